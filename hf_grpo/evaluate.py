"""Evaluate a model or a LoRA adapter on a math dataset: greedy pass@1, sampled pass@k, correct / wrong / unparseable.

    python -m hf_grpo.evaluate outputs/tiny                        # the trained adapter, on the run's held-out split
    python -m hf_grpo.evaluate Qwen/Qwen2.5-Math-1.5B --dataset math500 --prompt-style r1_zero --max-new-tokens 1024
    python -m hf_grpo.evaluate outputs/run --num-samples 8 --temperature 1.0 --output per_example.jsonl
    hf-grpo eval outputs/tiny                                      # the same command, from the hf-grpo console script

A run's directory sets the defaults to the run's; bad input exits with status 2, one line on stderr (docs/grading.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import yaml

from .base.run_files import RECIPE_FILE, write_text
from .evaluation.checks import check_max_new_tokens, check_model, check_output
from .launch.launcher import apply_thread_policy
from .rewards import RewardArguments


# hf_grpo.evaluation.core's default, read here without importing torch: bad input fails before the heavy imports
DEFAULT_GRADE_TIMEOUT = RewardArguments.reward_timeout
ERROR_PREFIX = "hf_grpo.evaluate: error:"
PROG = "python -m hf_grpo.evaluate"  # the name in --help; `hf-grpo eval` passes its own


def fail(message) -> int:
    """Report a bad input as the module does: one line on stderr, exit status 2."""
    print(f"{ERROR_PREFIX} {' '.join(str(message).split())}", file=sys.stderr)  # noqa: T201
    return 2


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors are the module's one-line errors (exit status 2)."""

    def error(self, message: str):
        self.exit(fail(f"{message} (see {self.prog} --help)"))


def _positive(kind: type, noun: str, bound: str):
    """An argparse type: the text as a positive ``kind``; its errors say the text is not ``noun`` or ``bound``."""

    def convert(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{bound}, got {text}")
        return value

    return convert


positive_seconds = _positive(float, "a number of seconds", "must be positive")  # --grade-timeout
positive_int = _positive(int, "a whole number", "must be at least 1")  # the counts (--max-samples, --num-samples...)


def parse_args(argv: list[str] | None, prog: str = PROG):
    p = ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    p.add_argument("model", help="model id or directory, or a LoRA adapter directory (e.g. a run's output_dir)")
    p.add_argument("--recipe", help="take dataset, prompts and budget from this recipe (default: the run's own)")
    p.add_argument("--dataset", help="preset (arithmetic, gsm8k, math, math500, openmathinstruct2), hub id or file")
    p.add_argument("--split", help="split to evaluate (default: the dataset's held-out split)")
    p.add_argument("--task", choices=["gsm8k", "math"], help="grader (default: the dataset's)")
    p.add_argument("--prompt-column")
    p.add_argument("--solution-column")
    p.add_argument("--prompt-style", choices=["chat", "plain", "r1_zero"])
    p.add_argument("--prompt-template")
    p.add_argument("--max-samples", type=positive_int, help="evaluate the first N problems only")
    p.add_argument("--max-new-tokens", type=positive_int)
    p.add_argument("--num-samples", type=positive_int, default=1, help="k for pass@k (sampled), besides greedy pass@1")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature for pass@k")
    p.add_argument(
        "--batch-size",
        type=positive_int,
        help="problems per generate call (default: the training run's, at least 8 on a CPU and 64 on a GPU; halved "
        "while a GPU runs out of memory)",
    )
    p.add_argument(
        "--device",
        help="cpu, cuda or cuda:N (default: cuda when torch sees a CUDA GPU, else cpu; --backend transformers)",
    )
    p.add_argument("--seed", type=int)
    p.add_argument("--backend", choices=["transformers", "vllm"], default="transformers")
    p.add_argument("--output", help="write one JSON line per problem here")
    p.add_argument(
        "--grade-timeout",
        type=positive_seconds,
        help="seconds one completion may take to grade before it counts as 'timeout' (default: the recipe's "
        f"reward_timeout, else {DEFAULT_GRADE_TIMEOUT:g})",
    )
    p.add_argument("--trust-remote-code", action="store_true", help="run code shipped with the model (off by default)")
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        help="progress bars on stderr for generation and grading (default: bars when stderr is a terminal, else a log "
        "line on generation's progress every 30 s)",
    )
    return p.parse_args(argv)


def find_recipe(path: Path) -> Path | None:
    return next((folder / RECIPE_FILE for folder in (path, path.parent) if (folder / RECIPE_FILE).is_file()), None)


def recipe_values(recipe: Path | None) -> dict:
    """The settings of ``recipe`` ({} for none); ValueError for a file that is not a YAML mapping."""
    if recipe is None:
        return {}
    from .recipe import load_yaml  # hf_grpo.recipe imports trl: not for --help or a bad model path

    if not recipe.is_file():
        raise FileNotFoundError(f"recipe {recipe} does not exist; pass an existing file to --recipe")
    try:
        with open(recipe) as f:
            values = load_yaml(f)
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        mark = getattr(exc, "problem_mark", None)  # where the parser gave up, for a syntax error
        problem = f"line {mark.line + 1}: {exc.problem}" if mark is not None else str(exc)
        raise ValueError(
            f"recipe {recipe} is not valid YAML ({problem}); fix it, or pass another with --recipe"
        ) from None
    if values is None:
        return {}
    if isinstance(values, dict):
        return {k: v for k, v in values.items() if isinstance(k, str)}
    raise ValueError(
        f"recipe {recipe} holds a {type(values).__name__}, not a mapping of settings; fix it, or pass another with "
        "--recipe"
    )


def grade_timeout(args: argparse.Namespace, values: dict) -> float:
    """Seconds per completion for grading: ``--grade-timeout``, else the recipe's ``reward_timeout``, else 10."""
    if args.grade_timeout is not None:
        return args.grade_timeout
    if values.get("reward_timeout") is None:
        return DEFAULT_GRADE_TIMEOUT
    try:
        return positive_seconds(str(values["reward_timeout"]))
    except argparse.ArgumentTypeError as exc:
        raise ValueError(f"recipe reward_timeout {values['reward_timeout']!r}: {exc}; pass --grade-timeout") from None


def evaluate_run(model: str, args: argparse.Namespace | None = None, **overrides):
    """Evaluate ``model`` (a run's output_dir, a base model or an adapter dir) and return the ``EvalResult``.

    ``overrides`` are the command-line options by their Python names (``dataset="math500"``, ``num_samples=8``).
    Raises ``ValueError`` / ``FileNotFoundError`` for a model, recipe or dataset that cannot be loaded.
    """
    if args is None:
        args = parse_args([model])
    for key, value in overrides.items():
        setattr(args, key, value)
    check_model(args.model)
    recipe = Path(args.recipe) if args.recipe else find_recipe(Path(args.model))
    values = recipe_values(recipe)
    timeout = grade_timeout(args, values)
    if args.max_new_tokens is not None:  # before the data and the model load, as training checks its length
        check_max_new_tokens(args.model, args.max_new_tokens, args.trust_remote_code)
    # imported once the inputs are checked: the evaluation loads torch, transformers and datasets
    from .evaluation.saved_model import evaluate_saved

    return evaluate_saved(args, values, recipe, timeout)


def write_records(output: str, records: list[dict]) -> None:
    """One JSON line per problem, written to a temporary file next to ``output`` and renamed into place."""
    write_text(output, "".join(json.dumps(record) + "\n" for record in records))


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    args = parse_args(argv, prog)
    try:
        check_output(args.output)  # before evaluating: a bad --output must not cost the results
        check_model(args.model)  # (evaluate_run checks it too) before torch is imported
        apply_thread_policy()  # the same per-process thread count as training, so the same numbers
        result = evaluate_run(args.model, args)
    except (ValueError, FileNotFoundError) as exc:
        return fail(exc)
    if args.output:
        write_records(args.output, result.records)
    print(json.dumps(result.summary(), indent=2))  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
