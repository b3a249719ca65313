"""Writes that failed on the storage under a dump root: the cause in words, one line, and what was lost.

A full disk, a read-only remount or a dump folder removed mid-run shows up as an ``OSError``, often
wrapped (msprobe's ``save_json`` re-raises it as ``RuntimeError("Save json file … failed.")``). What
the user needs is the cause (no space left on the device holding PATH) and what was lost (which
step folders, which log lines). :func:`report_loss` says so on one warning line per cause and
device; later losses of the same cause go to debug level, and what stays lost (a file written whole
later is not) is listed once more when the process exits.
"""

from __future__ import annotations

import _thread
import errno
import os

from msprobe_hooks.log import logger

# The errors of a storage that fails under a dump root (a full disk, a read-only remount, a removed folder).
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.ENOENT, errno.EACCES, errno.EIO})

_lock = _thread.allocate_lock()  # not threading: it imports functools, and activation stays light
_reported: set[tuple[int, str]] = set()  # (errno, mount point) already given their warning line
_lost: list[str] = []  # what was lost, in order, for the exit summary
_summary_registered = False


def os_error(exc: BaseException) -> OSError | None:
    """The ``OSError`` that ``exc`` is or was raised from (its ``__cause__``/``__context__`` chain), or None."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def failed_path(exc: BaseException) -> str | None:
    """The path whose storage failed, when ``exc`` comes from an ``OSError`` of writing it; else None.

    Taken from the error itself, else from the first absolute path in a message of its chain
    (msprobe re-raises ``json.dump``'s nameless error as "Save json file PATH failed.").
    """
    err = os_error(exc)
    if err is None or err.errno not in STORAGE_ERRNOS:
        return None
    if isinstance(err.filename, str):
        return err.filename
    current: BaseException | None = exc
    while current is not None:
        for word in str(current).split():
            if word.startswith(os.sep):
                return word.rstrip(".,;:'\"")
        current = current.__cause__ or current.__context__
    return os.getcwd()


def probe(path: str) -> OSError | None:
    """The storage state that would make writing under ``path`` fail, as an ``OSError``, or None.

    For failures whose own exception hides the cause (msprobe checks a path itself and raises its own
    exception): the folder gone, its file system read-only, or full.
    """

    if not os.path.exists(path):
        return OSError(errno.ENOENT, os.strerror(errno.ENOENT), path)
    stats = os.statvfs(path)
    if stats.f_flag & os.ST_RDONLY:
        return OSError(errno.EROFS, os.strerror(errno.EROFS), path)
    if stats.f_bavail == 0:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
    return None


def mount_point(path: str) -> str:
    """The mount point of the file system holding ``path`` (or that would hold it, if it is gone)."""
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    while not os.path.ismount(path):
        path = os.path.dirname(path)
    return path


def cause(err: OSError, path: str) -> str:
    """What went wrong with ``path``, for a user: the device and its free space, a read-only mount, a removed folder."""
    where = mount_point(path)
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        stats = os.statvfs(where)
        free = stats.f_bavail * stats.f_frsize
        what = "no space left" if err.errno == errno.ENOSPC else "disk quota exceeded"
        return f"{what} on the device holding {path} (mounted at {where}, {free} bytes free)"
    if err.errno == errno.EROFS:
        return f"the file system holding {path} is read-only (mounted at {where})"
    if err.errno == errno.ENOENT:
        return f"{path} does not exist any more (removed while the job ran?)"
    return f"{os.strerror(err.errno) if err.errno else err} for {path}"


def report_loss(lost: str, exc: BaseException, path: str, strict: bool = False) -> None:
    """``lost`` (e.g. "msprobe dump step3/rank0") could not be written under ``path`` because of ``exc``.

    One warning per cause and device, naming the cause and what was lost; the rest at debug level
    and in the exit summary. Under ``strict`` (MSPROBE_HOOKS_STRICT=1) ``exc`` is raised after its line.
    """
    import logging

    err = os_error(exc) or probe(path)
    err_path = err.filename if err is not None and isinstance(err.filename, str) else path
    why = cause(err, err_path) if err is not None else f"{type(exc).__name__}: {exc}"
    key = (err.errno if err is not None and err.errno is not None else -1, mount_point(err_path))
    register_summary()
    with _lock:
        first = key not in _reported
        _reported.add(key)
        if lost not in _lost:
            _lost.append(lost)
    level = logging.WARNING if first else logging.DEBUG
    later = "; what stays lost is listed when the process exits" if first else ""
    logger().log(level, "%s could not be written, the host goes on unaffected: %s%s", lost, why, later)
    if strict:
        raise exc


def register_summary() -> None:
    """Log what stays lost when the process exits; call before msprobe makes its debugger, so that the
    summary runs after msprobe's own exit flush (exit handlers run last-registered first)."""
    global _summary_registered
    with _lock:
        if _summary_registered:
            return
        _summary_registered = True
    import atexit

    atexit.register(_summary)


def saved(what: str) -> None:
    """``what`` was written after all (msprobe rewrites a step's files whole at its next flush): not lost."""
    with _lock:
        if what in _lost:
            _lost.remove(what)


def lost() -> list[str]:
    """Everything this process could not save, in order."""
    with _lock:
        return list(_lost)


def _summary() -> None:
    with _lock:
        items = list(_lost)
    if items:
        logger().warning("lost in this process (%d): %s", len(items), ", ".join(items))
