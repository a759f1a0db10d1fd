"""A float8 reference cast for the quantisation tests: the nearest of the format's finite values (from its whole
value table), ties to the even code, saturating at the largest finite value."""
import bisect
import functools
import math

import torch


@functools.lru_cache(maxsize=None)
def fp8_table(dtype):
    """(sorted finite values, their codes) of a float8 dtype; -0 is dropped (it equals +0)."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    vals = codes.view(dtype).double()
    pairs = sorted({v: c for v, c in zip(vals.tolist(), codes.tolist()) if math.isfinite(v) and not
                    (v == 0 and math.copysign(1, v) < 0)}.items())
    return [v for v, _ in pairs], [c for _, c in pairs]


def fp8_ref(v, dtype):
    if math.isnan(v):
        return v
    vals, codes = fp8_table(dtype)
    v = max(vals[0], min(vals[-1], v))
    i = bisect.bisect_left(vals, v)
    near = [j for j in (i - 1, i) if 0 <= j < len(vals)]
    best = min(near, key=lambda j: (abs(vals[j] - v), codes[j] & 1))  # ties: even code
    return vals[best]
