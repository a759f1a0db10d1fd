"""torch_npu 2.14.0's public surface, name for name, against the data read from its wheel
(tests/data/torch_npu_surface/, written by scripts/torch_npu_surface.py).

Every recorded name resolves in npudist or is listed in expected_missing.txt; every Python-visible signature
equals the recorded one or is listed in signature_differences.txt; both lists are checked in both directions
(an entry that no longer applies fails too: regenerate with ``python scripts/torch_npu_surface.py update``).
The doc table in docs/torch_npu_surface.md is the generator's output.
"""
from __future__ import annotations

import importlib.util
import pathlib

import pytest
import torch

import torch_npu  # noqa: F401  (the surface under test)
from npudist.device.refusal import NeedsAscendHardware

ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("torch_npu_surface", ROOT / "scripts" / "torch_npu_surface.py")
surface = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(surface)


@pytest.fixture(scope="module")
def state():
    return surface.surface_state()


def test_reference_data_has_the_pinned_counts():
    data = surface.load_reference()
    assert data["torch_npu_version"] == "2.14.0"
    counts = {k: len(v) for k, v in data["sections"].items()}
    assert counts["torch_npu.npu"] == 144 and counts["operators"] == 215
    assert {"ProcessGroupHCCL", "ProcessGroupHCCL.Options", "ProcessGroupHCCL.get_hccl_comm_name"} == {
        e["name"] for e in data["sections"]["torch_npu._C._distributed_c10d"]}


def test_every_name_resolves_or_is_listed_missing_with_a_reason(state):
    listed = surface.read_reasons(surface.EXPECTED_MISSING)
    missing = {k for k, v in state.items() if v["missing"]}
    unlisted = sorted(missing - set(listed))
    stale = sorted(set(listed) - missing)
    assert not unlisted, f"names that do not resolve and are not in expected_missing.txt: {unlisted}"
    assert not stale, f"expected_missing.txt lists names that now resolve (or are no longer recorded): {stale}"
    assert all(reason for reason in listed.values())


def test_torch_npu_npu_names(state):
    npu = [k for k in state if k[0] == "torch_npu.npu"]
    missing = [k[1] for k in npu if state[k]["missing"]]
    # The names still absent are listed with their reason (expected_missing.txt); this pins how many.
    assert len(npu) - len(missing) >= 129, missing
    for name in ("mstx", "set_sync_debug_mode", "get_sync_debug_mode", "is_autocast_enabled", "get_autocast_dtype",
                 "FloatStorage", "config", "matmul", "conv", "set_deterministic_level", "ExternalStream",
                 "enable_deterministic_with_backward", "set_device_limit", "set_stream_limit", "ipc_collect",
                 "stop_device", "restart_device", "check_uce_in_memory"):
        assert not state[("torch_npu.npu", name)]["missing"], name


def test_signatures_match_or_are_listed(state):
    listed = surface.read_reasons(surface.SIGNATURE_DIFFERENCES)
    differing = {k for k, v in state.items() if v["signature"]}
    assert not sorted(differing - set(listed)), f"signatures differing from torch_npu's, not listed: " + "\n".join(
        f"{k}: {state[k]['signature']}" for k in sorted(differing - set(listed)))
    assert not sorted(set(listed) - differing), f"signature_differences.txt entries that no longer differ: " \
                                                f"{sorted(set(listed) - differing)}"


def test_refused_names_raise_naming_themselves(state):
    refused = [(k, v) for k, v in state.items() if v["refused"]]
    assert len(refused) >= 10
    for (section, name), v in refused:
        with pytest.raises(NeedsAscendHardware, match=name.split(".")[-1]):
            v["obj"]()


def test_doc_table_is_up_to_date():
    doc = surface.DOC.read_text(encoding="utf-8")
    assert surface.DOC_BEGIN in doc, \
        "docs/torch_npu_surface.md has no surface table: python scripts/torch_npu_surface.py docs"
    assert surface.doc_with_table(doc, surface.render_table()) == doc, \
        "docs/torch_npu_surface.md's surface table is stale: python scripts/torch_npu_surface.py docs"


def test_extract_reads_the_same_data_from_the_wheel():
    wheel = pathlib.Path("/work/ref/wheel")
    if not (wheel / "torch_npu" / "__init__.py").is_file():
        pytest.skip("the torch_npu 2.14.0 wheel is not unpacked at /work/ref/wheel")
    assert surface.extract(str(wheel)) == surface.load_reference()
