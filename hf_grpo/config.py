"""Configuration dataclasses: TRL's, extended with hf_grpo's options and nothing re-declared.

A recipe is one flat YAML file whose keys are the fields of these classes (``hf_grpo.recipe`` parses it):

- ``HfGRPOConfig(trl.GRPOConfig)``: every TRL/transformers training field, plus dynamic sampling, the advantage
  estimator and task evaluation during training (used by ``hf_grpo.training.trainer.GRPOTrainer``);
- ``ModelArguments(trl.ModelConfig)``: model id and LoRA fields, plus the embedded tiny model's warm start;
- ``DataArguments(trl.ScriptArguments)`` in ``hf_grpo.data``; ``RewardArguments`` in ``hf_grpo.rewards``;
  ``LaunchArguments`` in ``hf_grpo.launch.launcher`` (accelerate config, processes, generation layout).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from dataclasses import dataclass, field
from functools import cached_property

import torch
from accelerate import PartialState
from trl import GRPOConfig, ModelConfig


logger = logging.getLogger(__name__)


ADVANTAGE_ESTIMATORS = ("grpo", "dr_grpo", "rloo")
EXHAUSTED_POLICIES = ("fill", "error")
STOP_REASONS = ("degraded", "plateau")  # stop_on (hf_grpo.monitoring.run_watch)
WATCH_FLOORS = ("entropy", "completion_length", "signal")  # watch_floors (hf_grpo.monitoring.run_watch)


@dataclass
class ModelArguments(ModelConfig):
    """
    Model options (extends [`trl.ModelConfig`], which holds `model_name_or_path` and the LoRA fields).

    Args:
        model_name_or_path (`str`, defaults to `"tiny"`):
            Hub id or local directory of the policy. `tiny` builds the embedded 2-layer Qwen2 model and its tokenizer
            locally (no download).
        tiny_hidden_size (`int`, defaults to `128`):
            Hidden size of the embedded tiny model.
        warm_start_steps (`int`, defaults to `0`):
            Supervised steps before GRPO (`hf_grpo.training.warm_start`). With `tiny`: on the embedded arithmetic train split,
            building the base model, so that GRPO has reward variance to learn from. With a pretrained model: on the
            training rows' gold solutions (`solution_column`, the prompt as GRPO renders it), after the `before`
            evaluation, training the adapter with `use_peft`; skipped when the run resumes from a checkpoint.
        warm_start_lr (`float`, *optional*):
            Learning rate of the warm start; unset: `2e-3` where it trains an adapter or builds the tiny model, `1e-5`
            for a full fine-tune of a pretrained model (`resolved_warm_start_lr`).
        warm_start_reference (`bool`, defaults to `False`):
            With a KL term (`beta` > 0) and LoRA, measure it against the warm-started policy (a frozen copy of the
            adapter after the warm start, TRL's `ref` adapter) instead of the base model, so the KL does not pull
            GRPO back from what the warm start taught.
        warm_start_batch_size (`int`, defaults to `32`):
            Rows per warm-start step (a pretrained model's; the tiny model's are 32).
        warm_start_max_lines (`int`, *optional*):
            A curriculum: the warm start learns only the rows whose gold solution has at most this many lines (the
            `#### N` line counted); GRPO trains on every row. Unset: every row.
    """

    model_name_or_path: str | None = field(
        default="tiny", metadata={"help": "Hub id or local path of the policy; `tiny` builds the embedded model."}
    )
    tiny_hidden_size: int = field(default=128, metadata={"help": "Hidden size of the embedded tiny model."})
    warm_start_steps: int = field(
        default=0, metadata={"help": "Supervised steps on gold solutions before GRPO (tiny: builds its base model)."}
    )
    warm_start_lr: float | None = field(
        default=None,
        metadata={"help": "Learning rate of the warm start (unset: 2e-3 for an adapter, 1e-5 for a full fine-tune)."},
    )
    warm_start_batch_size: int = field(default=32, metadata={"help": "Rows per warm-start step."})
    warm_start_max_lines: int | None = field(
        default=None, metadata={"help": "Warm-start only on gold solutions of at most this many lines (unset: all)."}
    )
    warm_start_reference: bool = field(
        default=False, metadata={"help": "KL term against the warm-started policy (LoRA), not the base model."}
    )

    @property
    def warm_starts_pretrained(self) -> bool:
        """Whether a pretrained policy is warm-started in the run (``hf_grpo.training.warm_start.warm_start_policy``); the
        tiny model's warm start builds its base model instead."""
        return self.warm_start_steps > 0 and self.model_name_or_path != "tiny"

    @property
    def resolved_warm_start_lr(self) -> float:
        """``warm_start_lr``, or its default: a full fine-tune of a pretrained model moves every weight, where an
        adapter or the tiny model's base from scratch takes a step 200 times larger."""
        if self.warm_start_lr is not None:
            return self.warm_start_lr
        return 1e-5 if self.warm_starts_pretrained and not self.use_peft else 2e-3


@dataclass
class HfGRPOConfig(GRPOConfig):
    r"""
    Training configuration (extends [`trl.GRPOConfig`]; every TRL and transformers field is available).

    One default differs from TRL's: an unset `bf16` becomes `False` on a machine without a bf16-capable GPU (TRL makes
    it `True`, which fails there), so one recipe runs on a GPU node and on a laptop.

    Parameters:
        > Dynamic sampling (DAPO, https://huggingface.co/papers/2503.14476)

        dynamic_sampling (`bool`, defaults to `False`):
            Drop prompt groups whose rewards are all equal (they carry zero advantage) and generate more groups until
            the batch is full. Surplus groups are carried over to the next step. Each group keeps the advantages of the
            round that generated it: with `scale_rewards: batch` that is its round's std, dropped groups included,
            not the trained batch's (a warning says so; `group` has no such mix).
        dynamic_sampling_metric (`str`, defaults to `"reward"`):
            What must vary within a group for it to be kept: `reward` (the weighted total) or the name of one reward
            function (for example `gsm8k_correctness`).
        max_generation_batches (`int`, defaults to `10`):
            Generation rounds allowed per optimizer step, the first included (NeMo RL's default is 10).
        dynamic_sampling_exhausted (`str`, defaults to `"fill"`):
            What to do when the rounds run out before the batch is full: `fill` completes the batch with dropped
            groups masked out of the loss (no policy or KL gradient, no tokens in the loss normaliser) and logs
            `dynamic_sampling/exhausted`; `error` stops the run.
        prompt_selection (`bool`, defaults to `False`):
            With dynamic sampling: skip, before generating it, a prompt whose recent groups all had equal rewards, with
            a probability that rises with how many times in a row that happened and never reaches 1 (GRESO,
            https://huggingface.co/papers/2506.02177; `hf_grpo/training/prompt_selection.py`). Every process decides the same; the
            history is saved in checkpoints. Logged as `selection/*`.
        prompt_selection_target (`float`, defaults to `0.75`):
            The share of generated groups dynamic sampling should keep: selection skips more while a step keeps
            less than this, and less while it keeps more (GRESO's default: 25% of groups without signal). 0.75 is
            4 generated per 3 trained.

        > Speed

        shared_prompts (`bool`, defaults to `True`):
            Run each distinct prompt of a micro-batch through the model once for all its completions, when scoring
            them (log-probabilities of the policy and the reference model, training) and when sampling them (HF
            generate, where a row that ended also runs no further forward), and project only completion positions
            onto the vocabulary through TRL's own fused head; micro-batches are regrouped into whole groups where
            the loss allows it (`hf_grpo/training/micro_batches.py`). The same update and samples as TRL's to float rounding,
            for less compute (`hf_grpo/training/shared_prompts.py`). Activation checkpointing, a sharded model (ZeRO-3,
            FSDP) or a vision-language model keeps TRL's path.

        > Advantages

        advantage_estimator (`str`, defaults to `"grpo"`):
            `grpo`: reward minus the group mean, scaled as `scale_rewards` says (TRL's estimator). `dr_grpo`: reward
            minus the group mean, never scaled (Dr. GRPO; forces `scale_rewards="none"`). `rloo`: reward minus the
            mean of the *other* completions of the group (leave-one-out baseline, NeMo RL's default), then scaled as
            `scale_rewards` says.

        > Task evaluation

        eval_before_after (`bool`, defaults to `True`):
            Measure greedy accuracy on the held-out split before and after training and write
            `eval_results.json` in `output_dir`.
        task_eval_steps (`int`, defaults to `0`):
            Also measure held-out accuracy every this many optimizer steps (0 = never) and log it as
            `eval/accuracy`.
        task_eval_max_samples (`int`, *optional*):
            Held-out examples used by `task_eval_steps` evaluations (all when unset).
        eval_max_new_tokens (`int`, *optional*):
            Generation budget of task evaluations; defaults to `max_completion_length`.
        keep_top_k (`int`, *optional*):
            Keep only the `k` checkpoints with the best held-out accuracy (NeMo RL's `keep_top_k`); every saved
            checkpoint is scored by the task evaluation of its step, so `save_steps` must be a multiple of
            `task_eval_steps`. Scores are in `output_dir/checkpoint_scores.json`. Replaces `save_total_limit`.

        > Run watch (`hf_grpo/monitoring/run_watch.py`, docs/watch.md)

        watch (`bool`, defaults to `True`):
            Watch the run's logged signals and its evaluations: report collapse, reward hacking and forgetting, and
            keep the best evaluated adapter (by paired comparison) when it beats the last one.
        stop_on (`list[str]`, defaults to `[]`):
            End the run cleanly on `degraded` (a finding of the watch) and/or `plateau` (the last
            `watch_plateau_evals` evaluations gained nothing over the best one).
        watch_patience (`int`, defaults to `2`):
            Logged steps in a row a collapse signal must hold before it is a finding.
        watch_reward_drop (`float`, defaults to `0.5`):
            Collapse of the training reward: its two-step mean below this share of its best two-step mean (and at
            least 0.1 below it).
        watch_floors (`dict`, *optional*):
            Collapse floors: `entropy` (nats per token), `completion_length` (tokens), `signal` (the share of groups
            whose rewards differ); a signal under its floor for `watch_patience` steps is a finding.
        watch_plateau_evals (`int`, defaults to `3`):
            Evaluations without a gain whose paired interval is above 0 that make a plateau (`stop_on: [plateau]`).

        > Console (`hf_grpo/monitoring/console.py`)

        console_metrics (`bool`, defaults to `False`):
            Print transformers' full metric dictionary at every logged step, as plain TRL does, instead of one line
            (step, reward, training accuracy, kept groups, KL, entropy, seconds a step, time left). Every metric
            reaches `training_history.json` and the trackers either way.
    """

    dynamic_sampling: bool = field(
        default=False, metadata={"help": "Drop zero-variance prompt groups and generate more until the batch is full."}
    )
    dynamic_sampling_metric: str = field(
        default="reward", metadata={"help": "`reward` or the name of one reward function to filter groups on."}
    )
    max_generation_batches: int = field(
        default=10, metadata={"help": "Generation rounds allowed per optimizer step (first included)."}
    )
    dynamic_sampling_exhausted: str = field(
        default="fill",
        metadata={
            "help": "When rounds run out: `fill` with dropped groups masked out of the loss, or `error`.",
            "choices": EXHAUSTED_POLICIES,
        },
    )
    prompt_selection: bool = field(
        default=False,
        metadata={"help": "Skip prompts whose recent groups had all-equal rewards (needs dynamic_sampling)."},
    )
    prompt_selection_target: float = field(
        default=0.75, metadata={"help": "Share of generated groups to keep that prompt selection adapts toward."}
    )
    shared_prompts: bool = field(
        default=True,
        metadata={"help": "Run each distinct prompt once for its completions when scoring and sampling them."},
    )
    advantage_estimator: str = field(
        default="grpo",
        metadata={
            "help": "`grpo`, `dr_grpo` (no std scaling) or `rloo` (leave-one-out baseline).",
            "choices": ADVANTAGE_ESTIMATORS,
        },
    )
    eval_before_after: bool = field(
        default=True, metadata={"help": "Held-out accuracy before and after training, in eval_results.json."}
    )
    task_eval_steps: int = field(default=0, metadata={"help": "Held-out accuracy every N optimizer steps (0 = off)."})
    task_eval_max_samples: int | None = field(
        default=None, metadata={"help": "Held-out examples used by the periodic task evaluation."}
    )
    eval_max_new_tokens: int | None = field(
        default=None, metadata={"help": "Generation budget of task evaluations (default: max_completion_length)."}
    )
    keep_top_k: int | None = field(
        default=None, metadata={"help": "Keep only the k checkpoints with the best held-out accuracy."}
    )
    watch: bool = field(
        default=True, metadata={"help": "Report collapse, hacking and forgetting; keep the best adapter."}
    )
    stop_on: list[str] = field(
        default_factory=list, metadata={"help": "End the run on `degraded` (a watch finding) and/or `plateau`."}
    )
    watch_patience: int = field(default=2, metadata={"help": "Steps in a row a collapse signal must hold."})
    watch_reward_drop: float = field(
        default=0.5, metadata={"help": "Collapse: the reward's 2-step mean under this share of its best."}
    )
    watch_floors: dict[str, float] | None = field(
        default=None, metadata={"help": "Collapse floors: entropy, completion_length, signal (share of groups)."}
    )
    watch_plateau_evals: int = field(
        default=3, metadata={"help": "Evaluations without a significant gain that make a plateau."}
    )
    console_metrics: bool = field(
        default=False,
        metadata={"help": "Print transformers' full metric dictionary at every logged step, as plain TRL does."},
    )

    def __post_init__(self):
        # TRL turns an unset bf16 into True, which fails on a machine without a bf16-capable GPU; resolve it from the
        # hardware instead, so one recipe runs both on a GPU node and on a laptop.
        if self.bf16 is None and not self.fp16 and not (torch.cuda.is_available() and torch.cuda.is_bf16_supported()):
            self.bf16 = False
        # Several processes but no GPU: accelerate picks no process-group backend and every process silently trains
        # alone (world size 1). DeepSpeed's CPU accelerator needs gloo; plain data parallel needs use_cpu (-> gloo).
        if not torch.cuda.is_available() and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
                self.ddp_backend = self.ddp_backend or "gloo"
            else:
                self.use_cpu = True
        if self.advantage_estimator == "dr_grpo":
            self.scale_rewards = "none"
        super().__post_init__()
        if self.max_generation_batches < 1:
            raise ValueError(f"max_generation_batches must be >= 1, got {self.max_generation_batches}")
        if self.dynamic_sampling and self.scale_rewards == "batch":
            logger.warning(
                "dynamic_sampling with scale_rewards 'batch': each kept group's advantages are divided by the reward "
                "std of the round that generated it (its dropped groups included), not of the trained batch; "
                "scale_rewards 'group' (or 'none') has no such mix"
            )
        if self.prompt_selection and not self.dynamic_sampling:
            raise ValueError("prompt_selection needs dynamic_sampling: true (it learns from the groups it drops)")
        if not 0 < self.prompt_selection_target <= 1:
            raise ValueError(f"prompt_selection_target must be in (0, 1], got {self.prompt_selection_target}")
        if self.advantage_estimator not in ADVANTAGE_ESTIMATORS:
            raise ValueError(
                f"advantage_estimator must be one of {ADVANTAGE_ESTIMATORS}, got {self.advantage_estimator!r}"
            )
        if self.keep_top_k is not None:
            if self.keep_top_k < 1 or self.task_eval_steps < 1:
                raise ValueError(
                    "keep_top_k needs keep_top_k >= 1 and task_eval_steps >= 1 (checkpoints are ranked "
                    "by the held-out accuracy measured every task_eval_steps)"
                )
            if self.save_strategy != "steps" or self.save_steps % self.task_eval_steps:
                raise ValueError(
                    f"keep_top_k needs save_strategy 'steps' and save_steps ({self.save_steps}) a "
                    f"multiple of task_eval_steps ({self.task_eval_steps})"
                )
            if self.save_total_limit is not None:
                raise ValueError("keep_top_k replaces save_total_limit: set only one")
        self._check_watch()
        if self.advantage_estimator == "rloo" and self.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError("advantage_estimator='rloo' needs multi_objective_aggregation='sum_then_normalize'")

    def _check_watch(self) -> None:
        unknown = sorted(set(self.stop_on or []) - set(STOP_REASONS))
        if unknown:
            raise ValueError(f"stop_on takes {list(STOP_REASONS)}, not {unknown}")
        floors = sorted(set(self.watch_floors or {}) - set(WATCH_FLOORS))
        if floors:
            raise ValueError(f"watch_floors takes {list(WATCH_FLOORS)}, not {floors}")
        for key, floor in (self.watch_floors or {}).items():
            high = 1 if key == "signal" else math.inf  # signal is a share of groups; the others nats and tokens
            if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not 0 < floor <= high:
                meaning = {"signal": "a share of groups, above 0 and at most 1 (0.1: a finding when fewer than 10% of "
                           "groups have rewards that differ)", "entropy": "nats per token, above 0 (such as 0.05)",
                           "completion_length": "tokens, above 0 (such as 8)"}[key]  # fmt: skip
                raise ValueError(f"watch_floors.{key} is {meaning}; got {floor!r}: set watch_floors: {{{key}: ...}}")
        if self.stop_on and not self.watch:
            raise ValueError(f"stop_on {self.stop_on} needs watch: true (the watch decides when to stop)")
        if "plateau" in (self.stop_on or []) and self.task_eval_steps < 1:
            raise ValueError("stop_on: [plateau] needs task_eval_steps >= 1 (a plateau is seen in the evaluations)")
        if self.watch_patience < 1 or self.watch_plateau_evals < 1 or not 0 < self.watch_reward_drop < 1:
            raise ValueError("watch_patience and watch_plateau_evals must be >= 1, watch_reward_drop in (0, 1)")

    @cached_property
    def _setup_devices(self) -> torch.device:
        # transformers starts the process group with ddp_timeout on GPUs and under DeepSpeed, but on the use_cpu path
        # it passes no timeout: gloo then waits 30 minutes on a peer that vanished without closing its connection
        # (a machine powered off, a link down). Starting the group here with the timeout first (accelerate keeps a
        # group that exists) makes ddp_timeout hold there too.
        if self.use_cpu and int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.distributed.is_initialized():
            PartialState(cpu=True, backend=self.ddp_backend, timeout=self.ddp_timeout_delta)
        return super()._setup_devices


def hf_config(model, args) -> HfGRPOConfig:
    """``args`` as an ``HfGRPOConfig``: itself; for ``None`` TRL's default (output dir ``<model name>-GRPO``); for a
    ``trl.GRPOConfig`` the same values with hf_grpo's fields at their defaults. Anything else is a ``TypeError``."""
    if isinstance(args, HfGRPOConfig):
        return args
    if args is None:
        from trl.trainer.utils import get_config_model_id  # loads transformers' integrations: not on --help's path

        name = model if isinstance(model, str) else get_config_model_id(model.config)
        return HfGRPOConfig(f"{name.split('/')[-1]}-GRPO")
    if isinstance(args, GRPOConfig):
        values = {f.name: getattr(args, f.name) for f in dataclasses.fields(GRPOConfig) if f.init}
        values.pop("generation_batch_size")  # derived in __post_init__ from steps_per_generation, which is kept
        return HfGRPOConfig(**values)
    raise TypeError(f"hf_grpo.GRPOTrainer needs an HfGRPOConfig (or a trl.GRPOConfig), got {type(args).__name__}")
