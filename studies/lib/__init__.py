"""What the studies share: hosts in network namespaces, launching, provenance, socket bytes,
process CPU time, run labels, gradient sets, local ports, plan files."""
