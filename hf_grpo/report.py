"""``hf-grpo report OUTPUT_DIR`` (``python -m hf_grpo.report``): rebuild a finished run's ``training_curves.png``,
``summary.md`` and model card (``README.md``) from its files.

It refuses, before writing anything, a folder that holds no run (``is_run_folder``) and a run whose ``summary.md``
or ``README.md`` is the user's, and finishes a run that trained but lacks its evaluation after training
(``hf_grpo.run.finishing``: its resume). Exit status 2 for a file that does not parse.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

from .base.run_files import RUN_MANIFEST, SUMMARY_FILE, claim, foreign_file, is_run_folder
from .publish.card import CARD_FILE, CARD_SIGNS, write_local_card
from .publish.report import SUMMARY_SIGNS, write_report
from .publish.run_result import RunFileError, RunResult
from .run.finishing import finishing_command


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


def main(argv: list[str] | None = None, prog: str = "python -m hf_grpo.report") -> int:
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
