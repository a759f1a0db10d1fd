"""``torch_npu.optim.NpuFusedOptimizerBase``: the base class of torch_npu's parameter-combining fused optimizers
(docs/torch_npu.md).

At its first ``step()`` (or ``zero_grad()``) the parameters that have a gradient are moved, per dtype (index 0:
float32, 1: float16; any other dtype raises ``TypeError``), into one flat npu buffer across all groups, and their
gradients into another (``torch_npu.utils.npu_combine_tensors``: every parameter and gradient becomes a view of its
part, so backward keeps accumulating into the combined buffer). Each group gets its slice of both buffers
(``combined_params_indexed_by_group[g][dtype]``, ``combined_grads_indexed_by_group[g][dtype]``; None where the
group has no parameter of that dtype), the per-group parameter lists are ``params_lists_indexed_by_group[g][dtype]``.

A subclass implements two hooks: ``_maybe_init_combined_states()`` (build its state, typically combined per group
and dtype into ``combined_param_states_indexed_by_group``, and set ``is_states_combined``) and
``_group_step(group_index)`` (update the group's combined slices in place). ``step(closure=None)`` combines what is
not combined yet, then calls ``_group_step`` for every group. ``zero_grad(set_to_none=False)`` zeroes the combined
gradient buffers (``set_to_none=True`` raises ``ValueError``: the gradients must stay views of the buffer).
``get_combined_params()`` / ``get_combined_grads()`` return the per-dtype buffers ``[float32, float16]``;
``clip_grad_norm_fused_(max_norm, norm_type=2)`` clips all gradients together over the combined buffers and returns
the total norm. ``load_state_dict`` additionally marks the state as not combined, so the loaded state is combined
afresh at the next step (Ascend's base keeps the buffers combined before the load).
"""
from __future__ import annotations

import math

import torch
from torch.optim.optimizer import Optimizer

from torch_npu.utils.combine_tensors import get_part_combined_tensor, npu_combine_tensors

__all__ = ["NpuFusedOptimizerBase"]

_DTYPES = (torch.float32, torch.float16)   # the dtype index of the combined buffers


def _storage_numel(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes() // t.element_size()


class NpuFusedOptimizerBase(Optimizer):
    """The base of the fused optimizers: parameters and gradients combined into one buffer per dtype; subclasses
    implement ``_maybe_init_combined_states`` and ``_group_step``."""

    def __init__(self, params, default):
        super().__init__(params, default)
        self.combined_params_indexed_by_group = None
        self.combined_grads_indexed_by_group = None
        self.combined_param_states_indexed_by_group = None
        self.params_lists_indexed_by_group = []
        self.params_all_group = [[], []]
        self.params_all_group_combined = [None, None]
        self.grads_all_group_combined = [None, None]
        self.combined_grads_masks = [None, None]
        self.is_params_grads_combined = False
        self.is_states_combined = False
        self.is_grads_masks_combined = False
        self.is_fused_optimizer = True

    # --- combining ------------------------------------------------------------------------------------------

    @staticmethod
    def _dtype_index(p) -> int:
        for i, dtype in enumerate(_DTYPES):
            if p.dtype == dtype:
                return i
        raise TypeError(f"Fused optimizer's parameters must be either float32 or float16, but received {p.dtype}")

    def _maybe_init_combined_params_and_grads(self):
        if self.is_params_grads_combined:
            return
        per_group_params, per_group_param_sizes, per_group_grad_sizes = [], [], []
        all_params, all_grads = [[], []], [[], []]
        for group in self.param_groups:
            params, psize, gsize = [[], []], [0, 0], [0, 0]
            for p in group["params"]:
                if p.grad is None:
                    continue
                i = self._dtype_index(p)
                self._match_grad_format(p)
                params[i].append(p)
                psize[i] += _storage_numel(p)
                gsize[i] += _storage_numel(p.grad)
            for i in range(len(_DTYPES)):
                all_params[i] += params[i]
                all_grads[i] += [p.grad for p in params[i]]
            per_group_params.append(params)
            per_group_param_sizes.append(psize)
            per_group_grad_sizes.append(gsize)

        self.params_lists_indexed_by_group = per_group_params
        self.params_all_group = all_params
        with torch.no_grad():
            for i in range(len(_DTYPES)):
                self.params_all_group_combined[i] = npu_combine_tensors(all_params[i])
                self.grads_all_group_combined[i] = npu_combine_tensors(all_grads[i])

        self.combined_params_indexed_by_group = []
        self.combined_grads_indexed_by_group = []
        poff, goff = [0, 0], [0, 0]
        for psize, gsize in zip(per_group_param_sizes, per_group_grad_sizes):
            gparams, ggrads = [], []
            for i in range(len(_DTYPES)):
                gparams.append(get_part_combined_tensor(self.params_all_group_combined[i], poff[i], psize[i]))
                ggrads.append(get_part_combined_tensor(self.grads_all_group_combined[i], goff[i], gsize[i]))
                poff[i] += psize[i]
                goff[i] += gsize[i]
            self.combined_params_indexed_by_group.append(gparams)
            self.combined_grads_indexed_by_group.append(ggrads)

        self.is_params_grads_combined = any(b is not None for b in self.params_all_group_combined)

    @staticmethod
    def _match_grad_format(p):
        """Give the gradient its parameter's npu format (Ascend combines both in the same format)."""
        import torch_npu  # noqa: PLC0415

        get_format = getattr(torch_npu, "get_npu_format", None)
        if get_format is None:
            return
        fmt = get_format(p)
        if get_format(p.grad) != fmt:
            p.grad = torch_npu.npu_format_cast(p.grad, fmt).contiguous()

    # --- the optimizer interface ------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self.is_params_grads_combined:
            self._maybe_init_combined_params_and_grads()
        if not self.is_states_combined:
            self._maybe_init_combined_states()
        for i in range(len(self.param_groups)):
            self._group_step(i)
        return loss

    @torch.no_grad()
    def zero_grad(self, set_to_none=False):
        if set_to_none:
            raise ValueError("set_to_none is not supported in fused optimizers")
        if not self.is_params_grads_combined:
            self._maybe_init_combined_params_and_grads()
            if not self.is_params_grads_combined:
                super().zero_grad(set_to_none=False)
                return
        for grads in self.grads_all_group_combined:
            if grads is not None:
                grads.zero_()

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        # the loaded per-parameter state replaces the combined one at the next step
        self.is_states_combined = False

    def _maybe_init_combined_states(self):
        raise NotImplementedError(f"{type(self).__name__} must implement _maybe_init_combined_states")

    def _group_step(self, group_index):
        raise NotImplementedError(f"{type(self).__name__} must implement _group_step")

    def get_combined_params(self):
        return self.params_all_group_combined

    def get_combined_grads(self):
        return self.grads_all_group_combined

    # --- gradient clipping over the combined buffers ------------------------------------------------------------

    def _combine_grads_mask(self, list_of_params):
        """A combined buffer of ones over the parameters' gradients (Ascend masks the padding of private formats;
        npudist's tensors have none)."""
        masks = [torch.ones(p.grad.size(), dtype=p.grad.dtype, device=p.grad.device)
                 for p in list_of_params if p.requires_grad]
        if not masks:
            return None
        return npu_combine_tensors(masks)

    def _maybe_init_combined_grads_masks(self):
        if not self.is_params_grads_combined:
            raise ValueError("Value of param 'is_params_grads_combined' must be True")
        self.combined_grads_masks = [self._combine_grads_mask(params) for params in self.params_all_group]
        self.is_grads_masks_combined = True

    def _get_combined_grad_masks(self):
        return self.combined_grads_masks

    def _clip_grad_norm_fused_(self, combined_grads, combined_grads_masks, max_norm, norm_type):
        if len(combined_grads) != len(combined_grads_masks):
            raise ValueError("Length of combined_grads and combined_grads_masks must be equal.")
        pairs = [(g, m) for g, m in zip(combined_grads, combined_grads_masks) if g is not None]
        if not pairs:
            return torch.tensor(0.)
        max_norm, norm_type = float(max_norm), float(norm_type)
        if math.isinf(norm_type):
            parts = [(g.float().abs() * (1 if m is None else m)).max() for g, m in pairs]
            total_norm = torch.stack(parts).max()
        else:
            parts = [(g.float().abs().pow(norm_type) * (1 if m is None else m)).sum() for g, m in pairs]
            total_norm = torch.stack(parts).sum().pow(1.0 / norm_type)
        clip_coef = max_norm / (total_norm + 1e-6)
        if clip_coef < 1:
            for g, _ in pairs:
                g.mul_(clip_coef.to(g.dtype))
        return total_norm

    def clip_grad_norm_fused_(self, max_norm, norm_type=2):
        """Clip every gradient of the optimizer together to ``max_norm`` (``norm_type``-norm over all of them, as
        ``torch.nn.utils.clip_grad_norm_`` with ``1e-6`` added to the norm); returns the total norm."""
        if not self.is_params_grads_combined:
            with torch.no_grad():
                self._maybe_init_combined_params_and_grads()
        if not self.is_grads_masks_combined:
            self._maybe_init_combined_grads_masks()
        with torch.no_grad():
            return self._clip_grad_norm_fused_(self.get_combined_grads(), self._get_combined_grad_masks(),
                                               max_norm, norm_type)
