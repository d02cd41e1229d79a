"""Tiny-trainer tests of hf_grpo.GRPOTrainer: dynamic sampling (filter, fill, carry-over), the leave-one-out
baseline, metrics, and exact resume."""

from __future__ import annotations

import copy
import itertools
import types

import pytest
import torch
from transformers import TrainerCallback

from hf_grpo.config import HfGRPOConfig
from hf_grpo.data import DataArguments, load_grpo_datasets
from hf_grpo.models.tiny import build_model, build_tokenizer
from hf_grpo.rewards.functions import gsm8k_correctness
from hf_grpo.training.trainer import GRPOTrainer
from hf_grpo.training.warm_start import warm_start

from .helpers import reward_scripts, trainers
from .helpers.callbacks import StopAt
from .helpers.common import tiny_config


@pytest.fixture(scope="module")
def tiny():
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, hidden_size=64)
    warm_start(model, tokenizer, steps=60)
    train, _ = load_grpo_datasets(DataArguments(arithmetic_train_size=256, arithmetic_eval_size=8))
    return model, tokenizer, train


def make_trainer(tiny, tmp_path, reward=gsm8k_correctness, **overrides) -> GRPOTrainer:
    """A trainer of a copy of the warm-started tiny model (``tests/helpers/trainers.make_trainer``)."""
    model, tokenizer, train = tiny
    return trainers.make_trainer(
        tmp_path,
        model=copy.deepcopy(model),
        tokenizer=tokenizer,
        reward_funcs=reward,
        train_dataset=train,
        **overrides,
    )


def trainable(trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


def logged(trainer, key):
    return [r[key] for r in trainer.state.log_history if key in r]


def capture_batches(trainer) -> list[dict]:
    batches, original = [], trainer._sampler.batch

    def spy(*args, **kwargs):
        batch, metrics = original(*args, **kwargs)
        batches.append(batch)
        return batch, metrics

    trainer._sampler.batch = spy
    return batches


def test_parameters_change_and_metrics_are_logged(tiny, tmp_path):
    trainer = make_trainer(tiny, tmp_path)
    before = trainable(trainer)
    trainer.train()
    after = trainable(trainer)
    assert any(not torch.equal(before[n], after[n]) for n in before if "lora_B" in n)
    record = trainer.state.log_history[0]
    for key in (
        "reward",
        "reward_std",
        "rewards/gsm8k_correctness/mean",
        "accuracy",
        "grade/unparseable",
        "advantage/mean",
        "advantage/std",
        "entropy",
        "frac_reward_zero_std",
        "clip_ratio/region_mean",
        "time/generate",
        "time/reward",
        "time/train",
        "time/step",
    ):
        assert key in record, key
    assert record["time/generate"] > 0 and record["time/train"] > 0


def test_evaluation_time_is_not_counted_as_training_time(tiny, tmp_path, monkeypatch):
    """TRL's prediction_step goes through _generate / _calculate_rewards; that time used to land in
    the next training step's time/*. Here evaluation's reward takes ``eval_s`` (1000 s) on the trainer's clock, moved
    forward instead of slept; training's takes no such time, so a training record holding it holds evaluation's."""
    import time

    from hf_grpo.training import trainer as trainer_module

    eval_s, offset = 1000.0, [0.0]
    clock = types.SimpleNamespace(perf_counter=lambda: time.perf_counter() + offset[0])
    monkeypatch.setattr(trainer_module, "time", clock)  # the trainer's time/* clock (it reads only perf_counter)
    train = tiny[2]
    holder = {}

    def slow_in_eval(prompts, completions, **kwargs):
        if not holder["trainer"].model.training:
            offset[0] += eval_s
        return reward_scripts.alternating(prompts, completions)

    trainer = make_trainer(
        tiny,
        tmp_path,
        reward=slow_in_eval,
        eval_dataset=train.select(range(4)),
        max_steps=2,
        eval_strategy="steps",
        eval_steps=1,
        per_device_eval_batch_size=16,
    )
    holder["trainer"] = trainer
    trainer.train()
    train_records = [r for r in trainer.state.log_history if "time/step" in r]
    assert [r["step"] for r in train_records] == [1, 2]
    assert any("eval_loss" in r or "eval_reward" in r for r in trainer.state.log_history), "no evaluation ran"
    assert offset[0] >= eval_s  # evaluation's reward ran, after step 1
    assert train_records[1]["time/reward"] < eval_s / 2, train_records[1]
    assert train_records[1]["time/step"] < eval_s / 2, train_records


def test_dynamic_sampling_trains_only_on_groups_with_signal(tiny, tmp_path):
    trainer = make_trainer(
        tiny,
        tmp_path,
        reward=reward_scripts.half_varying,
        dynamic_sampling=True,
        max_generation_batches=10,
        max_steps=4,
    )
    batches = capture_batches(trainer)
    trainer.train()
    assert len(batches) == 4
    for batch in batches:
        assert batch["completion_ids"].size(0) == 16  # the batch is always exactly full
        grouped = batch["advantages"].view(-1, 4)
        assert (grouped.abs().sum(dim=1) > 0).all(), "a zero-variance group reached the optimizer"
    rounds = logged(trainer, "dynamic_sampling/rounds")
    assert max(rounds) > 1  # about half the groups are dropped, so extra rounds were needed
    kept = logged(trainer, "dynamic_sampling/kept_fraction")
    assert all(0 < f < 1 for f in kept) and 0.2 < sum(kept) / len(kept) < 0.8
    assert logged(trainer, "dynamic_sampling/exhausted") == [0.0] * 4
    assert any(c > 0 for c in logged(trainer, "dynamic_sampling/carry_out")), "surplus groups were not carried"
    assert all(g >= 1.0 for g in logged(trainer, "dynamic_sampling/generated_per_trained"))


def rows(prompt_ids, prompt_mask, completion_ids, completion_mask) -> list[tuple]:
    """Each row's unpadded prompt and completion tokens: how a group is recognised in a later, re-padded batch."""
    return [
        (tuple(p[pm.bool()].tolist()), tuple(c[cm.bool()].tolist()))
        for p, pm, c, cm in zip(prompt_ids, prompt_mask, completion_ids, completion_mask, strict=True)
    ]


@torch.no_grad()
def policy_logps(trainer, params: dict, batch: dict) -> torch.Tensor:
    """Per-token log-probabilities of ``batch``'s completions under the adapter ``params`` (our own forward pass)."""
    model = trainer.model
    for name, p in model.named_parameters():
        if name in params:
            p.copy_(params[name])
    model.eval()
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)  # [B, P+C]
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)  # [B, P+C]
    width = batch["completion_ids"].size(1)
    logits = model(input_ids=ids, attention_mask=mask).logits[:, -width - 1 : -1] / trainer.temperature  # [B, C, V]
    return logits.log_softmax(-1).gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)  # [B, C]


def test_carried_groups_keep_their_generating_policy_log_probs(tiny, tmp_path):
    """A group carried to the next step is trained with the log-probs of the policy that generated it (pi_old of
    the previous step), the fresh groups beside it with the current policy's: recomputed here by our own forward pass
    under each step's saved adapter."""
    trainer = make_trainer(tiny, tmp_path, reward=reward_scripts.half_varying, dynamic_sampling=True, max_steps=3)
    seen, original = [], trainer._sampler.batch  # (adapter when assembled, batch, rows carried out of the step)

    def spy(*args, **kwargs):
        params = trainable(trainer)
        batch, metrics = original(*args, **kwargs)
        carry = set()
        for g in trainer._sampler.pool.groups:
            carry |= set(rows(g["prompt_ids"], g["prompt_mask"], g["completion_ids"], g["completion_mask"]))
        seen.append((params, {k: v.detach().clone() for k, v in batch.items() if torch.is_tensor(v)}, carry))
        return batch, metrics

    trainer._sampler.batch = spy
    trainer.train()
    checked = 0
    for (old_params, _, carried), (params, batch, _) in itertools.pairwise(seen):
        if "old_per_token_logps" not in batch:
            continue
        keys = rows(batch["prompt_ids"], batch["prompt_mask"], batch["completion_ids"], batch["completion_mask"])
        is_carried = torch.tensor([k in carried for k in keys], device=batch["completion_mask"].device)  # [B]
        assert is_carried.any() and not is_carried.all(), "the batch should mix carried and fresh groups"
        mask = batch["completion_mask"].bool()  # [B, C]
        stored = batch["old_per_token_logps"]  # [B, C]
        generating, current = policy_logps(trainer, old_params, batch), policy_logps(trainer, params, batch)
        for row in range(stored.size(0)):
            expected = generating[row] if is_carried[row] else current[row]
            torch.testing.assert_close(stored[row][mask[row]], expected[mask[row]], atol=1e-4, rtol=1e-4)
        moved = (generating - current)[is_carried.unsqueeze(1) & mask].abs().max()
        assert moved > 1e-3, "the policy did not move between the steps: the check could not tell them apart"
        checked += 1
    assert checked, "no batch mixed carried and fresh groups"


def test_the_kl_reference_runs_once_a_step_on_the_batch_and_trains_as_trls_per_round_pass(tiny, tmp_path):
    """With beta > 0 TRL runs the reference over every dynamic-sampling round, the dropped groups' too; ours runs it
    once on the batch that trains (hf_grpo/training/batch_logps.py). The same run with TRL's per-round pass trains on the same
    batches, the reference log-probs equal to 1e-5, and logs the same losses and KL."""
    from hf_grpo.training import batch_logps

    runs = []
    for defer in (True, False):
        trainer = make_trainer(
            tiny, tmp_path / str(defer), reward=reward_scripts.half_varying, dynamic_sampling=True, max_steps=3,
            beta=0.2, max_generation_batches=10,
        )  # fmt: skip
        assert trainer._defer_reference  # the default with a KL term: switched off here for TRL's path
        trainer._defer_reference = defer
        passes = []

        def counted(trainer, batch, passes=passes, original=batch_logps.reference_logps):
            passes.append(1)
            return original(trainer, batch)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(batch_logps, "reference_logps", counted)
            batches = capture_batches(trainer)
            trainer.train()
        runs.append((trainer, batches, len(passes)))
    (ours, our_batches, our_passes), (trls, trl_batches, trl_passes) = runs
    assert sum(logged(ours, "dynamic_sampling/rounds")) > 3, "every step took one round: nothing to save"
    assert our_passes == 3 and trl_passes == 0  # TRL's per-round pass is inline in TRL, not this function
    for a, b in zip(our_batches, trl_batches, strict=True):
        assert a.keys() == b.keys()
        mask = a["completion_mask"].bool()
        torch.testing.assert_close(a["ref_per_token_logps"][mask], b["ref_per_token_logps"][mask], atol=1e-5, rtol=0)
        for key in a.keys() - {"ref_per_token_logps"}:
            assert torch.equal(a[key], b[key]) if torch.is_tensor(a[key]) else a[key] == b[key], key
    for key in ("loss", "kl", "grad_norm"):
        assert logged(ours, key) == pytest.approx(logged(trls, key), rel=1e-4, abs=1e-6), key
    assert max(logged(ours, "kl")) > 0  # the policy moved off the reference after step 1


@pytest.mark.parametrize("reward", [reward_scripts.always_zero, reward_scripts.always_one], ids=["all0", "all1"])
def test_exhausted_budget_fills_with_zero_advantage_groups(tiny, tmp_path, reward):
    trainer = make_trainer(tiny, tmp_path, reward=reward, dynamic_sampling=True, max_generation_batches=3)
    before = trainable(trainer)
    trainer.train()
    assert logged(trainer, "dynamic_sampling/exhausted") == [1.0, 1.0, 1.0]
    assert logged(trainer, "dynamic_sampling/rounds") == [3, 3, 3]
    after = trainable(trainer)
    assert all(torch.equal(before[n], after[n]) for n in before), "zero-advantage fill must not move the policy"


def test_filled_groups_add_no_kl_gradient_and_no_loss_tokens(tiny, tmp_path):
    """Zero-advantage fill groups still added KL gradient (beta > 0) and, under dapo, tokens to the loss
    normaliser. Step 1 moves the adapter (rewards vary); steps 2-3 are filled entirely (rewards all 0). With plain SGD
    (no momentum) and the fill groups out of the loss, steps 2-3 must leave the adapter where step 1 put it."""
    holder = {}

    def varies_then_flat(prompts, completions, **kwargs):
        if holder["trainer"].state.global_step == 0:
            return reward_scripts.alternating(prompts, completions)
        return [0.0] * len(prompts)

    trainer = make_trainer(
        tiny,
        tmp_path,
        reward=varies_then_flat,
        dynamic_sampling=True,
        max_generation_batches=2,
        beta=0.05,
        loss_type="dapo",
        optim="sgd",
        learning_rate=0.5,
    )
    holder["trainer"] = trainer
    batches, snapshots = capture_batches(trainer), []

    class Snapshot(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            snapshots.append(trainable(trainer))

    trainer.add_callback(Snapshot())
    start = trainable(trainer)
    trainer.train()
    assert logged(trainer, "dynamic_sampling/exhausted") == [0.0, 1.0, 1.0]
    assert any(not torch.equal(start[n], snapshots[0][n]) for n in start), "step 1 should have moved the adapter"
    assert all(torch.equal(snapshots[0][n], snapshots[2][n]) for n in snapshots[0]), "fill groups moved the policy"
    assert int(batches[1]["completion_mask"].sum()) == 0 and int(batches[1]["num_items_in_batch"]) == 0
    assert int(batches[0]["completion_mask"].sum()) > 0


def test_exhausted_budget_can_stop_the_run(tiny, tmp_path):
    trainer = make_trainer(
        tiny,
        tmp_path,
        reward=reward_scripts.always_zero,
        dynamic_sampling=True,
        max_generation_batches=2,
        dynamic_sampling_exhausted="error",
    )
    with pytest.raises(RuntimeError, match="max_generation_batches=2"):
        trainer.train()


def test_dynamic_sampling_can_filter_on_one_reward_function(tiny, tmp_path):
    # the total reward always varies (half_varying), but the filter looks at always_zero only: everything dropped
    trainer = make_trainer(
        tiny,
        tmp_path,
        reward=[reward_scripts.half_varying, reward_scripts.always_zero],
        dynamic_sampling=True,
        dynamic_sampling_metric="always_zero",
        max_generation_batches=2,
        max_steps=1,
    )
    trainer.train()
    assert logged(trainer, "dynamic_sampling/kept_fraction") == [0.0]


def test_rloo_advantages_are_leave_one_out(tiny, tmp_path):
    trainer = make_trainer(
        tiny,
        tmp_path,
        reward=reward_scripts.half_varying,
        advantage_estimator="rloo",
        scale_rewards="none",
        max_steps=1,
    )
    outputs = []
    original = trainer._score
    trainer._score = lambda inputs, mode: outputs.append(original(inputs, mode)) or outputs[-1]
    trainer.train()
    output, _ = outputs[0]  # (scored batch, rewards)
    grouped = output["advantages"].view(-1, 4)
    for row in grouped:  # rewards 0, 1, 0, 1 -> baselines 2/3, 1/3, 2/3, 1/3
        assert row.tolist() in (pytest.approx([-2 / 3, 2 / 3, -2 / 3, 2 / 3]), pytest.approx([0.0] * 4))
    # the completions table (TRL's _logs, written before our advantages replace TRL's) shows the trained advantages
    assert list(trainer._logs["advantages"]) == pytest.approx(output["advantages"].tolist())


def test_dr_grpo_estimator_disables_std_scaling(tmp_path):
    assert HfGRPOConfig(output_dir=str(tmp_path), advantage_estimator="dr_grpo", bf16=False).scale_rewards == "none"


def test_resume_continues_exactly(tiny, tmp_path):
    common = dict(
        reward=reward_scripts.half_varying, dynamic_sampling=True, max_steps=6, save_strategy="steps", save_steps=1
    )
    straight = make_trainer(tiny, tmp_path / "straight", **common)
    straight.train()
    # stop where the checkpoint holds carried-over groups, so that restoring them matters
    carry = logged(straight, "dynamic_sampling/carry_out")
    stop = next(step for step, c in enumerate(carry[:-1], start=1) if c > 0)

    first = make_trainer(tiny, tmp_path / "resumed", **common)
    first.add_callback(StopAt(stop))
    first.train()
    assert first.state.global_step == stop and len(first._sampler.pool) > 0

    second = make_trainer(tiny, tmp_path / "resumed", **common)
    second.train(resume_from_checkpoint=str(tmp_path / "resumed" / f"checkpoint-{stop}"))
    assert second.state.global_step == 6
    resumed = next(r for r in second.state.log_history if r.get("step") == stop + 1 and "reward" in r)
    assert resumed["dynamic_sampling/carried_in"] == carry[stop - 1]  # the carried groups came back
    a, b = trainable(straight), trainable(second)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6, msg=name)
    assert straight._sampler.stream.state() == second._sampler.stream.state()


@pytest.mark.parametrize("gather", [True, False])
def test_the_task_evaluator_follows_ds3_gather_for_generation(tmp_path, monkeypatch, gather):
    """TRL generates without gathering ZeRO-3 shards when ``ds3_gather_for_generation: false`` (a model
    too large to gather on one GPU); the held-out evaluation gathered them anyway."""
    import contextlib
    from types import SimpleNamespace

    import trl.models
    from datasets import Dataset

    from hf_grpo.evaluation import core
    from hf_grpo.evaluation.tasks import TaskEvaluator

    seen = []

    @contextlib.contextmanager
    def unwrap(model, accelerator, gather_deepspeed3_params=True, **kwargs):
        seen.append(gather_deepspeed3_params)
        yield model

    monkeypatch.setattr(trl.models, "unwrap_model_for_generation", unwrap)
    monkeypatch.setattr(core, "generate", lambda model, tokenizer, prompts, *a, **k: [["#### 4"] for _ in prompts])
    args = tiny_config(tmp_path, ds3_gather_for_generation=gather)
    evaluator = TaskEvaluator(Dataset.from_dict({"prompt": ["2 + 2?"], "solution": ["#### 4"]}), "gsm8k", args)
    accelerator = SimpleNamespace(
        num_processes=1, device=torch.device("cpu"), state=SimpleNamespace(deepspeed_plugin=None)
    )
    trainer = SimpleNamespace(model_wrapped=torch.nn.Linear(1, 1), accelerator=accelerator, args=args, reward_funcs=[])
    try:
        result = evaluator.run(trainer.model_wrapped, None, label="periodic", trainer=trainer)
    finally:
        evaluator.close()
    assert seen == [gather] and result["accuracy"] == 1.0
