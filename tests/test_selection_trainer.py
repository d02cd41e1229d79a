"""Prompt selection inside the trainer (``prompt_selection: true``): prompts whose groups gave no signal are skipped
before generation, the history is logged, and a resumed run continues exactly (on 2 processes, from the command line:
tests/test_launch_resume.py).

The reward is scripted from the prompt alone (``third_varying``: 0/1 alternating for a prompt whose first number is a
multiple of 3, else 0 for every sample), so which groups carry a signal, and so every selection decision, does not
depend on what the model writes or on the machine's floating point."""

from __future__ import annotations

import copy
import json
import re

import pytest

from hf_grpo.data import DataArguments, load_grpo_datasets
from hf_grpo.models.tiny import build_model, build_tokenizer
from hf_grpo.training.prompt_selection import Record, prompt_key
from hf_grpo.training.trainer import GRPOTrainer
from hf_grpo.training.warm_start import warm_start

from .helpers.common import tiny_config
from .helpers.overlap_run import make_overlap_trainer
from .helpers.reward_scripts import third_varying
from .helpers.trainers import make_trainer, one_torch_thread  # noqa: F401  (an autouse fixture)


@pytest.fixture(scope="module")
def tiny():
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, hidden_size=64)
    warm_start(model, tokenizer, steps=20)
    train, _ = load_grpo_datasets(DataArguments(arithmetic_train_size=12, arithmetic_eval_size=8))
    return model, tokenizer, train


def no_signal(prompt) -> bool:
    text = prompt if isinstance(prompt, str) else prompt[-1]["content"]
    return int(re.search(r"\d+", text).group(0)) % 3 != 0


def run(tiny, tmp_path, selection: bool) -> tuple[GRPOTrainer, list[list[bool]]]:
    """12 steps of 2 prompts x 4 samples; the prompts each round generated, as no-signal flags. With selection, the
    history starts as if every no-signal prompt had given 8 empty groups in a row (skip probability 0.95), and does
    not adapt, so that what is generated shows the skipping itself."""
    model, tokenizer, train = tiny
    trainer = make_trainer(
        tmp_path,
        model=copy.deepcopy(model),
        tokenizer=tokenizer,
        reward_funcs=third_varying,
        train_dataset=train,
        per_device_train_batch_size=8,
        max_completion_length=8,
        max_steps=12,
        dynamic_sampling=True,
        max_generation_batches=6,
        prompt_selection=selection,
    )
    if selection:
        history = trainer._sampler.selector.history
        history.rate = 0.0
        for row in train:
            if no_signal(row["prompt"]):
                history.records[prompt_key(row["prompt"])] = Record(streak=8, kind="failed")
    rounds, score = [], trainer._score

    def spy(inputs, mode):
        rounds.append([no_signal(row["prompt"]) for row in inputs[:: trainer.num_generations]])
        return score(inputs, mode)

    trainer._score = spy
    trainer.train()
    return trainer, rounds


@pytest.mark.slow  # two 12-step runs, ~1 min: the second tier
def test_prompts_without_signal_are_skipped_before_generation(tiny, tmp_path):
    _, plain_rounds = run(tiny, tmp_path / "plain", selection=False)
    selected, selected_rounds = run(tiny, tmp_path / "selected", selection=True)
    wasted = [sum(map(sum, rounds)) / sum(map(len, rounds)) for rounds in (plain_rounds, selected_rounds)]
    assert wasted[0] > 0.3, f"the scripted reward should waste many groups without selection: {wasted}"
    assert wasted[1] < wasted[0] / 2, f"share of no-signal groups generated, without and with selection: {wasted}"
    assert len(selected_rounds) < len(plain_rounds), "selection should need fewer generation rounds"
    logs = [r for r in selected.state.log_history if "selection/skipped" in r]
    assert len(logs) == 12 and sum(r["selection/skipped"] for r in logs) > 0
    assert logs[-1]["selection/history_size"] == len(selected._sampler.selector.history.records) == 12
    assert logs[-1]["selection/long_streaks"] >= 1 and logs[-1]["selection/explore_failed"] == 0.5
    signal = [r for r in selected._sampler.selector.history.records.values() if r.streak == 0]
    assert signal, "the prompts with a signal are recorded with no streak"


def test_selection_needs_dynamic_sampling(tmp_path):
    with pytest.raises(ValueError, match="prompt_selection needs dynamic_sampling"):
        tiny_config(tmp_path, prompt_selection=True)


@pytest.mark.slow
def test_a_resumed_run_reaches_the_uninterrupted_runs_parameters_and_history(tmp_path):
    """tests/scripts/selection_resume_check.py on one process, run here: straight through, then stopped after
    checkpoint-3 and resumed from it; the resumed run ends with the same parameters, reward history, prompt stream
    and skips. On 2 processes, from the command line and after a stop signal: tests/test_launch_resume.py."""
    from .scripts import selection_resume_check

    out = tmp_path / "reports.json"
    selection_resume_check.main(str(out), str(tmp_path / "runs"), 1)
    (rank,) = json.loads(out.read_text())
    straight, stopped, resumed = rank["straight"], rank["stopped"], rank["resumed"]
    assert sum(stopped["skipped"]) > 0, "nothing was skipped before the stop: the resumed history did not matter"
    assert resumed["params"] == straight["params"], "the resumed run's parameters differ"
    assert resumed["history"] == straight["history"] and resumed["stream"] == straight["stream"]
    after = len(straight["skipped"]) - len(stopped["skipped"])  # the steps trained after the resume
    assert resumed["skipped"][-after:] == straight["skipped"][-after:]


@pytest.mark.slow
def test_overlapped_generation_with_selection_trains_within_the_staleness_bound(policy_dir, tmp_path):
    """With generation.overlap the first round is sent ahead before it can be selected; the further rounds are
    selected, and the run trains to the end with the lag bound kept (the stand-in server, tests/helpers)."""
    with make_overlap_trainer(
        policy_dir,
        tmp_path,
        reward=third_varying,
        dynamic_sampling=True,
        max_generation_batches=4,
        max_steps=6,
        prompt_selection=True,
    ) as (trainer, _):
        trainer.train()
    assert trainer.state.global_step == 6
    skipped = [r["selection/skipped"] for r in trainer.state.log_history if "selection/skipped" in r]
    assert len(skipped) == 6 and trainer._sampler.selector.history.records
    assert all(r.get("async/staleness_max", 0) <= 1 for r in trainer.state.log_history)
