"""How long the run will take: once its first steps are measured, one line with the seconds per step and the time
``max_steps`` needs, and a warning when that is more than a month (``max_steps: 1e29`` would otherwise train until
killed without a word)."""

from __future__ import annotations

import logging
import time

from transformers import TrainerCallback


logger = logging.getLogger(__name__)

MEASURED_STEPS = 2  # steps timed before the estimate (the first includes start-up work: an over- rather than under-)
WARN_DAYS = 30


def duration(seconds: float) -> str:
    """``seconds`` in the unit that reads best: s, min, h or days."""
    for unit, size, limit in (("s", 1, 90), ("min", 60, 90 * 60), ("h", 3600, 48 * 3600)):
        if seconds < limit:
            return f"{seconds / size:.1f} {unit}" if unit != "s" else f"{seconds:.0f} s"
    return f"{seconds / 86400:,.0f} days"


class EtaCallback(TrainerCallback):
    """Logs ``step 2 of N: S s/step, about T for max_steps`` on rank 0 once, from this run's first steps (a resumed
    run counts from where it resumed)."""

    def __init__(self):
        self._start: tuple[float, int] | None = None
        self._done = False

    def on_train_begin(self, args, state, control, **kwargs):
        self._start, self._done = (time.monotonic(), state.global_step), False

    def on_step_end(self, args, state, control, **kwargs):
        if self._done or self._start is None or state.global_step - self._start[1] < MEASURED_STEPS:
            return
        self._done = True
        if not state.is_world_process_zero:
            return
        per_step = (time.monotonic() - self._start[0]) / (state.global_step - self._start[1])
        left = max(int(state.max_steps) - state.global_step, 0)
        logger.info(
            "step %d of %d: %.1f s/step, about %s for max_steps (%d steps left)",
            state.global_step,
            state.max_steps,
            per_step,
            duration(per_step * left),
            left,
        )
        if per_step * left > WARN_DAYS * 86400:
            logger.warning(
                "max_steps %d would take about %s at %.1f s/step: lower max_steps to the steps you mean to train",
                state.max_steps,
                duration(per_step * left),
                per_step,
            )
