"""Stand-in for SGLang 0.5.11 (0.5.11-0.5.12 shape: native --msprobe-dump-config, worker batch with requests)."""

__version__ = "0.5.11"
