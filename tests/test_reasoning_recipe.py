"""Issue 47's pieces, checked without the real model: the two-step training problems and the reasoning held-out set
(``hf_grpo.data.arithmetic``), and the supervised warm start of a pretrained policy (``hf_grpo.training.warm_start``) as a run
does it: after the ``before`` evaluation, on the adapter only, and not again when the run resumes.

How much the real model learns with ``recipes/smollm2-135m-reasoning.yaml``: ``benchmarks/real_model_learning.py``.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf_grpo.data.arithmetic import REASONING_KINDS, TWO_STEP, make_reasoning_split, make_split
from hf_grpo.data.loaders import DataArguments, load_grpo_datasets
from hf_grpo.training.warm_start import sft_batch, sft_example, sft_loss, warm_start

from .helpers.launching import run_train


LINE = re.compile(r"^(\d+) ([+-]) (\d+) = (\d+)$")


def worked_lines_add_up(problem: dict) -> list[tuple[int, str, int, int]]:
    """The answer's worked lines, each checked: its arithmetic, its first number the previous result, and the last
    result the gold number after '####'."""
    *lines, final = problem["answer"].splitlines()
    steps = [LINE.match(line).groups() for line in lines]
    previous = None
    for a, op, b, result in steps:
        assert int(result) == (int(a) + int(b) if op == "+" else int(a) - int(b)) and int(result) >= 0, problem
        assert previous is None or int(a) == previous, problem
        previous = int(result)
    assert final == f"#### {previous}" and problem["solution"] == str(previous), problem
    return steps


def test_a_two_step_share_mixes_worked_two_step_problems_into_training_and_zero_changes_nothing():
    mixed = make_split("train", 2000, seed=0, two_step_share=0.5)
    steps = [len(worked_lines_add_up(p)) for p in mixed]
    assert 0.45 < steps.count(2) / len(steps) < 0.55 and set(steps) == {1, 2}
    held_out_phrasings = {t.split(",")[0].split(" {item}")[0] for t in TWO_STEP.values()}
    assert not any(p["question"].startswith(tuple(held_out_phrasings)) for p in mixed)
    data = DataArguments(arithmetic_train_size=200, arithmetic_eval_size=8, arithmetic_two_step_share=0.5)
    train, _ = load_grpo_datasets(data, seed=0)
    assert sum("\n" in line.partition("#### ")[0].strip() for line in train["solution"]) > 50  # gold: worked lines
    # share 0 draws exactly what a set of one-step problems drew before the option existed (seeded runs compare)
    assert make_split("train", 300, seed=3, two_step_share=0.0) == make_split("train", 300, seed=3)


def test_the_reasoning_set_holds_five_kinds_no_training_question_and_distractors_that_do_not_count():
    problems = make_reasoning_split(500, seed=0)
    assert [p["kind"] for p in problems[:5]] == list(REASONING_KINDS)
    train = {p["question"] for p in make_split("train", 4000, seed=0, two_step_share=0.5)}
    assert not train & {p["question"] for p in problems}
    lines = {kind: {len(worked_lines_add_up(p)) for p in problems if p["kind"] == kind} for kind in REASONING_KINDS}
    assert lines == {"seen": {1}, "rephrased": {1}, "two_step": {2}, "three_step": {3}, "distractor": {1}}
    for p in (p for p in problems if p["kind"] == "distractor"):  # "{a} {item} and {x} {other}... {b} more {item}"
        a, _, b, _ = worked_lines_add_up(p)[0]
        numbers = [int(n) for n in re.findall(r"\d+", p["question"])]
        assert len(numbers) == 3 and (int(a), int(b)) == (numbers[0], numbers[2]), p
    data = DataArguments(eval_dataset_name="arithmetic_reasoning", arithmetic_eval_size=10, arithmetic_train_size=8)
    _, held_out = load_grpo_datasets(data, seed=0)
    assert held_out["kind"] == list(REASONING_KINDS) * 2


def test_the_warm_start_trains_only_the_adapter_and_teaches_the_worked_answers(policy_dir):
    tokenizer = AutoTokenizer.from_pretrained(policy_dir)  # warm-started on one-step problems (conftest)
    base = AutoModelForCausalLM.from_pretrained(policy_dir)
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    pairs = [([{"role": "user", "content": p["question"]}], p["answer"]) for p in make_split("train", 64, 0, 1.0)]
    batch = sft_batch([sft_example(tokenizer, *pair) for pair in pairs[:16]], tokenizer.pad_token_id)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    with torch.no_grad():
        loss_before = model(**batch).loss.item()
    losses = warm_start(model, tokenizer, steps=30, batch_size=16, lr=3e-3, examples=pairs, progress=False)
    with torch.no_grad():
        loss_after = model(**batch).loss.item()
    assert loss_after < 0.8 * loss_before and losses[-1] < losses[0], (loss_before, loss_after)
    changed = {name for name, p in model.named_parameters() if not torch.equal(p, before[name])}
    assert changed and all("lora_" in name for name in changed)


def test_the_warm_start_loss_is_the_models_own_loss_with_logits_only_where_labels_are(policy_dir):
    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(policy_dir), LoraConfig(r=8, target_modules="all-linear")
    )
    for name, param in model.named_parameters():
        if "lora_B" in name:  # LoRA B starts at zero: give the adapter a gradient path of its own
            torch.nn.init.normal_(param, std=0.02)
    # Prompts of different lengths (one a multi-step problem), so the kept positions start inside some prompts
    pairs = [([{"role": "user", "content": p["question"]}], p["answer"]) for p in make_split("train", 6, 0, 1.0)]
    pairs.append(("short", "1 + 1 = 2\n#### 2"))
    batch = sft_batch([sft_example(tokenizer, *pair) for pair in pairs], tokenizer.pad_token_id)
    assert len({int((row != -100).int().argmax()) for row in batch["labels"]}) > 1
    grads = []
    for loss_of in (lambda: model(**batch).loss, lambda: sft_loss(model, batch)):
        model.zero_grad(set_to_none=True)
        loss = loss_of()
        loss.backward()
        grads.append((loss.detach(), [p.grad.clone() for p in model.parameters() if p.requires_grad]))
    (full, full_grads), (trimmed, trimmed_grads) = grads
    torch.testing.assert_close(trimmed, full, rtol=1e-6, atol=1e-6)
    for a, b in zip(full_grads, trimmed_grads, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_warm_start_max_lines_keeps_the_warm_start_to_short_gold_solutions_and_names_the_key_when_none_is():
    from datasets import Dataset

    from hf_grpo.training.warm_start import GoldPairs

    rows = Dataset.from_list(
        [{"prompt": f"q{i}", "solution": "\n".join(["1 + 1 = 2"] * (i % 3) + ["#### 2"])} for i in range(9)]
    )
    assert len(GoldPairs(rows)) == 9
    short = GoldPairs(rows, max_lines=2)  # rows 0, 1, 3, 4, 6, 7: at most one worked line
    assert [short[i][0] for i in range(len(short))] == ["q0", "q1", "q3", "q4", "q6", "q7"]
    with pytest.raises(ValueError, match="warm_start_max_lines: 2 leaves no training row.*remove the key"):
        GoldPairs(rows.select([2, 5, 8]), max_lines=2)


def test_the_warm_start_skips_rows_for_grpo_only_and_names_the_column_when_none_is_left():
    from datasets import Dataset

    from hf_grpo.data.loaders import DataArguments, load_grpo_datasets
    from hf_grpo.training.warm_start import GoldPairs

    train, _ = load_grpo_datasets(DataArguments(dataset_name="word_problems", arithmetic_train_size=33,
                                                word_problems_compare=True, eval_dataset_name="word_problems_held_out",
                                                arithmetic_eval_size=6))  # fmt: skip
    assert len(train) == 36 and train["warm_start"].count(False) == 3
    pairs = GoldPairs(train)
    assert len(pairs) == 33 and all("How many more" not in str(pairs[i][0]) or " than " not in str(pairs[i][0])
                                    for i in range(33))  # fmt: skip
    rows = Dataset.from_list([{"prompt": f"q{i}", "solution": "#### 2", "warm_start": i % 2 == 0} for i in range(6)])
    short = GoldPairs(rows, max_lines=1)
    assert [short[i][0] for i in range(len(short))] == ["q0", "q2", "q4"]
    with pytest.raises(ValueError, match="column 'warm_start' is false in every row.*warm_start_steps: 0"):
        GoldPairs(rows.select([1, 3, 5]))


def test_a_run_warm_starts_a_pretrained_policy_after_its_before_evaluation_and_not_again_on_resume(
    policy_dir, tmp_path
):
    out = tmp_path / "run"
    args = [
        "recipes/tiny.yaml", "--model_name_or_path", str(policy_dir), "--output_dir", str(out),
        "--warm_start_steps", "3", "--warm_start_batch_size", "8", "--arithmetic_two_step_share", "0.5",
        "--eval_dataset_name", "arithmetic_reasoning", "--arithmetic_train_size", "64", "--arithmetic_eval_size", "10",
        "--per_device_train_batch_size", "8", "--num_generations", "4", "--max_completion_length", "12",
        "--lora_r", "8", "--lora_alpha", "16", "--task_eval_steps", "0", "--save_strategy", "steps", "--save_steps", "1",
        "--warm_start_max_lines", "2",
    ]  # fmt: skip
    first = run_train(*args, "--max_steps", "1")
    assert first.returncode == 0, first.stderr[-4000:]
    log = first.stderr
    assert "warm start: 3 steps" in log, log[-4000:]
    short = int(re.search(r"warm start: (\d+) of 64 rows have a solution of at most 2 lines", log).group(1))
    assert 0 < short < 64  # one-step answers only (a worked line and '#### N'); GRPO still trains on all 64
    assert (
        log.index("held-out accuracy (before)")
        < log.index("warm start: 3 steps")
        < log.index("held-out accuracy (after)")
    )
    again = run_train(*args, "--max_steps", "2", "--resume_from_checkpoint", "auto")
    assert again.returncode == 0, again.stderr[-4000:]
    assert "resuming from" in again.stderr and "warm start: 3 steps" not in again.stderr, again.stderr[-4000:]


def test_warm_start_reference_makes_the_kl_term_measure_from_the_warm_started_policy(policy_dir, tmp_path):
    """With the base as the reference, the KL term pulls GRPO back from what the warm start taught (KL 1.2-1.8 nats a
    token on the real model). With ``warm_start_reference`` the first step's KL is 0 (the policy is its reference),
    and a resumed run gets the same reference back from the run's ``warm_start/``."""
    from safetensors.torch import load_file

    from hf_grpo.train import main

    def run(out, *extra):
        argv = [
            "recipes/tiny.yaml", "--model_name_or_path", str(policy_dir), "--output_dir", str(out),
            "--warm_start_steps", "10", "--beta", "0.04", "--arithmetic_train_size", "64", "--arithmetic_eval_size",
            "8", "--per_device_train_batch_size", "16", "--num_generations", "4", "--max_completion_length", "8",
            "--max_generation_batches", "2", "--logging_steps", "1", "--task_eval_steps", "0", "--report_to", "none",
            *extra,
        ]  # fmt: skip
        assert main(argv) == 0
        return [r["kl"] for r in json.loads((out / "training_history.json").read_text()) if "kl" in r]

    assert run(tmp_path / "base", "--max_steps", "1")[0] > 0  # the warm start moved the policy from the base
    out = tmp_path / "warm"
    checkpoints = ["--save_strategy", "steps", "--save_steps", "1"]
    assert run(out, "--warm_start_reference", "true", "--max_steps", "1", *checkpoints)[0] == 0
    run(out, "--warm_start_reference", "true", "--max_steps", "2", *checkpoints, "--resume_from_checkpoint", "auto")
    warm = load_file(out / "warm_start" / "adapter_model.safetensors")
    resumed_ref = load_file(out / "checkpoint-2" / "ref" / "adapter_model.safetensors")  # PEFT saves each adapter
    assert warm.keys() == resumed_ref.keys() and all(torch.equal(warm[k], resumed_ref[k]) for k in warm)
