"""Shared fixtures for checking torch_uop: the reference models used by tests/ and benchmarks/."""
