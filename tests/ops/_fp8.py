"""A float8 reference cast for the quantisation tests: the nearest of the format's finite values (found by
searching its whole value table), ties to the even code, saturating at the largest finite value."""
import math

import torch


def fp8_table(dtype):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    vals = codes.view(dtype).double()
    ok = torch.isfinite(vals)
    return vals[ok].tolist(), codes[ok].tolist()


def fp8_ref(v, dtype):
    if math.isnan(v):
        return v
    vals, codes = fp8_table(dtype)
    top = max(vals)
    v = max(-top, min(top, v))
    best = min(range(len(vals)), key=lambda i: (abs(vals[i] - v), codes[i] & 1))  # ties: even code
    return vals[best]
