"""The `hccl` collective backend (ProcessGroupHCCL) for torch.distributed."""
