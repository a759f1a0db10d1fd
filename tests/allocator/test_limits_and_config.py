"""Capacity, OOM (message, retry, observer, OOM snapshot), PYTORCH_NPU_ALLOC_CONF and
PYTORCH_NO_NPU_MEMORY_CACHING, each in a fresh process with a small device."""
import os
import pickle

from _subproc import check_snippet, run_snippet

SMALL = {"NPUDIST_DEVICE_MEMORY": "64MiB", "NPUDIST_DEVICE_COUNT": "2"}


def test_oom_raises_torch_outofmemoryerror_with_cuda_style_message():
    out = check_snippet("""
        import torch, npudist
        MiB = 1 << 20
        keep = torch.empty(40 * MiB, dtype=torch.uint8, device="npu")
        try:
            torch.empty(40 * MiB, dtype=torch.uint8, device="npu")
        except torch.npu.OutOfMemoryError as e:
            assert isinstance(e, torch.OutOfMemoryError)
            print("MSG", str(e).splitlines()[0])
        s = torch.npu.memory_stats()
        print("OOMS", s["num_ooms"], "RETRIES", s["num_alloc_retries"])
        other = torch.empty(60 * MiB, dtype=torch.uint8, device="npu:1")  # capacity is per device
        print("OK1", other.device)
    """, SMALL)
    msg = out.split("MSG ", 1)[1].splitlines()[0]
    for frag in ["NPU out of memory. Tried to allocate 40.00 MiB", "NPU 0 has a total capacity of 64.00 MiB",
                 "of which 24.00 MiB is free", "40.00 MiB is allocated by PyTorch",
                 "is reserved by PyTorch but unallocated", "PYTORCH_NPU_ALLOC_CONF=expandable_segments:True",
                 "max_split_size_mb"]:
        assert frag in msg, (frag, msg)
    assert "OOMS 1 RETRIES 1" in out
    assert "OK1 npu:1" in out


def test_failed_allocation_frees_cache_and_retries():
    out = check_snippet("""
        import torch, npudist
        MiB = 1 << 20
        a = torch.empty(30 * MiB, dtype=torch.uint8, device="npu")
        del a                                   # 30 MiB stays cached
        print("RES", torch.npu.memory_reserved() // MiB)
        b = torch.empty(50 * MiB, dtype=torch.uint8, device="npu")   # fits only after the cache is freed
        s = torch.npu.memory_stats()
        print("RETRIES", s["num_alloc_retries"], "OOMS", s["num_ooms"], "RES", torch.npu.memory_reserved() // MiB)
    """, SMALL)
    assert "RES 30" in out and "RETRIES 1 OOMS 0 RES 50" in out


def test_per_process_memory_fraction_limits_allocations():
    out = check_snippet("""
        import torch, npudist
        MiB = 1 << 20
        torch.npu.set_per_process_memory_fraction(0.5)
        a = torch.empty(20 * MiB, dtype=torch.uint8, device="npu")
        try:
            torch.empty(20 * MiB, dtype=torch.uint8, device="npu")
        except torch.OutOfMemoryError as e:
            print("OOM", "per-process memory fraction limits this process to 32.00 MiB" in str(e))
        print("REJ", torch.npu.memory_stats()["num_oom_rejections"] >= 1)
    """, SMALL)
    assert "OOM True" in out and "REJ True" in out


def test_oom_snapshot_written(tmp_path):
    out = check_snippet("""
        import torch, npudist
        MiB = 1 << 20
        def grow():
            return [torch.empty(20 * MiB, dtype=torch.uint8, device="npu") for _ in range(5)]
        try:
            grow()
        except torch.OutOfMemoryError:
            print("RAISED")
    """, {**SMALL, "OOM_SNAPSHOT_ENABLE": "1", "OOM_SNAPSHOT_PATH": str(tmp_path)})
    assert "RAISED" in out
    files = [f for f in os.listdir(tmp_path) if f.startswith("oom_snapshot_") and f.endswith(".pickle")]
    assert len(files) == 1
    with open(tmp_path / files[0], "rb") as f:
        snap = pickle.load(f)
    trace = snap["device_traces"][0]
    oom = [e for e in trace if e["action"] == "oom"]
    assert len(oom) == 1 and oom[0]["size"] == 20 << 20
    allocs = [e for e in trace if e["action"] == "alloc" and e["size"] == 20 << 20]
    assert len(allocs) == 3  # the three that fitted, each with the Python frame that allocated it
    assert any(fr["name"] == "grow" for fr in allocs[0]["frames"])
    assert sum(s["allocated_size"] for s in snap["segments"]) == 60 << 20


def test_malformed_alloc_conf_is_rejected_clearly():
    res = run_snippet("""
        import torch, npudist
        torch.empty(4, device="npu")
    """, {"PYTORCH_NPU_ALLOC_CONF": "max_split_size_mb:lots"})
    assert res.returncode != 0
    assert "ValueError" in res.stderr and "PYTORCH_NPU_ALLOC_CONF: invalid max_split_size_mb 'lots'" in res.stderr
    bad_env = run_snippet("import torch, npudist", {"OOM_SNAPSHOT_ENABLE": "yes"})
    assert bad_env.returncode != 0 and "OOM_SNAPSHOT_ENABLE='yes'" in bad_env.stderr


def test_alloc_conf_is_applied():
    out = check_snippet("""
        import torch, npudist
        from npudist import _C
        st = _C._npu_allocator_settings()
        print("CFG", st["max_split_size"] >> 20, st["garbage_collection_threshold"], st["expandable_segments"],
              st["roundup_power2_divisions"]["1"])
        print("MSS", torch.npu.memory_stats()["max_split_size"] >> 20)
    """, {"PYTORCH_NPU_ALLOC_CONF": "max_split_size_mb:64,garbage_collection_threshold:0.7,"
                                    "roundup_power2_divisions:[64:2,>:4]"})
    assert "CFG 64 0.7 False 2" in out and "MSS 64" in out


def test_no_memory_caching_returns_memory_immediately():
    out = check_snippet("""
        import torch, npudist
        MiB = 1 << 20
        x = torch.empty(3 * MiB, dtype=torch.uint8, device="npu")
        print("RES", torch.npu.memory_reserved() // MiB)
        del x
        y = torch.ones(1000, device="npu") * 2
        print("AFTER", torch.npu.memory_reserved(), torch.npu.memory_allocated(), int(y.sum()))
    """, {"PYTORCH_NO_NPU_MEMORY_CACHING": "1"})
    assert "RES 3" in out
    after = out.split("AFTER ")[1].split()
    assert after[0] == after[1] == "4096" and after[2] == "2000"


def test_expandable_segments_grow_in_place_through_tensors():
    code = """
        import torch, npudist
        MiB = 1 << 20
        w = torch.ones(8 * MiB, dtype=torch.uint8, device="npu")
        act = None
        for i in range(1, 9):          # growing activations, previous one freed first
            act = None
            act = torch.empty(i * 11 * MiB, dtype=torch.uint8, device="npu")
            act.fill_(i)
        s = torch.npu.memory_stats()
        segs = torch.npu.memory._snapshot()["segments"]
        print("PEAK", s["reserved_bytes.large_pool.peak"] // MiB, "SEGS", s["segment.large_pool.peak"],
              "EXP", all(x["is_expandable"] for x in segs if x["segment_type"] == "large"), int(act[-1]))
    """
    fixed = check_snippet(code, {"NPUDIST_DEVICE_MEMORY": "1GiB"})
    exp = check_snippet(code, {"NPUDIST_DEVICE_MEMORY": "1GiB", "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True"})
    f_peak, f_segs = int(fixed.split("PEAK ")[1].split()[0]), int(fixed.split("SEGS ")[1].split()[0])
    e_peak, e_segs = int(exp.split("PEAK ")[1].split()[0]), int(exp.split("SEGS ")[1].split()[0])
    assert "EXP True 8" in exp and "EXP False 8" in fixed
    assert e_segs == 1 and f_segs >= 6
    assert e_peak <= 8 + 88 + 2 and f_peak > 2 * e_peak


def test_allocator_usable_in_forked_child():
    out = check_snippet("""
        import os, threading, torch, npudist
        x = torch.ones(1000, device="npu")
        stop = False
        def churn():                      # another thread allocating while we fork
            while not stop:
                torch.empty(4096, device="npu")
        t = threading.Thread(target=churn)
        t.start()
        codes = []
        for _ in range(5):
            pid = os.fork()
            if pid == 0:
                y = torch.ones(1000, device="npu") + x
                os._exit(0 if float(y.sum()) == 2000.0 else 3)
            codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        stop = True
        t.join()
        print("CHILDREN", codes)
    """, timeout=120)
    assert "CHILDREN [0, 0, 0, 0, 0]" in out
