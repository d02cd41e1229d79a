"""A run writes its phase into its manifest (trained, kept, finished) and every command reads it there: a run that
trained is never trained again, and a finishing resume keeps what the run decided (a stop, the findings, the kept
adapter); the watch's state goes into every checkpoint. Each run here is interrupted where a Ctrl-C or a kill could
land (``KeyboardInterrupt`` raised in-process at that point), then resumed or reported."""

from __future__ import annotations

import json
import logging
import shutil

import pytest

from hf_grpo.base.run_files import (
    EVAL_FILE,
    EVAL_RECORDS,
    HISTORY_FILE,
    SUMMARY_FILE,
    WATCH_STATE,
    run_state,
)
from hf_grpo.evaluation.tasks import TaskEvaluator
from hf_grpo.publish.hub import run_problem
from hf_grpo.train import main

from .helpers.common import run_module


QUICK = [
    "recipes/tiny.yaml", "--arithmetic_train_size", "64", "--arithmetic_eval_size", "48",
    "--per_device_train_batch_size", "16", "--num_generations", "4", "--max_completion_length", "8",
    "--max_generation_batches", "2", "--logging_steps", "1", "--report_to", "none",
]  # fmt: skip
# The warm-started tiny policy, then a learning rate that wrecks it (0.00 at steps 1 and 2): the watch keeps step 0's
# adapter, chosen on the first 24 problems, judged on the other 24. 800 warm-start steps, not 300: at 300 the policy
# held out 0.31 on a Xeon and 0.15 on an EPYC (another float path), too weak there for the watch to tell it from 0.
WRECKED = [
    *QUICK, "--warm_start_steps", "800", "--learning_rate", "1.0", "--max_steps", "2", "--task_eval_steps", "1",
    "--task_eval_max_samples", "24", "--save_strategy", "steps", "--save_steps", "1",
]  # fmt: skip


def interrupt_evaluation(monkeypatch, stop_at: str, nth: int = 1):
    """Raise KeyboardInterrupt (a Ctrl-C) when the ``nth`` held-out evaluation called ``stop_at`` starts."""
    real, seen = TaskEvaluator.run, []

    def run(self, model, tokenizer, label: str, **kwargs):
        seen.append(label)
        if label == stop_at and seen.count(label) == nth:
            raise KeyboardInterrupt
        return real(self, model, tokenizer, label=label, **kwargs)

    monkeypatch.setattr(TaskEvaluator, "run", run)


def resume(out, argv):
    return main([*argv, "--output_dir", str(out), "--resume_from_checkpoint", "auto"])


@pytest.fixture(scope="module")
def kept_interrupted(tmp_path_factory):
    """The wrecked run stopped while its kept adapter was evaluated, with the adapter's bytes at that moment."""
    out = tmp_path_factory.mktemp("state") / "kept"
    with pytest.MonkeyPatch.context() as patch:
        interrupt_evaluation(patch, "after", nth=2)  # the second "after": the kept adapter's
        assert main([*WRECKED, "--output_dir", str(out)]) == 130
    assert run_state(out)["phase"] == "kept" and not (out / EVAL_FILE).exists()
    return out, (out / "adapter_model.safetensors").read_bytes()


def test_a_run_stopped_while_its_kept_adapter_was_evaluated_finishes_with_that_adapter(kept_interrupted, tmp_path):
    """The resume loaded checkpoint-2 (the wrecked last state), saved it over the kept adapter, and reported near 0
    with no `kept` in eval_results.json."""
    out = tmp_path / "run"
    shutil.copytree(kept_interrupted[0], out)
    assert resume(out, WRECKED) == 0
    results = json.loads((out / EVAL_FILE).read_text())
    assert (out / "adapter_model.safetensors").read_bytes() == kept_interrupted[1]
    assert results["kept"]["step"] == 0 and results["last"]["accuracy"] < 0.1
    assert results["problems"] == {"chose_the_adapter": 24, "judged": 24} and results["after"]["total"] == 24
    assert results["after"]["accuracy"] > 0.1 and results["gain"]["n"] == 24
    assert not (out / "checkpoint-3").exists() and run_state(out)["phase"] == "finished"
    assert "kept the adapter of step 0" in (out / SUMMARY_FILE).read_text()


@pytest.mark.slow  # a subprocess: the same finish as above, from the report command
def test_hf_grpo_report_finishes_it_the_same_way(kept_interrupted, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(kept_interrupted[0], out)
    result = run_module("hf_grpo.report", str(out), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "the run lacks its after-evaluation; finishing it: " in result.stderr
    assert (out / "adapter_model.safetensors").read_bytes() == kept_interrupted[1]
    assert json.loads((out / EVAL_FILE).read_text())["kept"]["step"] == 0


STOPPED = [
    *QUICK, "--warm_start_steps", "20", "--max_steps", "10", "--task_eval_steps", "0", "--save_strategy", "steps",
    "--save_steps", "1", "--watch_floors", json.dumps({"completion_length": 1000}), "--stop_on", "[degraded]",
]  # fmt: skip


def test_a_run_the_watch_stopped_is_finished_not_trained_past_its_stop(tmp_path, monkeypatch, caplog):
    """Stopped at step 2 of 10 and killed in its evaluation after training: the resume trained on from checkpoint-2
    and replaced what the run had decided, with no line saying so."""
    out = tmp_path / "run"
    with monkeypatch.context() as patch:
        interrupt_evaluation(patch, "after")
        assert main([*STOPPED, "--output_dir", str(out)]) == 130
    state = run_state(out)
    assert state["phase"] == "trained" and state["stopped"]["step"] == 2
    assert "trained but has not finished" in run_problem(out)  # `hf-grpo push` refuses it, naming the finish
    with caplog.at_level(logging.INFO, logger="hf_grpo"):
        assert resume(out, STOPPED) == 0
    assert "finished training (the run watch stopped it at step 2 (degraded: collapse))" in caplog.text
    assert not (out / "checkpoint-3").exists()
    results = json.loads((out / EVAL_FILE).read_text())
    assert results["watch"]["stopped"]["step"] == 2 and results["watch"]["findings"][0]["kind"] == "collapse"
    assert "stopped at step 2 (degraded: collapse)" in (out / SUMMARY_FILE).read_text()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hf_grpo"):  # and once finished, a resume trains nothing
        assert resume(out, STOPPED) == 0
    assert "is finished: the run watch stopped it at step 2" in caplog.text and not (out / "checkpoint-3").exists()


def test_a_finding_after_training_leaves_the_run_trained(tmp_path, monkeypatch, caplog):
    """A finding at the look after training came after `train_runtime` in training_history.json, where finishing
    looked for the end of training: killed while writing its outputs, a run without checkpoints was trained again
    from step 0 by its resume."""
    from hf_grpo.monitoring.run_watch import RunWatch
    from hf_grpo.run import pipeline

    argv = [*QUICK, "--warm_start_steps", "20", "--max_steps", "2", "--task_eval_steps", "0"]
    out = tmp_path / "run"
    real_finished = RunWatch.finished

    def finds_something(self, start, after):  # as a hacking finding at the look after training would
        real_finished(self, start, after)
        self._found("hacking", after.step, 0, "hacking: the test's finding after training")

    with monkeypatch.context() as patch:
        patch.setattr(RunWatch, "finished", finds_something)
        patch.setattr(pipeline, "write_outputs", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
        assert main([*argv, "--output_dir", str(out)]) == 130
    history = json.loads((out / HISTORY_FILE).read_text())
    assert "watch" in history[-1] and run_state(out)["phase"] == "trained"
    with caplog.at_level(logging.INFO, logger="hf_grpo"):
        assert resume(out, argv) == 0
    assert "lacked summary.md, training_curves.png, README.md: written from its files" in caplog.text
    assert "is finished: it trained to step 2; nothing to train" in caplog.text
    history = json.loads((out / HISTORY_FILE).read_text())
    assert sum("train_runtime" in r for r in history) == 1 and max(r["step"] for r in history) == 2
    assert "the test's finding after training" in (out / SUMMARY_FILE).read_text()


def test_a_resumed_run_watches_from_the_same_step_0(tmp_path, monkeypatch, caplog):
    """The watch's state is in every checkpoint: after a kill at step 2 the resumed run compares with the step 0 it
    started from, not with its first evaluation after the resume."""
    from hf_grpo.training.trainer import GRPOTrainer

    argv = [*QUICK, "--warm_start_steps", "20", "--max_steps", "4", "--task_eval_steps", "1",
            "--task_eval_max_samples", "24", "--save_strategy", "steps", "--save_steps", "1"]  # fmt: skip
    out = tmp_path / "run"
    real_step = GRPOTrainer.training_step

    def killed_in_step_3(self, *args, **kwargs):
        if self.state.global_step == 2:
            raise KeyboardInterrupt
        return real_step(self, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(GRPOTrainer, "training_step", killed_in_step_3)
        assert main([*argv, "--output_dir", str(out)]) == 130
    saved = json.loads((out / "checkpoint-2" / WATCH_STATE).read_text())
    assert [e["step"] for e in saved["evaluations"]] == [0, 1, 2]
    with caplog.at_level(logging.INFO, logger="hf_grpo"):
        assert resume(out, argv) == 0
    assert "holds no run watch state" not in caplog.text
    final = json.loads((out / WATCH_STATE).read_text())
    assert [e["step"] for e in final["evaluations"]] == [0, 1, 2, 3]  # step 4's: the evaluation after training
    assert final["evaluations"][0] == saved["evaluations"][0]
    step0 = {str(r["index"]): r["grade"] for r in map(json.loads, (out / EVAL_RECORDS.format(label="before")).open())}
    assert final["evaluations"][0]["grades"] == {k: v for k, v in step0.items() if int(k) < 24}
