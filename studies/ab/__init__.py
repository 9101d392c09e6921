"""The A/B comparison of two builds of the perf binary."""
