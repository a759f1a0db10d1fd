"""Unit tests of npurun's pieces that need no worker processes."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from npudist.launch import devices, job as npurun_main
from npudist.launch.options import parse_args
from npudist.launch.devices import LaunchError, resolve_nproc
from npudist.launch.logs import NpurunLogsSpecs, read_error_excerpt, summarize_traceback
from npudist.launch.plan_check import check_plan_args, format_plan_error
from npudist.launch.summary import format_ranges
from npudist.launch.worker import parse_worker_argv
from torch.distributed.elastic.multiprocessing import Std


def test_torchrun_options_and_nproc_alias():
    _, args = parse_args(["--nnodes", "1:2", "--nproc", "4", "--node-rank", "1", "--master-addr", "10.0.0.1",
                          "--master-port", "1234", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:29400",
                          "--rdzv-id", "job7", "--max-restarts", "2", "--monitor-interval", "0.5",
                          "--log-dir", "/tmp/x", "--redirects", "3", "--tee", "1", "--run-path",
                          "/abs/train.py", "--lr", "0.1"])
    assert (args.nnodes, args.nproc_per_node, args.node_rank) == ("1:2", "4", 1)
    assert (args.master_addr, args.master_port, args.rdzv_backend) == ("10.0.0.1", 1234, "c10d")
    assert (args.rdzv_endpoint, args.rdzv_id, args.max_restarts) == ("h:29400", "job7", 2)
    assert (args.monitor_interval, args.log_dir, args.redirects, args.tee) == (0.5, "/tmp/x", "3", "1")
    assert args.run_path and args.training_script == "/abs/train.py"
    assert args.training_script_args == ["--lr", "0.1"]  # the script's own options stay the script's


def test_nproc_long_form_and_default():
    assert parse_args(["--nproc-per-node", "3", "t.py"])[1].nproc_per_node == "3"
    assert parse_args(["--nproc_per_node", "2", "t.py"])[1].nproc_per_node == "2"
    assert parse_args(["t.py"])[1].nproc_per_node == "1"  # torchrun's default


def test_npu_and_output_options():
    _, args = parse_args(["--node-id", "nodeB", "--hccl-timeout", "60", "--hccl-buffsize", "16",
                          "--rank0-only", "-m", "pkg.train"])
    assert (args.node_id, args.hccl_timeout, args.hccl_buffsize) == ("nodeB", 60, 16)
    assert args.ranks_filter == {0} and args.module and args.training_script == "pkg.train"
    assert parse_args(["--ranks-filter", "1,3", "t.py"])[1].ranks_filter == {1, 3}


@pytest.mark.parametrize("argv, needle", [
    (["--hccl-timeout", "0", "t.py"], "positive integer"),
    (["--hccl-buffsize", "lots", "t.py"], "positive integer"),
    (["--ranks-filter", "a,b", "t.py"], "comma-separated list"),
    (["--rank0-only", "--ranks-filter", "1", "t.py"], "contradicts"),
    (["--device", "gpu", "t.py"], "invalid choice"),
])
def test_bad_options_exit_2_with_reason(argv, needle, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err


def test_nproc_resolution_against_visible_devices(monkeypatch):
    monkeypatch.setattr(devices, "count_visible_npus", lambda: 4)
    assert resolve_nproc("auto", "npu") == (4, 4)
    assert resolve_nproc("npu", "npu") == (4, 4)
    assert resolve_nproc("2", "npu") == (2, 4)
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "0,1,2,3")
    with pytest.raises(LaunchError, match=r"asks for 5 ranks per node but only 4 npu device\(s\) are visible "
                                          r"\(ASCEND_RT_VISIBLE_DEVICES=0,1,2,3\)"):
        resolve_nproc("5", "npu")
    with pytest.raises(LaunchError, match="positive number of ranks"):
        resolve_nproc("0", "npu")
    with pytest.raises(LaunchError, match="use an integer or 'auto'"):
        resolve_nproc("many", "npu")


def test_nproc_cpu_device_skips_device_check(monkeypatch):
    def fail():
        raise AssertionError("--device cpu must not look at npu devices")
    monkeypatch.setattr(devices, "count_visible_npus", fail)
    assert resolve_nproc("64", "cpu") == (64, None)
    assert resolve_nproc("auto", "cpu")[0] >= 1


def test_too_many_ranks_is_a_usage_error_before_launch(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(devices, "count_visible_npus", lambda: 2)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("raise SystemExit('must not run')\n")

    def no_launch(*a, **k):
        raise AssertionError("nothing may start when the request cannot work")
    monkeypatch.setattr(npurun_main, "elastic_launch", no_launch)
    with pytest.raises(SystemExit) as exc:
        npurun_main.run(["--nproc", "3", "train.py"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "asks for 3 ranks per node but only 2 npu device(s) are visible" in err


def test_worker_argv():
    w = parse_worker_argv(["--device", "cpu", "train.py", "--device", "x", "-m"])
    assert (w.device, w.module, w.target, w.args) == ("cpu", False, "train.py", ["--device", "x", "-m"])
    w = parse_worker_argv(["-m", "pkg.mod", "a"])
    assert (w.device, w.module, w.target, w.args) == ("npu", True, "pkg.mod", ["a"])
    with pytest.raises(ValueError, match="missing the script"):
        parse_worker_argv(["--device", "npu"])
    with pytest.raises(ValueError, match="unknown --device"):
        parse_worker_argv(["--device", "tpu", "t.py"])


def test_format_ranges():
    assert format_ranges([3, 0, 1, 2, 5, 7, 8]) == "0-3,5,7-8"
    assert format_ranges([4]) == "4"


def _envs(ranks):
    return {lr: {"RANK": str(r), "TORCHELASTIC_RUN_ID": "t", "TORCHELASTIC_RESTART_COUNT": "0",
                 "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "WORLD_SIZE": "4"} for lr, r in ranks.items()}


def test_global_rank_filter_selects_console_ranks(tmp_path):
    seen = []
    spec = NpurunLogsSpecs(str(tmp_path), Std.NONE, Std.ALL, global_ranks_filter={3}, on_start=seen.append)
    dest = spec.reify(_envs({0: 2, 1: 3}))
    assert set(dest.tee_stdouts) == {1} and set(dest.tee_stderrs) == {1}
    assert set(dest.stdouts) == {0, 1}  # every rank still logs to its file
    info = seen[0]
    assert (info.node_rank, info.num_nodes, info.world_size, info.ranks) == (1, 2, 4, {0: 2, 1: 3})
    # A node without any selected rank shows nothing (an empty filter would mean "show all").
    spec = NpurunLogsSpecs(str(tmp_path / "b"), Std.NONE, Std.ALL, global_ranks_filter={0})
    dest = spec.reify(_envs({0: 2, 1: 3}))
    assert dest.tee_stdouts == {} and dest.tee_stderrs == {}


def test_error_excerpt_prefers_innermost_frame(tmp_path):
    tb = ('Traceback (most recent call last):\n  File "train.py", line 9, in <module>\n    main()\n'
          '  File "train.py", line 5, in main\n    raise ValueError("bad lr")\nValueError: bad lr\n')
    ef = tmp_path / "error.json"
    ef.write_text(json.dumps({"message": {"message": "ValueError: bad lr",
                                          "extraInfo": {"py_callstack": tb, "timestamp": "1"}}}))
    assert read_error_excerpt(str(ef), None) == [
        '  File "train.py", line 5, in main', '    raise ValueError("bad lr")', "ValueError: bad lr"]
    se = tmp_path / "stderr.log"
    se.write_text("a\n\nb\nc\nd\ne\n")
    assert read_error_excerpt(None, str(se)) == ["b", "c", "d", "e"]
    assert read_error_excerpt(str(tmp_path / "missing.json"), None) == []
    # C++ backtraces (c10 format) are dropped so the message before them shows.
    se.write_text("[rank 0] hccl watchdog: all_reduce failed: Connection closed by peer\n"
                  "Exception raised from translate_error at x.cpp:216 (most recent call first):\n"
                  + "".join(f"frame #{i}: f{i} + 0x1 (0x7f in /lib/libc.so.6)\n" for i in range(30))
                  + "<omitting python frames>\n[rank 0] hccl watchdog: tearing down the process\n")
    assert read_error_excerpt(None, str(se), max_lines=2) == [
        "[rank 0] hccl watchdog: all_reduce failed: Connection closed by peer",
        "[rank 0] hccl watchdog: tearing down the process"]


def test_missing_script_is_a_usage_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        npurun_main.run(["--device", "cpu", "--nproc", "2", "no_such_train.py"])
    assert exc.value.code == 2
    assert "training script not found: 'no_such_train.py'" in capsys.readouterr().err


@pytest.mark.parametrize("cmd", [["npurun"], ["-m", "npudist.launch"]])
def test_console_script_and_module_entry_points(cmd):
    exe = Path(sys.executable)
    argv = [str(exe.parent / cmd[0])] if cmd == ["npurun"] else [str(exe), *cmd]
    out = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for opt in ("--nproc", "--nproc-per-node", "--rdzv-endpoint", "--hccl-timeout", "--node-id", "--rank0-only"):
        assert opt in out.stdout
    assert "--no-plan-check" in out.stdout
    for word in ("gpu", "xpu"):   # npurun launches npu (or cpu) jobs; torchrun's GPU wording is replaced
        assert word not in out.stdout.lower(), [ln for ln in out.stdout.splitlines() if word in ln.lower()]


def test_numa_binding_is_refused_before_anything_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("")
    with pytest.raises(SystemExit) as exc:
        npurun_main.run(["--device", "cpu", "--nproc", "2", "--numa-binding", "node", "t.py"])
    assert exc.value.code == 2 and "--numa-binding is not supported" in capsys.readouterr().err


def test_error_excerpt_quotes_the_users_frame_not_torchs():
    import torch

    c10d = Path(torch.__file__).parent / "distributed" / "distributed_c10d.py"
    tb = ('Traceback (most recent call last):\n'
          '  File "/home/u/train.py", line 30, in <module>\n    main()\n'
          '  File "/home/u/train.py", line 12, in main\n    dist.all_reduce(loss)\n'
          f'  File "{c10d}", line 3234, in all_reduce\n    group = _get_default_group()\n'
          '            ^^^^^^^^^^^^^^^^^^^^\n'
          f'  File "{c10d}", line 1423, in _get_default_group\n    raise ValueError(\n'
          'ValueError: Default process group has not been initialized\n')
    assert summarize_traceback(tb) == [
        '  File "/home/u/train.py", line 12, in main', "    dist.all_reduce(loss)",
        "  (raised in torch/distributed/distributed_c10d.py, line 1423, in _get_default_group)",
        "ValueError: Default process group has not been initialized"]
    # The innermost frame when no frame is the user's; the last exception of a chain.
    only_torch = tb.replace("/home/u/train.py", str(c10d))
    assert summarize_traceback(only_torch)[0].endswith("line 1423, in _get_default_group")
    chained = tb + "\nDuring handling of the above exception, another exception occurred:\n\n" + tb.replace(
        "line 12, in main", "line 14, in main")
    assert summarize_traceback(chained)[0].endswith("line 14, in main")


PLAN = Path(__file__).resolve().parents[2] / "examples" / "plans" / "fsdp_tp.yaml"


def test_plan_check_reports_a_plan_and_ignores_other_configs(tmp_path):
    assert check_plan_args(["--config", str(PLAN)], 4) is None
    assert check_plan_args([f"--config={PLAN}", "--training.steps", "5"], 4) is None
    err = check_plan_args(["--config", str(PLAN), "--parallel.tp_degree", "3"], 4)
    # -1 cannot fill a world of 4 when tp is 3: the hint must not suggest it.
    assert any("does not divide 4" in e for e in err.errors) and not any("to -1" in e for e in err.errors)
    err = check_plan_args(["--config", str(PLAN), "--parallel.tp_degree", "1"], 4)   # 2 x 1 != 4
    assert any("set parallel.dp_shard_degree to -1 (= 4 here)" in e for e in err.errors), err.errors
    assert "for 4 ranks" in format_plan_error(err, 4)
    assert check_plan_args(["--config", str(PLAN), "--parallel.tp_degree", "1"], None) is None   # elastic
    other = tmp_path / "other.yaml"
    other.write_text("lr: 0.1\nlayers: 3\n")   # not an npudist plan: the program's own business
    assert check_plan_args(["--config", str(other)], 4) is None
    assert check_plan_args(["--lr", "0.1"], 4) is None and check_plan_args(["--config", "missing.yaml"], 4) is None
