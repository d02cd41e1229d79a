"""Crash logs and the resume command: a run that stops on an error or a signal prints one line, not a traceback.

The traceback goes to ``OUTPUT_DIR/logs/crash-<time>-<pid>.log``; the line names that file and the command that
resumes the run (the same arguments with ``--resume_from_checkpoint auto``). The launcher passes its own command line
to the training processes (``COMMAND_ENV``), so theirs resumes the launch, not one process of it.

``python -m hf_grpo.crash_log OUTPUT_DIR PROGRAM ARGS...`` runs ``accelerate`` (``PROGRAM`` is its path) in this
process with its own errors (a failed child, a stop signal) written to a crash log instead of the console.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
import traceback
from pathlib import Path


COMMAND_ENV = "HF_GRPO_COMMAND"  # the launcher's arguments, as shlex.join writes them
ENTRY = "python -m hf_grpo.train"
RESUME_FLAGS = ("--resume_from_checkpoint", "--resume-from-checkpoint")


def write(output_dir: str | os.PathLike, exc: BaseException) -> Path | None:
    """Write ``exc``'s traceback to a new crash log under ``output_dir/logs``; its path, or None if it cannot."""
    path = Path(output_dir) / "logs" / f"crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(traceback.format_exception(exc)))
    except OSError:
        return None
    return path


def resume_command(argv: list[str]) -> str:
    """The command that resumes this run: its arguments (the launcher's, in a process it started) with
    ``--resume_from_checkpoint auto`` instead of any value given."""
    if COMMAND_ENV in os.environ:
        argv = shlex.split(os.environ[COMMAND_ENV])
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in RESUME_FLAGS:
            skip = True
        elif not arg.startswith(tuple(f"{flag}=" for flag in RESUME_FLAGS)) and arg not in ("--dry-run", "--dry_run"):
            kept.append(arg)
    return " ".join([ENTRY, *map(shlex.quote, kept), "--resume_from_checkpoint", "auto"])


def run_quietly(output_dir: str, argv: list[str]) -> int:
    """Run ``accelerate ARGS`` here; a failed child or a stop signal ends it with a crash log, not a traceback."""
    from accelerate.commands.accelerate_cli import main as accelerate_main  # only in this wrapper: it imports torch
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    sys.argv = ["accelerate", *argv[1:]]
    try:
        accelerate_main()
    except subprocess.CalledProcessError as exc:  # one process: its message is above
        write(output_dir, exc)
        return exc.returncode if exc.returncode > 0 else 128 - exc.returncode
    except ChildFailedError as exc:  # several processes: torchrun's summary of the failed one
        write(output_dir, exc)
        return 1
    except SignalException as exc:  # the launcher stopped it
        write(output_dir, exc)
        return 128 + int(exc.sigval)
    except KeyboardInterrupt as exc:
        write(output_dir, exc)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(run_quietly(sys.argv[1], sys.argv[2:]))
