"""Held-out task accuracy during a training run: before, every N steps, and after.

``TaskEvaluator.run`` shards the held-out set across processes, generates greedily on the trainer's device
(``evaluation.device``; under ZeRO-3 the parameters gathered, as TRL does), gathers the graded records and returns the
summary; the main process writes them to ``output_dir/eval_<label>.jsonl``. Grading runs in worker processes with a
hard per-completion timeout (``evaluation.core``): a completion math-verify cannot finish is graded ``timeout``, and
the run goes on. The pool: the one passed in, else the trainer's reward pool, else one of its own (``close()``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

from accelerate import PartialState
from accelerate.utils import gather_object
from transformers import TrainerCallback

from ..base.progress import enabled_for
from ..base.run_files import EVAL_RECORDS
from ..base.workers import cores_per_process
from ..rewards.wrapper import IsolatedReward, RewardPool
from .core import DEFAULT_GRADE_TIMEOUT, MAX_GRADE_WORKERS, evaluate
from .device import describe, eval_batch_size, model_device, place_for_generation
from .stats import EVAL_GRADES, summarize


logger = logging.getLogger(__name__)


def trainer_reward_pool(trainer) -> tuple[RewardPool, float] | None:
    """(pool, timeout) of the first isolated reward of ``trainer`` whose pool is open, or None."""
    for fn in getattr(trainer, "reward_funcs", None) or ():
        if isinstance(fn, IsolatedReward) and not fn.pool.closed:
            return fn.pool, fn.timeout
    return None


def sharded(trainer) -> bool:
    """Whether ``trainer``'s parameters are split across its processes (DeepSpeed ZeRO-3 or FSDP)."""
    plugin = trainer.accelerator.state.deepspeed_plugin
    return bool(getattr(trainer, "is_fsdp_enabled", False) or (plugin is not None and plugin.zero_stage == 3))


def in_step(trainer) -> bool:
    """Whether the processes must run every ``generate`` in step (parameters sharded across several of them): a
    process cannot then halve its batch on its own."""
    return trainer is not None and trainer.accelerator.num_processes > 1 and sharded(trainer)


class TaskEvaluator:
    """Greedy held-out accuracy of a policy, graded in worker processes with a hard per-completion timeout.

    Args:
        dataset: the held-out set (columns ``prompt`` and ``solution``).
        task (`str`): the grader (``"gsm8k"``, ``"math"`` or ``"r1_zero"``).
        args: the training arguments (``output_dir``, ``eval_max_new_tokens``, ...).
        grade_timeout (`float`, *optional*):
            Seconds one completion may take to grade. Defaults to the trainer's isolated rewards' timeout (the
            recipe's ``reward_timeout``) when grading in their pool, else ``DEFAULT_GRADE_TIMEOUT``.
        pool (`RewardPool`, *optional*):
            Grade in this pool; the caller owns it (``close()`` leaves it running).
    """

    def __init__(self, dataset, task: str, args, grade_timeout: float | None = None, pool: RewardPool | None = None):
        if grade_timeout is not None and not grade_timeout > 0:
            raise ValueError(f"grade_timeout must be positive, got {grade_timeout}")
        self.dataset = dataset
        self.task = task
        self.output_dir = Path(args.output_dir)
        self.max_new_tokens = args.eval_max_new_tokens or args.max_completion_length
        self.batch_size = (
            args.per_device_eval_batch_size
        )  # transformers default: 8 on a CPU, 64 on a GPU (eval_batch_size)
        self.chat_template_kwargs = args.chat_template_kwargs  # prompts rendered as training renders them
        self.periodic_samples = args.task_eval_max_samples
        self.grade_timeout = grade_timeout
        self.progress = enabled_for(args)  # bars on the main process, off with disable_tqdm (hf_grpo.base.progress)
        self.pool = pool
        self._own_pool: RewardPool | None = None
        self.last_records: list[dict] = []  # the per-problem records of the last evaluation
        # Wall seconds of each evaluation by label, in order; a second ``after`` (the adapter the watch kept) is
        # ``after (kept)``. A dict of numbers: eval_results.json's "seconds", read by the notebooks' tables.
        self.seconds: dict[str, float] = {}

    def grading(self, trainer=None) -> tuple[RewardPool, float]:
        """(pool, timeout per completion) for the next evaluation; starts the evaluator's own pool when needed."""
        pool, timeout = self.pool, DEFAULT_GRADE_TIMEOUT
        if pool is None:
            shared = trainer_reward_pool(trainer)
            if shared is not None:
                pool, timeout = shared
            else:
                if self._own_pool is None or self._own_pool.closed:
                    self._own_pool = RewardPool(num_workers=min(cores_per_process(), MAX_GRADE_WORKERS))
                pool = self._own_pool
        return pool, self.grade_timeout if self.grade_timeout is not None else timeout

    def close(self) -> None:
        """Stop the grading workers this evaluator started (not a pool it was given or shares); it can run again."""
        if self._own_pool is not None:
            self._own_pool.close()
            self._own_pool = None

    def run(self, model, tokenizer, label: str, trainer=None, max_samples: int | None = None) -> dict:
        """Greedy accuracy of ``model`` on the held-out set (all processes must call this together)."""
        state, start = PartialState(), time.perf_counter()
        pool, timeout = self.grading(trainer)
        n = len(self.dataset) if max_samples is None else min(max_samples, len(self.dataset))
        with state.split_between_processes(list(range(n)), apply_padding=True) as shard:
            subset = self.dataset.select(shard)
            options = dict(
                grade_timeout=timeout,
                pool=pool,
                progress=self.progress,
                label=label,
                chat_template_kwargs=self.chat_template_kwargs,
                halve_on_oom=not in_step(trainer),
            )
            result, device = self._generate_and_grade(model, tokenizer, subset, trainer, options)
            for record, index in zip(result.records, shard, strict=True):
                record["index"] = index
        records = {r["index"]: r for r in gather_object(result.records)}  # padding repeats the last index
        records = [records[i] for i in range(n)]
        if "kind" in self.dataset.column_names:  # the held-out set's own categories: the report's kinds
            for record, kind in zip(records, self.dataset.select(range(n))["kind"], strict=True):
                record["kind"] = kind
        self.last_records = records  # every process: the run watch reads them (hf_grpo.monitoring.run_watch)
        summary = summarize(records)
        seconds = round(time.perf_counter() - start, 3)
        self.seconds[f"{label} (kept)" if label in self.seconds else label] = seconds
        if state.is_main_process:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            with open(self.output_dir / EVAL_RECORDS.format(label=label), "w") as f:
                f.writelines(json.dumps(record) + "\n" for record in records)
            logger.info(
                "held-out accuracy (%s): %.3f (%d correct, %d wrong, %d unparseable, %d grading timeouts, "
                "%d grading errors of %d), generated on %s in %.0f s",
                label,
                summary["accuracy"],
                *(summary[g] for g in EVAL_GRADES),  # correct, wrong, unparseable, timeout, error
                n,
                describe(device),
                seconds,
            )
        return summary

    def recorded(self, label: str) -> dict | None:
        """The summary of the evaluation ``label`` from its per-problem records in ``output_dir``, when they cover
        the whole held-out set (a resumed run's ``before``: the base policy is the same); else None."""
        try:
            lines = (self.output_dir / EVAL_RECORDS.format(label=label)).read_text(encoding="utf-8").splitlines()
            records = [json.loads(line) for line in lines if line.strip()]
        except (OSError, ValueError):
            return None
        if sorted(r.get("index") for r in records if isinstance(r, dict)) != list(range(len(self.dataset))):
            return None
        logger.info("held-out accuracy (%s): from the run's records, %s", label, self.output_dir)
        self.last_records = records
        return summarize(records)

    def _generate_and_grade(self, model, tokenizer, subset, trainer, options: dict):
        """(EvalResult, device it generated on) of this process's ``subset``: through the trainer's unwrapped model
        (gathered under ZeRO-3 when the recipe says so) on the trainer's device, or ``model`` on this process's."""
        from trl.models import unwrap_model_for_generation

        if trainer is None:
            place_for_generation(model, PartialState().device)
            return self._evaluate(model, tokenizer, subset, options)
        gather = trainer.args.ds3_gather_for_generation  # False: ZeRO-3 shards stay, generate syncs ranks
        with unwrap_model_for_generation(
            trainer.model_wrapped, trainer.accelerator, gather_deepspeed3_params=gather
        ) as unwrapped:
            # before training under DeepSpeed or FSDP the trainer has not placed the model yet: its weights are where
            # they loaded (the CPU); the trainer would move them to the same device when training starts
            place_for_generation(unwrapped, trainer.accelerator.device, sharded=sharded(trainer))
            return self._evaluate(unwrapped, tokenizer, subset, options)

    def _evaluate(self, model, tokenizer, subset, options: dict):
        """``evaluate`` where ``model`` is, with the batch for that device; (EvalResult, device)."""
        device = model_device(model)
        batch = eval_batch_size(device, self.batch_size)
        return evaluate(model, tokenizer, subset, self.task, self.max_new_tokens, batch_size=batch, **options), device

    def callback(self, trainer, log: Callable[[object, dict[str, float]], None], on_result=None) -> TrainerCallback:
        """A callback that evaluates every ``task_eval_steps`` and logs ``{"accuracy": ...}`` with ``log(trainer,
        metrics)`` (the run passes ``hf_grpo.monitoring.trackers.log_evaluation``); ``on_result(step, records, control)``
        then gets the per-problem records (the run watch's ``evaluated``)."""
        return _PeriodicEval(self, trainer, log, on_result)


class _PeriodicEval(TrainerCallback):
    """Runs the task evaluation every ``task_eval_steps`` optimizer steps and logs ``eval/accuracy``; not at the last
    step when the evaluation after training follows (it evaluates the same weights on every problem)."""

    def __init__(self, evaluator: TaskEvaluator, trainer, log, on_result=None):
        self.evaluator, self.trainer, self.log, self.on_result = evaluator, trainer, log, on_result

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % args.task_eval_steps:
            return
        if args.eval_before_after and state.global_step >= state.max_steps:  # the evaluation after training is it
            return
        summary = self.evaluator.run(
            self.trainer.model,
            self.trainer.processing_class,
            f"step{state.global_step}",
            trainer=self.trainer,
            max_samples=self.evaluator.periodic_samples,
        )
        # A log record of its own: the trackers get it as eval/accuracy (through the trainer's metrics it would
        # reach them as train/eval/accuracy), training_history.json as before.
        self.log(self.trainer, {"accuracy": summary["accuracy"]})
        self.trainer.last_task_eval = (state.global_step, summary["accuracy"])
        if self.on_result is not None:
            self.on_result(state.global_step, self.evaluator.last_records, control)
