"""How the multi-process check scripts (``*_check.py``, started under accelerate by the tests) end, in one place.

if __name__ == "__main__":
    run_check(main, sys.argv[1])
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from hf_grpo.train import end_process_group


def run_check(main: Callable[..., None], *args) -> None:
    """Run ``main(*args)``, shut the process group down as a run does (``hf_grpo.train.main``), then exit at once.

    The exit skips interpreter teardown: under CI load a 2-process gloo script that had shut its group down still
    aborted now and then in teardown ("terminate called without an active exception", SIGABRT in a C++ destructor,
    2026-11-28: 1 of ~10 tier-2 launches), failing a test whose checks had all been written. The scripts check
    agreement between processes, not teardown. An exception in ``main`` propagates (exit status 1) after the group
    is shut down."""
    try:
        main(*args)
    finally:
        end_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
