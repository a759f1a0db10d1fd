"""How many ranks a node runs, checked against the npu devices this node can see."""
from __future__ import annotations

import os


class LaunchError(ValueError):
    """A launch request that cannot work; reported before any process starts."""


def count_visible_npus() -> int:
    """Number of npu devices visible to this process (honours ASCEND_RT_VISIBLE_DEVICES)."""
    try:
        import torch

        import npudist

        npudist.register()   # idempotent; npurun imports torch without autoload
    except Exception as e:  # an unbuilt/broken extension surfaces as ImportError or OSError
        raise LaunchError(
            f"the npu device is not available ({type(e).__name__}: {e}); build it with "
            "scripts/setup.sh, or pass --device cpu to launch without npu binding") from e
    npu = getattr(torch, "npu", None)
    if npu is None or not hasattr(npu, "device_count"):
        raise LaunchError(
            "`import npudist` did not provide torch.npu; build the device extension with "
            "scripts/setup.sh, or pass --device cpu to launch without npu binding")
    return int(npu.device_count())


def _visible_note() -> str:
    visible = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
    return f" (ASCEND_RT_VISIBLE_DEVICES={visible})" if visible is not None else ""


def resolve_nproc(value: str, device: str) -> tuple[int, int | None]:
    """Return (ranks per node, visible npu devices or None for --device cpu) for `--nproc VALUE`.

    Integers and 'auto' are resolved here; torchrun's other words (cpu/gpu/xpu) keep torchrun's meaning.
    """
    visible = count_visible_npus() if device == "npu" else None
    value = str(value).strip()
    if value in ("auto", "npu"):
        if device == "npu":
            assert visible is not None
            if visible == 0:
                raise LaunchError(f"--nproc {value}: no npu device is visible{_visible_note()}")
            nproc = visible
        elif value == "auto":
            nproc = os.cpu_count() or 1
        else:
            raise LaunchError("--nproc npu needs --device npu")
    else:
        try:
            nproc = int(value)
        except ValueError:
            from torch.distributed.run import determine_local_world_size

            try:
                nproc = determine_local_world_size(value)
            except ValueError as e:
                raise LaunchError(f"--nproc-per-node {value!r}: {e} (use an integer or 'auto')") from e
    if nproc <= 0:
        raise LaunchError(f"--nproc-per-node must be a positive number of ranks, got {value!r}")
    if visible is not None and nproc > visible:
        raise LaunchError(
            f"--nproc-per-node {nproc} asks for {nproc} ranks per node but only {visible} npu "
            f"device(s) are visible{_visible_note()}; each rank needs its own device. Use "
            f"--nproc {visible} (or --nproc auto), or make more devices visible.")
    return nproc, visible
