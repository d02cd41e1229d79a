"""Does a real pretrained model learn with hf_grpo on this CPU? ``recipes/smollm2-135m-arith.yaml`` on several seeds.

    hf-grpo model get smollm2-135m-instruct-q4_1              # once: the model (hf_grpo.local_models)
    python benchmarks/real_model_learning.py                  # seeds 0 1 2, one after another (10-23 min each, 2 cores)
    python benchmarks/real_model_learning.py --recipe recipes/smollm2-135m-reasoning.yaml
    python benchmarks/real_model_learning.py --seeds 0 --run-args "--max_steps 4"
    python benchmarks/real_model_learning.py --reuse          # only the table, from runs already in --out
    python benchmarks/real_model_learning.py --without-instruction   # + base and adapter on the questions as written

Each seed is one run of ``python -m hf_grpo.train RECIPE --seed S --output_dir OUT/seed-S`` (this interpreter: with
vLLM's CPU build installed the recipe's ``generation.backend: auto`` serves through a real vLLM server, else HF
generate in the training process; the table says which), in its own process, one after another, never side by side.

What it prints per seed, all read from the run's own files:

- held-out greedy accuracy before and after training on the recipe's held-out set (``arithmetic_transfer``,
  ``arithmetic_reasoning``, ``word_problems_held_out``: docs/data.md; each seed draws its own set), and the gain with
  its paired 95% interval
  (``hf_grpo.evaluation.stats.gain_from_run``: the same problems graded before and after);
- format: the share of held-out answers in the format the prompt asks for, ending with ``#### N`` and using ``####``
  nowhere else (``hf_grpo.rewards.functions.hash_final_format``), before and after;
- the gain per kind of held-out problem (the records' ``kind``) with its paired interval, and the kinds that fell
  (interval below 0);
- with ``--without-instruction``: the base model and the adapter graded again with each question as written, without
  the recipe's answer instruction (``hf_grpo.evaluate``), the paired gain and the kinds that fell;
- wall seconds of the whole command (``time.perf_counter`` around the process: model load, both evaluations,
  training, reports), the training loop's seconds (``train_runtime``) and the mean seconds per optimizer step by
  phase from ``training_history.json`` (``time/generate``, ``time/reward``, ``time/score``, ``time/train``,
  ``time/weight_sync``; the first step included);
- the seconds of each held-out evaluation in the run (``eval_results.json`` ``seconds``): before and after, and the
  run watch's own (step 0 after a warm start, the periodic ones, the kept adapter's evaluation after training), as a
  share of the wall time without them: what the watch adds to a run.

The bar (issues 29 and 58): on each seed the interval lies above 0 and no kind's lies below 0 (with
``--without-instruction``, for both prompts); the goal is a lower bound of +0.05. Exit status 1 when a seed misses.
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

from hf_grpo import local_models
from hf_grpo.evaluation.stats import gain_from_run, gains_by_kind, paired_gain
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


def summarize(out: Path, seconds: float) -> dict:
    """The numbers of one finished run (see the module docstring)."""
    row = {"dir": str(out), "wall": seconds, **gain_from_run(out)}
    before, after = records(out, "before"), records(out, "after")
    for label, recs in (("before", before), ("after", after)):
        row[f"format_{label}"] = sum(hash_final_format([r["completion"] for r in recs.values()])) / len(recs)
    row["kinds"] = gains_by_kind(list(before.values()), list(after.values()))  # the records' own ``kind``
    history = json.loads((out / HISTORY_FILE).read_text())
    steps = [r for r in history if "time/step" in r]
    row["steps"] = len(steps)
    row["train_runtime"] = next((r["train_runtime"] for r in history if "train_runtime" in r), None)
    for phase in (*PHASES, "step"):
        values = [r[f"time/{phase}"] for r in steps if f"time/{phase}" in r]
        row[f"s_{phase}"] = sum(values) / len(values) if values else 0.0
    row["eval_seconds"] = json.loads((out / "eval_results.json").read_text()).get("seconds", {})
    recipe = yaml.safe_load((out / "recipe.yaml").read_text())
    row["backend"] = (recipe.get("generation") or {}).get("backend") or "transformers"
    return row


def without_instruction(python: str, out: Path) -> dict:
    """Base model and adapter graded again on the run's held-out set, each question as written (no answer
    instruction): ``{"gain": paired_gain, "kinds": gains_by_kind}``, each record's kind taken from the run's own."""
    values = yaml.safe_load((out / "recipe.yaml").read_text())
    base = local_models.resolve(values["model_name_or_path"]) or values["model_name_or_path"]
    after = records(out, "after")
    graded = {}
    for label, model in (("base", base), ("adapter", str(out))):
        path = out / f"plain-{label}.jsonl"
        if not path.is_file():
            argv = [python, "-m", "hf_grpo.evaluate", model, "--recipe", str(out / "recipe.yaml"),
                    "--prompt-template", "{question}", "--output", str(path), "--no-progress"]  # fmt: skip
            subprocess.run(argv, check=True, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        graded[label] = [json.loads(line) for line in path.read_text().splitlines()]
        for record in graded[label]:
            run_record = after[record["index"]]  # the same problem: its question is in both prompts
            assert _question(record) in _question(run_record), f"{path} is not the run's held-out set"
            if "kind" in run_record:
                record["kind"] = run_record["kind"]
    before, adapter = graded["base"], graded["adapter"]
    gain = paired_gain([r["grade"] for r in before], [r["grade"] for r in adapter])
    return {"gain": gain, "kinds": gains_by_kind(before, adapter)}


def _question(record: dict) -> str:
    prompt = record["prompt"]
    return (prompt if isinstance(prompt, str) else prompt[-1]["content"]).split("\n")[0]


def passes(gain: dict, kinds: dict[str, dict]) -> bool:
    """The bar: the whole gain's interval above ``LOW_BAR`` and no kind's interval below 0."""
    return gain["ci95"][0] > LOW_BAR and not any(k["ci95"][1] < 0 for k in kinds.values())


def format_plain(plain: dict) -> str:
    g = plain["gain"]
    fell = [kind for kind, k in plain["kinds"].items() if k["ci95"][1] < 0]
    return (
        f"      without the instruction: {g['before_accuracy']:.3f} -> {g['after_accuracy']:.3f} {g['gain']:+.3f} "
        f"[{g['ci95'][0]:+.3f}, {g['ci95'][1]:+.3f}]; kinds fell: {', '.join(fell) or 'none'}; per kind: "
        + "; ".join(
            f"{kind} {k['gain']:+.2f} [{k['ci95'][0]:+.2f}, {k['ci95'][1]:+.2f}]" for kind, k in plain["kinds"].items()
        )
    )


HEADER = (
    "seed  before  after   gain   95% interval      r->w  w->r  format before->after  kinds fell  wall s  train s"
    "  s/step (gen + train)  backend"
)


def format_row(seed: int, row: dict) -> str:
    low, high = row["ci95"]
    fell = ",".join(kind for kind, g in row["kinds"].items() if g["ci95"][1] < 0) or ("none" if row["kinds"] else "-")
    return (
        f"{seed:>4}  {row['before_accuracy']:6.3f}  {row['after_accuracy']:5.3f}  {row['gain']:+5.3f}  "
        f"[{low:+.3f}, {high:+.3f}]  {row['right_to_wrong']:>4}  {row['wrong_to_right']:>4}  "
        f"{row['format_before']:>9.2f} -> {row['format_after']:.2f}  {fell:>10}  {row['wall']:6.0f}  "
        f"{row['train_runtime'] or 0:7.0f}  {row['s_step']:6.1f} ({row['s_generate']:.1f} + {row['s_train']:.1f})"
        f"  {row['backend']}"
    )


def format_kinds(row: dict) -> str:
    """One line: each kind's gain and paired 95% interval (issue 47's bars are per kind)."""
    parts = [
        f"{kind} {g['before_accuracy']:.2f}->{g['after_accuracy']:.2f} {g['gain']:+.2f} "
        f"[{g['ci95'][0]:+.2f}, {g['ci95'][1]:+.2f}] (n {g['n']})"
        for kind, g in row["kinds"].items()
    ]
    return "      per kind: " + "; ".join(parts) if parts else ""


def format_seconds(row: dict) -> str:
    """One line: the run's held-out evaluations in seconds; all but the first before and after are the watch's (a
    second ``after`` is the kept adapter's)."""
    if not row["eval_seconds"]:
        return ""
    first = {label: row["eval_seconds"][label] for label in ("before", "after") if label in row["eval_seconds"]}
    watch = [(label, seconds) for label, seconds in row["eval_seconds"].items() if label not in first]
    theirs = sum(s for _, s in watch)
    return (
        f"      evaluations: before {first.get('before', 0):.0f} s, after {first.get('after', 0):.0f} s; the watch's "
        f"({', '.join(label for label, _ in watch) or 'none'}): {theirs:.0f} s, "
        f"{theirs / max(row['wall'] - theirs, 1e-9):.1%} of the wall time without them"
    )


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
    parser.add_argument(
        "--without-instruction",
        action="store_true",
        help="after each run, grade the base model and the adapter again with each question as written (no answer "
        "instruction; hf_grpo.evaluate, greedy, the recipe's token budget): two more evaluations a seed",
    )
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
        for line in (format_kinds(rows[seed]), format_seconds(rows[seed])):
            if line:
                print(line, flush=True)
        ok = ok and passes(rows[seed], rows[seed]["kinds"])
        if args.without_instruction:
            rows[seed]["without_instruction"] = plain = without_instruction(args.python, out)
            print(format_plain(plain), flush=True)
            ok = ok and passes(plain["gain"], plain["kinds"])
    goal = sum(r["ci95"][0] >= GOAL for r in rows.values())
    print(f"\ninterval above 0 on {sum(r['ci95'][0] > LOW_BAR for r in rows.values())} of {len(args.seeds)} seeds; "
          f"lower bound >= {GOAL:+.2f} on {goal}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
