"""Run under ``accelerate launch`` (2 CPU processes, gloo): ``hf_grpo.run.pipeline.agree_on_resume`` with what each
process found on "its own disk", per case; rank 0 writes each case's outcome on every process to the JSON file.

    accelerate launch --config_file accelerate_configs/cpu.yaml -m tests.scripts.resume_agreement_check out.json DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from accelerate.utils import gather_object

from hf_grpo.recipe import RecipeError
from hf_grpo.run.pipeline import agree_on_resume
from tests.helpers.common import tiny_config
from tests.scripts.check_main import run_check


# case -> (what rank 0 found, its problem), (what rank 1 found, its problem)
CASES = {
    "same": [("out/checkpoint-4", None), ("out/checkpoint-4", None)],
    "none_on_node_1": [("out/checkpoint-4", None), (None, None)],
    "older_on_node_1": [("out/checkpoint-4", None), ("out/checkpoint-2", None)],
    "problem_on_node_1": [("out/checkpoint-4", None), (None, "out/checkpoint-4 is incomplete: no manifest")],
    "none_anywhere": [(None, None), (None, None)],
}


def main(out: str, folder: str) -> None:
    rank = tiny_config(Path(folder)).process_index  # sets up the process group as a run does (gloo on a CPU)
    outcomes = {}
    for name, found in CASES.items():
        try:
            outcomes[name] = {"resume": agree_on_resume(*found[rank])}
        except RecipeError as exc:
            outcomes[name] = {"error": str(exc)}
    reports = gather_object([outcomes])
    if rank == 0:
        Path(out).write_text(json.dumps(reports))


if __name__ == "__main__":
    run_check(main, sys.argv[1], sys.argv[2])
