"""Reward workers: hf_grpo's ``RewardPool`` vs pebble's ``ProcessPool``; and isolated vs in-process vs TRL grading.

    python benchmarks/rewards.py                      # the pools (about 1 minute on 2 cores)
    python benchmarks/rewards.py --pool ours          # only RewardPool (or --pool pebble)
    python benchmarks/rewards.py --pool none --graders          # only the grader comparison (about 2.5 minutes)
    python benchmarks/rewards.py --pool none --graders --n 400 --repeats 1  # a quick look

Pools (``--pool``, issue 10 item 6: could ``hf_grpo/workers.py`` be replaced by pebble?). The same work on
``RewardPool`` and on ``benchmarks/pebble_pool.py``'s ``PebblePool`` (``pebble.ProcessPool`` on the same preloaded
"forkserver" context, once as it comes and once with an initializer that adds ``hf_grpo/workers.py``'s worker hardening):
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
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
if "--heavy-main" in sys.argv:  # this main module then imports the training stack, as python -m hf_grpo.train does
    _started = time.perf_counter()
    import trl.trainer.grpo_trainer  # noqa: F401

    print(f"--heavy-main: this script imported trl.trainer.grpo_trainer in {time.perf_counter() - _started:.2f} s")

# math-verify computes this factorial for ever (Math-Verify#65's power tower no longer reaches it: grading refuses
# powers of over MAX_POWER_DIGITS digits)
PATHOLOGICAL = r"\boxed{99999999999!}"

# ---------------------------------------------------------------------------------------------------------------------
# Completions

NAMES = ["Natalia", "James", "Maria", "Tom", "Aisha", "Wei", "Priya", "Carlos", "Janet", "Olga"]
ITEMS = ["apples", "clips", "pencils", "eggs", "books", "marbles", "stickers", "cupcakes"]


def _gsm8k_item(rng: random.Random) -> tuple[str, str, str]:
    """(completion, GSM8K gold, MATH-style gold for TRL), with a random answer format and outcome."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b, price = rng.randint(2, 400), rng.randint(2, 60), rng.choice([1, 2, 3, 5, 12, 25])
    answer = (a + b) * price
    gold = f"{name} has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} {item}.\nThey cost {a + b} * {price} = {answer}.\n#### {answer}"
    outcome = rng.choices(["correct", "wrong", "unparseable"], weights=[55, 35, 10])[0]
    value = answer if outcome == "correct" else answer + rng.choice([-price, price, -1, 10, a])
    steps = [
        f"{name} starts with {a} {item} and gets {b} more, so {a} + {b} = {a + b} {item}.",
        f"Each costs ${price}, so the total is {a + b} * {price} = {value}.",
    ]
    if rng.random() < 0.4:
        steps.insert(1, f"Let me double-check: {a + b} - {b} = {a}, which matches.")
    body = "\n".join(steps)
    if outcome == "unparseable":
        text = rng.choice(
            [
                f"{name} has some {item}. I am not sure how to work out the total cost.",
                f"We need the number of {item} first.\nThen multiply by the price.\n####",
                "Let's think step by step.",
            ]
        )
    else:
        shown = f"{value:,}" if value >= 1000 and rng.random() < 0.5 else str(value)
        text = rng.choice(
            [
                f"{body}\n#### {shown}",
                f"{body}\n#### ${shown}",
                f"{body}\n\nThe final answer is $\\boxed{{{shown}}}$.",
                f"{body}\nThe answer is {shown} dollars.",
                f"{body}\n**Answer:** {shown}",
                f"{body}\n#### {shown}\n\nQuestion: {rng.choice(NAMES)} has 5 {item} and buys 3 more.",
            ]
        )
    return text, gold, f"\\boxed{{{answer}}}"


# (gold, correct forms, wrong forms) of MATH answers
MATH_ANSWERS = [
    (r"\frac{1}{2}", [r"\frac{1}{2}", r"\dfrac12", "0.5", r"\frac{2}{4}"], [r"\frac{1}{3}", "2", "-0.5"]),
    (r"\frac{3}{4}", [r"\frac{3}{4}", r"\dfrac{3}{4}", "0.75"], [r"\frac{4}{3}", r"\frac{3}{8}"]),
    (r"2\sqrt{3}", [r"2\sqrt{3}", r"\sqrt{12}", r"2 \sqrt 3"], [r"3\sqrt{2}", r"\sqrt{6}"]),
    (r"\frac{\sqrt{3}}{2}", [r"\frac{\sqrt{3}}{2}", r"\frac{\sqrt3}{2}"], [r"\frac{1}{2}", r"\sqrt{3}"]),
    (r"\frac{\pi}{6}", [r"\frac{\pi}{6}", r"\pi/6"], [r"\frac{\pi}{3}", r"\frac{\pi}{4}"]),
    ("12", ["12", "12.0", r"12 \text{ cm}"], ["13", "-12", "21"]),
    ("-7", ["-7", "-7.0"], ["7", "-6"]),
    ("(1, 2)", ["(1, 2)", "(1,2)"], ["(2, 1)", "(1, 3)"]),
    ("x^2 + 2x + 1", ["x^2 + 2x + 1", "(x+1)^2"], ["x^2 + 1", "x^2 - 2x + 1"]),
    ("10000", ["10000", "10{,}000", "10,\\!000"], ["1000", "100000"]),
    (r"\frac{5}{16}", [r"\frac{5}{16}", "0.3125"], [r"\frac{5}{8}", r"\frac{3}{16}"]),
    ("36", ["36", "6^2"], ["30", "216"]),
]


def _math_item(rng: random.Random) -> tuple[str, str, str]:
    """(completion, MATH gold solution, MATH gold for TRL)."""
    gold, right, wrong = rng.choice(MATH_ANSWERS)
    outcome = rng.choices(["correct", "wrong", "unparseable"], weights=[55, 35, 10])[0]
    x = rng.randint(2, 9)
    steps = [
        f"Let $f(x) = x^2 - {2 * x}x + {x * x}$. Completing the square, $f(x) = (x - {x})^2$.",
        f"Substituting $x = {x + 1}$ gives $f({x + 1}) = 1$, and the constraint $y \\le {x}$ still holds.",
        "By symmetry we only need to consider the case $a \\ge b$, which halves the work.",
        f"The equation $\\frac{{a}}{{b}} = {x}$ means $a = {x}b$, so we substitute into the second equation.",
    ]
    body = " ".join(rng.sample(steps, rng.randint(1, 4)))
    if rng.random() < 0.3:
        body = body + "\n\n" + body  # longer completions
    solution = f"We simplify the expression step by step. Therefore the answer is $\\boxed{{{gold}}}$."
    if outcome == "unparseable":
        return f"{body}\nI could not finish the computation.", solution, solution
    answer = rng.choice(right if outcome == "correct" else wrong)
    text = rng.choice(
        [
            f"{body}\nTherefore the answer is $\\boxed{{{answer}}}$.",
            f"{body}\n\\[\n\\boxed{{{answer}}}\n\\]",
            f"{body}\nFinal answer: $\\boxed{{{answer}}}$",
            f"{body}\nSo we get $\\boxed{{{rng.choice(wrong)}}}$. Wait, let me recheck. Actually it is $\\boxed{{{answer}}}$.",
        ]
    )
    return text, solution, solution


def build(n: int, seed: int = 0) -> dict:
    """N completions: the first half GSM8K-style, the second half MATH-style."""
    rng = random.Random(seed)
    gsm8k = [_gsm8k_item(rng) for _ in range(n // 2)]
    math = [_math_item(rng) for _ in range(n - n // 2)]
    return {
        "gsm8k": {"completions": [c for c, _, _ in gsm8k], "solution": [g for _, g, _ in gsm8k]},
        "math": {"completions": [c for c, _, _ in math], "solution": [g for _, g, _ in math]},
        "trl": {
            "completions": [[{"role": "assistant", "content": c}] for c, _, _ in gsm8k + math],
            "solution": [t for _, _, t in gsm8k + math],
        },
    }


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


def compare_graders(args: argparse.Namespace) -> None:
    """Isolated vs in-process ``hf_grpo`` grading vs TRL's ``accuracy_reward``, then one pathological completion."""
    from trl.rewards import accuracy_reward

    from hf_grpo.rewards.functions import gsm8k_correctness, math_correctness
    from hf_grpo.rewards.wrapper import RewardPool, isolate

    data = build(args.n)
    g, m = data["gsm8k"], data["math"]
    n_g, n_m = len(g["completions"]), len(m["completions"])
    print("== graders: hf_grpo isolated vs in-process vs TRL's accuracy_reward")
    print(
        f"N = {args.n} completions ({n_g} GSM8K-style, {n_m} MATH-style); wall clock (time.perf_counter), "
        f"best of {args.repeats} after 1 warm-up; isolated pool: {args.workers} worker processes (forkserver)"
    )
    print()

    start = time.perf_counter()
    pool = RewardPool(args.workers)
    iso_g = isolate(gsm8k_correctness, pool, timeout=10.0)
    iso_m = isolate(math_correctness, pool, timeout=10.0)
    startup = time.perf_counter() - start

    rows = []  # (grader, subset, N, best seconds or None, share of rewards equal to 1.0)

    def fraction_correct(rewards) -> float:
        return sum(r == 1.0 for r in rewards) / len(rewards)

    # Each half is timed on its own (a recipe uses one correctness reward per dataset); "all" is their sum.
    outputs = {}
    graders = {
        "hf_grpo isolated": (lambda: iso_g(**g), lambda: iso_m(**m)),
        "hf_grpo in-process": (lambda: gsm8k_correctness(**g), lambda: math_correctness(**m)),
    }
    for label, calls in graders.items():
        total, outs = 0.0, []
        for subset, call in zip(("GSM8K", "MATH"), calls, strict=True):
            seconds, out = best_of(call, args.repeats)
            total += seconds
            outs.append(out)
            rows.append((label, subset, len(out), seconds, fraction_correct(out)))
        rows.append((label, "all", args.n, total, fraction_correct(outs[0] + outs[1])))
        outputs[label] = outs
    trl = data["trl"]
    seconds, trl_out = best_of(lambda: accuracy_reward(**trl), args.repeats)
    rows.append(("trl accuracy_reward", "GSM8K", n_g, None, fraction_correct(trl_out[:n_g])))
    rows.append(("trl accuracy_reward", "MATH", n_m, None, fraction_correct(trl_out[n_g:])))
    rows.append(("trl accuracy_reward", "all", args.n, seconds, fraction_correct(trl_out)))

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

    # ---- one pathological completion
    bad = {"completions": list(m["completions"]), "solution": list(m["solution"])}
    at = len(bad["completions"]) // 2
    bad["completions"].insert(at, PATHOLOGICAL)
    bad["solution"].insert(at, r"\boxed{1}")
    print(f"one pathological completion (99999999999!) inserted at position {at} of the MATH half ({n_m + 1} items):")
    clean_s = next(r[3] for r in rows if r[0] == "hf_grpo isolated" and r[1] == "MATH")
    iso_m_out = outputs["hf_grpo isolated"][1]
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
    pool.close()


# ---------------------------------------------------------------------------------------------------------------------
# Pools: hf_grpo's RewardPool vs pebble's ProcessPool (issue 10, item 6)

POOL_CHOICES = {
    "ours": ["ours"],
    "pebble": ["pebble", "pebble+init"],
    "both": ["ours", "pebble", "pebble+init"],
    "none": [],
}
POOL_LABELS = {
    "ours": "hf_grpo RewardPool",
    "pebble": "pebble (stock)",
    "pebble+init": "pebble + our init",
}
FIRST_ITEM = {"completion": r"so $\boxed{\frac{1}{2}}$", "gold": r"\boxed{0.5}"}  # one MATH grade
ORPHAN_WAIT_S = 3.0  # after the parent's SIGKILL, how long its workers get to go away
POOL_TIMEOUT_S = 10.0  # the per-completion timeout of the throughput runs (recipes' default reward_timeout)


def make_pool(kind: str, workers: int):
    if kind == "ours":
        from hf_grpo.rewards.wrapper import RewardPool

        return RewardPool(workers)
    from pebble_pool import PebblePool

    return PebblePool(workers, init="hardened" if kind == "pebble+init" else "stock")


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def pool_child(kind: str, workers: int) -> None:
    """In a fresh interpreter (``--_child``): cold start-up, then one worker stuck in C code, then wait to be killed.

    Prints one JSON line: start-up seconds, the worker pids, the fork server's and resource tracker's pids, and
    whether the stuck worker was seen running.
    """
    import functools
    import multiprocessing.forkserver
    import multiprocessing.resource_tracker
    import threading

    import psutil
    from pebble_pool import c_loop_forever, graded_by

    if kind != "ours":
        import pebble  # noqa: F401 - imports are not start-up: RewardPool's are done above by pebble_pool

    start = time.perf_counter()
    pool = make_pool(kind, workers)
    (first,) = pool.map(functools.partial(graded_by, "math"), [FIRST_ITEM], timeout=120.0)
    startup = time.perf_counter() - start
    threading.Thread(target=pool.map, args=(c_loop_forever, [{}], 3600.0), daemon=True).start()
    running = False
    end = time.monotonic() + 5.0
    while not running and time.monotonic() < end:  # until a worker is on the CPU (in the C loop)
        time.sleep(0.1)
        running = any(psutil.Process(pid).status() == psutil.STATUS_RUNNING for pid in pool.worker_pids if _alive(pid))
    helpers = [
        multiprocessing.forkserver._forkserver._forkserver_pid,
        multiprocessing.resource_tracker._resource_tracker._pid,
    ]
    info = {
        "startup_s": startup,
        "first_ok": first.ok,
        "workers": pool.worker_pids,
        "helpers": helpers,
        "stuck": running,
    }
    print(json.dumps(info), flush=True)
    time.sleep(3600)


def cold_start_and_orphans(kind: str, workers: int) -> dict:
    """Run ``pool_child`` in a fresh interpreter, SIGKILL it once its worker is stuck, count what outlives it."""
    child = subprocess.Popen(
        [sys.executable, __file__, "--_child", kind, "--workers", str(workers)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    import select

    line = ""
    if select.select([child.stdout], [], [], 180.0)[0]:
        line = child.stdout.readline()
    child.kill()  # SIGKILL: no atexit, no finalizers, no pool.close()
    child.wait()
    killed = time.monotonic()
    if not line:
        return {"error": (child.stderr.read().strip().splitlines() or ["no output"])[-1]}
    info = json.loads(line)
    watched = info["workers"] + info["helpers"]
    while time.monotonic() - killed < ORPHAN_WAIT_S and any(_alive(pid) for pid in watched):
        time.sleep(0.05)
    gone_after = time.monotonic() - killed
    info["workers_left"] = [pid for pid in info["workers"] if _alive(pid)]
    info["helpers_left"] = [pid for pid in info["helpers"] if _alive(pid)]
    info["gone_after_s"] = gone_after
    for pid in info["workers_left"] + info["helpers_left"]:  # processes this benchmark started: clean up
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return info


def kill_and_replace(pool, hangs: dict, timeout: float) -> dict:
    """On a 1-worker pool: per hang, kill latency (past ``timeout``) and replacement latency (kill to next result)."""
    import functools

    from pebble_pool import graded_by

    fn = functools.partial(graded_by, "math")
    (warm,) = pool.map(fn, [FIRST_ITEM], timeout=120.0)
    pid = warm.value[0]
    out = {}
    for name, (hang_fn, hang_item) in hangs.items():
        start = time.perf_counter()
        (hung,) = pool.map(hang_fn, [hang_item], timeout=timeout)
        kill = time.perf_counter() - start - timeout
        start = time.perf_counter()
        (after,) = pool.map(fn, [FIRST_ITEM], timeout=120.0)
        replace = time.perf_counter() - start
        new_pid = after.value[0] if after.ok else None
        out[name] = {
            "status": hung.status,
            "kill_s": kill,
            "replace_s": replace,
            "new_worker": new_pid not in (None, pid),
        }
        pid = new_pid
    # a worker that dies while idle, between two calls (the OOM killer, a segfault in a C extension's thread)
    os.kill(pool.worker_pids[0], signal.SIGKILL)
    time.sleep(0.5)
    try:
        (after,) = pool.map(fn, [FIRST_ITEM], timeout=120.0)
        out["idle death"] = after.status
    except Exception as exc:  # noqa: BLE001 - reported
        out["idle death"] = f"raises {type(exc).__name__}: {exc}"
    return out


def compare_pools(args: argparse.Namespace) -> None:
    """hf_grpo's RewardPool vs pebble's ProcessPool: start-up, throughput, kill and replacement, parent SIGKILL."""
    import functools
    import multiprocessing
    import multiprocessing.forkserver
    import statistics

    from pebble_pool import PEBBLE_PRELOAD, c_loop_forever, graded_by, worker_info

    from hf_grpo.rewards.functions import grade_completion
    from hf_grpo.rewards.wrapper import PRELOAD

    kinds = POOL_CHOICES[args.pool]
    use_pebble = any(k != "ours" for k in kinds)
    if use_pebble:
        import pebble

        version = f"pebble {pebble.__version__}"
    T = args.kill_timeout
    data = build(args.pool_n)
    halves = {
        "GSM8K": (functools.partial(grade_completion, "gsm8k"), data["gsm8k"]),
        "MATH": (functools.partial(grade_completion, "math"), data["math"]),
    }
    halves = {
        name: (fn, [{"completion": c, "gold": s} for c, s in zip(d["completions"], d["solution"], strict=True)])
        for name, (fn, d) in halves.items()
    }
    n_g, n_m = len(halves["GSM8K"][1]), len(halves["MATH"][1])
    hangs = {
        "C loop": (c_loop_forever, {}),
        "never-ending factorial": (
            functools.partial(graded_by, "math"),
            {"completion": PATHOLOGICAL, "gold": r"\boxed{1}"},
        ),
    }

    print(
        f"== pools: {', '.join(POOL_LABELS[k] for k in kinds)}"
        + (
            f" ({version}; 'stock' = initializer warm_up, '+ our init' = warm_up + _die_with_parent + SIGTERM SIG_DFL)"
            if use_pebble
            else ""
        )
    )
    print(
        "method (wall clock, time.perf_counter; every pool on a 'forkserver' context preloading hf_grpo.rewards, sympy,"
    )
    print("        latex2sympy2_extended, math_verify, and pebble for the pebble pools):")
    print("  start cold: a fresh interpreter (fork server not running), from creating the pool to the first result")
    print(f"              (one MATH grade), {args.workers} workers; includes starting the fork server and its preload")
    print(f"  start warm: the same in this process, fork server already running, {args.workers} workers")
    print(
        f"  throughput: {args.pool_n} completions ({n_g} GSM8K-style, {n_m} MATH-style, as --graders builds them) graded"
    )
    print(
        f"              by grade_completion through pool.map(fn, items, timeout={POOL_TIMEOUT_S:g}), one map per half as"
    )
    print(
        f"              IsolatedCorrectness calls it; {args.workers} workers; 'all' = both halves; best and median of"
    )
    print(f"              {args.pool_repeats} after 1 warm-up, the pools taking turns (order rotated each repeat)")
    print(f"  kill:       a 1-worker pool maps one hung item with timeout T = {T:g} s; latency = wall clock - T")
    print("              (hangs: 'C loop' = sum(range(10**13)), one C call that never lets a signal handler run;")
    print("              'never-ending factorial' = grade_completion('math', 99999999999! input))")
    print("  replace:    right after the kill, the same pool maps one MATH item: wall clock until its result, which")
    print("              must come from a new worker (pid checked); then that worker is SIGKILLed while idle and")
    print("              the pool maps one more item")
    print("  orphans:    the 'start cold' interpreter then puts one worker in the C loop and is SIGKILLed; workers")
    print(
        f"              and helpers (fork server, resource tracker) still alive {ORPHAN_WAIT_S:g} s later (then killed)"
    )
    print()

    # ---- cold start and orphans, each pool in its own interpreter
    cold = {kind: cold_start_and_orphans(kind, args.workers) for kind in kinds}

    # ---- this process: one fork server for every pool, started up front with the preload
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(PEBBLE_PRELOAD) if use_pebble else list(PRELOAD))
    start = time.perf_counter()
    multiprocessing.forkserver.ensure_running()
    first_child = ctx.Process(target=time.sleep, args=(0,))  # served once the fork server has done its preload
    first_child.start()
    first_child.join()
    server_s = time.perf_counter() - start

    pools, warm = {}, {}
    preloaded = {}
    for kind in kinds:
        start = time.perf_counter()
        pools[kind] = make_pool(kind, args.workers)
        (first,) = pools[kind].map(worker_info, [{}], timeout=120.0)
        warm[kind] = time.perf_counter() - start
        preloaded[kind] = first.value["preloaded"] if first.ok else None

    outputs, times = {}, {kind: [] for kind in kinds}
    for kind in kinds:  # warm-up, and the reference outputs
        outputs[kind] = {half: pools[kind].map(fn, items, POOL_TIMEOUT_S) for half, (fn, items) in halves.items()}
    for rep in range(args.pool_repeats):
        order = kinds[rep % len(kinds) :] + kinds[: rep % len(kinds)]
        for kind in order:
            per = {"cpu": 0.0}
            for half, (fn, items) in halves.items():
                start, cpu = time.perf_counter(), time.process_time()
                out = pools[kind].map(fn, items, POOL_TIMEOUT_S)
                per[half] = time.perf_counter() - start
                per["cpu"] += time.process_time() - cpu  # the parent's CPU, all its threads (pebble runs three)
                if out != outputs[kind][half]:
                    print(f"  note: {POOL_LABELS[kind]} gave different results on the {half} half in repeat {rep + 1}")
            times[kind].append(per)
    for pool in pools.values():
        pool.close()

    faults = {}
    for kind in kinds:
        pool = make_pool(kind, 1)
        faults[kind] = kill_and_replace(pool, hangs, T)
        pool.close()

    # ---- tables
    reference = outputs[kinds[0]]
    print(f"this process: fork server start + preload + first child, before any 'start warm': {server_s:.2f} s")
    header = (
        f"{'pool':<20} {'start cold':>10} {'start warm':>10} {'GSM8K s':>8} {'MATH s':>7} {'all s':>6} "
        f"{'median':>6} {'compl/s':>7} {'vs ours':>7} {'median vs':>9} {'parent CPU':>10} {'not ok':>6} {'same':>4}"
    )
    print(header)
    best, median = {}, {}
    for kind in kinds:
        runs = times[kind]
        totals = [r["GSM8K"] + r["MATH"] for r in runs]
        best[kind], median[kind] = min(totals), statistics.median(totals)
        ratio = f"{best['ours'] / best[kind]:7.2f}" if "ours" in best else f"{'-':>7}"
        median_ratio = f"{median['ours'] / median[kind]:9.2f}" if "ours" in median else f"{'-':>9}"
        cpu = statistics.median(r["cpu"] for r in runs)
        statuses = [r.status for half in outputs[kind].values() for r in half]
        not_ok = sum(s != "ok" for s in statuses)
        same = outputs[kind] == reference
        c = cold[kind]
        cold_s = f"{c['startup_s']:10.2f}" if "startup_s" in c else f"{'failed':>10}"
        print(
            f"{POOL_LABELS[kind]:<20} {cold_s} {warm[kind]:10.2f} {min(r['GSM8K'] for r in runs):8.3f} "
            f"{min(r['MATH'] for r in runs):7.3f} {best[kind]:6.3f} {median[kind]:6.3f} "
            f"{args.pool_n / best[kind]:7.0f} {ratio} {median_ratio} {cpu:10.3f} {not_ok:>6} {'yes' if same else 'NO':>4}"
        )
    print(
        "  (start: s; GSM8K / MATH / all: best s for the half / both halves; median: of 'all'; compl/s: N / best 'all';"
    )
    print(
        "   vs ours / median vs: ours' seconds / this pool's, best and median, so 0.90 = 10% less throughput; parent"
    )
    print(
        "   CPU: the benchmark process's CPU seconds (all threads) per 'all', median; not ok: timeouts + errors in the"
    )
    print("   warm-up; same: the same grades as the first pool)")
    for kind in kinds:
        totals = " ".join(f"{r['GSM8K'] + r['MATH']:.3f}" for r in times[kind])
        print(f"  'all' s per repeat, {POOL_LABELS[kind]}: {totals}")
    print()
    print(f"{'pool':<20} {'hang':<15} {'result':<8} {'kill s past T':>13} {'replace s':>9} {'new worker':>10}")
    for kind in kinds:
        for hang, f in faults[kind].items():
            if hang == "idle death":
                continue
            print(
                f"{POOL_LABELS[kind]:<20} {hang:<15} {f['status']:<8} {f['kill_s']:13.3f} {f['replace_s']:9.3f} "
                f"{'yes' if f['new_worker'] else 'NO':>10}"
            )
    print("then its worker is SIGKILLed while idle, and one more item is mapped:")
    for kind in kinds:
        print(f"  {POOL_LABELS[kind]:<20} {faults[kind]['idle death']}")
    print()
    print(f"{'pool':<20} {'hung worker':>11} {'workers left':>12} {'helpers left':>12} {'preloaded':>9}")
    for kind in kinds:
        c = cold[kind]
        if "error" in c:
            print(f"{POOL_LABELS[kind]:<20} child failed: {c['error']}")
            continue
        left = f"{len(c['workers_left'])} of {len(c['workers'])}"
        helpers = f"{len(c['helpers_left'])} of {len(c['helpers'])}"
        pre = {True: "yes", False: "NO", None: "n/a"}[preloaded[kind]]
        print(
            f"{POOL_LABELS[kind]:<20} {'running' if c['stuck'] else 'not seen':>11} {left:>12} {helpers:>12} {pre:>9}"
        )
    print(
        f"  (left: still alive {ORPHAN_WAIT_S:g} s after the parent's SIGKILL; preloaded: the PRELOAD modules were already"
    )
    print("   imported when the worker's initializer started, i.e. it came from the preloaded fork server; RewardPool")
    print("   workers import PRELOAD themselves before their initializer, so it cannot be seen from there: n/a)")


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
