"""torch_npu's ``npu_advance_step_flashattn``: vLLM's ``advance_step_flashattn`` (the page defines the operator as
that function), updating a decoding batch's metadata in place for the next step.

For each query ``i < num_queries`` (the first ``num_queries`` of ``num_seqs`` sequences), with
``p = seq_lens[i]`` the position of the token just sampled::

    input_tokens[i]    = sampled_token_ids[i, 0]
    input_positions[i] = p
    seq_lens[i]        = p + 1
    slot_mapping[i]    = block_tables[i, p // block_size] * block_size + p % block_size

Entries past ``num_queries`` are left unchanged. ``input_positions`` may be (num_seqs,) or (num_seqs, 1) (the page
shows both).

Refused with a ValueError naming the argument: the speculative form (``spec_token`` / ``accepted_num``): the page
gives its shapes but not how accepted draft tokens advance the positions and slots.
"""
from __future__ import annotations

import torch
from torch.library import custom_op

_OP = "npu_advance_step_flashattn"


def _fail(msg):
    raise ValueError(f"{_OP}: {msg}")


def _check(input_tokens, sampled_token_ids, input_positions, seq_lens, slot_mapping, block_tables, num_seqs,
           num_queries, block_size):
    if not 0 < num_queries <= num_seqs or block_size <= 0:
        _fail(f"need 0 < num_queries <= num_seqs and block_size > 0, got num_queries={num_queries}, "
              f"num_seqs={num_seqs}, block_size={block_size}")
    for name, t in (("input_tokens", input_tokens), ("input_positions", input_positions), ("seq_lens", seq_lens),
                    ("slot_mapping", slot_mapping)):
        if t.numel() != num_seqs or t.dim() not in (1, 2):
            _fail(f"{name} must hold num_seqs = {num_seqs} entries ((num_seqs,) or (num_seqs, 1)), got "
                  f"{tuple(t.shape)}")
    if sampled_token_ids.dim() != 2 or sampled_token_ids.shape[0] < num_queries:
        _fail(f"sampled_token_ids must be (num_queries, 1) = ({num_queries}, 1), got {tuple(sampled_token_ids.shape)}")
    if block_tables.dim() != 2 or block_tables.shape[0] < num_queries:
        _fail(f"block_tables must be (num_seqs, max blocks), got {tuple(block_tables.shape)}")


# The update reads seq_lens' values (the block of each position), so it is an opaque mutating operator with a fake
# kernel; the public operator takes its speculative tensors keyword-only, which custom_op does not allow.
@custom_op("npu::_advance_step_flashattn", device_types="npu",
           mutates_args=("input_tokens", "input_positions", "seq_lens", "slot_mapping"),
           schema="(Tensor(a!) input_tokens, Tensor sampled_token_ids, Tensor(b!) input_positions, "
                  "Tensor(c!) seq_lens, Tensor(d!) slot_mapping, Tensor block_tables, int num_seqs, int num_queries, "
                  "int block_size) -> ()")
def _advance_step(input_tokens, sampled_token_ids, input_positions, seq_lens, slot_mapping, block_tables, num_seqs,
                  num_queries, block_size):
    _check(input_tokens, sampled_token_ids, input_positions, seq_lens, slot_mapping, block_tables, num_seqs,
           num_queries, block_size)
    q = num_queries
    pos = seq_lens.reshape(-1)[:q].clone()
    block = pos // block_size
    if block.numel() and int(block.max()) >= block_tables.shape[1]:
        _fail(f"block_tables has {block_tables.shape[1]} blocks per sequence, fewer than seq_lens needs "
              f"(position {int(pos.max())} with block_size {block_size})")
    slots = block_tables[torch.arange(q, device=pos.device), block] * block_size + pos % block_size
    input_tokens.view(-1)[:q].copy_(sampled_token_ids[:q, 0])
    input_positions.view(-1)[:q].copy_(pos)
    seq_lens.view(-1)[:q].copy_(pos + 1)
    slot_mapping.view(-1)[:q].copy_(slots)


@_advance_step.register_fake
def _(input_tokens, sampled_token_ids, input_positions, seq_lens, slot_mapping, block_tables, num_seqs, num_queries,
      block_size):
    _check(input_tokens, sampled_token_ids, input_positions, seq_lens, slot_mapping, block_tables, num_seqs,
           num_queries, block_size)


def npu_advance_step_flashattn(input_tokens, sampled_token_ids, input_positions, seq_lens, slot_mapping, block_tables,
                               num_seqs, num_queries, block_size, *, spec_token=None, accepted_num=None):
    if spec_token is not None or accepted_num is not None:
        _fail("spec_token / accepted_num (the speculative form) are not supported: the page does not say how the "
              "accepted draft tokens advance positions and slots")
    torch.ops.npu._advance_step_flashattn(input_tokens, sampled_token_ids, input_positions, seq_lens, slot_mapping,
                                          block_tables, num_seqs, num_queries, block_size)


_lib = torch.library.Library("npu", "FRAGMENT")
_lib.define("npu_advance_step_flashattn(Tensor(a!) input_tokens, Tensor sampled_token_ids, "
            "Tensor(b!) input_positions, Tensor(c!) seq_lens, Tensor(d!) slot_mapping, Tensor block_tables, "
            "int num_seqs, int num_queries, int block_size, *, Tensor? spec_token=None, "
            "Tensor? accepted_num=None) -> ()")
_lib.impl("npu_advance_step_flashattn", npu_advance_step_flashattn, "CompositeImplicitAutograd")
