"""Held-out evaluation never grades without a hard timeout.

math-verify never finishes with ``PATHOLOGICAL`` (a huge factorial) against a MATH gold: SymPy evaluates it in one
C call that holds the GIL, so neither a signal nor a watchdog thread (pytest-timeout included) can stop it in the
process that runs it (huggingface/Math-Verify#65's power tower was such an input until grading refused those).
The tests that feed it to an evaluation path therefore run that path in a subprocess with a deadline: a regression
to in-process grading fails on the deadline instead of hanging the test run. They check that the evaluation finishes within ``TIMEOUT + SLACK`` seconds, that the pathological
completion is counted as ``timeout`` and that the normal ones are graded as before.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import pytest

from .helpers.common import REPO


pytestmark = pytest.mark.timeout(300)  # a second guard; the subprocess deadlines below are the ones that can act

TIMEOUT = 3.0  # grading seconds per completion in these tests
SLACK = 30.0  # an evaluation with one hanging completion must finish within TIMEOUT + SLACK
DEADLINE = 180  # seconds a subprocess gets (imports and model loading included) before it is killed

# A factorial math-verify computes for ever (SymPy evaluates it in one C call). The power tower of Math-Verify#65
# no longer reaches SymPy (grading.MAX_POWER_DIGITS); this input still does, and only the worker timeout bounds it.
PATHOLOGICAL = r"\boxed{99999999999!}"

# (problem, MATH gold solution, completion before, completion after, grade before, grade after)
PROBLEMS = [
    ("What is 1 + 0?", r"Adding zero changes nothing: $\boxed{1}$.", r"$1 + 0 = 1$, so $\boxed{1}$.", r"$\boxed{1}$"),
    ("Simplify the factorial.", r"It is $\boxed{1}$.", PATHOLOGICAL, PATHOLOGICAL),
    ("What is 1 + 1?", r"$1 + 1 = \boxed{2}$", r"The answer is $\boxed{3}$.", r"The answer is $\boxed{2}$."),
    ("What is 2 - 1?", r"$\boxed{1}$", "I do not know.", "I still do not know."),
    ("Half of 1?", r"$\boxed{\frac{1}{2}}$", r"So $\boxed{0.5}$.", r"So $\boxed{0.5}$."),
]
BEFORE = ["correct", "timeout", "wrong", "unparseable", "correct"]
AFTER = ["correct", "timeout", "correct", "unparseable", "correct"]
# the summary of an evaluation graded as BEFORE, in eval_results.json and in the evaluate CLI's output
EXPECTED = {"accuracy": 0.4, "correct": 2, "wrong": 1, "unparseable": 1, "timeout": 1, "error": 0, "total": 5}


def logged_at(stderr: str, text: str) -> float:
    """When the one log line holding ``text`` was written (its ``%(asctime)s``, the last before ``text``: a progress
    bar may share the line), in seconds."""
    lines = [line for line in stderr.splitlines() if text in line]
    assert len(lines) == 1, stderr[-5000:]
    stamps = re.findall(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}", lines[0][: lines[0].index(text)])
    assert stamps, lines[0]
    return datetime.datetime.strptime(stamps[-1], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def run_python(args: list[str], env: dict | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """Run the interpreter from the repository root with a deadline; fail the test (not hang) when it passes."""
    start = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=DEADLINE,
            env={**os.environ, **(env or {})},
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"still running after {DEADLINE} s (grading hung?); stderr tail:\n{(exc.stderr or b'')[-3000:]!r}")
    return proc, time.monotonic() - start


# ---------------------------------------------------------------------------------------------------------------------
# (a) the before/after (and periodic) evaluation: TaskEvaluator.run, as hf_grpo.run.pipeline.run calls it

TASK_EVALUATOR_SCRIPT = """
import json, sys, time
from pathlib import Path
from types import SimpleNamespace

import torch
from datasets import Dataset

from hf_grpo.evaluation import core
from hf_grpo.evaluation.history import write_json
from hf_grpo.publish.report import write_report
from hf_grpo.evaluation.tasks import TaskEvaluator
from hf_grpo.base.run_files import EVAL_FILE
from hf_grpo.run.phases import reported

spec = json.loads(Path(sys.argv[1]).read_text())
out = Path(spec["output_dir"])
canned = {}
core.generate = lambda model, tokenizer, prompts, *args, **kwargs: [[canned[p]] for p in prompts]
args = SimpleNamespace(
    output_dir=str(out),
    eval_max_new_tokens=None,
    max_completion_length=8,
    per_device_eval_batch_size=8,
    task_eval_max_samples=None,
    chat_template_kwargs=None,
)
dataset = Dataset.from_dict({"prompt": spec["prompts"], "solution": spec["golds"]})
evaluator = TaskEvaluator(dataset, "math", args)  # as hf_grpo.run.pipeline.run builds it
evaluator.grade_timeout = spec["timeout"]
results, records, elapsed = {}, {}, {}
for label in ("before", "after"):
    canned.update(zip(spec["prompts"], spec[label], strict=True))
    start = time.monotonic()
    results[label] = evaluator.run(torch.nn.Linear(1, 1), None, label=label)  # hf_grpo.run.pipeline.run's call, sans trainer
    records[label] = evaluator.last_records
    elapsed[label] = time.monotonic() - start
results["gain"] = reported(records)["gain"]  # then exactly what hf_grpo.run.phases does with them
write_json(out / EVAL_FILE, results)
write_report(out)
pool = evaluator._own_pool
print(json.dumps({"elapsed": elapsed, "workers": pool.num_workers, "started_workers": pool.started_workers}))
evaluator.close()
"""


@pytest.mark.subprocess
@pytest.mark.slow  # a whole run: the second tier (pyproject.toml)
def test_task_evaluator_counts_a_hanging_grade_as_timeout(tmp_path):
    """TaskEvaluator.run (before/after and every task_eval_steps) finishes, with the hang counted as ``timeout``."""
    out = tmp_path / "run"
    spec = {
        "output_dir": str(out),
        "timeout": TIMEOUT,
        "prompts": [p[0] for p in PROBLEMS],
        "golds": [p[1] for p in PROBLEMS],
        "before": [p[2] for p in PROBLEMS],
        "after": [p[3] for p in PROBLEMS],
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    proc, wall = run_python(["-c", TASK_EVALUATOR_SCRIPT, str(tmp_path / "spec.json")])
    assert proc.returncode == 0, proc.stderr[-5000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"TaskEvaluator: process {wall:.1f} s, evaluations {report['elapsed']}")
    for label in ("before", "after"):
        assert report["elapsed"][label] < TIMEOUT + SLACK, (label, report["elapsed"])
    # workers started once for the evaluator (plus one replacement per timeout), not once per evaluation
    assert report["started_workers"] == report["workers"] + 2

    results = json.loads((out / "eval_results.json").read_text())
    assert results["before"] == EXPECTED
    assert results["after"]["accuracy"] == 0.6 and results["after"]["timeout"] == 1
    for label, grades in (("before", BEFORE), ("after", AFTER)):
        records = [json.loads(line) for line in (out / f"eval_{label}.jsonl").read_text().splitlines()]
        assert [r["grade"] for r in records] == grades
        assert "no result after 3 s" in records[1]["grade_error"]
        assert all("grade_error" not in r for i, r in enumerate(records) if i != 1)
    # the paired statistics take a timeout as not correct: one problem went wrong -> right, none right -> wrong
    gain = results["gain"]
    assert (gain["n"], gain["right_to_wrong"], gain["wrong_to_right"]) == (5, 0, 1)
    assert gain["gain"] == pytest.approx(0.2)
    summary = (out / "summary.md").read_text()
    assert "| grading timed out | 1 (20.0%) | 1 (20.0%) | +0 |" in summary
    assert "| grading failed |" not in summary  # no row for what did not happen
    assert "accuracy difference, paired" in summary


# ---------------------------------------------------------------------------------------------------------------------
# (b) python -m hf_grpo.evaluate

# Active only with its folder (then tests/scripts, for patch_on_import) on PYTHONPATH and HF_GRPO_TEST_CANNED set:
# hf_grpo.evaluation.core.generate returns the completions of that JSON file (prompt -> completion) instead of running
# the model. The CLI is otherwise as is.
CANNED_SITECUSTOMIZE = """
import json
import os

from patch_on_import import PatchOnImport  # tests/scripts, on PYTHONPATH after the site folder

CANNED = os.environ.get("HF_GRPO_TEST_CANNED")


def canned_generate(model, tokenizer, prompts, max_new_tokens, num_return_sequences=1, **kwargs):
    with open(CANNED) as f:
        completions = json.load(f)
    return [[completions[p]] * num_return_sequences for p in prompts]


if CANNED:
    PatchOnImport("hf_grpo.evaluation.core", lambda module: setattr(module, "generate", canned_generate)).install()
"""


@pytest.mark.subprocess
@pytest.mark.slow  # a whole run: the second tier (pyproject.toml)
def test_evaluate_cli_counts_a_hanging_grade_as_timeout(tmp_path, tiny_model_dir):
    """``python -m hf_grpo.evaluate`` finishes with the hang counted as ``timeout``, using the recipe's reward_timeout.

    The model's generation is replaced by canned completions (a ``sitecustomize`` on PYTHONPATH), since no model can
    be made to write the pathological answer on demand; loading, data, recipe, grading and output are the CLI's own.
    """
    problems = tmp_path / "problems.jsonl"
    problems.write_text("".join(json.dumps({"problem": p[0], "answer": p[1]}) + "\n" for p in PROBLEMS))
    canned = tmp_path / "canned.json"
    canned.write_text(json.dumps({p[0]: p[2] for p in PROBLEMS}))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        textwrap.dedent(
            f"""\
            dataset_name: {problems}
            task: math
            prompt_column: problem
            solution_column: answer
            prompt_style: plain
            max_completion_length: 8
            reward_timeout: {TIMEOUT}
            """
        )
    )
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(CANNED_SITECUSTOMIZE)
    records_path = tmp_path / "records.jsonl"
    args = ["-m", "hf_grpo.evaluate", str(tiny_model_dir), "--recipe", str(recipe), "--split", "train"]
    path = [str(site), str(REPO / "tests" / "scripts"), os.environ.get("PYTHONPATH", "")]
    env = {"PYTHONPATH": os.pathsep.join(path).rstrip(os.pathsep)}
    env["HF_GRPO_TEST_CANNED"] = str(canned)
    proc, wall = run_python([*args, "--output", str(records_path)], env=env)
    assert proc.returncode == 0, proc.stderr[-5000:]
    # the evaluation itself, from its start (model loaded) to its grading's end, by the CLI's log times: the
    # interpreter's start, imports and model loading (seconds to tens of seconds under load) are not counted
    started = logged_at(proc.stderr, "hf_grpo.evaluation.saved_model: evaluating ")
    graded = logged_at(proc.stderr, "grading timed out after 3 s on 1 of 5 completions")
    print(f"python -m hf_grpo.evaluate: process {wall:.1f} s, evaluation {graded - started:.1f} s")
    assert graded - started < TIMEOUT + SLACK
    summary = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert {k: summary[k] for k in EXPECTED} == EXPECTED
    records = [json.loads(line) for line in records_path.read_text().splitlines()]
    assert [r["grade"] for r in records] == BEFORE
    assert [r["completion"] for r in records] == [p[2] for p in PROBLEMS]


# ---------------------------------------------------------------------------------------------------------------------
# The pieces, without a hanging input (these cannot hang)


def test_grade_bounded_grades_in_workers_and_counts_errors():
    from hf_grpo.evaluation.core import grade_bounded

    golds = ["#### 7", "#### 7", "#### 7", "no number at all"]
    grades = grade_bounded("gsm8k", ["3 + 4 = 7\n#### 7", "#### 8", "I do not know.", "#### 7"], golds, timeout=30)
    # a gold answer the grader cannot read is the data's fault, not the model's: 'error', not 'unparseable'
    assert grades == ["correct", "wrong", "unparseable", "error"]
    with pytest.raises(ValueError, match="unknown grading task"):
        grade_bounded("algebra", ["1"], ["1"])


def test_grade_timeout_comes_from_the_flag_then_the_recipe():
    from hf_grpo.evaluate import grade_timeout, parse_args
    from hf_grpo.evaluation.core import DEFAULT_GRADE_TIMEOUT

    assert DEFAULT_GRADE_TIMEOUT == 10.0
    assert grade_timeout(parse_args(["m"]), {}) == DEFAULT_GRADE_TIMEOUT
    assert grade_timeout(parse_args(["m"]), {"reward_timeout": 4}) == 4.0
    assert grade_timeout(parse_args(["m", "--grade-timeout", "2.5"]), {"reward_timeout": 4}) == 2.5
    with pytest.raises(SystemExit):
        parse_args(["m", "--grade-timeout", "0"])
    with pytest.raises(ValueError, match="reward_timeout"):
        grade_timeout(parse_args(["m"]), {"reward_timeout": "soon"})


def test_task_evaluator_grades_in_the_trainers_reward_pool(tmp_path):
    """With isolated rewards the evaluator uses their pool and timeout; otherwise one pool of its own, kept."""
    from hf_grpo.evaluation.tasks import TaskEvaluator
    from hf_grpo.rewards.functions import math_correctness
    from hf_grpo.rewards.wrapper import RewardPool, isolate

    args = SimpleNamespace(
        output_dir=str(tmp_path),
        eval_max_new_tokens=None,
        max_completion_length=8,
        per_device_eval_batch_size=8,
        task_eval_max_samples=None,
        chat_template_kwargs=None,
    )
    with RewardPool(num_workers=1) as pool:
        trainer = SimpleNamespace(reward_funcs=[isolate(math_correctness, pool, timeout=7.0)])
        evaluator = TaskEvaluator(None, "math", args)
        assert evaluator.grading(trainer) == (pool, 7.0)
        assert evaluator._own_pool is None
        evaluator.grade_timeout = 2.0
        assert evaluator.grading(trainer) == (pool, 2.0)

    alone = TaskEvaluator(None, "math", args)
    own, timeout = alone.grading(SimpleNamespace(reward_funcs=[math_correctness]))  # reward_isolation: false
    assert timeout == 10.0 and alone.grading() == (own, 10.0)  # started once, kept for every evaluation
    alone.close()
    assert own.closed
    with pytest.raises(ValueError, match="grade_timeout"):
        TaskEvaluator(None, "math", args, grade_timeout=0)


def test_report_table_shows_timeouts_only_when_there_are_any():
    from hf_grpo.publish.summary import eval_table

    plain = {"accuracy": 0.5, "correct": 1, "wrong": 1, "unparseable": 0, "total": 2}  # written before timeouts
    assert "grading" not in eval_table({"before": plain, "after": plain})
    after = {**plain, "wrong": 0, "timeout": 1, "error": 0}
    table = eval_table({"before": {**plain, "timeout": 0, "error": 0}, "after": after})
    assert "| grading timed out | 0 (0.0%) | 1 (50.0%) | +1 |" in table
    assert "grading failed" not in table
