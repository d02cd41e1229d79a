"""One run per ``output_dir``: the lock file ``hf_grpo.lock`` (``outputs.LOCK_FILE``).

The main training process (rank 0) takes it before anything is written into ``output_dir`` and removes it when the
run ends, also on an exception or Ctrl-C. It holds the pid, the host, the process's start time and the command line,
and is created whole: written to a temporary file, then hard-linked to its name, which fails when a lock exists.

A second run into the same ``output_dir`` is refused while the holder is alive, whatever its recipe says: there is
no override (``overwrite_output_dir`` is gone from transformers 5, and a live run's outputs would be mixed with this
one's). A lock whose process is gone on this host (killed with SIGKILL, the machine restarted) is stale and taken
over with a warning; one from another host cannot be checked, so the message names the file to delete.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from pathlib import Path

from .run_files import LOCK_FILE


logger = logging.getLogger(__name__)


class RunLockError(RuntimeError):
    """``output_dir`` is held by another live run; the message names it and what to do."""


def _start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), which tells a reused pid from the holder."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _command_line() -> str:
    """This process's command as it was started (``python -m hf_grpo.train ...``; ``sys.argv`` has the file path)."""
    try:
        return Path("/proc/self/cmdline").read_bytes().rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return " ".join([sys.executable, *sys.argv])


def _alive(holder: dict) -> bool:
    """Whether the holder's process still runs (on this host: only then can it be checked)."""
    pid = holder.get("pid")
    if holder.get("host") != socket.gethostname() or not isinstance(pid, int):
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    started = holder.get("start_ticks")
    return started is None or _start_ticks(pid) in (None, started)


def _is_me(holder: dict) -> bool:
    """Whether the lock is this very process's: pid, host and start time all equal (a pid alone is not enough:
    containers on two nodes routinely give their main process the same small pid)."""
    me = os.getpid()
    return (
        holder.get("pid") == me
        and holder.get("host") == socket.gethostname()
        and holder.get("start_ticks") in (None, _start_ticks(me))
    )


def read_holder(output_dir: str | os.PathLike) -> dict | None:
    """The lock's content, or None when there is none ({} for an unreadable one, which counts as stale)."""
    try:
        holder = json.loads((Path(output_dir) / LOCK_FILE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def refusal(output_dir: str | os.PathLike, holder: dict) -> str:
    """The one-line message for a live holder: its pid, host and command, and the ways out."""
    lock = Path(output_dir) / LOCK_FILE
    where = "" if holder.get("host") == socket.gethostname() else f" on host {holder.get('host')}"
    gone = (
        f"; if it no longer runs there, delete {lock}" if where else "; a run's lock is never taken over while it runs"
    )
    return (
        f"output_dir {output_dir} is in use by another run (pid {holder.get('pid')}{where}, started "
        f"{holder.get('started', '?')}, command: {holder.get('command', '?')}): wait for it to finish or choose "
        f"another output_dir{gone}"
    )


def check_free(output_dir: str | os.PathLike) -> None:
    """Raise RunLockError when a live run other than this process holds ``output_dir`` (takes nothing)."""
    holder = read_holder(output_dir)
    if holder and not _is_me(holder) and _alive(holder):
        raise RunLockError(refusal(output_dir, holder))


def acquire(output_dir: str | os.PathLike) -> Path:
    """Take ``output_dir``'s lock for this process (creating the directory); returns the lock's path.

    Raises RunLockError when a live run holds it; takes over a stale one with a warning.
    """
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    lock = out / LOCK_FILE
    mine = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "start_ticks": _start_ticks(os.getpid()),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": _command_line()[:500],
    }
    tmp = out / f"{LOCK_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(mine))
    try:
        for _ in range(3):
            try:
                os.link(tmp, lock)  # atomic: fails when the lock exists
                return lock
            except FileExistsError:
                pass
            holder = read_holder(out)
            if holder is None:
                continue  # released in between
            if _is_me(holder):
                return lock
            if holder and _alive(holder):
                raise RunLockError(refusal(out, holder))
            _take_over(lock, holder)
        raise RunLockError(f"output_dir {out}: could not take {lock} (other runs are starting there); try again")
    finally:
        tmp.unlink(missing_ok=True)


def _take_over(lock: Path, stale: dict) -> None:
    """Move a stale lock aside (a rename: only one taker gets it), then delete it; a live one put back meanwhile is
    restored."""
    aside = lock.with_name(f"{LOCK_FILE}.stale.{os.getpid()}")
    try:
        os.rename(lock, aside)
    except FileNotFoundError:
        return
    try:
        moved = json.loads(aside.read_text())
    except (OSError, ValueError):
        moved = {}
    if moved and moved != stale and _alive(moved):  # another run took it over between our read and the rename
        os.replace(aside, lock)
        return
    aside.unlink(missing_ok=True)
    logger.warning(
        "output_dir %s: taking over the lock of a run that no longer runs (pid %s, command: %s)",
        lock.parent,
        stale.get("pid"),
        stale.get("command", "?"),
    )


def release(lock: Path | None) -> None:
    """Remove the lock if this process still holds it."""
    if lock is not None and _is_me(read_holder(lock.parent) or {}):
        lock.unlink(missing_ok=True)
