"""A run's report: the training figure (``training_curves.png``) and ``summary.md``. ``hf_grpo.run.pipeline`` calls
``write_report`` with the run's result in memory after training; ``hf-grpo report`` (``hf_grpo.report``) with the
result read back from the run's files. A ``summary.md`` hf_grpo did not write is never replaced.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..base.run_files import (
    PLOT_FILE,
    SUMMARY_FILE,
    foreign_file,
    replacing,
    write_text,
)
from .plot import plot_training
from .run_result import RunResult, as_run_result
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
