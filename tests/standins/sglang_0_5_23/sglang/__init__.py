"""Stand-in for SGLang 0.5.23 (0.5.13+ shape: no ModelWorkerBatch, ForwardBatch built from the ScheduleBatch)."""

__version__ = "0.5.23"
