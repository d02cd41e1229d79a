"""hf_grpo's GRPOTrainer: TRL's trainer plus dynamic sampling, a leave-one-out baseline, phase timings and the
metrics users need, through narrow overrides of TRL's hooks (``_calculate_rewards``, ``_generate``,
``_generate_single_turn``, ``_generate_and_score_completions``, ``training_step``, ``compute_loss``, ``_save_checkpoint``,
``_load_optimizer_and_scheduler``; transformers' ``get_batch_samples``), each pinned in ``tests/test_trl_hooks.py``;
what each does, the dynamic-sampling loop and the carried groups' log-probabilities: docs/trainer.md.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections import defaultdict
from typing import ClassVar

import torch
import trl
from accelerate.utils import gather_object
from datasets import Dataset
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints
from trl.models.utils import disable_gradient_checkpointing

from . import sampling
from .advantages import leave_one_out_advantages, relog_advantages
from .checkpoints import keep_best, listing, write_manifest
from .config import hf_config
from .eta import EtaCallback
from .generation.overlap import Lookahead
from .progress import DeferredBar, enabled_for
from .rewards.health import RewardHealth
from .sampling import GroupPool, PromptStream, assemble_batch, collate_groups, keep_mask, split_groups
from .selection import PromptHistory, Selector


__all__ = ["GRPOTrainer", "hf_config", "leave_one_out_advantages"]


logger = logging.getLogger(__name__)

ROW_MEAN_LOSSES = ("grpo", "sapo", "dr_grpo", "luspo")  # TRL's losses whose normaliser counts rows (_compute_loss)


class GRPOTrainer(trl.GRPOTrainer):
    """``trl.GRPOTrainer`` with dynamic sampling, leave-one-out advantages and per-phase metrics.

    Takes the same arguments as ``trl.GRPOTrainer``, plus ``generator``. ``args`` is an ``HfGRPOConfig``; as in TRL,
    ``None`` builds a default one (``<model>-GRPO``), and a plain ``trl.GRPOConfig`` is converted (see ``hf_config``).
    """

    _tag_names: ClassVar[list[str]] = ["trl", "grpo", "hf_grpo"]

    def __init__(self, model, reward_funcs=None, args=None, *rest, generator=None, **kwargs):
        args = hf_config(model, args)  # before TRL loads anything
        super().__init__(model, reward_funcs, args, *rest, **kwargs)
        self.add_callback(EtaCallback())  # the estimated-time line once the first steps are measured
        self.generator = generator  # hf_grpo.generation.ServerGenerator: a vLLM server with adapter-only sync
        if generator is not None:
            if self.args.use_vllm:
                raise ValueError("a generator replaces TRL's vLLM engine: set use_vllm: false")
            # Our server's sampled log-probs feed TRL's vLLM importance-sampling correction, as TRL's would.
            self.use_vllm, self.vllm_mode = True, "server"
            generator.connect(self)
        self._last_rewards_per_func: torch.Tensor | None = None
        self._phase_seconds: dict[str, float] = defaultdict(float)
        self._step_started: float | None = None
        if self.args.dynamic_sampling:
            self._check_dynamic_sampling()
        metric = self.args.dynamic_sampling_metric
        self._filter_column = None if metric == "reward" else self.reward_func_names.index(metric)
        self._pool = GroupPool()
        overlap = generator is not None and generator.max_staleness is not None  # generation.overlap
        streamed = self.args.dynamic_sampling or overlap
        self._stream = PromptStream(len(self.train_dataset), self.args.seed) if streamed else None
        self._ahead = self._lookahead() if overlap else None
        self._selector = self._prompt_selector() if self.args.prompt_selection else None
        self._keep_digest = hashlib.sha256()  # every global keep decision, hashed: tests compare it across ranks
        self.reward_health = RewardHealth(self.reward_func_names)
        self._warned_infinite: set[str] = set()
        self.last_task_eval: tuple[int, float] | None = None  # (step, held-out accuracy), set by the task evaluator

    # ----------------------------------------------------------------------------------------------------------------
    # Validation

    def _text_only_problems(self) -> list[str]:
        """What keeps prompts from being drawn by index and generated as plain text (dynamic sampling, overlap)."""
        problems = []
        if not isinstance(self.train_dataset, Dataset):
            problems.append("a map-style train dataset (not streaming)")
        if self.tools or self.environment_factories is not None or self.rollout_func is not None or self._is_vlm:
            problems.append("a text-only setup (no tools, environments, rollout_func or images)")
        return problems

    def _lookahead(self) -> Lookahead:
        """Overlapped generation's rounds (``generation.overlap``), once the setup is checked to allow it."""
        args, problems = self.args, self._text_only_problems()
        if not self.vllm_importance_sampling_correction:
            problems.append("vllm_importance_sampling_correction: true (it reweights what an older policy generated)")
        generate_every = args.steps_per_generation * self.num_iterations
        if generate_every % args.gradient_accumulation_steps:
            problems.append(
                f"steps_per_generation x num_iterations ({generate_every}) a multiple of gradient_accumulation_steps "
                f"({args.gradient_accumulation_steps}), so that every generation starts an optimizer step"
            )
        if problems:
            raise ValueError("generation.overlap needs " + "; ".join(problems))
        cycle_steps = generate_every // args.gradient_accumulation_steps
        shape = (self.generator.max_staleness, cycle_steps, self.num_generations, args.gradient_accumulation_steps)
        return Lookahead(self.generator, *shape)

    def _prompt_selector(self) -> Selector:
        """Prompt selection by reward history (``prompt_selection``): selection.py."""
        device = self.accelerator.device

        def gather(values: list[int]) -> list[int]:  # every process's values, in process order
            return self.accelerator.gather(torch.tensor(values, dtype=torch.int64, device=device)).tolist()

        history = PromptHistory(target_kept=self.args.prompt_selection_target, seed=self.args.seed)
        return Selector(history, self.train_dataset, self.num_generations, gather)

    def _check_dynamic_sampling(self) -> None:
        args = self.args
        problems = self._text_only_problems()
        local_rows = args.per_device_train_batch_size * args.steps_per_generation
        if local_rows % self.num_generations:
            problems.append(
                f"per_device_train_batch_size x steps_per_generation ({local_rows}) divisible by num_generations "
                f"({self.num_generations}), so that every process holds whole groups"
            )
        metric = args.dynamic_sampling_metric
        if metric != "reward" and metric not in self.reward_func_names:
            problems.append(f"dynamic_sampling_metric 'reward' or one of {self.reward_func_names}, not {metric!r}")
        if problems:
            raise ValueError("dynamic_sampling needs " + "; ".join(problems))

    # ----------------------------------------------------------------------------------------------------------------
    # Metrics and timing

    def record_metric(self, name: str, value: float, mode: str = "train") -> None:
        """Add a value to the metrics averaged into the next log record."""
        self._metrics[mode][name].append(value)

    def total_rewards(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        """Weighted sum over reward functions, NaN where every function returned None. [N, F] -> [N]."""
        weights = self.reward_weights.to(rewards_per_func.device)
        total = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)  # [N]
        total[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
        return total

    def _timed(self, phase: str, fn, *args, **kwargs):
        """``fn(*args, **kwargs)``, its seconds added to this training step's ``phase`` (not in evaluation, which would
        land in the next step's ``time/*``); what ``fn`` raises propagates unchanged, even on a half-built trainer."""
        if not getattr(getattr(self, "model", None), "training", False):
            return fn(*args, **kwargs)
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            seconds = getattr(self, "_phase_seconds", None)
            if seconds is not None:
                seconds[phase] += time.perf_counter() - start

    def _generate(self, prompts):
        return self._timed("generate", super()._generate, prompts)

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        if self.generator is None:
            return super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images=has_tool_images
            )
        if images is not None:
            raise NotImplementedError("generation through the vLLM server generator is text-only")
        in_use = {"in_use": self._ahead.in_use()} if self._ahead is not None else {}  # adapters of rounds sent ahead
        self._timed("weight_sync", self.generator.sync, self, **in_use)  # then rounds sent ahead are waited for
        if self._ahead is not None and self.model.training:  # overlapped: the round may have been sent a step ago
            return self._ahead.generate(self, prompt_ids, num_generations)
        return self.generator.generate(self, prompt_ids, num_generations)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = self._timed(
            "reward", super()._calculate_rewards, inputs, prompts, completions, completion_ids_list
        )
        rewards_per_func = self._drop_infinite(rewards_per_func)
        self._last_rewards_per_func = rewards_per_func  # [B*G global, num_funcs], gathered across processes
        return rewards_per_func

    def _drop_infinite(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        """±inf rewards become NaN (no reward, as None): one would make every advantage of its group NaN or zero.
        Counted per function in ``rewards/<name>/nonfinite`` and named in a warning the first time.

        NaN is TRL's encoding of None, so a NaN reward is no reward too. An isolated reward (the default) tells a NaN
        it returned from a None (``IsolatedReward.last_nan``), and those are counted in ``nonfinite`` as well; a
        reward run in the training process (``reward_isolation: false``, async rewards) cannot be told apart."""
        infinite = torch.isinf(rewards_per_func)  # [B*G global, F]
        nan = torch.tensor(
            [float(getattr(f, "last_nan", 0)) for f in self.reward_funcs], device=rewards_per_func.device
        )  # [F], this process's completions
        nan = self.accelerator.gather(nan).view(-1, len(self.reward_funcs)).sum(0)  # [F], all processes
        for f in self.reward_funcs:
            if hasattr(f, "last_nan"):
                f.last_nan = 0
        mode = "train" if self.model.training else "eval"
        for i, name in enumerate(self.reward_func_names):
            count = int(infinite[:, i].sum()) + int(nan[i])
            self.record_metric(f"rewards/{name}/nonfinite", float(count), mode)
            if count and name not in self._warned_infinite:
                self._warned_infinite.add(name)
                logger.warning(
                    "reward %r returned ±inf or NaN for %d of %d completions (step %d): they get no reward; further "
                    "ones are counted in rewards/%s/nonfinite",
                    name,
                    count,
                    infinite.shape[0],
                    self.state.global_step,
                    name,
                )
        return rewards_per_func.masked_fill(infinite, torch.nan) if infinite.any() else rewards_per_func

    def training_step(self, model, inputs, num_items_in_batch):
        if self._step_started is None:
            self._step_started = time.perf_counter()
        output = super().training_step(model, inputs, num_items_in_batch)
        if self._step % self.current_gradient_accumulation_steps == 0:  # TRL increments _step in super()
            total = time.perf_counter() - self._step_started
            phases = self._phase_seconds
            other = phases.pop("prepare", 0.0)  # everything _prepare_inputs did besides generate/reward
            self.record_metric("time/generate", phases.get("generate", 0.0) - phases.get("weight_sync", 0.0))
            for phase in ("reward", "weight_sync"):
                self.record_metric(f"time/{phase}", phases.get(phase, 0.0))
            self.record_metric("time/score", max(other - phases.get("generate", 0.0) - phases.get("reward", 0.0), 0))
            self.record_metric("time/train", max(total - other, 0.0))
            self.record_metric("time/step", total)
            self._phase_seconds, self._step_started = defaultdict(float), None
        return output

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """TRL's loss. The loss types that average over rows count dynamic sampling's fill rows (masked out) as rows,
        scaling the real rows' gradient by real / all rows: rescaled here to the real rows."""
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        filled = inputs.get("filled")  # [rows of this micro-batch]
        if filled is not None and self.loss_type in ROW_MEAN_LOSSES:
            loss = loss * filled.numel() / (~filled).sum().clamp(min=1)
        return loss

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """transformers' hook that takes an optimizer step's batches; overlapped generation reads ahead of it."""
        if self._ahead is None:
            return super().get_batch_samples(epoch_iterator, num_batches, device)
        batches = self._ahead.take(epoch_iterator, num_batches)
        return batches, self._get_num_items_in_batch(batches, device)

    def _prepare_inputs(self, generation_batch):
        inputs = self._timed("prepare", super()._prepare_inputs, generation_batch)  # TRL's micro-batch
        if self._ahead is not None and "policy_version" in inputs:  # overlap: the lag of every micro-batch trained on
            self._ahead.record_lag(self, inputs["policy_version"])
        return inputs

    def _save_checkpoint(self, model, trial):
        start, limit = time.perf_counter(), self.args.save_total_limit
        self.args.save_total_limit = None  # transformers would rotate before this one is complete: done below
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self.args.save_total_limit = limit
        rank = self.accelerator.process_index
        if self._stream is not None:
            digest = self._keep_digest.hexdigest()
            selection = self._selector.history.state_dict() if self._selector is not None else None
            sampling.save_state(self._checkpoint_dir(trial), rank, self._stream, self._pool, digest, selection)
        if self._ahead is not None:  # waits for the rounds in flight
            self._ahead.save(self._checkpoint_dir(trial), rank)
        # transformers' _save_checkpoint ends without a barrier: a slower process may still be writing its RNG and
        # sampling state. Once all have, the manifest marks the checkpoint complete (checkpoints.py).
        self.accelerator.wait_for_everyone()
        folder = self._checkpoint_dir(trial)
        seen = gather_object([listing(folder)]) if self.accelerator.num_processes > 1 else []  # one per process
        shared = all(view == seen[0] for view in seen)  # else each node has its own output_dir: each writes its own
        if self.accelerator.is_main_process or (self.accelerator.is_local_main_process and not shared):
            # after the barrier, no process still writes into what is deleted
            write_manifest(folder, self.accelerator.num_processes, self._stream is not None, seen)
            run_dir, step, last = self._get_output_dir(trial=trial), self.state.global_step, self.last_task_eval
            # older checkpoints go only now that this one is complete (a kill in between keeps one to resume from)
            rotate_checkpoints(run_dir, limit, self.state.best_model_checkpoint, use_mtime=True)
            if self.args.keep_top_k is not None:  # rank it by this step's held-out accuracy (None: not evaluated)
                score = last[1] if last is not None and last[0] == step else None
                keep_best(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}", score, self.args.keep_top_k)
        self.record_metric("time/checkpoint", time.perf_counter() - start)

    # ----------------------------------------------------------------------------------------------------------------
    # Scoring

    def _generate_and_score_completions(self, inputs):
        overlapped = self._ahead is not None and self.model.training
        if overlapped:  # this cycle's batch may have been sent ahead of it: generation/overlap.py
            self._ahead.first_round(self, inputs)
        if self.model.training and self.args.dynamic_sampling:
            output = self._dynamic_batch(inputs)
        else:
            mode = "train" if self.model.training else "eval"
            output = self._score(inputs, mode)
            self._log_advantages(output["advantages"], mode)
        if overlapped:  # seconds from sending this cycle's rounds to their last answer (while training ran, if ahead)
            self.record_metric("time/server_generate", self._ahead.take_server_seconds())
        return output

    def _score(self, inputs, mode: str) -> dict:
        """TRL's generation and scoring of ``inputs``, with our advantages and reward metrics."""
        output = super()._generate_and_score_completions(inputs)
        total = self.total_rewards(self._last_rewards_per_func)  # [B*G global]
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        if self.args.advantage_estimator == "rloo":
            advantages = leave_one_out_advantages(total, num_generations, self.scale_rewards)  # [B*G global]
            rows = output["advantages"].size(0)
            start = self.accelerator.process_index * rows
            output["advantages"] = advantages[start : start + rows].to(output["advantages"].device)
            relog_advantages(self._logs["advantages"], advantages)  # TRL's completions table
        finite = total[~torch.isnan(total)]
        if finite.numel():
            self.record_metric("reward/min", finite.min().item(), mode)
            self.record_metric("reward/max", finite.max().item(), mode)
        if mode == "train":
            self.reward_health.check(finite, total.numel(), self.state.global_step)
        if mode == "train" and self._ahead is not None:  # [B]: the adapter version that generated each row
            rows = output["advantages"].size(0)
            output["policy_version"] = torch.full((rows,), self._ahead.last_version, device=self.accelerator.device)
        return output

    def _log_advantages(self, advantages: torch.Tensor, mode: str = "train") -> None:
        gathered = self.accelerator.gather(advantages)  # [B*G global]
        self.record_metric("advantage/mean", gathered.mean().item(), mode)
        self.record_metric("advantage/std", gathered.std().item() if gathered.numel() > 1 else 0.0, mode)

    # ----------------------------------------------------------------------------------------------------------------
    # Dynamic sampling

    def _filter_values(self) -> torch.Tensor:
        rewards = self._last_rewards_per_func  # [B*G global, F]
        return self.total_rewards(rewards) if self._filter_column is None else rewards[:, self._filter_column]

    def _next_round_inputs(self, groups: int, index: int) -> list[dict]:
        """Further round ``index``: this process's share of the stream's next prompts, each num_generations times."""
        total, step = groups * self.accelerator.num_processes, self.state.global_step + 1
        if self._selector is None:
            indices = self._stream.next(total)
        else:  # past the prompts the reward history skips
            indices = self._selector.draw(self._stream, total, step, index)
        mine = indices[self.accelerator.process_index * groups : (self.accelerator.process_index + 1) * groups]
        rows = [self.train_dataset[i] for i in mine]
        if self._ahead is not None:  # overlapped: drawn as a synchronous run draws them, generated now (lag 0)
            self._ahead.further_round(self, index, rows)
        return [row for row in rows for _ in range(self.num_generations)]

    def _old_logps(self, batch: dict) -> torch.Tensor:
        """Per-token log-probs of ``batch``'s completions under the current policy (no grad). [B, C]."""
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)  # [B, P+C]
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)  # [B, P+C]
        with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            logps, _, _ = self._get_per_token_logps_and_entropies(
                self.model,
                input_ids,
                attention_mask,
                batch["completion_ids"].size(1),
                batch_size=self.args.per_device_train_batch_size,
            )
        return logps  # [B, C]

    def _fill_old_logps(self, groups: list, dummy: dict, token_keys: tuple[str, ...]) -> None:
        """Add ``old_per_token_logps`` to ``groups``. Every process runs the same number of forward passes (padding
        with copies of ``dummy``), since under ZeRO-3 a forward pass is a collective operation."""
        count = int(self.accelerator.gather(torch.tensor([len(groups)], device=self.accelerator.device)).max())
        if count == 0:
            return
        batch = collate_groups(groups + [dummy] * (count - len(groups)), self._tokenizer.pad_token_id, token_keys)
        logps = self._old_logps(batch)  # [count * G, C]
        for i, group in enumerate(groups):
            rows = slice(i * self.num_generations, (i + 1) * self.num_generations)
            group["old_per_token_logps"] = logps[rows, : group["completion_ids"].size(1)]

    def _token_level_keys(self) -> tuple[str, ...]:
        token_is = (
            self.use_vllm
            and self.vllm_importance_sampling_correction
            and self.vllm_importance_sampling_mode.startswith("token")
        )
        return ("importance_sampling_ratio",) if token_is else ()

    def _dynamic_batch(self, inputs: list[dict]) -> dict:
        num_gen = self.num_generations
        needed = len(inputs) // num_gen  # groups this process trains on
        token_keys = self._token_level_keys()
        if self._ahead is not None:  # carried groups older than generation.max_staleness are not trained on
            stale = self._pool.drop_older(self.state.global_step - self.generator.max_staleness)
            self.record_metric("async/stale_dropped", stale)
        carried = len(self._pool)
        dropped: list = []
        rounds, generated_groups, kept_groups = 0, 0, 0
        max_rounds, step = self.args.max_generation_batches, self.state.global_step + 1
        if self._selector is not None and self._ahead is None:  # overlap sent round 1 before it was known
            inputs = self._selector.first_round(inputs, self._stream, step, self.accelerator.process_index)
        # Extra rounds get a bar (main process, a terminal or a notebook, not with disable_tqdm) of the groups ready
        # for this process's batch; the usual single round draws nothing. Every round is logged at DEBUG.
        desc = f"step {step}: dynamic sampling"
        with DeferredBar(needed, desc, enabled=enabled_for(self.args), unit="group", leave=False) as bar:
            while True:
                rounds += 1
                output = self._score(inputs, mode="train")
                groups = split_groups(output, num_gen, token_keys)
                values = self._filter_values()  # [B*G global]
                keep_global = keep_mask(values, num_gen).cpu()  # [groups, all processes]
                if self._selector is not None:
                    self._selector.record_round(inputs, keep_global, values, step)
                self._keep_digest.update(bytes(keep_global.to(torch.uint8).tolist()))
                per_process = keep_global.view(self.accelerator.num_processes, -1)  # [P, groups per process]
                keep_local = per_process[self.accelerator.process_index].tolist()
                self._pool.add([g for g, k in zip(groups, keep_local, strict=True) if k])
                dropped += [g for g, k in zip(groups, keep_local, strict=True) if not k]
                generated_groups += keep_global.numel()
                kept_groups += int(keep_global.sum())
                pool_sizes = self.accelerator.gather(torch.tensor([len(self._pool)], device=self.accelerator.device))
                ready = min(int(pool_sizes.min()), needed)
                kept_now = f"{int(keep_global.sum())}/{keep_global.numel()} groups kept, {ready}/{needed} ready"
                logger.debug("dynamic sampling, step %d round %d/%d: %s", step, rounds, max_rounds, kept_now)
                if ready >= needed or rounds >= max_rounds:
                    break
                bar.show(ready, f"round {rounds + 1}/{max_rounds}, {kept_groups}/{generated_groups} groups kept")
                inputs = self._next_round_inputs(needed, index=rounds)

        batch_groups, filled = assemble_batch(self._pool, dropped, needed)
        # Rounds run until the process with the fewest kept groups has enough; the others keep at most one step's
        # worth, or their surplus would grow without bound and wait ever longer (sampling.GroupPool).
        surplus = self._pool.trim(needed, keep_newest=self._ahead is not None)
        exhausted = self._check_exhausted(filled, needed, kept_groups / generated_groups)

        if "old_per_token_logps" not in output:  # TRL did not need them; carried groups do (see module docstring)
            missing = [g for g in self._pool.groups if "old_per_token_logps" not in g]
            if any("old_per_token_logps" in g for g in batch_groups):
                missing += [g for g in batch_groups if "old_per_token_logps" not in g]
            self._fill_old_logps(missing, dummy=batch_groups[0], token_keys=token_keys)

        batch = collate_groups(batch_groups, self._tokenizer.pad_token_id, token_keys)
        if filled:  # fill groups come last; out of the loss, or beta > 0 adds their KL gradient and dapo their tokens
            batch["completion_mask"][-filled * num_gen :] = 0  # [B, C]
            rows = batch["advantages"].size(0)  # [B]: out of the row count of row-mean losses too (compute_loss)
            batch["filled"] = torch.arange(rows, device=batch["advantages"].device) >= rows - filled * num_gen
        mask = batch["completion_mask"] if "tool_mask" not in batch else batch["completion_mask"] * batch["tool_mask"]
        batch["num_items_in_batch"] = self.accelerator.gather(mask.sum()).sum()
        self._log_advantages(batch["advantages"])
        self.record_metric("dynamic_sampling/rounds", rounds)
        self.record_metric("dynamic_sampling/kept_fraction", kept_groups / generated_groups)
        self.record_metric(
            "dynamic_sampling/generated_per_trained", generated_groups / (needed * self.accelerator.num_processes)
        )
        self.record_metric("dynamic_sampling/carried_in", carried)
        self.record_metric("dynamic_sampling/carry_out", len(self._pool))
        self.record_metric("dynamic_sampling/surplus_dropped", surplus)
        self.record_metric("dynamic_sampling/exhausted", float(exhausted > 0))
        for name, value in self._selector.end_step(kept_groups / generated_groups).items() if self._selector else ():
            self.record_metric(name, value)
        return batch

    def _check_exhausted(self, filled: int, needed: int, kept_fraction: float) -> int:
        """The most groups any process had to fill after the last round; an error or a warning when any did."""
        exhausted = int(self.accelerator.gather(torch.tensor([filled], device=self.accelerator.device)).max())
        if exhausted:
            message = (
                f"dynamic sampling: after max_generation_batches={self.args.max_generation_batches} rounds a process "
                f"still lacked {exhausted} of {needed} groups with varying rewards ({1 - kept_fraction:.0%} of "
                "generated groups had all-equal rewards); the prompts are too easy or too hard for the policy"
            )
            if self.args.dynamic_sampling_exhausted == "error":
                raise RuntimeError(message + ". Raise max_generation_batches or set dynamic_sampling_exhausted: fill.")
            logger.warning(
                "%s; filled the batch with zero-advantage groups (step %d)", message, self.state.global_step
            )
        return exhausted

    # ----------------------------------------------------------------------------------------------------------------
    # Checkpointing of the sampling state

    def _checkpoint_dir(self, trial) -> str:
        return os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None or self._stream is None:
            return
        rank, device = self.accelerator.process_index, self.accelerator.device
        self._pool = sampling.load_state(checkpoint, rank, self._stream, device, overlap=self._ahead is not None)
        if self._selector is not None:
            self._selector.history.load_state_dict(sampling.load_selection(checkpoint, rank))
        if self._ahead is not None:
            self._ahead.load(checkpoint, rank)
        state = self._stream.state()
        logger.info("restored dynamic sampling state: %d carried groups, prompt stream %s", len(self._pool), state)
