"""Fault injection for the reliability catalogue (tests/test_reliability.py): a full disk, a
crash in the middle of a write, torn and garbled files.

    disk_full(monkeypatch, module_or_class, "writer")   # that writer raises ENOSPC from now on
    crash_after(monkeypatch, module_or_class, "writer", n)  # the first n calls work, then ENOSPC
    torn(path, keep=0.5)                                 # cut a file to a fraction of its bytes
    garble(path)                                         # overwrite a file (or every file below
                                                         # a directory) with garbage
"""

from __future__ import annotations

import errno
import os
import pathlib


def _enospc(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, "No space left on device (injected)")


def disk_full(monkeypatch, owner, name: str) -> None:
    """Every later call of ``owner.name`` fails as a full disk would."""
    getattr(owner, name)  # fail loudly on a typo rather than patch nothing
    monkeypatch.setattr(owner, name, _enospc)


def crash_after(monkeypatch, owner, name: str, n: int) -> list:
    """The first ``n`` calls of ``owner.name`` run; the next one fails with ENOSPC (a crash
    part-way through a multi-file write). Returns the list of calls made (their arguments)."""
    real = getattr(owner, name)
    calls: list = []

    def wrapped(*args, **kwargs):
        calls.append(args)
        if len(calls) > n:
            _enospc()
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapped)
    return calls


def torn(path: str | os.PathLike, keep: float = 0.5) -> None:
    """Truncate ``path`` to ``keep`` of its bytes (a write cut short)."""
    path = pathlib.Path(path)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def garble(path: str | os.PathLike) -> int:
    """Overwrite ``path`` (or every file below it) with garbage bytes; returns how many files."""
    path = pathlib.Path(path)
    files = [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]
    for f in files:
        f.write_bytes(b"\0garbage\xff" * 3)
    if not files:
        raise FileNotFoundError(f"nothing to garble at {path}")
    return len(files)
