"""The JSON-lines protocol of the kit's long-lived rollout engines (:mod:`cpu_kit.vllm_engine`,
:mod:`cpu_kit.sglang_engine`): the server loop each engine's venv runs, and the client the training venv drives.

One JSON object a line on stdin, one a line on stdout. A first line ``{"ok": true, "ready": true, "pid": ...,
"engine": NAME, "version": ...}`` says the engine is up; ``{"cmd": NAME, ...fields}`` calls that handler with the
fields; ``{"cmd": "shutdown"}`` is answered, then the server exits. Errors answer ``{"ok": false, "error": "..."}``
and the engine keeps serving. Engines and their spawned processes log to stdout: the server moves fd 1 onto stderr
before the engine is imported and answers on a private copy of the original stdout, so the protocol stream holds
replies only. Standard library only: it runs in every venv.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

# Engine start is ~15-70 s on 2 cores (import, profile run, KV cache); a command is well under that.
START_TIMEOUT = 600.0
COMMAND_TIMEOUT = 300.0


def server_arguments(description: str) -> argparse.ArgumentParser:
    """An engine server's command line: the model folder and the engine's dtype; each engine adds its own."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("model", help="a Hugging Face model folder")
    parser.add_argument("--dtype", default="float32", help="the engine's dtype: float32 (default) or bfloat16")
    return parser


def server_command(python: str | os.PathLike, server: str, model: str | os.PathLike, dtype: str) -> list[str]:
    """How a client starts the engine server module ``server`` (a file) on ``model``; each engine adds its options."""
    return [os.fspath(python), os.path.abspath(server), os.fspath(model), "--dtype", dtype]


class EngineError(RuntimeError):
    """The engine answered an error, or died; the message ends with its log's last lines."""


def claim_stdout() -> IO[str]:
    """A private copy of stdout for replies; fd 1 (inherited by the engine's processes) now goes to stderr. Call it
    before the engine is imported."""
    replies = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    sys.stdout.flush()
    os.dup2(2, 1)
    return replies


def answer_commands(replies: IO[str], hello: Mapping[str, Any], handlers: Mapping[str, Callable[..., dict]]) -> int:
    """Say ``hello`` (the engine is up), then answer commands from stdin until ``shutdown`` or EOF."""

    def reply(message: Mapping[str, Any]) -> None:
        replies.write(json.dumps(message) + "\n")

    reply({"ok": True, "ready": True, **hello})
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        command = request.pop("cmd", None)
        if command == "shutdown":
            reply({"ok": True})
            break
        if command not in handlers:
            reply({"ok": False, "error": f"unknown command {command!r}; known: {sorted(handlers)} and shutdown"})
            continue
        try:
            reply({"ok": True, **handlers[command](**request)})
        except Exception as exc:  # the engine keeps serving; the client raises with this line
            reply({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
    return 0


class EngineClient:
    """A server started as ``command`` (an engine venv's interpreter on its engine module), stderr to ``log_path``.

    ``env`` is the server's whole environment (the shim and the dump variables come with it). Use it as a context
    manager: leaving the block shuts the engine down (killed if it does not answer).
    """

    def __init__(
        self, command: Sequence[str], *, env: Mapping[str, str], log_path: str | os.PathLike, name: str
    ) -> None:
        self.name = name  # "the vLLM engine", in errors
        self.log_path = os.fspath(log_path)
        with open(self.log_path, "w", encoding="utf-8") as log:
            self.process = subprocess.Popen(
                list(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=dict(env), text=True
            )
        self._replies: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        try:
            hello = self._next_reply(START_TIMEOUT)
        except BaseException:  # a start that hangs or fails leaves no server behind
            self.process.kill()
            self.process.wait()
            raise
        self.pid: int = hello["pid"]
        self.version: str = hello["version"]

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._replies.put(line)
        self._replies.put(None)  # EOF: the server exited

    def _next_reply(self, timeout: float) -> dict[str, Any]:
        try:
            line = self._replies.get(timeout=timeout)
        except queue.Empty:
            raise EngineError(f"no answer from {self.name} in {timeout:.0f} s{self._log_tail()}") from None
        if line is None:
            code = self.process.wait()
            raise EngineError(f"{self.name} exited ({code}){self._log_tail()}")
        message = json.loads(line)
        if not message.get("ok"):
            raise EngineError(f"{self.name} answered: {message.get('error')}{self._log_tail()}")
        return message

    def _log_tail(self, lines: int = 30) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as log:
            tail = log.readlines()[-lines:]
        return f"\n--- {self.log_path} (end) ---\n" + "".join(tail)

    def request(self, command: str, timeout: float = COMMAND_TIMEOUT, **fields: Any) -> dict[str, Any]:
        """Send one command and return its answer (raises :class:`EngineError` on an error answer)."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"cmd": command, **fields}) + "\n")
        self.process.stdin.flush()
        return self._next_reply(timeout)

    def generate(self, requests: Sequence[Mapping[str, Any]], packed: bool = False) -> list[dict[str, Any]]:
        """The outputs (``id``, ``token_ids``, ``logprobs``: the sampled tokens') in the order of ``requests``: greedy,
        or sampled at a request's ``temperature`` with its ``seed``; ``packed``: all added at once, else one at a
        time."""
        return self.request("generate", requests=list(requests), packed=packed)["outputs"]

    def update_weights(self, path: str | os.PathLike) -> None:
        """Load the safetensors of folder ``path`` into the running engine."""
        self.request("update_weights", path=os.fspath(path))

    def close(self, timeout: float = COMMAND_TIMEOUT) -> int:
        """Shut the engine down and wait for its exit; its exit status."""
        if self.process.poll() is None:
            try:
                self.request("shutdown")
                return self.process.wait(timeout=timeout)
            except (EngineError, OSError, subprocess.TimeoutExpired):
                self.process.kill()
        return self.process.wait()

    def __enter__(self) -> EngineClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
