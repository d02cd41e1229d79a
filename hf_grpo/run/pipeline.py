"""One training run in this process: policy, data, rewards, trainer, evaluations, then the run's outputs.

``hf_grpo.train`` (the command line and ``train()``) loads and checks the recipe, then calls ``run``; under
``accelerate launch`` every process runs it. ``run`` reads as its steps: save the recipe, build the trainer, train
and evaluate, then hand the run's result (``hf_grpo.publish.run_result.RunResult``, built from memory) to the report, the
trackers and the model card, and push when the recipe asks.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

import yaml

from ..base.progress import enabled_for
from ..base.run_files import (
    RECIPE_FILE,
    RECIPE_HEADER,
    RECIPE_HEADER_END,
    VERSIONS_FILE,
    RunFileError,
    RunFolderError,
    claim,
    run_state,
    write_state,
)
from ..base.run_lock import RunLockError, acquire, check_free, release
from ..data import load_grpo_datasets
from ..data.lengths import fit_prompts, prompt_budget
from ..data.loaders import eval_grader, is_conversation
from ..launch.launcher import SERVER_STARTED_ENV, apply_thread_policy
from ..miniature import activate
from ..monitoring.trackers import TrackerSetup, setup_trackers
from ..publish.card import write_local_card
from ..publish.hub import push as push_to_hub
from ..publish.report import write_report
from ..publish.run_result import RunResult, library_versions
from ..recipe import Recipe, RecipeError
from ..recipe.memory import measured_line, plan_lines
from ..recipe.plan import check_rows
from ..recipe.schema import key_defaults
from ..recipe.yaml12 import load_yaml
from ..rewards import load_reward_funcs
from ..training.checkpoints import (
    CheckpointError,
    recipe_changes,
    resolve_resume,
    sampling_changes,
    saved_recipe_path,
)
from .finishing import REPORT_FILES, finished, lacking
from .phases import train_and_evaluate


logger = logging.getLogger("hf_grpo")


def load_policy(recipe: Recipe, chat_prompts: bool = False):
    """(model, tokenizer): the embedded tiny model (built, warm-started, saved) or a pretrained one. ``chat_prompts``:
    the prompts are chat messages, which a tokenizer without a chat template cannot render (checked first)."""
    from accelerate import PartialState
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import get_quantization_config

    model_args, args = recipe.model, recipe.training
    if model_args.model_name_or_path == "tiny":
        from ..models.tiny import build_model, build_tokenizer  # torch: loaded when a run starts, not --help
        from ..training.warm_start import warm_start  # the same

        tokenizer = build_tokenizer(seed=args.seed)
        model = build_model(tokenizer, seed=args.seed, hidden_size=model_args.tiny_hidden_size)
        steps, lr = model_args.warm_start_steps, model_args.resolved_warm_start_lr
        warm_start(model, tokenizer, steps, lr=lr, seed=args.seed, progress=enabled_for(args))
        base_dir = Path(args.output_dir) / "base_model"
        if args.process_index == 0:
            model.save_pretrained(base_dir)  # safetensors; the adapter is saved relative to these weights
            tokenizer.save_pretrained(base_dir)
        model.config._name_or_path = model.name_or_path = str(base_dir.resolve())  # PEFT records it in the adapter
        return model, tokenizer

    tokenizer = AutoTokenizer.from_pretrained(  # first: what it cannot do is found before the model loads
        model_args.model_name_or_path,
        revision=model_args.model_revision,
        padding_side="left",
        trust_remote_code=args.trust_remote_code,
    )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if chat_prompts and tokenizer.chat_template is None:
        raise RecipeError(
            f"{recipe.path}: the tokenizer of {model_args.model_name_or_path} has no chat template and the prompts "
            "are chat messages (a conversational dataset, or prompt_style: chat): use plain-text prompts "
            "(prompt_style: text, or a text prompt_column), or a model whose tokenizer has a chat template"
        )
    quantization = get_quantization_config(model_args)
    model = AutoModelForCausalLM.from_pretrained(
        model_args.model_name_or_path,
        revision=model_args.model_revision,
        dtype=model_args.dtype or "auto",
        attn_implementation=model_args.attn_implementation,
        trust_remote_code=args.trust_remote_code,
        quantization_config=quantization,
        device_map={"": PartialState().local_process_index} if quantization is not None else None,
    )
    return model, tokenizer


def save_recipe(recipe: Recipe) -> str | None:
    """Copy the resolved recipe (its explicit values and overrides) into ``output_dir`` for provenance and the Hub,
    with the library versions beside it; returns the text written (None on the other processes)."""
    from ..evaluation.history import write_json  # transformers: loaded when a run starts, not for --help

    if recipe.training.process_index != 0:
        return None
    out = Path(recipe.training.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    header = f"{RECIPE_HEADER}{recipe.path}{RECIPE_HEADER_END}\n"
    text = header + yaml.safe_dump(recipe.values, sort_keys=False)
    (out / RECIPE_FILE).write_text(text)
    write_json(out / VERSIONS_FILE, library_versions())
    return text


def resume_target(recipe, num_processes: int, lock: bool = True) -> str | None:
    """What to pass to ``Trainer.train(resume_from_checkpoint=...)``: the newest complete checkpoint for ``auto``/``true``.

    ``recipe`` is a Recipe (or only its training arguments, which skips the recipe comparison). Raises RecipeError,
    before anything loads, when another live run holds ``output_dir`` (``lock``: the launcher's check, before it
    starts anything; ``run`` takes the lock itself), for a checkpoint path that is incomplete, damaged or written by
    another number of processes (``checkpoints.py``), and for a checkpoint trained with another value of a key that
    fixes its shapes (``checkpoints.FIXED_KEYS``); other changed keys are a warning, and so is a sampling feature
    (dynamic sampling, prompt selection, overlap) turned on or off since the checkpoint (it starts fresh, or its
    saved state is dropped) and a generation batch saved mid-cycle by another number of processes (generated anew).
    """
    args = getattr(recipe, "training", recipe)
    try:
        if lock:
            check_free(args.output_dir)
        resume = resolve_resume(args.resume_from_checkpoint, args.output_dir, num_processes)
    except (CheckpointError, RunLockError) as exc:
        raise RecipeError(str(exc)) from None
    if resume is not None and isinstance(recipe, Recipe):
        check_recipe_unchanged(recipe, resume)
        features = {"overlap": recipe.generation.overlap}
        features |= {key: getattr(args, key) for key in ("dynamic_sampling", "prompt_selection")}
        for change in sampling_changes(resume, features, num_processes):
            logger.warning("resume: %s", change)
    return resume


def claim_output_dir(recipe: Recipe) -> None:
    """``output_dir`` made a run folder of hf_grpo (``run_files.claim``) before anything is written there; a folder
    that is no run of ours is a RecipeError naming it."""
    try:
        claim(recipe.training.output_dir)
    except (RunFolderError, RunFileError) as exc:
        raise RecipeError(str(exc)) from None


def check_recipe_unchanged(recipe: Recipe, checkpoint: str) -> None:
    """RecipeError naming the keys (saved -> current) when ``checkpoint`` was trained with other values of the keys
    that fix its shapes; a warning for the other changed keys."""
    path = saved_recipe_path(checkpoint)
    if path is None:
        logger.warning(
            "resume: %s has no %s beside it: the recipe it was trained with is not compared", checkpoint, RECIPE_FILE
        )
        return
    try:
        saved = load_yaml(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        logger.warning("resume: %s cannot be read (%s): the recipes are not compared", path, exc)
        return
    fixed, other = recipe_changes(saved if isinstance(saved, dict) else {}, recipe.values, key_defaults())

    def listed(changes: dict) -> str:
        return ", ".join(f"{key} {old!r} -> {new!r}" for key, (old, new) in changes.items())

    if fixed:
        raise RecipeError(
            f"resume_from_checkpoint: {checkpoint} was trained with another {', '.join(fixed)} ({listed(fixed)}, "
            f"from {path}): it cannot be resumed with these values; resume with the saved ones, or start a new run "
            "in another output_dir"
        )
    if other:
        logger.warning(
            "resume: these keys differ from %s and take effect from %s: %s", path, checkpoint, listed(other)
        )


def run(recipe: Recipe) -> dict:
    """Train the recipe; returns the before/after evaluation (empty when disabled, or when the run is finished).

    The main process holds ``output_dir``'s lock (``run_lock``) from before anything is written there to the end.
    """
    activate(recipe.miniature)  # a miniature's stand-ins, before TRL's generation modules look for vllm once
    logger.info("torch uses %d CPU thread(s) per process (OMP_NUM_THREADS)", apply_thread_policy())
    lock, problem, args = None, None, recipe.training
    if args.local_process_index == 0:  # each node's first process: its output_dir, shared with the others or not
        try:
            claim(args.output_dir)  # the run's manifest: the first file hf_grpo writes there
            lock = acquire(args.output_dir) if args.process_index == 0 else None
        except (
            RunFolderError,
            RunFileError,
            RunLockError,
        ) as exc:  # raised by every process at once (agree_on_resume)
            problem = str(exc)
    try:
        return _run(recipe, problem)
    finally:
        release(lock)


def _run(recipe: Recipe, problem: str | None) -> dict:
    """``run``'s steps, with the lock held (``problem``: why process 0 could not take it)."""
    args = recipe.training
    resume = None
    if problem is None:
        try:
            resume = resume_target(recipe, int(os.environ.get("WORLD_SIZE", "1")), lock=False)
        except RecipeError as exc:  # raised below on every process at once, not here on one while the others wait
            problem = str(exc)
    resume = agree_on_resume(resume, problem)  # before anything loads
    finishing = finished_run(recipe, resume)  # trained already: the resume writes only what the run lacks
    if finishing is not None and finishing["phase"] == "complete":
        return {}
    if finishing is None and args.process_index == 0:
        write_state(args.output_dir, {"phase": "training"})
    if args.process_index == 0:
        logger.info("\n".join(plan_lines(recipe, for_run=True)))
    push = args.push_to_hub  # pushed at the end by hf_grpo.publish.hub (card with the eval table), not by the Trainer
    args.push_to_hub = False
    recipe_text = save_recipe(recipe)
    trackers = setup_trackers(recipe)  # the project (recipe > environment > default), before the trainer is built
    trainer, evaluator, history = build_trainer(recipe)
    if finishing is not None:  # no train(): the history is the file's
        from ..evaluation.history import read_history  # transformers: loaded when a run starts, not for --help

        history.records = read_history(args.output_dir)

    def result_of(evaluations: dict | None) -> RunResult:  # what this process holds, as one result
        values, records = recipe.values, history.records
        return RunResult.from_training(
            args.output_dir, values=values, recipe_text=recipe_text, history=records, evaluations=evaluations
        )

    on_failure = lambda: write_report(result_of(None))  # noqa: E731
    results = train_and_evaluate(recipe, trainer, evaluator, resume, on_failure, finishing, history)
    if trainer.accelerator.is_main_process:
        result = result_of(results)
        write_outputs(result, trainer, trackers)
        write_state(args.output_dir, {**(run_state(args.output_dir) or {}), "phase": "finished"})
        if push:
            private = args.hub_private_repo is not False
            pushed = push_to_hub(
                args.output_dir, args.hub_model_id, private=private, revision=args.hub_revision, run=result
            )
            logger.info("pushed to %s", pushed.repo_url)
    if args.process_index == 0 and (line := measured_line(recipe)) is not None:
        logger.info(line)
    trainer.accelerator.wait_for_everyone()
    return results


def finished_run(recipe: Recipe, resume: str | None) -> dict | None:
    """Whether the run asked to resume trained already (``hf_grpo.run.finishing.finished``): None for a run to train;
    ``{"phase": "complete"}`` when it lacks nothing (a report it lacks is rebuilt from its files here); else its
    state and ``weights``, the folder its trained weights and watch state load from, to write what it lacks."""
    args = recipe.training
    asked = args.resume_from_checkpoint not in (None, False, "", "false", "False", "none")
    found = finished(args.output_dir, resume, args.max_steps) if asked else None
    if found is None:
        return None
    state, where = found
    missing = lacking(args.output_dir, args.eval_before_after)
    if missing and all(name in REPORT_FILES for name in missing) and state["phase"] != "checkpoint":
        if args.process_index == 0:  # its evaluation is written: the report and card come from the files
            run = RunResult.load(args.output_dir)
            write_report(run)
            write_local_card(run)
            write_state(args.output_dir, {**run_state(args.output_dir), "phase": "finished"})
            logger.info("the run in %s lacked %s: written from its files", args.output_dir, ", ".join(missing))
        missing = []
    if not missing:
        on = ("to train past the stop, start a new run in another output_dir with resume_from_checkpoint set to a "
              "checkpoint of this one" if state.get("stopped") else "raise max_steps to train on")  # fmt: skip
        logger.info("the run in %s is finished: %s; nothing to train (%s)", args.output_dir, where, on)
        return {"phase": "complete"}
    logger.info(
        "the run in %s finished training (%s) but lacks %s: writing them now, without training",
        args.output_dir, where, ", ".join(missing),
    )  # fmt: skip
    zero3 = recipe.layout.zero_stage == 3 or recipe.layout.distributed_type == "FSDP"
    if zero3:  # their weights load sharded: set_peft_model_state_dict cannot fill them outside training
        raise RecipeError(
            f"the run in {args.output_dir} finished training but lacks {', '.join(missing)}, which hf_grpo writes "
            f"only without ZeRO-3 or FSDP: evaluate it with `hf-grpo eval {args.output_dir}`, then `hf-grpo report "
            f"{args.output_dir}` writes its summary, plot and card"
        )
    return state


def agree_on_resume(resume: str | None, problem: str | None) -> str | None:
    """Every process resumes from the same step, or every process stops with the same one-line RecipeError.

    Each process finds its checkpoint on its own disk; nodes without a shared ``output_dir`` find different ones
    (node 1 none at all), and a run whose ranks resumed from different steps would pair the wrong collectives. So
    the processes compare what they found (one small gather, before anything loads) and refuse unless they agree.
    """
    from accelerate import PartialState  # accelerate: loaded when a run starts, not for --help
    from accelerate.utils import gather_object

    state = PartialState()
    if state.num_processes == 1:
        if problem is not None:
            raise RecipeError(problem)
        return resume
    name = Path(resume).name if resume is not None else None  # checkpoint-N
    found = gather_object([(state.process_index, socket.gethostname(), name, problem)])
    problems = [(rank, host, text) for rank, host, _, text in found if text is not None]
    several_nodes = state.num_processes > int(os.environ.get("LOCAL_WORLD_SIZE", state.num_processes))
    shared = "; every node reads its own output_dir: put it on a filesystem they all share" if several_nodes else ""
    if problems:
        rank, host, text = problems[0]
        raise RecipeError(f"process {rank} (on {host}): {text}{shared}")
    if len({s for _, _, s, _ in found}) > 1:
        seen = "; ".join(f"process {r} on {h}: {n if n is not None else 'none'}" for r, h, n, _ in found)
        raise RecipeError(
            f"the processes found different checkpoints to resume from ({seen}): put output_dir on a filesystem "
            "every node shares (or copy the checkpoint folder to every node's output_dir), then resume again"
        )
    return resume


def build_trainer(recipe: Recipe):
    """(trainer, evaluator or None, history): data, policy, the held-out evaluator, the generator and the GRPO
    trainer; ``history`` (a ``HistoryCallback``) writes ``training_history.json`` and keeps its records in memory."""
    from trl import get_peft_config

    from ..evaluation.history import HistoryCallback  # transformers: loaded when a run starts, not for --help
    from ..evaluation.tasks import TaskEvaluator  # the same
    from ..monitoring.console import install as install_console  # the same
    from ..training.trainer import GRPOTrainer  # the same

    args = recipe.training
    try:  # before the model: a missing column or split is a recipe error, found in seconds rather than after loading
        train_dataset, eval_dataset = load_grpo_datasets(recipe.data, seed=args.seed)
    except (ValueError, FileNotFoundError) as exc:
        raise RecipeError(f"{recipe.path}: data: {exc}") from None
    data = f"the training data ({recipe.data.dataset_name})"
    check_rows(recipe.plan, len(train_dataset), f"{data} has {len(train_dataset)} usable row(s)")
    model, tokenizer = load_policy(
        recipe, chat_prompts=len(train_dataset) > 0 and is_conversation(train_dataset[0]["prompt"])
    )
    train_dataset, eval_dataset = fit_to_context(recipe, model, tokenizer, train_dataset, eval_dataset)
    evaluator = None
    if eval_dataset is None and (args.task_eval_steps > 0 or args.eval_before_after):
        logger.warning("%s has no held-out split: no held-out evaluation %s (set eval_dataset_name or eval_split_size "
                       "to have them)", data, "before, during or after training" if args.task_eval_steps > 0 else
                       "before and after training")  # fmt: skip
    if eval_dataset is not None:  # grades in worker processes, each completion bounded by the reward timeout
        grader = eval_grader(recipe.data)
        evaluator = TaskEvaluator(eval_dataset, grader, args, grade_timeout=recipe.rewards.reward_timeout)
    history = HistoryCallback(args.output_dir)
    trainer = GRPOTrainer(
        generator=_server_generator(recipe),
        model=model,
        reward_funcs=load_reward_funcs(recipe.rewards),
        args=args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset if args.eval_strategy != "no" else None,
        processing_class=tokenizer,
        peft_config=get_peft_config(recipe.model),
        callbacks=[history],
    )
    install_console(trainer)  # one line per logged step instead of transformers' dictionary (console_metrics)
    trainer.reward_health.max_unscored_calls = recipe.rewards.reward_max_failed_calls
    state = trainer.accelerator.state
    logger.info(
        "training on %d process(es), %s, device %s", state.num_processes, state.distributed_type.value, state.device
    )
    return trainer, evaluator, history


def fit_to_context(recipe: Recipe, model, tokenizer, train_dataset, eval_dataset):
    """The datasets with every prompt short enough to leave ``max_completion_length`` tokens in the context
    (``generation.max_model_len``, else the model's ``max_position_embeddings``): ``data.long_prompts`` says whether
    a longer one is dropped or cut, and how many were is logged."""
    context = recipe.generation.max_model_len or getattr(model.config, "max_position_embeddings", None)
    try:
        budget = prompt_budget(context, recipe.training.max_completion_length)
    except ValueError as exc:
        raise RecipeError(f"{recipe.path}: {exc}") from None
    if budget is None:
        return train_dataset, eval_dataset
    mode, progress = recipe.data.long_prompts, enabled_for(recipe.training)
    kwargs = recipe.training.chat_template_kwargs  # as TRL renders chat prompts
    try:  # every prompt too long (a ValueError naming the budget and the fixes): one line, exit 2
        train_dataset = fit_prompts(train_dataset, tokenizer, budget, mode, "training data", progress, kwargs)[0]
        if eval_dataset is not None:
            eval_dataset = fit_prompts(eval_dataset, tokenizer, budget, mode, "held-out data", progress, kwargs)[0]
    except ValueError as exc:
        raise RecipeError(f"{recipe.path}: data: {exc}") from None
    left = f"{len(train_dataset)} row(s) left once the prompts too long for the context were dropped"
    check_rows(recipe.plan, len(train_dataset), f"the training data ({recipe.data.dataset_name}) has {left}")
    return train_dataset, eval_dataset


def _server_generator(recipe: Recipe):
    """The generator that syncs LoRA adapters to a vLLM server (``vllm_server`` with ``lora`` sync), else None."""
    args, gen = recipe.training, recipe.generation
    if gen.backend != "vllm_server" or gen.sync_mode(recipe.model.use_peft) != "lora":
        return None
    from ..generation.server_generator import ServerGenerator  # peft, safetensors: only for a server-mode run

    return ServerGenerator(
        gen.url,
        Path(args.output_dir) / "vllm_adapters",
        gen.request_timeout,
        gen.max_retries,
        gen.server_timeout,
        args.seed if gen.seed is None else gen.seed,  # reproducible sampling; layout.py documents this default
        # the server command our launcher starts sets processed_logprobs; a server the user started is checked
        check_logprobs=gen.base_url is not None and os.environ.get(SERVER_STARTED_ENV) != "1",
        restart_wait=gen.restart_wait,
        max_staleness=gen.max_staleness if gen.overlap else None,
    )


def write_outputs(run: RunResult, trainer, trackers: TrackerSetup) -> None:
    """The report, the trackers' story and the model card, all from ``run`` (main process)."""
    write_report(run)
    trackers.log_story(trainer, run)  # before/after, gain, plot and recipe to wandb / trackio / tensorboard
    write_local_card(run)  # our model card replaces the blank README.md PEFT's save_pretrained leaves
    logger.info("outputs in %s", run.output_dir)
