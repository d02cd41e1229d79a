"""The console during training (hf_grpo/monitoring/console.py): one line per logged step from the log record the
trainer produces, metrics the run does not log left out, the run watch's findings on lines of their own above the
training bar, ``console_metrics: true`` bringing transformers' dictionary back, and a tiny run's console."""

from __future__ import annotations

import json
import logging
import re
import sys
from types import SimpleNamespace

import pytest
from transformers import DefaultFlowCallback, PrinterCallback, ProgressCallback, TrainerCallback
from transformers.trainer_callback import CallbackHandler, TrainerControl, TrainerState

from hf_grpo.base.run_files import HISTORY_FILE
from hf_grpo.monitoring.console import ConsolePrinter, ConsoleProgress, install, step_line
from hf_grpo.monitoring.run_watch import RunWatch
from hf_grpo.recipe import RecipeError, load_recipe
from hf_grpo.train import train

from .helpers.common import REPO


# Step 2 of a tiny run's training_history.json (python -m hf_grpo.train --max_steps 3 --logging_steps 1), less the
# "step" HistoryCallback adds: the record every callback's on_log gets.
LOGS = {
    "epoch": 0.06451612903225806, "loss": -0.001164557528682053, "grad_norm": 0.11690676212310791,
    "learning_rate": 0.002, "num_tokens": 237727.0, "completions/mean_length": 10.50390625,
    "completions/min_length": 1.0, "completions/max_length": 16.0, "completions/clipped_ratio": 0.21661931818181818,
    "completions/mean_terminated_length": 8.988559809598057, "completions/min_terminated_length": 1.0,
    "completions/max_terminated_length": 16.0, "rewards/gsm8k_correctness/nonfinite": 0.0,
    "rewards/gsm8k_correctness/mean": 0.04794034090909091, "rewards/gsm8k_correctness/std": 0.2091904269023375,
    "reward": 0.04794034090909091, "reward_std": 0.2091904269023375, "frac_reward_zero_std": 0.9098011363636364,
    "accuracy": 0.04794034090909091, "grade/unparseable": 0.06640625, "grade/wrong": 0.8856534090909091,
    "rewards/gsm8k_correctness/errors": 0.0, "rewards/gsm8k_correctness/timeouts": 0.0, "reward/min": 0.0,
    "reward/max": 1.0, "dynamic_sampling/rounds": 11.0, "dynamic_sampling/kept_fraction": 0.09019886363636363,
    "dynamic_sampling/generated_per_trained": 11.0, "dynamic_sampling/carried_in": 9.0,
    "dynamic_sampling/carry_out": 8.0, "dynamic_sampling/surplus_dropped": 0.0, "dynamic_sampling/exhausted": 0.0,
    "advantage/mean": 0.0, "advantage/std": 0.7083917260169983, "entropy": 2.3554458618164062,
    "clip_ratio/low_mean": 0.0037950663827359676, "clip_ratio/high_mean": 0.004174572881311178,
    "clip_ratio/region_mean": 0.007969639264047146, "clip_ratio/low_min": 0.0,
    "clip_ratio/high_max": 0.2857142984867096, "step_time": 2.8092324579993146, "time/generate": 2.158899024998391,
    "time/reward": 0.10394494300635415, "time/weight_sync": 0.0, "time/score": 0.2653290179951,
    "time/train": 0.28109063299780246, "time/step": 2.8092636189976474,
}  # fmt: skip
LINE = "step 2/3  reward 0.048  acc 0.048  kept 9% of groups in 11 rounds  entropy 2.36  2.81 s/step  5.0 min left"


def test_the_line_of_a_real_log_record():
    assert step_line(LOGS, 2, 3, seconds_left=300) == LINE
    with_kl = step_line({**LOGS, "kl": 0.0021345}, 2, 3, seconds_left=300)  # logged when beta > 0
    assert with_kl == LINE.replace("  entropy", "  kl 0.00213  entropy")


def test_metrics_the_run_does_not_log_are_left_out_not_printed_as_nan():
    logs = {"loss": 0.1, "reward": float("nan"), "accuracy": None, "entropy": 0.41, "time/step": 29.06}
    assert step_line(logs, 3, 12) == "step 3/12  entropy 0.41  29.1 s/step"
    plain = {"reward": 0.61, "frac_reward_zero_std": 0.25, "step_time": 4.0}  # no dynamic sampling, TRL's timing
    assert step_line(plain, 3, 12, seconds_left=0) == "step 3/12  reward 0.610  signal in 75% of groups  4 s/step"
    assert step_line({"eval/accuracy": 0.4}, 10, 12) is None  # the held-out evaluation logs a line of its own
    end = {"train_runtime": 75.2, "train_loss": -0.01, "total_flos": 0.0}
    assert step_line(end, 12, 12) == "step 12/12  done in 75 s"


def tiny_state(max_steps: int) -> TrainerState:
    state = TrainerState()
    state.max_steps, state.global_step = max_steps, 0
    return state


def test_a_watch_finding_is_a_line_of_its_own_above_the_training_bar(capsys):
    console = logging.StreamHandler(sys.stderr)  # as logging.basicConfig in python -m hf_grpo.train
    console.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(console)
    state, control = tiny_state(4), TrainerControl()
    progress = ConsoleProgress()
    args = SimpleNamespace(stop_on=[], watch_patience=1, watch_reward_drop=0.5, watch_floors={"entropy": 1.0},
                           watch_plateau_evals=3, max_steps=4, task_eval_steps=0)  # fmt: skip
    watch = RunWatch(args)
    try:
        progress.on_train_begin(None, state, control)
        state.global_step = 1
        progress.on_step_end(None, state, control)
        logs = {"reward": 0.5, "entropy": 0.4, "time/step": 2.0}
        for callback in (progress, watch):  # the order of the run's callbacks: transformers' first, the watch after
            callback.on_log(None, state, control, logs=dict(logs))
        progress.on_train_end(None, state, control)
    finally:
        root.removeHandler(console)
    assert [f.kind for f in watch.findings] == ["collapse"]
    assert root.handlers.count(console) == 0 and not any(type(h).__name__ == "_AboveTheBar" for h in root.handlers)
    captured = capsys.readouterr()
    assert re.fullmatch(r"step 1/4  reward 0\.500  entropy 0\.4  2 s/step  \S+ \w+ left\n", captured.out)
    finding = "WARNING hf_grpo.monitoring.run_watch: watch: collapse (entropy): policy entropy 0.400 under its floor"
    at = captured.err.index(finding)
    assert captured.err[at - 1] in "\r\n", repr(captured.err[max(at - 80, 0) : at + 20])  # not glued to the bar
    assert "\n" in captured.err[at:] and "|" not in captured.err[at : captured.err.index("\n", at)]


class Recorder(TrainerCallback):
    """What the callbacks before the console (training_history.json, the trackers) get."""

    def __init__(self):
        self.records = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.records.append(dict(logs))


def trainer_with(progress: type, console_metrics: bool) -> SimpleNamespace:
    """What ``install`` reads of a trainer: its args and its callbacks as transformers orders them (the flow, the
    run's own, then the progress callback)."""
    handler = CallbackHandler([DefaultFlowCallback, Recorder()], None, None, None, None)
    handler.add_callback(progress)
    return SimpleNamespace(args=SimpleNamespace(console_metrics=console_metrics), callback_handler=handler)


@pytest.mark.parametrize("console_metrics", [False, True])
def test_console_metrics_true_brings_transformers_dictionary_back(console_metrics, capsys):
    trainer = trainer_with(PrinterCallback, console_metrics)  # disable_tqdm: transformers prints the dictionary
    install(trainer)
    callbacks = trainer.callback_handler.callbacks
    assert [type(c) for c in callbacks[-1:]] == [PrinterCallback if console_metrics else ConsolePrinter]
    state = tiny_state(3)
    state.global_step = 2
    trainer.callback_handler.on_train_begin(None, state, TrainerControl())
    trainer.callback_handler.on_log(None, state, TrainerControl(), {**LOGS, "total_flos": 0.0})
    out = capsys.readouterr().out
    assert ("{'epoch': '0.06452', 'loss': '-0.001165'" in out) is console_metrics
    assert ("step 2/3  reward 0.048  acc 0.048  kept 9% of groups in 11 rounds" in out) is not console_metrics
    assert callbacks[1].records == [{**LOGS, "total_flos": 0.0}]  # the whole record, either way


def test_the_training_bar_stays_and_a_notebook_keeps_its_table():
    trainer = trainer_with(ProgressCallback, console_metrics=False)
    install(trainer)
    assert type(trainer.callback_handler.callbacks[-1]) is ConsoleProgress  # a ProgressCallback: bar and all
    notebook = pytest.importorskip("transformers.utils.notebook", reason="IPython: the dev extra")
    trainer = trainer_with(notebook.NotebookProgressCallback, console_metrics=False)
    install(trainer)
    assert [type(c) for c in trainer.callback_handler.callbacks[-2:]] == [
        notebook.NotebookProgressCallback,
        ConsolePrinter,
    ]


def test_console_metrics_is_a_recipe_key():
    recipe, _ = load_recipe([str(REPO / "recipes" / "tiny.yaml")], for_run=False)
    assert recipe.training.console_metrics is False
    recipe, _ = load_recipe([str(REPO / "recipes" / "tiny.yaml"), "--console_metrics", "true"], for_run=False)
    assert recipe.training.console_metrics is True
    with pytest.raises(RecipeError, match="console_metrics must be bool, got 'often'"):
        load_recipe([str(REPO / "recipes" / "tiny.yaml"), "--console_metrics", "often"], for_run=False)


def test_a_tiny_runs_console_has_one_line_per_logged_step_and_no_dictionary(tmp_path, capsys):
    out = tmp_path / "run"
    train(
        "recipes/tiny.yaml",
        output_dir=str(out),
        max_steps=3,
        logging_steps=1,
        warm_start_steps=10,
        tiny_hidden_size=64,
        arithmetic_train_size=64,
        arithmetic_eval_size=8,
        per_device_train_batch_size=16,
        eval_before_after=False,
        report_to="none",
    )
    captured = capsys.readouterr()
    lines = [line for line in captured.out.splitlines() if line.startswith("step ")]
    assert [line.split("  ")[0] for line in lines] == ["step 1/3", "step 2/3", "step 3/3", "step 3/3"], lines
    assert all(" reward " in f" {line} " and " s/step" in line for line in lines[:3]), lines
    assert lines[-1].startswith("step 3/3  done in ")
    for text in (captured.out, captured.err):
        assert "{'loss':" not in text and "'train_runtime'" not in text
    history = json.loads((out / HISTORY_FILE).read_text())  # the whole dictionary, as before
    assert [r["step"] for r in history if "loss" in r] == [1, 2, 3]
    assert {"grad_norm", "reward", "entropy", "time/step"} <= set(history[0]) and "train_runtime" in history[-1]
