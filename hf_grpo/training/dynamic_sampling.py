"""Dynamic sampling (DAPO, https://huggingface.co/papers/2503.14476): keep only the prompt groups whose rewards
differ, and generate further rounds until every process has a full batch of them.

``DynamicSampler`` is what the trainer calls, once per generation (``batch``), with two functions of its own: one
that generates and scores a round (returning TRL's scored batch and the values to filter on) and one that computes
log-probabilities. Under it, pure tensor bookkeeping, unit-tested on hand-made rewards: ``keep_mask`` (a group is
kept when its values are not all equal), ``split_groups`` / ``collate_groups``, ``GroupPool`` (kept and carried-over
groups, first in first out), ``PromptStream`` (the extra prompts of later rounds) and ``save_state`` /
``load_state``. Prompt selection by reward history plugs in as a ``selection.Selector``. Details: docs/trainer.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from safetensors.torch import load_file, save_file

from ..base.progress import DeferredBar
from .prompt_selection import Selector


logger = logging.getLogger(__name__)


Group = dict[str, torch.Tensor]  # every tensor has G rows

PROMPT_KEYS = ("prompt_ids", "prompt_mask")  # left-padded
COMPLETION_KEYS = (  # right-padded along the completion axis
    "completion_ids",
    "completion_mask",
    "old_per_token_logps",
    "ref_per_token_logps",
    "sampling_per_token_logps",
    "tool_mask",
)
ROW_KEYS = ("advantages", "policy_version")  # policy_version: overlapped generation (generation/overlap.py)
STATE_FILE = "hf_grpo_state_rank{rank}.json"
POOL_FILE = "hf_grpo_pool_rank{rank}.safetensors"


def keep_mask(values: torch.Tensor, num_generations: int, atol: float = 1e-6) -> torch.Tensor:
    """Which groups carry a learning signal. ``values``: [N] (N = groups x G, group-major) -> [N / G] bool.

    >>> keep_mask(torch.tensor([1.0, 0.0, 1.0, 1.0, float("nan"), 0.0]), 2)
    tensor([ True, False, False])
    """
    grouped = values.view(-1, num_generations)  # [N/G, G]
    finite = ~torch.isnan(grouped)
    high = torch.where(finite, grouped, torch.full_like(grouped, -torch.inf)).max(dim=1).values  # [N/G]
    low = torch.where(finite, grouped, torch.full_like(grouped, torch.inf)).min(dim=1).values  # [N/G]
    return (finite.sum(dim=1) >= 2) & ((high - low) > atol)


def split_groups(batch: dict, num_generations: int, token_level_keys: tuple[str, ...] = ()) -> list[Group]:
    """Cut a scored batch into groups of ``num_generations`` rows (``num_items_in_batch`` is dropped)."""
    keys = [k for k in batch if k != "num_items_in_batch"]
    allowed = (
        set(PROMPT_KEYS) | set(COMPLETION_KEYS) | set(ROW_KEYS) | set(token_level_keys) | {"importance_sampling_ratio"}
    )
    unsupported = [k for k in keys if k not in allowed]
    if unsupported:
        raise NotImplementedError(
            f"dynamic_sampling supports text-only batches; this batch also has {unsupported} "
            "(multimodal inputs or tools). Set dynamic_sampling: false."
        )
    rows = batch["completion_ids"].size(0)
    if rows % num_generations:
        raise ValueError(f"batch of {rows} rows is not made of whole groups of {num_generations}")
    return [{k: batch[k][start : start + num_generations] for k in keys} for start in range(0, rows, num_generations)]


def _pad_to(tensor: torch.Tensor, width: int, value: float, left: bool) -> torch.Tensor:
    missing = width - tensor.size(1)
    if missing <= 0:
        return tensor
    pad = tensor.new_full((tensor.size(0), missing, *tensor.shape[2:]), value)
    return torch.cat([pad, tensor] if left else [tensor, pad], dim=1)


def collate_groups(groups: list[Group], pad_token_id: int, token_level_keys: tuple[str, ...] = ()) -> dict:
    """Concatenate groups into one batch, re-padding prompts (left) and completions (right) to the widest."""
    completion_keys = COMPLETION_KEYS + tuple(token_level_keys)
    pad_values = {"prompt_ids": pad_token_id, "completion_ids": pad_token_id, "tool_mask": 1}
    keys = list(dict.fromkeys(k for g in groups for k in g))  # every group's keys, first seen first
    missing = [k for k in keys if any(k not in g for g in groups)]
    if missing:
        raise ValueError(f"cannot collate groups: {missing} present in some groups only")
    batch = {}
    for key in keys:
        parts = [g[key] for g in groups]
        if key in PROMPT_KEYS or key in completion_keys:
            width = max(p.size(1) for p in parts)
            parts = [_pad_to(p, width, pad_values.get(key, 0), left=key in PROMPT_KEYS) for p in parts]
        batch[key] = torch.cat(parts, dim=0)
    return batch


@dataclass
class GroupPool:
    """Kept groups waiting to be trained on, oldest first. After each step the trainer trims it to one step's worth
    (``trim``), so a carried group is trained on in the next step and never waits longer, however many rounds other
    processes needed."""

    groups: list[Group] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.groups)

    def add(self, groups: list[Group]) -> None:
        self.groups.extend(groups)

    def take(self, n: int) -> list[Group]:
        """The ``n`` oldest groups (fewer if the pool is smaller), removed from the pool."""
        taken, self.groups = self.groups[:n], self.groups[n:]
        return taken

    def trim(self, limit: int, keep_newest: bool = False) -> int:
        """Drop the groups beyond ``limit``, the newest ones (or with ``keep_newest`` the oldest: under overlap the
        oldest are those of the previous policy, which ``drop_older`` discards at the next step anyway); returns how
        many were dropped."""
        dropped = max(len(self.groups) - limit, 0)
        del self.groups[slice(0, dropped) if keep_newest else slice(limit, None)]
        return dropped

    def drop_older(self, version: int) -> int:
        """Drop the groups a policy older than ``version`` generated (overlap's staleness bound); returns how many."""
        kept = [g for g in self.groups if "policy_version" not in g or int(g["policy_version"][0]) >= version]
        dropped, self.groups = len(self.groups) - len(kept), kept
        return dropped

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Flat ``{"<index>.<key>": tensor}`` for safetensors."""
        return {f"{i}.{k}": t.detach().cpu().contiguous() for i, g in enumerate(self.groups) for k, t in g.items()}

    @classmethod
    def from_state_tensors(cls, tensors: dict[str, torch.Tensor], device) -> GroupPool:
        groups: dict[int, Group] = {}
        for name, tensor in tensors.items():
            index, _, key = name.partition(".")
            groups.setdefault(int(index), {})[key] = tensor.to(device)
        return cls([groups[i] for i in sorted(groups)])


def assemble_batch(pool: GroupPool, dropped: list[Group], needed: int) -> tuple[list[Group], int]:
    """The ``needed`` groups to train on: the oldest kept groups first, then, when the pool is short (the
    generation budget ran out), the most recently dropped groups. Returns ``(groups, number filled)``.

    >>> pool = GroupPool([{"x": torch.tensor([1])}, {"x": torch.tensor([2])}])
    >>> groups, filled = assemble_batch(pool, [{"x": torch.tensor([9])}], needed=3)
    >>> [int(g["x"]) for g in groups], filled, len(pool)
    ([1, 2, 9], 1, 0)
    """
    groups = pool.take(needed)
    filled = needed - len(groups)
    if filled > len(dropped):
        raise ValueError(f"cannot fill {filled} groups from {len(dropped)} dropped ones")
    return groups + (dropped[len(dropped) - filled :] if filled else []), filled


@dataclass
class PromptStream:
    """Endless shuffled stream of dataset indices for extra generation rounds; state = ``(epoch, cursor)``.

    Every process holds the same stream and reads the same global slice each round, then keeps its own share, so
    processes stay in step without communicating.
    """

    size: int
    seed: int
    epoch: int = 0
    cursor: int = 0
    # The current epoch's permutation, derived from (seed, epoch) and kept between calls: drawing it anew each round
    # costs ~0.8 s on a 14M-row dataset.
    _order_cache: tuple[int, torch.Tensor] | None = field(default=None, repr=False, compare=False)

    def _order(self) -> torch.Tensor:
        if self._order_cache is None or self._order_cache[0] != self.epoch:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            self._order_cache = (self.epoch, torch.randperm(self.size, generator=generator))  # [size]
        return self._order_cache[1]

    def next(self, n: int) -> list[int]:
        """The next ``n`` indices (wrapping into a new shuffled epoch when needed)."""
        out: list[int] = []
        while len(out) < n:
            order = self._order()
            take = order[self.cursor : self.cursor + n - len(out)].tolist()
            out += take
            self.cursor += len(take)
            if self.cursor >= self.size:
                self.epoch, self.cursor = self.epoch + 1, 0
        return out

    def state(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor}


def save_state(
    folder: str, rank: int, stream: PromptStream, pool: GroupPool, keep_digest: str, selection: dict | None = None
) -> None:
    """Write process ``rank``'s sampling state into checkpoint ``folder``: the stream position, the carried groups'
    count, the digest of every keep decision and prompt selection's history (``STATE_FILE``), and the carried groups
    (``POOL_FILE``)."""
    os.makedirs(folder, exist_ok=True)
    state = {"stream": stream.state(), "pool_groups": len(pool), "keep_digest": keep_digest, "selection": selection}
    with open(os.path.join(folder, STATE_FILE.format(rank=rank)), "w") as f:
        json.dump(state, f)
    save_file(pool.state_tensors(), os.path.join(folder, POOL_FILE.format(rank=rank)))


def load_state(checkpoint: str, rank: int, stream: PromptStream, device, overlap: bool = True) -> GroupPool:
    """Move ``stream`` to where ``save_state`` left it in ``checkpoint`` and return the carried groups, on ``device``.

    Without ``overlap`` the groups lose the ``policy_version`` an overlapped run recorded (fresh groups have none)."""
    path = os.path.join(checkpoint, STATE_FILE.format(rank=rank))
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{path} is missing: the checkpoint was written without dynamic sampling or with a different number "
            "of processes; resume with the same dynamic_sampling setting and process count"
        )
    with open(path) as f:
        state = json.load(f)
    stream.epoch, stream.cursor = state["stream"]["epoch"], state["stream"]["cursor"]
    pool = GroupPool.from_state_tensors(load_file(os.path.join(checkpoint, POOL_FILE.format(rank=rank))), device)
    if not overlap:
        for group in pool.groups:
            group.pop("policy_version", None)
    return pool


def load_selection(checkpoint: str, rank: int) -> dict | None:
    """Prompt selection's history as ``save_state`` wrote it into ``checkpoint`` (``selection.PromptHistory``); None
    when it was saved with prompt selection off."""
    with open(os.path.join(checkpoint, STATE_FILE.format(rank=rank))) as f:
        return json.load(f).get("selection")


# ---------------------------------------------------------------------------------------------------------------------
# The rounds of one step


class SamplingExhausted(RuntimeError):
    """``dynamic_sampling_exhausted: error``: after ``max_generation_batches`` rounds a process still lacked groups
    with varying rewards. Raised on every process at once (the count is gathered); ``hf_grpo.train`` ends the run
    with one line and the resume command."""


ScoreRound = Callable[[list[dict]], tuple[dict, torch.Tensor]]  # rows -> (TRL's scored batch, values [B*G global])
OldLogps = Callable[[dict], torch.Tensor]  # a collated batch -> its completions' per-token log-probs [B, C]


class DynamicSampler:
    """One process's dynamic sampling: the prompt stream of further rounds, the pool of kept groups carried between
    steps, prompt selection (optional) and the digest of every keep decision (tests compare it across processes).

    ``accelerator`` is only gathered through; ``dataset`` gives the rows of further rounds; ``max_staleness`` (overlapped
    generation) drops carried groups an older policy generated and trims the pool from the oldest; ``further_round``
    is called with (round index, this process's rows) before such a round is scored (overlap generates it now).
    """

    def __init__(
        self,
        accelerator,
        dataset,
        num_generations: int,
        *,
        seed: int,
        max_rounds: int,
        exhausted: str,
        pad_token_id: int,
        selector: Selector | None = None,
        max_staleness: int | None = None,
        further_round: Callable[[int, list[dict]], None] | None = None,
        progress: bool = False,
    ):
        self.accelerator, self.dataset, self.num_generations = accelerator, dataset, num_generations
        self.max_rounds, self.exhausted, self.pad_token_id = max_rounds, exhausted, pad_token_id
        self.selector, self.max_staleness, self.further_round = selector, max_staleness, further_round
        self.progress = progress
        self.stream = PromptStream(len(dataset), seed)
        self.pool = GroupPool()
        self.keep_digest = hashlib.sha256()

    def _gather(self, value: int) -> torch.Tensor:
        return self.accelerator.gather(torch.tensor([value], device=self.accelerator.device))  # [P]

    def batch(
        self,
        inputs: list[dict],
        step: int,
        score: ScoreRound,
        old_logps: OldLogps,
        token_keys: tuple[str, ...],
        reference_logps: OldLogps | None = None,
    ) -> tuple[dict, dict[str, float]]:
        """Step ``step``'s batch for this process from the dataloader's ``inputs`` (``num_generations`` rows per
        prompt): rounds of ``score`` until every process holds as many kept groups as ``inputs`` has, or
        ``max_rounds``; then the batch and the step's metrics (``dynamic_sampling/*``, ``selection/*``).
        ``reference_logps``: the rounds did not compute ``ref_per_token_logps``; it runs once on the batch."""
        needed = len(inputs) // self.num_generations  # groups this process trains on
        metrics = {}
        if self.max_staleness is not None:  # carried groups older than generation.max_staleness are not trained on
            metrics["async/stale_dropped"] = self.pool.drop_older(step - 1 - self.max_staleness)
        carried = len(self.pool)
        if self.selector is not None and self.max_staleness is None:  # overlap sent round 1 before it was known
            inputs = self.selector.first_round(inputs, self.stream, step, self.accelerator.process_index)
        dropped, output, rounds, generated, kept = self._rounds(inputs, step, score, needed, token_keys)
        batch_groups, filled = assemble_batch(self.pool, dropped, needed)
        # Rounds run until the process with the fewest kept groups has enough; the others keep at most one step's
        # worth, or their surplus would grow without bound and wait ever longer (GroupPool).
        surplus = self.pool.trim(needed, keep_newest=self.max_staleness is not None)
        exhausted = self._check_exhausted(filled, needed, kept / generated, step)
        if "old_per_token_logps" not in output:  # TRL did not need them; carried groups do (docs/trainer.md)
            missing = [g for g in self.pool.groups if "old_per_token_logps" not in g]
            if any("old_per_token_logps" in g for g in batch_groups):
                missing += [g for g in batch_groups if "old_per_token_logps" not in g]
            self._fill_old_logps(missing, batch_groups[0], old_logps, token_keys)
        if reference_logps is not None:  # a group carried from a checkpoint may hold them: the batch gets one pass
            batch_groups = [{k: v for k, v in g.items() if k != "ref_per_token_logps"} for g in batch_groups]
        batch = collate_groups(batch_groups, self.pad_token_id, token_keys)
        if reference_logps is not None:  # every process makes one pass (a collective under ZeRO-3)
            batch["ref_per_token_logps"] = reference_logps(batch)  # [B, C], before fill rows lose their mask
        if filled:  # fill groups come last; out of the loss, or beta > 0 adds their KL gradient and dapo their tokens
            batch["completion_mask"][-filled * self.num_generations :] = 0  # [B, C]
            rows = batch["advantages"].size(0)  # [B]: out of the row count of row-mean losses too (compute_loss)
            batch["filled"] = (
                torch.arange(rows, device=batch["advantages"].device) >= rows - filled * self.num_generations
            )
        mask = batch["completion_mask"] if "tool_mask" not in batch else batch["completion_mask"] * batch["tool_mask"]
        batch["num_items_in_batch"] = self.accelerator.gather(mask.sum()).sum()
        metrics |= {
            "dynamic_sampling/rounds": rounds,
            "dynamic_sampling/kept_fraction": kept / generated,
            "dynamic_sampling/generated_per_trained": generated / (needed * self.accelerator.num_processes),
            "dynamic_sampling/carried_in": carried,
            "dynamic_sampling/carry_out": len(self.pool),
            "dynamic_sampling/surplus_dropped": surplus,
            "dynamic_sampling/exhausted": float(exhausted > 0),
        }
        return batch, metrics | (self.selector.end_step(kept / generated) if self.selector is not None else {})

    def _rounds(self, inputs, step: int, score: ScoreRound, needed: int, token_keys) -> tuple:
        """Score rounds into the pool until every process has ``needed`` groups or ``max_rounds`` ran; returns
        (this step's dropped groups, the last scored batch, rounds, groups generated and kept by all processes)."""
        g, rank, processes = self.num_generations, self.accelerator.process_index, self.accelerator.num_processes
        dropped: list[Group] = []
        rounds, generated, kept = 0, 0, 0
        # Extra rounds get a bar (main process, a terminal or a notebook, not with disable_tqdm) of the groups ready
        # for this process's batch; the usual single round draws nothing. Every round is logged at DEBUG.
        with DeferredBar(
            needed, f"step {step}: dynamic sampling", enabled=self.progress, unit="group", leave=False
        ) as bar:
            while True:
                rounds += 1
                output, values = score(inputs)  # values: [B*G global]
                keep_global = keep_mask(values, g).cpu()  # [groups of all processes]
                if self.selector is not None:
                    self.selector.record_round(inputs, keep_global, values, step)
                self.keep_digest.update(bytes(keep_global.to(torch.uint8).tolist()))
                keep_local = keep_global.view(processes, -1)[rank].tolist()  # [groups of this process]
                groups = split_groups(output, g, token_keys)
                self.pool.add([group for group, k in zip(groups, keep_local, strict=True) if k])
                dropped += [group for group, k in zip(groups, keep_local, strict=True) if not k]
                generated, kept = generated + keep_global.numel(), kept + int(keep_global.sum())
                ready = min(int(self._gather(len(self.pool)).min()), needed)
                kept_now = f"{int(keep_global.sum())}/{keep_global.numel()} groups kept, {ready}/{needed} ready"
                logger.debug("dynamic sampling, step %d round %d/%d: %s", step, rounds, self.max_rounds, kept_now)
                if ready >= needed or rounds >= self.max_rounds:
                    return dropped, output, rounds, generated, kept
                bar.show(ready, f"round {rounds + 1}/{self.max_rounds}, {kept}/{generated} groups kept")
                inputs = self._next_round(needed, step, index=rounds)

    def _next_round(self, groups: int, step: int, index: int) -> list[dict]:
        """Further round ``index``: this process's share of the stream's next prompts, each num_generations times."""
        rank, total = self.accelerator.process_index, groups * self.accelerator.num_processes
        if self.selector is None:
            indices = self.stream.next(total)
        else:  # past the prompts the reward history skips
            indices = self.selector.draw(self.stream, total, step, index)
        rows = [self.dataset[i] for i in indices[rank * groups : (rank + 1) * groups]]
        if self.further_round is not None:  # overlapped: drawn as a synchronous run draws them, generated now
            self.further_round(index, rows)
        return [row for row in rows for _ in range(self.num_generations)]

    def _fill_old_logps(self, groups: list, dummy: Group, old_logps: OldLogps, token_keys) -> None:
        """Add ``old_per_token_logps`` to ``groups``. Every process runs the same number of forward passes (padding
        with copies of ``dummy``), since under ZeRO-3 a forward pass is a collective operation."""
        count = int(self._gather(len(groups)).max())
        if count == 0:
            return
        pad = {k: v for k, v in dummy.items() if not groups or k in groups[0]}  # a carried dummy has old log-probs
        logps = old_logps(collate_groups(groups + [pad] * (count - len(groups)), self.pad_token_id, token_keys))
        for i, group in enumerate(groups):  # logps: [count * G, C]
            rows = slice(i * self.num_generations, (i + 1) * self.num_generations)
            group["old_per_token_logps"] = logps[rows, : group["completion_ids"].size(1)]

    def _check_exhausted(self, filled: int, needed: int, kept_fraction: float, step: int) -> int:
        """The most groups any process had to fill after the last round; an error or a warning when any did."""
        exhausted = int(self._gather(filled).max())
        if exhausted:
            message = (
                f"dynamic sampling: after max_generation_batches={self.max_rounds} rounds a process still lacked "
                f"{exhausted} of {needed} groups with varying rewards ({1 - kept_fraction:.0%} of generated groups "
                "had all-equal rewards); the prompts are too easy or too hard for the policy"
            )
            if self.exhausted == "error":
                raise SamplingExhausted(
                    f"{message} (generating step {step}); raise max_generation_batches or set "
                    "dynamic_sampling_exhausted: fill"
                )
            logger.warning("%s; filled the batch with zero-advantage groups (step %d)", message, step - 1)
        return exhausted

    def save(self, folder: str, rank: int) -> None:
        selection = self.selector.history.state_dict() if self.selector is not None else None
        save_state(folder, rank, self.stream, self.pool, self.keep_digest.hexdigest(), selection)

    def load(self, checkpoint: str, rank: int) -> None:
        overlap = self.max_staleness is not None
        self.pool = load_state(checkpoint, rank, self.stream, self.accelerator.device, overlap=overlap)
        selection = load_selection(checkpoint, rank) if self.selector is not None else None
        if selection is not None:  # else prompt selection starts with an empty history (resume_target warned)
            self.selector.history.load_state_dict(selection)
