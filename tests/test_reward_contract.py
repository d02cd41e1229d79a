"""A reward function is called exactly as TRL calls it, isolated or not, and a reward that fails on
every completion stops the run. The rewards are TRL's own (``trl.rewards``), an Unsloth-style one reading a dataset
column by keyword, and one that uses ``trainer_state``, ``log_metric`` and ``log_extra``; the datasets are TRL-format
JSONL files, standard and conversational, with extra columns. TRL's own ``_calculate_rewards`` makes the calls."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch

from hf_grpo.data import DataArguments, load_grpo_datasets
from hf_grpo.models.tiny import build_model, build_tokenizer
from hf_grpo.rewards import RewardArguments, load_reward_funcs
from hf_grpo.train import main
from hf_grpo.training.trainer import GRPOTrainer

from .helpers.trainers import make_trainer


PROBLEMS = [(2, 3), (7, 8), (12, 30), (9, 9)]
# one right, one wrong, one with a <think> block, one without a number
ANSWERS = ["The answer is $\\boxed{{{s}}}$", "I think it is {w}", "<think>easy</think> {s}", "no idea"]


def write_dataset(path, conversational: bool):
    with open(path, "w") as f:
        for level, (a, b) in enumerate(PROBLEMS, start=1):
            question = f"What is {a} + {b}?"
            prompt = [{"role": "user", "content": question}] if conversational else question
            row = {"prompt": prompt, "solution": str(a + b), "answer": f"#### {a + b}", "level": level}
            f.write(json.dumps(row) + "\n")
    return path


def completions_for(rows, conversational: bool):
    texts = []
    for row in rows:
        gold = int(row["solution"])
        texts += [t.format(s=gold, w=gold + 1) for t in ANSWERS]
    return [[{"role": "assistant", "content": t}] for t in texts] if conversational else texts


REWARDS = {
    False: [
        "tests.helpers.reward_plugins:unsloth_answer",
        "tests.helpers.reward_plugins:logs_everything",
        "gsm8k_correctness",
    ],
    True: [
        "trl.rewards:accuracy_reward",
        "trl.rewards:think_format_reward",
        "tests.helpers.reward_plugins:unsloth_answer",
        "tests.helpers.reward_plugins:logs_everything",
    ],
}


def score(tmp_path, conversational: bool, isolated: bool):
    """Rewards, logged metrics and extra columns of one TRL ``_calculate_rewards`` call on the dataset's rows."""
    data = write_dataset(tmp_path / f"data-{conversational}.jsonl", conversational)
    style = "chat" if conversational else "plain"  # plain: a string prompt stays a string (TRL's standard format)
    train, _ = load_grpo_datasets(DataArguments(dataset_name=str(data), task="gsm8k", prompt_style=style))
    funcs = load_reward_funcs(RewardArguments(reward_funcs=REWARDS[conversational], reward_isolation=isolated))
    tokenizer = build_tokenizer()
    trainer = make_trainer(
        tmp_path / f"out-{conversational}-{isolated}",
        tokenizer=tokenizer,
        reward_funcs=funcs,
        train_dataset=train,
        per_device_train_batch_size=16,
    )
    trainer.state.global_step = 7
    rows = [row for row in train for _ in ANSWERS]  # each prompt repeated per completion, as TRL's sampler does
    completions = completions_for(list(train), conversational)
    prompts = [row["prompt"] for row in rows]
    ids = [tokenizer(c if isinstance(c, str) else c[0]["content"])["input_ids"] for c in completions]
    try:
        rewards = trainer._calculate_rewards(rows, prompts, completions, ids)
    finally:
        for f in funcs:
            if hasattr(f, "pool"):
                f.pool.close()
    metrics = {k: v for k, v in trainer._pending_metrics.items() if not k.startswith("rewards/")}
    return rewards, metrics, dict(trainer._pending_extra_logs), train


@pytest.mark.parametrize("conversational", [False, True], ids=["standard", "conversational"])
def test_isolated_rewards_get_what_trl_passes_and_return_what_in_process_returns(tmp_path, conversational):
    inline, inline_metrics, inline_extra, train = score(tmp_path, conversational, isolated=False)
    isolated, isolated_metrics, isolated_extra, _ = score(tmp_path, conversational, isolated=True)
    # the dataset's own columns and format reach the rewards
    assert set(train.column_names) >= {"prompt", "solution", "answer", "level"}
    assert isinstance(train[0]["prompt"], list) == conversational
    torch.testing.assert_close(isolated, inline, equal_nan=True)
    names = REWARDS[conversational]
    unsloth = inline[:, names.index("tests.helpers.reward_plugins:unsloth_answer")]
    assert unsloth.tolist() == [2.0, 0.0, 2.0, 0.0] * len(PROBLEMS)  # the `answer` column arrived
    logged = inline[:, names.index("tests.helpers.reward_plugins:logs_everything")]
    expected = [level / 10 + 7 / 1000 for level in range(1, len(PROBLEMS) + 1) for _ in ANSWERS]
    assert logged.tolist() == pytest.approx(expected)  # `level` and trainer_state.global_step arrived
    # what the rewards logged reaches the trainer: the same metric value and the same extra column
    assert inline_metrics.keys() == isolated_metrics.keys() and "contract/mean_length" in inline_metrics
    for name in inline_metrics:
        assert isolated_metrics[name] == pytest.approx(inline_metrics[name]), name
    assert isolated_extra["contract_level"] == inline_extra["contract_level"]
    assert len(inline_extra["contract_level"]) == len(PROBLEMS) * len(ANSWERS)
    if conversational:  # TRL's accuracy_reward logs its own extra columns through log_extra
        trl_columns = set(inline_extra) - {"contract_level"}
        assert trl_columns and all(isolated_extra[c] == inline_extra[c] for c in trl_columns), trl_columns
        accuracy = inline[:, names.index("trl.rewards:accuracy_reward")].tolist()
        assert accuracy[:2] == [1.0, 0.0] and not any(math.isnan(a) for a in accuracy)


RUN = [
    "recipes/tiny.yaml", "--warm_start_steps", "0", "--per_device_train_batch_size", "8", "--num_generations", "4",
    "--max_completion_length", "8", "--eval_before_after", "false", "--logging_steps", "1", "--task", "gsm8k",
    "--save_strategy", "no", "--report_to", "none",
]  # fmt: skip


def train_here(capfd, caplog, *args: str) -> tuple[int, str]:
    """``python -m hf_grpo.train`` with ``RUN`` and ``args``, run in this process (these runs are about what the
    rewards get and return, not about processes): its exit status, and what it and its reward workers printed (file
    descriptor 2) and logged."""
    code = main([*RUN, *args])
    return code, capfd.readouterr().err + caplog.text


@pytest.mark.slow  # a whole run: the second tier (pyproject.toml)
def test_a_logged_metric_reaches_the_training_history_and_infinite_rewards_are_counted_and_left_out(
    tmp_path, capfd, caplog
):
    """One run, two rewards under test beside TRL's own and ours. A metric a reward logs (``log_metric``) reaches
    the training history at every step. ±inf rewards zeroed every loss (nothing learned) without a counter, and the
    report crashed: now they are counted per reward (``rewards/<name>/nonfinite``), left out of the reward, said once,
    and the run ends with its summary."""
    data = write_dataset(tmp_path / "data.jsonl", conversational=True)
    out = tmp_path / "run"
    rewards = [
        "trl.rewards:accuracy_reward", "tests.helpers.reward_plugins:logs_everything", "gsm8k_correctness",
        "tests.helpers.reward_plugins:partly_infinite",
    ]  # fmt: skip
    code, err = train_here(
        capfd, caplog, "--dataset_name", str(data), "--output_dir", str(out), "--max_steps", "2",
        "--dynamic_sampling", "false", "--reward_funcs", f"[{', '.join(rewards)}]",
    )  # fmt: skip
    assert code == 0, err[-3000:]
    history = [r for r in json.loads((out / "training_history.json").read_text()) if "reward" in r]
    assert [r["step"] for r in history] == [1, 2] and all(r["contract/mean_length"] > 0 for r in history)
    for record in history:
        assert record["rewards/partly_infinite/nonfinite"] > 0 and record["rewards/gsm8k_correctness/nonfinite"] == 0
        assert math.isfinite(record["reward"]) and math.isfinite(record["rewards/partly_infinite/mean"])
    assert "returned ±inf" in err and (out / "summary.md").is_file()


@pytest.mark.slow  # a whole run: the second tier (pyproject.toml)
def test_a_reward_that_fails_on_every_completion_stops_the_run(tmp_path, capfd, caplog):
    data = write_dataset(tmp_path / "data.jsonl", conversational=False)
    out = tmp_path / "run"
    code, err = train_here(
        capfd, caplog, "--dataset_name", str(data), "--output_dir", str(out), "--max_steps", "50",
        "--dynamic_sampling", "false", "--reward_max_failed_calls", "2",
        "--reward_funcs", "[gsm8k_correctness, tests.helpers.reward_plugins:wrong_signature]",
    )  # fmt: skip
    assert code == 1, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("hf_grpo: error:")]
    assert len(errors) == 1, err[-3000:]
    assert "reward 'wrong_signature' failed on every completion of 2 consecutive calls" in errors[0]
    assert "TypeError" in errors[0] and "unexpected keyword argument" in errors[0] and "completions=" in errors[0]
    history = (
        json.loads((out / "training_history.json").read_text()) if (out / "training_history.json").exists() else []
    )
    assert max((r.get("step", 0) for r in history), default=0) <= 2  # stopped at once, not after 50 steps


def test_a_gold_column_in_another_tasks_format_is_named_when_the_data_loads(tmp_path, caplog):
    """A MATH-style gold under task gsm8k was graded against its first number, silently."""
    path = tmp_path / "math_gold.jsonl"
    rows = [
        {"prompt": f"What is {i} + 7?", "solution": f"{i} + 7 = {i + 7}, so $\\boxed{{{i + 7}}}$"} for i in range(9)
    ]
    rows.append({"prompt": "What is 1 + 1?", "solution": "#### 2"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with caplog.at_level(logging.WARNING, logger="hf_grpo.data.loaders"):
        train, _ = load_grpo_datasets(DataArguments(dataset_name=str(path), task="gsm8k"))
    mismatch = [r.message for r in caplog.records if "sampled gold answers" in r.message]
    assert len(mismatch) == 1 and "9 of 10" in mismatch[0] and "look like math" in mismatch[0]
    assert train["solution"] == ["#### 2"]  # the unreadable rows are dropped (and counted), not graded as 8


def test_reward_models_and_async_rewards_beside_isolated_ones_work_as_in_trl(tmp_path):
    """A ``PreTrainedModel`` in ``reward_funcs`` (TRL scores prompt + completion with it) and an async
    reward (awaited by TRL) keep working next to isolated rewards."""
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    from .helpers import reward_plugins

    data = write_dataset(tmp_path / "data.jsonl", conversational=False)
    train, _ = load_grpo_datasets(DataArguments(dataset_name=str(data), task="gsm8k", prompt_style="plain"))
    tokenizer = build_tokenizer()
    policy = build_model(tokenizer, hidden_size=32)
    config = Qwen2Config(**{**policy.config.to_dict(), "num_labels": 1})
    torch.manual_seed(0)
    scorer = Qwen2ForSequenceClassification(config).eval()
    isolated = load_reward_funcs(RewardArguments(reward_funcs=["tests.helpers.reward_plugins:unsloth_answer"]))
    trainer = make_trainer(
        tmp_path / "out",
        model=policy,
        tokenizer=tokenizer,
        reward_funcs=[*isolated, scorer, reward_plugins.async_reward],
        reward_processing_classes=[None, tokenizer, None],
        train_dataset=train,
        per_device_train_batch_size=16,
    )
    rows = [row for row in train for _ in ANSWERS]
    completions = completions_for(list(train), conversational=False)
    ids = [tokenizer(c)["input_ids"] for c in completions]
    try:
        rewards = trainer._calculate_rewards(rows, [r["prompt"] for r in rows], completions, ids)
    finally:
        isolated[0].pool.close()
    assert rewards[:, 0].tolist() == [2.0, 0.0, 2.0, 0.0] * len(PROBLEMS)
    texts = [r["prompt"] + c for r, c in zip(rows, completions, strict=True)]
    batch = tokenizer(texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
    with torch.inference_mode():  # the trainer placed the scorer on its device (a GPU where there is one)
        expected = scorer(**batch.to(scorer.device)).logits[:, 0].to(rewards.device)
    torch.testing.assert_close(rewards[:, 1], expected)
    assert rewards[:, 2].tolist() == [1.0] * len(rows)


@pytest.mark.slow  # a whole run: the second tier (pyproject.toml)
def test_rewards_that_are_all_none_stop_the_run_with_a_summary(tmp_path, capfd, caplog):
    """A run whose rewards were all None logged an error per batch, trained on nothing to the end and then
    died in write_report (TypeError on a None reward): exit 1, no summary.md."""
    out = tmp_path / "run"
    code, err = train_here(
        capfd, caplog, "--output_dir", str(out), "--max_steps", "30", "--arithmetic_train_size", "64",
        "--arithmetic_eval_size", "8", "--reward_funcs", "[tests.helpers.reward_plugins:always_none]",
    )  # fmt: skip
    assert code == 1, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("hf_grpo: error:")]
    assert len(errors) == 1 and "no completion got a reward in 3 consecutive batches" in errors[0], errors
    assert "always_none" in errors[0] and "Traceback" not in err
    summary = (out / "summary.md").read_text()
    assert "reward: n/a" in summary or "Training summary" in summary


def test_nan_rewards_are_counted_as_nonfinite_and_left_out():
    """TRL turns None into NaN, so a reward returning NaN was left out without a count. An isolated
    reward tells the two apart; the trainer adds its NaNs to rewards/<name>/nonfinite (gathered over processes)."""
    import types

    from .helpers import reward_plugins

    funcs = load_reward_funcs(RewardArguments(reward_funcs=["tests.helpers.reward_plugins:nan_for_odd_lengths"]))
    try:
        completions = ["ab", "abc", "abcd", "a"]
        assert funcs[0](prompts=["p"] * 4, completions=completions) == [1.0, None, 1.0, None]
        assert funcs[0].last_nan == 2
        assert math.isnan(reward_plugins.nan_for_odd_lengths(completions)[1])  # what the function itself returns

        recorded = {}
        fake = types.SimpleNamespace(
            reward_funcs=funcs,
            reward_func_names=["nan_for_odd_lengths"],
            accelerator=types.SimpleNamespace(gather=lambda t: torch.cat([t, t])),  # two processes, the same counts
            model=types.SimpleNamespace(training=True),
            record_metric=lambda name, value, mode: recorded.__setitem__(name, value),
            _warned_infinite=set(),
            state=types.SimpleNamespace(global_step=0),
        )
        rewards = torch.tensor([[1.0], [math.nan], [math.inf], [math.nan]])  # [B*G global, F]: NaNs are the None's
        out = GRPOTrainer._drop_infinite(fake, rewards)
        assert recorded["rewards/nan_for_odd_lengths/nonfinite"] == 1 + 2 * 2  # one inf, two NaN on each process
        assert torch.isnan(out[2, 0]) and funcs[0].last_nan == 0  # inf left out; the count is taken once
    finally:
        funcs[0].pool.close()
