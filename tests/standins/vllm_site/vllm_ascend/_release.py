from importlib import metadata

from packaging.version import Version

release = Version(metadata.version("vllm-ascend"))

# Where NPUModelRunner starts its PrecisionDebugger (vllm-ascend git history, model_runner_v1.py):
INLINE_DUMP_CALLS = release < Version("0.20.2rc1")  # start() after _prepare_inputs, stop()/step() inline
START_BEFORE_UPDATE_STATES = Version("0.20.2rc1") <= release < Version("0.24.0rc1")  # _start_dump_data() first
PASSES_SCHEDULED_TOKENS = release >= Version("0.27.1rc1")  # PR #13377
CONFIG_KEY = "dump_config" if release < Version("0.13.0rc1") else "dump_config_path"
