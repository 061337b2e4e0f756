"""Runtime: devices that compile and launch kernels, and the executor PyTorch calls."""
