"""The install of ``python3 scripts/gpu_bundle.py install .gpu_bundle/callN``, there on the lent GPU machine with the
standard library and pip only: check and keep the call's parts, join each file whose parts are all there, install each
whole group into SITE/GROUP. gpu_bundle.py's docstring tells the whole; not run itself.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from gpu_bundle_common import PROG, File, Part, refuse, say, sha256


MARK, WRITER = "gpu_bundle-install.json", "scripts/gpu_bundle.py install"  # in each folder install made, no other


def claim(folder: Path, option: str) -> dict | None:
    """The mark of ``folder`` (a folder install made), None where it does not exist; refuses any other folder."""
    if not folder.exists() and not folder.is_symlink():
        return None
    try:
        mark = None if folder.is_symlink() else json.loads((folder / MARK).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        mark = None
    if not isinstance(mark, dict) or mark.get("written_by") != WRITER:
        why = f"exists and gpu_bundle did not make it (no {MARK} of its own in it), so it is left as it is"
        raise refuse(f"{folder} {why}: pass another {option}, or remove it yourself")
    return mark


def write_mark(folder: Path, **what) -> None:
    """Mark ``folder`` as install's, saying what it holds (temp + rename)."""
    (folder / f"{MARK}.tmp").write_text(json.dumps({"written_by": WRITER, **what}, indent=1) + "\n")
    os.replace(folder / f"{MARK}.tmp", folder / MARK)


def read_call(call_dir: Path) -> tuple[str, list[File]]:
    """The bundle and files of a call's manifest; one line (exit 2) where ``call_dir`` is no call folder of build."""
    try:
        manifest = json.loads((call_dir / "manifest.json").read_text())
        files = [File(**{**f, "parts": [Part(**p) for p in f["parts"]]}) for f in manifest["files"]]
        return str(manifest["bundle"]), files
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as error:
        why = f"manifest.json: {getattr(error, 'strerror', None) or error!r}" if call_dir.is_dir() else "absent"
        carry = 'carry it (e.g. [".gpu_bundle/call1"]) after `python scripts/gpu_bundle.py build` here'
        raise refuse(f"{call_dir} is no call folder of build ({why}): {carry}") from None


def install(args: argparse.Namespace) -> int:
    """Check and keep the parts of one call, join the files whose parts are all here, install complete groups."""
    call_dir, store, site = Path(args.call_dir), Path(args.store), Path(args.site)
    bundle, files = read_call(call_dir)
    groups = {g: [f for f in files if f.group == g] for g in dict.fromkeys(f.group for f in files)}
    for group in groups:
        claim(site / group, "--site")  # (refused before anything is written)
    try:
        open_store(store, bundle)
        for part in (p for f in files for p in f.parts if (call_dir / p.name).is_file()):
            if sha256(call_dir / part.name) != part.sha256:
                raise SystemExit(f"{PROG}: error: {call_dir / part.name} is damaged (sha256 differs): carry it again")
            shutil.copyfile(call_dir / part.name, store / "parts" / f"{part.name}.tmp")
            os.replace(store / "parts" / f"{part.name}.tmp", store / "parts" / part.name)
        for group, members in groups.items():
            missing = sorted({p.call for f in members for p in f.parts if not (store / "parts" / p.name).is_file()})
            if missing:
                say(f"group {group}: waiting for call(s) {', '.join(map(str, missing))}")
            elif (store / f"installed-{group}").is_file():
                say(f"group {group}: installed in {site / group}")
            else:
                install_group(group, [join(f, store) for f in members], site / group, bundle)
                (store / f"installed-{group}").touch()
    except OSError as error:  # (a failed write: which path, and which option to change)
        path = next((Path(p) for p in (error.filename2, error.filename) if p), store)
        option = "--site" if path.is_relative_to(site) else "--store" if path.is_relative_to(store) else None
        fix = f"pass {option} a writable folder with room" if option else "carry the call folder again"
        raise refuse(f"{path}: {error.strerror}: {fix}") from None
    return 0


def open_store(store: Path, bundle: str) -> None:
    """``store`` made and marked for ``bundle``: another bundle's store (one install made) is removed first."""
    mark = claim(store, "--store")
    if mark is not None and mark.get("bundle") != bundle:
        say(f"{PROG}: {store} holds another bundle's parts: removed")
        shutil.rmtree(store)
    if mark is None or mark.get("bundle") != bundle:
        store.mkdir(parents=True)
        write_mark(store, bundle=bundle, holds="the parts of the bundle's calls and the files joined from them")
    (store / "parts").mkdir(exist_ok=True)


def join(file: File, store: Path) -> Path:
    """``file`` put together from its parts in ``store``, checked against its sha256."""
    (store / "files").mkdir(exist_ok=True)
    path = store / "files" / file.name
    with open(path, "wb") as out:
        for part in file.parts:
            with open(store / "parts" / part.name, "rb") as f:
                shutil.copyfileobj(f, out)
    if sha256(path) != file.sha256:
        raise SystemExit(f"{PROG}: error: {file.name} put together from its parts differs from the build's: rebuild")
    return path


def install_group(group: str, wheels: list[Path], target: Path, bundle: str) -> None:
    """pip-install ``wheels`` (no index, no requirements) into a new marked folder that then takes the place of
    ``target`` (which, if it exists, install made: ``claim`` refuses any other); prints what it holds."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(prefix=f".{group}-", dir=target.parent))
    try:
        write_mark(fresh, bundle=bundle, group=group, wheels=[w.name for w in wheels])
        command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
        command += ["--no-cache-dir", "--disable-pip-version-check", "--target", str(fresh), *map(str, wheels)]
        if subprocess.run(command, check=False).returncode:
            raise SystemExit(f"{PROG}: error: pip could not install group {group} into {target} (its output above)")
        if claim(target, "--site") is not None:
            shutil.rmtree(target)
        os.rename(fresh, target)
    finally:
        shutil.rmtree(fresh, ignore_errors=True)  # (made above, with the mark in it; gone once renamed)
    names = sorted(p.name.removesuffix(".dist-info") for p in target.glob("*.dist-info"))
    say(f"group {group}: installed in {target}: {' '.join(names)}")
