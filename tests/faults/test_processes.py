"""The JSON-lines logs (``msprobe_hooks.jsonl``, which every log of ours is written with) under process faults.

Children of every start method, a SIGKILL at any moment, two processes on one dump root, a disk that
fills up mid-line: each process writes its own file only, and every file holds complete JSON lines.
The writers run in fresh interpreters under the shim (``DUMP_ON=1``), as in a job.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.interpreter import run_python, shim_env

from . import fault_matrix as fm
from .verl_faults import tmpfs

WRITER = """
import json, os, sys
import msprobe_hooks
from msprobe_hooks.jsonl import JsonlLog, flush

assert msprobe_hooks.current_config() is not None, "not active"
log = JsonlLog(sys.argv[1], "faults.jsonl", deferred=sys.argv[2] == "deferred")

def write(count, who, size=200):
    for n in range(count):
        log.write({"who": who, "pid": os.getpid(), "n": n, "pad": "x" * size})
"""


def _script(tmp: Path, body: str) -> Path:
    path = tmp / "writer.py"
    path.write_text(textwrap.dedent(WRITER) + textwrap.dedent(body))
    return path


def _env(tmp: Path) -> dict[str, str]:
    return shim_env(DUMP_ON="1", MSPROBE_HOOKS_OUTPUT_DIR=str(tmp / "out"))


# A log written at once, and one whose lines the writer thread writes (the dispatch log's).
WRITES = ["direct", "deferred"]


def _run(script: Path, root: Path, tmp: Path, writes: str):
    """``script ROOT WRITES`` as ``__main__`` in a fresh interpreter under the shim (spawned children re-import it)."""
    argv = ["w", str(root), writes]
    code = f"import runpy, sys; sys.argv = {argv!r}; runpy.run_path({str(script)!r}, run_name='__main__')"
    return run_python(code, _env(tmp))


def _lines(root: Path) -> dict[str, list[dict]]:
    import json

    return {p.parent.name: [json.loads(x) for x in p.read_text().splitlines()] for p in root.glob("*/faults.jsonl")}


@pytest.mark.parametrize("writes", WRITES)
def test_fork_spawn_and_forkserver_children_write_their_own_files(tmp_path, writes):
    body = """
    import multiprocessing

    def child(who):
        assert msprobe_hooks.current_config() is not None, f"{who}: not active"
        write(3, who)

    if __name__ == "__main__":
        write(1, "parent")  # opened in the parent: a forked child inherits the open log
        for method in ("fork", "spawn", "forkserver"):
            proc = multiprocessing.get_context(method).Process(target=child, args=(method,))
            proc.start()
            proc.join()
            assert proc.exitcode == 0, method
        print(json.dumps({"parent": os.getpid()}))
    """
    root = tmp_path / "logs"
    with fm.cell("fork, spawn and forkserver children", fm.LOGS) as tally:
        script = _script(tmp_path, body)
        result = _run(script, root, tmp_path, writes)
        tally.runs += 1
        assert result.returncode == 0, result.stderr[-3000:]
        files = _lines(root)  # a deferred child's lines too: written before its exit, os._exit of a fork too
        assert sorted(len(lines) for lines in files.values()) == [1, 3, 3, 3]
        for pid, lines in files.items():
            assert {line["pid"] for line in lines} == {int(pid)} and len({line["who"] for line in lines}) == 1
        assert {lines[0]["who"] for lines in files.values()} == {"parent", "fork", "spawn", "forkserver"}
        assert fm.our_lines(result.stderr) == []
        fm.check_logs(root, tally)


@pytest.mark.parametrize("writes", WRITES)
def test_sigkill_mid_write_leaves_complete_lines(tmp_path, writes):
    body = """
    write(20, "victim", size=20000)
    flush()  # the 20 lines are on disk (a deferred log's are too, now)
    print("ready", flush=True)
    while True:
        write(1, "victim", size=20000)
    """
    with fm.cell("SIGKILL mid-write", fm.LOGS) as tally:
        script = _script(tmp_path, body)
        for attempt in range(5):
            root = tmp_path / f"logs{attempt}"
            proc = subprocess.Popen(
                [sys.executable, str(script), str(root), writes], env=_env(tmp_path), stdout=subprocess.PIPE, text=True
            )
            assert proc.stdout.readline().strip() == "ready"
            proc.send_signal(signal.SIGKILL)  # while it writes: lines of 20 kB, one after another
            proc.wait()
            tally.runs += 1
            assert proc.returncode == -signal.SIGKILL
            # How many lines were written before the kill landed varies: the table counts the 20 sure ones.
            assert fm.check_logs(root, fm.Tally(), killed=True) >= 20
            tally.lines += 20


def test_two_processes_on_one_dump_root_never_share_a_file(tmp_path):
    body = """
    print("ready", flush=True)
    sys.stdin.readline()  # both start writing together
    write(300, sys.argv[2])
    """
    root = tmp_path / "logs"
    with fm.cell("two processes, one dump root", fm.LOGS) as tally:
        script = _script(tmp_path, body)
        procs = [
            subprocess.Popen(
                [sys.executable, str(script), str(root), who],
                env=_env(tmp_path),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for who in ("a", "b")
        ]
        for proc in procs:
            assert proc.stdout.readline().strip() == "ready"
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        for proc in procs:
            proc.communicate()
            assert proc.returncode == 0
        tally.runs += 2
        files = _lines(root)
        assert len(files) == 2
        for pid, lines in files.items():
            assert {line["pid"] for line in lines} == {int(pid)} and [line["n"] for line in lines] == list(range(300))
        fm.check_logs(root, tally)


def test_a_full_disk_mid_line_leaves_complete_lines(tmp_path):
    body = """
    try:
        write(1000, "filler", size=3000)
    except OSError as exc:
        print(json.dumps({"errno": exc.errno}))
    """
    with tmpfs(tmp_path / "full", "64k") as mount, fm.cell("disk full (tmpfs)", fm.LOGS) as tally:
        script = _script(tmp_path, body)
        result = _run(script, mount, tmp_path, "direct")
        tally.runs += 1
        assert result.returncode == 0, result.stderr[-3000:]
        import errno

        assert result.json() == {"errno": errno.ENOSPC}  # the writer's caller is told (and reports it)
        assert 10 <= fm.check_logs(mount, tally) < 1000  # the line the disk cut short was taken back


def test_a_full_disk_under_the_writer_thread_leaves_complete_lines_and_says_so_once(tmp_path):
    body = """
    for n in range(1000):
        write(1, "filler", size=3000)
        if n % 5 == 4:
            flush()  # writes of 5 lines, the last one cut by the disk
    print(json.dumps({"host": "went on"}))
    """
    with tmpfs(tmp_path / "full", "64k") as mount, fm.cell("disk full (tmpfs)", fm.LOGS) as tally:
        script = _script(tmp_path, body)
        result = _run(script, mount, tmp_path, "deferred")
        tally.runs += 1
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.json() == {"host": "went on"}  # the step that handed the lines over is not told
        assert 10 <= fm.check_logs(mount, tally) < 1000  # the part the disk cut short was taken back
        (said,) = fm.our_lines(result.stderr, "could not be written")  # once, not at every lost write
        assert "faults.jsonl" in said and "No space left on device" in said, said
