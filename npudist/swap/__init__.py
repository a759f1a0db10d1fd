"""Swap: training past device memory by keeping activations and optimizer state in pinned host memory.

* ``npudist.swap.activations``: ``ActivationSwap`` / ``apply_activation_swap`` (plan key
  ``memory.swap.activations.blocks``);
* ``npudist.swap.optimizer_state``: ``OptimizerStateSwap`` (``memory.swap.optimizer_state``);
* ``npudist.swap.oom``: the note an out-of-memory error gets during a plan's training.

Which blocks a plan swaps and its rules live with the plan (``npudist.plan.swap_rules``, torch-free), the
levers and their savings too (``npudist.plan.levers``). The submodules are imported where they are used.
"""
