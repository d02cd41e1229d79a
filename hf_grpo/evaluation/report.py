"""A run's report: the training figure (``training_curves.png``) and ``summary.md``, and the command that rebuilds
them with the model card from a finished run's files::

    python -m hf_grpo.evaluation.report outputs/tiny

``hf_grpo.pipeline`` calls ``write_report`` with the run's result in memory after training; ``main`` reads it with
``hf_grpo.results.RunResult.load`` and writes the figure, ``summary.md`` and ``README.md`` (the model card) again.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from ..card import write_local_card
from ..results import RunFileError, RunResult, as_run_result
from ..run_files import PLOT_FILE, SUMMARY_FILE
from .plot import plot_training
from .summary import summary_markdown


logger = logging.getLogger(__name__)


def write_report(run: RunResult | str | Path) -> Path:
    """Plot the run (a ``RunResult``, or the output_dir of a finished run) and write its Markdown summary; returns the
    plot's path."""
    run = as_run_result(run)
    plot = plot_training(run.history, run.output_dir / PLOT_FILE, run.evaluations, run.gain)
    (run.output_dir / SUMMARY_FILE).write_text(summary_markdown(run))
    return plot


def main(argv: list[str] | None = None, prog: str = "python -m hf_grpo.evaluation.report") -> int:
    """Rebuild the figure, ``summary.md`` and the model card of a finished run; 2 for a run file that does not parse."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Rebuild training_curves.png, summary.md and the model card (README.md) of a finished hf_grpo "
        "run from the files in its output directory.",
    )
    parser.add_argument("output_dir", nargs="?", default=".", help="the output_dir of a run (default: .)")
    args = parser.parse_args(argv)
    if not Path(args.output_dir).is_dir():
        print(f"{parser.prog}: error: {args.output_dir!r} is not a directory", file=sys.stderr)  # noqa: T201
        return 2
    try:
        run = RunResult.load(args.output_dir)
    except RunFileError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)  # noqa: T201
        return 2
    print(write_report(run))  # noqa: T201
    print(write_local_card(run))  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
