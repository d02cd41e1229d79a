"""hf_grpo's GRPOTrainer: TRL's trainer with a few narrow overrides.

Overridden TRL hooks (each pinned by a signature test in ``tests/test_trl_hooks.py``):

- ``_calculate_rewards``: keeps the gathered per-function rewards of the batch for the hooks below.
- ``_generate_and_score_completions``: adds reward min/max metrics.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import trl

from .config import HfGRPOConfig


class GRPOTrainer(trl.GRPOTrainer):
    """``trl.GRPOTrainer`` plus hf_grpo's metrics. Takes the same arguments; ``args`` is an ``HfGRPOConfig``."""

    _tag_names: ClassVar[list[str]] = ["trl", "grpo", "hf_grpo"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not isinstance(self.args, HfGRPOConfig):
            raise TypeError(f"hf_grpo.GRPOTrainer needs an HfGRPOConfig, got {type(self.args).__name__}")
        self._last_rewards_per_func: torch.Tensor | None = None

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._last_rewards_per_func = rewards_per_func  # [B*G global, num_funcs], gathered across processes
        return rewards_per_func

    def record_metric(self, name: str, value: float, mode: str = "train") -> None:
        """Add a value to the metrics averaged into the next log record."""
        self._metrics[mode][name].append(value)

    def total_rewards(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        """Weighted sum over reward functions, NaN where every function returned None. [N, F] -> [N]."""
        weights = self.reward_weights.to(rewards_per_func.device)
        total = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)  # [N]
        total[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
        return total

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        mode = "train" if self.model.training else "eval"
        total = self.total_rewards(self._last_rewards_per_func)
        finite = total[~torch.isnan(total)]
        if finite.numel():
            self._metrics[mode]["reward/min"].append(finite.min().item())
            self._metrics[mode]["reward/max"].append(finite.max().item())
        return output
