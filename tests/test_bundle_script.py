"""scripts/gpu_bundle.py and its two jobs' modules, without a download: the bundle of the last build (its lock) fits
the lent machine's calls with today's working tree, the plan cuts files into parts that join back, and ``install``
run once per call, on a bundle of two small wheels made here, installs each group when its last part arrives
(docs/gpu.md)."""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
import zipfile
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from .helpers.common import REPO


def load(name: str):
    """scripts/NAME.py as module NAME, as the command imports it (scripts/ is no package)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = sys.modules[name] = importlib.util.module_from_spec(spec)  # (dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


common, build_job, install_job, bundle = map(
    load, ["gpu_bundle_common", "gpu_bundle_build", "gpu_bundle_install", "gpu_bundle"]
)


def test_the_locked_bundle_fits_the_calls_with_todays_tree():
    files = common.read_lock()
    tree = build_job.tree_size()
    calls = build_job.plan(files, common.CARRY_LIMIT - tree - common.MARGIN)
    sizes = build_job.call_sizes(files)
    assert sorted(sizes) == list(range(1, calls + 1))
    assert all(size + tree <= common.CARRY_LIMIT for size in sizes.values()), (tree, sizes)
    for file in files:
        assert sum(p.size for p in file.parts) == file.size and file.parts[0].offset == 0
        assert all(a.offset + a.size == b.offset for a, b in zip(file.parts, file.parts[1:], strict=False))
    assert {f.group for f in files} == set(common.GROUPS)
    order = [list(common.GROUPS).index(f.group) for f in files]
    assert order == sorted(order), "a group's files come before the next group's: core is installed first"
    assert len({f.name for f in files}) == len(files) and all(len(f.sha256) == 64 for f in files)
    names = {common.canonical(f.name.split("-")[0]) for f in files}
    assert not names & set(build_job.LEAVE_OUT), "a package left out was carried"
    out = io.StringIO()
    with redirect_stdout(out):
        assert bundle.main(["build", "--dry-run"]) == 0
    assert f"in {calls} calls (at most 64 MiB a call)" in out.getvalue()


def test_the_plan_fills_each_call_and_splits_what_does_not_fit():
    files = [common.File("a.whl", "core", 90), common.File("b.whl", "core", 20), common.File("c.whl", "vllm", 130)]
    assert build_job.plan(files, 100) == 3
    assert [(p.call, p.name, p.offset, p.size) for f in files for p in f.parts] == [
        (1, "a.whl", 0, 90),
        (1, "b.whl.part1", 0, 10),
        (2, "b.whl.part2", 10, 10),
        (2, "c.whl.part1", 0, 90),
        (3, "c.whl.part2", 90, 40),
    ]
    assert build_job.call_sizes(files) == {1: 100, 2: 100, 3: 40}
    with pytest.raises(ValueError, match="no room"):
        build_job.plan(files, 0)


def make_wheel(folder: Path, name: str, body: str) -> Path:
    """A pure-Python wheel of one module ``name`` whose ``VALUE`` is ``body`` (padded so that it is split)."""
    path = folder / f"{name}-1.0-py3-none-any.whl"
    info = f"{name}-1.0.dist-info"
    with zipfile.ZipFile(path, "w") as archive:  # stored, not compressed: the padding keeps its size
        archive.writestr(f"{name}.py", f"VALUE = {body!r}\n# {'x' * 3000}\n")
        archive.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        archive.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        archive.writestr(f"{info}/RECORD", "")
    return path


def install(call: Path, store: Path, site: Path) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        assert bundle.main(["install", str(call), "--store", str(store), "--site", str(site)]) == 0
    return out.getvalue()


def test_install_puts_each_group_together_call_by_call(tmp_path):
    wheels = [make_wheel(tmp_path, "alpha", "core's"), make_wheel(tmp_path, "beta", "vllm's")]
    files = [
        common.File(w.name, group, w.stat().st_size, sha256=common.sha256(w))
        for w, group in zip(wheels, ["core", "vllm"], strict=True)
    ]
    calls = build_job.plan(files, 2500)  # each wheel (~3.4 kB) in two parts
    assert calls == 3 and all(len(f.parts) == 2 for f in files)
    out, store, site = tmp_path / "bundle", tmp_path / "store", tmp_path / "site"
    build_job.write_calls(files, {w.name: w for w in wheels}, out)

    first = install(out / "call1", store, site)
    assert "group core: waiting for call(s) 2" in first and "group vllm: waiting for call(s) 2, 3" in first
    second = install(out / "call2", store, site)
    assert "group core: installed in" in second and "alpha-1.0" in second and "vllm: waiting for call(s) 3" in second
    third = install(out / "call3", store, site)
    assert f"group core: installed in {site / 'core'}" in third and "beta-1.0" in third
    path = f"{site / 'core'}:{site / 'vllm'}"
    check = "import alpha, beta; print(alpha.VALUE, beta.VALUE)"
    env = {"PYTHONPATH": path}
    done = subprocess.run([sys.executable, "-c", check], check=False, env=env, capture_output=True, text=True)
    assert done.stdout.strip() == "core's vllm's", done.stderr


def test_install_refuses_a_damaged_part_and_forgets_another_bundles_parts(tmp_path):
    wheel = make_wheel(tmp_path, "alpha", "one")
    files = [common.File(wheel.name, "core", wheel.stat().st_size, sha256=common.sha256(wheel))]
    build_job.plan(files, 2500)
    out, store, site = tmp_path / "bundle", tmp_path / "store", tmp_path / "site"
    build_job.write_calls(files, {wheel.name: wheel}, out)
    install(out / "call1", store, site)
    assert (store / "parts" / f"{wheel.name}.part1").is_file()

    (tmp_path / "other").mkdir()
    other = make_wheel(tmp_path / "other", "alpha", "two")  # a rebuilt bundle: same file names, other bytes
    files = [common.File(other.name, "core", other.stat().st_size, sha256=common.sha256(other))]
    build_job.plan(files, 2500)
    build_job.write_calls(files, {other.name: other}, tmp_path / "new")
    assert "holds another bundle's parts: removed" in install(tmp_path / "new" / "call1", store, site)
    assert common.sha256(store / "parts" / f"{wheel.name}.part1") == files[0].parts[0].sha256

    part = tmp_path / "new" / "call2" / f"{other.name}.part2"
    data = part.read_bytes()
    part.write_bytes(bytes([data[0] ^ 1]) + data[1:])
    with pytest.raises(SystemExit, match="is damaged .sha256 differs.: carry it again"):
        install(tmp_path / "new" / "call2", store, site)


def one_call(tmp_path: Path) -> Path:
    """The call folder of a bundle of one wheel in one call: install installs group core from it at once."""
    wheel = make_wheel(tmp_path, "alpha", "one")
    files = [common.File(wheel.name, "core", wheel.stat().st_size, sha256=common.sha256(wheel))]
    assert build_job.plan(files, 10**6) == 1
    build_job.write_calls(files, {wheel.name: wheel}, tmp_path / "bundle")
    return tmp_path / "bundle" / "call1"


def refused(capsys, call: Path, store: Path, site: Path) -> str:
    """The one line of an install that exits 2 (a user error), with nothing on stdout and no traceback."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        bundle.main(["install", str(call), "--store", str(store), "--site", str(site)])
    out, err = capsys.readouterr()
    assert stop.value.code == 2 and out == "", (stop.value.code, out, err)
    assert len(err.strip().splitlines()) == 1 and err.startswith("gpu_bundle: error: ") and "Traceback" not in err, err
    return err.strip()


def test_install_leaves_the_folders_it_did_not_make_as_they_are(tmp_path, capsys):
    call, store, site = one_call(tmp_path), tmp_path / "store", tmp_path / "site"
    (site / "core").mkdir(parents=True)
    (site / "core" / "mine.py").write_text("the user's\n")
    line = refused(capsys, call, store, site)
    assert str(site / "core") in line and "--site" in line and "remove it yourself" in line, line
    assert (site / "core" / "mine.py").read_text() == "the user's\n" and not store.exists()

    theirs = tmp_path / "theirs"  # a store someone else made, even one with a manifest of another bundle
    theirs.mkdir()
    (theirs / "manifest.json").write_text('{"bundle": "another"}')
    (theirs / "notes.txt").write_text("keep\n")
    line = refused(capsys, call, theirs, tmp_path / "site2")
    assert str(theirs) in line and "--store" in line, line
    assert sorted(p.name for p in theirs.iterdir()) == ["manifest.json", "notes.txt"]
    assert not (tmp_path / "site2").exists()

    (site / "core" / "mine.py").unlink()
    (site / "core").rmdir()
    assert "group core: installed in" in install(call, store, site)  # what it made, it marks and may replace
    for folder in (store, site / "core"):
        assert json.loads((folder / install_job.MARK).read_text())["written_by"] == install_job.WRITER
    assert "group core: installed in" in install(call, tmp_path / "store2", site)
    assert (site / "core" / "alpha.py").is_file() and [p.name for p in site.iterdir()] == ["core"]


def test_install_of_a_missing_call_folder_is_one_line(tmp_path, capsys):
    store, site = tmp_path / "store", tmp_path / "site"
    line = refused(capsys, tmp_path / "no" / "such" / "call", store, site)
    assert str(tmp_path / "no" / "such" / "call") in line and "(absent)" in line and ".gpu_bundle/call1" in line
    (tmp_path / "empty").mkdir()
    line = refused(capsys, tmp_path / "empty", store, site)
    assert str(tmp_path / "empty") in line and "manifest.json" in line, line
    assert not store.exists() and not site.exists()


def test_install_into_a_folder_it_cannot_write_is_one_line(tmp_path, capsys):
    # (tests run as root, where a read-only folder still takes writes: a path under a file cannot be made by anyone)
    call, blocker = one_call(tmp_path), tmp_path / "a_file"
    blocker.write_text("")
    line = refused(capsys, call, tmp_path / "store", blocker / "site")
    assert str(blocker / "site") in line and "pass --site a writable folder" in line, line
    line = refused(capsys, call, blocker / "store", tmp_path / "site")
    assert str(blocker / "store") in line and "pass --store a writable folder" in line, line
    assert blocker.read_text() == ""
