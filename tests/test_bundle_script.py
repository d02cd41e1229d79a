"""scripts/gpu_bundle.py, without a download: the bundle of the last build (its lock) fits the lent machine's calls with
today's working tree, the plan cuts files into parts that join back, and ``install`` run once per call, on a bundle of
two small wheels made here, installs each group when its last part arrives (docs/gpu.md)."""

from __future__ import annotations

import importlib.util
import io
import subprocess
import sys
import zipfile
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from .helpers.common import REPO


SPEC = importlib.util.spec_from_file_location("gpu_bundle", REPO / "scripts" / "gpu_bundle.py")
bundle = importlib.util.module_from_spec(SPEC)
sys.modules["gpu_bundle"] = bundle  # (dataclasses look their module up)
SPEC.loader.exec_module(bundle)


def test_the_locked_bundle_fits_the_calls_with_todays_tree():
    files = bundle.read_lock()
    tree = bundle.tree_size()
    calls = bundle.plan(files, bundle.CARRY_LIMIT - tree - bundle.MARGIN)
    sizes = bundle.call_sizes(files)
    assert sorted(sizes) == list(range(1, calls + 1))
    assert all(size + tree <= bundle.CARRY_LIMIT for size in sizes.values()), (tree, sizes)
    for file in files:
        assert sum(p.size for p in file.parts) == file.size and file.parts[0].offset == 0
        assert all(a.offset + a.size == b.offset for a, b in zip(file.parts, file.parts[1:], strict=False))
    assert {f.group for f in files} == set(bundle.GROUPS)
    order = [list(bundle.GROUPS).index(f.group) for f in files]
    assert order == sorted(order), "a group's files come before the next group's: core is installed first"
    assert len({f.name for f in files}) == len(files) and all(len(f.sha256) == 64 for f in files)
    names = {bundle.canonical(f.name.split("-")[0]) for f in files}
    assert not names & set(bundle.LEAVE_OUT), "a package left out was carried"
    out = io.StringIO()
    with redirect_stdout(out):
        assert bundle.main(["build", "--dry-run"]) == 0
    assert f"in {calls} calls (at most 64 MiB a call)" in out.getvalue()


def test_the_plan_fills_each_call_and_splits_what_does_not_fit():
    files = [bundle.File("a.whl", "core", 90), bundle.File("b.whl", "core", 20), bundle.File("c.whl", "vllm", 130)]
    assert bundle.plan(files, 100) == 3
    assert [(p.call, p.name, p.offset, p.size) for f in files for p in f.parts] == [
        (1, "a.whl", 0, 90),
        (1, "b.whl.part1", 0, 10),
        (2, "b.whl.part2", 10, 10),
        (2, "c.whl.part1", 0, 90),
        (3, "c.whl.part2", 90, 40),
    ]
    assert bundle.call_sizes(files) == {1: 100, 2: 100, 3: 40}
    with pytest.raises(ValueError, match="no room"):
        bundle.plan(files, 0)


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
        bundle.File(w.name, group, w.stat().st_size, sha256=bundle.sha256(w))
        for w, group in zip(wheels, ["core", "vllm"], strict=True)
    ]
    calls = bundle.plan(files, 2500)  # each wheel (~3.4 kB) in two parts
    assert calls == 3 and all(len(f.parts) == 2 for f in files)
    out, store, site = tmp_path / "bundle", tmp_path / "store", tmp_path / "site"
    bundle.write_calls(files, {w.name: w for w in wheels}, out)

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
    files = [bundle.File(wheel.name, "core", wheel.stat().st_size, sha256=bundle.sha256(wheel))]
    bundle.plan(files, 2500)
    out, store, site = tmp_path / "bundle", tmp_path / "store", tmp_path / "site"
    bundle.write_calls(files, {wheel.name: wheel}, out)
    install(out / "call1", store, site)
    assert (store / "parts" / f"{wheel.name}.part1").is_file()

    (tmp_path / "other").mkdir()
    other = make_wheel(tmp_path / "other", "alpha", "two")  # a rebuilt bundle: same file names, other bytes
    files = [bundle.File(other.name, "core", other.stat().st_size, sha256=bundle.sha256(other))]
    bundle.plan(files, 2500)
    bundle.write_calls(files, {other.name: other}, tmp_path / "new")
    assert "holds another bundle's parts: removed" in install(tmp_path / "new" / "call1", store, site)
    assert bundle.sha256(store / "parts" / f"{wheel.name}.part1") == files[0].parts[0].sha256

    part = tmp_path / "new" / "call2" / f"{other.name}.part2"
    data = part.read_bytes()
    part.write_bytes(bytes([data[0] ^ 1]) + data[1:])
    with pytest.raises(SystemExit, match="is damaged .sha256 differs.: carry it again"):
        install(tmp_path / "new" / "call2", store, site)
