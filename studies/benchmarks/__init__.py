"""The figures of docs/benchmarks.md."""
