"""``trainer_init`` of vLLM 0.30 (``vllm/distributed/weight_transfer/nccl_common.py``), over TCP instead of NCCL.

``trainer_init(init_info, rank=0)`` takes a dict (or an object) with ``master_address``, ``master_port`` and
``world_size``, opens the rendezvous as rank 0 and returns once the ``world_size - 1`` workers have joined, as vLLM's
does; TRL 1.16 calls it as ``open_trainer_endpoint`` in ``VLLMClient.init_communicator``. The communicator it
returns (``hf_grpo.vllm_standin.transport.CPUCommunicator``) has the ``group`` (with ``store`` and ``socket``),
``rank``, ``world_size`` and ``broadcast`` that TRL and ``packed_nccl_broadcast_producer`` use; vLLM's would need
CUDA, this one does not look at devices. Only loopback addresses are accepted. The worker side and the
``nccl_unique_id_b64`` rendezvous are not provided here (the worker is hf_grpo.vllm_standin.server).
"""

from hf_grpo.vllm_standin import transport


def trainer_init(init_info, rank: int = 0) -> transport.CPUCommunicator:
    if isinstance(init_info, dict):
        address, port, world_size = init_info["master_address"], init_info["master_port"], init_info["world_size"]
    else:
        address, port, world_size = init_info.master_address, init_info.master_port, init_info.world_size
    return transport.open_trainer_group(address, int(port), int(world_size), rank=rank)
