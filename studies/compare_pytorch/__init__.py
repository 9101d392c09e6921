"""lowrank against PyTorch's PowerSGD hook on the same gradients."""
