"""Reading a file kgen is handed by name (a spec, a cache entry): a regular file of bounded size, or an error.

A name can hold anything: a FIFO blocks the reader until a writer comes, a link to ``/dev/zero`` or a sparse
file feeds it without end. So the file's type and size are checked before it is opened, and again on the open
file (the name may have changed hands in between), and no more than the cap is ever read.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class NotARegularFile(ValueError):
    """The name holds a FIFO, a device, a folder or a socket."""


class FileTooLarge(ValueError):
    """The file holds more than the reader's cap."""


def read_regular_file(path: Path, cap: int) -> bytes:
    """The bytes of the regular file at ``path`` (links followed), at most ``cap`` of them.

    Raises :class:`NotARegularFile` or :class:`FileTooLarge` (both ValueErrors, their messages saying what the
    file is), or ``OSError`` if it cannot be read.
    """
    _check_regular(os.stat(path), cap)
    # O_NONBLOCK: a FIFO put in its place since the stat does not block the open; fstat then refuses it.
    with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)), "rb") as f:
        _check_regular(os.fstat(f.fileno()), cap)
        data = f.read(cap + 1)
    if len(data) > cap:
        raise FileTooLarge(f"it holds over the {_size(cap)} kgen reads")
    return data


def _check_regular(info: os.stat_result, cap: int) -> None:
    if not stat.S_ISREG(info.st_mode):
        kind = "a folder" if stat.S_ISDIR(info.st_mode) else "a FIFO" if stat.S_ISFIFO(info.st_mode) else \
            "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode) else "a socket or special file"
        raise NotARegularFile(f"it is {kind}, not a regular file")
    if info.st_size > cap:
        raise FileTooLarge(f"it is {info.st_size} bytes, over the {_size(cap)} kgen reads")


def _size(cap: int) -> str:
    return f"{cap >> 20} MiB" if cap >= 1 << 20 else f"{cap} bytes"
