"""Stand-in for vLLM (tests only): the V1 model runner path, on CPU, with a toy model."""

from importlib import metadata

__version__ = metadata.version("vllm")
