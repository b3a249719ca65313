"""Fault injection for the fault suite, in every Python process of a test job.

Put this folder on PYTHONPATH after the shim: the shim activates msprobe-hooks and then chains
this ``sitecustomize`` (as it chains a user's), so spawned engine workers get the faults too.
``FAULT_INJECT`` lists the faults, comma-separated (no prefix of ours: the library would read it
as a typo of its own variables):

* ``msprobe_missing``: ``import msprobe`` fails, as where it is not installed;
* ``msprobe_start`` / ``msprobe_stop`` / ``msprobe_step``: that ``PrecisionDebugger`` method
  raises before doing anything, as a broken msprobe would;
* ``remove_root``: after msprobe's second ``step()`` the dump folder (``FAULT_ROOT``) is deleted (our log
  of the first step with it);
* ``readonly_root``: after msprobe's first ``step()`` the mount at ``FAULT_ROOT`` is remounted
  read-only (the test made it a tmpfs);
* ``cut_prompts``: msprobe-hooks' own ``prompt_only_micro_batch`` raises (a micro-batch layout it does
  not know);
* ``gap``: msprobe-hooks' own log-prob gap computation (``logprob_gap.statistics``) raises;
* ``double_activation``: msprobe-hooks is activated twice more, once having forgotten it was;
* ``prompt_forward``: on rank ``FAULT_RANK`` (default 1), verl's second prompt-only forward
  (``compute_loss`` false) raises before its first collective;
* ``kill_in_dump``: the process about to write msprobe's step folder ``FAULT_KILL_DUMP`` (relative to the dump
  root's parent, e.g. ``actor/step1``) SIGKILLs itself at that step's ``stop()``, before msprobe writes the step's
  ``dump.json`` and before our log line: a worker lost mid-dump.

Standard library only until the faulted module is imported.
"""

import os

INJECTED = "injected by the fault suite"


def _faults():
    return {name.strip() for name in os.environ.get("FAULT_INJECT", "").split(",") if name.strip()}


def _after_msprobe(callback):
    from msprobe_hooks.import_hooks import when_imported

    when_imported("msprobe.pytorch", callback)


def _break_debugger(methods, after_first_step):
    def patch(module):
        debugger = module.PrecisionDebugger
        for name in methods:

            def failing(self, *args, __name=name, **kwargs):
                raise RuntimeError(f"PrecisionDebugger.{__name} failed ({INJECTED})")

            setattr(debugger, name, failing)
        if after_first_step is not None:
            original = debugger.step  # a classmethod: bound already
            done = []

            def step(self, *args, **kwargs):
                result = original(*args, **kwargs)
                done.append(True)
                if len(done) == (2 if after_first_step is _remove_root else 1):
                    after_first_step()
                return result

            debugger.step = step

    _after_msprobe(patch)


def _kill_in_dump(module):
    import signal

    debugger = module.PrecisionDebugger
    original = debugger.stop  # a classmethod: bound already
    target = os.path.normpath(os.environ["FAULT_KILL_DUMP"])

    def stop(*args, **kwargs):
        service = debugger._instance.service
        step_folder = service.dump_iter_dir or ""
        if os.path.relpath(step_folder, os.path.dirname(str(service.config.dump_path))) == target:
            os.kill(os.getpid(), signal.SIGKILL)
        return original(*args[1:] if args and args[0] is debugger._instance else args, **kwargs)

    debugger.stop = stop


def _remove_root():
    import shutil

    shutil.rmtree(os.environ["FAULT_ROOT"])


def _readonly_root():
    import subprocess

    subprocess.run(["mount", "-o", "remount,ro", os.environ["FAULT_ROOT"]], check=True)


def _break_prompt_forward():
    from msprobe_hooks.import_hooks import when_imported

    def patch(module):
        cls = module.FSDPEngineWithLMHead
        original = cls.prepare_model_inputs
        seen = []

        def prepare_model_inputs(self, micro_batch, *args, **kwargs):
            import torch.distributed as dist
            from verl.utils import tensordict_utils as tu

            prompt_only = tu.get(micro_batch, "compute_loss") is False
            rank = dist.get_rank() if dist.is_initialized() else 0
            if prompt_only and rank == int(os.environ.get("FAULT_RANK", "1")):
                seen.append(True)
                if len(seen) == 2:
                    raise RuntimeError(f"a prompt-only forward failed partway ({INJECTED})")
            return original(self, micro_batch, *args, **kwargs)

        cls.prepare_model_inputs = prepare_model_inputs

    when_imported("verl.workers.engine.fsdp.transformer_impl", patch)


def _install():
    faults = _faults()
    if not faults:
        return
    if "msprobe_missing" in faults:
        import sys

        sys.modules["msprobe"] = None  # ``import msprobe`` now raises ImportError
    methods = [m for m in ("start", "stop", "step") if f"msprobe_{m}" in faults]
    after = _remove_root if "remove_root" in faults else _readonly_root if "readonly_root" in faults else None
    if methods or after:
        _break_debugger(methods, after)
    if "prompt_forward" in faults:
        _break_prompt_forward()
    if "kill_in_dump" in faults:
        _after_msprobe(_kill_in_dump)
    if "cut_prompts" in faults:
        from msprobe_hooks.training import micro_batch

        def cut(*args, **kwargs):
            raise RuntimeError(f"cutting a prompt failed ({INJECTED})")

        micro_batch.prompt_only_micro_batch = cut
    if "gap" in faults:
        from msprobe_hooks.training import logprob_gap

        def statistics(*args, **kwargs):
            raise RuntimeError(f"computing the log-prob gap failed ({INJECTED})")

        logprob_gap.statistics = statistics
    if "double_activation" in faults:
        import msprobe_hooks
        from msprobe_hooks import bootstrap

        msprobe_hooks.activate()
        bootstrap._active = None  # as a second activation path that does not know of the first
        msprobe_hooks.activate()


_install()
