"""The plan's ``model`` section: ``ModelConfig`` for every model spec, which a spec with fields of its own
subclasses (``MoEConfig``, ``config_cls`` of the spec). Torch-free; re-exported by ``npudist.plan``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union


@dataclass
class ModelConfig:
    """The one model config, for every model spec (``npudist.models``). ``name`` picks the spec: ``llama``
    (the built-in decoder), ``hf_causal_lm`` (a HuggingFace decoder; the fields below map to its config,
    ``hf_config`` adds any other config key), ``module`` (the user's nn.Module built by the function
    ``module`` names), or any name registered with ``npudist.models.register_model_spec``."""
    name: str = "llama"
    vocab_size: int = 256          # byte-level tokenizer; may be padded above 256 (e.g. for TP divisibility)
    dim: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: Optional[int] = None   # None = n_heads (plain multi-head attention)
    ffn_hidden_dim: int = 384
    max_seq_len: int = 256
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_embeddings: bool = False
    hf_model_type: str = "llama"       # hf_causal_lm: the transformers model_type (llama, qwen2, mistral, ...)
    hf_config: Optional[dict[str, Union[int, float, bool, str]]] = None   # hf_causal_lm: more config keys
    module: Optional[str] = None       # name module: "package.module:function" returning the nn.Module

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads
