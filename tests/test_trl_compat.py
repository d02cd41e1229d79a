"""A TRL or open-r1 user's own recipe works here: refused once with every fix listed, then checked and run.

The fixtures in ``tests/fixtures/configs/`` are published recipes in their own shape (open-r1's GRPO
``config_demo.yaml``; a ``trl grpo --config`` file in TRL 1.x's fields) with only the model and the dataset named by
placeholders. The open-r1 one carries keys TRL 1.x / transformers 5 renamed or removed: the first dry run lists all
of them in one line with the exact replacement (not one refusal per attempt); applying exactly those replacements
(``OPENR1_FIXES``) gives a recipe that passes ``--dry-run`` with its published layout and trains. The TRL one
passes as it is. Few-step runs use the embedded tiny model and a local data file in the dataset's published schema,
with the CPU swaps listed in ``ON_THIS_CPU`` (everything else as written); the miniature tier runs the migrated
open-r1 recipe with ``--miniature``, its published accelerate / DeepSpeed layout included.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hf_grpo.train import main

from .helpers.common import REPO


CONFIGS = Path(__file__).parent / "fixtures" / "configs"
OPENR1 = CONFIGS / "openr1_grpo_config_demo.yaml"
TRL = CONFIGS / "trl_grpo_config.yaml"
FAKE_TOKEN = "hf_" + "x" * 34  # push_to_hub: true is checked for a token before anything loads

# What the one refusal of open-r1's recipe says for each key, and the fix applied (new key, value) or None (drop).
OPENR1_RENAMED = {
    "torch_dtype": ("use dtype", ("dtype", lambda v: v)),
    "dataset_configs": ("use dataset_config", ("dataset_config", lambda v: v[0])),
    "vllm_device": ("generation: {backend: vllm_server", None),
    "max_prompt_length": ("removed from TRL's GRPOConfig", None),
    "overwrite_output_dir": ("resume_from_checkpoint: auto", None),
    "warmup_ratio": ("use warmup_steps", ("warmup_steps", lambda v: v)),
}
OPENR1_FIXES = {
    # the second refusal: open-r1's reward names, each with the reward to use instead
    "reward_funcs": ["accuracy_reward", "r1_zero_format"],
    # not a rename: open-r1 reads the `problem` column by default, TRL's format (our default) `prompt`
    "prompt_column": "problem",
    # OpenR1-Math-220k has only a train split (open-r1 sets do_eval: false); hold out 10% for the before/after
    "eval_split_size": 0.1,
    # open-r1 launches this recipe on 8 GPUs with its ZeRO-3 accelerate config, beside the recipe
    "accelerate_config": "zero3",
    "num_processes": 8,
}
OPENR1_DROPPED = ("hub_strategy",)  # every_save: refused here (hf_grpo pushes once, with the card), so dropped

# Keys a few-step run on this CPU changes; everything else runs as the fixture has it.
ON_THIS_CPU = {
    "model_name_or_path": "tiny",
    "warm_start_steps": 20,
    "bf16": False,
    "dtype": "float32",
    "use_vllm": False,
    "attn_implementation": "sdpa",
    "accelerate_config": None,
    "num_processes": 1,
    "push_to_hub": False,
    "report_to": "none",
    "gradient_checkpointing": False,
    "max_steps": 2,
    "per_device_train_batch_size": 4,
    "num_generations": 4,
    "gradient_accumulation_steps": 1,
    "max_completion_length": 16,
    "logging_steps": 1,
    "save_strategy": "no",
    "per_device_eval_batch_size": 8,
}


def published(path: Path, model: str, dataset: str) -> str:
    return path.read_text().replace("MODEL", model).replace("DATASET", dataset)


def refusal(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    return err


def migrate_openr1(text: str) -> dict:
    values = yaml.safe_load(text)
    for key, (_, fix) in OPENR1_RENAMED.items():
        value = values.pop(key)
        if fix is not None:
            values[fix[0]] = fix[1](value)
    for key in OPENR1_DROPPED:
        values.pop(key)
    return {**values, **OPENR1_FIXES}


def write(tmp_path: Path, name: str, values: dict) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(values, sort_keys=False))
    return path


def test_openr1_recipe_is_refused_once_with_every_fix(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    path = tmp_path / "config_demo.yaml"
    path.write_text(published(OPENR1, "Qwen/Qwen2.5-1.5B-Instruct", "open-r1/OpenR1-Math-220k"))
    err = refusal([str(path), "--dry-run"], capsys)
    assert f"{len(OPENR1_RENAMED)} unknown keys" in err
    for key, (fix, _) in OPENR1_RENAMED.items():
        assert f"'{key}'" in err and fix in err, (key, err)
    assert "torch_compile" not in err and "did you mean 'output_dir'" not in err  # the old wrong hints

    values = migrate_openr1(path.read_text())
    values["reward_funcs"] = ["accuracy", "format"]  # open-r1's reward names: refused with what to use instead
    err = refusal([str(write(tmp_path, "step2.yaml", values)), "--dry-run"], capsys)
    assert "'accuracy' is open-r1's name: use accuracy_reward" in err


def online(monkeypatch) -> None:
    """As on a machine with the hub: the dry run checks a hub dataset is reachable only when offline mode is set."""
    for variable in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(variable, raising=False)


def test_migrated_openr1_recipe_passes_dry_run_with_its_layout(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    online(monkeypatch)
    values = migrate_openr1(published(OPENR1, "Qwen/Qwen2.5-1.5B-Instruct", "open-r1/OpenR1-Math-220k"))
    assert main([str(write(tmp_path, "openr1.yaml", values)), "--dry-run"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "8 training process(es) on 1 machine(s) (8 per machine), DEEPSPEED ZeRO-3" in out
    assert "generation: TRL vLLM (colocate" in out  # use_vllm: true, and TRL 1.x's default mode
    # no task in the recipe: the one its correctness reward grades with, said so
    assert "task: 'math'  # inferred from reward_funcs (accuracy_reward, r1_zero_format)" in out
    assert "problem column 'problem', gold column 'solution (TRL default)'" in out


def test_trl_recipe_passes_dry_run_as_published(tmp_path, capsys, monkeypatch):
    online(monkeypatch)
    path = tmp_path / "trl.yaml"
    path.write_text(published(TRL, "Qwen/Qwen2.5-0.5B-Instruct", "trl-lib/DeepMath-103K"))
    assert main([str(path), "--dry-run"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert f"learning_rate: 1e-05  # {path}" in out
    assert "+ LoRA r=16 alpha=32 on ['q_proj', 'k_proj', 'v_proj', 'o_proj']" in out
    assert "generation: TRL vLLM (colocate)" in out


def test_dry_run_says_where_every_value_came_from(tmp_path, capsys):
    assert main(["--dry-run", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "    seed: 3  # command line" in out
    assert "    learning_rate: 0.002  # tiny default (tiny.yaml, no recipe given)" in out
    recipe = REPO / "recipes" / "qwen7b.yaml"
    assert main([str(recipe), "--dry-run", "--miniature"]) == 0
    out = capsys.readouterr().out
    assert "    max_steps: 2  # --miniature" in out
    assert f"    accelerate_config: 'zero3'  # {recipe}" in out


def local_rows(schema: str, n: int) -> list[dict]:
    """Arithmetic problems in a published dataset's schema, gold answers in LaTeX (math-verify grades them)."""
    from hf_grpo.data.arithmetic import make_split

    rows = []
    for p in make_split("train", n, seed=0):
        gold = f"The answer is $\\boxed{{{p['solution']}}}$."
        if schema == "openr1":  # OpenR1-Math-220k: problem, solution, answer
            rows.append({"problem": p["question"], "solution": gold, "answer": p["solution"]})
        else:  # trl-lib/DeepMath-103K: a conversational prompt and a solution
            rows.append({"prompt": [{"role": "user", "content": p["question"]}], "solution": gold})
    return rows


def few_steps(tmp_path: Path, values: dict, schema: str) -> dict:
    from hf_grpo.train import train

    data = tmp_path / f"{schema}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in local_rows(schema, 64)))
    recipe = write(tmp_path, f"{schema}.yaml", {**values, "dataset_name": str(data)})
    return train(str(recipe), **ON_THIS_CPU, output_dir=str(tmp_path / "out"), arithmetic_eval_size=8)


def test_migrated_openr1_recipe_trains_a_few_steps(tmp_path, monkeypatch):
    values = migrate_openr1(published(OPENR1, "tiny", "local"))
    values.pop("dataset_config")  # a local file has no configs
    results = few_steps(tmp_path, {**values, "eval_split_size": 0.125}, "openr1")
    history = json.loads((tmp_path / "out" / "training_history.json").read_text())
    assert max(r.get("step", 0) for r in history) == 2
    assert any("rewards/accuracy_reward/mean" in r for r in history)
    assert results["after"]["total"] == 8  # 12.5% of 64 held out


def test_trl_recipe_trains_a_few_steps(tmp_path):
    values = yaml.safe_load(published(TRL, "tiny", "local"))
    results = few_steps(tmp_path, {**values, "eval_split_size": 0.125}, "trl")
    history = json.loads((tmp_path / "out" / "training_history.json").read_text())
    assert max(r.get("step", 0) for r in history) == 2
    assert any("rewards/think_format_reward/mean" in r for r in history)
    assert results["after"]["total"] == 8


@pytest.mark.miniature
@pytest.mark.subprocess
@pytest.mark.slow
def test_migrated_openr1_recipe_in_miniature(tmp_path):
    """The migrated recipe as open-r1 launches it (ZeRO-3, several processes, vLLM in the training processes) runs
    here in miniature: the launcher, DeepSpeed, TRL's vLLM path against the stand-in, the mirrored dataset."""
    values = migrate_openr1(published(OPENR1, "Qwen/Qwen2.5-1.5B-Instruct", "open-r1/OpenR1-Math-220k"))
    recipe = write(tmp_path, "openr1.yaml", {**values, "output_dir": str(tmp_path / "run")})
    env = {**os.environ, "HF_TOKEN": FAKE_TOKEN}
    cmd = [sys.executable, "-m", "hf_grpo.train", str(recipe), "--miniature"]
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    out = tmp_path / "run-miniature"
    history = json.loads((out / "training_history.json").read_text())
    assert max(r.get("step", 0) for r in history) == 2
    assert json.loads((out / "eval_results.json").read_text())["after"]["total"] > 0
