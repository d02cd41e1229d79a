"""``hf-grpo eval`` says how far it is while it generates: on a terminal a bar (tests/test_progress.py), elsewhere (a log
file, a pipe: stderr here, captured by pytest, is no terminal) a log line with the problems done, the rate and the
time left, every ``hf_grpo.base.progress.LOG_EVERY`` seconds, and one when it is done."""

from __future__ import annotations

import io
import logging
import re

import pytest

import hf_grpo.base.progress
from hf_grpo import evaluate as hf_evaluate


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def progress_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "hf_grpo.base.progress"]


def test_the_eval_command_logs_its_progress_where_no_bar_shows(tiny_model_dir, monkeypatch, caplog, capsys):
    monkeypatch.setattr(hf_grpo.base.progress, "LOG_EVERY", 0.0)  # a line at every batch
    argv = [str(tiny_model_dir), "--dataset", "arithmetic", "--max-samples", "12", "--batch-size", "4"]
    with caplog.at_level(logging.INFO, logger="hf_grpo"):
        assert hf_evaluate.main([*argv, "--max-new-tokens", "4"]) == 0
    lines = progress_lines(caplog)
    pattern = r"evaluate: generate: (\d+)/12 problems \((\d+)%\), [\d.]+ problems/s, \d\d:\d\d left"
    counts = [re.fullmatch(pattern, line) for line in lines[:-1]]
    assert all(counts), lines
    assert [(int(m[1]), int(m[2])) for m in counts] == [(4, 33), (8, 67), (12, 100)]
    assert re.fullmatch(r"evaluate: generate: 12 problems in \d\d:\d\d", lines[-1]), lines[-1]
    assert "evaluate: generate" not in capsys.readouterr().out, "progress never goes to stdout (the summary does)"


def test_a_short_wait_logs_nothing_and_a_terminal_gets_the_bar(monkeypatch, caplog):
    with caplog.at_level(logging.INFO, logger="hf_grpo"):
        with hf_grpo.base.progress.progress_bar(3, "quick", log_lines=True) as bar:  # well under LOG_EVERY
            assert isinstance(bar, hf_grpo.base.progress.ProgressLog)
            bar.update(3)
        assert progress_lines(caplog) == []
        monkeypatch.setattr("sys.stderr", Terminal())
        with hf_grpo.base.progress.progress_bar(3, "on a terminal", log_lines=True) as bar:
            assert isinstance(bar, hf_grpo.base.progress.tqdm) and not bar.disable
        with hf_grpo.base.progress.progress_bar(3, "forced off", enabled=False, log_lines=True) as bar:
            assert bar.disable


@pytest.mark.parametrize("main", [True, False])
def test_only_the_main_process_logs(main, monkeypatch, caplog):
    monkeypatch.setattr(hf_grpo.base.progress, "LOG_EVERY", 0.0)
    monkeypatch.setattr(hf_grpo.base.progress, "is_main_process", lambda: main)
    with (
        caplog.at_level(logging.INFO, logger="hf_grpo"),
        hf_grpo.base.progress.progress_bar(2, "x", log_lines=True) as bar,
    ):
        bar.update(2)
    assert bool(progress_lines(caplog)) == main
