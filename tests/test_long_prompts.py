"""A prompt too long for the context no longer ends the run. vLLM answers prompt + max_tokens >
max_model_len with HTTP 400, which ended training at the first batch holding such a prompt; now every prompt is
measured before training and, per ``long_prompts``, dropped or cut from the left, with the count logged."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest
import trl
from datasets import Dataset

from hf_grpo.data.arithmetic import make_split
from hf_grpo.data.lengths import fit_prompts, prompt_budget, prompt_lengths, shortened
from hf_grpo.evaluation.checks import check_max_new_tokens
from hf_grpo.evaluation.core import prompt_token_ids
from hf_grpo.models.tiny import build_tokenizer
from hf_grpo.recipe import RecipeError, load_recipe
from hf_grpo.train import main

from .helpers.common import run_module
from .helpers.fake_vllm_server import start_in_thread


LONG_EVERY = 4  # every fourth problem is made too long


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def chat(text: str) -> list[dict]:
    return [{"role": "system", "content": "Answer with the number."}, {"role": "user", "content": text}]


def bos_tokenizer():
    """The tiny tokenizer made Llama-like: it adds a BOS token in front of every text it encodes."""
    from tokenizers.processors import TemplateProcessing

    tokenizer = build_tokenizer()
    tokenizer.bos_token = "<|endoftext|>"
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", tokenizer.bos_token_id)]
    )
    return tokenizer


def trl_prompt_ids(tokenizer, prompts: list, chat_template_kwargs: dict | None = None) -> list[list[int]]:
    """The prompt ids TRL's own GRPOTrainer._tokenize_prompts builds (called on a stand-in for the trainer that holds
    only what that method reads)."""
    trainer = SimpleNamespace(
        processing_class=tokenizer,
        _is_vlm=False,
        environment_factories=None,
        tools=None,
        chat_template=None,
        chat_template_kwargs=chat_template_kwargs or {},
    )
    return [list(ids) for ids in trl.GRPOTrainer._tokenize_prompts(trainer, prompts)[0]]


THINKING_TEMPLATE = (  # a template that reads a chat_template_kwargs key, as Qwen3's enable_thinking
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "<|im_start|>assistant\n{% if not enable_thinking %}<think></think>{% endif %}"
)


@pytest.mark.parametrize("adds_bos", [False, True], ids=["no-bos", "bos"])
def test_prompts_are_measured_and_evaluated_as_trl_tokenizes_them(adds_bos):
    """The length measure and evaluation's prompt ids equal TRL's own tokenization, for text prompts (where a Llama
    tokenizer adds BOS) and chat prompts (with the recipe's chat_template_kwargs)."""
    tokenizer = bos_tokenizer() if adds_bos else build_tokenizer()
    tokenizer.chat_template = THINKING_TEMPLATE
    text = "Leo has 9 shells. How many are left?"
    for kwargs in (None, {"enable_thinking": True}):
        prompts = [text, "3 + 4 = ?"] if kwargs is None else [chat(text), chat("3 + 4 = ?")]
        expected = trl_prompt_ids(tokenizer, prompts, kwargs)
        assert prompt_lengths(tokenizer, prompts, chat_template_kwargs=kwargs) == [len(ids) for ids in expected]
        assert [prompt_token_ids(tokenizer, p, kwargs) for p in prompts] == expected
    plain = trl_prompt_ids(tokenizer, [text])[0]
    assert (plain[0] == tokenizer.bos_token_id) == adds_bos
    thinking = prompt_lengths(tokenizer, [chat(text)], chat_template_kwargs={"enable_thinking": True})
    assert prompt_lengths(tokenizer, [chat(text)], chat_template_kwargs={"enable_thinking": False}) > thinking


def test_a_prompt_cut_to_the_budget_fits_it_with_bos():
    """Cutting a text prompt counts the BOS token the tokenizer adds: the cut prompt is exactly within the budget as
    TRL tokenizes it (one token over is HTTP 400 from vLLM)."""
    tokenizer = bos_tokenizer()
    cut = shortened(tokenizer, "3 + 4 = ? " * 40, 50)
    assert 45 <= len(trl_prompt_ids(tokenizer, [cut])[0]) <= 50


LONG_SYSTEM = [
    {"role": "system", "content": "Think step by step. " * 40},
    {"role": "user", "content": "What is 3 + 4?"},
]


@pytest.mark.parametrize("prompt", ["3 + 4 = ? " * 40, LONG_SYSTEM], ids=["text", "chat"])
def test_a_long_prompt_is_cut_from_the_left_in_its_own_form(tokenizer, prompt):
    (before,) = prompt_lengths(tokenizer, [prompt])
    cut = shortened(tokenizer, prompt, 50)
    (after,) = prompt_lengths(tokenizer, [cut])
    assert before > 50 >= after > 40
    if isinstance(prompt, list):  # the messages and the question stay; the system prompt, first, loses its start
        assert cut[1] == prompt[1] and prompt[0]["content"].strip().endswith(cut[0]["content"].strip())
    else:
        assert prompt.strip().endswith(cut.strip())


def test_a_dataset_with_no_prompt_short_enough_is_an_error(tokenizer):
    data = Dataset.from_dict({"prompt": [chat("3 + 4 = ? " * 40)] * 3, "solution": ["7"] * 3})
    with pytest.raises(ValueError, match="training data: every prompt is longer than 60 tokens"):
        fit_prompts(data, tokenizer, 60, "drop", "training data")


@pytest.mark.parametrize("mode", ["drop", "truncate_left"])
def test_fit_prompts_drops_or_cuts_only_the_long_ones(tokenizer, mode, caplog):
    prompts = [chat("What is 3 + 4?") for _ in range(8)] + [chat("3 + 4 = ? " * 40) for _ in range(2)]
    data = Dataset.from_dict({"prompt": prompts, "solution": [str(i) for i in range(10)]})
    with caplog.at_level(logging.WARNING):
        fitted, dropped, truncated = fit_prompts(data, tokenizer, 60, mode, "training data")
    assert (dropped, truncated) == ((2, 0) if mode == "drop" else (0, 2))
    assert len(fitted) == 10 - dropped and max(prompt_lengths(tokenizer, fitted["prompt"])) <= 60
    assert fitted["solution"][:8] == [str(i) for i in range(8)]  # every short row kept, in order
    assert "training data: 2 of 10 prompts are longer than 60 tokens" in caplog.text and mode in caplog.text


def test_no_room_for_a_prompt_is_a_recipe_level_error():
    assert prompt_budget(None, 1024) is None and prompt_budget(1536, 1024) == 512
    with pytest.raises(ValueError, match="max_completion_length 1024 leaves no room for a prompt"):
        prompt_budget(1024, 1024)


def test_eval_max_new_tokens_beyond_the_context_exits_2_before_loading(tiny_model_dir, tmp_path):
    """`hf-grpo eval --max-new-tokens` past the model's context generated past max_position_embeddings (vLLM would
    refuse it): training's check of max_completion_length now runs on it, for a model and for an adapter's base."""
    adapter = tmp_path / "run"
    adapter.mkdir()
    (adapter / "base_model").symlink_to(tiny_model_dir, target_is_directory=True)
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    check_max_new_tokens(str(adapter), 255)  # room for a one-token prompt in 256
    for model in (tiny_model_dir, adapter):
        with pytest.raises(ValueError, match=r"--max-new-tokens 256 leaves no room .* context of 256 tokens"):
            check_max_new_tokens(str(model), 256)
    result = run_module("hf_grpo.evaluate", str(tiny_model_dir), "--dataset", "arithmetic", "--max-new-tokens", "5000")
    lines = [line for line in result.stderr.splitlines() if line.startswith("hf_grpo.evaluate: error:")]
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "--max-new-tokens 5000 leaves no room for a prompt in a context of 256 tokens" in lines[0], lines[0]
    assert f"max_position_embeddings 256 in the config of {tiny_model_dir}" in lines[0], lines[0]
    assert "lower --max-new-tokens below 256" in lines[0] and "problems" not in result.stderr  # nothing evaluated


def test_long_prompts_takes_only_its_choices():
    with pytest.raises(RecipeError, match="long_prompts"):
        load_recipe(["recipes/tiny.yaml", "--long_prompts", "truncate"], for_run=False)


def write_data(path, count: int = 16) -> int:
    """Arithmetic problems as a local JSONL file, every LONG_EVERY-th with a question far over 256 tokens."""
    rows = make_split("train", count, seed=3)
    long = 0
    with open(path, "w") as f:
        for i, row in enumerate(rows):
            if i % LONG_EVERY == 0:
                row = {**row, "question": "Count the apples again. " * 60 + row["question"]}
                long += 1
            f.write(json.dumps({"question": row["question"], "answer": row["answer"]}) + "\n")
    return long


@pytest.mark.parametrize("mode", ["drop", "truncate_left"])
def test_a_dataset_with_long_prompts_trains_to_the_end_through_a_server(policy_dir, tmp_path, mode, caplog):
    """Through a server whose max_model_len is the model's 256 positions: before, the first batch holding a long
    prompt was a 400 that ended the run (4 steps of 4 prompts see every one of the 16 problems)."""
    data = tmp_path / "problems.jsonl"
    long = write_data(data)
    out = tmp_path / mode
    server = start_in_thread(policy_dir, enable_lora=True, max_lora_rank=16, allow_runtime_lora_updating=True)
    with server, caplog.at_level(logging.WARNING, logger="hf_grpo"):
        code = main(
            [
                "recipes/tiny.yaml",
                "--model_name_or_path", str(policy_dir),
                "--warm_start_steps", "0",  # the tiny recipe's 300 would warm-start this pretrained policy (60 s)
                "--dataset_name", str(data),
                "--prompt_column", "question",
                "--solution_column", "answer",
                "--long_prompts", mode,
                "--eval_before_after", "false",
                "--task_eval_steps", "0",
                "--output_dir", str(out),
                "--max_steps", "4",
                "--logging_steps", "1",
                "--per_device_train_batch_size", "16",
                "--num_generations", "4",
                "--max_completion_length", "10",
                "--dynamic_sampling", "false",
                "--generation.backend", "vllm_server",
                "--generation.base_url", server.url,
            ]
        )  # fmt: skip
    assert code == 0
    history = [r for r in json.loads((out / "training_history.json").read_text()) if "reward" in r]
    assert [r["step"] for r in history] == [1, 2, 3, 4]
    counts = f"dropped {long}, truncated 0" if mode == "drop" else f"dropped 0, truncated {long}"
    assert f"training data: {long} of 16 prompts are longer than 246 tokens" in caplog.text and counts in caplog.text


@pytest.mark.parametrize(
    ("short", "named"),
    [
        (0, "training data: every prompt is longer than 240 tokens"),
        (1, "has 1 row(s) left once the prompts too long for the context were dropped"),
    ],
    ids=["every-prompt-long", "too-few-left"],
)
def test_prompts_too_long_for_any_step_exit_2_with_one_line(tmp_path, capsys, short, named):
    """Every prompt over the budget was a good message inside a traceback (fit_prompts' ValueError); too few left
    for one generation made 0 steps and saved an untrained adapter."""
    data = tmp_path / "long.jsonl"
    rows = make_split("train", 12, seed=3)
    with open(data, "w") as f:
        for i, row in enumerate(rows):
            question = row["question"] if i < short else "Count the apples again. " * 60 + row["question"]
            f.write(json.dumps({"question": question, "answer": row["answer"]}) + "\n")
    argv = ["recipes/tiny.yaml", "--dataset_name", str(data), "--prompt_column", "question"]
    argv += ["--solution_column", "answer", "--long_prompts", "drop", "--warm_start_steps", "0", "--max_steps", "2"]
    argv += ["--per_device_train_batch_size", "16", "--num_generations", "4", "--output_dir", str(tmp_path / "run")]
    code = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("hf_grpo: error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert named in lines[0], lines[0]
    assert not (tmp_path / "run" / "adapter_model.safetensors").exists()
