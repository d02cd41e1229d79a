"""``python -m hf_grpo.evaluate`` turns bad input into exit status 2 and one error line.

Each case was a traceback or a silent wrong result: a path that does not exist, a file given as the model, a
truncated adapter, a broken recipe or dataset file, an ``--output`` that cannot be written (found only after the
evaluation), ``--max-samples 0``, an unknown ``--split``, MATH golds that are null. The checks run before any model
is loaded: no case logs the evaluation's start (``MODEL_LOADED``) or fails in the model's loading.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time

import pytest

from .helpers.common import REPO


pytestmark = pytest.mark.timeout(300)

ERROR_PREFIX = "hf_grpo.evaluate: error:"
MAX_SECONDS = 120.0  # per bad-input case, interpreter start and imports included (5-15 s on 2 busy cores): a hang
MODEL_LOADED = "INFO hf_grpo.evaluation.saved_model: evaluating "  # logged once the model is loaded, before generating
QUICK = ["--max-samples", "2", "--max-new-tokens", "2", "--batch-size", "2"]  # only matters when a case is not caught
MATH_FILE = ["--task", "math", "--prompt-column", "problem", "--solution-column", "answer", "--split", "train"]


def write_safetensors(path, truncate_to: int | None = None) -> None:
    import torch
    from safetensors.torch import save_file

    save_file({"base_model.model.lora_A.weight": torch.zeros(8, 16)}, str(path))
    if truncate_to is not None:
        os.truncate(path, truncate_to)


def adapter_dir(tmp_path, model_dir, config: str | None = None, weights_size: int | None = None):
    """An adapter directory with ``base_model/`` next to it; ``config`` replaces adapter_config.json's text."""
    adapter = tmp_path / "run"
    adapter.mkdir()
    (adapter / "base_model").symlink_to(model_dir, target_is_directory=True)
    lora = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"], "task_type": "CAUSAL_LM"}
    (adapter / "adapter_config.json").write_text(config if config is not None else json.dumps(lora))
    write_safetensors(adapter / "adapter_model.safetensors", truncate_to=weights_size)
    return adapter


def run_dir(tmp_path, model_dir, recipe: str):
    """A copy of the tiny model with ``recipe`` as its run's recipe.yaml."""
    run = tmp_path / "run"
    shutil.copytree(model_dir, run)
    (run / "recipe.yaml").write_text(recipe)
    return run


def data_file(tmp_path, text: str):
    path = tmp_path / "problems.jsonl"
    path.write_text(text)
    return path


def null_golds(tmp_path):
    return data_file(tmp_path, "".join(json.dumps({"problem": f"{i} + 1?", "answer": None}) + "\n" for i in range(2)))


# case id -> (argv built from tmp_path and the tiny model dir, what the error line must name)
CASES = {
    "missing-relative-path": (lambda tmp, model: ["outputs/no-such-run-3f9c"], "outputs/no-such-run-3f9c"),
    "missing-nested-relative-path": (lambda tmp, model: ["runs/no/such-run"], "runs/no/such-run"),
    "file-instead-of-directory": (
        lambda tmp, model: [str(model / "config.json")],
        "not a directory",
    ),
    "empty-adapter-weights": (
        lambda tmp, model: [str(adapter_dir(tmp, model, weights_size=0))],
        "adapter_model.safetensors",
    ),
    "truncated-adapter-weights": (
        lambda tmp, model: [str(adapter_dir(tmp, model, weights_size=200))],
        "adapter_model.safetensors",
    ),
    "adapter-config-not-json": (
        lambda tmp, model: [str(adapter_dir(tmp, model, config='{"r": 8, "peft_'))],
        "adapter_config.json",
    ),
    "recipe-not-yaml": (
        lambda tmp, model: [str(run_dir(tmp, model, "dataset_name: arithmetic\ntask: [gsm8k\n")), *QUICK],
        "recipe.yaml",
    ),
    "recipe-not-a-mapping": (
        lambda tmp, model: [str(run_dir(tmp, model, "- dataset_name: arithmetic\n")), *QUICK],
        "recipe.yaml",
    ),
    "broken-jsonl-dataset": (
        lambda tmp, model: [
            str(model),
            "--dataset",
            str(data_file(tmp, '{"problem": "1 + 1?", "answer": "2"}\n{"problem": "2 + 2?", "ans\n')),
            *MATH_FILE,
            *QUICK,
        ],
        "line 2",
    ),
    "empty-jsonl-dataset": (
        lambda tmp, model: [str(model), "--dataset", str(data_file(tmp, "")), *MATH_FILE, *QUICK],
        "empty",
    ),
    "output-is-a-directory": (
        lambda tmp, model: [str(model), "--output", str(tmp), *QUICK],
        "--output",
    ),
    "output-directory-missing": (
        lambda tmp, model: [str(model), "--output", str(tmp / "no" / "such" / "records.jsonl"), *QUICK],
        "--output",
    ),
    "max-samples-zero": (lambda tmp, model: [str(model), "--max-samples", "0"], "--max-samples"),
    "max-samples-negative": (lambda tmp, model: [str(model), "--max-samples", "-3"], "--max-samples"),
    "num-samples-zero": (lambda tmp, model: [str(model), "--num-samples", "0", *QUICK], "--num-samples"),
    "unknown-split": (
        lambda tmp, model: [str(model), "--dataset", "arithmetic", "--split", "nosuchsplit", *QUICK],
        "'test'",
    ),
    "unknown-split-of-a-file": (
        lambda tmp, model: [
            str(model),
            "--dataset",
            str(data_file(tmp, json.dumps({"problem": "1 + 1?", "answer": "2"}) + "\n")),
            *MATH_FILE[:-2],
            "--split",
            "test",
            *QUICK,
        ],
        "'train'",
    ),
    "all-golds-null": (
        lambda tmp, model: [str(model), "--dataset", str(null_golds(tmp)), *MATH_FILE, *QUICK],
        "gold",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_error_line_and_exit_2(case, tmp_path, tiny_model_dir):
    build, named = CASES[case]
    argv = build(tmp_path, tiny_model_dir)
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "hf_grpo.evaluate", *argv],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"},
    )
    elapsed = time.monotonic() - start
    print(f"{case}: exit {proc.returncode} in {elapsed:.1f} s\n{proc.stderr[-3000:]}")
    assert proc.returncode == 2, proc.stdout[-2000:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, errors
    assert errors[0].startswith(ERROR_PREFIX)
    assert named in errors[0]
    assert MODEL_LOADED not in proc.stderr and "cannot load model" not in errors[0]  # refused before loading
    assert elapsed < MAX_SECONDS


def test_null_golds_are_dropped_with_a_count(caplog):
    from datasets import Dataset

    from hf_grpo.evaluation.saved_model import drop_missing_golds

    rows = [
        {"problem": "a", "answer": "1", "solution": "1"},
        {"problem": "b", "answer": None, "solution": "None"},  # the loader writes a null gold as "None"
        {"problem": "c", "answer": " ", "solution": " "},
        {"problem": "d", "answer": "None", "solution": "None"},  # a gold that is the word None is kept
    ]
    with caplog.at_level(logging.WARNING, logger="hf_grpo.evaluation.saved_model"):
        kept = drop_missing_golds(Dataset.from_list(rows), "answer")
    assert kept["problem"] == ["a", "d"]
    assert "dropped 2 of 4 problems" in caplog.text
    # without the raw column (the gold column is ``solution`` itself) only the text is left to go by
    plain = Dataset.from_list([{k: r[k] for k in ("problem", "solution")} for r in rows])
    assert drop_missing_golds(plain, "solution")["problem"] == ["a"]
    with pytest.raises(ValueError, match="gold"):
        drop_missing_golds(Dataset.from_list(rows[1:3]), "answer")


def test_output_is_written_to_a_temporary_file_then_renamed(tmp_path, tiny_model_dir, monkeypatch, capsys):
    import hf_grpo.evaluate as cli

    renames = []
    replace = os.replace

    def recording_replace(src, dst):
        renames.append((str(src), str(dst)))
        replace(src, dst)

    monkeypatch.setattr(os, "replace", recording_replace)  # hf_grpo.base.run_files.replacing's rename
    output = tmp_path / "records.jsonl"
    assert cli.main([str(tiny_model_dir), "--output", str(output), *QUICK]) == 0
    assert [dst for _, dst in renames] == [str(output)]
    temporary = renames[0][0]
    assert os.path.dirname(temporary) == str(tmp_path) and temporary != str(output)
    assert sorted(os.listdir(tmp_path)) == ["records.jsonl"]  # the temporary file is gone
    records = [json.loads(line) for line in output.read_text().splitlines()]
    summary = json.loads(capsys.readouterr().out)
    assert len(records) == summary["total"] == 2
    assert all(isinstance(r, dict) and "completion" in r for r in records)


@pytest.mark.parametrize("name", ["arithmetic_transfer", "word_problems_held_out"])
def test_a_held_out_set_named_by_dataset_is_read_from_its_one_split(name):
    """``--dataset word_problems_held_out`` without ``--split``: its test problems, not an error about 'train'."""
    from hf_grpo.data.loaders import DataArguments
    from hf_grpo.evaluation.saved_model import eval_dataset

    dataset = eval_dataset(DataArguments(dataset_name=name, arithmetic_eval_size=12), seed=0, split=None)
    assert len(dataset) == 12 and len(set(dataset["kind"])) > 1
