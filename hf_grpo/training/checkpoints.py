"""Which checkpoints are complete, and which one a run resumes from.

transformers writes ``checkpoint-N`` file by file with no marker at the end, so a run stopped while saving leaves a
folder ``get_last_checkpoint`` still picks. Here, once every process has written its files (after a barrier), the
main process writes ``hf_grpo_checkpoint.json`` last, atomically: the process count, the sampling state in it
(``FEATURES``; ``mid_cycle``: TRL's generation batch) and the size of every file; a checkpoint is complete when every
listed file has its size. ``resume_from_checkpoint: auto`` takes the newest complete one and says which it skipped
and why; an explicit path that is not complete is one error before any model loads (docs/recipe_format.md). A
sampling feature turned on or off since, or another process count, starts that state fresh with a warning
(``sampling_changes``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path

from ..base.run_files import CHECKPOINT_MANIFEST, RECIPE_FILE, RunFileError, read_checked


logger = logging.getLogger(__name__)

MANIFEST = CHECKPOINT_MANIFEST
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
# The sampling features whose per-process state a checkpoint may hold, each a manifest key (true or false), with what
# that state is. The manifest's ``mid_cycle`` says it holds TRL's generation batch too (per process), saved when it
# falls inside a generation cycle (``steps_per_generation x num_iterations`` micro-batches).
FEATURES = {
    "dynamic_sampling": "dynamic-sampling groups",
    "prompt_selection": "prompt-selection history",
    "overlap": "rounds generated ahead",
}


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from; the message names the file and the alternative."""


def listing(folder: str | os.PathLike) -> dict[str, int]:
    """The size of every file under ``folder`` that this process sees, by relative path (the manifest excluded)."""
    folder = Path(folder)
    return {
        str(path.relative_to(folder)): path.stat().st_size
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != MANIFEST and not path.name.startswith(f"{MANIFEST}.")
    }


def write_manifest(
    folder: str | os.PathLike,
    num_processes: int,
    dynamic_sampling: bool,
    seen: list[dict[str, int]] = (),
    *,
    prompt_selection: bool = False,
    overlap: bool = False,
    mid_cycle: bool = False,
) -> None:
    """Mark ``folder`` complete: call after every process has written its files. ``seen``: what each process saw
    there (``listing``, gathered); the manifest lists all of it, so a node that does not share the folder with the
    others finds their files missing instead of resuming from its own fragments. The flags: ``FEATURES`` and
    ``mid_cycle``.

    A node where no process wrote a file (nodes that do not share ``output_dir``, ``save_only_model: true``) has no
    folder yet: it gets one holding the manifest alone, which lists the other nodes' files, so it is incomplete there.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    run_recipe = folder.parent / RECIPE_FILE
    if run_recipe.is_file():  # the recipe this checkpoint was trained with, compared before a resume
        shutil.copyfile(run_recipe, folder / RECIPE_FILE)
    files = sorted({name: size for view in (*seen, listing(folder)) for name, size in view.items()}.items())
    flags = {"dynamic_sampling": dynamic_sampling, "prompt_selection": prompt_selection, "overlap": overlap}
    manifest = {"num_processes": num_processes, **flags, "mid_cycle": mid_cycle, "files": dict(files)}
    tmp = folder / f"{MANIFEST}.tmp-{os.getpid()}"  # each node's writer its own (nodes that do not share write both)
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / MANIFEST)


def read_manifest(folder: str | os.PathLike) -> dict | None:
    """The manifest of checkpoint ``folder``, None when it has none (another program wrote it); ``RunFileError``
    naming it when it is damaged or not what ``write_manifest`` writes."""
    path = Path(folder) / MANIFEST
    manifest = read_checked(path, dict, missing_ok=True)
    if manifest is None:
        return None
    files, processes = manifest.get("files"), manifest.get("num_processes")
    if not isinstance(files, dict) or not isinstance(processes, int) or isinstance(processes, bool):
        raise RunFileError(f"{path} is not the checkpoint manifest hf_grpo writes (no files and num_processes)")
    return manifest


def problem(folder: str | os.PathLike, num_processes: int | None = None) -> str | None:
    """Why ``folder`` cannot be resumed from on ``num_processes`` processes, or None when it can."""
    folder = Path(folder)
    try:
        manifest = read_manifest(folder)
    except RunFileError as exc:
        return str(exc)
    if manifest is None:
        return f"no {MANIFEST}: the run stopped while writing it (or another program wrote it)"
    for name, size in manifest["files"].items():
        path = folder / name
        if not path.is_file():
            return f"{path} is missing"
        if path.stat().st_size != size:
            return f"{path} is {path.stat().st_size} bytes, {size} when it was saved (damaged)"
    saved = manifest["num_processes"]
    held = [what for key, what in FEATURES.items() if manifest.get(key)]
    if num_processes is not None and held and saved != num_processes:
        return (
            f"it holds the {' and '.join(held)} of {saved} training processes and this run has {num_processes}: "
            f"resume with num_processes: {saved}"
        )
    return None


_STARTS_FRESH = {  # feature -> (turned on since the checkpoint, turned off since)
    "dynamic_sampling": (
        "dynamic sampling starts fresh (no carried groups, its prompt stream from the start)",
        "its carried groups are dropped",
    ),
    "prompt_selection": (
        "prompt selection starts with an empty reward history",
        "its reward history is dropped",
    ),
    "overlap": (
        "overlap starts fresh (the next cycle's batch is generated when it starts)",
        "the rounds it generated ahead are dropped and generated again",
    ),
}


def sampling_changes(checkpoint: str | os.PathLike, current: dict[str, bool], num_processes: int) -> list[str]:
    """One message per sampling feature (``FEATURES``) that ``current`` (this run's, by key) turns on or off against
    what ``checkpoint`` was saved with, saying what the resumed run does instead: the feature starts fresh, or its
    saved state is dropped; and one when the checkpoint holds TRL's generation batch of another number of processes
    than ``num_processes``. Empty for a checkpoint without a manifest (nothing of hf_grpo's is in it)."""
    manifest = read_manifest(checkpoint)
    if manifest is None:
        return []
    changes = []
    saved = manifest["num_processes"]
    if manifest.get("mid_cycle") and saved != num_processes:
        changes.append(
            f"{checkpoint} was saved inside a generation cycle by {saved} training processes and this run has "
            f"{num_processes}: that cycle's batch is generated anew, so the run does not continue exactly as it would "
            "have"
        )
    for key in FEATURES:
        saved, now = bool(manifest.get(key)), bool(current.get(key))
        if saved != now:
            turned_on, turned_off = _STARTS_FRESH[key]
            changes.append(
                f"{checkpoint} was saved with {key} {str(saved).lower()} and this run has {key}: "
                f"{str(now).lower()}: {turned_on if now else turned_off}"
            )
    return changes


def checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """The ``checkpoint-N`` directories of ``output_dir``, newest (highest N) first."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    found = [p for p in output_dir.iterdir() if p.is_dir() and _CHECKPOINT.match(p.name)]
    return sorted(found, key=lambda p: int(_CHECKPOINT.match(p.name).group(1)), reverse=True)


def newest_complete(output_dir: str | os.PathLike, num_processes: int) -> tuple[Path | None, dict[Path, str]]:
    """The newest checkpoint that resumes on ``num_processes`` processes, and the newer ones skipped with why."""
    skipped = {}
    for folder in checkpoints(output_dir):
        why = problem(folder, num_processes)
        if why is None:
            return folder, skipped
        skipped[folder] = why
    return None, skipped


def resolve_resume(value, output_dir: str, num_processes: int) -> str | None:
    """What ``Trainer.train(resume_from_checkpoint=...)`` gets for the recipe's ``resume_from_checkpoint``.

    ``auto``/``true``: the newest complete checkpoint in ``output_dir``, or None when there is none (start over).
    A path: itself, once checked. Raises CheckpointError for a path that cannot be resumed from, and for ``auto`` when
    ``output_dir`` holds checkpoints but none can be resumed from (another process count, all incomplete).
    """
    if value is None or value is False or (isinstance(value, str) and value.lower() in ("", "false", "none")):
        return None
    if value is True or value.lower() in ("auto", "true"):
        found, skipped = newest_complete(output_dir, num_processes)
        for folder, why in skipped.items():
            logger.warning("resume: skipping %s: %s", folder, why)
        if found is not None:
            logger.info("resuming from %s", found)
            _warn_if_weights_only(found)
        elif skipped:  # starting over would train from step 0 and overwrite them: never silently
            newest, why = next(iter(skipped.items()))
            raise CheckpointError(
                f"resume_from_checkpoint {value}: {output_dir} holds {len(skipped)} checkpoint(s) and none can be "
                f"resumed from (the newest, {newest}: {why}); fix that, or delete them (or choose another output_dir) "
                "to start over"
            )
        return str(found) if found is not None else None
    value = os.path.expanduser(value)  # `~/runs/x/checkpoint-10` from a recipe is no shell word: expand it here
    why = problem(value, num_processes)
    if why is not None:
        parent = Path(value).expanduser().resolve().parent
        good, _ = newest_complete(parent, num_processes)
        alternative = f"the newest complete one is {good}" if good else f"{parent} has no complete checkpoint"
        if Path(value).is_dir() and not (Path(value) / MANIFEST).exists():  # before loading: it fails late there
            raise CheckpointError(
                f"resume_from_checkpoint: {value} has no {MANIFEST}: hf_grpo did not write it, or stopped while "
                f"writing it ({alternative}); to start from another trainer's weights, set model_name_or_path to "
                "them and resume_from_checkpoint: false"
            )
        raise CheckpointError(f"resume_from_checkpoint: {value} cannot be resumed from: {why}; {alternative}")
    _warn_if_weights_only(value)
    return value


def _warn_if_weights_only(checkpoint: str | os.PathLike) -> None:
    """A ``save_only_model`` checkpoint has weights but no optimizer, scheduler or RNG state: say that the run goes on
    from its weights with a fresh optimizer (Adam's moments at zero), so it does not continue as it would have."""
    missing = [name for name in ("optimizer.pt", "scheduler.pt") if not (Path(checkpoint) / name).is_file()]
    if missing:
        logger.warning(
            "resume: %s has no %s (saved with save_only_model: true): training goes on from its weights with a fresh "
            "optimizer and schedule state, not exactly as the run would have continued",
            checkpoint,
            " or ".join(missing),
        )


# Recipe keys that fix the shapes or the meaning of what a checkpoint holds: resuming with another value fails after
# the model loads (a LoRA size mismatch) or trains a different model from the saved optimizer state.
FIXED_KEYS = (
    "model_name_or_path",
    "model_revision",
    "tiny_hidden_size",
    "use_peft",
    "lora_r",
    "lora_target_modules",
    "lora_target_parameters",
    "lora_modules_to_save",
    "use_dora",
    "num_generations",
)
# With the tiny model (built and warm-started locally, from the seed) these also fix the base model the adapter is on.
TINY_FIXED_KEYS = ("seed", "warm_start_steps", "warm_start_lr")
# Keys that differ between a run and its resume without changing what is resumed.
_IGNORED_KEYS = ("resume_from_checkpoint", "output_dir")


def saved_recipe_path(checkpoint: str | os.PathLike) -> Path | None:
    """The recipe a checkpoint was trained with: its own copy, else its run's ``recipe.yaml``; None without one."""
    for path in (Path(checkpoint) / RECIPE_FILE, Path(checkpoint).parent / RECIPE_FILE):
        if path.is_file():
            return path
    return None


def recipe_changes(saved: dict, current: dict, defaults: dict) -> tuple[dict, dict]:
    """(fixed, other): the keys whose values differ between the checkpoint's recipe and this one, each as
    ``key: (saved, current)``; a key one of them leaves out has its default. ``fixed`` ones make resuming impossible."""
    fixed, other = {}, {}
    for key in sorted(saved.keys() | current.keys()):
        old, new = saved.get(key, defaults.get(key)), current.get(key, defaults.get(key))
        if key in _IGNORED_KEYS or old == new:
            continue
        tiny = saved.get("model_name_or_path", defaults.get("model_name_or_path")) == "tiny"
        (fixed if key in FIXED_KEYS or (tiny and key in TINY_FIXED_KEYS) else other)[key] = (old, new)
    return fixed, other


def finished_step(checkpoint: str | os.PathLike, max_steps: int) -> int | None:
    """The checkpoint's step when it reached ``max_steps`` (> 0): the run is finished; else None."""
    try:
        step = json.loads((Path(checkpoint) / "trainer_state.json").read_text()).get("global_step")
    except (OSError, ValueError, AttributeError):
        return None
    return step if isinstance(step, int) and 0 < max_steps <= step else None


SCORES_FILE = "checkpoint_scores.json"  # keep_top_k's ranking: checkpoint name -> held-out accuracy (None: unranked)


def keep_best(run_dir: str | os.PathLike, newest: str, score: float | None, keep: int) -> dict[str, float | None]:
    """Record the checkpoint ``newest`` with its held-out accuracy and delete all but the ``keep`` best; returns what
    is kept.

    The newest checkpoint is kept while it is the newest, whatever its rank, so that the run resumes from where it
    stopped (not from the peak step, retraining what came after); so is one without a score (saved at a step with no
    task evaluation: transformers saves at the last step whatever ``save_steps`` is). Once older, a checkpoint
    outside the best ``keep`` or without a score is deleted. The scores file is replaced atomically.
    """
    path = Path(run_dir) / SCORES_FILE
    scores = read_checked(path, dict, missing_ok=True) or {}
    scores[newest] = score

    def rank(name: str) -> tuple[float, int]:
        return scores[name], int(name.rsplit("-", 1)[1])

    ranked = sorted((name for name, value in scores.items() if value is not None), key=rank, reverse=True)
    kept = {name: scores[name] for name in ranked[:keep]}
    if newest not in kept:
        kept[newest] = score
        why = "has no task evaluation (task_eval_steps)" if score is None else f"ranks below the best {keep}"
        logger.info("keep_top_k: %s %s; kept while it is the newest, to resume from", newest, why)
    for name in scores.keys() - kept.keys():
        shutil.rmtree(Path(run_dir) / name, ignore_errors=True)
    tmp = path.with_name(f"{path.name}.tmp")
    tmp.write_text(json.dumps(kept, indent=2))
    os.replace(tmp, path)
    ranks = ", ".join(f"{name} ({value:.3f})" for name, value in kept.items() if value is not None)
    logger.info("keep_top_k: kept %s", ranks or "no ranked checkpoint yet")
    return kept
