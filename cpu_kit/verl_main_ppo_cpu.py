"""verl's own trainer (``python3 -m verl.trainer.main_ppo``) on CPU, vLLM CPU as its rollout: the plugin.

Loaded the way verl loads external modules, ``VERL_USE_EXTERNAL_MODULES=cpu_kit.verl_main_ppo_cpu`` (and
the repository root on PYTHONPATH): verl's ``__init__`` imports it in every process that imports verl, the
driver, each Ray worker and vLLM's worker subprocess (its ``worker_extension_cls`` imports verl). Importing
it installs, idempotently:

* the CPU platform of :mod:`cpu_kit.verl_cpu`, asking Ray for a *logical* GPU (below);
* the workarounds of ``shared/reference/real-verl-trainer-cpu.md`` that need code (its obstacles 2, 3, 7
  and 9; the others are overrides and variables: :mod:`cpu_kit.main_ppo`), each checked against the
  versions it was written for: another verl or vLLM is refused, to be re-checked, not silently half-patched.

No verl or vLLM source file is edited.
"""

from __future__ import annotations

import functools
import importlib.metadata
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed

from cpu_kit import verl_cpu

# The releases each workaround was written against (the venv of `make install-verl-e2e`).
VERIFIED = {"verl": "0.9.1", "vllm": "0.32.0+cpu"}
WEIGHT_SYNC_MODULE = "verl.workers.rollout.vllm_rollout.utils"


def _require(package: str, workaround: str) -> None:
    installed = importlib.metadata.version(package)
    if installed != VERIFIED[package]:
        raise RuntimeError(
            f"cpu_kit.verl_main_ppo_cpu: {workaround} was written for {package} {VERIFIED[package]}, "
            f"this is {installed}: re-check it (shared/reference/real-verl-trainer-cpu.md)"
        )


def register_trainer_platform() -> None:
    """The kit's CPU platform, with what the trainer's resource pools and step metrics ask of it."""
    _require("verl", "the platform's Ray resource and device name")
    verl_cpu.register_cpu_platform()
    from verl.plugin.platform import PlatformRegistry, get_platform, set_platform

    base = type(get_platform())
    if base.__name__ == "PlatformCPUTrainer":
        return

    class PlatformCPUTrainer(base):
        # 9: the step metrics' flops counter asks the device module for its name.
        device_module = types.SimpleNamespace(**vars(base.device_module), get_device_name=lambda *a, **k: "CPU")

        def ray_resource_name(self) -> str:
            # 2: ResourcePoolManager counts only Ray's "GPU"/"NPU" and Ray refuses "CPU" as a custom
            # resource: the job gives Ray one logical GPU (ray_init.num_gpus=1) and the pools ask for it.
            return "GPU"

    PlatformRegistry.register("cpu")(PlatformCPUTrainer)
    set_platform(PlatformCPUTrainer())


def _dedupe_backend(backend: Any) -> Any:
    return ",".join(dict.fromkeys(backend.split(","))) if isinstance(backend, str) else backend


def single_gloo_backend() -> None:
    """3: verl's ``initialize_global_process_group_ray`` builds ``f"cpu:gloo,{device}:{backend}"``, which on
    a CPU names ``cpu:gloo`` twice and torch refuses (``Duplicate device type cpu``): the repeat is dropped."""
    _require("verl", "the process group's backend string")
    original = torch.distributed.init_process_group
    if getattr(original, "cpu_kit", False):  # installed already (torch's own wraps it: no __wrapped__ test)
        return

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        if args:
            args = (_dedupe_backend(args[0]), *args[1:])
        if "backend" in kwargs:
            kwargs["backend"] = _dedupe_backend(kwargs["backend"])
        return original(*args, **kwargs)

    init_process_group.cpu_kit = True
    torch.distributed.init_process_group = init_process_group


def update_weights_from_ipc(self: Any, peft_config: dict | None = None, base_sync_done: bool = False, **kwargs: Any):
    """7: the weight sync into vLLM CPU through vLLM's own layerwise reload.

    verl's ``_update_weights`` calls ``model.load_weights`` on a model whose linear layers vLLM's CPU
    backend repacked after loading (``'Parameter' object has no attribute 'weight_loader'``). The buckets
    arrive by verl's own receiver (shared memory: the platform has no IPC); each is cloned out of the
    buffer the next bucket overwrites; then ``reload_weights`` loads them as a checkpoint and repacks.
    """
    from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightReceiver

    if peft_config and base_sync_done:
        raise NotImplementedError("cpu_kit.verl_main_ppo_cpu: a LoRA adapter sync is not handed over on CPU")
    received: list[tuple[str, torch.Tensor]] = []
    receiver = BucketedWeightReceiver(
        zmq_handle=self._get_zmq_handle(), device=torch.device("cpu"), use_shm=kwargs.get("use_shm", False)
    )
    receiver.receive_weights(
        on_bucket_received=lambda weights, is_last: received.extend((n, t.clone()) for n, t in weights)
    )
    self.reload_weights(weights_iterator=iter(received), is_checkpoint_format=True)


def _patch_weight_sync(module: types.ModuleType) -> None:
    _require("vllm", "the weight sync through vLLM's reload")
    module.vLLMColocateWorkerExtension.update_weights_from_ipc = update_weights_from_ipc


def when_imported(name: str, hook: Callable[[types.ModuleType], None]) -> None:
    """Run ``hook`` once ``name`` is imported (at once if it is): vLLM is imported only where it runs."""
    import wrapt

    wrapt.register_post_import_hook(hook, name)


def install() -> None:
    register_trainer_platform()
    single_gloo_backend()
    when_imported(WEIGHT_SYNC_MODULE, _patch_weight_sync)


install()
