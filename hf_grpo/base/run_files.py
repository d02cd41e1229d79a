"""Names of the files a training run writes into its ``output_dir``; the trainer, reports, evaluation and the Hub
push all read them from here. Also what makes a folder a run's (its manifest, ``hf_grpo_run.json``: ``claim``,
``run_manifest``, ``is_run_folder``), what a run may not write into (``output_dir_problem``), and the one way the
commands write a file (``replacing``, ``write_text``): a temporary file beside it, renamed over it once whole, so a
full disk or a kill never leaves half a file in its place.

A folder is a run of hf_grpo only when it holds a file that only hf_grpo writes: the manifest, written first (before
the lock, the server's log or a crash log), naming hf_grpo and its version. A name any trainer writes
(``eval_results.json``, ``README.md``, ``adapter_config.json``) never makes a folder ours. A run written before the
manifest existed is recognised by a file only hf_grpo ever wrote (``LEGACY_SIGNS``: a ``recipe.yaml`` that starts
with the line ``save_recipe`` writes, or a ``checkpoint-N/`` with hf_grpo's checkpoint manifest), and gets its
manifest when a command of ours next writes into it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path


RECIPE_FILE = "recipe.yaml"  # the resolved recipe (hf_grpo.run.pipeline.save_recipe)
RECIPE_HEADER = "# resolved from "  # how save_recipe starts recipe.yaml's first line (a user's recipe.yaml does not)
RECIPE_HEADER_END = " and the command line; every other key has its default"  # and how it ends it
VERSIONS_FILE = "versions.json"  # library versions at training time (hf_grpo.run.pipeline.save_recipe)
HISTORY_FILE = "training_history.json"  # one record per logged step (hf_grpo.evaluation.history)
EVAL_FILE = "eval_results.json"  # held-out accuracy before and after training (hf_grpo.train)
PLOT_FILE = "training_curves.png"  # the training plot (hf_grpo.publish.report.choose_panels)
SUMMARY_FILE = "summary.md"  # the Markdown summary (hf_grpo.publish.report)
EVAL_RECORDS = "eval_{label}.jsonl"  # per-problem held-out records, label before / after / stepN (evaluation.tasks)
LOCK_FILE = "hf_grpo.lock"  # the run writing into output_dir: pid, host, command (hf_grpo.base.run_lock)
SERVER_LOG = "vllm_server.log"  # the output of the vLLM server a launch starts (hf_grpo.launch.launcher)
LOGS_DIR = "logs"  # crash logs, logs/crash-<time>-<pid>.log (hf_grpo.base.crash_log)
CHECKPOINT_MANIFEST = (
    "hf_grpo_checkpoint.json"  # the last file of a complete checkpoint-N/ (hf_grpo.training.checkpoints)
)
WARM_START_DIR = "warm_start"  # the adapter after a pretrained policy's warm start, before GRPO (hf_grpo.run.phases)
WATCH_STATE = "watch_state.json"  # the run watch's evaluations and findings, in checkpoints and output_dir (watch.py)
WATCH_ADAPTER = "watch_best_adapter.safetensors"  # beside it: the most accurate evaluated adapter

RUN_MANIFEST = "hf_grpo_run.json"  # the first file of a run: what makes the folder hf_grpo's (claim)
WRITER = "hf_grpo"  # the manifest's "written_by"


RUN_PHASES = ("training", "trained", "kept", "finished")  # the manifest's "state": where the run is (write_state)


class RunFolderError(ValueError):
    """A folder a command would write into is not a run of hf_grpo's; the message names it and what to do."""


class RunFileError(ValueError):
    """A file of the run that does not parse or is not what hf_grpo wrote there; the message is one line naming the
    file and what to do (fix or remove it)."""


def read_checked(path: str | os.PathLike, kind: type = dict, missing_ok: bool = False):
    """The JSON file ``path`` as a ``kind`` (dict or list), None when it is missing and ``missing_ok``. Every file a
    command reads back from a run (its manifest, a checkpoint's, the watch's state, the reports) comes through here,
    so a damaged one ends in one ``RunFileError`` line naming it, never a traceback."""
    path = Path(path)
    if path.is_dir():
        raise RunFileError(f"{path} is a folder, where hf_grpo writes a file: remove it (or move it away)")
    if missing_ok and not path.exists():
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if missing_ok:
            return None
        raise RunFileError(f"{path} is missing") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RunFileError(f"{path} cannot be read ({exc}): fix its permissions, or remove it") from None
    try:
        value = json.loads(text)
    except ValueError as exc:
        empty = "is empty" if not text.strip() else f"is not valid JSON ({exc})"
        raise RunFileError(f"{path} {empty}: a write was cut short or another program wrote it; remove it") from None
    if not isinstance(value, kind):
        raise RunFileError(
            f"{path} holds a {type(value).__name__}, not the {kind.__name__} hf_grpo writes there: remove it"
        )
    return value


def hf_grpo_version() -> str:
    try:
        return version("hf_grpo")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown"


def run_manifest(folder: str | os.PathLike) -> dict | None:
    """The manifest of the run in ``folder`` (``{"written_by": "hf_grpo", "version": ..., "created": ...}``), or
    None when it holds none, or one hf_grpo did not write; ``RunFileError`` for one that is damaged (a folder, empty,
    cut short), naming it."""
    path = Path(folder) / RUN_MANIFEST
    try:
        manifest = read_checked(path, dict, missing_ok=True)
    except RunFileError as exc:
        raise RunFileError(f"{exc} (the run's next command writes it anew)") from None
    return manifest if manifest is not None and manifest.get("written_by") == WRITER else None


def run_state(folder: str | os.PathLike) -> dict | None:
    """Where the run in ``folder`` is, as it last wrote into its manifest (``write_state``): ``{"phase": "training"
    | "trained" | "kept" | "finished", "step": ..., ...}``; None for a run an earlier version wrote. Resume, report
    and push read this, not whichever file another module wrote last."""
    state = (run_manifest(folder) or {}).get("state")
    return state if isinstance(state, dict) and state.get("phase") in RUN_PHASES else None


def write_state(folder: str | os.PathLike, state: dict | None) -> None:
    """Record the run's phase in its manifest, by temp file and rename (the main process): ``training`` when a
    training starts, ``trained`` once its last weights are saved in ``folder`` (``step``, ``stopped`` by the watch
    or not), ``kept`` once the watch's kept adapter is saved over them, ``finished`` once its outputs are written."""
    manifest = run_manifest(folder)
    if manifest is None:  # no run of ours: nothing is written
        return
    manifest.pop("state", None)
    if state is not None:
        manifest["state"] = state
    write_text(Path(folder) / RUN_MANIFEST, json.dumps(manifest, indent=2) + "\n")


def legacy_run(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` holds a run an earlier hf_grpo wrote, before the manifest: a ``recipe.yaml`` that starts
    with the line only ``save_recipe`` writes, or a ``checkpoint-N/`` whose manifest only hf_grpo writes (all that a
    node holds when the nodes do not share ``output_dir``)."""
    folder = Path(folder)
    header = _first_line(folder / RECIPE_FILE)
    if header.startswith(RECIPE_HEADER) and header.endswith(RECIPE_HEADER_END):
        return True
    for manifest in folder.glob(f"checkpoint-*/{CHECKPOINT_MANIFEST}"):
        try:
            content = json.loads(manifest.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(content, dict) and {"num_processes", "dynamic_sampling", "files"} <= content.keys():
            return True
    return False


def is_run_folder(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` holds a run of hf_grpo: its manifest, or an earlier version's run (``legacy_run``)."""
    return run_manifest(folder) is not None or legacy_run(folder)


def claim(folder: str | os.PathLike) -> Path:
    """Make ``folder`` a run folder of hf_grpo before anything is written there: create it with the manifest, write
    the manifest into an empty folder or an earlier version's run, keep a run's own; any other folder raises
    ``RunFolderError``. Safe to call from several processes (the manifest is written whole, by rename)."""
    path = Path(folder)
    if run_manifest(path) is not None:
        return path
    problem = output_dir_problem(path)
    if problem:
        raise RunFolderError(
            f"output_dir {folder} {problem}: hf_grpo writes only into a new or empty folder or one of its own "
            "runs; choose another output_dir"
        )
    path.mkdir(parents=True, exist_ok=True)
    manifest = {
        "written_by": WRITER,
        "version": hf_grpo_version(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "about": "This folder is a training run of hf_grpo: its commands write here, and only where this file is.",
    }
    write_text(path / RUN_MANIFEST, json.dumps(manifest, indent=2) + "\n")
    return path


def _names(folder: str | os.PathLike) -> list[str]:
    """The names in ``folder``; none when it is no folder or cannot be read (the writes' own checks say why)."""
    try:
        return os.listdir(folder)
    except OSError:
        return []


def _first_line(path: Path) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.readline(1000).rstrip("\n")
    except OSError:
        return ""


def output_dir_problem(output_dir: str | os.PathLike) -> str | None:
    """Why a run must not write into ``output_dir`` (the end of a sentence that starts with its name), or None.

    Refused: a filesystem root (``--output_dir "$RUN_DIR/"`` with the variable unset is ``/``), the home folder, a
    folder inside another run's (one of its checkpoints, or deeper), and an existing folder that holds files (hidden
    ones aside: no file a run writes is hidden) but no run of hf_grpo. A
    folder that does not exist yet, an empty one and a run's own (to resume it, or to train again into it) are fine.
    """
    path = Path(output_dir).expanduser().resolve()
    if path == Path(path.anchor):
        return "is the root of the filesystem"
    if path == Path.home().resolve():
        return "is your home folder"
    outer = next((parent for parent in path.parents if is_run_folder(parent)), None)
    if outer is not None:  # a checkpoint of that run, or any folder under it: its files are the run's
        inside = path.relative_to(outer).parts[0]
        return (
            f"is inside the run in {outer} (its {inside}{'/' if inside != path.name else ''}), whose folder is its own"
        )
    if any(not name.startswith(".") for name in _names(path)) and not is_run_folder(path):
        return f"already holds files and is no run of hf_grpo (it has no {RUN_MANIFEST})"
    return None


def foreign_file(path: str | os.PathLike, signs: tuple[str, ...]) -> Path | None:
    """``path`` when it is a file that holds none of ``signs`` (texts only the writers of a run put there): a file
    the user owns, which is never replaced; None when there is no file or it is a run's."""
    path = Path(path)
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8", errors="replace")
    return None if any(sign in text for sign in signs) else path


@contextlib.contextmanager
def replacing(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary file beside ``path`` (hidden, same folder and suffix) for the block to write. When the block ends
    it is flushed to disk and renamed over ``path`` (``os.replace``: a reader sees the old file or the whole new
    one); when the block raises (a full disk) it is removed and ``path`` is left as it was."""
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        yield tmp
        with contextlib.suppress(FileNotFoundError):
            shutil.copymode(path, tmp)  # a file replaced keeps its permissions
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` through ``replacing``; returns the path."""
    with replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)
