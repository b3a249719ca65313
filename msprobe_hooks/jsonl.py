"""Per-process JSON-lines logs that stay parseable whatever happens to the process.

Each record is written with one ``os.write`` of a whole line to a file opened ``O_APPEND``, so
a process killed at any moment leaves complete lines, but for the record it was writing: a SIGKILL
can cut a write that crosses a page, leaving that one record unterminated at the end of the file,
where readers skip it (tests/faults measures it). A log written at every engine step (the dispatch
log) hands its lines to this process's writer thread instead (:meth:`JsonlLog.write_later`): the step pays a
list append, the thread builds and writes the line (whole lines, one ``os.write`` for all that wait) while
the step runs on, and a line still waiting when the next step's lines come is written by the caller first, so a kill
still loses at most the lines of the latest step. The step wakes the thread, unless steps come at a steady pace
(each at most ``STEADY_STEPS_UP_TO_S``): the thread's own timer then wakes it a tenth of a step after the next
step's lines are due. :func:`flush` (also run at exit) writes what waits at once. A write that the disk cuts short
is taken back; a file removed under the writer is made anew (by the next write, or, for the per-step dispatch log,
the first write a second after the last look). Files live under ``{root}/{pid}/``: no two processes
ever write the same file, and a forked child that inherits a log reopens it under its own pid on
its first write.

Reading (:func:`records`, every reader of these logs and of ``pairs.jsonl``): a line that is not a JSON
object is skipped, the rest of the file still read, and named with its file and line number (a
:class:`BadLine` handed to ``bad``; by default a warning on the ``msprobe_hooks`` logger). The cut last
line a kill leaves is told from damage elsewhere by its missing newline and named "truncated?". A
blank line holds no record and is passed over silently. A caller may do more with a named line than
skip it: ``align`` counts it, ``pairs.read`` refuses the pairs file (written whole by ``align``, a bad
line there is an edit gone wrong, and a pair dropped unseen would leave a report short of it).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

_pid = os.getpid()  # this process's id: asking the kernel at every line costs a system call


def _forked() -> None:
    global _pid, _writer
    _pid = os.getpid()
    _writer = _Writer()  # the parent's thread is not in the child, nor are its lines the child's


os.register_at_fork(after_in_child=_forked)


def current_pid() -> int:
    """``os.getpid()``, without the system call (kept by a fork hook)."""
    return _pid


def encode(value: object) -> str:
    """A record (or one field's value) as the compact JSON every log line uses (non-ASCII kept, unknown types
    as ``str``)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


class JsonlLog:
    """``{root}/{pid}/{filename}``, appended one complete line per :meth:`write`."""

    def __init__(self, root: str, filename: str, removal_check_s: float = 0.0, deferred: bool = False) -> None:
        self.root = root
        self.filename = filename
        self.deferred = deferred  # every line goes through the writer thread (:meth:`write_later`)
        # How often a write looks whether the file was removed (an fstat): 0, at every write; a log written
        # at every model step looks once a second (lines of that second after a removal are lost with it).
        self.removal_check_s = removal_check_s
        self._checked = float("-inf")  # time.monotonic() of the last look
        self._lock = threading.Lock()
        self._pid = -1
        self._fd = -1

    @property
    def path(self) -> str:
        return os.path.join(self.root, str(_pid), self.filename)

    def _open(self) -> int:
        pid = _pid
        if self._pid == pid and self._removal_due() and os.fstat(self._fd).st_nlink == 0:
            # Removed under us (a cleanup deleted the dump folder): later lines would go to a file no one
            # can read. Write anew where readers look; what the file held went with it.
            os.close(self._fd)
            self._pid = -1
            from msprobe_hooks.log import logger

            logger().warning("%s was removed while the job ran; it is written anew from here", self.path)
        if self._pid != pid:  # first write, or first write after a fork
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self._pid = pid
        return self._fd

    def _removal_due(self) -> bool:
        if not self.removal_check_s:
            return True
        now = time.monotonic()
        if now - self._checked < self.removal_check_s:
            return False
        self._checked = now
        return True

    def write(self, record: dict[str, Any]) -> None:
        self.write_line(encode(record))

    def write_line(self, line: str) -> None:
        """Append ``line``, one JSON record already encoded (no newline), as one whole line."""
        if self.deferred:
            self.write_later(str, (line,))
            return
        with self._lock:
            self._append((line + "\n").encode())

    def write_later(self, build: Callable[..., str], args: tuple[Any, ...], wake: bool = True) -> None:
        """Append the line ``build(*args)`` from this process's writer thread (started on first use).

        For a log written at every engine step: the caller pays a list append (and a wake-up, but at a steady
        pace), not the line's encoding and its ``os.write`` (whose file-time update through the journal alone cost
        25-55 us a step). The thread writes while the step runs on; should an earlier step's line still wait when
        the next one comes, the caller writes it first, so that once a step's lines are handed over every earlier
        step's are on disk, and a kill loses at most the lines of the latest step. ``wake=False``: a line of this
        step that a later hand-over of the same step wakes the writer for (one wake-up a step: a second found the
        thread busy with the first and waited for it). ``args`` must not change once handed over. The lines of a
        log keep their order.
        """
        writer = _writer
        if writer.thread is None:
            writer.start()
        elif len(writer.waiting) > writer.held or writer.lock.locked():
            writer.drain()  # an earlier step's line is not on disk yet (the thread lags): written now, as before
        with writer.guard:
            writer.waiting.append((self, build, args))
            if not wake:
                writer.held += 1
                return
            writer.held = 0
            writer.handed_over()
            # The first line since the writer took the last ones wakes it, unless its timer is set for this step's lines
            ring, writer.rung = not writer.rung and not writer.timed, True
        if writer.thread is None:  # no thread could start (the interpreter is shutting down): written now
            writer.drain()
        elif ring:
            writer.doorbell.put(None)

    def _append(self, data: bytes) -> None:
        """Append ``data``, whole lines, with one ``os.write`` (the caller holds this log's lock or the writer's)."""
        fd = self._open()
        written = os.write(fd, data)
        if written == len(data):
            return
        # A short write (a full disk): finish the lines, or cut the part written off again, so the
        # file holds complete lines only. Only this process appends to this file.
        end = os.fstat(fd).st_size
        try:
            while written < len(data):
                written += os.write(fd, data[written:])
        except OSError:
            os.ftruncate(fd, end - written)
            raise


# Steps that come at a steady pace, each this short or shorter, are not rung for: the writer's own timer wakes it a
# tenth of a step after the next one's hand-over is due (a wake-up from another thread cost the step 4 us of CPU on
# the tiny engine, 11 us on the wider one: bench_real_vllm.py). Slower or unsteady steps ring, as the first of a
# burst does; a step later than the timer (the thread finds nothing) rings too.
STEADY_STEPS_UP_TO_S = 0.05
_STEADY_RATIO = 1.5  # two intervals between hand-overs within this ratio: a steady pace
_WAKE_AFTER = 1.1  # steps after the last hand-over: soon after the next is due, long before the one after it


class _Writer:
    """This process's writer thread and the lines waiting for it, in the order they were handed over."""

    def __init__(self) -> None:
        self.waiting: list[tuple[JsonlLog, Callable[..., str], tuple[Any, ...]]] = []
        self.guard = threading.Lock()  # over ``waiting``, ``held``, ``rung``, ``timed`` and the pace
        self.held = 0  # lines at the end of ``waiting`` handed over with wake=False: their step's next one wakes
        self.rung = False  # the doorbell was rung since the lines were last taken
        self.timed = False  # the thread waits on its timer, set for the next step's lines: hand-overs do not ring
        self.handed = float("-inf")  # time.monotonic() of the last waking hand-over
        self.intervals = (float("inf"), float("inf"))  # the last two times between waking hand-overs
        self.doorbell: queue.SimpleQueue[None] = queue.SimpleQueue()  # rung by the first line after a take
        # Held while lines are taken and written: whoever holds it writes all that wait, so order is kept.
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.starting = threading.Lock()
        self.failures: set[str] = set()  # each cause of a lost line is logged once

    def handed_over(self) -> None:
        """A step's lines are all handed over (under ``guard``): its pace."""
        now = time.monotonic()
        self.intervals, self.handed = (self.intervals[1], now - self.handed), now

    def next_wake(self, now: float) -> float | None:
        """Seconds until the writer's timer should wake it for the next step's lines (under ``guard``); None when the
        steps are slow, unsteady or late (the next hand-over rings)."""
        earlier, last = self.intervals
        steady = last <= STEADY_STEPS_UP_TO_S and max(earlier, last) <= _STEADY_RATIO * min(earlier, last)
        wait = self.handed + _WAKE_AFTER * last - now
        self.timed = steady and wait > 0
        return wait if self.timed else None

    def start(self) -> None:
        """Start the thread, once (two threads of the host may hand their first lines over at once)."""
        with self.starting:
            if self.thread is None:
                thread = threading.Thread(target=self._run, name="msprobe_hooks-log-writer", daemon=True)
                try:
                    thread.start()
                except RuntimeError:  # at interpreter shutdown: the caller writes
                    return
                self.thread = thread
                # Also before a multiprocessing child's exit, which skips atexit (os._exit) but not this.
                with contextlib.suppress(AttributeError, RuntimeError):
                    threading._register_atexit(flush)  # type: ignore[attr-defined]

    def _run(self) -> None:
        timeout = None
        while True:
            try:
                self.doorbell.get(timeout=timeout)
            except queue.Empty:
                if not self.timer_finds_lines():
                    timeout = None
                    continue
            self.drain()
            with self.guard:
                timeout = self.next_wake(time.monotonic())

    def timer_finds_lines(self) -> bool:
        """The timer woke the thread: whether the step it was set for handed its lines over (else the thread waits to
        be rung, and that step's hand-over rings)."""
        with self.guard:
            self.timed = len(self.waiting) > self.held
            return self.timed

    def drain(self) -> None:
        """Build and write every line waiting: one ``os.write`` per file."""
        with self.lock:
            with self.guard:
                taken, self.waiting = self.waiting, []
                self.held, self.rung = 0, False
            lines: dict[int, tuple[JsonlLog, list[str]]] = {}
            for log, build, args in taken:
                try:
                    line = build(*args)
                except Exception as exc:  # a bug of ours: the host goes on, the line is lost and said
                    self._lost(f"a line of {log.filename} could not be built ({type(exc).__name__}: {exc})")
                    continue
                lines.setdefault(id(log), (log, []))[1].append(line)
            for log, built in lines.values():
                try:
                    log._append(("\n".join(built) + "\n").encode())
                except OSError as exc:
                    self._lost(f"lines of {log.path} could not be written ({exc})")

    def _lost(self, what: str) -> None:
        if what not in self.failures:
            self.failures.add(what)
            from msprobe_hooks.log import logger

            logger().warning("%s; the job goes on", what)


_writer = _Writer()


def flush() -> None:
    """Write every line handed to :meth:`JsonlLog.write_later` and not yet written, now (also run at exit)."""
    _writer.drain()


atexit.register(flush)


class BadLine:
    """A line of a JSON-lines file that holds no record: where it is, and what is wrong with it.

    (A plain class: the writers import this module, and dataclasses would cost them its imports.)"""

    __slots__ = ("path", "number", "problem")

    def __init__(self, path: str, number: int, problem: str) -> None:
        self.path = path
        self.number = number
        self.problem = problem  # "not JSON (truncated?) (Unterminated string ...)", "a list, not a JSON object"

    @property
    def where(self) -> str:
        return f"{self.path}:{self.number}"

    def __str__(self) -> str:
        return f"{self.where}: {self.problem}; line skipped"


def warn_bad(line: BadLine) -> None:
    """The default for a bad line: one warning naming it."""
    from msprobe_hooks.log import logger

    logger().warning("%s", line)


def records(
    path: str,
    bad: Callable[[BadLine], None] = warn_bad,
    shortcut: Callable[[str], Any] | None = None,
) -> Iterator[tuple[int, Any]]:
    """(line number, JSON object) for every record of ``path``; each bad line is handed to ``bad``.

    ``shortcut(line)``, when given, may answer for a line without parsing it (None: parse it). An
    ``OSError`` of opening or reading the file is the caller's.
    """
    with open(path, encoding="utf-8", errors="replace") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            quick = shortcut(line) if shortcut is not None else None
            if quick is not None:
                yield number, quick
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                cut = " (truncated?)" if not line.endswith("\n") else ""
                bad(BadLine(path, number, f"not JSON{cut} ({exc.msg})"))
                continue
            if not isinstance(record, dict):
                bad(BadLine(path, number, f"a {type(record).__name__}, not a JSON object"))
                continue
            yield number, record
