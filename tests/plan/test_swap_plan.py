"""The memory.swap plan section: accepted forms, every rule's error at once with its fix, the estimate's
savings, the plan check lines and the out-of-memory note's levers. No processes, no torch."""
import dataclasses

import pytest

from npudist.plan import PlanError, load_plan
from npudist.plan.check import check_plan
from npudist.plan.estimate import estimate_rank
from npudist.plan.levers import memory_levers
from npudist.plan.swap_rules import resolve_swap_blocks
from npudist.swap.oom import oom_note

pytestmark = pytest.mark.timeout(60)

MODEL = {"dim": 64, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden_dim": 256, "max_seq_len": 128}
DATA = {"seq_len": 128, "global_batch_size": 16, "micro_batch_size": 8}


def plan_with(swap=None, world_size=1, **sections):
    data = {"model": MODEL, "data": DATA, **sections}
    if swap is not None:
        data["memory"] = {"swap": swap}
    return load_plan(data, world_size=world_size)


def errors_of(data, overrides=()):
    with pytest.raises(PlanError) as info:
        load_plan(data, overrides, world_size=1)
    return info.value.errors


def test_blocks_by_index_name_and_pattern():
    blocks = [f"layers.{i}" for i in range(4)]
    assert resolve_swap_blocks([0, "layers.2", "layers.3"], blocks) == ({0, 2, 3}, [])
    assert resolve_swap_blocks(["layers.*"], blocks) == ({0, 1, 2, 3}, [])
    assert resolve_swap_blocks(["layers.[13]"], blocks) == ({1, 3}, [])
    plan = plan_with({"activations": {"blocks": ["layers.*"]}, "optimizer_state": True})
    assert plan.memory.swap.optimizer_state and plan.memory.swap.activations.blocks == ["layers.*"]
    # overridable like every key
    plan = load_plan({"model": MODEL, "data": DATA}, ["--memory.swap.activations.blocks", "[1, 3]"], world_size=1)
    assert plan.memory.swap.activations.blocks == [1, 3]


def test_every_problem_at_once_with_its_fix():
    errs = errors_of({"model": MODEL, "data": DATA, "training": {"device": "cpu"},
                      "parallel": {"activation_checkpoint": {"mode": "selective", "every_n_layers": 2},
                                   "fsdp": {"cpu_offload": True}},
                      "memory": {"swap": {"activations": {"blocks": [0, 7, "layer.*", "layers..1"]},
                                          "optimizer_state": True}}})
    text = "\n".join(errs)
    assert len(errs) == 6, errs
    assert "memory.swap: swap moves device memory to the host; with training.device cpu" in text
    assert "set training.device npu or remove memory.swap" in text
    assert "memory.swap.optimizer_state: parallel.fsdp.cpu_offload already keeps the optimizer state" in text
    assert "memory.swap.activations.blocks[1]: block index 7 is out of range: the model has 4 blocks (0-3)" in text
    assert "memory.swap.activations.blocks[2]: 'layer.*' matches none of the model's blocks" in text
    assert "memory.swap.activations.blocks[3]: " in text and "empty segment" in text
    assert ("memory.swap.activations.blocks: block(s) [0] are also checkpointed" in text
            and "swap only blocks that are not checkpointed ([1, 3])" in text)


def test_full_checkpointing_and_compiled_blocks_are_rejected():
    errs = errors_of({"model": MODEL, "data": DATA, "parallel": {"activation_checkpoint": {"mode": "full"}},
                      "compile": {"enable": True, "components": ["model", "loss"]},
                      "memory": {"swap": {"activations": {"blocks": [1]}}}})
    text = "\n".join(errs)
    assert "set parallel.activation_checkpoint.mode to none or selective" in text
    assert "swapping the activations of compiled blocks is not supported yet" in text


def test_estimate_savings():
    plain, swapped = plan_with(), plan_with({"activations": {"blocks": ["layers.*"]}})
    degrees = plain.parallel.degrees()
    a, b = estimate_rank(plain, degrees, 0), estimate_rank(swapped, degrees, 0)
    assert a.swapped_activation_bytes == 0 and b.swapped_activation_bytes > 0
    # four blocks leave the device, two (the running one and the prefetched one) come back for backward
    assert a.activation_bytes - b.activation_bytes == b.swapped_activation_bytes // 2
    state = plan_with({"optimizer_state": True})
    c = estimate_rank(state, degrees, 0)
    assert c.optim_swapped and a.device_bytes - c.device_bytes == a.optim_bytes   # activations dominate
    # with selective layer checkpointing, swapping the blocks it leaves saves on top of it
    ac = {"activation_checkpoint": {"mode": "selective", "every_n_layers": 2}}
    both = plan_with({"activations": {"blocks": [1, 3]}}, parallel=ac)
    assert estimate_rank(both, degrees, 0).device_bytes < estimate_rank(plan_with(parallel=ac), degrees, 0).device_bytes


def test_levers_and_plan_check_lines(tmp_path):
    plan = plan_with()
    levers = {lv.name: lv for lv in memory_levers(plan, plan.parallel.degrees(), 0)}
    assert levers["activation swap"].setting == "memory.swap.activations.blocks: ['layers.*']"
    assert levers["optimizer-state swap"].saved == estimate_rank(plan, plan.parallel.degrees(), 0).optim_bytes
    assert all(lv.saved > 0 for lv in levers.values()), levers
    path = tmp_path / "plan.yaml"
    path.write_text(f"model: {MODEL}\ndata: {DATA}\nmemory: {{swap: {{activations: {{blocks: [1, 2, 3]}}, "
                    "optimizer_state: true}}\n")
    _, degrees, report = check_plan(str(path), 2)
    swap_line = next(ln for ln in report.splitlines() if ln.startswith("swap "))
    assert "activations of blocks 1-3" in swap_line and "optimizer state between steps" in swap_line
    assert " -> " in swap_line and "of device memory" in swap_line
    lever_line = next(ln for ln in report.splitlines() if ln.startswith("levers "))
    assert "activation swap (memory.swap.activations.blocks: ['layers.*'])" in lever_line   # block 0 too
    assert "optimizer-state swap" not in lever_line


def test_oom_note_names_each_lever_with_bytes():
    plan = plan_with(parallel={"activation_checkpoint": {"mode": "selective"}})
    note = oom_note(plan, 0, 32 << 20)
    assert "estimated peak" in note and "against a capacity of 32.00 MiB" in note
    assert "activation swap: memory.swap.activations.blocks: [1, 3] -> saves ~" in note
    assert "activation checkpointing: parallel.activation_checkpoint.mode: full -> saves ~" in note
    assert "optimizer-state swap: memory.swap.optimizer_state: true -> saves ~" in note
    assert "data.micro_batch_size: 4 -> saves ~" in note
    everything = dataclasses.replace(plan, data=dataclasses.replace(plan.data, micro_batch_size=1,
                                                                    global_batch_size=1))
    everything.parallel.activation_checkpoint.mode = "full"
    everything.memory.swap.optimizer_state = True
    assert "none left in the plan" in oom_note(everything, 0, None)


def test_json_report_lists_the_levers():
    from npudist.plan.check import report_dict
    plan = plan_with()
    levers = report_dict(plan, plan.parallel.degrees())["levers"]
    assert levers["rank"] == 0
    assert {lv["name"] for lv in levers["levers"]} >= {"activation swap", "optimizer-state swap"}
    assert all(lv["saved"] > 0 and lv["setting"] for lv in levers["levers"])
