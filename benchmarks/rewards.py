"""Reward throughput: isolated (worker pool) vs in-process grading vs TRL's ``accuracy_reward``, and one bad input.

    python benchmarks/rewards.py                      # 2,000 completions, 2 workers, best of 3 after a warm-up
    python benchmarks/rewards.py --n 400 --repeats 1  # a quick look

It builds N realistic completions in code (half GSM8K-style, half MATH-style: reasoning then a ``####``, boxed or
"The answer is" answer, about 55% right, 35% wrong and 10% unparseable), then times, wall clock, best of
``--repeats`` after one warm-up:

- ``hf_grpo`` isolated: ``gsm8k_correctness`` on the GSM8K half and ``math_correctness`` on the MATH half, each
  through ``isolate`` on one ``RewardPool`` of ``--workers`` processes;
- ``hf_grpo`` in-process: the same two functions called directly;
- TRL's ``trl.rewards.accuracy_reward`` on all N, with conversational completions and a MATH-style gold
  (``\\boxed{answer}``) for every item, which is all it reads.

Then it inserts ONE pathological completion (huggingface/Math-Verify#65) into the MATH half and times the isolated
call with it (at the default 10 s timeout and at 2 s). TRL's function is run on the same batch only in a subprocess
with a hard time limit, since in-process it would never return; the in-process ``hf_grpo`` path is not run on it for
the same reason.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

PATHOLOGICAL = r"\boxed{\dfrac{5^{\left(5^{\left(5^{\left(5^5\right)}\right)} - 4\right)} - 5}{16}}"

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trl-limit", type=float, default=60.0, help="hard limit for TRL on the bad batch (s)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="    [log] %(message)s")

    from trl.rewards import accuracy_reward

    from hf_grpo.rewards.functions import gsm8k_correctness, math_correctness
    from hf_grpo.rewards.isolation import RewardPool, isolate

    data = build(args.n)
    g, m = data["gsm8k"], data["math"]
    n_g, n_m = len(g["completions"]), len(m["completions"])
    print(f"machine: {machine()}")
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
    print(
        f"one pathological completion (Math-Verify#65) inserted at position {at} of the MATH half ({n_m + 1} items):"
    )
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
    print(f"load avg at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
