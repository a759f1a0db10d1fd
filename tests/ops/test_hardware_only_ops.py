"""The operators whose meaning needs Ascend hardware raise NeedsAscendHardware naming themselves and the reason,
with torch_npu's signatures."""
import inspect

import pytest
import torch

import torch_npu
from npudist.device.refusal import NeedsAscendHardware
from npudist.ops import hardware_only


@pytest.mark.parametrize("name", sorted(hardware_only.REFUSED))
def test_refused_operator_names_itself(name):
    fn = getattr(torch_npu, name)
    schema, why = hardware_only.REFUSED[name]
    args = [torch.ones(1) if p.default is inspect.Parameter.empty else p.default
            for p in inspect.signature(fn).parameters.values() if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    with pytest.raises(NeedsAscendHardware, match=f"torch_npu.{name}: {why}"):
        fn(*args)
    assert fn.__npudist_refused__ == why
    want = [a.name for a in torch._C.parse_schema("npu::" + schema).arguments]
    assert list(inspect.signature(fn).parameters) == want
