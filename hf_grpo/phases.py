"""The phases of a run around ``trainer.train()``: the held-out evaluation before training, a pretrained policy's
warm start, training with the periodic evaluation and the run watch, the saved model, the evaluation after training,
the adapter the run keeps, and ``eval_results.json``.

``hf_grpo.pipeline.run`` calls ``train_and_evaluate`` on every process with the trainer it built. The run watch
(``hf_grpo.watch``, on unless ``watch: false``) is a callback beside the trainer: it reads the logged steps and every
held-out evaluation (step 0 is the policy training starts from: the evaluation before training, or one after a warm
start), may end training early (``stop_on``), and at the end restores the best evaluated adapter when it beats the
last one with its paired interval above 0; the evaluation after training is then that adapter's.
"""

from __future__ import annotations

import logging
from pathlib import Path

from .data.loaders import is_local_file, source_splits
from .evaluation.stats import gain_from_run, gains_by_kind
from .finishing import load_trained_weights
from .recipe import Recipe
from .rewards.wrapper import RewardFailedError
from .run_files import EVAL_FILE
from .trackers import log_evaluation


logger = logging.getLogger("hf_grpo")


def train_and_evaluate(recipe: Recipe, trainer, evaluator, resume: str | None, on_failure, trained=None,
                       history=None) -> dict:  # fmt: skip
    """Evaluate before, train (with the periodic evaluation and the watch), save, evaluate after; returns
    ``eval_results.json``'s content (empty without the before/after evaluation), which the main process writes.
    ``on_failure`` runs on the main process when a broken reward stops training (the report then shows the run up to
    there). ``trained``: the folder of the run's trained weights (``finished_run``: its checkpoint at max_steps, or
    ``output_dir``), loaded instead of training (transformers' resume at max_steps would train one step more).
    ``history``: the run's ``HistoryCallback``, where the watch marks its findings."""
    args, results = recipe.training, {}
    before_after = evaluator is not None and args.eval_before_after
    tokenizer = trainer.processing_class
    if before_after:
        # Through the trainer, as every later evaluation: under ZeRO-3 (zero3_init_flag) the loaded weights are
        # shards, and only the trainer's unwrap gathers them for generation. A resumed run has its records.
        recorded = evaluator.recorded("before") if resume is not None or trained is not None else None
        results["before"] = recorded or evaluator.run(trainer.model, tokenizer, label="before", trainer=trainer)
        before_records = evaluator.last_records  # (recorded() leaves them there too)
    if recipe.model.warm_starts_pretrained and resume is None and trained is None:
        from .warm_start import warm_start_policy  # torch: loaded when a run starts, not for --help

        warm_start_policy(trainer, recipe.model)  # after "before": the gain counts it (the tiny model's is its base)
    watch = start_watch(recipe, trainer, evaluator, history, fresh=resume is None and trained is None)
    if evaluator is not None and args.task_eval_steps > 0:
        on_result = None if watch is None else lambda step, records, control: watch.evaluated(
            step, watch_evaluation(step, records, evaluator), trainer.model, control
        )  # fmt: skip
        trainer.add_callback(evaluator.callback(trainer, log_evaluation, on_result))
    try:
        if trained is not None:
            load_trained_weights(trainer, trained)
        else:
            trainer.train(resume_from_checkpoint=resume)
    except RewardFailedError:
        if trainer.accelerator.is_main_process:
            on_failure()
        raise
    trainer.save_model(args.output_dir)
    if before_after:
        results["after"] = evaluator.run(trainer.model, tokenizer, label="after", trainer=trainer)
        if watch is not None:
            results |= end_watch(watch, trainer, evaluator, results, before_records)
        kinds = gains_by_kind(before_records, evaluator.last_records)  # of the adapter kept
        if kinds:
            results["kinds"] = kinds
    if evaluator is not None:
        evaluator.close()
    if results and trainer.accelerator.is_main_process:
        from .evaluation.history import write_json  # transformers: loaded when a run starts, not for --help

        results["gain"] = paired_gain_of_run(args.output_dir)
        results["settings"] = eval_settings(recipe, evaluator)
        results["seconds"] = evaluator.seconds
        write_json(Path(args.output_dir) / EVAL_FILE, results)
        logger.info(
            "held-out accuracy: before %.3f, after %.3f", results["before"]["accuracy"], results["after"]["accuracy"]
        )
    return results


def start_watch(recipe: Recipe, trainer, evaluator, history, fresh: bool):
    """The run watch as a callback of ``trainer`` (None with ``watch: false``), with the policy training starts from
    as its step-0 evaluation when the run has periodic ones: the evaluation before training, or (after a warm start)
    one of its own on the periodic problems. A resumed run's watch starts at the resumed step."""
    from .watch import RunWatch  # transformers: loaded when a run starts, not for --help

    args = recipe.training
    if not args.watch:
        return None
    watch = RunWatch(args, mark=None if history is None else history.mark, is_main=trainer.accelerator.is_main_process)
    trainer.add_callback(watch)
    if evaluator is None or args.task_eval_steps < 1 or not fresh:
        return watch
    if recipe.model.warm_starts_pretrained or not args.eval_before_after:
        label, limit = "step0", evaluator.periodic_samples
        evaluator.run(trainer.model, trainer.processing_class, label=label, trainer=trainer, max_samples=limit)
    watch.evaluated(0, watch_evaluation(0, evaluator.last_records, evaluator), trainer.model)
    return watch


def watch_evaluation(step: int, records: list[dict], evaluator):
    """The watch's view of an evaluation: the periodic problems (``task_eval_max_samples``) of ``records``."""
    from .watch import from_records  # transformers: loaded when a run starts, not for --help

    return from_records(step, records, evaluator.periodic_samples)


def end_watch(watch, trainer, evaluator, results: dict, before_records: list[dict]) -> dict:
    """The watch's last rules (after against before, every problem), the adapter the run keeps, and what
    ``eval_results.json`` records of both; the evaluation after training is the kept adapter's."""
    from .watch import from_records  # the same

    before = from_records(0, before_records)
    last_step = trainer.state.global_step
    watch.finished(before, from_records(last_step, evaluator.last_records))
    kept = watch.choose_kept(watch_evaluation(last_step, evaluator.last_records, evaluator), trainer.model)
    if kept is not None:
        trainer.save_model(trainer.args.output_dir)
        last = {"step": last_step, **results["after"]}
        results["after"] = evaluator.run(trainer.model, trainer.processing_class, label="after", trainer=trainer)
        return {"watch": watch.summary(), "kept": kept, "last": last}
    return {"watch": watch.summary()}


def eval_settings(recipe: Recipe, evaluator) -> dict:
    """How the held-out numbers were measured, recorded beside them in ``eval_results.json``.

    ``dataset`` is a hub id or preset name as the recipe gives it; a local file is recorded by its file name only, so
    nothing machine-specific reaches the Hub card.
    """
    spec, split = source_splits(recipe.data).get("eval", (recipe.data.resolved(), "train (eval_split_size)"))
    name = spec["name"]
    return {
        "task": evaluator.task,
        "dataset": Path(name).name if is_local_file(name) else name,
        "dataset_config": spec["config"],
        "split": split,
        "num_problems": len(evaluator.dataset),
        "decoding": "greedy",
        "max_new_tokens": evaluator.max_new_tokens,
        "prompt_style": recipe.data.prompt_style,
    }


def paired_gain_of_run(output_dir: str) -> dict | None:
    """The paired before/after difference with its 95% interval, from the run's per-problem records."""
    try:
        return gain_from_run(output_dir)
    except ValueError as exc:  # records that cannot be paired: the report leaves the interval out
        logger.warning("no paired before/after interval: %s", exc)
        return None
