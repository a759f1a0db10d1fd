"""Activation swap: the tensors a block saves for backward live in pinned host memory between its forward and
its backward.

Built on ``torch.autograd.graph.saved_tensors_hooks`` (the mechanism of torch's own ``save_on_cpu`` and
``offload_wrapper``), with what those lack for training past device memory:

* the device-to-host copies of a block run on a side stream when its forward ends, ordered after the
  producing work with one ``wait_stream``, so the next block's compute can continue while they drain;
  ``record_stream`` keeps the allocator from handing a source's block to other work until the copy has read
  it;
* backward prefetches: the first unpack of block k's tensors also starts the host-to-device copy of block
  k-1 (when it is swapped and ran just before k), so that copy overlaps k's backward; the compute stream waits
  on an event recorded after a block's copies before it reads them;
* parameters and views of them (FSDP's unsharded parameters among them) are not copied: they stay
  referenced elsewhere, so a host copy would free nothing; a tensor saved several times by one block is copied once;
* tensor subclasses that flatten into plain tensors (DTensor under tensor parallelism) are swapped by their
  inner tensors and rebuilt on unpack.

A pinned buffer read by a host-to-device copy is kept until an event after that copy completes, so a later
swap-out never reuses pinned memory a queued copy has still to read.
"""
from __future__ import annotations

import collections
import weakref

import torch
from torch import nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass


class _Saved:
    """One swapped tensor: its pinned host copy until fetched, then its device copy."""
    __slots__ = ("host", "device", "group", "__weakref__")

    def __init__(self, host: torch.Tensor, group: "_Group"):
        self.host, self.device, self.group = host, None, group


class _Subclass:
    """A wrapper subclass (DTensor) swapped through its inner tensors."""
    __slots__ = ("cls", "inner", "ctx", "size", "stride")

    def __init__(self, t: torch.Tensor, inner: dict, ctx):
        self.cls, self.inner, self.ctx, self.size, self.stride = type(t), inner, ctx, t.size(), t.stride()


class _Group:
    """The tensors one forward call of one block swapped out; ``prev`` is the block that ran just before it
    in the same forward (the one to prefetch while this block's backward runs)."""
    __slots__ = ("index", "saved", "prev", "ready", "fetched", "seen", "outgoing")

    def __init__(self, index: int, prev: "_Group | None"):
        self.index, self.prev = index, prev
        self.saved: list[weakref.ref] = []
        self.outgoing: list[tuple[_Saved, torch.Tensor]] = []   # copies to issue when the block's forward ends
        self.ready = None          # event after this group's host-to-device copies
        self.fetched = False
        self.seen: dict[int, tuple] = {}   # id(tensor) -> (weakref, version, packed): dedup within the block


class ActivationSwap:
    """Swaps the saved activations of the blocks it is attached to (``attach``) on one device."""

    def __init__(self, device: torch.device):
        self.device = device
        self.device_module = getattr(torch, device.type)
        self.stream = self.device_module.Stream(device=device)
        self._group: _Group | None = None        # the block whose forward is running
        self._last: _Group | None = None         # the block whose forward ran last
        self._pending: collections.deque = collections.deque()   # (event, pinned buffers) of queued copies
        self.bytes_out = 0                       # bytes copied to host (all blocks, since creation)

    # -- attaching to blocks ------------------------------------------------------------------------------

    def attach(self, block: nn.Module, index: int) -> None:
        """Swap what ``block`` (the model's block number ``index``) saves in its forward."""
        hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

        def enter(module, args):
            # Prefetch only the block just before this one in the model: with a checkpointed (or unswapped)
            # block between them, fetching early would hold both while the block between runs its backward.
            prev = self._last if self._last is not None and self._last.index == index - 1 else None
            self._group = _Group(index, prev)
            hooks.__enter__()

        def leave(module, args, output):
            hooks.__exit__(None, None, None)
            self._swap_out(self._group)
            self._group.seen.clear()   # dedup is per forward call; keeping the entries would pin tensors
            self._last, self._group = self._group, None

        block.register_forward_pre_hook(enter)
        block.register_forward_hook(leave, always_call=True)

    # -- forward: device -> host --------------------------------------------------------------------------

    @torch.no_grad()
    def _pack(self, t: torch.Tensor):
        group = self._group
        # A parameter, or a view of one (linear saves weight.t()), stays referenced by its module: copying it
        # would free nothing.
        base = t._base if t._base is not None else t
        if group is None or isinstance(base, nn.Parameter) or t.device != self.device:
            return t
        key = id(t)
        hit = group.seen.get(key)
        if hit is not None and hit[0]() is t and hit[1] == t._version:
            return hit[2]
        packed = self._pack_tensor(t, group)
        group.seen[key] = (weakref.ref(t), t._version, packed)
        return packed

    def _pack_tensor(self, t: torch.Tensor, group: _Group):
        if is_traceable_wrapper_subclass(t):
            names, ctx = t.__tensor_flatten__()
            # Inner entries may be opaque non-tensors (DTensor's device mesh): those are kept as they are.
            inner = {n: getattr(t, n) for n in names}
            return _Subclass(t, {n: self._pack_tensor(v, group) if isinstance(v, torch.Tensor) else v
                                 for n, v in inner.items()}, ctx)
        host = torch.empty_like(t, device="cpu", pin_memory=True)
        if host.stride() != t.stride():
            # Overlapping or non-dense (an expanded view): a dense copy would change its strides, and with
            # them possibly the backward kernels' results; such tensors are small, so they stay.
            return t
        saved = _Saved(host, group)
        group.saved.append(weakref.ref(saved))
        group.outgoing.append((saved, t))
        group.fetched = False   # saved after a fetch (a backward inside the block's forward): fetch again
        return saved

    def _swap_out(self, group: _Group) -> None:
        """Copy a block's saved tensors to their pinned buffers on the side stream, after the block's forward
        (one stream wait per block, not per tensor), and let go of the device tensors."""
        if not group.outgoing:
            return
        self._release_finished()
        self.stream.wait_stream(self.device_module.current_stream(self.device))
        with self.device_module.stream(self.stream):
            for saved, t in group.outgoing:
                saved.host.copy_(t, non_blocking=True)
        for saved, t in group.outgoing:
            t.record_stream(self.stream)   # its block is not reused before the copy has read it
            self.bytes_out += t.numel() * t.element_size()
        group.outgoing.clear()

    # -- backward: host -> device -------------------------------------------------------------------------

    @torch.no_grad()
    def _unpack(self, packed):
        if isinstance(packed, torch.Tensor):
            return packed
        return self._unpack_tensor(packed)

    def _unpack_tensor(self, packed):
        if isinstance(packed, _Subclass):
            inner = {n: self._unpack_tensor(p) if isinstance(p, (torch.Tensor, _Saved, _Subclass)) else p
                     for n, p in packed.inner.items()}
            return packed.cls.__tensor_unflatten__(inner, packed.ctx, packed.size, packed.stride)
        if isinstance(packed, torch.Tensor):
            return packed
        group = packed.group
        self._fetch(group)
        if group.prev is not None:
            self._fetch(group.prev)   # overlaps the previous block's copies with this block's backward
        current = self.device_module.current_stream(self.device)
        current.wait_event(group.ready)
        return packed.device

    def _fetch(self, group: _Group) -> None:
        if group.fetched:
            return
        group.fetched = True
        self._swap_out(group)   # a backward inside the block's own forward comes before its swap-out
        self._release_finished()
        # None: its graph was freed; no host copy: fetched before
        live = [saved for saved in (ref() for ref in group.saved) if saved is not None and saved.host is not None]
        # The destinations come from the compute stream's pool: blocks cached for the side stream would be
        # unusable by compute work and fragment a tight device. The side stream waits for the compute
        # stream's earlier users of those blocks before it writes them.
        for saved in live:
            saved.device = torch.empty_like(saved.host, device=self.device)
        self.stream.wait_stream(self.device_module.current_stream(self.device))
        buffers = []
        with self.device_module.stream(self.stream):
            for saved in live:
                saved.device.copy_(saved.host, non_blocking=True)
                buffers.append(saved.host)
                saved.host = None
            group.ready = self.device_module.Event()
            group.ready.record(self.stream)
        self._pending.append((group.ready, buffers))

    def _release_finished(self) -> None:
        """Drop the pinned buffers whose host-to-device copies have completed."""
        while self._pending and self._pending[0][0].query():
            self._pending.popleft()


def apply_activation_swap(model: nn.Module, blocks: list[str], chosen: set[int]) -> ActivationSwap | None:
    """Attach one ``ActivationSwap`` (on the model's device) to the blocks of ``blocks`` (the whole model's block
    names, in forward order) whose index is in ``chosen``; blocks this pipeline stage lacks are skipped. None
    when none of the chosen blocks is here."""
    present = dict(model.named_modules())
    mine = [(i, present[name]) for i, name in enumerate(blocks) if i in chosen and name in present]
    if not mine:
        return None
    device = next(p.device for p in model.parameters())
    swap = ActivationSwap(device)
    for index, block in mine:
        swap.attach(block, index)
    return swap
