"""The experiment trackers of ``report_to`` (wandb, trackio, tensorboard) get the whole story of a run.

Transformers' integration callbacks log the training metrics as training goes. This module adds what they do not:

- the project name, before the trainer is built (``setup_trackers``). Precedence, for each tracker: the recipe's
  ``project`` key (set in the recipe file or as ``--project``) > the tracker's own environment variable > the other
  tracker's one > Transformers' default ``"huggingface"``. Trackio reads ``TrainingArguments.project`` only (not
  ``TRACKIO_PROJECT``), so the chosen name is written there; wandb reads ``WANDB_PROJECT`` only (not ``project``), so
  it is written to that variable of this process when the recipe sets ``project`` or only ``TRACKIO_PROJECT`` is set.
  A run with trackio and no ``run_name`` gets one (``<output_dir name>-<time>``): the story reopens the run by name.
- held-out accuracy during training (``log_evaluation``, called by the periodic task evaluation): a record of its
  own at its step, which the integration callbacks get as ``eval_accuracy`` (Transformers' spelling of an
  evaluation metric, which wandb / trackio / tensorboard write as ``eval/accuracy``) and every other callback, among
  them the one writing ``training_history.json``, as ``eval/accuracy``. Logged through the trainer's metrics, it
  would reach the trackers as ``train/eval/accuracy``.
- after training (``TrackerSetup.log_story``, main process, once ``eval_results.json``, ``training_curves.png`` and
  ``recipe.yaml`` are written): ``eval/accuracy_before``, ``eval/accuracy_after``, ``eval/gain``, ``eval/gain_low``,
  ``eval/gain_high`` (the paired 95% interval), the plot as an image (``training_curves``) and the resolved recipe
  (``recipe``), tracker by tracker:

  * wandb: ``WandbCallback`` leaves its run open after training (wandb's exit hook finishes it at interpreter exit),
    so the story goes into that run: ``wandb.log`` (the values, which also become the run's summary, and a
    ``wandb.Image``) and ``config.update({"recipe": ...})``. The run is then finished (``wandb.finish()``), so a
    notebook's next ``train()`` starts a new one; a run that was open before training (the user's own) is left open.
  * trackio: ``TrackioCallback`` finishes its run in ``on_train_end``, before the after-training evaluation, so the
    run is reopened (``trackio.init(..., resume="must")`` with the project, name and Space of the callback), given
    the values and a ``trackio.Image`` with ``trackio.log``, and finished again. A reopened run's stored config is
    replaced by the one it is opened with, so it is opened with the config the callback stored plus ``recipe``.
  * tensorboard: ``TensorBoardCallback`` closes its writer in ``on_train_end``; a new ``SummaryWriter`` on the same
    directory writes the scalars at the last step, the image (``add_image``) and the recipe as YAML text
    (``add_text``) into a second event file, which TensorBoard reads with the first, and is closed.

A tracker that cannot take the story gets a warning that names it and the reason; the finished run goes on.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .outputs import EVAL_FILE, PLOT_FILE, RECIPE_FILE


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

    def log_story(self, trainer) -> None:
        """Log the before/after result, the plot and the recipe to every active tracker (main process only)."""
        loggers = {"WandbCallback": _story_to_wandb, "TrackioCallback": _story_to_trackio}
        loggers["TensorBoardCallback"] = _story_to_tensorboard
        callbacks = [cb for cb in trainer.callback_handler.callbacks if type(cb).__name__ in loggers]
        if not callbacks:
            return
        story = read_story(self.output_dir, trainer.state.global_step)
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
    ``eval_<name>`` to the integration callbacks (``report_to``), ``eval/<name>`` to the others."""
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
    recipe: dict  # recipe.yaml, parsed
    recipe_text: str  # recipe.yaml as written
    step: int  # the last optimizer step


def read_story(output_dir: Path, step: int) -> Story:
    """The story of the run in ``output_dir``, from the files ``hf_grpo.train`` wrote there."""
    import json

    import yaml

    scalars = {}
    results_path = output_dir / EVAL_FILE
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    if "before" in results and "after" in results:
        before, after = results["before"]["accuracy"], results["after"]["accuracy"]
        scalars = {"eval/accuracy_before": before, "eval/accuracy_after": after, "eval/gain": after - before}
        gain = results.get("gain")
        if gain:
            low, high = gain["ci95"]
            scalars.update({"eval/gain": gain["gain"], "eval/gain_low": low, "eval/gain_high": high})
    recipe_path = output_dir / RECIPE_FILE
    recipe_text = recipe_path.read_text() if recipe_path.is_file() else ""
    plot = output_dir / PLOT_FILE
    return Story(scalars, plot if plot.is_file() else None, yaml.safe_load(recipe_text) or {}, recipe_text, step)


def _wandb_errors(callback) -> tuple[type[BaseException], ...]:
    wandb = getattr(callback, "_wandb", None)
    return (wandb.Error,) if wandb is not None else ()


def _story_to_wandb(callback, story: Story, args, setup: TrackerSetup) -> None:
    wandb = callback._wandb
    if wandb is None or wandb.run is None:
        raise RuntimeError("no wandb run is open")
    run = wandb.run
    run.config.update({RECIPE_KEY: story.recipe}, allow_val_change=True)
    values = dict(story.scalars)
    if story.plot is not None:
        values[IMAGE_KEY] = wandb.Image(str(story.plot))
    run.log({**values, "train/global_step": story.step})
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
        values = dict(story.scalars)
        if story.plot is not None:
            values[IMAGE_KEY] = trackio.Image(str(story.plot))
        trackio.log({**values, "train/global_step": story.step})
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
