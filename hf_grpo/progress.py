"""Progress bars for the waits hf_grpo adds around training: the warm start, held-out evaluations (before, every N
steps, after, and ``python -m hf_grpo.evaluate``) and extra dynamic-sampling rounds.

Every bar comes from ``progress_bar``, which applies the same rules everywhere:

- ``tqdm.auto``: an ipywidgets bar in Jupyter, a text bar on stderr elsewhere;
- the main process only (``accelerate.PartialState().is_main_process``), so a run on N processes shows one bar;
- ``enabled=None`` (the default) shows it only where someone watches: tqdm's ``disable=None`` hides a text bar when
  stderr is not a terminal (a log file, a pipe, captured test output), and ``tqdm.notebook`` always shows its widget;
  ``enabled=True`` forces it on (even when stderr is redirected), ``enabled=False`` off;
- a trainer's ``disable_tqdm`` (transformers' training argument) turns them off: ``enabled_for(args)``.

tqdm reads ``TQDM_*`` environment variables (``TQDM_MININTERVAL=5``...) as defaults for its keyword arguments; an
argument passed here wins, so ``TQDM_DISABLE`` does not switch these bars on or off: ``enabled`` does.
"""

from __future__ import annotations

from typing import Self

from tqdm.auto import tqdm


def is_main_process() -> bool:
    """True on the process that reports (rank 0), and in a plain single-process run."""
    from accelerate import PartialState

    return PartialState().is_main_process


def enabled_for(args) -> bool | None:
    """``enabled`` for a bar shown during training with ``args``: off with ``disable_tqdm``, else automatic."""
    return False if getattr(args, "disable_tqdm", False) else None


def progress_bar(total: int | None, desc: str, *, enabled: bool | None = None, **kwargs) -> tqdm:
    """A ``tqdm.auto`` bar following the module's rules (main process only; ``enabled`` None = only on a terminal
    or in a notebook). ``kwargs`` go to tqdm (``unit``, ``leave``...). Use it as a context manager, or ``close()``."""
    if enabled is not False and not is_main_process():  # (a bar that is off asks accelerate nothing)
        enabled = False
    return tqdm(total=total, desc=desc, disable=None if enabled is None else not enabled, dynamic_ncols=True, **kwargs)


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
