"""Training against native HSDP (run.py, report.py, plan.toml)."""
