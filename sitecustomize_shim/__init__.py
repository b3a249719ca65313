"""Holds the activation shim. Put this folder (``msprobe-hooks shim-path``) on PYTHONPATH; never import it."""
