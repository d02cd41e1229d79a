"""The phases of a run around ``trainer.train()``: the held-out evaluation before training, a pretrained policy's
warm start and its own evaluation, training with the periodic evaluation and the run watch, the saved model, the
evaluation after training, the adapter the run keeps, and ``eval_results.json`` (``reported``: before -> warm start
-> after, each step's paired gain and kinds; with a kept adapter, on the problems that did not choose it). The run
writes its phase into its manifest at each transition (``run_files.write_state``: ``trained``, ``kept``).
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..base.run_files import EVAL_FILE, WARM_START_DIR, write_state
from ..data.loaders import is_local_file, source_splits
from ..evaluation.stats import gains_by_kind, paired_gain, summarize
from ..monitoring.trackers import log_evaluation
from ..recipe import Recipe
from ..rewards.wrapper import RewardFailedError
from .finishing import load_trained_weights


logger = logging.getLogger("hf_grpo")


def train_and_evaluate(recipe: Recipe, trainer, evaluator, resume: str | None, on_failure, finishing=None,
                       history=None) -> dict:  # fmt: skip
    """Evaluate before, warm-start, train (with the periodic evaluation and the watch), save, evaluate after; returns
    ``eval_results.json``'s content (empty without the before/after evaluation), which the main process writes.
    ``on_failure`` runs on the main process when a broken reward stops training (the report then shows the run up to
    there). ``finishing``: a run that trained already (``pipeline.finished_run``: ``{"phase", "weights"}``), whose
    weights and watch state are loaded from ``weights`` instead of training. ``history``: the run's
    ``HistoryCallback``, where the watch marks its findings."""
    args, results, records = recipe.training, {}, {}
    before_after = evaluator is not None and args.eval_before_after
    again = resume is not None or finishing is not None  # the evaluations before training are in the run's records
    if before_after:  # through the trainer, as every later one: under ZeRO-3 only its unwrap gathers the shards
        records["before"] = evaluate(evaluator, trainer, "before", recorded=again)
    warm = recipe.model.warm_starts_pretrained
    if warm and not again:
        from ..training.warm_start import warm_start_policy  # torch: loaded when a run starts, not for --help

        warm_start_policy(trainer, recipe.model)
        if trainer.accelerator.is_main_process and hasattr(trainer.model, "peft_config"):  # for `hf-grpo eval`
            trainer.model.save_pretrained(Path(args.output_dir) / WARM_START_DIR)
    if recipe.model.warm_start_reference and finishing is None:
        reference_from_warm_start(trainer, resumed=resume is not None)
    if warm and before_after:  # the warm-started policy on every problem: what GRPO itself added is after - this
        records["warm_start"] = evaluate(evaluator, trainer, "warm_start", recorded=again, fresh=not again)
    start = records.get("warm_start") if warm else records.get("before")
    watch = start_watch(recipe, trainer, evaluator, history, start, resume, finishing)
    if evaluator is not None and args.task_eval_steps > 0:
        on_result = None if watch is None else lambda step, records, control: watch.evaluated(
            step, watch_evaluation(step, records, evaluator), trainer.model, control
        )  # fmt: skip
        trainer.add_callback(evaluator.callback(trainer, log_evaluation, on_result))
    if finishing is not None:
        load_trained_weights(trainer, finishing["weights"])
    else:
        train(trainer, on_failure, resume)
        mark_trained(trainer, watch)
    if not before_after:
        if evaluator is not None:
            evaluator.close()
        return results
    records["after"] = evaluate(evaluator, trainer, "after")
    if watch is not None:
        results |= end_watch(watch, trainer, evaluator, start, records, finishing)
    evaluator.close()
    results = reported(records, evaluator.periodic_samples if "kept" in results else 0) | results
    if trainer.accelerator.is_main_process:
        from ..evaluation.history import write_json  # transformers: loaded when a run starts, not for --help

        results["settings"] = eval_settings(recipe, evaluator)
        results["seconds"] = evaluator.seconds
        write_json(Path(args.output_dir) / EVAL_FILE, results)
        logger.info(
            "held-out accuracy: before %.3f, after %.3f", results["before"]["accuracy"], results["after"]["accuracy"]
        )
    return results


def evaluate(evaluator, trainer, label: str, recorded: bool = False, fresh: bool = True) -> list[dict] | None:
    """The per-problem records of the evaluation ``label`` on every held-out problem: read from the run's folder
    when ``recorded`` and they are there (a resumed run's), else measured now when ``fresh`` (None if not)."""
    if recorded and evaluator.recorded(label) is not None:
        return evaluator.last_records
    if not fresh:
        return None
    evaluator.run(trainer.model, trainer.processing_class, label=label, trainer=trainer)
    return evaluator.last_records


def reference_from_warm_start(trainer, resumed: bool) -> None:
    """The KL term's reference: the warm-started adapter, frozen (``warm_start_reference``); a resumed run reads it
    from the run's ``warm_start/``."""
    from safetensors.torch import load_file

    from ..training.warm_start import freeze_as_reference  # torch: loaded when a run starts, not for --help

    saved = Path(trainer.args.output_dir) / WARM_START_DIR / "adapter_model.safetensors"
    freeze_as_reference(trainer.model, load_file(str(saved)) if resumed else None)
    logger.info("the KL term's reference is the warm-started policy (a frozen copy of its adapter)")


def train(trainer, on_failure, resume: str | None) -> None:
    """``trainer.train()``; then one line per reward that failed on some completions while training went on."""
    try:
        trainer.train(resume_from_checkpoint=resume)
    except RewardFailedError:
        if trainer.accelerator.is_main_process:
            on_failure()
        raise
    for fn in trainer.reward_funcs:
        line = fn.summary() if hasattr(fn, "summary") else None
        if line is not None:
            logger.warning(line)


def mark_trained(trainer, watch) -> None:
    """Save the last weights, then the watch's state beside them, then the phase ``trained`` (main process)."""
    out = trainer.args.output_dir
    trainer.save_model(out)
    if trainer.accelerator.is_main_process:
        if watch is not None:
            watch.save_state(out)
        stopped = watch.stopped if watch is not None else None
        write_state(out, {"phase": "trained", "step": trainer.state.global_step, "stopped": stopped})


def start_watch(recipe: Recipe, trainer, evaluator, history, start: list[dict] | None, resume, finishing):
    """The run watch as a callback of ``trainer`` (None with ``watch: false``). A fresh run's step 0 is the policy
    training starts from (``start``: the records before training, or after a warm start; else an evaluation of its
    own on the periodic problems); a resumed or finishing run's watch is the one its checkpoint or folder saved."""
    from ..monitoring.run_watch import RunWatch  # transformers: loaded when a run starts, not for --help

    args = recipe.training
    if not args.watch:
        return None
    apart = evaluator is not None and args.task_eval_max_samples is not None
    apart = apart and args.task_eval_max_samples < len(evaluator.dataset)
    watch = RunWatch(args, mark=None if history is None else history.mark, is_main=trainer.accelerator.is_main_process,
                     judge_apart=apart)  # fmt: skip
    trainer.add_callback(watch)
    saved = (finishing or {}).get("weights") or resume
    if saved is not None:
        if not watch.load_state(saved):
            logger.warning("resume: %s holds no run watch state (an earlier hf_grpo wrote it): the watch starts "
                           "again, its first evaluation from here its step 0", saved)  # fmt: skip
        return watch
    if evaluator is None or args.task_eval_steps < 1:
        return watch
    if start is None:  # no evaluation before training: step 0 of its own, on the periodic problems
        label, limit = "step0", evaluator.periodic_samples
        evaluator.run(trainer.model, trainer.processing_class, label=label, trainer=trainer, max_samples=limit)
        start = evaluator.last_records
    watch.evaluated(0, watch_evaluation(0, start, evaluator), trainer.model)
    return watch


def watch_evaluation(step: int, records: list[dict], evaluator):
    """The watch's view of an evaluation: the periodic problems (``task_eval_max_samples``) of ``records``."""
    from ..monitoring.run_watch import from_records  # transformers: loaded when a run starts, not for --help

    return from_records(step, records, evaluator.periodic_samples)


def end_watch(watch, trainer, evaluator, start: list[dict] | None, records: dict, decided: dict | None) -> dict:
    """The watch's look after training (after against step 0, every problem) and the adapter the run keeps; an
    earlier kept adapter is saved over the last weights (phase ``kept``) and evaluated, its records ``after``.
    A finishing run that kept one (``decided``: its state) decided all that already."""
    from ..monitoring.run_watch import from_records  # transformers: loaded when a run starts, not for --help

    out = trainer.args.output_dir
    if decided is not None and "kept" in decided:
        return {"watch": watch.summary(), "kept": decided["kept"], "last": decided["last"]}
    last_step = trainer.state.global_step
    if start is not None:
        watch.finished(from_records(0, start), from_records(last_step, records["after"]))
    kept = watch.choose_kept(watch_evaluation(last_step, records["after"], evaluator))
    if kept is None:
        if trainer.accelerator.is_main_process:  # the findings of the look after training
            watch.save_state(out)
        return {"watch": watch.summary()}
    last = {"step": last_step, **summarize(records["after"])}
    watch.restore(trainer.model)
    trainer.save_model(out)
    if trainer.accelerator.is_main_process:
        watch.save_state(out)
        write_state(out, {"phase": "kept", "step": last_step, "stopped": watch.stopped, "kept": kept, "last": last})
    records["after"] = evaluate(evaluator, trainer, "after")
    return {"watch": watch.summary(), "kept": kept, "last": last}


def reported(records: dict, skip: int = 0) -> dict:
    """The summaries, paired gains and kinds ``eval_results.json`` reports, on the problems from index ``skip`` on
    (those that did not choose the kept adapter): ``before``, ``warm_start``, ``after``, ``gain`` (before -> after),
    ``gains`` (each step, with a warm start), ``kinds`` / ``kinds_by_step`` and ``problems`` when ``skip``."""
    judged = {label: [r for r in rows if r["index"] >= skip] for label, rows in records.items() if rows is not None}
    results = {label: summarize(rows) for label, rows in judged.items()}
    results["gain"] = paired(judged["before"], judged["after"])
    kinds = gains_by_kind(judged["before"], judged["after"])
    if kinds:
        results["kinds"] = kinds
    if "warm_start" in judged:
        steps = {"warm_start": ("before", "warm_start"), "grpo": ("warm_start", "after")}
        results["gains"] = {name: paired(judged[a], judged[b]) for name, (a, b) in steps.items()}
        by_step = {name: gains_by_kind(judged[a], judged[b]) for name, (a, b) in steps.items()}
        if kinds:
            results["kinds_by_step"] = by_step
    if skip:
        results["problems"] = {"chose_the_adapter": skip, "judged": len(judged["after"])}
    return results


def paired(before: list[dict], after: list[dict]) -> dict:
    """``paired_gain`` of two evaluations' records, matched by problem index."""
    grades = {r["index"]: r["grade"] for r in after}
    common = [r for r in before if r["index"] in grades]
    return paired_gain([r["grade"] for r in common], [grades[r["index"]] for r in common])


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
