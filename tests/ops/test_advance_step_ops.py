"""npu_advance_step_flashattn against a per-query loop of vLLM's advance_step_flashattn update."""
import pytest
import torch

import torch_npu

from ._common import NPU


def _state(seed, num_seqs=6, num_queries=4, block_size=4):
    g = torch.Generator().manual_seed(seed)
    return dict(input_tokens=torch.randint(0, 50, (num_seqs,), generator=g),
                sampled=torch.randint(0, 50, (num_queries, 1), generator=g),
                input_positions=torch.randint(0, 9, (num_seqs,), generator=g),
                seq_lens=torch.randint(1, 15, (num_seqs,), generator=g),
                slot_mapping=torch.randint(0, 9, (num_seqs,), generator=g),
                block_tables=torch.randint(0, 20, (num_seqs, 4), generator=g))


@pytest.mark.parametrize("positions_2d", [False, True])
def test_advance_step(positions_2d):
    s = _state(0)
    want = {k: v.clone() for k, v in s.items()}
    for i in range(4):
        p = want["seq_lens"][i].item()
        want["input_tokens"][i] = want["sampled"][i, 0]
        want["input_positions"][i] = p
        want["seq_lens"][i] = p + 1
        want["slot_mapping"][i] = want["block_tables"][i, p // 4].item() * 4 + p % 4
    dev = {k: v.to(NPU) for k, v in s.items()}
    if positions_2d:
        dev["input_positions"] = dev["input_positions"].reshape(6, 1)
    out = torch_npu.npu_advance_step_flashattn(dev["input_tokens"], dev["sampled"], dev["input_positions"],
                                               dev["seq_lens"], dev["slot_mapping"], dev["block_tables"], 6, 4, 4)
    assert out is None
    for k in ("input_tokens", "input_positions", "seq_lens", "slot_mapping"):
        assert dev[k].cpu().reshape(-1).tolist() == want[k].tolist(), k


def test_advance_step_rejects_bad_arguments():
    dev = {k: v.to(NPU) for k, v in _state(1).items()}
    args = [dev[k] for k in ("input_tokens", "sampled", "input_positions", "seq_lens", "slot_mapping",
                             "block_tables")]
    with pytest.raises(ValueError, match="npu_advance_step_flashattn: spec_token / accepted_num"):
        torch_npu.npu_advance_step_flashattn(*args, 6, 4, 4, accepted_num=torch.ones(6, dtype=torch.int64).to(NPU))
    with pytest.raises(ValueError, match="npu_advance_step_flashattn: need 0 < num_queries <= num_seqs"):
        torch_npu.npu_advance_step_flashattn(*args, 6, 7, 4)
    with pytest.raises(ValueError, match="npu_advance_step_flashattn: block_tables has 4 blocks"):
        torch_npu.npu_advance_step_flashattn(*args, 6, 4, 1)


def test_advance_step_compile():
    s = _state(2)

    def fn(tokens, sampled, positions, lens, slots, tables):
        torch.ops.npu.npu_advance_step_flashattn(tokens, sampled, positions, lens, slots, tables, 6, 4, 4)
        return tokens, positions, lens, slots

    results = []
    for f in (fn, torch.compile(fn, backend="aot_eager", fullgraph=True)):
        dev = [s[k].clone().to(NPU) for k in ("input_tokens", "sampled", "input_positions", "seq_lens",
                                                "slot_mapping", "block_tables")]
        results.append([t.cpu() for t in f(*dev)])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b)
