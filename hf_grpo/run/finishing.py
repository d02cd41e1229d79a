"""A run that trained already is never trained again: its resume (or ``hf-grpo report``, through
``finishing_command``) loads the weights and the watch's state from ``output_dir`` by the phase in its manifest
(``finished``), or, with no phase (killed before ``train()`` returned, an earlier version's run), from a checkpoint at
``max_steps``, and writes only what it lacks (``lacking``): what the run decided (a stop, the findings, the kept
adapter) stays. docs/running.md, "Stopping a run".
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..base.run_files import EVAL_FILE, PLOT_FILE, RECIPE_FILE, SUMMARY_FILE, RunFileError, read_checked, run_state
from ..publish.card import CARD_FILE
from ..publish.run_result import ADAPTER_FILES, RunResult, run_kind
from ..training.checkpoints import finished_step, newest_complete


REPORT_FILES = (SUMMARY_FILE, PLOT_FILE, CARD_FILE)  # rebuilt from the run's files, without the model


def lacking(output_dir: str | Path, expects_eval: bool) -> list[str]:
    """What a finished run in ``output_dir`` lacks of its outputs, by file name (the after-evaluation as
    ``eval_results.json``); empty when it has them all. A README.md of anyone's counts as there."""
    out = Path(output_dir)
    missing = [name for name in REPORT_FILES if not (out / name).is_file()]
    try:
        results = read_checked(out / EVAL_FILE, dict, missing_ok=True) or {}
    except RunFileError:  # damaged: written again
        results = {}
    if expects_eval and "after" not in results:
        missing.insert(0, f"{EVAL_FILE} (the after-evaluation)")
    return missing


def finished(output_dir: str | Path, resume: str | None, max_steps: int) -> tuple[dict, str] | None:
    """(state with ``weights``, where it stands in words) for a run in ``output_dir`` that trained already, or None
    for one to train. Trained: its phase says so, at ``max_steps`` or stopped by the watch (a run whose ``max_steps``
    was raised since trains on from its checkpoint, when it has one); or, with no phase, the checkpoint ``resume``
    is at ``max_steps``."""
    state = run_state(output_dir)
    if state is not None and state["phase"] != "training":
        stopped, step = state.get("stopped"), state.get("step", 0)
        raised = not stopped and step < max_steps and resume is not None
        if not raised:
            where = (f"the run watch stopped it at step {step} ({stopped['reason']})" if stopped
                     else f"it trained to step {step}")  # fmt: skip
            return {**state, "weights": str(output_dir)}, where
    step = finished_step(resume, max_steps) if resume is not None else None
    if step is None:
        return None
    return {"phase": "checkpoint", "weights": resume}, f"{resume} is at step {step} of max_steps {max_steps}"


def load_trained_weights(trainer, output_dir: str | Path) -> None:
    """The trained weights saved in ``output_dir`` (the adapter, or a full fine-tune's model) into ``trainer.model``."""
    from peft import set_peft_model_state_dict  # torch: loaded when a run starts, not for --help
    from safetensors.torch import load_file

    out = Path(output_dir)
    if run_kind(out) == "adapter":
        result = set_peft_model_state_dict(trainer.model, load_file(out / ADAPTER_FILES[1]))
        if result.unexpected_keys:
            raise ValueError(f"{out / ADAPTER_FILES[1]} does not fit the run's adapter: {result.unexpected_keys[:3]}")
    else:
        trainer._load_from_checkpoint(str(out))  # transformers': model.safetensors or its shards


def finishing_command(run: RunResult) -> list[str] | None:
    """The command that finishes ``run`` (``hf-grpo report``'s way): when it trained and lacks its after-evaluation,
    its resume from its own ``recipe.yaml``, which evaluates and writes what it lacks; else None."""
    out = run.output_dir
    if not run.value("eval_before_after", True) or "after" in (run.evaluations or {}):
        return None
    checkpoint, _ = newest_complete(out, None)
    if finished(out, str(checkpoint) if checkpoint else None, run.value("max_steps", -1)) is None:
        return None
    if not (out / RECIPE_FILE).is_file():
        return None
    recipe, resume = str(out / RECIPE_FILE), ["--resume_from_checkpoint", "auto"]
    return [sys.executable, "-m", "hf_grpo.train", recipe, "--output_dir", str(out), *resume]
