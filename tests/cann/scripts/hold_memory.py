"""Worker: holds 64 MiB on its npu device, says READY, and waits until the test creates the release file."""
import os
import sys
import time

import torch

x = torch.ones(16 << 20, device="npu")  # 64 MiB of float32 on npu:<local rank>
torch.npu.synchronize()
print(f"READY {os.getpid()} {x.device}", flush=True)
release = sys.argv[1]
deadline = time.monotonic() + 300   # longer than the test waits for the slowest rank to start
while not os.path.exists(release) and time.monotonic() < deadline:
    time.sleep(0.1)
