"""Run as a script (a fresh process: the stream sanitizer is enabled by NPUDIST_STREAM_SANITIZER before the first
npu op). Trains a tiny Llama two steps with activation swap on every block and optimizer-state swap, under the
sanitizer, and the same steps without swap; then profiles one swapped step. Prints one JSON line:
losses and gradients of both runs, whether the sanitizer saw the ops, and the stream tracks of the trace's
kernels and host<->device copies."""
from __future__ import annotations

import json
import os
import sys

import torch

import npudist
from npudist.device import sanitizer
from npudist.models import ModelConfig, build_model, model_layout
from npudist.swap.activations import apply_activation_swap
from npudist.swap.optimizer_state import OptimizerStateSwap

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "profiler"))
from trace_checks import device_events, load, npu_tracks  # noqa: E402

CFG = ModelConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden_dim=64, max_seq_len=32)


def _model(swap: bool):
    torch.manual_seed(0)
    model = build_model(CFG).to("npu")
    blocks = list(model_layout(CFG).blocks)
    act = apply_activation_swap(model, blocks, set(range(len(blocks)))) if swap else None
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    state = OptimizerStateSwap(opt, torch.device("npu", 0)) if swap else None
    return model, opt, act, state


def _step(model, opt, tokens):
    opt.zero_grad(set_to_none=True)
    logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    opt.step()
    return loss.item()


def main(trace_path: str) -> None:
    npudist.register()
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 256, (4, 33), generator=g).to("npu") for _ in range(3)]
    out = {"sanitizer_enabled": sanitizer.is_enabled()}
    results = {}
    for swap in (True, False):
        model, opt, act, state = _model(swap)
        losses = [_step(model, opt, b) for b in batches[:2]]
        results[swap] = (losses, [p.detach().cpu() for p in model.parameters()])
        if swap:
            out["bytes_swapped"] = act.bytes_out
            out["state_on_host"] = state.host_bytes
            out["state_storage_after_step"] = sum(t.untyped_storage().nbytes() for st in opt.state.values()
                                                  for t in st.values() if t.device.type == "npu")
            swapped = (model, opt)
    out["losses_swap"], out["losses_plain"] = results[True][0], results[False][0]
    out["params_equal"] = all(torch.equal(a, b) for a, b in zip(results[True][1], results[False][1]))
    sanitizer.disable()
    model, opt = swapped
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.NPU]) as prof:
        _step(model, opt, batches[2])
        torch.npu.synchronize()
    prof.export_chrome_trace(trace_path)
    trace = load(trace_path)
    tracks = npu_tracks(trace)
    where = {}
    for cat in ("kernel", "gpu_memcpy", "Memcpy"):
        for e in device_events(trace, cat):
            where.setdefault(e["name"], set()).add(tracks.get((e["pid"], e["tid"]), f"tid {e['tid']}"))
    out["tracks"] = {name: sorted(t) for name, t in where.items()
                     if name.startswith("Memcpy") or name in ("npu:aten::mm", "npu:aten::addmm")}
    out["default_stream"] = torch.npu.default_stream().stream_id
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
