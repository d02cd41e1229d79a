"""Train a policy with GRPO from one YAML recipe.

    accelerate launch -m hf_grpo.train recipes/qwen7b.yaml          # a recipe (positional, or --config PATH)
    accelerate launch -m hf_grpo.train                              # the embedded tiny default (recipes/tiny.yaml)
    python -m hf_grpo.train recipes/qwen7b.yaml --dry-run           # check it and print layout and batch arithmetic
    python -m hf_grpo.train recipes/qwen7b.yaml --miniature         # run it on this machine in miniature (CPU)
    python -m hf_grpo.train recipes/tiny.yaml --learning_rate 1e-3  # override any key on the command line

A run loads the policy (or builds and warm-starts the embedded tiny model), the datasets and the reward functions,
measures held-out accuracy, trains with ``hf_grpo.GRPOTrainer``, saves the model (the adapter, as safetensors, with
LoRA), measures held-out accuracy again and writes ``eval_results.json``, ``training_history.json`` and
``training_curves.png`` to ``output_dir``. A recipe error exits with code 2 and a one-line message.
"""

from __future__ import annotations

import logging
import sys

from .generation.server import ServerStartError
from .launch import (
    ProgramNotFound,
    apply_thread_policy,
    inside_launch,
    needs_launcher,
    plan_commands,
    run_launcher,
)
from .pipeline import resume_target, run
from .recipe import SECTIONS, RecipeError, apply_env, load_recipe, render_dry_run


logger = logging.getLogger("hf_grpo")


def train(recipe: str | None = None, **overrides) -> dict:
    """Run a recipe from Python (a notebook, a script): ``train("recipes/tiny.yaml", max_steps=30)``.

    Keyword arguments override recipe keys exactly as ``--key value`` does on the command line (``generation`` takes
    a dict). Returns the before/after held-out evaluation. Raises ``RecipeError`` for a bad recipe.
    """
    import json

    from .recipe import NESTED

    argv = [recipe] if recipe else []
    for key, value in overrides.items():
        if key in NESTED and isinstance(value, dict):
            argv += [f"--{key}.{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in value.items()]
        else:
            argv.append(f"--{key}={json.dumps(value) if not isinstance(value, str) else value}")
    apply_thread_policy()
    loaded, _ = load_recipe(argv, for_run=True)
    apply_env(loaded)
    return run(loaded)


FLAG_HELP = """
flags:
  --dry-run     check the recipe, print the resolved values, layout, batch arithmetic and commands; run nothing
  --miniature   run the recipe here in miniature: same code path, tiny local model and data, 2 steps, 2 processes
                (with --dry-run: print exactly what a miniature swaps)
"""


def print_help() -> None:
    from trl import TrlParser

    TrlParser(tuple(SECTIONS.values()), prog="python -m hf_grpo.train [RECIPE.yaml]").print_help()
    print(FLAG_HELP)  # noqa: T201


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    dry_run = any(a in ("--dry-run", "--dry_run") for a in argv)
    if any(a in ("-h", "--help") for a in argv):
        print_help()
        return 0
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    apply_thread_policy()  # before anything computes (a miniature builds its model while loading the recipe)
    try:
        recipe, _ = load_recipe(argv, for_run=not dry_run)
    except RecipeError as exc:
        print(f"hf_grpo: error: {exc}", file=sys.stderr)  # noqa: T201
        return 2
    passthrough = [a for a in argv if a not in ("--dry-run", "--dry_run")]
    if dry_run:
        print(render_dry_run(recipe, [str(c) for c in plan_commands(recipe, passthrough)]))  # noqa: T201
        return 0
    apply_env(recipe)
    if needs_launcher(recipe):
        try:
            resume_target(recipe.training, recipe.layout.num_processes)  # a bad checkpoint: before the launch
            return run_launcher(recipe, passthrough)
        except (ProgramNotFound, RecipeError) as exc:
            print(f"hf_grpo: error: {exc}", file=sys.stderr)  # noqa: T201
            return 2
        except ServerStartError as exc:  # the server did not come up, or its port was taken
            print(f"hf_grpo: error: {exc}", file=sys.stderr)  # noqa: T201
            return 1
    if recipe.generation.starts_server() and inside_launch():
        print(  # noqa: T201
            "hf_grpo: error: this recipe starts a vLLM server (generation.backend: vllm_server), which needs the "
            "launcher: run `python -m hf_grpo.train RECIPE` instead of `accelerate launch`, or start the server "
            "yourself and set generation.base_url",
            file=sys.stderr,
        )
        return 2
    from .rewards.isolation import RewardFailedError

    try:
        run(recipe)
    except RecipeError as exc:  # found by the checks run() makes before loading (the checkpoint to resume from)
        print(f"hf_grpo: error: {exc}", file=sys.stderr)  # noqa: T201
        return 2
    except RewardFailedError as exc:  # a reward failing on every completion, stopped early (reward_max_failed_calls)
        print(f"\nhf_grpo: error: {exc}", file=sys.stderr)  # noqa: T201  (on a line of its own, after tqdm's)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
