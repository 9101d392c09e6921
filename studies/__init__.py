"""The experiments that run lowrank's perf binaries or train with it (docs/training.md,
docs/benchmarks.md): not part of the lowrank package or its wheel. Run from the checkout's root,
e.g. `python3 -m studies.switch.run --help`."""
