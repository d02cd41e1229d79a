"""A training step survives a reward that hangs: the step completes within the timeout, and the counter shows it."""

from __future__ import annotations

import json
import time

from hf_grpo.train import train


def test_a_hanging_reward_costs_one_timeout_not_the_run(tmp_path):
    out = tmp_path / "run"
    start = time.monotonic()
    train(
        "recipes/tiny.yaml",
        output_dir=str(out),
        max_steps=2,
        warm_start_steps=30,
        per_device_train_batch_size=16,
        arithmetic_eval_size=8,
        logging_steps=1,
        dynamic_sampling=False,
        reward_funcs=["gsm8k_correctness", "tests.helpers.reward_plugins:hangs_once"],
        reward_kwargs={"tests.helpers.reward_plugins:hangs_once": {"marker": str(tmp_path / "hung")}},
        reward_timeout=3.0,
    )
    elapsed = time.monotonic() - start
    history = [r for r in json.loads((out / "training_history.json").read_text()) if "reward" in r]
    assert [r["step"] for r in history] == [1, 2]
    assert history[0]["rewards/hangs_once/timeouts"] == 1.0 and history[1]["rewards/hangs_once/timeouts"] == 0.0
    # one completion waited for its timeout (not less: its deadline), the rest were scored, not held up (30 s: load)
    assert 3.0 <= history[0]["time/reward"] < 3.0 + 30, history[0]
    assert history[1]["rewards/hangs_once/mean"] == 1.0
    assert elapsed < 300
