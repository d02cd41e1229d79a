"""The notebooks in notebooks/ run top to bottom (tiny model, CPU, no network) and produce what they promise.

Each notebook is executed with nbclient in a fresh temporary directory (its working directory), its code as shipped;
CI's shorter run lengths go in a cell after its ``parameters`` cell, as papermill injects them; every file it writes lands in its OUTPUT_DIR, none beside it or in the repository. The kernel is this interpreter: a temporary ``python3``
kernelspec whose argv is ``sys.executable`` is put first on ``JUPYTER_PATH``, so neither a user-level kernelspec
pointing at another Python nor the current working directory changes what runs.
"""

from __future__ import annotations

import ast
import json
import os
import re
import sys
from pathlib import Path

import pytest


nbformat = pytest.importorskip("nbformat", reason="the notebook tests need the dev extra (pip install -e '.[dev]')")
NotebookClient = pytest.importorskip("nbclient", reason="the notebook tests need the dev extra").NotebookClient


REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
KERNEL_NAME = "python3"
CELL_TIMEOUT_S = 600  # per cell; quickstart takes 72-87 s (its training cell 75 s) on a 2-core machine
KERNEL_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "WANDB_MODE": "offline",
}


@pytest.fixture
def kernel(tmp_path_factory, monkeypatch) -> str:
    """A ``python3`` kernelspec that runs this interpreter, first on ``JUPYTER_PATH``; its env adds offline mode."""
    root = tmp_path_factory.mktemp("jupyter")
    spec = root / "kernels" / KERNEL_NAME
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "Python 3 (hf_grpo tests)",
                "language": "python",
                "env": KERNEL_ENV,
            }
        )
    )
    monkeypatch.setenv("JUPYTER_PATH", str(root))
    return KERNEL_NAME


def parameters(nb) -> dict:
    """The values of the notebook's ``parameters`` cell (assignments of literals)."""
    cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1, "a notebook needs exactly one cell tagged `parameters`"
    assert cells[0] is next(c for c in nb.cells if c.cell_type == "code"), "the parameters cell comes first"
    return {
        target.id: ast.literal_eval(node.value)
        for node in ast.parse(cells[0].source).body
        if isinstance(node, ast.Assign)
        for target in node.targets
    }


def execute(name: str, workdir: Path, kernel_name: str, overrides: dict):
    """Run a shipped notebook in ``workdir``; returns the executed notebook and its parameters.

    ``overrides`` (shorter runs for CI) go in a new cell right after the ``parameters`` cell, as papermill does.

    What the notebook writes is in its ``OUTPUT_DIR`` only: nothing else appears in ``workdir`` (the folder it runs
    from), in the repository's root or next to the notebook.
    """
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in nb.cells if c.cell_type == "code"), (
        f"{name} is saved with outputs; clear them before committing"
    )
    params = parameters(nb)
    assert set(overrides) <= set(params), f"not parameters of {name}: {sorted(set(overrides) - set(params))}"
    injected = "# injected by tests/test_notebooks.py, as papermill does\n" + "".join(
        f"{key} = {value!r}\n" for key, value in overrides.items()
    )
    nb.cells.insert(
        nb.cells.index(next(c for c in nb.cells if c.cell_type == "code")) + 1, nbformat.v4.new_code_cell(injected)
    )
    params.update(overrides)
    around = {folder: set(os.listdir(folder)) for folder in (REPO, NOTEBOOKS)}
    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name=kernel_name,
        resources={"metadata": {"path": str(workdir)}},
    )
    client.execute()  # raises CellExecutionError (with the cell and its traceback) if a cell fails
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    assert sorted(os.listdir(workdir)) == [Path(params["OUTPUT_DIR"]).parts[0]], "a file was written beside the run"
    for folder, before in around.items():
        assert set(os.listdir(folder)) <= before, (
            f"{name} wrote {sorted(set(os.listdir(folder)) - before)} to {folder}"
        )
    return nb, params


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def output_text(output) -> str:
    """The text of one cell output: a stream's text, a display's ``text/plain`` / ``text/html``, an error's message."""
    if output.output_type == "stream":
        return output.text
    if output.output_type == "error":
        return f"{output.ename}: {output.evalue}"
    data = output.get("data", {})
    return "\n".join(str(data.get(kind, "")) for kind in ("text/plain", "text/html"))


def cell_running(nb, code: str):
    """The one code cell whose source contains ``code``."""
    [cell] = [c for c in nb.cells if c.cell_type == "code" and code in c.source]
    return cell


def check_progress_shown(nb, training_code: str) -> None:
    """No "IProgress not found" anywhere (ipywidgets is installed); the training cell's output is not captured: it
    shows hf_grpo's log lines and progress bars drawn as ipywidgets (tqdm.auto in Jupyter)."""
    texts = [output_text(o) for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not any("IProgress not found" in text for text in texts), "tqdm found no ipywidgets"
    cell = cell_running(nb, training_code)
    assert "%%capture" not in cell.source
    logged = "".join(output_text(o) for o in cell.outputs)
    assert "warm start: " in logged and "held-out accuracy (before)" in logged, logged[-2000:]
    widgets = [o for o in cell.outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert widgets, "no progress bar was drawn as a widget in the training cell"


def plots_shown(nb) -> bool:
    """Every cell that draws with matplotlib displayed a PNG (inline plotting survives the training run)."""
    cells = [c for c in nb.cells if c.cell_type == "code" and "plt.subplots" in c.source]
    return bool(cells) and all(any("image/png" in o.get("data", {}) for o in c.outputs) for c in cells)


@pytest.mark.notebook
@pytest.mark.slow  # a whole run: the second tier (pyproject.toml)
def test_quickstart(tmp_path, kernel):
    nb, params = execute("quickstart.ipynb", tmp_path, kernel, {"MAX_STEPS": 3, "EVAL_SIZE": 24})
    out = tmp_path / params["OUTPUT_DIR"]

    results = json.loads((out / "eval_results.json").read_text())
    assert {"before", "after", "gain"} <= set(results)  # and the run's eval "settings"
    for phase in (results["before"], results["after"]):
        assert phase["total"] == params["EVAL_SIZE"]
        assert phase["correct"] + phase["wrong"] + phase["unparseable"] == phase["total"]
    assert results["gain"]["n"] == params["EVAL_SIZE"]

    # the re-evaluation with hf_grpo.evaluate reproduced the run's own held-out evaluation
    reevaluated = read_jsonl(out / "reevaluation.jsonl")
    after = read_jsonl(out / "eval_after.jsonl")
    assert [r["completion"] for r in reevaluated] == [r["completion"] for r in after]
    assert sum(r["grade"] == "correct" for r in reevaluated) == results["after"]["correct"]

    history = [r for r in json.loads((out / "training_history.json").read_text()) if "reward" in r]
    assert [r["step"] for r in history] == list(range(1, params["MAX_STEPS"] + 1))
    assert all("dynamic_sampling/kept_fraction" in r for r in history)
    assert plots_shown(nb), "the reward / accuracy plot was not displayed"
    check_progress_shown(nb, "results = train(")

    # the trained adapter, loaded with PEFT on its base model, answered a question
    asked = "".join(output_text(o) for o in cell_running(nb, "PeftModel.from_pretrained").outputs)
    answer = re.search(r"^answer: +'(.+)'$", asked, re.MULTILINE)
    assert answer and answer.group(1).strip(), asked
    assert re.search(r"^grade: +(correct|wrong|unparseable)$", asked, re.MULTILINE), asked

    # without PUSH_REPO_ID the push cell only says what it would upload
    assert params["PUSH_REPO_ID"] is None
    pushed = "".join(output_text(o) for o in cell_running(nb, "push(OUTPUT_DIR, PUSH_REPO_ID)").outputs)
    assert pushed.startswith("push skipped: PUSH_REPO_ID"), pushed
    assert "adapter_model.safetensors" in pushed and "README.md" in pushed


@pytest.mark.notebook
@pytest.mark.slow  # a whole run: the second tier (pyproject.toml)
def test_custom_reward(tmp_path, kernel):
    nb, params = execute("custom_reward.ipynb", tmp_path, kernel, {"MAX_STEPS": 3, "EVAL_SIZE": 12})
    out = tmp_path / params["OUTPUT_DIR"]

    assert (out / "rewards" / "my_rewards.py").is_file(), "the notebook writes its rewards into its output folder"
    assert (out / "run" / "eval_results.json").is_file(), "the run did not finish"
    history = [r for r in json.loads((out / "run" / "training_history.json").read_text()) if "reward" in r]
    assert len(history) == params["MAX_STEPS"]
    for record in history:
        for key in (
            "rewards/gsm8k_correctness/mean",
            "rewards/shows_work/mean",
            "rewards/consistent_answer/mean",
            "rewards/consistent_answer/errors",
        ):
            assert key in record, (key, record["step"])
    # the deliberately buggy reward raised on some completions: counted, not fatal
    assert sum(r["rewards/consistent_answer/errors"] for r in history) > 0
    assert all(r["rewards/shows_work/errors"] == 0 for r in history)
    assert all(0.0 <= r["rewards/shows_work/mean"] <= 1.0 for r in history)
    assert plots_shown(nb), "the per-reward plot was not displayed"
    check_progress_shown(nb, "results = train(")
