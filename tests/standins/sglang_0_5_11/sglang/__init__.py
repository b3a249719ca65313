"""Stand-in for SGLang 0.5.11 (0.5.11-0.5.12 shape: native --msprobe-dump-config, worker batch with requests).

Only model_runner.py and server_args.py differ from 0.5.10 here; the other modules are links to 0.5.10's.
"""

__version__ = "0.5.11"
