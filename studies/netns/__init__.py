"""The perf binary between hosts in network namespaces over shaped links."""
