"""Which rows of a generation train together, and what dynamic sampling's fill rows weigh.

TRL shuffles a generation's rows and cuts them into ``steps_per_generation`` micro-batches, which scatters each
prompt's group over several; the shared forward (``hf_grpo.training.shared_prompts``) runs a prompt once per micro-batch, so
``arrange`` puts each group's rows back side by side (``group_micro_batches``). That is exact only where the update does
not depend on how the rows are cut, so rows move only between micro-batches of the same optimizer step (a *window* of
``gcd(steps_per_generation, gradient_accumulation_steps)`` micro-batches: a window never straddles an optimizer step
nor a generation), and only when the loss sums per-row or per-token terms over one normaliser for the whole window
(``regroup_blocker`` names what prevents it: ``bnpo``'s per-micro-batch token count, the entropy bonus's and
``top_entropy_quantile``'s per-micro-batch means, an MoE router's aux loss). Elsewhere TRL's order stays; a prompt
that repeats within a micro-batch is still run once.

Fill rows (``dynamic_sampling_exhausted: fill``) have a zero completion mask, so they add nothing to a token-normalised
loss, but the losses that average over rows (``ROW_MEAN_LOSSES``) count them. ``arrange`` gives every micro-batch of a
window that holds fill rows ``fill_scale`` = window rows / real window rows, and the trainer multiplies the policy and
KL terms by it: the real rows of a window then weigh what they would if the fill rows were not there (their total
weight over an optimizer step is 1), however the rows are cut, regrouped or not.
"""

from __future__ import annotations

import logging
import math

import torch
from trl.trainer.utils import split_tensor_dict

from .shared_prompts import prompt_groups


logger = logging.getLogger(__name__)

ROW_MEAN_LOSSES = ("grpo", "sapo", "dr_grpo", "luspo")  # TRL's losses whose normaliser counts rows (_compute_loss)


def window(steps_per_generation: int, gradient_accumulation_steps: int) -> int:
    """Consecutive micro-batches of a generation that always belong to one optimizer step."""
    return math.gcd(steps_per_generation, gradient_accumulation_steps)


def regroup_blocker(trainer) -> str | None:
    """Why the micro-batches of ``trainer`` (a TRL GRPOTrainer) must keep TRL's order, or None when rows may move
    within a window."""
    args = trainer.args
    if trainer.loss_type == "bnpo":
        return "loss_type bnpo divides each micro-batch by its own token count"
    if trainer._entropy_bonus_enabled:
        return "the entropy bonus (entropy_coef, use_adaptive_entropy) is a mean over each micro-batch's tokens"
    if trainer.top_entropy_quantile < 1.0:
        return "top_entropy_quantile keeps the tokens above a quantile of each micro-batch"
    if trainer.aux_loss_enabled:
        return "the router aux loss is a mean over each micro-batch"
    if window(args.steps_per_generation, args.gradient_accumulation_steps) == 1:
        return (
            f"steps_per_generation {args.steps_per_generation} and gradient_accumulation_steps "
            f"{args.gradient_accumulation_steps} leave no two micro-batches of one generation in one optimizer step"
        )
    return None


def may_regroup(trainer) -> bool:
    """Whether ``trainer``'s micro-batches may be regrouped into whole groups; one line says why not."""
    blocker = regroup_blocker(trainer)
    if blocker:
        logger.info(
            "shared_prompts: micro-batches keep TRL's order (%s); a prompt repeated within one is still run once",
            blocker,
        )
    return blocker is None


def arrange(batches: list[dict], size: int, regroup: bool, row_mean: bool) -> list[dict]:
    """TRL's micro-batches of one generation (``_buffered_inputs``), window by window of ``size``: regrouped when
    ``regroup``, and with ``fill_scale`` where a ``row_mean`` loss meets fill rows."""
    arranged = []
    for start in range(0, len(batches), size):
        chunk = batches[start : start + size]
        if regroup and len(chunk) > 1:
            chunk = group_micro_batches(chunk)
        arranged.extend(weigh_fill_rows(chunk) if row_mean else chunk)
    return arranged


def weigh_fill_rows(chunk: list[dict]) -> list[dict]:
    """``chunk`` with ``fill_scale`` (a 0-dim tensor: rows / real rows of the chunk) in each micro-batch, when it
    holds both fill rows and real ones."""
    filled = [batch.get("filled") for batch in chunk]
    if any(f is None for f in filled):
        return chunk
    rows, real = sum(f.numel() for f in filled), sum(int((~f).sum()) for f in filled)
    if real in (0, rows):
        return chunk
    scale = torch.tensor(rows / real, device=filled[0].device)
    return [{**batch, "fill_scale": scale} for batch in chunk]


def group_order(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
    """A row order [R] that puts the rows of each distinct prompt side by side, prompts in the order of their first
    row: applied to a batch TRL shuffled, it keeps the shuffled order of the groups."""
    first, which = prompt_groups(prompt_ids, prompt_mask)
    return torch.sort(first[which], stable=True).indices  # by each row's prompt's first row


def group_micro_batches(batches: list[dict]) -> list[dict]:
    """Micro-batches with their rows reordered so that each prompt's rows sit side by side, groups in their shuffled
    order: a micro-batch then holds whole groups (where the window has room), whose prompt the shared forward runs
    once. The same rows and sizes."""
    merged = {}
    for key, first in batches[0].items():
        if first is None or (isinstance(first, torch.Tensor) and first.ndim == 0):
            merged[key] = first  # per micro-batch values TRL copies into each (num_items_in_batch)
        elif isinstance(first, torch.Tensor):
            merged[key] = torch.cat([batch[key] for batch in batches])
        else:
            merged[key] = [row for batch in batches for row in batch[key]]
    order = group_order(merged["prompt_ids"], merged["prompt_mask"])  # [R]
    for key, value in merged.items():
        if isinstance(value, torch.Tensor) and value.ndim > 0:
            merged[key] = value[order.to(value.device)]
        elif isinstance(value, list):
            merged[key] = [value[i] for i in order.tolist()]
    return split_tensor_dict(merged, len(batches))
