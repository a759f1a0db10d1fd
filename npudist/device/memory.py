"""torch.npu.memory: allocator statistics and tools (mirrors torch.cuda.memory). Filled by the allocator work."""
__all__: list[str] = []
