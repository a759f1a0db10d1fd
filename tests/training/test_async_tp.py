"""parallel.tp.async_tp: the sequence-parallel TP linear pairs on the MC2 operators (npudist.tp.async_tp).

The same tiny Llama, data and seed (the parity harness, fp32, 5 steps, gradient accumulation and clipping)
trains with plain sequence-parallel TP and with async TP on 2 ranks: every step's loss agrees within 1e-5
relative between the two and against the single-device run, as do the final parameters; the profiler trace of
the async run shows the fused operators (forward and backward) and that of the plain run none. The plan
switch is validated before launch."""
from __future__ import annotations

import copy
import json

import pytest
import torch
import yaml

from _async_tp_worker import run
from _train_parity import make_plan, plan_yaml
from _train_spawn import run_ranks
from npudist.data import default_corpus_path
from npudist.plan import PlanError, load_plan, validate_plan
from test_parity import check_parity

KW = dict(tp=2, sequence_parallel=True)
N_LAYERS = 4   # the harness's model: per layer and micro-step, one fused q/k/v and one w1/w3 gather, two rowwise


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return default_corpus_path(cache_dir=str(tmp_path_factory.mktemp("corpus")))


def _train(plan, tmp_path, tag):
    out = str(tmp_path / tag)
    run_ranks(run, 2, (plan, out), str(tmp_path), timeout=230)
    results = [torch.load(f"{out}.{r}") for r in range(2)]
    ops = [json.load(open(f"{out}.{r}.ops.json")) for r in range(2)]
    return results, ops


@pytest.mark.timeout(500)
def test_async_tp_matches_plain_tp_and_shows_the_fused_ops(corpus, tmp_path):
    plain = make_plan(corpus, "npu", **KW)
    fused = copy.deepcopy(plain)
    fused.parallel.tp.async_tp = True
    assert validate_plan(fused, world_size=2) == []
    plain_res, plain_ops = _train(plain, tmp_path, "plain")
    fused_res, fused_ops = _train(fused, tmp_path, "async")
    for r in range(2):
        for step, (got, want) in enumerate(zip(fused_res[r]["losses"], plain_res[r]["losses"])):
            assert abs(got - want) <= 1e-5 * abs(want), f"rank {r} step {step}: async {got} vs plain TP {want}"
    check_parity(fused, corpus, KW, fused_res)
    micro_steps = fused.training.steps * 2   # two accumulation steps per optimizer step
    for ops in fused_ops:
        # forward: 2 gathers per layer (attention, feed_forward) + backward of the 2 rowwise linears
        assert ops.get("npu::npu_all_gather_base_mm", 0) == 4 * N_LAYERS * micro_steps, ops
        assert ops.get("npu::npu_mm_reduce_scatter_base", 0) == 4 * N_LAYERS * micro_steps, ops
    for ops in plain_ops:
        assert not any("base_mm" in k or "reduce_scatter_base" in k for k in ops), ops


@pytest.mark.parametrize("change, message", [
    (dict(tp=1), "parallel.tp.async_tp: needs tensor parallelism"),
    (dict(tp=2, sequence_parallel=False), "set parallel.tp.sequence_parallel: true"),
    (dict(tp=2, sequence_parallel=True, device="cpu"), "the MC2 operators run on npu over hccl"),
])
def test_async_tp_needs_sequence_parallel_tp_on_npu(corpus, change, message):
    device = change.pop("device", "npu")
    plan = make_plan(corpus, device, **change)
    plan.parallel.tp.async_tp = True
    with pytest.raises(PlanError, match=message):   # a ValueError, before any process starts
        load_plan(yaml.safe_load(plan_yaml(plan)), world_size=change["tp"])
