"""npudist.launch: the `npurun` launcher (torchrun + npu device binding, hccl settings, summaries).

Entry points: the `npurun` console script and `python -m npudist.launch` (both `npudist.launch.main:main`).
Workers start through `npudist.launch.worker`, which binds npu:LOCAL_RANK before the user's code runs.
This package imports nothing heavy so that the worker bootstrap starts fast.
"""
