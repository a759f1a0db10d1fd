#!/usr/bin/env python3
"""Find the (operator, dtype) pairs that CUDA accepts and the CPU kernel refuses, from PyTorch's OpInfo database.

For every OpInfo whose CUDA dtype list has a dtype its CPU list lacks, each sample input is run on the cpu in
that dtype: when the CPU kernel refuses it (``"... not implemented for '<Dtype>'"`` / ``Unsupported dtype``),
the pair is a gap the npu device must close (CUDA and Ascend compute it). Pairs the CPU actually runs (the
OpInfo CPU list is only conservative there) need nothing. Ops that exist only as CUDA kernels (flash/efficient
attention) are not dtype gaps and are skipped.

    python scripts/cuda_dtype_gaps.py        # writes tests/data/cuda_dtype_gaps.json and prints a summary
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "cuda_dtype_gaps.json"
CUDA_ONLY = ("torch.ops.aten._flash_attention_forward", "torch.ops.aten._efficient_attention_forward")
REFUSAL = re.compile(r"not implemented for '|Unsupported dtype|unsupported dtype|does not support|not supported for")


def classify() -> list[dict]:
    import torch  # noqa: PLC0415
    from torch.testing._internal.common_methods_invocations import op_db  # noqa: PLC0415

    out = []
    for op in op_db:
        if op.name in CUDA_ONLY:
            continue
        extra = set(op.supported_dtypes("cuda")) - set(op.supported_dtypes("cpu"))
        for dtype in sorted(extra, key=str):
            refused, ran, message = 0, 0, ""
            try:
                samples = list(op.sample_inputs("cpu", dtype, requires_grad=False))
            except Exception as e:  # noqa: BLE001 - the sample generator itself cannot build this dtype on cpu
                samples, message = [], f"samples: {type(e).__name__}: {e}"
            for s in samples:
                try:
                    op(s.input, *s.args, **s.kwargs)
                    ran += 1
                except Exception as e:  # noqa: BLE001 - classified by message below
                    if REFUSAL.search(str(e)):
                        refused += 1
                        message = message or str(e).splitlines()[0][:160]
            out.append({"op": op.name, "variant": op.variant_test_name, "dtype": str(dtype).replace("torch.", ""),
                        "cpu": "refuses" if refused and not ran else "runs" if ran and not refused
                        else "mixed" if ran else "no samples", "message": message})
    return out


def main() -> int:
    rows = classify()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    refused = [r for r in rows if r["cpu"] == "refuses"]
    print(f"{len(rows)} (op, dtype) pairs CUDA lists beyond CPU; the CPU kernel refuses {len(refused)}:")
    for r in refused:
        print(f"  {r['op']}{'.' + r['variant'] if r['variant'] else ''} {r['dtype']}: {r['message']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
