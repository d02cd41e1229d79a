"""Nothing a user owns is overwritten or lost (issue 45): ``hf-grpo report``, ``hf-grpo eval --output``,
``hf-grpo recipes cp`` and a training run's ``output_dir`` refuse a folder or a file hf_grpo did not write, with one
line and exit status 2 before anything loads, and the files they write go through a temporary file renamed into
place (``hf_grpo.base.run_files``), so a full disk leaves the old file whole."""

from __future__ import annotations

import json
import logging
import resource
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from hf_grpo import evaluate
from hf_grpo import report as report_command
from hf_grpo.base.run_files import (
    CHECKPOINT_MANIFEST,
    HISTORY_FILE,
    LOCK_FILE,
    PLOT_FILE,
    RECIPE_FILE,
    RECIPE_HEADER,
    RECIPE_HEADER_END,
    RUN_MANIFEST,
    SERVER_LOG,
    SUMMARY_FILE,
    VERSIONS_FILE,
    claim,
)
from hf_grpo.publish import report
from hf_grpo.publish.card import CARD_FILE, CARD_MARKER, write_local_card
from hf_grpo.recipe import shipped
from hf_grpo.train import main as train_main

from .helpers.common import REPO


pytestmark = pytest.mark.timeout(300)

HF_GRPO = Path(sys.executable).with_name("hf-grpo")  # the console script, installed next to this interpreter
TINY = str(REPO / "recipes" / "tiny.yaml")
USER_README = "# My project\n\nNotes I wrote myself.\n"
TRL_DRAFT = "---\ntags: [trl]\n---\n\n# Model Card for run\n\nIt has been trained using [TRL](https://github.com/huggingface/trl).\n"


def cli(args: list[str], cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    assert HF_GRPO.is_file(), f"no {HF_GRPO}: reinstall the package (pip install -e .) to get the console script"
    return subprocess.run(
        [str(HF_GRPO), *args], cwd=cwd, capture_output=True, text=True, timeout=240, check=False, **kwargs
    )


def one_error(err: str, prefix: str) -> str:
    """The one error line of ``err``, which starts with ``prefix``; no traceback."""
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and lines[0].startswith(prefix) and "Traceback" not in err, err[-3000:]
    return lines[0]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones too: no temporary file may be left) with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def project(folder: Path) -> Path:
    """A folder of the user's, e.g. a project root: files named as a run's outputs are, and others."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CARD_FILE).write_text(USER_README)
    (folder / SUMMARY_FILE).write_text("- my summary\n")
    (folder / "notes.txt").write_text("mine\n")
    return folder


def fake_run(out: Path) -> Path:
    """A finished run's folder as the run leaves it, without the model: its manifest, recipe, versions, history."""
    claim(out)
    header = f"{RECIPE_HEADER}recipes/tiny.yaml{RECIPE_HEADER_END}\n"
    (out / RECIPE_FILE).write_text(header + "max_steps: 2\n")
    (out / VERSIONS_FILE).write_text(json.dumps({"hf_grpo": "0.0"}))
    (out / HISTORY_FILE).write_text(json.dumps([{"step": 1, "reward": 0.25}, {"step": 2, "reward": 0.5}]))
    return out


# ---------------------------------------------------------------------------------------------------------------------
# hf-grpo report


def test_report_in_a_folder_that_is_no_run_writes_nothing(tmp_path):
    """`hf-grpo report` with no argument reports on `.`: in a project root it replaced the user's README.md and
    summary.md with a model card and a summary of nothing."""
    folder = project(tmp_path / "project")
    before = snapshot(folder)
    result = cli(["report"], cwd=folder)
    assert result.returncode == 2, result.stderr[-3000:]
    line = one_error(result.stderr, "hf-grpo report: error: ")
    assert "holds no hf_grpo run" in line and "nothing was written" in line, line
    assert snapshot(folder) == before


@pytest.mark.parametrize("name", [CARD_FILE, SUMMARY_FILE])
def test_report_keeps_a_file_of_the_users_in_a_run(tmp_path, capsys, name):
    """A run's folder where the user wrote README.md (or summary.md): refused before anything is written."""
    out = fake_run(tmp_path / "run")
    (out / name).write_text(USER_README)
    before = snapshot(out)
    assert report_command.main([str(out)]) == 2
    line = one_error(capsys.readouterr().err, "python -m hf_grpo.report: error: ")
    assert f"{out / name} was not written by hf_grpo" in line, line
    assert snapshot(out) == before  # no plot, no summary, no card


def test_report_rewrites_the_files_a_run_wrote(tmp_path):
    """The report writes the card, and a second report replaces its own."""
    out = fake_run(tmp_path / "run")
    for _ in range(2):
        assert report_command.main([str(out)]) == 0
        assert CARD_MARKER in (out / CARD_FILE).read_text()
        assert (out / SUMMARY_FILE).read_text().startswith("# Training summary: run")
        assert (out / PLOT_FILE).read_bytes().startswith(b"\x89PNG")
        assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_the_end_of_a_run_leaves_a_readme_and_summary_of_the_users(tmp_path, caplog):
    """What the pipeline calls after training: a README.md or summary.md the user put into the run's folder stays."""
    out = fake_run(tmp_path / "run")
    (out / CARD_FILE).write_text(USER_README)
    (out / SUMMARY_FILE).write_text(USER_README)
    with caplog.at_level(logging.WARNING):
        assert write_local_card(out) is None
        report.write_report(out)
    assert (out / CARD_FILE).read_text() == USER_README and (out / SUMMARY_FILE).read_text() == USER_README
    assert (out / PLOT_FILE).is_file()  # the figure is the run's own
    assert caplog.text.count("was not written by hf_grpo: left as it is") == 2, caplog.text


# ---------------------------------------------------------------------------------------------------------------------
# a training run's output_dir


def test_a_run_into_a_folder_of_the_users_stops_before_anything_loads(tmp_path):
    """A real run (not a dry run) into a project folder: exit 2 with one line, the folder as it was."""
    folder = project(tmp_path / "project")
    before = snapshot(folder)
    result = cli(["train", TINY, "--output_dir", str(folder), "--report_to", "none"], cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    line = one_error(result.stderr, "hf_grpo: error: ")
    assert f"output_dir '{folder}' already holds files and is no run of hf_grpo (it has no {RUN_MANIFEST})" in line
    assert snapshot(folder) == before


@pytest.mark.parametrize("case", ["root", "root by another path", "home", "home by another path", "user folder"])
def test_output_dir_refusals(tmp_path, monkeypatch, capsys, case):
    """`--output_dir /` (what `"$RUN_DIR/"` is with the variable unset), `$HOME` and a folder of the user's were
    accepted: a run wrote its adapter, base_model/ and README into them."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("")  # a home folder holding nothing but hidden files is still refused
    monkeypatch.setenv("HOME", str(home))
    output_dir = {
        "root": "/",
        "root by another path": f"{tmp_path}/../../../../../../../../../../..",
        "home": str(home),  # $HOME, as the shell expands it (a literal ~ is YAML's null: the default folder)
        "home by another path": f"{home}/../home/",
        "user folder": str(project(tmp_path / "project")),
    }[case]
    assert train_main([TINY, "--dry-run", "--output_dir", output_dir]) == 2
    line = one_error(capsys.readouterr().err, "hf_grpo: error: ")
    expected = {"root": "root of the filesystem", "home": "your home folder", "user": "already holds files"}
    assert expected[case.split()[0]] in line and "choose a new or empty folder" in line, line


LEGACY_CHECKPOINT = json.dumps({"num_processes": 1, "dynamic_sampling": False, "mid_cycle": False, "files": {}})


@pytest.mark.parametrize(
    "case",
    ["new", "empty", "hidden files only", "finished run", "killed run", "launch stopped early", "earlier version",
     "earlier version's node"],
)  # fmt: skip
def test_output_dirs_a_run_may_use(tmp_path, capsys, case):
    """A new or empty folder, every state a run of ours leaves its folder in (its manifest is its first file: the
    lock a killed run leaves, a launch that stopped early with its server's log), and a run an earlier version wrote
    (its recipe.yaml's first line; a node's own folder, when nodes do not share output_dir: its checkpoint)."""
    out = tmp_path / "run"
    if case != "new":
        out.mkdir()
    if case in ("finished run", "killed run", "launch stopped early"):
        claim(out)
    files = {
        "hidden files only": {".DS_Store": ""},
        "killed run": {LOCK_FILE: "{}"},
        "launch stopped early": {SERVER_LOG: "INFO started", "logs/crash-20250101-000000-123.log": "Traceback"},
        "earlier version": {RECIPE_FILE: f"{RECIPE_HEADER}recipes/tiny.yaml{RECIPE_HEADER_END}\nseed: 0\n"},
        "earlier version's node": {f"checkpoint-2/{CHECKPOINT_MANIFEST}": LEGACY_CHECKPOINT},
    }
    for name, text in files.get(case, {}).items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    if case == "finished run":
        fake_run(out)
        project(out)  # its README.md and summary.md are the run's own
    assert train_main([TINY, "--dry-run", "--output_dir", str(out)]) == 0, capsys.readouterr().err


TRAINED_ELSEWHERE = {  # a plain transformers / TRL / PEFT training folder: every name a trainer of any kind writes
    "eval_results.json": '{"eval_loss": 0.5}',
    "README.md": TRL_DRAFT,
    "adapter_config.json": '{"peft_type": "LORA"}',
    "adapter_model.safetensors": "weights",
    "training_args.bin": "args",
    SERVER_LOG: "INFO vllm",
    HISTORY_FILE: "[]",
    VERSIONS_FILE: "{}",
    LOCK_FILE: "{}",
    RECIPE_FILE: "model_name_or_path: Qwen/Qwen2.5-0.5B\n",
    f"checkpoint-5/{CHECKPOINT_MANIFEST}": "{}",
}


def test_a_folder_with_the_names_a_run_writes_is_not_a_run_of_ours(tmp_path, capsys):
    """Names any trainer writes (eval_results.json, vllm_server.log, README.md...) made a folder a run of ours: it
    was accepted as output_dir and its README.md and eval_results.json were replaced. Only the manifest does now: the
    run and the report refuse it in one line, before writing anything."""
    folder = tmp_path / "trained-elsewhere"
    for name, text in TRAINED_ELSEWHERE.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    before = snapshot(folder)
    assert train_main([TINY, "--dry-run", "--output_dir", str(folder)]) == 2
    line = one_error(capsys.readouterr().err, "hf_grpo: error: ")
    assert f"already holds files and is no run of hf_grpo (it has no {RUN_MANIFEST})" in line, line
    assert report_command.main([str(folder)]) == 2
    line = one_error(capsys.readouterr().err, "python -m hf_grpo.report: error: ")
    assert f"holds no hf_grpo run (no {RUN_MANIFEST}" in line and "nothing was written" in line, line
    assert snapshot(folder) == before


def test_a_card_written_by_trl_in_a_run_of_ours_is_the_users(tmp_path, caplog):
    """A README.md with TRL's sentence counted as a card of ours and was replaced; hf_grpo's trainer no longer lets
    TRL or PEFT write one, so such a README.md is a user's (copied from a TRL run, say), and stays."""
    out = fake_run(tmp_path / "run")
    (out / CARD_FILE).write_text(TRL_DRAFT)
    with caplog.at_level(logging.WARNING):
        assert write_local_card(out) is None
    assert (out / CARD_FILE).read_text() == TRL_DRAFT
    assert "was not written by hf_grpo: left as it is" in caplog.text


def test_an_earlier_versions_run_gets_its_manifest_from_the_report(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / RECIPE_FILE).write_text(f"{RECIPE_HEADER}recipes/tiny.yaml{RECIPE_HEADER_END}\nmax_steps: 2\n")
    (out / HISTORY_FILE).write_text(json.dumps([{"step": 1, "reward": 0.25}]))
    assert report_command.main([str(out)]) == 0
    manifest = json.loads((out / RUN_MANIFEST).read_text())
    assert manifest["written_by"] == "hf_grpo" and manifest["version"]
    assert (out / SUMMARY_FILE).is_file() and CARD_MARKER in (out / CARD_FILE).read_text()


# ---------------------------------------------------------------------------------------------------------------------
# hf-grpo eval --output


def test_eval_output_never_replaces_a_file_of_the_users(tmp_path):
    """Checked before the model loads: a file that holds no per-problem records is the user's."""
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    result = cli(["eval", str(tmp_path / "no-such-model"), "--output", str(notes)], cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    line = one_error(result.stderr, "hf_grpo.evaluate: error: ")
    assert f"--output {notes} exists and holds no per-problem records" in line, line
    assert notes.read_text() == "mine\n"


RECORD = {"index": 0, "prompt": "1+1?", "gold": "2", "completion": "#### 2", "grade": "correct"}


@pytest.mark.parametrize("existing", ["a file of the user's", "records of an earlier evaluation", "an empty file"])
def test_eval_output_replaces_only_records(tmp_path, monkeypatch, capsys, existing):
    """The evaluation itself is stubbed: what is checked is what happens to the file --output names."""
    monkeypatch.setattr(evaluate, "check_model", lambda name: None)
    result = SimpleNamespace(records=[RECORD, {**RECORD, "index": 1}], summary=lambda: {"accuracy": 1.0})
    monkeypatch.setattr(evaluate, "evaluate_run", lambda model, args: result)
    output = tmp_path / "records.jsonl"
    output.write_text({"a file of the user's": "mine\n", "an empty file": ""}.get(existing, json.dumps(RECORD) + "\n"))
    code = evaluate.main(["model", "--output", str(output)])
    if existing == "a file of the user's":
        assert code == 2 and output.read_text() == "mine\n"
        one_error(capsys.readouterr().err, "hf_grpo.evaluate: error: --output ")
    else:
        assert code == 0 and [json.loads(line)["index"] for line in output.read_text().splitlines()] == [0, 1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["records.jsonl"]  # no temporary file left


# ---------------------------------------------------------------------------------------------------------------------
# hf-grpo recipes cp


def _small_disk():
    """In the child: a file may grow to 200 bytes, as on a disk that fills up while the recipe is written."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (200, 200))


def test_recipes_cp_force_on_a_full_disk_keeps_the_old_file(tmp_path):
    """`cp NAME DEST --force` truncated DEST, then failed to fill it: the user's old file was gone."""
    dest = tmp_path / "my.yaml"
    dest.write_text("learning_rate: 1.0e-6  # my edits\n")
    result = cli(["recipes", "cp", "tiny", str(dest), "--force"], cwd=tmp_path, preexec_fn=_small_disk)
    assert snapshot(tmp_path) == {"my.yaml": b"learning_rate: 1.0e-6  # my edits\n"}  # no temporary file left
    assert result.returncode == 2, result.stderr[-3000:]
    line = one_error(result.stderr, "hf-grpo recipes: error: ")
    assert f"could not write {dest}" in line and "left as it was" in line, line


def test_recipes_cp_into_a_new_folder(tmp_path, monkeypatch, capsys):
    """`cp NAME newdir/` wrote a file named newdir; a file path in a missing folder is refused in one line."""
    monkeypatch.chdir(tmp_path)
    assert shipped.main(["cp", "tiny", "newdir/"]) == 0
    assert (tmp_path / "newdir" / "tiny.yaml").read_text() == (REPO / "recipes" / "tiny.yaml").read_text()
    assert shipped.main(["cp", "tiny", "missing/my.yaml"]) == 2
    line = one_error(capsys.readouterr().err, "hf-grpo recipes: error: ")
    assert "folder missing does not exist" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["newdir"]


def test_training_and_saving_leave_a_readme_in_the_run_as_it_is(tmp_path):
    """TRL wrote its draft card over output_dir's README.md at every checkpoint, and PEFT's save rewrote README.md
    before the card code decided to leave it alone: neither writes one now (the run's card is hf_grpo.publish.card's)."""
    from .helpers.trainers import make_trainer

    out = claim(tmp_path / "run")
    (out / CARD_FILE).write_text(USER_README)
    trainer = make_trainer(out, max_steps=1, save_strategy="steps", save_steps=1, max_completion_length=4)
    trainer.train()
    trainer.save_model(str(out))
    assert (out / "checkpoint-1" / "adapter_model.safetensors").is_file() and (out / "adapter_config.json").is_file()
    assert (out / CARD_FILE).read_text() == USER_README
    assert not (out / "checkpoint-1" / CARD_FILE).exists()


def test_eval_output_never_replaces_a_runs_own_records(tmp_path, capsys):
    """``--output run/eval_after.jsonl`` replaced the records the run's report and paired gain read."""
    out = fake_run(tmp_path / "run")
    records = out / "eval_after.jsonl"
    records.write_text(json.dumps(RECORD) + "\n")
    assert evaluate.main([str(tmp_path / "no-such-model"), "--output", str(records)]) == 2
    line = one_error(capsys.readouterr().err, "hf_grpo.evaluate: error: ")
    assert f"--output {records} is a record file of the run in {out}" in line, line
    assert records.read_text() == json.dumps(RECORD) + "\n"


# ---------------------------------------------------------------------------------------------------------------------
# Damaged run files, and a run inside another run (issue 69)


@pytest.mark.parametrize("damage", ["a folder", "empty", "cut short", "a list"])
def test_a_damaged_run_manifest_is_one_line_naming_it(tmp_path, capsys, damage):
    """A manifest that was a folder ended in IsADirectoryError; an empty one was reported as no manifest at all."""
    out = fake_run(tmp_path / "run")
    manifest = out / RUN_MANIFEST
    manifest.unlink()
    if damage == "a folder":
        manifest.mkdir()
    else:
        manifest.write_text({"empty": "", "cut short": '{"written_by": "hf_gr', "a list": "[]"}[damage])
    assert train_main([TINY, "--dry-run", "--output_dir", str(out)]) == 2
    line = one_error(capsys.readouterr().err, "hf_grpo: error: ")
    assert str(manifest) in line and "the run's next command writes it anew" in line, line
    assert report_command.main([str(out)]) == 2
    line = one_error(capsys.readouterr().err, "python -m hf_grpo.report: error: ")
    assert str(manifest) in line, line


def test_a_damaged_checkpoint_manifest_is_one_line_naming_it(tmp_path, capsys):
    """A checkpoint manifest of `{}` ended in KeyError: 'files'."""
    out = fake_run(tmp_path / "run")
    (out / "checkpoint-2").mkdir()
    (out / "checkpoint-2" / CHECKPOINT_MANIFEST).write_text("{}")
    argv = [TINY, "--output_dir", str(out), "--resume_from_checkpoint", str(out / "checkpoint-2"), "--max_steps", "3"]
    assert train_main(argv) == 2
    line = one_error(capsys.readouterr().err, "hf_grpo: error: ")
    assert f"{out / 'checkpoint-2' / CHECKPOINT_MANIFEST} is not the checkpoint manifest hf_grpo writes" in line


@pytest.mark.parametrize("where", ["checkpoint-2", "checkpoint-2/deeper", "logs"])
def test_a_new_run_inside_another_runs_folder_is_refused(tmp_path, capsys, where):
    """An output_dir inside another run's checkpoint folder was accepted and trained into."""
    out = fake_run(tmp_path / "run")
    (out / "checkpoint-2").mkdir()
    inner = out / where
    assert train_main([TINY, "--dry-run", "--output_dir", str(inner)]) == 2
    line = one_error(capsys.readouterr().err, "hf_grpo: error: ")
    assert f"is inside the run in {out} (its {where.split('/')[0]}" in line and "choose a new or empty folder" in line
