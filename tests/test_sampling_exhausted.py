"""``dynamic_sampling_exhausted: error`` ends a run with one line (what ran out, the fix, the traceback's file, the
resume command) and exit status 1, no traceback: it was a ``RuntimeError`` that ``hf_grpo.train`` re-raised."""

from __future__ import annotations

import re
from pathlib import Path

from hf_grpo.train import main

from .helpers.launching import COMMON


def test_an_exhausted_dynamic_sampling_budget_ends_the_run_with_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    argv = [
        *COMMON, "--output_dir", str(out), "--max_steps", "3", "--report_to", "none",
        "--eval_before_after", "false", "--task_eval_steps", "0",
        "--reward_funcs", "[tests.helpers.reward_scripts:always_zero]",  # every group has equal rewards: all dropped
        "--dynamic_sampling", "true", "--max_generation_batches", "1", "--dynamic_sampling_exhausted", "error",
    ]  # fmt: skip
    code = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("hf_grpo: error:")]
    assert code == 1 and len(lines) == 1, err[-3000:]
    assert "Traceback" not in err and 'File "' not in err, err[-3000:]
    line = lines[0]
    assert "after max_generation_batches=1 rounds" in line and "generating step 1" in line, line
    assert "raise max_generation_batches or set dynamic_sampling_exhausted: fill" in line, line
    assert line.endswith("--resume_from_checkpoint auto"), line
    log = Path(re.search(r"the traceback: (\S+);", line).group(1))
    assert log.parent == out / "logs" and "SamplingExhausted" in log.read_text()
