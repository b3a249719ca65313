"""Engine children forked from a process that has imported torch, transformers, verl and Megatron already.

An engine child spends about 10 s importing those for about 2 s of work, and the engine tests run dozens of
them. The zygote (this file run as a script, once per test worker) imports them, with verl's CPU platform
registered first (``cpu_kit.verl_cpu``), and nothing of ours or msprobe's; each run is then a fork that sets
its environment, working folder, stdout/stderr files and ``sys.argv``, imports ``sitecustomize`` as Python's
start-up would (the shim, which chains the fault site), runs the child script as ``__main__`` and exits as an
interpreter does (non-daemon threads joined, ``atexit`` functions run, an uncaught exception printed and
status 1). The shim's post-import hooks find verl imported and patch it at once (``import_hooks.when_imported``);
patching at import time, in a fresh interpreter, is what the engine tests without the zygote and the
``main_ppo`` runs prove.

Protocol: a JSON request per line on stdin (``argv``, ``env``, ``cwd``, ``stdout``, ``stderr``); the zygote
answers ``{"pid": P}`` at the fork and ``{"returncode": R}`` when the child has exited.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

HERE = Path(__file__).resolve()
TESTS = HERE.parent.parent  # run as a file, like the *_child.py scripts: it puts these on sys.path itself
REPO = TESTS.parent
# The interpreter's own sys.path (the venv's site-packages), under each child's script folder and PYTHONPATH.
_BASE_PATH = [entry for entry in sys.path if entry != str(HERE.parent)]


def _preload() -> None:
    sys.path[:0] = [str(REPO), str(TESTS)]
    from cpu_kit import megatron_cpu, verl_cpu  # noqa: F401  (torch, transformers, megatron-core, mbridge)

    verl_cpu.register_cpu_platform()  # before verl.workers, as every child does
    import verl.workers.config  # noqa: F401
    import verl.workers.engine.fsdp.transformer_impl  # noqa: F401
    import verl.workers.engine.megatron.transformer_impl  # noqa: F401
    import verl.workers.utils.losses  # noqa: F401

    assert not any(name.split(".")[0] in ("msprobe", "msprobe_hooks") for name in sys.modules), "imported ours"
    assert threading.active_count() == 1, "a thread started at import: forking could deadlock the children"


def _child(request: dict) -> None:
    """In the fork: become the interpreter ``request`` describes, run its script, exit."""
    os.setpgid(0, 0)  # its own group: a timeout kills what it started too
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):  # appended: they may be one file
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(target, fd)
        os.close(target)
    os.environ.clear()
    os.environ.update(request["env"])
    import torch._dynamo.config  # imported already

    # The one setting of the children's environment that torch reads at import (torch/_dynamo/config.py).
    torch._dynamo.config.disable = os.environ.get("TORCHDYNAMO_DISABLE", "0") == "1"
    os.chdir(request["cwd"])
    script, *args = request["argv"]
    sys.argv = [script, *args]
    entries = [entry for entry in request["env"].get("PYTHONPATH", "").split(os.pathsep) if entry]
    sys.path[:] = [os.path.dirname(os.path.abspath(script)), *entries, *_BASE_PATH]
    code = 0
    try:
        sys.modules.pop("sitecustomize", None)
        try:
            import sitecustomize  # noqa: F401  (the shim, as Python's site module imports it)
        except ImportError as exc:
            if exc.name != "sitecustomize":
                raise
        import runpy

        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int | None):
            print(exc.code, file=sys.stderr)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]  # what the interpreter does at exit, in its order
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _serve() -> None:
    _preload()
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)


class Zygote:
    """The client: one zygote process, runs one at a time."""

    def __init__(self, env: dict[str, str]) -> None:
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115  (open while the zygote lives: its import warnings)
        self._process = subprocess.Popen(
            [sys.executable, str(HERE)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr
        )
        self._pending = b""

    def run(self, request: dict, timeout: float) -> int:
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(request).encode() + b"\n")
        self._process.stdin.flush()
        pid = self._reply(timeout)["pid"]
        try:
            return self._reply(timeout)["returncode"]
        except subprocess.TimeoutExpired:
            os.killpg(pid, signal.SIGKILL)
            self._reply(timeout)
            raise

    def _reply(self, timeout: float) -> dict:
        stdout = self._process.stdout
        assert stdout is not None
        while b"\n" not in self._pending:
            ready, _, _ = select.select([stdout], [], [], timeout)
            if not ready:
                raise subprocess.TimeoutExpired(str(HERE), timeout)
            chunk = os.read(stdout.fileno(), 4096)
            if not chunk:
                self._stderr.seek(0)
                tail = self._stderr.read()[-3000:].decode(errors="replace")
                raise RuntimeError(f"the zygote exited with status {self._process.wait()}: {tail}")
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        assert self._process.stdin is not None
        self._process.stdin.close()
        self._process.wait()
        self._stderr.close()


@functools.cache
def _zygote() -> Zygote:
    """This test worker's zygote, started at its first run, ended with the worker."""
    from support.interpreter import clean_env  # not in the zygote: it imports msprobe_hooks

    zygote = Zygote(clean_env(OMP_NUM_THREADS="1"))
    atexit.register(zygote.close)
    return zygote


def run(
    argv: list[str], env: dict[str, str], cwd: Path, timeout: float, stdout: Path, stderr: Path | None = None
) -> int:
    """Run ``argv`` (a Python script of this interpreter and its arguments) forked from the zygote, its output
    in ``stdout`` (and ``stderr``, or the same file); its exit status. A run past ``timeout`` is killed
    with what it started, raising ``subprocess.TimeoutExpired``."""
    stderr = stderr or stdout
    for path in (stdout, stderr):
        path.write_text("")
    request = {"argv": argv, "env": env, "cwd": str(cwd), "stdout": str(stdout), "stderr": str(stderr)}
    return _zygote().run(request, timeout)


if __name__ == "__main__":
    _serve()
