"""Carry the Python packages a lent GPU machine lacks, in files small enough for its calls (docs/gpu.md).

The lent machine has Python 3.12, torch 2.11 (CUDA 13), accelerate, peft and no network; each call carries the
working tree plus its ``carry`` paths, 64 MiB in all, and what a call leaves outside the tree (in /tmp) survives
into the next call only while the machine is warm (30 s after a call). So:

    python scripts/gpu_bundle.py build              # here, with the package index (the project's venv, whose torch
                                                    # builds deepspeed's wheel): .gpu_bundle/call1, call2, ...
    python scripts/gpu_bundle.py build --dry-run    # the calls of the last build (scripts/gpu_bundle.lock.json)
    python3 scripts/gpu_bundle.py install .gpu_bundle/call1     # there, in call 1; then call2 in call 2, ...

``build`` downloads py3.12 manylinux x86_64 wheels of each group's packages and of their requirements that the
machine lacks (``DEVICE``: what it was seen to hold), builds deepspeed's wheel from its sdist, repacks vLLM without
what a single Hopper GPU and a dense model never load (``VLLM_DROP``), then cuts the files into calls: each call's
folder, with the working tree, stays under the carry limit; a file larger than what is left of a call is split in
parts. It writes ``manifest.json`` (sha256 of every file and part) into each call's folder, the lock of what it
chose, and prints the calls with their sizes.

``install`` (standard library and pip only) checks the call's parts, adds them to ``/tmp/gpu_bundle``, joins every
file whose parts are all there, checks it, and installs each group whose files are all there with ``pip install
--no-index --no-deps --target /tmp/site/GROUP``. Then ``export PYTHONPATH=/tmp/site/vllm:/tmp/site/model:/tmp/site/
core:$PWD`` puts them before the machine's own packages. The store and each SITE/GROUP hold ``gpu_bundle-install.json``
(``MARK``), written by install alone: it replaces or removes only a folder with that mark and refuses any other.

Each job is a module beside this one: gpu_bundle_build.py (with ``DEVICE``, ``LEAVE_OUT``, ``VLLM_DROP``) and
gpu_bundle_install.py (with ``MARK``); gpu_bundle_common.py holds what both use (``GROUPS``, the files and parts).
"""

from __future__ import annotations

import argparse
import sys

from gpu_bundle_build import build
from gpu_bundle_common import GROUPS, PROG, ROOT, SITE, STORE
from gpu_bundle_install import install


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    b = commands.add_parser("build", help="download and cut the bundle into calls (here, with the package index)")
    b.add_argument("--out", default=str(ROOT / ".gpu_bundle"), help="where the wheels and calls go (git ignores it)")
    b.add_argument("--groups", type=lambda s: s.split(","), default=list(GROUPS), help="e.g. core,model")
    b.add_argument("--dry-run", action="store_true", help="only print the calls of the lock's files")
    i = commands.add_parser("install", help="add one call's parts; install the groups that are whole (there)")
    i.add_argument("call_dir", help="the call's folder, e.g. .gpu_bundle/call1")
    i.add_argument("--store", default=str(STORE), help="where the parts of earlier calls wait")
    i.add_argument("--site", default=str(SITE), help="each group is installed in SITE/GROUP")
    args = parser.parse_args(argv)
    unknown = [g for g in getattr(args, "groups", []) if g not in GROUPS]
    if unknown:
        parser.error(f"unknown group(s) {', '.join(unknown)}: choose from {', '.join(GROUPS)}")
    return build(args) if args.command == "build" else install(args)


if __name__ == "__main__":
    sys.exit(main())
