"""vLLM's distributed package; the stand-in has the trainer side of the weight transfer only."""
