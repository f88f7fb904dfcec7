"""Inference-engine adapters. Each module imports without its engine
installed (it then uses a local stand-in for the engine's base class)."""
