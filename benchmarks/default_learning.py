"""Does the embedded default learn, whatever the seed, the entry point and the floating-point path?

    python benchmarks/default_learning.py                          # 3 seeds x 2 commands x 2 thread settings
    python benchmarks/default_learning.py --seeds 0 --commands accelerate --threads unset   # README's run alone
    python benchmarks/default_learning.py --commands accelerate --threads unset --kernels sse4   # another CPU's path

Each run is a fresh process in a fresh working directory, so the recipe's relative ``output_dir``
(``outputs/tiny``) lands there and nothing is shared between runs:

- ``accelerate``: README's command exactly, ``HF_HUB_OFFLINE=1 accelerate launch -m hf_grpo.train`` (the
  ``accelerate`` beside this interpreter), plus ``--seed N`` for the seeds other than the recipe's;
- ``python``: ``HF_HUB_OFFLINE=1 python -m hf_grpo.train`` (this interpreter), same arguments.

``--threads unset`` leaves ``OMP_NUM_THREADS`` out of the environment (torch then computes with 1 thread,
``hf_grpo.launch.launcher.torch_threads``); ``--threads 2`` sets ``OMP_NUM_THREADS=2``, which both commands honour.
Different thread counts, like different CPUs, can take different floating-point paths (on a 2-core AVX2 machine with
torch 2.13, 1 and 2 threads gave identical numbers); different seeds change the model's initialization, the data
and the sampling, so they move the run much further.
``--kernels sse4`` runs with ``ATEN_CPU_CAPABILITY=default`` and ``MKL_ENABLE_INSTRUCTIONS=SSE4_2``: torch's and MKL's
kernels for a CPU without AVX, which round differently from this machine's own (``native``), i.e. the floating-point
path of another machine.

Per run the table shows held-out greedy accuracy before and after training on the recipe's held-out problems, the
gain with its paired 95% interval (``hf_grpo.evaluation.stats.gain_from_run``: the same problems graded before and
after, Bonett-Price adjusted Wald), how many problems went right -> wrong and wrong -> right, and the wall-clock
seconds of the whole command (start-up, warm start, both evaluations, training, reports), measured with
``time.perf_counter`` around the process. Runs go one after another, never side by side, so each has the machine
to itself apart from whatever else runs on it (the load average is printed first). ``pass`` is the issue's bar:
gain >= 0.20 and interval lower bound >= 0.10, within 300 s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from hf_grpo.evaluation.stats import gain_from_run
from hf_grpo.launch.launcher import resolve_program
from hf_grpo.launch.processes import shipped_dir


GAIN_BAR, LOW_BAR, SECONDS_BAR = 0.20, 0.10, 300.0
COMMANDS = ("accelerate", "python")
KERNELS = {"native": {}, "sse4": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}}


def recipe_values() -> dict:
    return yaml.safe_load((shipped_dir("recipes") / "tiny.yaml").read_text())


def command(kind: str, seed: int, recipe_seed: int) -> list[str]:
    """README's command (``accelerate``) or its ``python -m`` twin; ``--seed`` only for a seed not the recipe's."""
    if kind == "accelerate":
        beside = Path(sys.executable).parent / "accelerate"  # this environment's, as the activated venv's PATH has it
        base = [str(beside), "launch"] if beside.is_file() else resolve_program(["accelerate", "launch"])
    else:
        base = [sys.executable]
    argv = [*base, "-m", "hf_grpo.train"]
    return argv if seed == recipe_seed else [*argv, "--seed", str(seed)]


def run_one(kind: str, seed: int, threads: str, kernels: str, recipe: dict, root: Path, timeout: float) -> dict:
    workdir = root / f"{kind}-seed{seed}-threads{threads}-{kernels}"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS" and k not in KERNELS["sse4"]}
    env.update(HF_HUB_OFFLINE="1", **KERNELS[kernels])
    if threads != "unset":
        env["OMP_NUM_THREADS"] = threads
    argv = command(kind, seed, recipe["seed"])
    start = time.perf_counter()
    with open(workdir / "run.log", "w") as log:
        try:
            code = subprocess.run(
                argv, check=False, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout
            ).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    seconds = time.perf_counter() - start
    row = {
        "seed": seed,
        "command": kind,
        "threads": threads,
        "kernels": kernels,
        "seconds": seconds,
        "returncode": code,
        "dir": str(workdir),
    }
    gain = gain_from_run(workdir / recipe["output_dir"]) if code == 0 else None
    if gain is not None:
        row.update(gain)
    return row


def format_row(row: dict) -> str:
    head = f"{row['seed']:>4}  {row['command']:<10}  {row['threads']:>7}  {row['kernels']:<7}"
    if "gain" not in row:
        return f"{head}  FAILED (exit {row['returncode']}, see {row['dir']}/run.log)  {row['seconds']:7.0f}"
    low, high = row["ci95"]
    passed = row["gain"] >= GAIN_BAR and low >= LOW_BAR and row["seconds"] <= SECONDS_BAR
    return (
        f"{head}  {row['before_accuracy']:6.3f}  {row['after_accuracy']:5.3f}  {row['gain']:+5.3f}  "
        f"[{low:+.3f}, {high:+.3f}]  {row['right_to_wrong']:>5}  {row['wrong_to_right']:>5}  {row['seconds']:7.0f}  "
        f"{'yes' if passed else 'NO'}"
    )


HEADER = (
    "seed  command     threads  kernels  before  after   gain   95% interval      r->w   w->r  wall s  pass\n"
    "----  ----------  -------  -------  ------  -----  -----  ----------------  -----  -----  ------  ----"
)


def main() -> int:
    recipe = recipe_values()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=[recipe["seed"], recipe["seed"] + 1, recipe["seed"] + 2],
        help="training seeds (default: the recipe's and the next two)",
    )
    parser.add_argument("--commands", nargs="+", choices=COMMANDS, default=list(COMMANDS))
    parser.add_argument(
        "--threads", nargs="+", default=["unset", "2"], help="OMP_NUM_THREADS values; 'unset' leaves it out (1 thread)"
    )
    parser.add_argument(
        "--kernels", nargs="+", choices=list(KERNELS), default=["native"], help="sse4: another CPU's float path"
    )
    parser.add_argument("--out", default="/tmp/hf_grpo_bench_default", help="one working directory per run in here")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds before a run is stopped")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args()

    root = Path(args.out)
    print(
        f"embedded default (recipes/tiny.yaml: seed {recipe['seed']}, {recipe['arithmetic_eval_size']} held-out "
        f"problems), {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f} at start, python {platform.python_version()}"
    )
    print(f"README's command: HF_HUB_OFFLINE=1 {' '.join(command('accelerate', recipe['seed'], recipe['seed']))}")
    print(f"bar: gain >= {GAIN_BAR}, 95% interval lower bound >= {LOW_BAR}, wall <= {SECONDS_BAR:.0f} s\n")
    print(HEADER, flush=True)
    rows = []
    for seed in args.seeds:
        for kind in args.commands:
            for threads in args.threads:
                for kernels in args.kernels:
                    row = run_one(kind, seed, threads, kernels, recipe, root, args.timeout)
                    rows.append(row)
                    print(format_row(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    ok = all("gain" in r and r["gain"] >= GAIN_BAR and r["ci95"][0] >= LOW_BAR for r in rows)
    print(f"\n{'every run' if ok else 'NOT every run'} meets the learning bar (gain and interval; wall time shown)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
