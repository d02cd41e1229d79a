"""The worker side of vLLM's NCCL weight transfer, for the stand-in server's development routes.

``WeightReceiver`` answers ``/init_weight_transfer_engine`` (join the trainer's group over ``transport``: TCP on
127.0.0.1), ``/start_weight_update``, ``/update_weights`` (receive the announced tensors, load them into the
engine) and ``/finish_weight_update`` with vLLM's bodies and errors. Every announced name and shape is checked
before any byte is loaded: an unknown name (``ValueError``, 400) or a wrong shape (``AssertionError``, 500) loads
nothing, the announced bytes are still read so the trainer's broadcast completes, and the group stays usable. Bytes
that do not match the announcement (500) leave the group unusable until the next ``/init_weight_transfer_engine``,
where NCCL would hang.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import torch

from . import transport
from .engine import SamplingEngine
from .errors import ApiError


logger = logging.getLogger("hf_grpo.vllm_standin.server")

INIT_INFO_FIELDS = {
    "master_address",
    "master_port",
    "rank_offset",
    "world_size",
    "nccl_unique_id_b64",
    "packed",
    "packed_buffer_size_bytes",
    "packed_num_buffers",
}
UPDATE_INFO_FIELDS = ("names", "dtype_names", "shapes")


def parse_update_info(update_info: Any) -> list[tuple[str, list[int], torch.dtype]]:
    """``[(name, shape, dtype)]`` from ``{"names", "dtype_names", "shapes"}``, checked as vLLM checks it."""
    if not isinstance(update_info, dict) or set(update_info) != set(UPDATE_INFO_FIELDS):
        fields = sorted(update_info) if isinstance(update_info, dict) else update_info
        raise ValueError(
            f"Invalid update_info for NCCLWeightTransferEngine: expected the fields {list(UPDATE_INFO_FIELDS)}, "
            f"got {fields}"
        )
    names, dtype_names, shapes = (update_info[k] for k in UPDATE_INFO_FIELDS)
    if len(dtype_names) != len(names) or len(shapes) != len(names):
        raise ValueError(
            f"`dtype_names` and `shapes` should be of the same size as `names`: got {len(dtype_names)}, "
            f"{len(shapes)} and {len(names)}"
        )
    metadata = []
    for name, dtype_name, shape in zip(names, dtype_names, shapes, strict=True):
        dtype = getattr(torch, str(dtype_name), None)
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"unknown dtype {dtype_name!r} for {name!r}")
        metadata.append((str(name), [int(d) for d in shape], dtype))
    return metadata


def check_init_info(init_info: Any) -> None:
    """Refuse an ``init_info`` vLLM's ``NCCLWeightTransferEngine`` refuses, or one this CPU transfer cannot join."""
    if not isinstance(init_info, dict) or set(init_info) - INIT_INFO_FIELDS:
        unknown = sorted(set(init_info) - INIT_INFO_FIELDS) if isinstance(init_info, dict) else init_info
        raise ValueError(f"Invalid init_info for NCCLWeightTransferEngine: unexpected fields {unknown}")
    missing = [k for k in ("rank_offset", "world_size") if k not in init_info]
    if missing:
        raise ValueError(f"Invalid init_info for NCCLWeightTransferEngine: missing {missing}")
    if init_info.get("nccl_unique_id_b64"):
        raise NotImplementedError(
            "hf_grpo's CPU weight transfer joins by master_address/master_port, not by an NCCL unique id"
        )
    if init_info.get("master_address") is None or init_info.get("master_port") is None:
        raise ValueError("NCCLWeightTransferInitInfo: need nccl_unique_id_b64, or both master_address and master_port")


class WeightReceiver:
    """One CPU worker (rank 0 + ``rank_offset``) of the weight transfer group; ``on_finish`` runs after each update
    session (the server re-merges its adapters there). ``last_update``: the tensors received and loaded last."""

    def __init__(self, engine: SamplingEngine, config: dict | None, on_finish: Callable[[], None]):
        self.engine, self.config, self.on_finish = engine, config, on_finish
        self.lock = threading.Lock()
        self.communicator: transport.CPUCommunicator | None = None
        self.init_info: dict | None = None
        self.failed: str | None = None  # why the group is unusable
        self.active = False  # between start_weight_update and finish_weight_update
        self.last_update: dict[str, int] = {}

    def _check_configured(self) -> None:
        if self.config is None:
            raise RuntimeError(
                "Weight transfer not configured. Please set weight_transfer_config to enable weight transfer."
            )

    def init(self, body: Any) -> dict:
        init_info = body.get("init_info") if isinstance(body, dict) else None
        if init_info is None:
            raise ApiError(400, "Missing 'init_info' in request body", "Bad Request")
        self._check_configured()
        check_init_info(init_info)
        address, port = init_info["master_address"], int(init_info["master_port"])
        rank, world_size = 0 + int(init_info["rank_offset"]), int(init_info["world_size"])  # one worker: rank 0
        with self.lock:
            if self.communicator is not None:
                self.communicator.group.close()
            self.communicator, self.failed = None, None
            self.communicator = transport.join_group(address, port, rank, world_size)
            self.init_info = dict(init_info)
        logger.info("joined the weight transfer group at %s:%s as rank %d of %d", address, port, rank, world_size)
        return {"message": "Weight transfer initialized"}

    def start(self) -> dict:
        self._check_configured()
        with self.lock:
            if self.active:
                raise RuntimeError(
                    "start_weight_update called while a weight update is already active. Call finish_weight_update "
                    "first."
                )
            self.active = True
        return {"message": "Weight update started"}

    def update(self, body: Any) -> dict:
        update_info = body.get("update_info") if isinstance(body, dict) else None
        if update_info is None:
            raise ApiError(400, "Missing 'update_info' in request body", "Bad Request")
        self._check_configured()
        with self.lock:
            try:
                self._update(update_info)
            except BaseException:
                self.active = False  # as vLLM's worker does when an update fails
                raise
        return {"message": "Weights updated"}

    def _update(self, update_info: Any) -> None:
        if not self.active:
            raise RuntimeError("start_weight_update must be called before update_weights.")
        communicator = self.communicator
        if communicator is None:
            raise RuntimeError("NCCL weight transfer not initialized. Call init_transfer_engine() first.")
        if self.failed:
            raise RuntimeError(
                f"the weight transfer group is unusable after a failed update ({self.failed}); call "
                "/init_weight_transfer_engine again"
            )
        metadata = parse_update_info(update_info)
        problem: Exception | None = None
        try:
            self.engine.check_weights([m[0] for m in metadata], [m[1] for m in metadata])
        except (ValueError, AssertionError) as exc:
            problem = exc  # still read every announced byte, so that the trainer's broadcast completes
        bytes_before = communicator.bytes  # the group counts every byte of its lifetime
        try:
            received = self._receive(communicator, metadata)
        except transport.TransportError as exc:
            self.failed = str(exc)
            raise
        if problem is not None:
            raise problem
        loaded = self.engine.load_weights(received)
        self.last_update = {"tensors": len(received), "loaded": len(loaded)}
        logger.info("loaded %d tensors (%d bytes) from the trainer", len(received), communicator.bytes - bytes_before)

    def _receive(self, communicator, metadata) -> list[tuple[str, torch.Tensor]]:
        """The announced tensors, in packed buffers or one broadcast each (``init_info["packed"]``)."""
        if not self.init_info.get("packed", False):
            received = [(name, torch.empty(shape, dtype=dtype)) for name, shape, dtype in metadata]
            for _, tensor in received:
                communicator.broadcast(tensor, src=0)
            return received
        buffer_size = int(self.init_info.get("packed_buffer_size_bytes", transport.DEFAULT_BUFFER_SIZE_BYTES))
        return [item for chunk in transport.receive_packed(communicator, metadata, 0, buffer_size) for item in chunk]

    def finish(self) -> dict:
        self._check_configured()
        with self.lock:
            if not self.active:
                raise RuntimeError("finish_weight_update called without a matching start_weight_update.")
            self.active = False
        self.on_finish()
        return {"message": "Weight update finished"}
