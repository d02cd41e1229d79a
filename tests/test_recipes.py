"""Recipe parsing and validation: every shipped recipe dry-runs; user errors exit 2 naming the key."""

from __future__ import annotations

import pytest

from hf_grpo.recipe import RecipeError, batch_plan, load_recipe, split_argv
from hf_grpo.train import main

from .helpers.common import REPO, run_module


RECIPES = sorted((REPO / "recipes").glob("*.yaml"))


def write(tmp_path, text: str):
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_every_shipped_recipe_dry_runs(recipe, capsys):
    assert main([str(recipe), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "batch arithmetic" in out
    assert "completions" in out and "num_generations" in out
    assert "accelerate launch" in out


def test_there_are_the_five_recipes_the_issue_asks_for():
    names = {p.name for p in RECIPES}
    assert {
        "tiny.yaml",
        "qwen7b.yaml",
        "qwen1.5b-gsm8k-8gb.yaml",
        "qwen-math-1.5b-math.yaml",
        "qwen7b-lora-2node.yaml",
    } <= names


def test_positional_and_config_flag_are_the_same(tmp_path):
    a, _ = load_recipe([str(REPO / "recipes/tiny.yaml")], for_run=False)
    b, _ = load_recipe(["--config", str(REPO / "recipes/tiny.yaml")], for_run=False)
    assert a.values == b.values


def test_no_recipe_means_the_tiny_default():
    recipe, _ = load_recipe([], for_run=False)
    assert recipe.path.name == "tiny.yaml"
    assert recipe.model.model_name_or_path == "tiny"


def test_command_line_overrides_any_field():
    recipe, _ = load_recipe(
        [
            "recipes/tiny.yaml",
            "--learning-rate",
            "1e-4",
            "--seed=7",
            "--lora_target_modules",
            "[q_proj, v_proj]",
            "--output_dir",
            "/tmp/x",
            "--eval_strategy",
            "no",
            "--dynamic_sampling",
        ],
        for_run=False,
    )
    assert recipe.training.learning_rate == 1e-4
    assert recipe.training.seed == 7
    assert recipe.model.lora_target_modules == ["q_proj", "v_proj"]
    assert recipe.training.output_dir == "/tmp/x"
    assert recipe.training.dynamic_sampling is True


def test_yaml_12_scalars(tmp_path):
    # PyYAML (YAML 1.1) reads `1e-6` as a string and `no` as False; recipes use YAML 1.2 rules instead.
    recipe, _ = load_recipe(
        [write(tmp_path, "learning_rate: 1e-6\neval_strategy: no\nuse_peft: true\nmax_completion_length: 16\n")],
        for_run=False,
    )
    assert recipe.training.learning_rate == 1e-6
    assert recipe.values["eval_strategy"] == "no"
    assert recipe.model.use_peft is True


@pytest.mark.parametrize(
    "text, expected",
    [
        ("learnig_rate: 0.1\n", ["learnig_rate", "did you mean 'learning_rate'"]),
        ("num_generations: eight\n", ["num_generations", "int", "'eight'"]),
        ("use_peft: 3\n", ["use_peft", "bool"]),
        ("loss_type: dapoo\n", ["loss_type", "'dapoo'", "dapo"]),
        ("eval_strategy: sometimes\n", ["eval_strategy", "'sometimes'"]),
        ("reward_funcs: [gsm8k_corectness]\n", ["gsm8k_corectness", "unknown reward"]),
        ("reward_funcs: ['no_such_module_xyz:fn']\n", ["no_such_module_xyz", "cannot import"]),
        ("dataset_name: missing/file.jsonl\n", ["dataset_name", "missing/file.jsonl", "does not exist"]),
        ("accelerate_config: zero9\n", ["accelerate_config", "zero9"]),
        ("per_device_train_batch_size: 12\nnum_generations: 8\n", ["num_generations 8", "not divisible"]),
        ("generation_batch_size: 10\nsteps_per_generation: 2\n", ["generation_batch_size", "not both"]),
        ("reward_weights: [1.0, 2.0]\n", ["reward_weights", "2 entries", "reward_funcs has 1"]),
        ("hub_token: hf_abc\n", ["hub_token", "HF_TOKEN"]),
        ("env:\n  HF_TOKEN: hf_abc\n", ["HF_TOKEN", "secret"]),
        ("dynamic_sampling_metric: accuracy\n", ["dynamic_sampling_metric", "'accuracy'"]),
        ("- a list\n", ["mapping"]),
        ("learning_rate: [1\n", ["invalid YAML", "line"]),
    ],
)
def test_bad_recipes_raise_a_message_naming_the_problem(tmp_path, text, expected):
    with pytest.raises(RecipeError) as info:
        load_recipe([write(tmp_path, text)], for_run=False)
    for fragment in expected:
        assert fragment in str(info.value)


def test_dynamic_sampling_needs_whole_groups_per_process(tmp_path):
    # 2 x 2 x 4 processes = 16 completions = 2 groups of 8, but each process holds half a group
    text = "per_device_train_batch_size: 2\ngradient_accumulation_steps: 2\nnum_generations: 8\nnum_processes: 4\nmax_completion_length: 16\n"
    load_recipe([write(tmp_path, text)], for_run=False)
    with pytest.raises(RecipeError, match="dynamic_sampling"):
        load_recipe([write(tmp_path, text + "dynamic_sampling: true\n")], for_run=False)


def test_batch_plan_arithmetic():
    plan = batch_plan(
        {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 8, "num_generations": 16},
        num_processes=16,
    )
    assert plan.completions_per_optimizer_step == 512
    assert plan.prompts_per_generation == 32
    assert plan.steps_per_generation == 8


@pytest.mark.parametrize(
    "args, message",
    [
        (["recipes/tiny.yaml", "--learnig_rate", "0.1"], "did you mean 'learning_rate'"),
        (["recipes/tiny.yaml", "--num_generations", "3", "--dry-run"], "not divisible by num_generations 3"),
        (["recipes/nope.yaml"], "does not exist"),
        (
            ["recipes/tiny.yaml", "--reward_funcs", "[no_such_module_xyz:fn]"],
            "cannot import module 'no_such_module_xyz'",
        ),
        (["recipes/tiny.yaml", "--reward_funcs", "[gsm8k_corectness]"], "unknown reward 'gsm8k_corectness'"),
    ],
)
def test_cli_user_errors_exit_2_without_traceback(args, message):
    result = run_module("hf_grpo.train", *args, timeout=120)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_help_renders():
    result = run_module("hf_grpo.train", "--help", timeout=120)
    assert result.returncode == 0, result.stderr
    assert "--dynamic_sampling" in result.stdout and "--learning_rate" in result.stdout
    assert "--miniature" in result.stdout and "--dry-run" in result.stdout


def test_split_argv():
    path, overrides, flags = split_argv(["r.yaml", "--a", "1", "--b=2", "--flag", "--dry-run"])
    assert path == "r.yaml" and overrides == {"a": "1", "b": "2", "flag": None} and flags == {"dry_run"}
