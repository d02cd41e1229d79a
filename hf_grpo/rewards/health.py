"""Is the reward signal alive? The trainer hands every scored batch's finite rewards to ``RewardHealth.check``:
an error after ``max_unscored_calls`` batches in a row in which no completion could be scored (every reward function
returned None or +-inf), a loud log line for each such batch, and a warning after a long run of all-zero rewards."""

from __future__ import annotations

import logging

import torch

from .wrapper import DEFAULT_MAX_FAILED_CALLS, RewardFailedError


logger = logging.getLogger(__name__)

ZERO_REWARD_PATIENCE = 20  # generation batches of all-zero rewards before a loud warning


class RewardHealth:
    def __init__(self, names: list[str], max_unscored_calls: int = DEFAULT_MAX_FAILED_CALLS):
        self.names = names
        self.max_unscored_calls = max_unscored_calls  # reward_max_failed_calls (pipeline.py sets the recipe's)
        self.unscored_calls = 0  # consecutive scoring calls in which no completion got a reward
        self.zero_reward_batches = 0

    def check(self, finite: torch.Tensor, total: int, step: int) -> None:
        """``finite``: the batch's finite total rewards (all processes), of ``total`` completions, at ``step``."""
        self.unscored_calls = self.unscored_calls + 1 if finite.numel() == 0 else 0
        if finite.numel() == 0:
            logger.error(
                "REWARDS: every reward function returned None for all %d completions of this batch (step %d): the "
                "rewards are broken or timing out (see rewards/*/timeouts and rewards/*/errors)",
                total,
                step,
            )
        if self.unscored_calls >= self.max_unscored_calls:
            raise RewardFailedError(
                f"no completion got a reward in {self.unscored_calls} consecutive batches (step {step}; "
                f"reward_max_failed_calls: {self.max_unscored_calls}): every reward function "
                f"({', '.join(self.names)}) returned None or ±inf for all of them; check that they can score this "
                "model's output and the dataset's gold column"
            )
        self.zero_reward_batches = self.zero_reward_batches + 1 if finite.numel() == 0 or not finite.any() else 0
        if self.zero_reward_batches == ZERO_REWARD_PATIENCE:
            logger.warning(
                "REWARDS: all rewards have been 0 (or None) for %d batches in a row (step %d): check that the reward "
                "functions can score this model's output format (grade/unparseable) and the gold column",
                ZERO_REWARD_PATIENCE,
                step,
            )
