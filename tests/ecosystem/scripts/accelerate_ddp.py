"""Worker: accelerate's Accelerator on npu + hccl, one DDP step; reports what accelerate picked and whether
the step equals the single-process full-batch step (each rank checks it on cpu)."""
import json
import sys

import torch
import torch_npu  # noqa: F401  (as Ascend users write it)
from accelerate import Accelerator
from accelerate.utils import DistributedType

acc = Accelerator()
rank, world = acc.process_index, acc.num_processes
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
init = {k: v.clone() for k, v in model.state_dict().items()}
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = [torch.randn(4, 8, generator=torch.Generator().manual_seed(100 + r)) for r in range(world)]
model, opt = acc.prepare(model, opt)
x = data[rank].to(acc.device)
loss = model(x).pow(2).mean()
acc.backward(loss)
opt.step()

ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
ref.load_state_dict(init)
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
sum(ref(d).pow(2).mean() for d in data).div(world).backward()  # DDP averages the ranks' gradients
ref_opt.step()
got = acc.unwrap_model(model).state_dict()
err = max((got[k].cpu() - v).abs().max().item() for k, v in ref.state_dict().items())
info = {"rank": rank, "world": world, "device": str(acc.device), "param_device": str(next(model.parameters()).device),
        "distributed_type": str(acc.distributed_type), "multi_npu": acc.distributed_type == DistributedType.MULTI_NPU,
        "backend": torch.distributed.get_backend(), "max_err": err}
sys.stdout.write("REPORT " + json.dumps(info) + "\n")
sys.stdout.flush()
acc.end_training()
