"""Plots of the soak run (tests/soak)."""
