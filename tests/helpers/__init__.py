"""Helpers the tests share: the fault-injecting vLLM stand-in server, reference decoding."""
