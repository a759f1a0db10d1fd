"""Models: a Llama-style decoder with its built-in tensor-parallel plan."""
from npudist.models.llama import LlamaArgs, RMSNorm, Transformer, TransformerBlock, build_model
from npudist.models.tp_plan import build_llama_tp_plan, check_tp_divisibility

__all__ = ["build_model", "LlamaArgs", "RMSNorm", "Transformer", "TransformerBlock", "build_llama_tp_plan",
           "check_tp_divisibility"]
