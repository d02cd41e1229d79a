"""CPU stand-in for the NCCL group of vLLM's weight transfer: TCP connections on 127.0.0.1 that carry the broadcast.

The trainer (rank 0) hosts the rendezvous, workers join, and the trainer broadcasts packed uint8 buffers
(``CPUCommunicator.broadcast``) cut by vLLM's packing rule; each receive waits at most
``HF_GRPO_WEIGHT_TRANSFER_TIMEOUT`` seconds (default 300). Rendezvous, framing, closing: docs/vllm_protocol.md.

    group = open_trainer_group("127.0.0.1", 51216, world_size=2)  # trainer
    broadcast_packed(model.named_parameters(), group, src=0, post_iter_func=lambda item: item[1].data)
    group = join_group("127.0.0.1", 51216, rank=1, world_size=2)  # server worker
    for chunk in receive_packed(group, [(name, shape, dtype), ...]): engine.load_weights(chunk)
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import struct
import time
from collections.abc import Callable, Iterable, Iterator

import torch


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
FRAME_MAGIC = b"HFWT"
_FRAME = struct.Struct("!4sQ")  # magic, payload length in bytes
_MESSAGE = struct.Struct("!I")  # length of a JSON control message
DEFAULT_BUFFER_SIZE_BYTES = 1024 * 1024 * 1024  # vLLM's DEFAULT_PACKED_BUFFER_SIZE_BYTES
DEFAULT_NUM_BUFFERS = 2  # vLLM's DEFAULT_PACKED_NUM_BUFFERS (no effect here: sends are synchronous)


class TransportError(RuntimeError):
    """The CPU weight-transfer group failed: a peer left, timed out, or sent bytes that do not match."""


def _rendezvous_timeout(master_address: str, timeout: float | None) -> float:
    """Refuse a ``master_address`` that is not loopback; ``timeout`` or else ``HF_GRPO_WEIGHT_TRANSFER_TIMEOUT``."""
    if master_address not in LOOPBACK_HOSTS:
        raise ValueError(
            f"master_address {master_address!r} is not a loopback address: hf_grpo's CPU stand-in for vLLM's NCCL "
            f"weight transfer only listens and connects on {LOOPBACK_HOSTS}"
        )
    if timeout is not None:
        return timeout
    raw = os.environ.get("HF_GRPO_WEIGHT_TRANSFER_TIMEOUT", "300")
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and 0 < seconds <= 86400):
        raise ValueError(f"HF_GRPO_WEIGHT_TRANSFER_TIMEOUT={raw!r} is not a number of seconds above 0 and at most "
                         "86400: set it to e.g. 300, or unset it")  # fmt: skip
    return seconds


def _recv_exact(sock: socket.socket, buffer: bytearray | memoryview, what: str) -> bytearray | memoryview:
    """Fill ``buffer`` from ``sock`` (or raise ``TransportError``) and return it."""
    view, got = memoryview(buffer), 0
    while got < len(view):
        try:
            count = sock.recv_into(view[got:])
        except TimeoutError as exc:
            raise TransportError(f"no {what} arrived within {sock.gettimeout():.0f} s") from exc
        except OSError as exc:
            raise TransportError(f"the weight transfer connection failed while receiving {what}: {exc}") from exc
        if count == 0:
            raise TransportError(f"the peer closed the weight transfer connection while this side waited for {what}")
        got += count
    return buffer


def _send_message(sock: socket.socket, message: dict) -> None:
    data = json.dumps(message).encode()
    sock.sendall(_MESSAGE.pack(len(data)) + data)


def _recv_message(sock: socket.socket) -> dict:
    (length,) = _MESSAGE.unpack(_recv_exact(sock, bytearray(_MESSAGE.size), "a rendezvous message"))
    if length > 1 << 20:
        raise TransportError("malformed rendezvous message (not an hf_grpo weight transfer peer?)")
    return json.loads(_recv_exact(sock, bytearray(length), "a rendezvous message"))


class TCPGroup:
    """The group's sockets. ``store``: rank 0's listening socket; ``socket``: the connections (rank 0 has one per
    worker, a worker one to rank 0). Assigning None to either closes it, which is how TRL closes the group."""

    def __init__(self, rank: int, world_size: int, listener: socket.socket | None, peers: dict[int, socket.socket]):
        self.rank, self.world_size = rank, world_size
        self._listener, self._peers = listener, peers

    @property
    def store(self) -> socket.socket | None:
        return self._listener

    @store.setter
    def store(self, value: socket.socket | None) -> None:
        if value is None and self._listener is not None:
            self._listener.close()
        self._listener = value

    @property
    def socket(self) -> dict[int, socket.socket] | None:
        return self._peers or None

    @socket.setter
    def socket(self, value: dict[int, socket.socket] | None) -> None:
        if value is None:
            for sock in self._peers.values():
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._peers = {}
        else:
            self._peers = value

    def close(self) -> None:
        self.socket = None
        self.store = None


class CPUCommunicator:
    """What vLLM's ``PyNcclCommunicator`` is to the weight transfer (``group``, ``rank``, ``world_size``,
    ``device``, ``broadcast``), with tensors moved over the ``TCPGroup``'s sockets."""

    def __init__(self, group: TCPGroup, timeout: float):
        self.group, self.timeout = group, timeout
        self.rank, self.world_size = group.rank, group.world_size
        self.device = torch.device("cpu")
        self.bytes = 0  # sent (rank 0) or received (worker) in the group's lifetime

    def _peers(self) -> dict[int, socket.socket]:
        peers = self.group.socket
        if not peers:
            raise TransportError("the weight transfer group is closed (close_communicator, or the peer left)")
        return peers

    def broadcast(self, tensor: torch.Tensor, src: int = 0, stream=None) -> None:
        """Rank ``src`` (0) sends ``tensor``; the others receive into ``tensor`` in place."""
        if src != 0:
            raise NotImplementedError("hf_grpo's CPU weight transfer broadcasts from rank 0 (the trainer) only")
        if self.rank == src:
            self._send(tensor)
        else:
            self._recv_into(tensor)

    def _send(self, tensor: torch.Tensor) -> None:
        data = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
        header = _FRAME.pack(FRAME_MAGIC, data.nbytes)
        for rank, sock in self._peers().items():
            try:
                sock.sendall(header)
                sock.sendall(memoryview(data))
            except OSError as exc:
                raise TransportError(
                    f"sending weights to rank {rank} failed: {exc} (did the vLLM server stop?)"
                ) from exc
        self.bytes += data.nbytes

    def _recv_into(self, tensor: torch.Tensor) -> None:
        if tensor.device.type != "cpu" or not tensor.is_contiguous():
            raise ValueError("receive into a contiguous CPU tensor")
        sock = self._peers()[0]
        sock.settimeout(self.timeout)
        magic, length = _FRAME.unpack(_recv_exact(sock, bytearray(_FRAME.size), "weights"))
        if magic != FRAME_MAGIC:
            raise TransportError("malformed weight transfer frame (the stream is out of step)")
        target = tensor.reshape(-1).view(torch.uint8)
        if length != target.numel():
            _drain(sock, length)
            raise TransportError(
                f"the trainer sent {length} bytes where {target.numel()} were expected: its tensors do not match the "
                "names, dtypes and shapes announced in update_info"
            )
        _recv_exact(sock, memoryview(target.numpy()), "weights")
        self.bytes += length


def _drain(sock: socket.socket, length: int) -> None:
    scratch = bytearray(min(length, 1 << 20))
    while length:
        part = memoryview(scratch)[: min(length, len(scratch))]
        _recv_exact(sock, part, "weights")
        length -= len(part)


def open_trainer_group(
    master_address: str, master_port: int, world_size: int, rank: int = 0, timeout: float | None = None
) -> CPUCommunicator:
    """Rank 0's side of the rendezvous: listen, wait for the ``world_size - 1`` workers, check them, confirm."""
    timeout = _rendezvous_timeout(master_address, timeout)
    if rank != 0:
        raise NotImplementedError("hf_grpo's CPU weight transfer has one trainer rank (0)")
    if world_size < 2:
        raise ValueError(f"world_size must count the trainer and at least one worker, got {world_size}")
    try:
        family = socket.AF_INET6 if ":" in master_address else socket.AF_INET
        listener = socket.create_server((master_address, int(master_port)), family=family)
    except OSError as exc:
        raise TransportError(
            f"cannot listen on {master_address}:{master_port} for the weight transfer group: {exc} (port in use? set "
            "another vllm_group_port)"
        ) from exc
    peers: dict[int, socket.socket] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(peers) < world_size - 1:
            listener.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                conn, _ = listener.accept()
            except TimeoutError as exc:
                raise TransportError(
                    f"only ranks {sorted(peers)} of world size {world_size} joined the weight transfer group at "
                    f"{master_address}:{master_port} within {timeout:.0f} s"
                ) from exc
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(max(0.01, deadline - time.monotonic()))
            hello = _recv_message(conn)
            problem = None
            if hello.get("world_size") != world_size:
                problem = f"world size {hello.get('world_size')} differs from the trainer's {world_size}"
            elif not isinstance(hello.get("rank"), int) or not 0 < hello["rank"] < world_size:
                problem = f"rank {hello.get('rank')} is outside 1..{world_size - 1}"
            elif hello["rank"] in peers:
                problem = f"rank {hello['rank']} joined twice"
            if problem:
                _send_message(conn, {"error": problem})
                conn.close()
                raise TransportError(f"a worker could not join the weight transfer group: {problem}")
            peers[hello["rank"]] = conn
        for conn in peers.values():
            _send_message(conn, {"ok": True})
    except BaseException:
        for conn in peers.values():
            conn.close()
        listener.close()
        raise
    return CPUCommunicator(TCPGroup(0, world_size, listener, peers), timeout)


def join_group(
    master_address: str, master_port: int, rank: int, world_size: int, timeout: float | None = None
) -> CPUCommunicator:
    """A worker's side of the rendezvous: connect to rank 0 (retrying until it listens), announce, wait for the go."""
    timeout = _rendezvous_timeout(master_address, timeout)
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = socket.create_connection((master_address, int(master_port)), timeout=5)
            break
        except OSError as exc:
            if time.monotonic() > deadline:
                raise TransportError(
                    f"the trainer's weight transfer group at {master_address}:{master_port} did not accept rank "
                    f"{rank} within {timeout:.0f} s: {exc}"
                ) from exc
            time.sleep(0.05)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(max(0.01, deadline - time.monotonic()))
    try:
        _send_message(sock, {"rank": rank, "world_size": world_size})
        reply = _recv_message(sock)
    except BaseException:
        sock.close()
        raise
    if "error" in reply:
        sock.close()
        raise TransportError(f"the trainer refused rank {rank}: {reply['error']}")
    return CPUCommunicator(TCPGroup(rank, world_size, None, {0: sock}), timeout)


# ---------------------------------------------------------------------------------------------------------------------
# Packed broadcast


def pack_chunks(sizes: list[int], buffer_size_bytes: int) -> list[range]:
    """Indices of the tensors in each packed buffer: tensors are added until the total exceeds the buffer size."""
    chunks, start, total = [], 0, 0
    for i, size in enumerate(sizes):
        total += size
        if total > buffer_size_bytes:
            chunks.append(range(start, i + 1))
            start, total = i + 1, 0
    if start < len(sizes):
        chunks.append(range(start, len(sizes)))
    return chunks


def broadcast_packed(
    iterator: Iterable[tuple[str, torch.Tensor]],
    communicator: CPUCommunicator,
    src: int,
    post_iter_func: Callable[[tuple[str, torch.Tensor]], torch.Tensor],
    buffer_size_bytes: int = DEFAULT_BUFFER_SIZE_BYTES,
) -> None:
    """Send every tensor of ``iterator`` (after ``post_iter_func``) in packed buffers."""
    pending: list[torch.Tensor] = []
    total = 0
    for item in iterator:
        flat = post_iter_func(item).detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        pending.append(flat)
        total += flat.numel()
        if total > buffer_size_bytes:
            communicator.broadcast(torch.cat(pending), src=src)
            pending, total = [], 0
    if pending:
        communicator.broadcast(torch.cat(pending), src=src)


def receive_packed(
    communicator: CPUCommunicator,
    metadata: list[tuple[str, list[int], torch.dtype]],
    src: int = 0,
    buffer_size_bytes: int = DEFAULT_BUFFER_SIZE_BYTES,
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Receive the buffers ``broadcast_packed`` sends for ``metadata``; yields each buffer's (name, tensor) pairs."""
    sizes = [math.prod(shape) * dtype.itemsize for _, shape, dtype in metadata]
    for chunk in pack_chunks(sizes, buffer_size_bytes):
        buffer = torch.empty(sum(sizes[i] for i in chunk), dtype=torch.uint8)
        communicator.broadcast(buffer, src=src)
        pieces = buffer.split([sizes[i] for i in chunk])
        yield [
            (metadata[i][0], piece.clone().view(metadata[i][2]).view(metadata[i][1]))  # clone: aligned storage
            for i, piece in zip(chunk, pieces, strict=True)
        ]
