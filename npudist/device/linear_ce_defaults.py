"""``F.linear_cross_entropy``'s per-device "auto" defaults for npu: the CPU's.

PyTorch resolves ``LinearCrossEntropyOptions(acc_policy="auto")`` by device type: a table keyed by
``(device_type, dtype)`` (``_AUTO_DEFAULTS``: cpu and cuda entries, every other device gets "compact" in the
input dtype) and ``_resolve_auto_acc_dtype`` (fp32 accumulation for bf16/fp16 on cpu and capable cuda only).
npudist's npu runs the CPU's kernels on the same host memory, so the measurements behind the CPU's picks
("accurate", fp32 accumulation; the others hit emulated low-precision matmul) are the npu's too, and with
them npu results equal CPU results bit for bit (OpInfo ``nn.functional.linear_cross_entropy.chunked*``).
A real Ascend backend would register its own measured picks here instead.

The table is data meant to be keyed by device, so npu rows are added to it. ``_resolve_auto_acc_dtype``
hard-codes ``device.type == "cpu"``: wrapping that static method so npu answers like cpu is the one patch;
it lives here, with this reason, and is idempotent.
"""
import torch

BACKEND = "npu"


def register() -> None:
    """Give npu the CPU's linear_cross_entropy "auto" picks (idempotent)."""
    try:
        from torch.nn.modules import linear_cross_entropy_options as lce
    except ImportError:  # a torch without the chunked linear_cross_entropy: nothing to align
        return
    table = getattr(lce, "_AUTO_DEFAULTS", None)
    options = getattr(lce, "LinearCrossEntropyOptions", None)
    if table is None or options is None or not hasattr(options, "_resolve_auto_acc_dtype"):
        return
    for dtype in (torch.bfloat16, torch.float16):
        if ("cpu", dtype) in table:
            table.setdefault((BACKEND, dtype), table[("cpu", dtype)])
    upstream = options.__dict__["_resolve_auto_acc_dtype"].__func__
    if getattr(upstream, "_npudist", False):
        return

    def _resolve_auto_acc_dtype(dtype, device):
        if device is not None and torch.device(device).type == BACKEND:
            device = torch.device("cpu")
        return upstream(dtype, device)

    _resolve_auto_acc_dtype._npudist = True
    _resolve_auto_acc_dtype.__doc__ = upstream.__doc__
    options._resolve_auto_acc_dtype = staticmethod(_resolve_auto_acc_dtype)
