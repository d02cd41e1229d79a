"""vLLM's utilities; the stand-in has ``network_utils`` only."""
