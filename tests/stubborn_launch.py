"""Run ``hf_grpo.launch.run_launcher`` over a stand-in training launch whose worker ignores SIGINT and SIGTERM (as a
worker stuck in a collective or a long generation does), with a 2 s stop grace. The test signals this process and
then looks for the worker.

    python -m tests.stubborn_launch
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

from hf_grpo import launch


# "accelerate": starts a worker, then waits for it; the worker ignores the polite signals and sleeps
WORKER = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
LAUNCH = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {WORKER!r}]).wait()"


def main() -> int:
    launch.STOP_GRACE_S = 2.0
    launch.plan_commands = lambda recipe, argv: [launch.Command("train", {}, [sys.executable, "-c", LAUNCH])]
    print("launched", flush=True)
    return launch.run_launcher(SimpleNamespace(), [])


if __name__ == "__main__":
    sys.exit(main())
