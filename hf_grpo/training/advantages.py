"""Advantage estimators beyond TRL's: the leave-one-out baseline (RLOO, NeMo RL's default), used by
``hf_grpo.GRPOTrainer`` when ``advantage_estimator: rloo``."""

from __future__ import annotations

import torch


def leave_one_out_advantages(rewards: torch.Tensor, num_generations: int, scale: str) -> torch.Tensor:
    """RLOO advantages: each reward minus the mean of the other valid rewards of its group. [N] -> [N].

    NaN rewards (unscorable) are left out of the baselines and get advantage 0. ``scale`` is TRL's
    ``scale_rewards``: ``group`` divides by the group std, ``batch`` by the batch std, ``none`` not at all.

    >>> leave_one_out_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0]), 3, "none")
    tensor([ 1.0000, -0.5000, -0.5000,  0.0000,  0.0000,  0.0000])
    """
    grouped = rewards.view(-1, num_generations)  # [N/G, G]
    valid = ~torch.isnan(grouped)
    filled = torch.nan_to_num(grouped, nan=0.0)
    count = valid.sum(dim=1, keepdim=True)  # [N/G, 1]
    others = (count - 1).clamp(min=1)
    baseline = (filled.sum(dim=1, keepdim=True) - filled) / others  # [N/G, G]
    advantages = torch.where(valid & (count > 1), filled - baseline, torch.zeros_like(filled))  # [N/G, G]
    if scale == "group":
        std = torch.stack(
            [row[v].std() if v.sum() > 1 else row.new_tensor(0.0) for row, v in zip(grouped, valid, strict=True)]
        )
        advantages = advantages / (std.unsqueeze(1) + 1e-4)
    elif scale == "batch":
        finite = rewards[~torch.isnan(rewards)]
        advantages = advantages / ((finite.std() if finite.numel() > 1 else 0.0) + 1e-4)
    return advantages.reshape(-1)  # [N]


def relog_advantages(logged, advantages: torch.Tensor) -> None:
    """Replace the last ``advantages.numel()`` values of ``logged`` (TRL's completions-table deque ``_logs
    ["advantages"]``, where TRL appended this batch's [B*G global] advantages last) with ``advantages``."""
    count = min(len(logged), advantages.numel())
    for _ in range(count):
        logged.pop()
    logged.extend(advantages[advantages.numel() - count :].tolist())
