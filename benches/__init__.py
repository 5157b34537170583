"""Reproducible benchmarks (ARCHITECTURE.md §13). Run all: ``python -m benches``."""
