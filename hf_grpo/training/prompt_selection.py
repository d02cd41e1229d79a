"""Prompt selection by reward history: skip, before generating them, the prompts whose recent groups taught nothing.

Dynamic sampling drops a group whose samples all got the same reward (all right or all wrong), after paying for its
generation. Most prompts that gave such a group give one again the next time (GRESO, arXiv 2506.02177), so this
module keeps, for every prompt a run has generated, how many of its groups in a row gave no signal and whether the
last of them was "solved" (equal rewards above 0) or "failed" (all 0), and skips the prompt before generation with

    p_skip = min(1 - explore[kind] ** streak, max_skip)

so one empty group skips it with probability 1 - explore, a longer streak more, and it always comes back at least
``1 - max_skip`` of the times it is drawn. ``explore`` starts at ``explore_start`` per kind and is adapted after
each step: lowered by ``rate`` while the step kept a smaller share of its groups than ``target_kept`` (too much
generation wasted), raised while it kept more, within ``[explore_floor, 1]``.

Every decision is a uniform number hashed from (seed, step, round, prompt key), not drawn from a random generator:
every process holds the same history (it is updated with the gathered outcome of every group) and so decides the
same, and a run resumed from a checkpoint (``state_dict``) decides exactly as the uninterrupted run would.

``Selector`` is what the trainer calls (``prompt_selection: true``, with dynamic sampling): it replaces the skipped
prompts of the dataloader's first round with prompts drawn from the dynamic-sampling ``PromptStream``, draws the
further rounds' prompts past skipped ones, records each round's gathered outcome and adapts after each step. With
overlapped generation the first round has been sent before it is known, so only further rounds are selected.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field


KINDS = ("solved", "failed")
MAX_DRAWS = 8  # passes over the stream for one round's prompts; then the rest is generated unselected


@dataclass
class Record:
    """One prompt's history: no-signal groups in a row, the kind of the last one, the step it was last generated."""

    streak: int = 0
    kind: str | None = None
    step: int = 0


@dataclass
class PromptHistory:
    target_kept: float = 0.75
    explore_start: float = 0.5
    rate: float = 0.05
    explore_floor: float = 0.05
    max_skip: float = 0.95
    seed: int = 0
    explore: dict[str, float] = field(default_factory=dict)
    records: dict[int, Record] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, value in (("target_kept", self.target_kept), ("explore_start", self.explore_start)):
            if not 0 < value <= 1:
                raise ValueError(f"prompt selection: {name} must be in (0, 1], got {value}")
        if not 0 <= self.max_skip < 1:
            raise ValueError(
                f"prompt selection: max_skip must be in [0, 1) so that a prompt comes back, got {self.max_skip}"
            )
        for kind in KINDS:
            self.explore.setdefault(kind, self.explore_start)

    # -- what happened -------------------------------------------------------------------------------------------

    def record(self, key: int, signal: bool, value: float, step: int) -> None:
        """One generated group of prompt ``key`` at optimizer step ``step``: whether dynamic sampling kept it
        (``signal``, its rewards differ) and, when not, their common ``value`` (above 0: solved, else failed)."""
        entry = self.records.setdefault(key, Record())
        entry.step = step
        if signal:  # the streak ends
            entry.streak, entry.kind = 0, None
            return
        entry.streak += 1
        entry.kind = "solved" if value > 0 else "failed"

    def adapt(self, kept_fraction: float) -> None:
        """After a step: skip more while fewer groups than ``target_kept`` were kept, less while more were."""
        step = -self.rate if kept_fraction < self.target_kept else self.rate
        for kind in KINDS:
            self.explore[kind] = min(1.0, max(self.explore_floor, self.explore[kind] + step))

    # -- what to generate ----------------------------------------------------------------------------------------

    def skip_probability(self, key: int) -> float:
        entry = self.records.get(key)
        if entry is None or entry.streak == 0:
            return 0.0
        return min(1.0 - self.explore[entry.kind] ** entry.streak, self.max_skip)

    def uniform(self, key: int, step: int, round_index: int) -> float:
        """A number in [0, 1) that depends only on the seed, the step, the round and the prompt."""
        digest = hashlib.blake2b(f"{self.seed}:{step}:{round_index}:{key}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2**64

    def keep(self, keys: list[int], step: int, round_index: int) -> list[bool]:
        """Which of ``keys`` to generate at this step and round (False: skipped)."""
        return [self.uniform(key, step, round_index) >= self.skip_probability(key) for key in keys]

    # -- logging and checkpoints ---------------------------------------------------------------------------------

    def stats(self, long_streak: int = 4) -> dict[str, float]:
        """The history's size, how many prompts gave no signal ``long_streak`` times or more in a row (the policy
        running out of learnable prompts shows here), and the current exploration probabilities."""
        return {
            "selection/history_size": len(self.records),
            "selection/long_streaks": sum(r.streak >= long_streak for r in self.records.values()),
            **{f"selection/explore_{kind}": self.explore[kind] for kind in KINDS},
        }

    def state_dict(self) -> dict:
        return {
            "explore": dict(self.explore),
            "records": {str(key): [r.streak, r.kind, r.step] for key, r in self.records.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        self.explore = {kind: float(state["explore"][kind]) for kind in KINDS}
        self.records = {int(k): Record(streak, kind, step) for k, (streak, kind, step) in state["records"].items()}


def prompt_key(prompt) -> int:
    """A prompt's key in the history: a 63-bit hash of its text (a chat prompt: of its messages), the same on every
    process, so that the keys of a round can be gathered as one int64 tensor."""
    text = prompt if isinstance(prompt, str) else repr([(m["role"], m["content"]) for m in prompt])
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") >> 1


class Selector:
    """The trainer's side of prompt selection: which prompts each round generates, and what the rounds taught.

    ``gather`` takes this process's list of ints and returns every process's, concatenated in process order (the
    trainer's ``accelerator.gather``); every process calls each method at the same point with lists of equal length.
    """

    def __init__(
        self, history: PromptHistory, dataset, num_generations: int, gather: Callable[[list[int]], list[int]]
    ):
        self.history, self.dataset, self.num_generations, self.gather = history, dataset, num_generations, gather
        self._keys: dict[int, int] = {}  # dataset index -> prompt key, computed once
        self.skipped = 0  # prompts skipped (all processes) since the last end_step

    def key_of(self, index: int) -> int:
        if index not in self._keys:
            self._keys[index] = prompt_key(self.dataset[index]["prompt"])
        return self._keys[index]

    def draw(self, stream, n: int, step: int, round_index: int) -> list[int]:
        """The stream's next ``n`` dataset indices that are not skipped (the same on every process)."""
        chosen: list[int] = []
        for _ in range(MAX_DRAWS):
            if len(chosen) == n:
                return chosen
            candidates = stream.next(n - len(chosen))
            keep = self.history.keep([self.key_of(i) for i in candidates], step, round_index)
            chosen += [i for i, k in zip(candidates, keep, strict=True) if k]
            self.skipped += keep.count(False)
        return chosen + stream.next(n - len(chosen))  # nearly every prompt is skipped: generate these anyway

    def first_round(self, inputs: list[dict], stream, step: int, rank: int) -> list[dict]:
        """The dataloader's rows for this step (``num_generations`` per prompt) with each skipped prompt's group
        replaced by one of a prompt drawn from ``stream``; every process replaces its own skipped groups."""
        g = self.num_generations
        keep = self.history.keep([prompt_key(row["prompt"]) for row in inputs[::g]], step, 0)
        missing = self.gather([keep.count(False)])  # [P]
        if not any(missing):
            return inputs
        self.skipped += sum(missing)
        start = sum(missing[:rank])
        mine = iter(self.draw(stream, sum(missing), step, 0)[start : start + missing[rank]])
        rows: list[dict] = []
        for i, kept in enumerate(keep):
            rows += inputs[i * g : (i + 1) * g] if kept else [self.dataset[next(mine)]] * g
        return rows

    def record_round(self, inputs: list[dict], keep_global, values, step: int) -> None:
        """One round's outcome: ``keep_global`` [groups of all processes], dynamic sampling's decision, and
        ``values`` [groups x G of all processes], what it decided on (a dropped group's common value says whether it
        was solved or failed), in the gathered order."""
        keys = self.gather([prompt_key(row["prompt"]) for row in inputs[:: self.num_generations]])
        first = values.view(-1, self.num_generations)[:, 0].tolist()  # [groups]
        for key, signal, value in zip(keys, keep_global.tolist(), first, strict=True):
            self.history.record(key, signal, value, step)

    def end_step(self, kept_fraction: float) -> dict[str, float]:
        """Adapt to the step's kept share; the step's metrics (prompts skipped, history size, long streaks)."""
        self.history.adapt(kept_fraction)
        metrics = {"selection/skipped": float(self.skipped), **self.history.stats()}
        self.skipped = 0
        return metrics
