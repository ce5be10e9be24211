"""GPUs over NVML."""
