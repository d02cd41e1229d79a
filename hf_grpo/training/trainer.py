"""hf_grpo's GRPOTrainer: TRL's trainer plus dynamic sampling, a leave-one-out baseline, phase timings and the
metrics users need, through narrow overrides of TRL's hooks (``_calculate_rewards``, ``_generate``,
``_generate_single_turn``, ``_generate_and_score_completions``, ``training_step``, ``compute_loss``, ``_save_checkpoint``,
``_load_optimizer_and_scheduler``; transformers' ``get_batch_samples``), each pinned in ``tests/test_trl_hooks.py``;
what each does, the dynamic-sampling loop and the carried groups' log-probabilities: docs/trainer.md.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import ClassVar

import torch
import trl
from accelerate.utils import gather_object, is_peft_model
from datasets import Dataset
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

from ..base.progress import enabled_for
from ..base.run_files import LOGS_DIR
from ..base.stopping import raise_if_stopped
from ..config import hf_config
from ..generation.cycle import overlap_cycle
from ..generation.draws import one_uniform_per_row
from ..generation.overlap import Lookahead
from ..rewards.health import RewardHealth
from ..rewards.wrapper import IsolatedReward
from . import batch_logps, micro_batches, shared_prompts
from .advantages import leave_one_out_advantages, relog_advantages
from .checkpoints import keep_best, listing, read_manifest, write_manifest
from .dynamic_sampling import DynamicSampler
from .eta import EtaCallback
from .prompt_selection import PromptHistory, Selector


__all__ = ["GRPOTrainer", "hf_config", "leave_one_out_advantages"]


logger = logging.getLogger(__name__)

BATCH_FILE = "hf_grpo_batch_rank{rank}.pt"  # TRL's generation batch, in a checkpoint saved inside a generation cycle


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
        self._rewards: torch.Tensor | None = None  # TRL's _calculate_rewards -> _score, within one TRL call
        self._phase_seconds: dict[str, float] = defaultdict(float)
        self._step_started: float | None = None
        if self.args.dynamic_sampling:
            self._check_dynamic_sampling()
        metric = self.args.dynamic_sampling_metric
        self._filter_column = None if metric == "reward" else self.reward_func_names.index(metric)
        overlap = generator is not None and generator.max_staleness is not None  # generation.overlap
        self._ahead = self._lookahead() if overlap else None
        self._sampler = self._dynamic_sampler() if self.args.dynamic_sampling or overlap else None
        # dynamic sampling's rounds leave the KL term's reference pass to the assembled batch (batch_logps.py)
        self._defer_reference = self.args.dynamic_sampling and batch_logps.defers_reference(self)
        self.reward_health = RewardHealth(self.reward_func_names)
        rank = self.accelerator.process_index
        for fn in self.reward_funcs:  # a reward that fails now and then: its tracebacks in the run's logs folder
            if isinstance(fn, IsolatedReward):
                fn.error_log = Path(self.args.output_dir) / LOGS_DIR / f"reward_errors{f'-{rank}' if rank else ''}.log"
        if is_peft_model(
            self.model
        ):  # PEFT's save writes a README.md over any: the run's card is hf_grpo.publish.card's
            self.model.create_or_update_model_card = lambda output_dir: None
        self._shared_prompts = shared_prompts.install_in(self)  # each distinct prompt run once for its group
        self._regroup = self._shared_prompts and micro_batches.may_regroup(self)
        self._arranged = None  # the buffered micro-batches last arranged by _prepare_inputs (micro_batches.py)
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
        if problems:
            raise ValueError("generation.overlap needs " + "; ".join(problems))
        accumulation, max_staleness = args.gradient_accumulation_steps, self.generator.max_staleness
        cycle_steps, cycle = overlap_cycle(max_staleness, args.steps_per_generation, self.num_iterations, accumulation)
        if cycle:
            raise ValueError(cycle[0])
        shape = (max_staleness, cycle_steps, self.num_generations, accumulation)
        return Lookahead(self.generator, *shape, tokenize=lambda prompts: self._tokenize_prompts(prompts)[0])

    def _dynamic_sampler(self) -> DynamicSampler:
        """Dynamic sampling's rounds, pool and prompt stream (dynamic_sampling.py), with prompt selection by reward
        history when ``prompt_selection`` is on (selection.py)."""
        args, device, ahead = self.args, self.accelerator.device, self._ahead

        def gather(values: list[int]) -> list[int]:  # every process's values, in process order
            return self.accelerator.gather(torch.tensor(values, dtype=torch.int64, device=device)).tolist()

        selector = None
        if args.prompt_selection:
            history = PromptHistory(target_kept=args.prompt_selection_target, seed=args.seed)
            selector = Selector(history, self.train_dataset, self.num_generations, gather)
        return DynamicSampler(
            self.accelerator,
            self.train_dataset,
            self.num_generations,
            seed=args.seed,
            max_rounds=args.max_generation_batches,
            exhausted=args.dynamic_sampling_exhausted,
            pad_token_id=self._tokenizer.pad_token_id,
            selector=selector,
            max_staleness=None if ahead is None else self.generator.max_staleness,
            further_round=None
            if ahead is None
            else lambda i, rows: ahead.further_round(self.state.global_step, i, rows),
            progress=enabled_for(args),
        )

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
        land in the next step's ``time/*``); what ``fn`` raises propagates unchanged, even on a half-built trainer.
        Each phase starts at a safe point for a stop signal that a library dropped (``hf_grpo.base.stopping``)."""
        raise_if_stopped()
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
        with one_uniform_per_row():  # HF generate's sampling step on a CPU: one uniform per row (generation/draws.py)
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
        step = self.state.global_step
        if self._ahead is not None and self.model.training:  # overlapped: the round may have been sent a step ago
            return self._ahead.generate(step, prompt_ids, num_generations)
        return self.generator.generate(prompt_ids, num_generations, step)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = self._timed(
            "reward", super()._calculate_rewards, inputs, prompts, completions, completion_ids_list
        )
        self._rewards = self._drop_infinite(rewards_per_func)  # [B*G global, F], gathered across processes
        return self._rewards

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
        """TRL's loss with dynamic sampling's fill rows out of the row count (``fill_scale``, micro_batches.py: set
        for the losses that average over rows). The policy term is linear in the advantages and the KL term in
        ``beta`` (a positive scale keeps every sign TRL tests), so both are scaled, while the entropy bonus (a token
        mean) and the router aux loss, which count no rows, stay as TRL computes them. Dropping the rows instead would
        leave processes with micro-batches of different sizes, which TRL's gathers of per-row metrics cannot take."""
        scale = inputs.get("fill_scale")
        if scale is None:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        scale = float(scale)
        inputs = {**inputs, "advantages": inputs["advantages"] * scale}  # [R]
        beta, self.beta = self.beta, self.beta * scale
        try:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        finally:
            self.beta = beta

    def _get_per_token_logps_and_entropies(
        self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False,
        compute_aux_loss=False, **multimodal,
    ):  # fmt: skip
        """TRL's per-token log-probabilities (and entropies) of the completions; with ``shared_prompts`` each distinct
        prompt runs once and only completion positions meet the LM head (hf_grpo/training/shared_prompts.py)."""
        # a checkpointed layer drops its KV cache while it records a backward: TRL's whole rows then
        checkpointed = self.model.is_gradient_checkpointing and model.training and torch.is_grad_enabled()
        multimodal_inputs = any(v is not None for v in multimodal.values())
        if not self._shared_prompts or compute_aux_loss or multimodal_inputs or checkpointed:
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss,
                **multimodal,
            )  # fmt: skip
        logps, entropies = shared_prompts.completion_logps(
            model, input_ids, attention_mask, logits_to_keep, batch_size, self.accelerator.autocast
        )
        return logps, entropies if compute_entropy else None, None

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """transformers' hook that takes an optimizer step's batches; overlapped generation reads ahead of it."""
        if self._ahead is None:
            return super().get_batch_samples(epoch_iterator, num_batches, device)
        batches = self._ahead.take(epoch_iterator, num_batches)
        return batches, self._get_num_items_in_batch(batches, device)

    def _prepare_inputs(self, generation_batch):
        inputs = self._timed("prepare", super()._prepare_inputs, generation_batch)  # TRL's micro-batch
        if self.model.training and self._buffered_inputs is not self._arranged:  # TRL just generated
            args = self.args
            size = micro_batches.window(args.steps_per_generation, args.gradient_accumulation_steps)
            row_mean = self.loss_type in micro_batches.ROW_MEAN_LOSSES
            self._buffered_inputs = micro_batches.arrange(self._buffered_inputs, size, self._regroup, row_mean)
            self._arranged = self._buffered_inputs
            inputs = self._buffered_inputs[self._step % args.steps_per_generation]
        if self._ahead is not None and "policy_version" in inputs:  # overlap: the lag of every micro-batch trained on
            versions = self.accelerator.gather(inputs["policy_version"])  # [rows of every process]
            for name, value in self._ahead.lag_metrics(self.state.global_step, versions).items():
                self.record_metric(name, value)
        return inputs

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        """Nothing: TRL writes its draft card over output_dir's README.md at every checkpoint, whoever wrote it; the
        run's card is written at the end by ``hf_grpo.publish.card``, which never replaces a README.md it did not write."""

    def _save_checkpoint(self, model, trial):
        start, limit = time.perf_counter(), self.args.save_total_limit
        self.args.save_total_limit = None  # transformers would rotate before this one is complete: done below
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self.args.save_total_limit = limit
        rank, folder, sampler = self.accelerator.process_index, self._checkpoint_dir(trial), self._sampler
        if sampler is not None:
            sampler.save(folder, rank)
        if self._ahead is not None:  # waits for the rounds in flight
            self._ahead.save(folder, rank)
        mid_cycle = self._save_generation_batch(folder, rank)
        if self.accelerator.is_main_process:  # a callback's own state (the run watch's), resumed from with the rest
            for callback in self.callback_handler.callbacks:
                if hasattr(callback, "save_state"):
                    callback.save_state(folder)
        # transformers' _save_checkpoint ends without a barrier: a slower process may still be writing its RNG and
        # sampling state. Once all have, the manifest marks the checkpoint complete (checkpoints.py).
        self.accelerator.wait_for_everyone()
        seen = gather_object([listing(folder)]) if self.accelerator.num_processes > 1 else []  # one per process
        shared = all(view == seen[0] for view in seen)  # else each node has its own output_dir: each writes its own
        if self.accelerator.is_main_process or (self.accelerator.is_local_main_process and not shared):
            # after the barrier, no process still writes into what is deleted
            selection, overlap = sampler is not None and sampler.selector is not None, self._ahead is not None
            write_manifest(
                folder, self.accelerator.num_processes, self.args.dynamic_sampling, seen,
                prompt_selection=selection, overlap=overlap, mid_cycle=mid_cycle,
            )  # fmt: skip
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
            self._ahead.first_round(self.state.global_step, inputs)
        mode = "train" if self.model.training else "eval"
        if mode == "train" and self.args.dynamic_sampling:
            step, token_keys = self.state.global_step + 1, self._token_level_keys()
            old_logps = functools.partial(batch_logps.policy_logps, self)
            reference = functools.partial(batch_logps.reference_logps, self) if self._defer_reference else None
            output, metrics = self._sampler.batch(
                inputs, step, self._score_round, old_logps, token_keys, reference_logps=reference
            )
            for name, value in metrics.items():
                self.record_metric(name, value)
        else:
            output, _ = self._score(inputs, mode)
        self._log_advantages(output["advantages"], mode)
        if overlapped:  # seconds from sending this cycle's rounds to their last answer (while training ran, if ahead)
            self.record_metric("time/server_generate", self._ahead.take_server_seconds())
        return output

    def _score(self, inputs, mode: str) -> tuple[dict, torch.Tensor]:
        """TRL's generation and scoring of ``inputs``, with our advantages and reward metrics; returns TRL's scored
        batch and the rewards of every process's completions [B*G global, F]."""
        output = super()._generate_and_score_completions(inputs)
        rewards, self._rewards = self._rewards, None  # set by _calculate_rewards during the call above
        total = self.total_rewards(rewards)  # [B*G global]
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
        return output, rewards

    def _score_round(self, inputs) -> tuple[dict, torch.Tensor]:
        """A dynamic-sampling round: the scored batch and the values its groups are filtered on. [B*G global]
        With a KL term the round skips TRL's reference pass; the sampler runs it once on the batch that trains."""
        with batch_logps.rounds_skip_reference(self, self._defer_reference):
            output, rewards = self._score(inputs, mode="train")
        return output, self.total_rewards(rewards) if self._filter_column is None else rewards[:, self._filter_column]

    def _log_advantages(self, advantages: torch.Tensor, mode: str = "train") -> None:
        gathered = self.accelerator.gather(advantages)  # [B*G global]
        self.record_metric("advantage/mean", gathered.mean().item(), mode)
        self.record_metric("advantage/std", gathered.std().item() if gathered.numel() > 1 else 0.0, mode)

    # ----------------------------------------------------------------------------------------------------------------
    # Dynamic sampling

    def _token_level_keys(self) -> tuple[str, ...]:
        token_is = (
            self.use_vllm
            and self.vllm_importance_sampling_correction
            and self.vllm_importance_sampling_mode.startswith("token")
        )
        return ("importance_sampling_ratio",) if token_is else ()

    # ----------------------------------------------------------------------------------------------------------------
    # Checkpointing of the sampling state

    def _checkpoint_dir(self, trial) -> str:
        return os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")

    def _save_generation_batch(self, folder: str, rank: int) -> bool:
        """Inside a generation cycle (TRL's batch serves ``steps_per_generation x num_iterations`` micro-batches and
        some are left), write that batch and TRL's micro-batch count into ``folder``, so that a resumed run trains on
        the rest of it as the uninterrupted run would, instead of generating anew; returns whether it did (the same on
        every process)."""
        every = self.args.steps_per_generation * self.num_iterations
        if self._step % every == 0:
            return False
        os.makedirs(folder, exist_ok=True)  # a process that wrote nothing there yet (save_only_model)
        state = {"step": self._step, "every": every, "batches": self._buffered_inputs}
        torch.save(state, os.path.join(folder, BATCH_FILE.format(rank=rank)))
        return True

    def _load_generation_batch(self, checkpoint: str, rank: int, manifest: dict) -> None:
        """TRL's generation batch and micro-batch count as ``_save_generation_batch`` wrote them, when ``checkpoint``'s
        ``manifest`` says it did with this many processes; else the resumed run starts a generation cycle (TRL
        generates first; pipeline.resume_target warned about another process count before loading)."""
        self._step, self._buffered_inputs = 0, None  # TRL keeps both in memory only: a fresh cycle
        if not manifest.get("mid_cycle") or manifest["num_processes"] != self.accelerator.num_processes:
            return
        path = os.path.join(checkpoint, BATCH_FILE.format(rank=rank))
        state = torch.load(path, map_location="cpu", weights_only=True)  # torch.load cannot map to "cpu:0" (gloo)
        device, args = self.accelerator.device, self.args
        batches = [{k: v.to(device) if torch.is_tensor(v) else v for k, v in b.items()} for b in state["batches"]]
        every = args.steps_per_generation * self.num_iterations
        rows = {len(batch["prompt_ids"]) for batch in batches}
        if state["every"] != every or len(batches) != args.steps_per_generation or rows != {self._train_batch_size}:
            logger.warning(
                "resume: %s was saved inside a generation cycle with another steps_per_generation, num_iterations or "
                "per_device_train_batch_size: its batch is generated anew at step %d, so the run does not continue "
                "exactly as it would have",
                checkpoint,
                self.state.global_step,
            )
            return
        self._step, self._buffered_inputs = state["step"], batches

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        rank, saved = self.accelerator.process_index, read_manifest(checkpoint) or {}  # {}: another program's
        self._load_generation_batch(checkpoint, rank, saved)
        sampler = self._sampler
        # a feature the checkpoint holds no state of starts fresh (pipeline.resume_target warned before loading)
        if sampler is None or not (saved.get("dynamic_sampling") or saved.get("overlap")):
            return
        sampler.load(checkpoint, rank)
        if self._ahead is not None and saved.get("overlap"):
            self._ahead.load(checkpoint, rank)
        state = sampler.stream.state()
        logger.info("restored dynamic sampling state: %d carried groups, prompt stream %s", len(sampler.pool), state)
