"""Progress of a build on stderr: a bar on a terminal, a line every few seconds in a log."""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kgen.cli.errors import echo_error

_stderr = Console(stderr=True)
#: Seconds between two progress lines when stderr is not a terminal.
PROGRESS_INTERVAL_S = 5.0


@contextlib.contextmanager
def progress(total: int, description: str, job: str = "build") -> Iterator[Callable[[int], None]]:
    """A function taking the number of items done: a rich bar on a terminal, else a line every few seconds.

    The line reads ``<job>: <done>/<total> done, <seconds> s``; the bar, ``<job> <description>``.
    """
    if _stderr.is_terminal:
        bar = Progress(TextColumn(f"[bold]{job}[/bold] {{task.description}}"), BarColumn(), MofNCompleteColumn(),
                       TimeElapsedColumn(), console=_stderr, transient=True)
        with bar:
            task = bar.add_task(description, total=total)
            yield lambda done: bar.update(task, completed=done)
        return
    started = last = time.monotonic()

    def line(done: int) -> None:
        nonlocal last
        now = time.monotonic()
        if now - last >= PROGRESS_INTERVAL_S or done == total:
            last = now
            echo_error(f"{job}: {done}/{total} done, {now - started:.1f} s")

    yield line
