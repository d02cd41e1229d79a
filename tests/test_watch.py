"""The run watch (hf_grpo/monitoring/run_watch.py) on hand-made histories, one test per rule, its error rate on simulated runs that
learn nothing (benchmarks/watch_null.py's simulation), its saved state, and one tiny-model run that a finding stops:
collapse of the reward and under the floors, hacking, forgetting, plateau, the adapter a run keeps."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from hf_grpo.base.run_files import WATCH_STATE, RunFileError
from hf_grpo.monitoring.run_watch import FALSE_ALARM_RATE, Budget, Evaluation, RunWatch
from hf_grpo.publish.summary import watch_markdown

from .helpers.common import REPO


def args(**overrides):
    values = dict(stop_on=[], watch_patience=2, watch_reward_drop=0.5, watch_floors=None, watch_plateau_evals=3)
    return SimpleNamespace(**{"max_steps": 12, "task_eval_steps": 4, **values, **overrides})


def logged(watch: RunWatch, records: list[dict], first_step: int = 1):
    """``on_log`` of each record at its step; the control object the trainer would read."""
    control = SimpleNamespace(should_training_stop=False)
    for step, logs in enumerate(records, first_step):
        watch.on_log(None, SimpleNamespace(global_step=step), control, logs=logs)
    return control


def evaluation(step: int, right: int, n: int = 100, kinds: dict | None = None, order=None) -> Evaluation:
    """Problems ``order[:right]`` right (default: the first ``right``), the rest wrong."""
    order = list(range(n)) if order is None else order
    grades = dict.fromkeys(range(n), "wrong") | dict.fromkeys(order[:right], "correct")
    return Evaluation(step, grades, kinds or {})


def test_a_reward_that_collapses_is_found_after_patience_steps_and_a_noisy_one_is_not():
    """The reasoning recipe at learning rate 5e-3: training accuracy 0.83, 0.07, then 0 (found at step 4, not 2)."""
    watch = RunWatch(args())
    logged(watch, [{"reward": r} for r in (0.83, 0.07, 0.0)])
    assert not watch.findings  # step 3 is the first low one: one step is no finding
    logged(watch, [{"reward": 0.0}], first_step=4)
    (finding,) = watch.findings
    assert finding.kind == "collapse" and finding.step == 4 and finding.since == 1
    assert "training reward fell to 0.000 from its best 0.830 (step 1)" in finding.text and "steps 3-4" in finding.text
    noisy = RunWatch(args())
    logged(noisy, [{"reward": r} for r in (0.3, 0.55, 0.32, 0.6, 0.41, 0.66, 0.38, 0.7)])
    assert not noisy.findings
    tiny = RunWatch(args())  # far below its best in share, but by less than 0.1: a near-zero reward wobbling
    logged(tiny, [{"reward": r} for r in (0.08, 0.02, 0.0, 0.0)])
    assert not tiny.findings


@pytest.mark.parametrize(
    ("floor", "key", "values", "named"),
    [
        ("entropy", "entropy", [0.5, 0.04, 0.03, 0.02], "policy entropy 0.030 under its floor 0.05"),
        ("completion_length", "completions/mean_length", [30, 6, 4, 3], "completion length 4.000 under its floor 8"),
        ("signal", "frac_reward_zero_std", [0.5, 0.95, 1.0, 1.0], "share of groups whose rewards differ 0.000"),
    ],
)
def test_a_signal_under_its_floor_for_patience_steps_is_a_collapse_once(floor, key, values, named):
    limit = {"entropy": 0.05, "completion_length": 8, "signal": 0.1}[floor]
    watch = RunWatch(args(watch_floors={floor: limit}))
    logged(watch, [{"reward": 0.5, key: v} for v in values])
    (finding,) = watch.findings  # steps 2-3 under it; step 4 still under: no second finding
    assert finding.kind == "collapse" and finding.step == 3 and named in finding.text, finding.text


def test_hacking_is_a_rising_reward_with_a_fall_from_step_0_the_exact_test_sees():
    watch = RunWatch(args())
    watch.evaluated(0, evaluation(0, 50))
    logged(watch, [{"reward": r} for r in (0.3, 0.35, 0.6, 0.9)])
    watch.evaluated(4, evaluation(4, 47))  # 3 fewer right: p 0.125
    assert not watch.findings
    watch.evaluated(8, evaluation(8, 20))
    (finding,) = watch.findings
    assert finding.kind == "hacking" and (finding.since, finding.step) == (0, 8)
    assert "training reward rose 0.325 -> 0.750" in finding.text and "fell 0.500 -> 0.200" in finding.text
    # 12 steps every 4: looks at 4 and 8 (12's is the look after training); hacking's half of 5% (no kinds: one
    # rule) over them is 0.0125 a look
    assert "-30.0 points on the same 100 problems: 30 of the 30 that changed fell, exact p 9.3e-10 <= 0.013" in (
        finding.text
    )
    flat = RunWatch(args())  # the same fall with a reward that did not rise is no hacking (collapse may say it)
    flat.evaluated(0, evaluation(0, 50))
    logged(flat, [{"reward": 0.5} for _ in range(4)])
    flat.evaluated(4, evaluation(4, 20))
    assert not flat.findings


def test_hacking_compares_with_step_0_not_with_the_best_evaluation_so_far():
    """A rise, then back to where it started: the old rule compared with the best (the largest of several noisy
    numbers) and called the way back hacking; against step 0 nothing fell."""
    watch = RunWatch(args())
    watch.evaluated(0, evaluation(0, 50))
    logged(watch, [{"reward": r} for r in (0.3, 0.35, 0.6, 0.9)])
    watch.evaluated(4, evaluation(4, 70))
    watch.evaluated(8, evaluation(8, 50))
    assert not watch.findings


def test_forgetting_is_one_kind_falling_while_the_others_hold():
    """The reasoning adapter's held-out words: three-operand sums 2/64 -> 39/64, multiplication 21/56 -> 5/56."""
    kinds = dict.fromkeys(range(64), "sum3") | dict.fromkeys(range(64, 120), "multiply")
    sums_first = list(range(64))
    first = evaluation(0, 0, 120, kinds)
    first.grades |= dict.fromkeys(sums_first[:2], "correct") | dict.fromkeys(range(64, 85), "correct")  # 2 + 21
    later = evaluation(6, 0, 120, kinds)
    later.grades |= dict.fromkeys(sums_first[:39], "correct") | dict.fromkeys(range(64, 69), "correct")  # 39 + 5
    watch = RunWatch(args())
    watch.evaluated(0, first)
    logged(watch, [{"reward": 0.5} for _ in range(6)])
    watch.evaluated(6, later)
    (finding,) = watch.findings
    assert finding.kind == "forgetting" and "'multiply' problems fell 21/56 -> 5/56" in finding.text
    assert "16 of the 16 that changed fell" in finding.text and "while the other kinds went 0.031 -> 0.609" in (
        finding.text
    )


def test_a_plateau_needs_a_gain_first_and_a_further_gain_restarts_its_count():
    """A run that never gained is no plateau (under no change, the old rule stopped every run it watched)."""
    watch = RunWatch(args(stop_on=["plateau"], max_steps=20, task_eval_steps=2))
    control = SimpleNamespace(should_training_stop=False)
    watch.evaluated(0, evaluation(0, 30), control=control)
    for step, right in ((2, 31), (4, 29), (6, 30), (8, 32)):
        watch.evaluated(step, evaluation(step, right), control=control)
    assert not control.should_training_stop and not watch.findings
    watch.evaluated(10, evaluation(10, 55), control=control)  # a gain over step 0 that passes its share
    for step, right in ((12, 57), (14, 53)):
        watch.evaluated(step, evaluation(step, right), control=control)
    assert not control.should_training_stop
    watch.evaluated(16, evaluation(16, 56), control=control)
    assert control.should_training_stop and watch.stopped["reason"] == "plateau"
    assert watch.stopped["steps_saved"] == 4
    assert watch.findings[-1].text == (
        "plateau: held-out accuracy rose 0.300 -> 0.550 by step 10, then 3 evaluations gained nothing more"
    )


def test_the_budget_spends_at_most_the_false_alarm_rate_over_every_test_of_a_run():
    for looks, kinds, plateau in [(0, 0, False), (2, 6, False), (10, 6, True), (30, 2, True), (1, 0, True)]:
        budget = Budget(looks, kinds, plateau)
        per_look = sum(budget.share(rule) * (kinds if rule == "forgetting" else 1) for rule in budget.rules)
        final = sum(budget.share(rule, final=True) * (kinds if rule == "forgetting" else 1) for rule in budget.rules)
        assert looks * per_look + final == pytest.approx(FALSE_ALARM_RATE), (looks, kinds, plateau)


def null_simulation():
    """benchmarks/watch_null.py as a module: its simulation of runs through the real RunWatch."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("watch_null", REPO / "benchmarks" / "watch_null.py")
    module = sys.modules.setdefault("watch_null", importlib.util.module_from_spec(spec))
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("rate", [0.3, 1.0])
def test_runs_that_learn_nothing_get_a_finding_in_at_most_5_percent(rate):
    """A GPU recipe's shape (300 held out, 200 periodic, 100 steps, every 10, six kinds), held-out accuracy never
    changing while the reward rises: the old rules (each look against the best so far, every kind at the nominal
    level) found hacking or forgetting in 40% of such runs, and plateau in all of them."""
    import numpy as np

    sim = null_simulation()
    shape, rng, model = sim.SHAPES["gpu, 100 steps"], np.random.default_rng(7), sim.tiny_adapter_model()
    runs = [sim.simulate(shape, rate, rng, model, stop_on=("plateau",)) for _ in range(300)]
    found = sum(any(k in r["found"] for k in ("hacking", "forgetting", "plateau")) for r in runs) / len(runs)
    kept = sum(r["kept"] for r in runs) / len(runs)
    assert found <= FALSE_ALARM_RATE + 0.03 and kept <= 0.08, (found, kept)  # 5% plus three standard errors


def test_stop_on_degraded_ends_training_at_the_finding_and_says_what_it_saved():
    watch = RunWatch(args(stop_on=["degraded"]))
    control = logged(watch, [{"reward": r} for r in (0.83, 0.07, 0.0, 0.0)])
    assert control.should_training_stop and watch.stopped["reason"] == "degraded: collapse"
    assert watch.stopped["step"] == 4 and watch.stopped["steps_saved"] == 8
    lines = watch_markdown({"watch": watch.summary()})
    assert any("stopped at step 4 (degraded: collapse): 8 steps not trained" in line for line in lines)
    off = RunWatch(args())  # reported, not stopped
    assert not logged(off, [{"reward": r} for r in (0.83, 0.07, 0.0, 0.0)]).should_training_stop and off.findings


@pytest.fixture(scope="module")
def adapter_model():
    from peft import LoraConfig, get_peft_model

    from hf_grpo.models.tiny import build_model, build_tokenizer

    model = build_model(build_tokenizer(), hidden_size=32)
    return get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False))


def lora_b(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for n, p in model.named_parameters() if "lora_B" in n])


def test_the_run_keeps_an_earlier_adapter_only_when_it_beats_the_last_by_the_exact_test(adapter_model, caplog):
    """The policy right after a warm start scored 0.490 and the collapsed last one ~0: the first is kept."""
    watch = RunWatch(args())
    at_start = lora_b(adapter_model).clone()
    watch.evaluated(0, evaluation(0, 49), adapter_model)
    with torch.no_grad():
        for name, param in adapter_model.named_parameters():
            if "lora_B" in name:
                param.add_(1.0)  # training moved the adapter
    assert watch.choose_kept(evaluation(4, 46)) is None  # not better beyond noise: the last stays
    kept = watch.choose_kept(evaluation(4, 2))
    assert kept["step"] == 0 and kept["last_step"] == 4 and kept["chosen_on"] == 100
    assert kept["against_last"]["p"] <= kept["against_last"]["alpha"] == 0.05  # one earlier evaluation
    assert not torch.equal(lora_b(adapter_model), at_start)
    watch.restore(adapter_model)
    assert torch.equal(lora_b(adapter_model), at_start)
    every_problem_chose = RunWatch(args(), judge_apart=False)  # nothing left to judge a kept adapter on
    every_problem_chose.evaluated(0, evaluation(0, 49), adapter_model)
    assert every_problem_chose.choose_kept(evaluation(4, 2)) is None
    assert "none is left to judge it on: the last state is kept" in caplog.text


def test_the_watch_state_survives_a_checkpoint_and_a_damaged_one_is_one_line(adapter_model, tmp_path):
    watch = RunWatch(args(stop_on=["degraded"]))
    watch.evaluated(0, evaluation(0, 49, kinds=dict.fromkeys(range(100), "a")), adapter_model)
    logged(watch, [{"reward": r} for r in (0.83, 0.07, 0.0, 0.0)])
    watch.evaluated(4, evaluation(4, 10), adapter_model)
    watch.save_state(tmp_path)
    again = RunWatch(args(stop_on=["degraded"]))
    assert again.load_state(tmp_path)
    assert [e.grades for e in again.evaluations] == [e.grades for e in watch.evaluations]
    assert again.best.step == 0 and again.evaluations[0].kinds[3] == "a" and again.stopped == watch.stopped
    assert again.summary() == watch.summary() and again.rewards == watch.rewards
    assert all(torch.equal(again.best.adapter[k], watch.best.adapter[k]) for k in watch.best.adapter)
    assert not RunWatch(args()).load_state(tmp_path / "nothing")
    (tmp_path / WATCH_STATE).write_text('{"rewards": []}')
    with pytest.raises(RunFileError, match=f"{WATCH_STATE} is not the run watch's state hf_grpo wrote"):
        RunWatch(args()).load_state(tmp_path)


def test_a_finding_stops_a_tiny_run_cleanly_and_every_output_names_it(tmp_path, caplog):
    """A floor no completion reaches: the watch finds it at step 2, the run ends there with its outputs, and the
    history, summary, plot and eval_results.json say why and what it saved."""
    import logging

    from hf_grpo.train import main

    out = tmp_path / "run"
    argv = [
        "recipes/tiny.yaml", "--output_dir", str(out), "--max_steps", "10", "--warm_start_steps", "20",
        "--arithmetic_train_size", "64", "--arithmetic_eval_size", "16", "--per_device_train_batch_size", "16",
        "--num_generations", "4", "--max_completion_length", "8", "--max_generation_batches", "2",
        "--task_eval_steps", "0", "--logging_steps", "1", "--report_to", "none",
        "--watch_floors", json.dumps({"completion_length": 1000}), "--stop_on", "[degraded]",
    ]  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="hf_grpo"):
        assert main(argv) == 0
    assert "watch: collapse (completion_length): completion length" in caplog.text
    assert "watch: stopping at step 2 (degraded: collapse; stop_on ['degraded']): 8 of max_steps 10" in caplog.text
    results = json.loads((out / "eval_results.json").read_text())
    assert results["watch"]["stopped"]["step"] == 2 and results["watch"]["findings"][0]["kind"] == "collapse"
    history = json.loads((out / "training_history.json").read_text())
    assert max(r["step"] for r in history) == 2 and any(r.get("watch", {}).get("kind") == "collapse" for r in history)
    summary = (out / "summary.md").read_text()
    assert "## Run watch" in summary and "stopped at step 2 (degraded: collapse)" in summary
    assert (out / "adapter_model.safetensors").is_file() and (out / "training_curves.png").is_file()


@pytest.mark.slow
def test_the_watch_and_its_evaluations_leave_the_training_stream_as_it_was(tmp_path):
    """The same tiny run with the watch and a held-out evaluation every step, and with neither: every step's loss,
    reward and gradient norm are the same bits, and so is the adapter (the greedy evaluations draw no random numbers
    and the adapter copies change no weight); the watched run's evaluations are in eval_results.json's seconds."""
    from safetensors.torch import load_file

    from hf_grpo.train import main

    common = [
        "recipes/tiny.yaml", "--max_steps", "3", "--warm_start_steps", "20", "--arithmetic_train_size", "64",
        "--arithmetic_eval_size", "16", "--per_device_train_batch_size", "16", "--num_generations", "4",
        "--max_completion_length", "8", "--max_generation_batches", "2", "--logging_steps", "1",
        "--report_to", "none", "--task_eval_max_samples", "8",
    ]  # fmt: skip
    watched, plain = tmp_path / "watched", tmp_path / "plain"
    assert main([*common, "--output_dir", str(watched), "--task_eval_steps", "1"]) == 0
    assert main([*common, "--output_dir", str(plain), "--task_eval_steps", "0", "--watch", "false"]) == 0

    def steps(out):
        history = json.loads((out / "training_history.json").read_text())
        return [(r["step"], r["loss"], r["reward"], r["grad_norm"]) for r in history if "reward" in r]

    assert len(steps(watched)) == 3 and steps(watched) == steps(plain)
    results = json.loads((watched / "eval_results.json").read_text())
    assert list(results["seconds"]) == ["before", "step1", "step2", "after"]  # step 3's is the one after training
    assert "watch" not in json.loads((plain / "eval_results.json").read_text())
    if "kept" not in results:  # else the watch kept an earlier adapter, which is its job
        a, b = (load_file(out / "adapter_model.safetensors") for out in (watched, plain))
        assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)
