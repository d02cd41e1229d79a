"""Overlapped generation (``generation.overlap``): the vLLM server generates the next step's prompts while the
trainer scores and trains the current one.

Synchronously, each optimizer step syncs the adapter, waits for the server (trainer idle), then scores and trains
(server idle). Overlapped, with one generation per optimizer step and ``max_staleness`` 1::

    trainer  | sync v_s | wait R_s | send R_s+1 | score R_s, train step s -> v_s+1 | sync v_s+1 | wait R_s+1 | ...
    server   | ... R_s with v_s-1 ... |         R_s+1 with v_s ..................... |

``R_s`` is the round of prompts step ``s`` trains on and ``v_s`` the adapter after ``s`` updates. The adapter
``v_s+1`` is written and loaded while the server may still be finishing ``R_s+1`` with ``v_s``, which stays loaded
until nothing generates with it. Rounds are sent ``max_staleness // cycle_steps`` generation cycles ahead, where a
cycle is ``steps_per_generation x num_iterations / gradient_accumulation_steps`` optimizer steps (usually 1), so a
cycle's batch is generated at most ``max_staleness`` updates before the cycle starts; its last optimizer step trains
on it ``cycle_steps - 1`` updates later still. The bound on what any step trains on is therefore ``max_staleness +
cycle_steps - 1`` updates (``max_staleness`` with one update per generation); ``async/staleness*`` log the lag of
every micro-batch trained on.

Prompts. A cycle's first round is the batch TRL's dataloader yields for it (read ahead: ``take``, from the trainer's
``get_batch_samples``), so an overlapped run trains on the same prompts, in the same order, as a synchronous one; the
first cycle of an epoch is generated on arrival (lag 0). With dynamic sampling only a cycle's first round is sent
ahead: the further rounds come from the trainer's ``PromptStream`` and are generated during the cycle with the
current adapter (sending them ahead too cost held-out gain on 2 of 3 seeds: docs/generation.md).

Off-policy correction. Each round carries the server's per-token log-probs of the sampled tokens (``μ_v``, the
adapter ``v`` that generated it, after temperature: ``--logprobs-mode processed_logprobs``) and its version ``v``.
When the batch is scored, TRL computes the log-probs of the trainer's policy at that moment (``π_old``, detached)
and its vLLM importance-sampling weight, and the loss is, per completion token ``t``::

    ρ_t = π_θ(y_t) / π_old(y_t)                     PPO ratio of the update (1 at the first update of the batch)
    w_t = π_old(y_t) / μ_v(y_t)                     behaviour correction: the sampler was policy v, not π_old
    L_t = -min(ρ_t A, clip(ρ_t, 1 - ε, 1 + ε_high) A) · T(w)

with ``T`` TRL's truncation (``vllm_importance_sampling_mode``): ``token_truncate`` ``T(w) = min(w_t, C_max)``
(truncated importance sampling, Yao et al. 2025; what verl's one-step off-policy mode uses), or ``sequence_mask``
(TRL's default) ``T(w) = Π_t w_t``, or 0 when outside ``[C_min, C_max]``. This is TRL's correction for the
vLLM/trainer numeric mismatch, unchanged; with overlap ``μ_v`` is also one update older, and the same weight corrects
both. A recipe with overlap that does not name a mode gets ``token_truncate``: a product of one-update-old per-token
ratios spreads far (0.01 to 3 on the default task); docs/generation.md has the measurements behind the choice.
It is AReaL's decoupled PPO objective with the proximal policy ``π_old``. Carried dynamic-sampling groups keep the
``π_old`` and weight of the step that scored them, so ``ρ_t · w_t = π_θ / μ_v`` stays right for them. Hence overlap
needs ``vllm_importance_sampling_correction: true``.

Checkpoints. ``save`` waits for the rounds in flight and writes them (``overlap_rank<r>.json``); ``load`` makes them
the planned rounds again, so a resumed run trains on what the uninterrupted one would have.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .cycle import overlap_cycle
from .vllm_client import HEARTBEAT_S, VLLMConnectionError


THREAD_SLACK_S = 60.0  # added to a round's wait limit: the generation thread's own time beyond its requests


logger = logging.getLogger(__name__)

STATE_FILE = "overlap_rank{rank}.json"


@dataclass
class Round:
    """One generation round: this process's groups, the cycle that trains on them, and the policy that generates."""

    step: int  # global_step at the start of the generation cycle that trains on it
    index: int  # 0: the cycle's first round; 1, 2, ...: dynamic sampling's further rounds
    rows: list[dict] | None  # this process's rows (a first round's: as TRL's batch holds them; None when loaded)
    version: int  # global_step of the adapter that generated (or generates) it
    prompt_ids: list[list[int]] | None = None  # set when sent ahead: the rows' prompts as TRL tokenizes them
    result: tuple[list, list] | None = None  # (completion_ids, logprobs) once generated
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event, repr=False)
    sent_at: float = 0.0
    seconds: float = 0.0  # from sending its requests to the last answer

    def wait(self, limit_s: float) -> tuple[list, list]:
        """The round's result, raising what its generation raised; logs while waiting, gives up after ``limit_s``."""
        while not self.done.wait(HEARTBEAT_S):
            waited = time.monotonic() - self.sent_at
            if waited > limit_s:
                raise VLLMConnectionError(
                    f"the vLLM server has not generated step {self.step}'s round {self.index} in {waited:.0f} s "
                    f"(more than the {limit_s:.0f} s its requests may take with their retries); check its log"
                )
            logger.info("still waiting for step %d's generation: %.0f s", self.step, waited)
        if self.error is not None:
            raise self.error
        return self.result

    def to_json(self) -> dict:
        completion_ids, logprobs = self.result
        keys = ("step", "index", "version", "prompt_ids")
        return {**{k: getattr(self, k) for k in keys}, "completion_ids": completion_ids, "logprobs": logprobs}

    @classmethod
    def from_json(cls, data: dict) -> Round:
        result = (data.pop("completion_ids"), data.pop("logprobs"))
        round_ = cls(**data, rows=None, result=result)
        round_.done.set()
        return round_


class Lookahead:
    """The rounds sent ahead of the cycles that train on them, for ``hf_grpo.GRPOTrainer`` (one per process)."""

    def __init__(
        self,
        generator,
        max_staleness: int,
        cycle_steps: int,
        num_generations: int,
        accumulation: int = 1,
        tokenize: Callable[[list], list[list[int]]] | None = None,
    ):
        _, problems = overlap_cycle(max_staleness, cycle_steps)  # cycle_steps: already in optimizer steps
        if problems:
            raise ValueError(problems[0])
        self.generator = generator
        self.cycle_steps, self.num_generations = cycle_steps, num_generations
        self.max_staleness = max_staleness
        self.depth = max_staleness // cycle_steps  # cycles sent ahead
        # the most updates a trained micro-batch's generating policy can lag: a round sent up to max_staleness steps
        # ahead (or a carried group that old) serves a whole cycle, whose last step is cycle_steps - 1 further on
        self.bound = max_staleness + cycle_steps - 1
        self.accumulation = accumulation  # dataloader batches per optimizer step (gradient_accumulation_steps)
        self.tokenize = tokenize  # prompts -> their token ids, as TRL tokenizes them (rounds sent ahead)
        self.planned: deque[Round] = deque()
        self.current: Round | None = None  # the round whose rows were handed to TRL last
        self.server_seconds = 0.0  # generation seconds of the rounds used since the last ``take_server_seconds``
        self._read_ahead: list = []  # dataloader batches read but not yet handed to the trainer
        self._read_from = None  # the epoch iterator they came from

    def take(self, iterator, count: int) -> list:
        """The next ``count`` batches of the epoch ``iterator`` (fewer at its end), for the trainer's
        ``get_batch_samples``; then reads on until the first batch of every cycle within the bound is known."""
        if iterator is not self._read_from:  # a new epoch (or a resumed one): what was read ahead belongs to the last
            self._read_ahead, self._read_from = [], iterator
        batches, self._read_ahead = self._read_ahead[:count], self._read_ahead[count:]
        # enough to hold the first batch of the farthest cycle within the bound (see _send_ahead)
        want = count + (self.depth * self.cycle_steps - 1) * self.accumulation + 1
        for batch in itertools.islice(iterator, max(0, want - len(batches) - len(self._read_ahead))):
            (batches if len(batches) < count else self._read_ahead).append(batch)
        return batches

    def first_round(self, step: int, inputs: list[dict]) -> None:
        """Make the round of the cycle starting now (optimizer step ``step``) current: the one sent ahead for it,
        else ``inputs`` (TRL's batch: this process's rows, each group's row up to ``num_generations`` times) generated
        when TRL asks."""
        while self.planned and self.planned[0].step < step:
            self.planned.popleft()  # planned for a cycle that never ran (not expected: kept as a guard)
        if self.planned and self.planned[0].step == step:
            self.current = self.planned.popleft()
        else:
            self.current = Round(step, 0, inputs, version=step)

    def further_round(self, step: int, index: int, rows: list[dict]) -> None:
        """Make further round ``index`` (1, 2, ...) of the cycle starting at ``step`` current: ``rows`` (one per
        group, drawn from dynamic sampling's prompt stream as in a synchronous run), generated now with the current
        adapter."""
        self.current = Round(step, index, rows, version=step)

    def in_use(self) -> set[str]:
        """The adapters of rounds still generating: the sync that loads the current one must not unload them."""
        rounds = (r for r in (self.current, *self.planned) if r is not None)
        return {f"policy-{r.version}" for r in rounds if r.prompt_ids is not None and not r.done.is_set()}

    def generate(self, step: int, prompt_ids: list[list[int]], num_generations: int) -> tuple[list, list]:
        """The completions of the current round: waited for when it was sent ahead, else generated now with the
        current adapter (the caller syncs it first, keeping ``in_use``). A cycle's first round then sends the rounds
        of the cycles ahead."""
        round_, self.current = self.current, None
        if round_ is None:
            raise RuntimeError("overlapped generation: TRL generated for a round that Lookahead was not told of")
        if round_.prompt_ids is not None:
            if round_.prompt_ids != prompt_ids:
                raise RuntimeError(f"overlapped generation: step {round_.step}'s prompts changed after they were sent")
            result = round_.wait(self._wait_limit(len(prompt_ids)))
        else:
            key, start = (round_.step, f"overlap-{round_.index}"), time.monotonic()
            result = self.generator.generate(prompt_ids, num_generations, step, seed_key=key)
            round_.seconds = time.monotonic() - start
        self.last_version = round_.version
        self.server_seconds += round_.seconds
        if round_.index == 0:
            self._send_ahead(step)
        return result

    def _send_ahead(self, step: int) -> None:
        """Send the first rounds of the next ``depth`` cycles that are not planned yet, with the current adapter:
        the dataloader batches ``take`` read ahead (none past the end of the epoch)."""
        for ahead in range(1, self.depth + 1):
            target = step + ahead * self.cycle_steps
            position = (ahead * self.cycle_steps - 1) * self.accumulation  # in what was read ahead of this step
            if any(r.step == target for r in self.planned) or position >= len(self._read_ahead):
                continue
            # every row this process holds, as TRL will tokenize them: a process may hold part of a group only
            round_ = Round(target, 0, self._read_ahead[position], version=step)
            round_.prompt_ids = [list(ids) for ids in self.tokenize([r["prompt"] for r in round_.rows])]
            self._start(round_)
            self.planned.append(round_)

    def _start(self, round_: Round) -> None:
        adapter, key = self.generator.adapter_name, (round_.step, f"overlap-{round_.index}")

        def work() -> None:
            try:
                round_.result = self.generator.generate(
                    round_.prompt_ids, self.num_generations, round_.version, adapter=adapter, seed_key=key
                )
            except BaseException as exc:  # noqa: BLE001 - not hidden: Round.wait re-raises it in the training thread
                round_.error = exc
            finally:
                round_.seconds = time.monotonic() - round_.sent_at
                round_.done.set()

        round_.sent_at = time.monotonic()
        threading.Thread(target=work, name=f"hf_grpo-generate-step-{round_.step}", daemon=True).start()

    def _wait_limit(self, rows: int) -> float:
        """The longest a round of ``rows`` may take in ``ServerGenerator.generate``: its requests with their retries,
        then, when the server restarted, up to ``restart_wait`` for it, the adapter loaded again and the round sent once
        more (``_send_once_more_after_restart``); plus a minute for the thread itself."""
        client = self.generator.client
        prompts = math.ceil(rows / self.num_generations) + 1  # rows in a row touch at most this many groups
        waves = math.ceil(prompts / client.max_concurrent_requests)
        once = client.worst_case_s * waves
        return once + self.generator.restart_wait + client.worst_case_s + once + THREAD_SLACK_S

    def lag_metrics(self, step: int, versions) -> dict[str, float]:
        """``async/staleness`` (mean over rows, ``_max``, ``_<k>``: groups at lag k): how many updates old, at
        ``step``, the policies that generated the rows a micro-batch trains on are (``versions``: [rows of every
        process])."""
        lag = step - versions  # [rows of every process]
        metrics = {"async/staleness": lag.float().mean().item(), "async/staleness_max": lag.max().item()}
        return metrics | {
            f"async/staleness_{k}": int((lag == k).sum()) / self.num_generations for k in range(self.bound + 1)
        }

    def take_server_seconds(self) -> float:
        """Generation seconds of the rounds used since the last call (send to last answer)."""
        seconds, self.server_seconds = self.server_seconds, 0.0
        return seconds

    # ------------------------------------------------------------------------------------------------------------
    # Checkpoints

    def save(self, folder: str, rank: int) -> None:
        """Wait for the rounds in flight and write every planned round into checkpoint ``folder``."""
        rounds = list(self.planned)
        for round_ in rounds:
            round_.wait(self._wait_limit(len(round_.prompt_ids)))
        path = os.path.join(folder, STATE_FILE.format(rank=rank))
        with open(path + ".tmp", "w") as f:
            json.dump({"rounds": [r.to_json() for r in rounds]}, f)
        os.replace(path + ".tmp", path)

    def load(self, checkpoint: str, rank: int) -> None:
        """Make the rounds ``save`` wrote into ``checkpoint`` the planned rounds again."""
        path = os.path.join(checkpoint, STATE_FILE.format(rank=rank))
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"{path} is missing: the checkpoint was written without generation.overlap or with another number of "
                "processes; resume with the same generation.overlap setting and process count"
            )
        with open(path) as f:
            rounds = [Round.from_json(r) for r in json.load(f)["rounds"]]
        # a run resumed with a lower generation.max_staleness: rounds beyond the new bound are generated anew
        stale = [r for r in rounds if r.step - r.version > self.max_staleness]
        if stale:
            logger.warning(
                "%s: %d round(s) generated ahead are more than generation.max_staleness %d updates old by the step "
                "that trains on them; they are generated again with the current adapter",
                checkpoint,
                len(stale),
                self.max_staleness,
            )
        self.planned = deque(r for r in rounds if r not in stale)
