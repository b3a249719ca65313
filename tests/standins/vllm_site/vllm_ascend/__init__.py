"""Stand-in for vLLM-Ascend (tests only): NPUModelRunner with its native msprobe switch, on CPU."""
