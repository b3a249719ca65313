"""A test-only stand-in for ``sgl_kernel``, so that SGLang 0.5.21 imports on a CPU without AMX.

PyPI's ``sglang-kernel`` is CUDA-only. Without AMX SGLang runs native torch layers and never calls
its CPU kernels, but some of its modules import these names at import time. Each resolves to a
function that raises if it is ever called, so a run that reaches a kernel fails loudly rather than
computing something else. There are no submodules on purpose: SGLang falls back when importing one
raises ImportError (``get_scalar_types``). Put on PYTHONPATH by ``tests/support/real_sglang.py`` only.
"""

from __future__ import annotations

from collections.abc import Callable

# What an engine start and a generation of sglang 0.5.21 on CPU ask this module for (logged by a
# probing stub): three KV-cache helpers, then four of speculative decoding.
_IMPORTED_AT_IMPORT_TIME = (
    "copy_all_layer_kv_cache_cpu",
    "assign_req_to_token_pool_cpu",
    "assign_extend_cache_locs_cpu",
    "build_tree_kernel_efficient_cpu",
    "verify_tree_greedy_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
)


def _never_called(name: str) -> Callable[..., None]:
    def kernel(*args: object, **kwargs: object) -> None:
        raise NotImplementedError(f"sgl_kernel.{name} is a test stub: this SGLang run reached a CPU kernel")

    kernel.__name__ = name
    return kernel


globals().update({name: _never_called(name) for name in _IMPORTED_AT_IMPORT_TIME})
