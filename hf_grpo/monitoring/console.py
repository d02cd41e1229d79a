"""The console during training: one line per logged step that says whether the run goes well, instead of the
whole metric dictionary (about 40 keys) transformers prints at every logged step.

    step 3/12  reward 0.610  acc 0.550  kept 62% of groups in 2 rounds  kl 0.002  entropy 0.41  29.1 s/step  4.4 min left

A metric the run does not log (``kl`` with ``beta: 0``, ``kept`` without dynamic sampling) or that is not finite is
left out. ``s/step`` is the trainer's own time of the logged steps (``time/step``); the time left is the wall clock
since training started (evaluations and checkpoints included) per step, times the steps left. Only the console
changes: the log record reaches ``training_history.json`` and the trackers whole, as before (their callbacks come
first). While transformers' training bar is drawn, console log lines (the run watch's findings among them) are
written above it, each on a line of its own, not glued to the bar. ``install`` puts the lines in place of
transformers' printing; ``console_metrics: true`` keeps transformers' dictionary. In a notebook transformers' bar and
loss table stay, and the lines are printed below them.
"""

from __future__ import annotations

import logging
import math
import sys
import time

from tqdm import tqdm
from transformers import PrinterCallback, ProgressCallback, TrainerCallback

from ..training.eta import duration


EVAL_PREFIX = "eval_"  # transformers' evaluation records (eval_strategy); hf_grpo's held-out one, eval/, has its line
SUMMARY_KEY = "train_runtime"  # the record transformers logs once training ends


def _number(logs: dict, key: str) -> float | None:
    """``logs[key]`` when it is a finite number, else None (missing, None, nan, a string)."""
    value = logs.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def metric_parts(logs: dict) -> list[str]:
    """What a person reads of a step's log record: reward, training accuracy (a correctness reward's), the groups
    dynamic sampling kept (else the share of groups whose rewards differ), KL and entropy; those logged only."""
    parts = []
    for key, label, spec in (("reward", "reward", ".3f"), ("accuracy", "acc", ".3f")):
        value = _number(logs, key)
        if value is not None:
            parts.append(f"{label} {value:{spec}}")
    kept, rounds = _number(logs, "dynamic_sampling/kept_fraction"), _number(logs, "dynamic_sampling/rounds")
    equal = _number(logs, "frac_reward_zero_std")
    if kept is not None:
        where = "" if rounds is None else f" in {rounds:.3g} round{'' if rounds == 1 else 's'}"
        parts.append(f"kept {kept:.0%} of groups{where}")
    elif equal is not None:
        parts.append(f"signal in {1 - equal:.0%} of groups")
    for key in ("kl", "entropy"):
        value = _number(logs, key)
        if value is not None:
            parts.append(f"{key} {value:.3g}")
    return parts


def step_line(logs: dict, step: int, max_steps: int, seconds_left: float | None = None) -> str | None:
    """The console line of one log record at ``step``; None for a record the console does not show (hf_grpo's
    held-out accuracy, ``eval/accuracy``, which the evaluation logs as a line of its own)."""
    head = f"step {step}/{max_steps}" if max_steps > 0 else f"step {step}"
    if SUMMARY_KEY in logs:  # the end of training, with the metrics of the steps since the last logged one
        runtime = _number(logs, SUMMARY_KEY)
        done = f"{head}  done" + ("" if runtime is None else f" in {duration(runtime)}")
        return "  ".join([done, *metric_parts(logs)])
    evaluated = {k.removeprefix(EVAL_PREFIX): v for k, v in logs.items() if k.startswith(EVAL_PREFIX)}
    if evaluated:
        parts = metric_parts(evaluated)
        loss = _number(evaluated, "loss")
        parts = parts or ([] if loss is None else [f"loss {loss:.4g}"])
        return "  ".join([f"{head}  eval", *parts]) if parts else None
    parts = metric_parts(logs)
    seconds = _number(logs, "time/step")
    seconds = _number(logs, "step_time") if seconds is None else seconds  # TRL's own, without hf_grpo's trainer
    if seconds is not None:
        parts.append(f"{seconds:.3g} s/step")
    if not parts:  # a record of nothing the line shows (a metric a user's callback logs alone)
        return None
    if seconds_left is not None and seconds_left > 0:
        parts.append(f"{duration(seconds_left)} left")
    return "  ".join([head, *parts])


class StepLines:
    """The lines of one training: ``begin`` when it starts (a resumed run counts from its checkpoint's step), then
    ``line`` for each log record."""

    def __init__(self):
        self._start: tuple[float, int] | None = None

    def begin(self, state) -> None:
        self._start = (time.monotonic(), state.global_step)

    def seconds_left(self, state) -> float | None:
        if self._start is None or state.global_step <= self._start[1] or state.max_steps <= 0:
            return None
        per_step = (time.monotonic() - self._start[0]) / (state.global_step - self._start[1])
        return per_step * max(state.max_steps - state.global_step, 0)

    def line(self, state, logs: dict | None) -> str | None:
        if not logs:
            return None
        return step_line(logs, state.global_step, state.max_steps, self.seconds_left(state))


class _AboveTheBar(logging.Handler):
    """A console log handler's lines, written through ``tqdm.write`` (above every bar drawn, each its own line),
    formatted, filtered and levelled as that handler does."""

    def __init__(self, handler: logging.StreamHandler):
        super().__init__(handler.level)
        self.handler = handler

    def emit(self, record: logging.LogRecord) -> None:
        if not self.handler.filter(record):
            return
        try:
            tqdm.write(self.handler.format(record), file=self.handler.stream)
        except Exception:  # noqa: BLE001 - as logging's own handlers: handleError reports it, training goes on
            self.handleError(record)


def _is_console(handler: logging.Handler) -> bool:
    """A plain ``StreamHandler`` on the terminal's streams (``logging.basicConfig``'s, transformers' own); not a file,
    nor a subclass that keeps records (pytest's caplog)."""
    streams = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
    return type(handler) is logging.StreamHandler and any(handler.stream is s for s in streams)


class ConsoleProgress(ProgressCallback):
    """transformers' ``ProgressCallback`` (the training and prediction bars) writing ``StepLines``' line where it
    wrote the log record, and console log lines above the bar while it is drawn (main process)."""

    LOGGERS = ("", "transformers")  # the root logger (hf_grpo's, TRL's propagate to it) and transformers' own

    def __init__(self):
        super().__init__()
        self.lines = StepLines()
        self._swapped: list[tuple[logging.Logger, list[logging.Handler]]] = []

    def on_train_begin(self, args, state, control, **kwargs):
        super().on_train_begin(args, state, control, **kwargs)
        self.lines.begin(state)
        if state.is_world_process_zero:
            self._restore()
            for name in self.LOGGERS:
                logger = logging.getLogger(name)
                handlers = list(logger.handlers)
                if any(_is_console(h) for h in handlers):
                    self._swapped.append((logger, handlers))
                    logger.handlers = [_AboveTheBar(h) if _is_console(h) else h for h in handlers]

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None:
            line = self.lines.line(state, logs)
            if line is not None:
                tqdm.write(line)  # stdout, as transformers' record; the bars are cleared and drawn again below it

    def on_train_end(self, args, state, control, **kwargs):
        super().on_train_end(args, state, control, **kwargs)
        self._restore()

    def _restore(self) -> None:
        for logger, handlers in self._swapped:
            logger.handlers = handlers
        self._swapped = []


class ConsolePrinter(TrainerCallback):
    """``StepLines``' line printed for each log record (main process): in place of transformers' ``PrinterCallback``
    (``disable_tqdm``), or below a notebook's table."""

    def __init__(self):
        self.lines = StepLines()

    def on_train_begin(self, args, state, control, **kwargs):
        self.lines.begin(state)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero:
            line = self.lines.line(state, logs)
            if line is not None:
                print(line, flush=True)  # noqa: T201 - the console line, where PrinterCallback printed


def install(trainer) -> None:
    """The console lines in place of transformers' printing of ``trainer``'s log records, at its place in the
    callbacks (after the history and the trackers, which read the record first); nothing with ``console_metrics``.
    A notebook keeps transformers' ``NotebookProgressCallback`` (its bar and loss table print no dictionary), the
    lines printed after it."""
    if trainer.args.console_metrics:
        return
    callbacks = trainer.callback_handler.callbacks
    for index, callback in enumerate(callbacks):
        if type(callback) is ProgressCallback:
            callbacks[index] = ConsoleProgress()
            return
        if type(callback) is PrinterCallback:
            callbacks[index] = ConsolePrinter()
            return
        if type(callback).__name__ == "NotebookProgressCallback":  # not imported: it needs IPython
            callbacks.insert(index + 1, ConsolePrinter())
            return
