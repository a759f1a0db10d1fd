"""torchair's face on npudist: ``CompilerConfig``, ``get_npu_backend``, ``get_compiler``, ``register_replacement``
(npudist/compile/torchair.py; docs/graphs.md, "torchair")."""
from npudist.compile.npugraph_ex import register_replacement
from npudist.compile.torchair import get_compiler, get_npu_backend
from npudist.compile.torchair_config import CompilerConfig

__all__ = ["get_compiler", "get_npu_backend", "CompilerConfig", "register_replacement"]
