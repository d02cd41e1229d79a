"""Trainer callbacks the tests share."""

from __future__ import annotations

from transformers import TrainerCallback


class StopAt(TrainerCallback):
    """Stops training at the end of optimizer step ``step`` (as a crash or a kill would, after its checkpoint)."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True
