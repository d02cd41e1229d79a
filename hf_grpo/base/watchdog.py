"""Stop a launcher's process groups when the launcher dies without stopping them itself (SIGKILL, OOM killer, crash).

The launcher starts it in a session of its own, writes the id of each process group it creates to its stdin
(``watch``), and ``done`` once it stopped them all itself (``dismiss``). When the launcher dies, the kernel closes its end of the pipe and the watchdog reads end of file without ``done``:
it sends SIGTERM to every group, then SIGKILL to the groups that still have a process after ``grace_s``. Its own
session keeps a terminal's Ctrl-C and the launcher's signals to its groups from reaching it, and it ignores SIGINT
and SIGHUP. It imports nothing of hf_grpo's, so it starts at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time


GRACE_S = 10.0  # between SIGTERM and SIGKILL
POLL_S = 0.2
DONE = "done"

logger = logging.getLogger(__name__)


class Watchdog:
    """The launcher's end: starts the watchdog process and tells it which groups to stop should the launcher die."""

    def __init__(self, grace_s: float = GRACE_S):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "hf_grpo.base.watchdog", str(grace_s)],
            stdin=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def watch(self, pgid: int) -> None:
        try:
            self.process.stdin.write(f"{pgid}\n")
            self.process.stdin.flush()
        except BrokenPipeError:  # the run goes on, unguarded
            logger.warning(
                "the launcher's watchdog exited (code %s): process group %d is unguarded", self.process.poll(), pgid
            )

    def dismiss(self) -> None:
        with contextlib.suppress(BrokenPipeError):
            self.process.stdin.write(f"{DONE}\n")
            self.process.stdin.flush()
        with contextlib.suppress(BrokenPipeError):
            self.process.stdin.close()
        self.process.wait()


def signal_group(pgid: int, signum: int) -> bool:
    """Send ``signum`` to group ``pgid``; False when the group has no process left."""
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def ask_group_to_stop(pgid: int, signum: int = signal.SIGTERM) -> bool:
    """Send ``signum`` to group ``pgid``, then SIGCONT: a stopped (SIGSTOP, Ctrl-Z) process would otherwise hold the
    signal pending until its grace ran out. False when the group has no process left."""
    sent = signal_group(pgid, signum)
    signal_group(pgid, signal.SIGCONT)
    return sent


def stop_groups(groups: list[int], grace_s: float) -> None:
    """SIGTERM to each group; SIGKILL to those that still have a process after ``grace_s`` seconds."""
    alive = [pgid for pgid in groups if ask_group_to_stop(pgid)]
    deadline = time.monotonic() + grace_s
    while alive and time.monotonic() < deadline:
        time.sleep(POLL_S)
        alive = [pgid for pgid in alive if signal_group(pgid, 0)]
    for pgid in alive:
        signal_group(pgid, signal.SIGKILL)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    grace_s = float(argv[0]) if argv else GRACE_S
    groups = []
    for line in sys.stdin:
        if line.strip() == DONE:
            return 0
        groups.append(int(line))
    if groups:
        sys.stderr.write(f"hf_grpo watchdog: the launcher died; stopping its process groups {groups}\n")
        stop_groups(groups, grace_s)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
