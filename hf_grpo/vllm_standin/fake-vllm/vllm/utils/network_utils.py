"""vLLM 0.30's ``get_ip`` / ``get_open_port`` (``vllm/utils/network_utils.py``), for loopback only.

vLLM's ``get_ip`` returns ``VLLM_HOST_IP`` or the address of the default route; TRL sends it as the weight transfer
rendezvous address. The stand-in's transport listens on loopback only, so ``get_ip`` returns ``127.0.0.1`` (and
warns once when ``VLLM_HOST_IP`` names another address, which it ignores).
"""

import logging
import os
import socket


logger = logging.getLogger(__name__)
_warned = False


def get_ip() -> str:
    global _warned
    host = os.environ.get("VLLM_HOST_IP", "").strip()
    if host and host not in ("127.0.0.1", "localhost", "::1") and not _warned:
        logger.warning("VLLM_HOST_IP=%s ignored: hf_grpo's CPU stand-in for vLLM uses 127.0.0.1 only", host)
        _warned = True
    return "127.0.0.1"


def get_open_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
