"""Prompt selection by reward history: skip, before generating them, the prompts whose recent groups taught nothing.

Dynamic sampling drops a group whose samples all got the same reward (all right or all wrong), after paying for its
generation. Most prompts that gave such a group give one again the next time (GRESO, arXiv 2506.02177), so this
module keeps, for every prompt a run has generated, how many of its groups in a row gave no signal and whether the
last of them was all right ("solved") or all wrong ("failed"), and skips the prompt before generation with

    p_skip = min(1 - explore[kind] ** streak, max_skip)

so one empty group skips it with probability 1 - explore, a longer streak more, and it always comes back at least
``1 - max_skip`` of the times it is drawn. ``explore`` starts at ``explore_start`` per kind and is adapted after
each step: lowered by ``rate`` while the step kept a smaller share of its groups than ``target_kept`` (too much
generation wasted), raised while it kept more, within ``[explore_floor, 1]``.

Every decision is a uniform number hashed from (seed, step, round, prompt key), not drawn from a random generator:
every process holds the same history (it is updated with the gathered outcome of every group) and so decides the
same, and a run resumed from a checkpoint (``state_dict``) decides exactly as the uninterrupted run would.
Not wired into the trainer yet (issue 30): this is its bookkeeping, tested on its own.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field


KINDS = ("solved", "failed")


@dataclass
class Record:
    """One prompt's history: no-signal groups in a row, the kind of the last one, the step it was last generated."""

    streak: int = 0
    kind: str | None = None
    step: int = 0


@dataclass
class PromptHistory:
    target_kept: float = 0.5
    explore_start: float = 0.5
    rate: float = 0.05
    explore_floor: float = 0.05
    max_skip: float = 0.95
    seed: int = 0
    explore: dict[str, float] = field(default_factory=dict)
    records: dict[str, Record] = field(default_factory=dict)

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

    def record(self, key: str, rewards: list[float], step: int, atol: float = 1e-6, right: float = 1.0) -> None:
        """One generated group of prompt ``key``: its rewards (every sample's), at optimizer step ``step``."""
        entry = self.records.setdefault(key, Record())
        entry.step = step
        if max(rewards) - min(rewards) > atol:  # a signal: the streak ends
            entry.streak, entry.kind = 0, None
            return
        entry.streak += 1
        entry.kind = "solved" if min(rewards) >= right - atol else "failed"

    def adapt(self, kept_fraction: float) -> None:
        """After a step: skip more while fewer groups than ``target_kept`` were kept, less while more were."""
        step = -self.rate if kept_fraction < self.target_kept else self.rate
        for kind in KINDS:
            self.explore[kind] = min(1.0, max(self.explore_floor, self.explore[kind] + step))

    # -- what to generate ----------------------------------------------------------------------------------------

    def skip_probability(self, key: str) -> float:
        entry = self.records.get(key)
        if entry is None or entry.streak == 0:
            return 0.0
        return min(1.0 - self.explore[entry.kind] ** entry.streak, self.max_skip)

    def uniform(self, key: str, step: int, round_index: int) -> float:
        """A number in [0, 1) that depends only on the seed, the step, the round and the prompt."""
        digest = hashlib.blake2b(f"{self.seed}:{step}:{round_index}:{key}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2**64

    def keep(self, keys: list[str], step: int, round_index: int) -> list[bool]:
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
            "records": {key: [r.streak, r.kind, r.step] for key, r in self.records.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        self.explore = {kind: float(state["explore"][kind]) for kind in KINDS}
        self.records = {key: Record(streak, kind, step) for key, (streak, kind, step) in state["records"].items()}


def prompt_key(prompt) -> str:
    """A prompt's key in the history: a hash of its text (a chat prompt: of its messages), the same on every process."""
    text = prompt if isinstance(prompt, str) else repr([(m["role"], m["content"]) for m in prompt])
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()
