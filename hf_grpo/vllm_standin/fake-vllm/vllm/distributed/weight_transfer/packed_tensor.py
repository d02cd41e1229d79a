"""vLLM 0.30's packed broadcast (``vllm/distributed/weight_transfer/packed_tensor.py``) over the stand-in transport.

``packed_nccl_broadcast_producer(iterator, group, src, post_iter_func, buffer_size_bytes, num_buffers)`` packs the
tensors into uint8 buffers of about ``buffer_size_bytes`` (vLLM's rule: add tensors until the total exceeds it) and
broadcasts each from rank ``src`` (0) through ``group``, the communicator of ``trainer_init``; TRL 1.16 calls it in
``VLLMClient.update_named_params``. ``packed_nccl_broadcast_consumer`` is the receiving side (the stand-in server
uses ``hf_grpo.vllm_standin.transport.receive_packed`` directly). ``num_buffers`` has no effect: sends are synchronous,
there are no CUDA streams to overlap.
"""

from collections.abc import Callable, Iterator

import torch

from hf_grpo.vllm_standin import transport


DEFAULT_PACKED_BUFFER_SIZE_BYTES = transport.DEFAULT_BUFFER_SIZE_BYTES
DEFAULT_PACKED_NUM_BUFFERS = transport.DEFAULT_NUM_BUFFERS


def _communicator(group) -> transport.CPUCommunicator:
    if not isinstance(group, transport.CPUCommunicator):
        raise TypeError(
            f"hf_grpo's CPU stand-in broadcasts through the communicator of trainer_init, got {type(group).__name__}"
        )
    return group


def packed_nccl_broadcast_producer(
    iterator: Iterator[tuple[str, torch.Tensor]],
    group,
    src: int,
    post_iter_func: Callable[[tuple[str, torch.Tensor]], torch.Tensor],
    buffer_size_bytes: int = DEFAULT_PACKED_BUFFER_SIZE_BYTES,
    num_buffers: int = DEFAULT_PACKED_NUM_BUFFERS,
) -> None:
    transport.broadcast_packed(iterator, _communicator(group), src, post_iter_func, buffer_size_bytes)


def packed_nccl_broadcast_consumer(
    iterator: Iterator[tuple[str, tuple[list[int], torch.dtype]]],
    group,
    src: int,
    post_unpack_func: Callable[[list[tuple[str, torch.Tensor]]], None],
    buffer_size_bytes: int = DEFAULT_PACKED_BUFFER_SIZE_BYTES,
    num_buffers: int = DEFAULT_PACKED_NUM_BUFFERS,
    device: torch.device | str = "cpu",
) -> None:
    metadata = [(name, list(shape), dtype) for name, (shape, dtype) in iterator]
    for chunk in transport.receive_packed(_communicator(group), metadata, src, buffer_size_bytes):
        post_unpack_func(chunk)
