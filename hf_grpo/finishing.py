"""A run that stopped after its last training step (a Ctrl-C or a kill during the evaluation after training) is
finished by its resume: it writes what the run lacks, its after-evaluation, ``eval_results.json``, the plot,
``summary.md`` and the model card, without training again.

``hf_grpo.pipeline`` asks ``lacking`` when the checkpoint a resume found is at ``max_steps`` (TRL then trains no
step), or when a run that saved no checkpoints has its trained weights in ``output_dir`` (``trained_weights``: its
history ends with the record ``train()`` writes when it returns, at ``max_steps``); ``load_trained_weights`` puts
those weights into the trainer's model. The held-out evaluation before training is not repeated: its per-problem
records are in the run's folder (``TaskEvaluator.recorded``). ``hf-grpo report`` finishes such a run the same way:
it runs that resume (``finishing_command``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .card import CARD_FILE
from .checkpoints import finished_step, newest_complete
from .results import ADAPTER_FILES, RunResult, run_kind
from .run_files import EVAL_FILE, HISTORY_FILE, PLOT_FILE, RECIPE_FILE, SUMMARY_FILE


def lacking(output_dir: str | Path, expects_eval: bool) -> list[str]:
    """What a finished run in ``output_dir`` lacks of its outputs, by file name (the after-evaluation as
    ``eval_results.json``); empty when it has them all. A README.md of anyone's counts as there."""
    out = Path(output_dir)
    missing = [name for name in (SUMMARY_FILE, PLOT_FILE, CARD_FILE) if not (out / name).is_file()]
    if expects_eval and "after" not in (_read(out / EVAL_FILE) or {}):
        missing.insert(0, f"{EVAL_FILE} (the after-evaluation)")
    return missing


def trained_weights(output_dir: str | Path, max_steps: int) -> bool:
    """Whether ``output_dir`` holds the weights of a training that reached ``max_steps`` and returned (the
    ``train_runtime`` record TRL logs then), saved by the run after training, though it has no checkpoint."""
    history = _read(Path(output_dir) / HISTORY_FILE)
    if not isinstance(history, list) or not history or max_steps <= 0:
        return False
    last = history[-1]
    ended = isinstance(last, dict) and "train_runtime" in last and last.get("step") == max_steps
    return ended and run_kind(output_dir) != ""


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
    """The command that finishes ``run`` (``hf-grpo report``'s way): when it trained to ``max_steps`` and lacks its
    after-evaluation, its resume from its own ``recipe.yaml``, which evaluates and writes what it lacks; else None."""
    out, max_steps = run.output_dir, run.value("max_steps", -1)
    if not run.value("eval_before_after", True) or "after" in (run.evaluations or {}):
        return None
    checkpoint, _ = newest_complete(out, None)
    at_end = checkpoint is not None and finished_step(checkpoint, max_steps) is not None
    if not (at_end or trained_weights(out, max_steps)) or not (out / RECIPE_FILE).is_file():
        return None
    recipe, resume = str(out / RECIPE_FILE), ["--resume_from_checkpoint", "auto"]
    return [sys.executable, "-m", "hf_grpo.train", recipe, "--output_dir", str(out), *resume]


def _read(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
