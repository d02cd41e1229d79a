"""Names of the files a training run writes into its ``output_dir``; the trainer, reports, evaluation and the Hub
push all read them from here. Also what marks a folder as a run's (``is_run_folder``), what a run may not write
into (``output_dir_problem``), and the one way the commands write a file (``replacing``, ``write_text``): a
temporary file beside it, renamed over it once whole, so a full disk or a kill never leaves half a file in its place.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path


RECIPE_FILE = "recipe.yaml"  # the resolved recipe (hf_grpo.pipeline.save_recipe)
RECIPE_HEADER = "# resolved from "  # how save_recipe starts recipe.yaml (a user's recipe.yaml does not)
VERSIONS_FILE = "versions.json"  # library versions at training time (hf_grpo.pipeline.save_recipe)
HISTORY_FILE = "training_history.json"  # one record per logged step (hf_grpo.evaluation.history)
EVAL_FILE = "eval_results.json"  # held-out accuracy before and after training (hf_grpo.train)
PLOT_FILE = "training_curves.png"  # the training plot (hf_grpo.evaluation.report.choose_panels)
SUMMARY_FILE = "summary.md"  # the Markdown summary (hf_grpo.evaluation.report)
EVAL_RECORDS = "eval_{label}.jsonl"  # per-problem held-out records, label before / after / stepN (evaluation.tasks)
LOCK_FILE = "hf_grpo.lock"  # the run writing into output_dir: pid, host, command (hf_grpo.run_lock)
SERVER_LOG = "vllm_server.log"  # the output of the vLLM server a launch starts (hf_grpo.launch)
LOGS_DIR = "logs"  # crash logs, logs/crash-<time>-<pid>.log (hf_grpo.crash_log)
CHECKPOINT_MANIFEST = "hf_grpo_checkpoint.json"  # the last file of a complete checkpoint-N/ (hf_grpo.checkpoints)

# Files only a run of hf_grpo writes, in the order it writes them: the lock is its first file (the main process takes
# it before writing anything else; a killed run leaves it), recipe.yaml and versions.json come next, then the
# history and the results. The launcher writes the server's log and crash logs before the lock.
RUN_MARKS = (LOCK_FILE, VERSIONS_FILE, HISTORY_FILE, EVAL_FILE, SERVER_LOG)


def is_run_folder(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` holds a run of hf_grpo: one of ``RUN_MARKS`` or a temporary file it is written through
    (``hf_grpo.lock.<pid>.tmp``), a ``recipe.yaml`` that starts as ``save_recipe`` writes it, a crash log, or a
    ``checkpoint-N/`` with its manifest (all that a node holds when the nodes do not share ``output_dir``)."""
    folder, temporaries = Path(folder), tuple(f"{mark}." for mark in RUN_MARKS)
    if any(name in RUN_MARKS or name.startswith(temporaries) for name in _names(folder)):
        return True
    if _starts_with(folder / RECIPE_FILE, RECIPE_HEADER):
        return True
    return any(folder.glob(f"{LOGS_DIR}/crash-*.log")) or any(folder.glob(f"checkpoint-*/{CHECKPOINT_MANIFEST}"))


def _names(folder: str | os.PathLike) -> list[str]:
    """The names in ``folder``; none when it is no folder or cannot be read (the writes' own checks say why)."""
    try:
        return os.listdir(folder)
    except OSError:
        return []


def _starts_with(path: Path, prefix: str) -> bool:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(len(prefix)) == prefix
    except OSError:
        return False


def output_dir_problem(output_dir: str | os.PathLike) -> str | None:
    """Why a run must not write into ``output_dir`` (the end of a sentence that starts with its name), or None.

    Refused: a filesystem root (``--output_dir "$RUN_DIR/"`` with the variable unset is ``/``), the home folder, and
    an existing folder that holds files (hidden ones aside: no file a run writes is hidden) but no run of hf_grpo. A
    folder that does not exist yet, an empty one and a run's own (to resume it, or to train again into it) are fine.
    """
    path = Path(output_dir).expanduser().resolve()
    if path == Path(path.anchor):
        return "is the root of the filesystem"
    if path == Path.home().resolve():
        return "is your home folder"
    if any(not name.startswith(".") for name in _names(path)) and not is_run_folder(path):
        return "already holds files and no hf_grpo run (no hf_grpo.lock, recipe.yaml, versions.json, checkpoint-N/)"
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
