"""Inference-engine adapters. ``lmcache`` and ``sglang`` import without
their engine installed (they then use a local stand-in for the engine's
base class); ``vllm`` is a vLLM KV connector and imports vLLM and torch."""
