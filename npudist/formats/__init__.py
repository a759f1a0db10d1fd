"""Number formats with no torch dtype, emulated with tensor ops: HiFloat8 (Ascend's 8-bit tapered float)."""
