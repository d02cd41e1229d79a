"""Held-out task accuracy during a training run: before, every N steps, and after.

``TaskEvaluator.run`` shards the held-out set across processes, generates greedily with the current policy (under
DeepSpeed ZeRO-3 the parameters are gathered for generation, as TRL does), gathers the graded records and returns
the summary; the main process also writes them to ``output_dir/eval_<label>.jsonl`` (one line per example).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from accelerate import PartialState
from accelerate.utils import gather_object
from transformers import TrainerCallback

from ..outputs import EVAL_RECORDS
from .core import evaluate


logger = logging.getLogger(__name__)


class TaskEvaluator:
    def __init__(self, dataset, task: str, args):
        self.dataset = dataset
        self.task = task
        self.output_dir = Path(args.output_dir)
        self.max_new_tokens = args.eval_max_new_tokens or args.max_completion_length
        self.batch_size = max(args.per_device_eval_batch_size, 8)
        self.periodic_samples = args.task_eval_max_samples

    def run(self, model, tokenizer, label: str, trainer=None, max_samples: int | None = None) -> dict:
        """Greedy accuracy of ``model`` on the held-out set (all processes must call this together)."""
        from trl.models import unwrap_model_for_generation

        state = PartialState()
        n = len(self.dataset) if max_samples is None else min(max_samples, len(self.dataset))
        with state.split_between_processes(list(range(n)), apply_padding=True) as shard:
            subset = self.dataset.select(shard)
            if trainer is not None:
                with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator) as unwrapped:
                    result = evaluate(
                        unwrapped, tokenizer, subset, self.task, self.max_new_tokens, batch_size=self.batch_size
                    )
            else:
                model.to(state.device)
                result = evaluate(model, tokenizer, subset, self.task, self.max_new_tokens, batch_size=self.batch_size)
            for record, index in zip(result.records, shard, strict=True):
                record["index"] = index
        records = {r["index"]: r for r in gather_object(result.records)}  # padding repeats the last index
        records = [records[i] for i in range(n)]
        counts = {g: sum(r["grade"] == g for r in records) for g in ("correct", "wrong", "unparseable")}
        summary = {"accuracy": counts["correct"] / n if n else 0.0, **counts, "total": n}
        if state.is_main_process:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            with open(self.output_dir / EVAL_RECORDS.format(label=label), "w") as f:
                for record in records:
                    f.write(json.dumps(record) + "\n")
            logger.info(
                "held-out accuracy (%s): %.3f (%d correct, %d wrong, %d unparseable of %d)",
                label,
                summary["accuracy"],
                counts["correct"],
                counts["wrong"],
                counts["unparseable"],
                n,
            )
        return summary

    def callback(self, trainer) -> TrainerCallback:
        return _PeriodicEval(self, trainer)


class _PeriodicEval(TrainerCallback):
    """Runs the task evaluation every ``task_eval_steps`` optimizer steps and records ``eval/accuracy``."""

    def __init__(self, evaluator: TaskEvaluator, trainer):
        self.evaluator, self.trainer = evaluator, trainer

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % args.task_eval_steps:
            return
        summary = self.evaluator.run(
            self.trainer.model,
            self.trainer.processing_class,
            f"step{state.global_step}",
            trainer=self.trainer,
            max_samples=self.evaluator.periodic_samples,
        )
        self.trainer.record_metric("eval/accuracy", summary["accuracy"])
        self.trainer.last_task_eval = (state.global_step, summary["accuracy"])
