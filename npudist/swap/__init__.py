"""Swap: training past device memory by keeping activations and optimizer state in pinned host memory.

* ``npudist.swap.activations``: ``ActivationSwap`` / ``apply_activation_swap`` (plan key
  ``memory.swap.activations.blocks``);
* ``npudist.swap.optimizer_state``: ``OptimizerStateSwap`` (``memory.swap.optimizer_state``);
* ``npudist.swap.select``: which blocks a plan swaps, and the plan rules (torch-free, used by validation);
* ``npudist.swap.oom``: the note an out-of-memory error gets during a plan's training.

The submodules are imported where they are used: plan validation must not import torch.
"""
