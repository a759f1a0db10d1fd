"""Driver: Ray finds the emulated NPUs by itself (ray.init() without resources: Ray's NPU detection imports pyACL,
acl.rt.get_device_count() / acl.get_soc_name()), then a TorchTrainer with one NPU per worker trains DDP over hccl.
Each worker compares its step with the single-process full-batch step and prints a WORKER line (Ray forwards
worker output to the driver); the driver prints one REPORT line."""
import json
import sys

import ray
from ray import train
from ray.train import ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

WORKERS = 2


def train_func():
    import os

    import torch
    import torch.distributed as dist
    import torch_npu  # noqa: F401

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    init = {k: v.clone() for k, v in model.state_dict().items()}
    rank, world = dist.get_rank(), dist.get_world_size()
    data = [torch.randn(4, 8, generator=torch.Generator().manual_seed(100 + r)) for r in range(world)]
    model = train.torch.prepare_model(model)  # DDP on the worker's npu
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    device = next(model.parameters()).device
    model(data[rank].to(device)).pow(2).mean().backward()
    opt.step()

    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    ref.load_state_dict(init)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    sum(ref(d).pow(2).mean() for d in data).div(world).backward()
    ref_opt.step()
    got = {k.removeprefix("module."): v.cpu() for k, v in model.state_dict().items()}
    err = max((got[k] - v).abs().max().item() for k, v in ref.state_dict().items())
    info = {"rank": rank, "device": str(device), "backend": dist.get_backend(), "max_err": err,
            "visible": os.environ.get("ASCEND_RT_VISIBLE_DEVICES")}
    print("WORKER " + json.dumps(info), flush=True)
    train.report(info)


ray.init(include_dashboard=False)
resources = ray.cluster_resources()
trainer = TorchTrainer(train_func, scaling_config=ScalingConfig(num_workers=WORKERS, resources_per_worker={"NPU": 1}),
                       torch_config=TorchConfig(backend="hccl"))
result = trainer.fit()
report = {"npus": resources.get("NPU"), "error": repr(result.error) if result.error else None,
          "accelerator_types": sorted(k for k in resources if k.startswith("accelerator_type"))}
ray.shutdown()
sys.stdout.write("REPORT " + json.dumps(report) + "\n")
