"""A run's report: the training figure (``training_curves.png``) and ``summary.md``, and the command that rebuilds
them with the model card from a finished run's files::

    python -m hf_grpo.evaluation.report outputs/tiny

``hf_grpo.pipeline`` calls ``write_report`` with the run's result in memory after training; ``main`` reads it with
``hf_grpo.results.RunResult.load`` and writes the figure, ``summary.md`` and ``README.md`` (the model card) again.
Neither replaces a ``summary.md`` or ``README.md`` hf_grpo did not write; ``main`` refuses, before writing anything, a
folder that holds no run (``run_files.is_run_folder``) and a run whose ``summary.md`` or ``README.md`` is the user's,
and finishes a run that trained to the end but lacks its after-evaluation (``hf_grpo.finishing``).
"""

from __future__ import annotations

import argparse
import logging
import shlex
import subprocess
import sys
from pathlib import Path

from ..card import CARD_FILE, CARD_SIGNS, write_local_card
from ..finishing import finishing_command
from ..results import RunFileError, RunResult, as_run_result
from ..run_files import (
    PLOT_FILE,
    RUN_MANIFEST,
    SUMMARY_FILE,
    claim,
    foreign_file,
    is_run_folder,
    replacing,
    write_text,
)
from .plot import plot_training
from .summary import summary_markdown


logger = logging.getLogger(__name__)

SUMMARY_SIGNS = ("# Training summary: ",)  # how summary_markdown starts summary.md


def write_report(run: RunResult | str | Path) -> Path:
    """Plot the run (a ``RunResult``, or the output_dir of a finished run) and write its Markdown summary; returns the
    plot's path. A ``summary.md`` hf_grpo did not write is left as it is, with a warning."""
    run = as_run_result(run)
    with replacing(run.output_dir / PLOT_FILE) as tmp:
        plot_training(run.history, tmp, run.evaluations, run.gain)
    summary = run.output_dir / SUMMARY_FILE
    if foreign_file(summary, SUMMARY_SIGNS) is not None:
        logger.warning("%s was not written by hf_grpo: left as it is, and the run's summary is not written", summary)
    else:
        write_text(summary, summary_markdown(run))
    return run.output_dir / PLOT_FILE


def report_problem(output_dir: Path) -> str | None:
    """Why ``main`` must not write into ``output_dir``: no run of hf_grpo there, or a ``summary.md`` or
    ``README.md`` of the user's that it would replace; None when it may."""
    if not is_run_folder(output_dir):
        return (
            f"{str(output_dir)!r} holds no hf_grpo run (no {RUN_MANIFEST}, which a run writes first): pass the "
            "output_dir of a run; nothing was written"
        )
    for name, signs in ((SUMMARY_FILE, SUMMARY_SIGNS), (CARD_FILE, CARD_SIGNS)):
        user_file = foreign_file(output_dir / name, signs)
        if user_file is not None:
            return (
                f"{user_file} was not written by hf_grpo and would be replaced: move it out of the run's folder (or "
                "delete it), then run this again; nothing was written"
            )
    return None


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
        problem = report_problem(Path(args.output_dir))
    except RunFileError as exc:  # a damaged manifest
        problem = str(exc)
    if problem is not None:
        print(f"{parser.prog}: error: {problem}", file=sys.stderr)  # noqa: T201
        return 2
    try:
        run = RunResult.load(args.output_dir)
    except RunFileError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)  # noqa: T201
        return 2
    finish = finishing_command(run)
    if finish is not None:  # trained to the end, stopped in its evaluation after training: the resume finishes it
        say = f"{parser.prog}: the run lacks its after-evaluation; finishing it: {shlex.join(finish)}"
        print(say, file=sys.stderr)  # noqa: T201
        return subprocess.call(finish)
    claim(args.output_dir)  # an earlier version's run gets its manifest
    print(write_report(run))  # noqa: T201
    print(write_local_card(run))  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
