"""Per-process JSON-lines logs that stay parseable whatever happens to the process.

Each record is written with one ``os.write`` of a whole line to a file opened ``O_APPEND``, so
a process killed at any moment leaves complete lines, but for the record it was writing: a SIGKILL
can cut a write that crosses a page, leaving that one record unterminated at the end of the file,
where readers skip it (tests/faults measures it). A write that the disk cuts short is taken back;
a file removed under the writer is made anew. Files live under ``{root}/{pid}/``: no two processes
ever write the same file, and a forked child that inherits a log reopens it under its own pid on
its first write.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any


def encode(value: object) -> str:
    """A record (or one field's value) as the compact JSON every log line uses (non-ASCII kept, unknown types
    as ``str``)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


class JsonlLog:
    """``{root}/{pid}/{filename}``, appended one complete line per :meth:`write`."""

    def __init__(self, root: str, filename: str) -> None:
        self.root = root
        self.filename = filename
        self._lock = threading.Lock()
        self._pid = -1
        self._fd = -1

    @property
    def path(self) -> str:
        return os.path.join(self.root, str(os.getpid()), self.filename)

    def _open(self) -> int:
        pid = os.getpid()
        if self._pid == pid and os.fstat(self._fd).st_nlink == 0:
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

    def write(self, record: dict[str, Any]) -> None:
        self.write_line(encode(record))

    def write_line(self, line: str) -> None:
        """Append ``line``, one JSON record already encoded (no newline), as one whole line."""
        data = (line + "\n").encode()
        with self._lock:
            fd = self._open()
            written = os.write(fd, data)
            if written == len(data):
                return
            # A short write (a full disk): finish the line, or cut the part written off again, so the
            # file holds complete lines only. Only this process appends to this file.
            end = os.fstat(fd).st_size
            try:
                while written < len(data):
                    written += os.write(fd, data[written:])
            except OSError:
                os.ftruncate(fd, end - written)
                raise
