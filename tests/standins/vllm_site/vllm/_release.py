"""Which real release this stand-in imitates (from its dist-info), and what differs between releases."""

import os
from importlib import metadata

from packaging.version import Version

release = Version(metadata.version("vllm"))

# execute_model() returns None and sample_tokens() samples (0.11.1+); before, execute_model() sampled.
HAS_SAMPLE_TOKENS = release >= Version("0.11.1")


def randomizes_request_ids() -> bool:
    """InputProcessor.assign_request_id: "{external}-{8 hex}" from 0.14, opt-out env var from 0.17."""
    if release < Version("0.14"):
        return False
    return not (release >= Version("0.17") and os.environ.get("VLLM_DISABLE_REQUEST_ID_RANDOMIZATION") == "1")
