"""Stand-in for SGLang 0.5.10 (0.5.6-0.5.10 shape: worker batch with requests, ForwardBatch.rids from 0.5.10)."""

__version__ = "0.5.10"
