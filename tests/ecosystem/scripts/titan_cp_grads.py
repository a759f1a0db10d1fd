"""One rank of test_torchtitan_cp.py's gradient check (run by ``npurun --nproc 2``): torchtitan's llama3 debug
model, context parallelism applied by torchtitan's own functions (``apply_cp_to_attention_module``,
``prepare_context_parallel_input``) over a 2-rank npu mesh, against the same model on one npu over the whole
sequence. Each rank's gradient is that of the mean loss over its half of the tokens, so the mean over the cp
ranks is the whole sequence's gradient. Prints ``CP GRADS OK <worst relative error>`` on success."""
import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torchtitan.distributed.context_parallel import apply_cp_to_attention_module, prepare_context_parallel_input
from torchtitan.models.llama3 import llama3_args
from torchtitan.models.llama3.model.model import Transformer


def main() -> None:
    dist.init_process_group("hccl")
    torch.npu.set_device(dist.get_rank())
    mesh = init_device_mesh("npu", (2,), mesh_dim_names=("cp",))
    torch.manual_seed(0)
    with torch.device("npu"):
        model = Transformer(llama3_args["debugmodel"])
    with torch.no_grad():
        model.init_weights(buffer_device=torch.device("npu"))
    whole = copy.deepcopy(model)
    g = torch.Generator().manual_seed(1)
    tokens, labels = (torch.randint(0, 2048, (2, 64), generator=g).npu() for _ in range(2))
    F.cross_entropy(whole(tokens, None).flatten(0, 1).float(), labels.flatten()).backward()

    apply_cp_to_attention_module([b.attention.inner_attention for b in model.layers.values()], mesh, "sdpa")
    tokens, labels, kwargs = prepare_context_parallel_input(tokens, labels, {}, mesh, torch.device("npu"))
    assert tokens.shape[1] == 32, tokens.shape
    F.cross_entropy(model(tokens, None, **kwargs).flatten(0, 1).float(), labels.flatten()).backward()
    worst = 0.0
    for (name, p), (_, q) in zip(model.named_parameters(), whole.named_parameters()):
        grad = p.grad.clone()
        dist.all_reduce(grad)
        rel = ((grad / 2 - q.grad).norm() / q.grad.norm()).item()
        assert rel <= 1e-5, f"{name}: gradient differs from one device by {rel:.2e} of its norm"
        worst = max(worst, rel)
    print(f"CP GRADS OK {worst:.1e}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
