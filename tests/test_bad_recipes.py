"""Bad recipes: each is refused before anything loads, with exit code 2 and one line naming the key and the fix.

Each case runs ``hf_grpo.train.main`` in-process (fast); what only a fresh interpreter shows (undecodable files, a
directory, a real run that must not load the model): tests/test_bad_recipes_subprocess.py.
"""

from __future__ import annotations

import time

import pytest

from hf_grpo.train import main

from .helpers.common import REPO


TINY = str(REPO / "recipes" / "tiny.yaml")
RECIPES = sorted((REPO / "recipes").glob("*.yaml"))
BASE = "model_name_or_path: tiny\ndataset_name: arithmetic\nreport_to: none\n"
TINY_SIZES = ["--generation.max_model_len", "256", "--max_completion_length", "128"]  # within the tiny model's 256
VLLM_SERVER = ["--generation.backend", "vllm_server"]
# lists of 9 aliases, 7 levels deep: 4.8 million strings once expanded (echoed whole, a 254 MB error line)
ALIAS_BOMB = "lora_target_modules:\n  - &a0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"  - &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 7)
)
# the same in a mapping of any values, which no type check refuses
BOMB_MAPPING = "".join(f"    a{n}: {line[4:]}\n" for n, line in enumerate(ALIAS_BOMB.splitlines()[1:]))

# (case id, command-line overrides on recipes/tiny.yaml, text the one error line must contain)
OVERRIDES = [
    # the run watch's keys, each checked with the config's other fields (issue 69)
    ("floor-a-word", ["--watch_floors", "{entropy: low}"], "watch_floors.entropy is 'low', write a float"),
    ("floor-share-5", ["--watch_floors", "{signal: 5}"], "watch_floors.signal is a share of groups, above 0 and at"),
    ("floor-nan", ["--watch_floors", "{completion_length: .nan}"], "watch_floors must be a finite number, got nan"),
    (
        "plateau-no-held-out",
        [
            "--dataset_name",
            "{tmp}/data.jsonl",
            "--prompt_column",
            "q",
            "--solution_column",
            "a",
            "--task_eval_steps",
            "0",
            "--stop_on",
            "[plateau]",
        ],
        "stop_on: [plateau] reads held-out evaluations during training, and",
    ),
    # data sizes against the batch and the machine, and keys for another dataset
    (
        "one-word-problem",
        ["--dataset_name", "word_problems", "--arithmetic_train_size", "1"],
        "the training data has at most 1 rows (arithmetic_train_size)",
    ),
    (
        "a-hundred-million",
        ["--arithmetic_train_size", "100000000"],
        "arithmetic_train_size 100000000 would take about",
    ),
    (
        "max-lines-without-warm-start",
        ["--warm_start_max_lines", "2"],
        "warm_start_max_lines: 2 keeps a pretrained policy's warm start to short gold solutions, and this recipe has",
    ),
    (
        "word-key-on-arithmetic",
        ["--word_problems_max_steps", "2"],
        "word_problems_max_steps is read only with dataset_name: word_problems",
    ),
    (
        "compare-key-on-arithmetic",
        ["--word_problems_compare", "true"],
        "word_problems_compare is read only with dataset_name: word_problems",
    ),
    # keys of other TRL configs and of our own sections, before spelling
    (
        "async-grpo-key",
        ["--max_inflight_tasks", "4"],
        "a field of TRL's AsyncGRPOConfig (trl.experimental.async_grpo.async_grpo_config), not of the GRPOConfig",
    ),
    (
        "section-key-on-top",
        ["--max_staleness", "2"],
        "a key of the generation section; write --generation.max_staleness",
    ),
    ("lr-nan", ["--learning_rate", ".nan"], "learning_rate"),
    (
        "warm-start-zero3",
        ["--model_name_or_path", "Qwen/Qwen2.5-0.5B", "--warm_start_steps", "4", "--accelerate_config", "zero3"],
        "warm_start_steps: 4 trains a pretrained model before GRPO, on weights that ZeRO-3 shards",
    ),
    ("two-step-share", ["--arithmetic_two_step_share", "1.5"], "arithmetic_two_step_share"),
    ("lr-inf", ["--learning_rate", ".inf"], "learning_rate"),
    ("lr-neg-inf", ["--learning_rate", "-.inf"], "learning_rate"),
    ("lr-nan-text", ["--learning_rate", "nan"], "learning_rate must be a finite number, got 'nan'"),
    ("lr-inf-text", ["--learning_rate", "inf"], "learning_rate must be a finite number, got 'inf'"),
    ("lr-negative", ["--learning_rate", "-1e-3"], "learning_rate"),
    ("lr-string", ["--learning_rate", "fast"], "learning_rate"),
    ("max-completion-0", ["--max_completion_length", "0"], "max_completion_length"),
    ("max-completion-neg", ["--max_completion_length", "-16"], "max_completion_length"),
    ("max-completion-over-context", ["--max_completion_length", "1000000"], "max_position_embeddings 256"),
    ("max-model-len-over-context", ["--generation.max_model_len", "4096"], "generation.max_model_len 4096"),
    ("temperature-neg", ["--temperature", "-1"], "temperature"),
    ("temperature-0", ["--temperature", "0"], "temperature"),
    ("temperature-nan", ["--temperature", ".nan"], "temperature"),
    ("top-p-0", ["--top_p", "0"], "top_p"),
    ("top-p-2", ["--top_p", "2"], "top_p"),
    ("lora-r-0", ["--lora_r", "0"], "lora_r"),
    ("lora-r-neg", ["--lora_r", "-8"], "lora_r"),
    ("lora-alpha-0", ["--lora_alpha", "0"], "lora_alpha"),
    ("lora-dropout-1", ["--lora_dropout", "1.0"], "lora_dropout"),
    ("streaming", ["--dataset_streaming", "true"], "dataset_streaming"),
    ("task-algebra", ["--task", "algebra"], "task"),
    ("txt-dataset", ["--dataset_name", "{tmp}/data.txt"], "dataset_name"),
    ("tsv-dataset", ["--dataset_name", "problems.tsv"], "dataset_name"),
    ("missing-jsonl", ["--dataset_name", "{tmp}/nope.jsonl"], "dataset_name"),
    ("missing-eval-jsonl", ["--eval_dataset_name", "{tmp}/nope.jsonl"], "eval_dataset_name"),
    ("report-to-unknown", ["--report_to", "[nosuchtracker]"], "report_to"),
    ("report-to-typo", ["--report_to", "wandbb"], "report_to"),
    ("report-to-not-installed", ["--report_to", "[mlflow]"], "report_to"),
    ("lora-target-unknown", ["--lora_target_modules", "[nosuch_proj]"], "lora_target_modules"),
    ("lora-target-typo", ["--lora_target_modules", "[q_proj, v_prj]"], "lora_target_modules"),
    ("lora-target-regex", ["--lora_target_modules", "nosuch.*"], "lora_target_modules"),
    ("lora-target-malformed", ["--lora_target_modules", "[q_proj,"], "lora_target_modules"),
    ("lora-target-malformed-map", ["--reward_kwargs", "{a: 1"], "reward_kwargs"),
    ("arith-train-0", ["--arithmetic_train_size", "0"], "arithmetic_train_size"),
    ("arith-train-neg", ["--arithmetic_train_size", "-5"], "arithmetic_train_size"),
    ("arith-eval-0", ["--arithmetic_eval_size", "0"], "arithmetic_eval_size"),
    ("arith-eval-neg", ["--arithmetic_eval_size", "-3"], "arithmetic_eval_size"),
    ("output-dir-file", ["--output_dir", "{tmp}/data.txt"], "output_dir"),
    ("output-dir-under-file", ["--output_dir", "{tmp}/data.txt/run"], "output_dir"),
    ("batch-8e9", ["--per_device_train_batch_size", "8000000000"], "per_device_train_batch_size"),
    ("batch-over-max-train-samples", ["--max_train_samples", "10"], "per_device_train_batch_size"),
    ("batch-0", ["--per_device_train_batch_size", "0"], "per_device_train_batch_size"),
    ("max-steps-0", ["--max_steps", "0"], "max_steps"),
    ("epochs-0", ["--max_steps", "-1", "--num_train_epochs", "0"], "num_train_epochs"),
    ("num-processes-neg", ["--num_processes", "-2"], "num_processes"),
    ("num-processes-0", ["--num_processes", "0"], "num_processes"),
    ("save-steps-0", ["--save_strategy", "steps", "--save_steps", "0"], "save_steps"),
    ("logging-steps-0", ["--logging_steps", "0"], "logging_steps"),
    ("save-strategy-bad", ["--save_strategy", "sometimes"], "save_strategy"),
    ("loss-type-bad", ["--loss_type", "ppo"], "loss_type"),
    ("prompt-style-bad", ["--prompt_style", "html"], "prompt_style"),
    ("advantage-bad", ["--advantage_estimator", "gae"], "advantage_estimator"),
    ("unknown-option", ["--learnin_rate", "1e-6"], "learnin_rate"),
    ("seed-negative", ["--seed", "-1"], "seed"),
    ("seed-float", ["--seed", "1.5"], "seed"),
    ("use-peft-int", ["--use_peft", "3"], "use_peft"),
    ("num-generations-1", ["--num_generations", "1"], "num_generations"),
    ("max-generation-batches-0", ["--max_generation_batches", "0"], "max_generation_batches"),
    ("eval-split-1", ["--eval_split_size", "1.5"], "eval_split_size"),
    ("beta-neg", ["--beta", "-0.1"], "beta"),
    ("generation-batch-0", ["--generation_batch_size", "0"], "generation_batch_size"),
    ("reward-timeout-0", ["--reward_timeout", "0"], "reward_timeout"),
    ("reward-unknown", ["--reward_funcs", "[nosuch_reward]"], "nosuch_reward"),
    ("tiny-hidden-0", ["--tiny_hidden_size", "0"], "tiny_hidden_size"),
    ("hub-token", ["--hub_token", "hf_abc"], "hub_token"),
    # Values that passed the check and failed (or hung) later
    ("hub-model-id-list", ["--hub_model_id", "[hf_abc]"], "hub_model_id '[hf_abc]' is not a Hub repository id"),
    ("hub-model-id-space", ["--hub_model_id", "me/my model"], "hub_model_id"),
    ("hub-model-id-3-parts", ["--hub_model_id", "a/b/c"], "hub_model_id"),
    ("base-url-port", [*VLLM_SERVER, "--generation.base_url", "http://127.0.0.1:99999"], "generation.base_url"),
    ("base-url-scheme", [*VLLM_SERVER, "--generation.base_url", "ftp://127.0.0.1:8000"], "generation.base_url"),
    ("base-url-no-host", [*VLLM_SERVER, "--generation.base_url", "http://:8000"], "generation.base_url"),
    ("base-url-no-scheme", [*VLLM_SERVER, "--generation.base_url", "localhost:8000"], "generation.base_url"),
    ("output-dir-unwritable", ["--output_dir", "/proc/hf_grpo_no_such/run"], "output_dir '/proc/hf_grpo_no_such/run'"),
    ("output-dir-sys", ["--output_dir", "/sys/hf_grpo_run"], "output_dir '/sys/hf_grpo_run'"),
]

# (case id, recipe file text, text the one error line must contain)
FILES = [
    ("duplicate-key", BASE + "learning_rate: 1e-3\nseed: 1\nlearning_rate: 2e-3\n", "learning_rate"),
    ("duplicate-nested", BASE + "generation:\n  backend: vllm_server\n  backend: vllm_colocate\n", "backend"),
    ("empty", "", "empty"),
    ("comment-only", "# nothing here\n# at all\n", "empty"),
    ("empty-mapping", "{}\n", "empty"),
    ("int-key", BASE + "1: 2\n", "1"),
    ("bool-key", BASE + "true: 2\n", "True"),
    ("nested-int-key", BASE + "generation:\n  1: 2\n", "1"),
    ("a-list", "- learning_rate: 1e-3\n", "mapping"),
    ("bad-yaml", BASE + "learning_rate: [1e-3\n", "invalid YAML"),
    ("lora-without-peft", BASE + "lora_r: 8\nlora_alpha: 16\n", "lora_r"),
    ("lora-peft-false", BASE + "use_peft: false\nlora_target_modules: [q_proj]\n", "lora_target_modules"),
    ("dora-peft-false", BASE + "use_peft: false\nuse_dora: true\n", "use_dora"),
    ("env-token", BASE + "env: {HF_TOKEN: abc}\n", "HF_TOKEN"),
    ("env-api-key", BASE + "env: {WANDB_API_KEY: abc}\n", "WANDB_API_KEY"),
    ("env-password", BASE + "env: {DB_PASSWORD: abc}\n", "DB_PASSWORD"),
    ("env-bad-name", BASE + "env: {'MY VAR': abc}\n", "MY VAR"),
    ("env-list", BASE + "env: [A, B]\n", "env"),
    ("env-nested-value", BASE + "env: {A: {b: 1}}\n", "env.A"),
    ("unknown-key", BASE + "lerning_rate: 1e-3\n", "lerning_rate"),
    ("wrong-type-list", BASE + "seed: [1, 2]\n", "seed"),
    ("wrong-type-str", BASE + "per_device_train_batch_size: many\n", "per_device_train_batch_size"),
    ("yes-as-bool", BASE + "num_generations: yes\n", "num_generations"),
    ("lr-nan-file", BASE + "learning_rate: .nan\n", "learning_rate"),
    ("num-processes-file", BASE + "num_processes: -2\n", "num_processes"),
    ("save-steps-file", BASE + "save_strategy: steps\nsave_steps: 0\n", "save_steps"),
    ("generation-unknown", BASE + "generation: {backnd: vllm_server}\n", "backnd"),
    ("generation-not-mapping", BASE + "generation: vllm\n", "generation"),
    ("alias-bomb", BASE + "use_peft: true\n" + ALIAS_BOMB, "lora_target_modules"),
    ("alias-bomb-in-mapping", BASE + "reward_kwargs:\n  gsm8k_correctness:\n" + BOMB_MAPPING, "reward_kwargs"),
    ("recursive-alias", BASE + "reward_kwargs: &r {gsm8k_correctness: *r}\n", "reward_kwargs"),
    ("too-deep", BASE + "reward_kwargs: " + "[" * 3000 + "]" * 3000 + "\n", "nested"),
    ("duplicate-after-merge", BASE + "<<: {seed: 1}\nlearning_rate: 1e-3\nlearning_rate: 2e-3\n", "learning_rate"),
    ("duplicate-in-merged", BASE + "<<: {seed: 1, seed: 2}\n", "seed"),
    ("base-url-file", BASE + "generation: {backend: vllm_server, base_url: 'http://127.0.0.1:99999'}\n", "99999"),
]


@pytest.fixture
def data_txt(tmp_path):
    (tmp_path / "data.txt").write_text("1 + 1 = ?\t2\n")
    (tmp_path / "data.jsonl").write_text('{"q": "1 + 1 = ?", "a": "#### 2"}\n' * 40)
    return tmp_path


def assert_refused(argv: list[str], capsys, must_mention: str) -> str:
    start = time.monotonic()
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse-style exits count as the exit code
        code = exc.code
    elapsed = time.monotonic() - start
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("hf_grpo: error:")]
    assert code == 2, err
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert must_mention in lines[0], lines[0]
    assert elapsed < 10
    return lines[0]


@pytest.mark.parametrize(("overrides", "mention"), [c[1:] for c in OVERRIDES], ids=[c[0] for c in OVERRIDES])
def test_bad_override_is_refused(overrides, mention, data_txt, capsys, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    argv = [TINY, "--dry-run", *(a.replace("{tmp}", str(data_txt)) for a in overrides)]
    assert_refused(argv, capsys, mention)


@pytest.mark.parametrize(("text", "mention"), [c[1:] for c in FILES], ids=[c[0] for c in FILES])
def test_bad_recipe_file_is_refused(text, mention, tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert_refused([str(path), "--dry-run"], capsys, mention)


@pytest.mark.parametrize(("char", "name"), [("\u00a0", "a no-break space (U+00A0)"), ("\t", "a tab")])
def test_indentation_that_is_not_spaces_names_its_own_line(char, name, tmp_path, capsys):
    """A no-break space in an indentation (pasted from a web page) was refused naming the next line."""
    path = tmp_path / "bad.yaml"
    lines = BASE.splitlines() + ["generation:", f"{char} backend: transformers", "seed: 3"]
    path.write_text("\n".join(lines) + "\n")
    line = assert_refused([str(path), "--dry-run"], capsys, f"line {len(lines) - 1} is indented with {name}")
    assert "replace it with spaces" in line and "backend: transformers" in line


@pytest.mark.parametrize("last", [False, True], ids=["mid-file", "last-line"])
def test_a_no_break_space_after_a_colon_names_its_own_line(last, tmp_path, capsys):
    """`key:<U+00A0>value` (pasted from a web page) was refused as invalid YAML on the next line (or one past the
    end): the parser reads it as one scalar and gives up a line later."""
    path = tmp_path / "bad.yaml"
    lines = BASE.splitlines() + ["learning_rate:\u00a01.0e-3"] + ([] if last else ["seed: 3", "max_steps: 2"])
    path.write_text("\n".join(lines) + "\n")
    line = assert_refused([str(path), "--dry-run"], capsys, "line 4 holds a no-break space (U+00A0)")
    assert "replace it with a space" in line and "learning_rate:" in line, line


def test_a_model_folder_without_config_or_weights_is_refused_before_loading(tmp_path, capsys):
    """An empty model folder, or one with a config and no weights, failed in from_pretrained."""
    folder = tmp_path / "model"
    folder.mkdir()
    argv = [TINY, "--dry-run", "--model_name_or_path", str(folder)]
    assert_refused(argv, capsys, "has no config.json")
    (folder / "config.json").write_text("{}")
    assert_refused(argv, capsys, "has a config.json but no weights")


def test_an_alias_bomb_is_refused_in_one_short_line(tmp_path, capsys):
    """An alias bomb in a list value was refused with a 254 MB error line (1.2 GB RSS)."""
    import tracemalloc

    path = tmp_path / "bomb.yaml"
    path.write_text(BASE + "use_peft: true\n" + ALIAS_BOMB)
    tracemalloc.start()
    try:
        line = assert_refused([str(path), "--dry-run"], capsys, "lora_target_modules")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(line) < 1000, len(line)
    assert peak < 50_000_000, peak


def test_a_long_value_is_shortened_in_the_error(tmp_path, capsys):
    """What an error echoes is bounded (a 1 MB string is not printed whole)."""
    line = assert_refused([TINY, "--dry-run", "--seed", "x" * 1_000_000], capsys, "seed")
    assert len(line) < 1000 and "1000000 characters" in line, line[:2000]


def test_yaml_merge_keys_are_read(tmp_path, capsys):
    """`<<: *base` failed with "could not determine a constructor for the tag ...merge"."""
    from hf_grpo.recipe import load_recipe
    from hf_grpo.recipe.yaml12 import load_yaml

    data = load_yaml("base: &base {a: 1, b: 2}\nrun:\n  <<: *base\n  b: 3\n")
    assert data["run"] == {"a": 1, "b": 3}
    path = tmp_path / "merge.yaml"
    path.write_text(BASE + "max_completion_length: 16\n<<: {learning_rate: 1e-3, seed: 3}\nseed: 5\n")
    recipe, _ = load_recipe([str(path)], for_run=False)
    assert recipe.values["learning_rate"] == 1e-3 and recipe.values["seed"] == 5


@pytest.mark.parametrize("argv", [["--config", "--dry-run"], ["--config=", "--dry-run"], ["--config"]])
def test_a_flag_is_never_the_recipe_path(argv, capsys):
    """`--config --dry-run` took `--dry-run` as the recipe path."""
    line = assert_refused(argv, capsys, "--config needs a recipe file")
    assert "'--dry-run' does not exist" not in line


def test_output_dir_in_a_read_only_directory(tmp_path, capsys):
    """An output_dir under a read-only location failed in train.py with a traceback; nothing is
    created by the check."""
    import os

    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if os.access(locked, os.W_OK):
        pytest.skip("running as root: mode bits do not stop writes (the /proc and /sys cases cover it)")
    line = assert_refused([TINY, "--dry-run", "--output_dir", str(locked / "run")], capsys, "output_dir")
    assert str(locked / "run") in line
    assert list(locked.iterdir()) == []


def test_output_dir_check_leaves_nothing_behind(tmp_path, capsys):
    out = tmp_path / "new" / "run"
    assert main([TINY, "--dry-run", "--output_dir", str(out)]) == 0, capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("hub_id", ["run", "me/run", "my-org/qwen2.5-math_1.5b"])
def test_good_hub_model_ids_pass(hub_id, capsys):
    from hf_grpo.recipe import load_recipe

    recipe, _ = load_recipe([TINY, "--hub_model_id", hub_id], for_run=False)
    assert recipe.training.hub_model_id == hub_id


def test_a_good_base_url_passes(capsys):
    assert main([TINY, "--dry-run", *VLLM_SERVER, "--generation.base_url", "http://gpu-node:8000/"]) == 0, (
        capsys.readouterr().err
    )


def test_duplicate_key_names_both_lines(tmp_path, capsys):
    path = tmp_path / "dup.yaml"
    path.write_text(BASE + "learning_rate: 1e-3\nseed: 1\nlearning_rate: 2e-3\n")
    line = assert_refused([str(path), "--dry-run"], capsys, "learning_rate")
    assert "line 4" in line and "line 6" in line


@pytest.mark.parametrize("name", ["foo/bar", "someone/private-math"])
@pytest.mark.parametrize("variable", ["HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"])
def test_unknown_hub_dataset_offline_is_refused(name, variable, capsys, monkeypatch):
    monkeypatch.setenv(variable, "1")
    argv = [TINY, "--dry-run", "--dataset_name", name, "--task", "gsm8k", "--prompt_column", "q"]
    line = assert_refused([*argv, "--solution_column", "a"], capsys, "dataset_name")
    assert "offline" in line and name in line


def test_offline_dataset_in_mirror_is_accepted(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    mirror = tmp_path / "split.jsonl"
    mirror.write_text('{"q": "1 + 1", "a": "#### 2"}\n')
    splits = f"{{'foo/bar:train': {mirror}, 'foo/bar:test': {mirror}}}"
    argv = [TINY, "--dry-run", "--dataset_name", "foo/bar", "--task", "gsm8k", "--prompt_column", "q"]
    argv += ["--solution_column", "a", "--dataset_mirror", splits, "--max_train_samples"]
    assert main([*argv, "1000", "--per_device_train_batch_size", "8"]) == 0, capsys.readouterr().err


@pytest.mark.parametrize(
    "env", ["TOKENIZERS_PARALLELISM", "OMP_NUM_THREADS", "WANDB_MODE", "KEYBOARD_LAYOUT", "TOKENIZER_NAME"]
)
def test_non_secret_env_is_allowed(env, tmp_path, capsys):
    path = tmp_path / "env.yaml"
    path.write_text(f"{BASE}env: {{{env}: 'false'}}\n")
    assert main([str(path), "--dry-run"]) == 0, capsys.readouterr().err


def test_use_peft_false_on_the_command_line_turns_lora_off(capsys):
    assert main([TINY, "--dry-run", "--use_peft", "false", "--dtype", "float32"]) == 0, capsys.readouterr().err
    assert "full fine-tuning" in capsys.readouterr().out


def test_single_lora_target_stays_a_module_name(capsys):
    # trl.ModelConfig turns ["q_proj"] into the regex "q_proj", which PEFT matches against full names only
    from hf_grpo.recipe import load_recipe

    recipe, _ = load_recipe([TINY, "--lora_target_modules", "[q_proj]"], for_run=False)
    assert recipe.model.lora_target_modules == ["q_proj"]


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_every_shipped_recipe_still_dry_runs(recipe, capsys):
    assert main([str(recipe), "--dry-run"]) == 0, capsys.readouterr().err


@pytest.mark.parametrize(
    ("overrides", "environment", "mention"),
    [
        (["--push_to_hub", "true"], {"HF_TOKEN": "hf_x"}, "push_to_hub needs hub_model_id"),
        (["--push_to_hub", "true", "--hub_model_id", "me/run"], {}, "no Hugging Face token in the environment"),
        (["--push_to_hub", "true", "--hub_model_id", "me/run"], {"HF_TOKEN": "hf_x"}, "HF_HUB_OFFLINE is set"),
        (
            ["--push_to_hub", "true", "--hub_model_id", "me/run", "--hub_strategy", "every_save"],
            {"HF_TOKEN": "hf_x", "HF_HUB_OFFLINE": "0"},
            "hub_strategy: every_save is not supported",
        ),
    ],
    ids=["no-repo", "no-token", "offline", "hub-strategy"],
)
def test_a_push_that_would_fail_after_training_is_refused_before(overrides, environment, mention, capsys, monkeypatch):
    """push_to_hub without HF_TOKEN trained to the end and then failed (HubUsageError, exit 1);
    hub_strategy was silently ignored."""
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert_refused(["recipes/tiny.yaml", "--dry-run", *overrides], capsys, mention)


@pytest.mark.parametrize(
    ("key", "value", "replacement"),
    [
        ("torch_dtype", "bfloat16", "use dtype"),
        ("warmup_ratio", "0.1", "use warmup_steps with a float in [0, 1)"),
        ("overwrite_output_dir", "true", "resume_from_checkpoint: auto"),
        ("max_prompt_length", "512", "removed from TRL's GRPOConfig"),
        ("dataset_prompt_column", "problem", "use prompt_column"),
        ("evaluation_strategy", "steps", "renamed eval_strategy"),
    ],
)
def test_a_renamed_or_removed_key_names_its_replacement(key, value, replacement, tmp_path, capsys):
    """open-r1 / older TRL recipes were refused with a wrong hint (torch_dtype -> torch_compile,
    overwrite_output_dir -> output_dir)."""
    assert_refused([TINY, "--dry-run", f"--{key}", value], capsys, replacement)
    recipe = tmp_path / "openr1.yaml"
    recipe.write_text(f"model_name_or_path: tiny\n{key}: {value}\n")
    assert_refused([str(recipe), "--dry-run"], capsys, replacement)


def test_space_separated_lists_on_the_command_line(capsys):
    """`--help` (TRL's parser) shows `--reward_funcs REWARD_FUNCS [REWARD_FUNCS ...]`, but a second value
    was an 'unexpected argument'."""
    from hf_grpo.recipe import load_recipe

    recipe, _ = load_recipe(
        ["--lora_target_modules", "q_proj", "v_proj", TINY, "--reward_funcs", "gsm8k_correctness", "length"],
        for_run=False,
    )
    assert recipe.model.lora_target_modules == ["q_proj", "v_proj"]
    assert recipe.rewards.reward_funcs == ["gsm8k_correctness", "length"]
    recipe, _ = load_recipe(["--lora_r", "8", TINY], for_run=False)  # a scalar option does not take the recipe
    assert recipe.model.lora_r == 8


def test_a_real_model_without_a_recipe_asks_for_one(capsys):
    """`--model_name_or_path Qwen/... --dataset_name ...` with no recipe silently took the tiny recipe's
    learning rate 2e-3, max_completion_length 16, batch 128 and LoRA r16."""
    assert_refused(["--model_name_or_path", "Qwen/Qwen2.5-0.5B", "--dry-run"], capsys, "without a recipe")
    from hf_grpo.recipe import load_recipe

    recipe, _ = load_recipe(["--model_name_or_path", "tiny"], for_run=False)  # the embedded default still runs
    assert recipe.model.model_name_or_path == "tiny"


@pytest.mark.parametrize(
    ("argv", "adapted"),
    [
        # (a server of your own: a server started for the in-process tiny model is refused)
        (
            [
                "recipes/qwen7b-lora-dedicated.yaml",
                "--model_name_or_path",
                "tiny",
                "--generation.base_url",
                "http://127.0.0.1:8000",
                *TINY_SIZES,
            ],
            14,
        ),
        ([TINY, "--lora_target_modules", "q_proj"], 2),
        ([TINY, "--lora_target_modules", "q_proj", "v_proj"], 4),
    ],
    ids=["all-linear", "one-module", "two-modules"],
)
def test_lora_targets_reach_peft_in_a_form_it_applies(argv, adapted):
    """CI3: keeping a one-item list a list made `all-linear` (a string only PEFT understands) ['all-linear'], and
    every 7B recipe failed in miniature with NoMatchingPeftModuleError."""
    from peft import get_peft_model
    from trl import get_peft_config

    from hf_grpo.models.tiny import build_model, build_tokenizer
    from hf_grpo.recipe import load_recipe

    recipe, _ = load_recipe(argv, for_run=False)
    model = get_peft_model(build_model(build_tokenizer(), hidden_size=32), get_peft_config(recipe.model))
    assert sum(name.endswith("lora_A.default") for name, _ in model.named_modules()) == adapted


def test_a_hub_dataset_without_the_columns_stops_before_the_model_loads(tmp_path, capsys, monkeypatch):
    """A dataset whose columns were not what the recipe says passed --dry-run and died after the model
    was built. A hub dataset's columns are known only once it loads; it now loads before the model."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    mirror = tmp_path / "split.jsonl"
    mirror.write_text('{"q": "1 + 1", "a": "#### 2"}\n' * 40)
    out = tmp_path / "run"
    argv = [TINY, "--dataset_name", "foo/bar", "--task", "gsm8k", "--output_dir", str(out), "--report_to", "none"]
    argv += ["--dataset_mirror", f"{{'foo/bar:train': {mirror}, 'foo/bar:test': {mirror}}}"]
    line = assert_refused(argv, capsys, "prompt_column is not set")
    assert "data:" in line and "foo/bar" in line
    assert not (out / "base_model").exists()  # the embedded model is saved there once built: it never was


def test_the_arithmetic_loader_refuses_a_split_it_does_not_have():
    """Any split name but train was read as the held-out split of the embedded data."""
    from hf_grpo.data.loaders import DataArguments, _load_raw

    args = DataArguments(dataset_name="arithmetic", arithmetic_eval_size=16)
    assert len(_load_raw("arithmetic", None, "test", args, 0)) == 16
    with pytest.raises(ValueError, match="has the splits 'train' and 'test', not 'validation'"):
        _load_raw("arithmetic", None, "validation", args, 0)
