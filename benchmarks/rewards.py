"""Reward workers: hf_grpo's ``RewardPool`` vs pebble's ``ProcessPool``; and isolated vs in-process vs TRL grading.

    python benchmarks/rewards.py                      # the pools (about 1 minute on 2 cores)
    python benchmarks/rewards.py --pool ours          # only RewardPool (or --pool pebble)
    python benchmarks/rewards.py --pool none --graders          # only the grader comparison (about 2.5 minutes)
    python benchmarks/rewards.py --pool none --graders --n 400 --repeats 1  # a quick look

Pools (``--pool``, issue 10 item 6: could ``hf_grpo/base/workers.py`` be replaced by pebble?). The same work on
``RewardPool`` and on ``benchmarks/pebble_pool.py``'s ``PebblePool`` (``pebble.ProcessPool`` on the same preloaded
"forkserver" context, once as it comes and once with an initializer that adds ``hf_grpo/base/workers.py``'s worker hardening):
start-up (cold, in a fresh interpreter, and warm), throughput (``--pool-n`` completions graded with
``grade_completion`` by ``--workers`` workers, the pools taking turns), kill latency and replacement latency on a
1-worker pool (a hung item with timeout ``--kill-timeout``, then the next item), what a worker dying while idle does
to the pool, and which workers and helper processes outlive a parent that is SIGKILLed while a worker is stuck in C
code. The method is printed above the tables.

Graders (``--graders``). It builds N realistic completions in code (half GSM8K-style, half MATH-style: reasoning then
a ``####``, boxed or "The answer is" answer, about 55% right, 35% wrong and 10% unparseable), then times, wall clock,
best of ``--repeats`` after one warm-up:

- ``hf_grpo`` isolated: ``gsm8k_correctness`` on the GSM8K half and ``math_correctness`` on the MATH half, each
  through ``isolate`` on one ``RewardPool`` of ``--workers`` processes;
- ``hf_grpo`` in-process: the same two functions called directly;
- TRL's ``trl.rewards.accuracy_reward`` on all N, with conversational completions and a MATH-style gold
  (``\\boxed{answer}``) for every item, which is all it reads.

Then it inserts ONE pathological completion (a factorial math-verify never finishes) into the MATH half and times the isolated
call with it (at the default 10 s timeout and at 2 s). TRL's function is run on the same batch only in a subprocess
with a hard time limit, since in-process it would never return; the in-process ``hf_grpo`` path is not run on it for
the same reason.

This script holds the command line and the grader comparison; the completions are built in
``benchmarks/reward_completions.py`` and the pool comparison is ``benchmarks/reward_pools.py``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from reward_completions import PATHOLOGICAL, build
from reward_pools import POOL_CHOICES, POOL_LABELS, compare_pools, pool_child


REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
if "--heavy-main" in sys.argv:  # this main module then imports the training stack, as python -m hf_grpo.train does
    _started = time.perf_counter()
    import trl.trainer.grpo_trainer  # noqa: F401

    print(f"--heavy-main: this script imported trl.trainer.grpo_trainer in {time.perf_counter() - _started:.2f} s")


# ---------------------------------------------------------------------------------------------------------------------
# Timing


def best_of(fn, repeats: int) -> tuple[float, object]:
    """(best wall-clock seconds of ``repeats`` runs after one warm-up, the last result)."""
    out = fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return min(times), out


TRL_SCRIPT = """
import json, sys, time
from trl.rewards import accuracy_reward
data = json.load(open(sys.argv[1]))
start = time.perf_counter()
accuracy_reward(completions=data["completions"], solution=data["solution"])
print(f"returned after {time.perf_counter() - start:.1f} s")
"""


def trl_in_subprocess(completions: list, solution: list, limit: float) -> str:
    """Run TRL's accuracy_reward in a fresh interpreter with a hard time limit; what happened, in words."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"completions": completions, "solution": solution}, f)
    start = time.perf_counter()
    try:
        result = subprocess.run(
            [sys.executable, "-c", TRL_SCRIPT, f.name], capture_output=True, text=True, timeout=limit, check=False
        )
    except subprocess.TimeoutExpired:
        return (
            f"no result after {limit:.0f} s: killed (math-verify's signal timeouts cannot interrupt the C-level work)"
        )
    finally:
        os.unlink(f.name)
    if result.returncode != 0:
        return f"failed after {time.perf_counter() - start:.1f} s: {result.stderr.strip().splitlines()[-1:]}"
    return result.stdout.strip()


def machine() -> str:
    model = platform.processor() or platform.machine()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"{model}; {cores} cores available; Python {platform.python_version()}; {platform.system()}; load avg {load}"
    )


# ---------------------------------------------------------------------------------------------------------------------
# Graders: hf_grpo isolated vs in-process vs TRL's accuracy_reward


def compare_graders(args: argparse.Namespace) -> None:
    """Isolated vs in-process ``hf_grpo`` grading vs TRL's ``accuracy_reward``, then one pathological completion."""
    from trl.rewards import accuracy_reward

    from hf_grpo.rewards.functions import gsm8k_correctness, math_correctness
    from hf_grpo.rewards.wrapper import RewardPool, isolate

    data = build(args.n)
    g, m, trl = data["gsm8k"], data["math"], data["trl"]
    print_graders_method(args, len(g["completions"]), len(m["completions"]))

    start = time.perf_counter()
    pool = RewardPool(args.workers)
    iso_g = isolate(gsm8k_correctness, pool, timeout=10.0)
    iso_m = isolate(math_correctness, pool, timeout=10.0)
    startup = time.perf_counter() - start

    # Each half is timed on its own (a recipe uses one correctness reward per dataset); "all" is their sum.
    graders = {
        "hf_grpo isolated": (lambda: iso_g(**g), lambda: iso_m(**m)),
        "hf_grpo in-process": (lambda: gsm8k_correctness(**g), lambda: math_correctness(**m)),
    }
    rows, outputs = time_graders(args, graders, lambda: accuracy_reward(**trl), len(g["completions"]))
    print_graders_table(args, rows, outputs, startup)
    clean_s = next(r[3] for r in rows if r[0] == "hf_grpo isolated" and r[1] == "MATH")
    pathological_batch(args, pool, m, clean_s, outputs["hf_grpo isolated"][1])
    pool.close()


def print_graders_method(args: argparse.Namespace, n_g: int, n_m: int) -> None:
    print("== graders: hf_grpo isolated vs in-process vs TRL's accuracy_reward")
    print(
        f"N = {args.n} completions ({n_g} GSM8K-style, {n_m} MATH-style); wall clock (time.perf_counter), "
        f"best of {args.repeats} after 1 warm-up; isolated pool: {args.workers} worker processes (forkserver)"
    )
    print()


def fraction_correct(rewards) -> float:
    return sum(r == 1.0 for r in rewards) / len(rewards)


def time_graders(args: argparse.Namespace, graders: dict, trl_call, n_g: int) -> tuple[list, dict]:
    """Best-of timings of each hf_grpo grader per half and of TRL's one call for all N.

    Returns (rows, outputs): rows of (grader, subset, N, best seconds or None, share of rewards equal to 1.0);
    outputs[grader] the [GSM8K, MATH] rewards of its last run.
    """
    rows, outputs = [], {}
    for label, calls in graders.items():
        total, outs = 0.0, []
        for subset, call in zip(("GSM8K", "MATH"), calls, strict=True):
            seconds, out = best_of(call, args.repeats)
            total += seconds
            outs.append(out)
            rows.append((label, subset, len(out), seconds, fraction_correct(out)))
        rows.append((label, "all", args.n, total, fraction_correct(outs[0] + outs[1])))
        outputs[label] = outs
    seconds, trl_out = best_of(trl_call, args.repeats)
    rows.append(("trl accuracy_reward", "GSM8K", n_g, None, fraction_correct(trl_out[:n_g])))
    rows.append(("trl accuracy_reward", "MATH", args.n - n_g, None, fraction_correct(trl_out[n_g:])))
    rows.append(("trl accuracy_reward", "all", args.n, seconds, fraction_correct(trl_out)))
    return rows, outputs


def print_graders_table(args: argparse.Namespace, rows: list, outputs: dict, startup: float) -> None:
    """The timing table, whether isolation changed any reward, and what each grader grades."""
    print(f"{'grader':<20} {'subset':<6} {'N':>5} {'best s':>8} {'compl/s':>9} {'reward 1.0':>10}")
    for label, subset, n, secs, correct in rows:
        timing = f"{secs:8.3f} {n / secs:9.0f}" if secs is not None else f"{'(one call for all)':>18}"
        print(f"{label:<20} {subset:<6} {n:>5} {timing} {correct:>10.1%}")
    print()
    same = outputs["hf_grpo isolated"] == outputs["hf_grpo in-process"]
    print(f"isolated == in-process rewards on all {args.n}: {same}; pool start + load checks: {startup:.2f} s")
    print("what each grades:")
    print("  hf_grpo: the GSM8K half with gsm8k_correctness against the '#### N' gold (####, boxed, 'answer is', last")
    print("           number; exact rationals), the MATH half with math_correctness against the \\boxed{} gold")
    print("           (math-verify; the last box counts; malformed operators such as \\dfrac12 are read)")
    print(
        "  trl:     all N with math-verify's LaTeX extraction against a \\boxed{answer} gold (both halves); a '####'"
    )
    print("           or plain-text answer is not extracted, so on the GSM8K half it is not comparable")
    print()


def pathological_batch(args: argparse.Namespace, pool, m: dict, clean_s: float, iso_m_out: list) -> None:
    """The MATH half with one never-ending completion: isolated at two timeouts, TRL in a time-limited subprocess."""
    from hf_grpo.rewards.functions import math_correctness
    from hf_grpo.rewards.wrapper import isolate

    n_m = len(m["completions"])
    bad = {"completions": list(m["completions"]), "solution": list(m["solution"])}
    at = len(bad["completions"]) // 2
    bad["completions"].insert(at, PATHOLOGICAL)
    bad["solution"].insert(at, r"\boxed{1}")
    print(f"one pathological completion (99999999999!) inserted at position {at} of the MATH half ({n_m + 1} items):")
    print(f"  hf_grpo isolated, clean MATH half ({n_m}):         {clean_s:7.2f} s (best of {args.repeats}, above)")
    for timeout in (10.0, 2.0):
        reward = isolate(math_correctness, pool, name=f"math_correctness_t{timeout:g}", timeout=timeout)
        start = time.perf_counter()
        out = reward(**bad)
        seconds = time.perf_counter() - start
        others_same = out[:at] + out[at + 1 :] == iso_m_out
        counters = pool.counters[reward.__name__]
        print(
            f"  hf_grpo isolated, with it, reward_timeout={timeout:>4g} s: {seconds:7.2f} s (1 run); its reward: "
            f"{out[at]}, timeouts: {counters['timeouts']}, other {n_m} rewards unchanged: {others_same}"
        )
    print("  hf_grpo in-process, with it:                 not run (would never return)")
    limit = max(args.trl_limit, 1.0)
    print(f"  trl accuracy_reward, with it, in a subprocess (hard limit {limit:.0f} s): ", end="", flush=True)
    trl_bad = [[{"role": "assistant", "content": c}] for c in bad["completions"]]
    print(trl_in_subprocess(trl_bad, bad["solution"], limit))
    print(f"  worker processes started in all: {pool.started_workers} ({pool.num_workers} + replacements)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--pool",
        choices=sorted(POOL_CHOICES),
        default="both",
        help="pools to compare: hf_grpo's RewardPool ('ours'), pebble's ProcessPool as it comes and with our worker "
        "initializer ('pebble'), all three ('both'), or none",
    )
    parser.add_argument(
        "--graders",
        action="store_true",
        help="also compare isolated / in-process / TRL grading and the pathological batch (--n completions; about "
        "2.5 minutes on 2 cores at the defaults)",
    )
    parser.add_argument(
        "--heavy-main",
        action="store_true",
        help="import TRL's trainer in this main module first, as the training script does: a worker that re-ran the "
        "main module (multiprocessing's default) would pay it at every start and replacement",
    )
    parser.add_argument("--n", type=int, default=2000, help="completions for --graders")
    parser.add_argument("--pool-n", type=int, default=512, help="completions for the pool throughput")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per grader (--graders)")
    parser.add_argument("--pool-repeats", type=int, default=5, help="timed runs per pool (throughput)")
    parser.add_argument("--kill-timeout", type=float, default=2.0, help="timeout T of the pools' hung item (s)")
    parser.add_argument("--trl-limit", type=float, default=60.0, help="hard limit for TRL on the bad batch (s)")
    parser.add_argument("--_child", choices=sorted(POOL_LABELS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.pool in ("pebble", "both"):
        import importlib.util

        if importlib.util.find_spec("pebble") is None:
            parser.error("--pool pebble/both needs pebble, which hf_grpo does not depend on: pip install pebble")
    if args._child:
        pool_child(args._child, args.workers)
        return
    logging.basicConfig(level=logging.WARNING, format="    [log] %(message)s")
    print(f"machine: {machine()}")
    print()
    if args.graders:
        compare_graders(args)
        print()
    if args.pool != "none":
        compare_pools(args)
    print(f"load avg at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
