"""GPU nodes: NVML snapshots, checks, labels."""
