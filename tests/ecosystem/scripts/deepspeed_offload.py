"""Worker: DeepSpeed ZeRO-2 with the optimizer offloaded to cpu (DeepSpeedCPUAdam, a C++ op DeepSpeed's NPU
builder compiles against $ASCEND_HOME_PATH and torch_npu/lib) on npu + hccl, nothing configured by hand.
Each rank trains a few steps and compares its parameters with AdamW on one cpu process over the full batch."""
import json
import os
import sys

import torch
import torch_npu  # noqa: F401  (as Ascend users write it)
import deepspeed
from deepspeed.accelerator import get_accelerator

STEPS, LR = 3, 1e-2


def model_and_data(world):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    data = [torch.randn(STEPS, 4, 16, generator=torch.Generator().manual_seed(100 + r)) for r in range(world)]
    return model, data


world = int(os.environ["WORLD_SIZE"])
rank = int(os.environ["RANK"])
model, data = model_and_data(world)
config = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}},
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
}
engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
for step in range(STEPS):
    x = data[rank][step].to(engine.device)
    loss = engine(x).pow(2).mean()
    engine.backward(loss)
    engine.step()

ref, _ = model_and_data(world)
ref_opt = torch.optim.AdamW(ref.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
for step in range(STEPS):
    ref_opt.zero_grad()
    sum(ref(d[step]).pow(2).mean() for d in data).div(world).backward()  # ZeRO averages the ranks' gradients
    ref_opt.step()
got = {k: v.detach().cpu() for k, v in engine.module.state_dict().items()}
err = max((got[k] - v).abs().max().item() for k, v in ref.state_dict().items())
info = {"rank": rank, "accelerator": get_accelerator().device_name(), "device": str(engine.device),
        "param_device": str(next(engine.module.parameters()).device), "backend": torch.distributed.get_backend(),
        "optimizer": type(optimizer.optimizer).__name__, "ascend_home": os.environ.get("ASCEND_HOME_PATH"),
        "max_err": err}
sys.stdout.write("REPORT " + json.dumps(info) + "\n")
sys.stdout.flush()
