"""torch_npu operators whose documented meaning needs Ascend hardware the emulated npu device does not have: each
exists under its torch_npu name with torch_npu's signature and raises ``NeedsAscendHardware`` naming itself and
the reason (npudist.device.refusal), rather than a made-up answer.

* ``obfuscation_initialize`` / ``obfuscation_calculate`` / ``obfuscation_finalize``: they drive the PMCC model
  obfuscation engine, a client application talking to a trusted application in the Ascend TEE.
* ``npu_prefetch``: it loads weights into the AI cores' L2 cache ahead of a kernel.
* ``attention_worker_scheduler(_)`` / ``ffn_worker_scheduler(_)``: they scan the scheduler context shared by
  attention and FFN workers deployed apart on Ascend devices.
* ``_npu_fused_infer_attention_score_get_max_workspace`` and its v2: they size the AI-core kernel's workspace
  (aclnnFusedInferAttentionScoreV3GetMaxWorkspaceSize) for graph capture.
"""
from __future__ import annotations

import inspect

import torch

from npudist.device.refusal import NeedsAscendHardware

_NO_DEFAULT = inspect.Parameter.empty


def _signature(schema: str) -> inspect.Signature:
    parsed = torch._C.parse_schema(schema if "::" in schema else "npu::" + schema)
    params = []
    for a in parsed.arguments:
        kind = inspect.Parameter.KEYWORD_ONLY if a.kwarg_only else inspect.Parameter.POSITIONAL_OR_KEYWORD
        default = a.default_value if a.has_default_value() else _NO_DEFAULT
        params.append(inspect.Parameter(a.name, kind, default=default))
    return inspect.Signature(params)


def _refused(name: str, schema: str, why: str):
    def refuse(*args, **kwargs):
        raise NeedsAscendHardware(f"torch_npu.{name}: {why}; the emulated npu device has no such hardware "
                                  "(docs/torch_npu.md)")

    refuse.__name__ = refuse.__qualname__ = name
    refuse.__module__ = __name__
    refuse.__signature__ = _signature(schema)
    refuse.__npudist_refused__ = why
    return refuse


def _schema_of(op_name: str, as_name: str) -> str:
    """The schema of a registered npu operator under another name (the workspace queries take its arguments)."""
    return as_name + str(getattr(torch.ops.npu, op_name).default._schema).split("::", 1)[1][len(op_name):]


_OBFUSCATION = "it drives the PMCC model obfuscation engine, a trusted application in the Ascend TEE"
_SCHEDULER = "it scans the scheduler context of attention and FFN workers deployed apart on Ascend devices"
_WORKSPACE = "it sizes the AI-core kernel's workspace for graph capture"
REFUSED = {
    "obfuscation_initialize": ("obfuscation_initialize(int hidden_size, int tp_rank, int cmd, *, "
                               "ScalarType? data_type=None, int? model_obf_seed_id=0, int? data_obf_seed_id=0, "
                               "int? thread_num=4, float? obf_coefficient=1.0) -> Tensor", _OBFUSCATION),
    "obfuscation_calculate": ("obfuscation_calculate(Tensor fd, Tensor x, Tensor param, *, "
                              "float? obf_coefficient=1.0) -> Tensor", _OBFUSCATION),
    "obfuscation_finalize": ("obfuscation_finalize(Tensor fd_to_close) -> Tensor", _OBFUSCATION),
    "npu_prefetch": ("npu_prefetch(Tensor self, Tensor? dependency, int max_size, int offset=0) -> ()",
                     "it loads weights into the AI cores' L2 cache ahead of a kernel"),
    "attention_worker_scheduler": ("attention_worker_scheduler(Tensor self) -> Tensor", _SCHEDULER),
    "attention_worker_scheduler_": ("attention_worker_scheduler_(Tensor(a!) self) -> Tensor(a!)", _SCHEDULER),
    "ffn_worker_scheduler": ("ffn_worker_scheduler(Tensor self, *, int sync_group_size=1, int execute_mode=0) "
                             "-> Tensor", _SCHEDULER),
    "ffn_worker_scheduler_": ("ffn_worker_scheduler_(Tensor(a!) self, *, int sync_group_size=1, "
                              "int execute_mode=0) -> Tensor(a!)", _SCHEDULER),
    "_npu_fused_infer_attention_score_get_max_workspace": (
        _schema_of("npu_fused_infer_attention_score", "_npu_fused_infer_attention_score_get_max_workspace"),
        _WORKSPACE),
    "_npu_fused_infer_attention_score_v2_get_max_workspace": (
        _schema_of("npu_fused_infer_attention_score_v2", "_npu_fused_infer_attention_score_v2_get_max_workspace"),
        _WORKSPACE),
}
FUNCTIONS = {name: _refused(name, schema, why) for name, (schema, why) in REFUSED.items()}

# torch_npu registers these under torch.ops.npu too (graph-mode code and torch.library users reach them there):
# the same schemas, and a kernel that refuses for every backend. CompositeImplicitAutograd also answers calls
# with no tensor argument (obfuscation_initialize takes only numbers), which have no backend key to dispatch on.
_lib = torch.library.Library("npu", "FRAGMENT")
for _name, (_schema, _why) in REFUSED.items():
    _lib.define(_schema)
    _lib.impl(_name, FUNCTIONS[_name], "CompositeImplicitAutograd")
