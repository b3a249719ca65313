"""Stand-in for SGLang 0.5.2 (0.5.2-0.5.3 shape: overlap thread, worker batch without requests)."""

__version__ = "0.5.2"
