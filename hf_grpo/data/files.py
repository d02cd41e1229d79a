"""Local data files (``.jsonl`` / ``.json`` / ``.parquet`` / ``.csv``): reading one as a split, and naming what is
wrong with one that cannot be read (not UTF-8, a datasets cache that cannot be written, a JSON line that does not
parse, such as the last line of a copy that stopped) rather than ending in datasets' ``DatasetGenerationError``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os

import datasets.config
from datasets import Dataset, load_dataset
from datasets.exceptions import DatasetGenerationError


LOCAL_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
TAIL_BYTES = 1 << 20  # the end of a file read for its last line (``cut_last_line``)
CUT_SHORT = "; it is the last line and has no line end: the file was cut short (an interrupted copy or download?)"


def is_local_file(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in LOCAL_BUILDERS


@contextlib.contextmanager
def cache_must_be_writable():
    """A datasets cache that cannot be written (a read-only ``HF_HOME``, or one under a file) as a ``ValueError``
    naming it and the fix."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST):  # (under a file)
            raise
        raise ValueError(
            f"cannot write the datasets cache ({exc.strerror}: {exc.filename}): set HF_DATASETS_CACHE (or HF_HOME) "
            f"to a writable folder; it is {datasets.config.HF_DATASETS_CACHE} now"
        ) from None


def load_file(path: str) -> Dataset:
    """A local data file as one split. A file that is not UTF-8 (a spreadsheet's cp1252 CSV), or a JSON file with a
    line that does not parse, is a ``ValueError`` naming the file, the byte or line and the fix."""
    try:
        with cache_must_be_writable():
            return load_dataset(LOCAL_BUILDERS[os.path.splitext(path)[1].lower()], data_files=path, split="train")
    except DatasetGenerationError as exc:
        bad, suffix = exc.__cause__, os.path.splitext(path)[1]
        if isinstance(bad, UnicodeDecodeError):
            byte, near = bad.object[bad.start : bad.start + 1], bad.object[max(0, bad.start - 20) : bad.start + 20]
            problem = (
                f"is not UTF-8 text: byte {byte.hex()} in {near!r}; save it as UTF-8 (for a Windows-1252 file: "
                f"iconv -f cp1252 -t utf-8 {path} > utf8{suffix})"
            )
        else:
            line = json_problem(path) if LOCAL_BUILDERS[suffix.lower()] == "json" else None
            problem = f"holds a bad {line}" if line is not None else None
        if problem is None:
            raise
        raise ValueError(f"dataset file {path!r} {problem}") from None


def line_problem(number: int, line: str) -> str | None:
    """What is wrong with line ``number`` of a JSON Lines file (``line N: not JSON (...)`` or not an object, said
    with the fix); None for a JSON object or a blank line."""
    if not line.strip():
        return None
    try:
        row = json.loads(line.rstrip("\r\n"))  # a column past the end would point into the next line
    except ValueError as exc:
        where = f": column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
        cut = CUT_SHORT if not line.endswith("\n") else ""
        return f"line {number}: not JSON ({getattr(exc, 'msg', exc)}{where}){cut}; fix or remove that line"
    if isinstance(row, dict):
        return None
    return f"line {number}: a JSON {type(row).__name__}, not an object of columns; fix or remove that line"


def json_problem(path: str) -> str | None:
    """The first line of a JSON file that is not a row (``line_problem``): a JSON Lines file line by line, a JSON
    document where its parser stops; None when it parses (the file's fault is another)."""
    with open(path, encoding="utf-8") as f:
        if f.read(4096).lstrip().startswith("["):  # one JSON document: an array of rows
            f.seek(0)
            try:
                json.load(f)
            except json.JSONDecodeError as exc:
                return f"line {exc.lineno}: not JSON ({exc.msg}: column {exc.colno}); fix that line"
            return None
        f.seek(0)
        for number, line in enumerate(f, 1):  # line by line: a JSON Lines file may be larger than memory
            problem = line_problem(number, line)
            if problem is not None:
                return problem
    return None


def cut_last_line(path: str) -> str | None:
    """``line N: not JSON ... cut short`` when the last line of a JSON Lines file does not parse (a copy or a
    download that stopped), read from the file's end, so a recipe check can afford it on any size of file; None
    otherwise (or when the last line is longer than ``TAIL_BYTES``: the load finds it then)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        f.seek(max(0, size - TAIL_BYTES))
        tail = f.read()
    body = tail.rstrip()
    start = body.rfind(b"\n") + 1
    if start == 0 and size > TAIL_BYTES:
        return None
    last = tail[start:].decode("utf-8", errors="replace")
    if line_problem(1, last) is None:
        return None
    with open(path, "rb") as f:  # the line's number: the newlines before it
        before = size - len(tail) + start
        newlines = sum(chunk.count(b"\n") for chunk in _chunks(f, before))
    return line_problem(newlines + 1, last)


def _chunks(f, length: int, size: int = 1 << 24):
    """The first ``length`` bytes of ``f`` in chunks."""
    while length > 0:
        chunk = f.read(min(size, length))
        if not chunk:
            return
        length -= len(chunk)
        yield chunk
