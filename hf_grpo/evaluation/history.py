"""``training_history.json``: one record per logged step, written as training goes.

The file is rewritten atomically at every log, so a crashed run keeps its curves, and on resume the records after
the checkpoint's step are dropped before new ones are appended (no step appears twice).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from transformers import TrainerCallback

from ..base.run_files import HISTORY_FILE, read_checked


def write_json(path: str | Path, data) -> None:
    """Write JSON atomically (temp file + rename), so readers never see half a file; a write that fails (a full
    disk) removes the temp file and raises ``OSError`` naming ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        with open(tmp, "w") as f:
            json.dump(data, f, indent=2, allow_nan=False)
        os.replace(tmp, path)
    except OSError as exc:  # a full disk: nothing half-written left behind, and the error names the file
        tmp.unlink(missing_ok=True)
        exc.filename = exc.filename or str(path)
        raise


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_history(output_dir: str | Path) -> list[dict]:
    """The run's history records (none when it has no file yet); ``RunFileError`` naming a damaged one."""
    return read_checked(Path(output_dir) / HISTORY_FILE, list, missing_ok=True) or []


class HistoryCallback(TrainerCallback):
    """Append every log of the main process to ``output_dir/training_history.json``."""

    def __init__(self, output_dir: str | Path):
        self.path = Path(output_dir) / HISTORY_FILE
        self.records: list[dict] = []

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            # state.global_step is the checkpoint's step when resuming, 0 otherwise
            self.records = [r for r in read_history(self.path.parent) if r.get("step", 0) <= state.global_step]
            write_json(self.path, self.records)

    def mark(self, step: int, finding: dict) -> None:
        """A record of the run watch's (``{"step", "watch": finding}``), between the step's logs (main process); once,
        when a finishing run finds again what it found before it was stopped."""
        record = {"step": step, "watch": finding}
        if record in self.records:
            return
        self.records.append(record)
        write_json(self.path, self.records)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        record = {"step": state.global_step, "epoch": state.epoch}
        record.update({k: _clean(v) for k, v in logs.items() if isinstance(v, (int, float, str, type(None)))})
        self.records.append(record)
        write_json(self.path, self.records)
