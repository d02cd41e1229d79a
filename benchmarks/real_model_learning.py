"""Does a real pretrained model learn with hf_grpo on this CPU? ``recipes/smollm2-135m-arith.yaml`` on several seeds.

    hf-grpo model get smollm2-135m-instruct-q4_1              # once: the model (hf_grpo.local_models)
    python benchmarks/real_model_learning.py                  # seeds 0 1 2, one after another (~11-12 min each here)
    python benchmarks/real_model_learning.py --recipe recipes/smollm2-135m-reasoning.yaml
    python benchmarks/real_model_learning.py --seeds 0 --run-args "--max_steps 4"
    python benchmarks/real_model_learning.py --reuse          # only the table, from runs already in --out

Each seed is one run of ``python -m hf_grpo.train RECIPE --seed S --output_dir OUT/seed-S`` (this interpreter: with
vLLM's CPU build installed the recipe's ``generation.backend: auto`` serves through a real vLLM server, else HF
generate in the training process; the table says which), in its own process, one after another, never side by side.

What it prints per seed, all read from the run's own files:

- held-out greedy accuracy before and after training on the recipe's held-out set (``arithmetic_transfer``: a third
  held-out questions of the training templates, a third the same operations phrased differently, a third two
  operations in one problem; ``arithmetic_reasoning``: those, three operations and a distractor number, a fifth each;
  each seed draws its own set), and the gain with its paired 95% interval
  (``hf_grpo.evaluation.stats.gain_from_run``: the same problems graded before and after);
- format: the share of held-out answers in the format the prompt asks for, ending with ``#### N`` and using ``####``
  nowhere else (``hf_grpo.rewards.functions.hash_final_format``), before and after;
- the gain per kind of held-out problem (seen / rephrased / two_step [/ three_step / distractor]), with its interval
  in the ``--json`` rows;
- wall seconds of the whole command (``time.perf_counter`` around the process: model load, both evaluations,
  training, reports), the training loop's seconds (``train_runtime``) and the mean seconds per optimizer step by
  phase from ``training_history.json`` (``time/generate``, ``time/reward``, ``time/score``, ``time/train``,
  ``time/weight_sync``; the first step included).

The issue's bar (29): on each seed the interval lies above 0; the goal is a lower bound of +0.05.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

import yaml

from hf_grpo.data.arithmetic import HELD_OUT_SETS, REASONING_KINDS
from hf_grpo.evaluation.stats import gain_from_run, paired_gain
from hf_grpo.generation.vllm_install import find_vllm
from hf_grpo.rewards.functions import hash_final_format
from hf_grpo.run_files import EVAL_RECORDS, HISTORY_FILE


REPO = Path(__file__).resolve().parent.parent
PHASES = ("generate", "reward", "score", "train", "weight_sync")
LOW_BAR, GOAL = 0.0, 0.05


def run(python: str, recipe: str, seed: int, out: Path, run_args: list[str], timeout: float) -> tuple[int, float]:
    """One training run in its own process; (exit code, wall seconds)."""
    argv = [python, "-m", "hf_grpo.train", recipe, "--seed", str(seed), "--output_dir", str(out), *run_args]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    with open(out.with_suffix(".log"), "w") as log:
        log.write(shlex.join(argv) + "\n")
        log.flush()
        try:
            done = subprocess.run(
                argv, check=False, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout
            )
            returncode = done.returncode
        except subprocess.TimeoutExpired:
            returncode = -1
    seconds = time.perf_counter() - start
    (out.parent / f"{out.name}.wall").write_text(f"{seconds:.1f}\n")
    return returncode, seconds


def records(out: Path, label: str) -> dict[int, dict]:
    lines = (out / EVAL_RECORDS.format(label=label)).read_text().splitlines()
    return {r["index"]: r for r in map(json.loads, lines)}


def kinds_of(out: Path, before: dict[int, dict]) -> dict[int, str]:
    """Each held-out problem's kind, from the set the run drew (an embedded held-out set, its size and seed)."""
    values = yaml.safe_load((out / "recipe.yaml").read_text())
    make = HELD_OUT_SETS.get(values.get("eval_dataset_name"))
    if make is None:
        return {}
    problems = make(values["arithmetic_eval_size"], values["seed"])
    kinds = {}
    for index, record in before.items():
        problem = problems[index]
        text = record["prompt"] if isinstance(record["prompt"], str) else record["prompt"][-1]["content"]
        if problem["question"] not in text:  # not the set this benchmark assumes: no per-kind numbers
            return {}
        kinds[index] = problem["kind"]
    return kinds


def summarize(out: Path, seconds: float) -> dict:
    """The numbers of one finished run (see the module docstring)."""
    row = {"dir": str(out), "wall": seconds, **gain_from_run(out)}
    before, after = records(out, "before"), records(out, "after")
    for label, recs in (("before", before), ("after", after)):
        row[f"format_{label}"] = sum(hash_final_format([r["completion"] for r in recs.values()])) / len(recs)
    kinds = kinds_of(out, before)
    for kind in REASONING_KINDS:
        index = [i for i, k in kinds.items() if k == kind]
        if index:
            row[f"gain_{kind}"] = paired_gain([before[i]["grade"] for i in index], [after[i]["grade"] for i in index])
    history = json.loads((out / HISTORY_FILE).read_text())
    steps = [r for r in history if "time/step" in r]
    row["steps"] = len(steps)
    row["train_runtime"] = next((r["train_runtime"] for r in history if "train_runtime" in r), None)
    for phase in (*PHASES, "step"):
        values = [r[f"time/{phase}"] for r in steps if f"time/{phase}" in r]
        row[f"s_{phase}"] = sum(values) / len(values) if values else 0.0
    recipe = yaml.safe_load((out / "recipe.yaml").read_text())
    row["backend"] = (recipe.get("generation") or {}).get("backend") or "transformers"
    return row


HEADER = (
    "seed  before  after   gain   95% interval      r->w  w->r  format before->after  gain seen/rephrased/two_step"
    "[/three_step/distractor]  wall s  train s  s/step (gen + train)  backend"
)


def format_row(seed: int, row: dict) -> str:
    low, high = row["ci95"]
    kinds = "/".join(f"{row[f'gain_{k}']['gain']:+.2f}" for k in REASONING_KINDS if f"gain_{k}" in row) or "-"
    return (
        f"{seed:>4}  {row['before_accuracy']:6.3f}  {row['after_accuracy']:5.3f}  {row['gain']:+5.3f}  "
        f"[{low:+.3f}, {high:+.3f}]  {row['right_to_wrong']:>4}  {row['wrong_to_right']:>4}  "
        f"{row['format_before']:>9.2f} -> {row['format_after']:.2f}  {kinds:>27}  {row['wall']:6.0f}  "
        f"{row['train_runtime'] or 0:7.0f}  {row['s_step']:6.1f} ({row['s_generate']:.1f} + {row['s_train']:.1f})"
        f"  {row['backend']}"
    )


def format_kinds(row: dict) -> str:
    """One line: each kind's gain and paired 95% interval (issue 47's bars are per kind)."""
    parts = []
    for kind in REASONING_KINDS:
        if f"gain_{kind}" in row:
            g = row[f"gain_{kind}"]
            parts.append(f"{kind} {g['before_accuracy']:.2f}->{g['after_accuracy']:.2f} {g['gain']:+.2f} "
                         f"[{g['ci95'][0]:+.2f}, {g['ci95'][1]:+.2f}]")  # fmt: skip
    if not parts:
        return ""
    return f"      per kind (n each: {row['gain_seen']['n']}): " + "; ".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="recipes/smollm2-135m-arith.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default="/tmp/hf_grpo_bench_real_model", help="one output_dir per seed in here")
    parser.add_argument("--run-args", default="", help="more recipe overrides for every run, e.g. '--max_steps 4'")
    parser.add_argument("--python", default=sys.executable, help="the interpreter that runs hf_grpo.train")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds before a run is stopped")
    parser.add_argument("--reuse", action="store_true", help="skip seeds whose run already finished in --out")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args()

    root = Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    print(
        f"{args.recipe}{' ' + args.run_args if args.run_args else ''}: seeds {args.seeds}; {platform.machine()}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start; vLLM here: {find_vllm().describe()}"
    )
    print(f"bar: paired 95% interval of the held-out gain above {LOW_BAR:+.2f} on every seed (goal: >= {GOAL:+.2f})")
    print(HEADER, flush=True)
    rows, ok = {}, True
    for seed in args.seeds:
        out = root / f"seed-{seed}"
        wall = root / f"{out.name}.wall"
        if args.reuse and (out / "eval_results.json").is_file() and wall.is_file():
            code, seconds = 0, float(wall.read_text())
        else:
            code, seconds = run(args.python, args.recipe, seed, out, shlex.split(args.run_args), args.timeout)
        if code != 0:
            print(f"{seed:>4}  FAILED (exit {code}, see {out.with_suffix('.log')})", flush=True)
            ok = False
            continue
        rows[seed] = summarize(out, seconds)
        print(format_row(seed, rows[seed]), flush=True)
        if format_kinds(rows[seed]):
            print(format_kinds(rows[seed]), flush=True)
        ok = ok and rows[seed]["ci95"][0] > LOW_BAR
    goal = sum(r["ci95"][0] >= GOAL for r in rows.values())
    print(f"\ninterval above 0 on {sum(r['ci95'][0] > LOW_BAR for r in rows.values())} of {len(args.seeds)} seeds; "
          f"lower bound >= {GOAL:+.2f} on {goal}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
