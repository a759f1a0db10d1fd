"""``torch_npu.dynamo``: registers the Dynamo backends ``"npu"`` (torchair's default, the Inductor path) and
``"npugraph_ex"``, and carries ``torchair`` (also importable as top-level ``torchair``, as torch_npu installs it).
Implementation: npudist/compile/torchair.py (docs/graphs.md, "torchair")."""
import sys

from npudist.compile import torchair as _torchair
from torch_npu.dynamo import torchair

__all__ = []

_torchair.register()
sys.modules.setdefault("torchair", torchair)
