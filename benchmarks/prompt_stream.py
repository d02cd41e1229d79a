"""Cost of one extra dynamic-sampling round's prompt draw (hf_grpo.training.dynamic_sampling.PromptStream.next) on a large dataset.

    python benchmarks/prompt_stream.py

Draws 128 indices (16 groups x 8 processes) ten times from a stream over 14M rows (OpenMathInstruct-2's size) and
prints the mean wall-clock time per call, after a first call that builds the epoch's permutation (timed separately).
"""

import time

from hf_grpo.training.dynamic_sampling import PromptStream


ROWS, DRAW, CALLS = 14_000_000, 128, 10

stream = PromptStream(ROWS, seed=0)
start = time.perf_counter()
stream.next(DRAW)
first = time.perf_counter() - start
start = time.perf_counter()
for _ in range(CALLS):
    stream.next(DRAW)
each = (time.perf_counter() - start) / CALLS
print(f"PromptStream over {ROWS:,} rows: first next({DRAW}) {first * 1e3:.1f} ms (draws the epoch's permutation)")
print(f"then next({DRAW}) {each * 1e3:.3f} ms per call (mean of {CALLS}, perf_counter)")
