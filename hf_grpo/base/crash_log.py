"""Crash logs and the resume command: a run that stops on an error or a signal prints one line, not a traceback.

The traceback goes to ``OUTPUT_DIR/logs/crash-<time>-<pid>.log``; the line names that file and the command that
resumes the run (the same arguments with ``--resume_from_checkpoint auto``). The launcher passes its own command line
to the training processes (``COMMAND_ENV``), so theirs resumes the launch, not one process of it.

``python -m hf_grpo.base.crash_log OUTPUT_DIR PROGRAM ARGS...`` runs ``accelerate`` (``PROGRAM`` is its path) in this
process with its own errors (a failed child, a stop signal) written to a crash log instead of the console, and its
refusals to start (the main node's port taken) as one ``hf_grpo: error:`` line. It names itself to the training
processes it starts (``PARENT_ENV``), which stop when it is gone (``hf_grpo.base.stopping.die_with_parent``).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

from .run_files import LOGS_DIR
from .stopping import PARENT_ENV, say


COMMAND_ENV = "HF_GRPO_COMMAND"  # the launcher's arguments, as shlex.join writes them
ERROR_MARK_ENV = "HF_GRPO_ERROR_MARK"  # the launcher's file: a process that printed `hf_grpo: error:` writes to it
PORT_TAKEN = re.compile(r"another process is utilizing it|EADDRINUSE|address already in use")  # accelerate's, torch's
PORT_IN_TEXT = re.compile(r"port `(\d+)`|:(\d+) \(errno")  # the port in accelerate's refusal, or torch's
ENTRY = "python -m hf_grpo.train"
RESUME_FLAGS = ("--resume_from_checkpoint", "--resume-from-checkpoint")


def write(output_dir: str | os.PathLike, exc: BaseException) -> Path | None:
    """Write ``exc``'s traceback to a new crash log under ``output_dir/logs``; its path, or None if it cannot."""
    path = Path(output_dir) / LOGS_DIR / f"crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
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


def mark_error() -> None:
    """Tell the launcher that this process printed an ``hf_grpo: error:`` line (its closing line then points at it)."""
    path = os.environ.get(ERROR_MARK_ENV)
    if path:
        try:
            with open(path, "a") as mark:
                mark.write(f"{os.getpid()}\n")
        except OSError:
            pass


def taken_port(text: str, argv: list[str]) -> str:
    """The port a refusal names (accelerate's "port `N`", torch's "...:N (errno"), else the one launched with: with
    ``--main_process_port 0`` accelerate picks the port, and only the refusal knows which."""
    found = PORT_IN_TEXT.search(text)
    if found:
        return next(group for group in found.groups() if group)
    return argv[argv.index("--main_process_port") + 1] if "--main_process_port" in argv else "29500"


def port_taken_message(port: int | str) -> str:
    """The one line for a main node (machine_rank 0) whose port another process holds on this machine."""
    return (
        f"main_process_port {port} is taken on this machine: another program listens there, or another node of this "
        "run was started here as machine_rank 0 too (only the main node is rank 0); give every node another free "
        "--main_process_port, or stop what holds it (`ss -ltnp` names it)"
    )


def run_quietly(output_dir: str, argv: list[str]) -> int:
    """Run ``accelerate ARGS`` here; a failed child or a stop signal ends it with a crash log, not a traceback. The
    exit status is the failed training process's (128 + N for one killed by signal N).

    Until torchrun's agent takes SIGINT over (it then stops its training processes with it), SIGINT kills this
    process at once: accelerate's imports and the main node's wait for the other machines (in C++, where no Python
    handler runs) would otherwise hold a stop for minutes; a single training process, in this process group, gets
    the same SIGINT and stops by itself, and the launcher waits for it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.environ[PARENT_ENV] = str(
        os.getpid()
    )  # inherited by the training processes (hf_grpo.base.stopping.parent_gone)
    from accelerate.commands.accelerate_cli import main as accelerate_main  # only in this wrapper: it imports torch
    from torch.distributed import DistNetworkError
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
        code = exc.get_first_failure()[1].exitcode
        return code if code > 0 else 128 - code
    except SignalException as exc:  # the launcher stopped it
        write(output_dir, exc)
        return 128 + int(exc.sigval)
    except (ConnectionError, DistNetworkError) as exc:  # accelerate's check of the main node's port, or its bind
        if not PORT_TAKEN.search(str(exc)):
            raise
        write(output_dir, exc)
        say(f"hf_grpo: error: {port_taken_message(taken_port(str(exc), argv))}")
        mark_error()
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(run_quietly(sys.argv[1], sys.argv[2:]))
