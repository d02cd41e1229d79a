"""The experiment trackers of ``report_to`` (wandb, trackio, tensorboard) get the whole story of a run.

Transformers' integration callbacks log the training metrics as training goes. This module adds what they do not:
the project name, before the trainer is built (``setup_trackers``: the recipe's ``project`` > the tracker's own
environment variable > the other tracker's one > ``"huggingface"``); held-out accuracy during training as a record of
its own (``log_evaluation``); and after training (``TrackerSetup.log_story``, main process, from the run's
``RunResult``) ``eval/accuracy_before``, ``eval/accuracy_after``, ``eval/gain``, ``eval/gain_low``,
``eval/gain_high`` (the paired 95% interval), the plot as an image (``training_curves``) and the resolved recipe
(``recipe``). How each tracker is reached after its callback has finished: ``docs/trackers.md``. A tracker that
cannot take the story gets a warning that names it and the reason; the finished run goes on.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..base.run_files import PLOT_FILE
from ..publish.run_result import RunResult


logger = logging.getLogger(__name__)

DEFAULT_PROJECT = "huggingface"  # TrainingArguments.project's default and WandbCallback's
PROJECT_VARIABLES = {"trackio": ("TRACKIO_PROJECT", "WANDB_PROJECT"), "wandb": ("WANDB_PROJECT", "TRACKIO_PROJECT")}
IMAGE_KEY = "training_curves"
RECIPE_KEY = "recipe"
# What a tracker raises when it cannot store something: its own errors, a file or database it cannot write (OSError,
# sqlite3.Error), a value it cannot serialise or a run it cannot find to reopen (ValueError, TypeError), a run that is
# not open (RuntimeError: trackio's "Call trackio.init() before ...").
TRACKER_ERRORS = (OSError, sqlite3.Error, ValueError, TypeError, RuntimeError)


def project_for(tracker: str, recipe_values: dict, environ=os.environ) -> str:
    """The project ``tracker`` logs to: the recipe's ``project``, else its variable, else the other's, else default."""
    if recipe_values.get("project"):
        return str(recipe_values["project"])
    for variable in PROJECT_VARIABLES[tracker]:
        if environ.get(variable):
            return environ[variable]
    return DEFAULT_PROJECT


@dataclass
class TrackerSetup:
    """What ``setup_trackers`` decided; ``log_story`` sends the story of the finished run."""

    output_dir: Path
    wandb_run_before: str | None = None  # id of a wandb run open before training: the user's, left open

    def log_story(self, trainer, run: RunResult) -> None:
        """Log the before/after result, the plot and the recipe of ``run`` to every active tracker (main process
        only)."""
        loggers = {"WandbCallback": _story_to_wandb, "TrackioCallback": _story_to_trackio}
        loggers["TensorBoardCallback"] = _story_to_tensorboard
        callbacks = [cb for cb in trainer.callback_handler.callbacks if type(cb).__name__ in loggers]
        if not callbacks:
            return
        story = story_of(run, trainer.state.global_step)
        for callback in callbacks:
            name = type(callback).__name__
            try:
                loggers[name](callback, story, trainer.args, self)
            except TRACKER_ERRORS + _wandb_errors(callback) as exc:
                logger.warning("%s could not log the run's results: %s: %s", name, type(exc).__name__, exc)


def setup_trackers(recipe) -> TrackerSetup:
    """Apply the project name (and a run name for trackio) before the trainer is built; see the module docstring."""
    args = recipe.training
    args.project = project_for("trackio", recipe.values)
    wandb_project = project_for("wandb", recipe.values)
    if wandb_project != DEFAULT_PROJECT:
        os.environ["WANDB_PROJECT"] = wandb_project
    report_to = args.report_to or []
    if "trackio" in report_to and not args.run_name:
        args.run_name = f"{Path(args.output_dir).name}-{time.strftime('%Y%m%d-%H%M%S')}"
    wandb = sys.modules.get("wandb")  # imported only if something used it already
    run = getattr(wandb, "run", None)
    return TrackerSetup(Path(args.output_dir), wandb_run_before=run.id if run is not None else None)


def log_evaluation(trainer, metrics: dict[str, float]) -> None:
    """Send ``metrics`` (``{"accuracy": 0.4}``) as one log record of the current step to the trainer's callbacks:
    ``eval_<name>`` to the integration callbacks (``report_to``: Transformers' spelling of an evaluation metric, which
    wandb / trackio / tensorboard write as ``eval/<name>``), ``eval/<name>`` to the others (``HistoryCallback``).
    Logged through the trainer's metrics instead, it would reach the trackers as ``train/eval/<name>``."""
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    integrations = tuple(INTEGRATION_TO_CALLBACK.values())
    handler, state = trainer.callback_handler, trainer.state
    plain = {f"eval/{k}": v for k, v in metrics.items()}
    state.log_history.append({**plain, "step": state.global_step})
    control = trainer.control  # the object the handler passes around; callbacks change it in place
    for callback in handler.callbacks:
        logs = {f"eval_{k}": v for k, v in metrics.items()} if isinstance(callback, integrations) else dict(plain)
        result = callback.on_log(
            trainer.args,
            state,
            control,
            logs=logs,
            model=handler.model,
            processing_class=handler.processing_class,
            optimizer=handler.optimizer,
            lr_scheduler=handler.lr_scheduler,
            train_dataloader=handler.train_dataloader,
            eval_dataloader=handler.eval_dataloader,
        )
        if result is not None:
            control = result


# --------------------------------------------------------------------------------------------------------------------
# The story


@dataclass
class Story:
    scalars: dict[str, float]  # eval/accuracy_before, eval/accuracy_after, eval/gain, eval/gain_low, eval/gain_high
    plot: Path | None  # training_curves.png
    recipe: dict  # the recipe's values
    recipe_text: str  # recipe.yaml as written
    step: int  # the last optimizer step

    def logged(self, image) -> dict:
        """What a wandb or trackio ``log`` call takes: the scalars, the plot as ``image`` (the tracker's Image class)
        and the step."""
        plot = {IMAGE_KEY: image(str(self.plot))} if self.plot is not None else {}
        return {**self.scalars, **plot, "train/global_step": self.step}


def story_of(run: RunResult, step: int) -> Story:
    """The story of ``run``, the result of the run that ended at optimizer step ``step``."""
    scalars = {}
    if run.has_eval:
        before, after = run.evaluations["before"]["accuracy"], run.evaluations["after"]["accuracy"]
        scalars = {"eval/accuracy_before": before, "eval/accuracy_after": after, "eval/gain": after - before}
        if run.gain:
            low, high = run.gain["ci95"]
            scalars.update({"eval/gain": run.gain["gain"], "eval/gain_low": low, "eval/gain_high": high})
    plot = run.output_dir / PLOT_FILE
    return Story(scalars, plot if plot.is_file() else None, run.values, run.recipe_text or "", step)


def _wandb_errors(callback) -> tuple[type[BaseException], ...]:
    wandb = getattr(callback, "_wandb", None)
    return (wandb.Error,) if wandb is not None else ()


def _story_to_wandb(callback, story: Story, args, setup: TrackerSetup) -> None:
    wandb = callback._wandb
    if wandb is None or wandb.run is None:
        raise RuntimeError("no wandb run is open")
    run = wandb.run
    run.config.update({RECIPE_KEY: story.recipe}, allow_val_change=True)
    run.log(story.logged(wandb.Image))
    if run.id != setup.wandb_run_before:
        run.finish()


def _story_to_trackio(callback, story: Story, args, setup: TrackerSetup) -> None:
    trackio = callback._trackio
    if not args.run_name:
        raise RuntimeError("the run has no run_name to reopen it by")
    config = {k: v for k, v in dict(trackio.config).items() if not k.startswith("_")}  # the finished run's config
    trackio.init(
        project=args.project,
        name=args.run_name,
        space_id=args.trackio_space_id,
        bucket_id=args.trackio_bucket_id,
        private=args.hub_private_repo,
        resume="must",
        config={**config, RECIPE_KEY: story.recipe},
        embed=False,
    )
    try:
        trackio.log(story.logged(trackio.Image))
    finally:
        trackio.finish()


def _story_to_tensorboard(callback, story: Story, args, setup: TrackerSetup) -> None:
    if callback.logging_dir is None:
        raise RuntimeError("no tensorboard logging directory (training never started)")
    writer = callback._SummaryWriter(log_dir=callback.logging_dir)
    try:
        for key, value in story.scalars.items():
            writer.add_scalar(key, value, story.step)
        if story.plot is not None:
            writer.add_image(IMAGE_KEY, _read_png(story.plot), story.step, dataformats="HWC")
        if story.recipe_text:
            text = "\n".join("    " + line for line in story.recipe_text.splitlines())  # Markdown code block
            writer.add_text(RECIPE_KEY, text, story.step)
    finally:
        writer.close()


def _read_png(path: Path):
    """RGB pixels (height, width, 3) of a PNG file, as ``add_image`` takes them."""
    import numpy as np
    from PIL import Image

    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))
