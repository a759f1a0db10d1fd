"""``torch.npu.npugraph_ex.inference``: ``cache_compile`` and ``readable_cache`` (npugraph_ex/cache.py)."""
from __future__ import annotations

__all__ = ["cache_compile", "readable_cache"]


def cache_compile(func, *, dynamic: bool = True, cache_dir=None, global_rank=None, tp_rank=None, pp_rank=None,
                  **kwargs):
    """``func`` compiled once and saved per rank; later process starts load it without Dynamo (docs/graphs.md)."""
    from npudist.compile.npugraph_ex.cache import CachedCompiled

    if kwargs:
        raise ValueError(f"cache_compile: options {sorted(kwargs)} are not supported by npudist (torchair's "
                         "config options); remove them")
    return CachedCompiled(func, dynamic=dynamic, cache_dir=cache_dir, global_rank=global_rank, tp_rank=tp_rank,
                          pp_rank=pp_rank)


def readable_cache(cache_bin, print_output=True, file=None):
    """Print (and return) what the cache at ``cache_bin`` holds."""
    from npudist.compile.npugraph_ex.cache import readable_cache as describe

    return describe(cache_bin, print_output=print_output, file=file)
