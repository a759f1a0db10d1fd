"""Models as plug-ins: a registry of model specs (build, layout, TP plan, FSDP units, pipeline support)
keyed by the plan's ``model.name``. Built in: ``llama`` (npudist's decoder), ``moe`` (its mixture-of-experts variant), ``hf_causal_lm`` (HuggingFace
transformers decoders) and ``module`` (the user's own nn.Module named by ``model.module``).

Importing this package is torch-free (the plan checker uses it); building a model imports torch.
"""
from npudist.models.config import ModelConfig
from npudist.models.hf_spec import HF_SPEC
from npudist.models.llama_spec import LLAMA_SPEC
from npudist.models.module_spec import MODULE_SPEC
from npudist.models.moe_spec import MOE_SPEC, MoEConfig
from npudist.models.spec import (ModelLayout, ModelSpec, TransformerDims, build_model, get_model_spec,
                                 layout_from_module, model_layout, model_spec_names, register_model_spec,
                                 stage_of_module)

for _spec in (LLAMA_SPEC, HF_SPEC, MODULE_SPEC, MOE_SPEC):
    register_model_spec(_spec, replace=True)

__all__ = ["ModelConfig", "MoEConfig", "ModelLayout", "ModelSpec", "TransformerDims", "build_model", "get_model_spec", "layout_from_module",
           "model_layout", "model_spec_names", "register_model_spec", "stage_of_module"]
