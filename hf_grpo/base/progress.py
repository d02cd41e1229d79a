"""Progress bars for the waits hf_grpo adds around training: the warm start, held-out evaluations and extra
dynamic-sampling rounds. Every bar comes from ``progress_bar``, with the same rules: ``tqdm.auto`` (a widget in
Jupyter, text on stderr elsewhere), on the main process only, shown only where someone watches (``enabled=None``:
tqdm hides a text bar when stderr is not a terminal; ``True`` forces it, ``False`` and a trainer's ``disable_tqdm``
turn it off: ``enabled_for(args)``). With ``log_lines=True`` (a long wait) where no bar shows, a ``ProgressLog`` logs
the count, the rate and the time left every ``LOG_EVERY`` seconds instead. An argument passed here wins over tqdm's
``TQDM_*`` variables.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Self

from tqdm.auto import tqdm


logger = logging.getLogger(__name__)

LOG_EVERY = 30.0  # seconds between two progress lines of a ProgressLog


def is_main_process() -> bool:
    """True on the process that reports (rank 0), and in a plain single-process run."""
    from accelerate import PartialState

    return PartialState().is_main_process


def enabled_for(args) -> bool | None:
    """``enabled`` for a bar shown during training with ``args``: off with ``disable_tqdm``, else automatic."""
    return False if getattr(args, "disable_tqdm", False) else None


def progress_bar(
    total: int | None, desc: str, *, enabled: bool | None = None, log_lines: bool = False, **kwargs
) -> tqdm | ProgressLog:
    """A ``tqdm.auto`` bar following the module's rules (main process only; ``enabled`` None = only on a terminal
    or in a notebook, else, with ``log_lines``, a ``ProgressLog``). ``kwargs`` go to tqdm (``unit``, ``leave``...).
    Use it as a context manager, or ``close()``."""
    if enabled is not False and not is_main_process():  # (a bar that is off asks accelerate nothing)
        enabled = False
    if enabled is None and log_lines and not bar_shows():
        return ProgressLog(total, desc, kwargs.get("unit", "it"))
    return tqdm(total=total, desc=desc, disable=None if enabled is None else not enabled, dynamic_ncols=True, **kwargs)


def bar_shows() -> bool:
    """Whether an automatic bar shows: in a notebook (``tqdm.auto`` is its widget) or on a terminal (stderr)."""
    notebook = any(cls.__module__ == "tqdm.notebook" for cls in tqdm.__mro__)
    return notebook or (hasattr(sys.stderr, "isatty") and sys.stderr.isatty())


class ProgressLog:
    """What a bar would show, as log lines for a log file: ``evaluate: generate: 64/300 problems (21%), 5.3
    problems/s, 00:44 left`` every ``LOG_EVERY`` seconds (at the first update after it), and at ``close`` a line with
    the total time if it logged any. The part of tqdm's interface this package uses."""

    disable = False

    def __init__(self, total: int | None, desc: str, unit: str = "it"):
        self.total, self.desc, self.unit, self.n = total, desc, unit, 0
        self.start = self.last = time.monotonic()
        self.logged = False

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self.last >= LOG_EVERY:
            self.last, self.logged = now, True
            logger.info("%s", self.line(now))

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:  # (a bar's extra text: not logged)
        pass

    def line(self, now: float) -> str:
        """The progress so far: count, share of the total, rate and the time left at that rate."""
        elapsed = max(now - self.start, 1e-9)
        rate = self.n / elapsed
        done = f"{self.n}/{self.total} {self.unit}s ({100 * self.n / self.total:.0f}%)" if self.total else f"{self.n}"
        left = ""
        if self.total and rate > 0:
            left = f", {tqdm.format_interval((self.total - self.n) / rate)} left"
        return f"{self.desc}: {done}, {rate:.1f} {self.unit}s/s{left}"

    def close(self) -> None:
        if self.logged:
            elapsed = time.monotonic() - self.start
            logger.info("%s: %d %ss in %s", self.desc, self.n, self.unit, tqdm.format_interval(elapsed))
            self.logged = False

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class DeferredBar:
    """A ``progress_bar`` that appears only at the first ``show``: for a wait that is usually short (one
    dynamic-sampling round), so that the usual case draws nothing. A context manager: the bar closes on exit."""

    def __init__(self, total: int | None, desc: str, *, enabled: bool | None = None, **kwargs):
        self.total, self.desc, self.enabled, self.kwargs = total, desc, enabled, kwargs
        self.bar: tqdm | None = None

    def show(self, n: int, postfix: str) -> None:
        """Draw the bar (created on the first call) at ``n`` of its total, with ``postfix`` beside it."""
        if self.bar is None:
            self.bar = progress_bar(self.total, self.desc, enabled=self.enabled, **self.kwargs)
        self.bar.n = n
        self.bar.set_postfix_str(postfix)  # refreshes: the bar shows the new count now

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
