"""npurun end to end with gloo on CPU (--device cpu): launcher mechanics independent of the npu device."""
from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest
from launch_helpers import run_two_nodes, LAUNCH_TIMEOUT, SCRIPTS, collect_lines, finish, free_port, run_npurun, start_npurun, worker_lines


def _reports(result):
    return {r: json.loads(v) for r, v in worker_lines(result, "REPORT").items()}


def test_single_node_two_ranks(tmp_path):
    res = run_npurun(["--device", "cpu", "--nproc", "2", str(SCRIPTS / "report_cpu.py"), "--lr", "0.5"], tmp_path)
    assert res.returncode == 0, res.output
    reports = _reports(res)
    assert sorted(reports) == [0, 1]
    for rank, rep in reports.items():
        assert (rep["rank"], rep["world"], rep["local_rank"]) == (rank, 2, rank)
        assert rep["sum"] == 3.0 and rep["argv"] == ["--lr", "0.5"]
        assert rep["name"] == "__main__" and rep["path0"] == str(SCRIPTS)  # as `python script.py`
        assert rep["job_id"] == rep["run_id"] and len(rep["run_id"]) > 8  # standalone: a fresh uuid per job
    start, end = res.summary_lines()[0], res.summary_lines()[-1]
    assert re.search(r"start attempt 1/1: nodes 1 .*ranks 0-1 of 2, devices cpu .*rendezvous c10d \(standalone\)",
                     start), start
    assert "finished OK" in end and "ranks 0-1 of 2" in end


def test_rank0_only_and_hccl_env(tmp_path):
    res = run_npurun(["--device", "cpu", "--nproc", "2", "--rank0-only", "--hccl-timeout", "77",
                      "--hccl-buffsize", "32", "--node-id", "boxA", str(SCRIPTS / "report_cpu.py")], tmp_path)
    assert res.returncode == 0, res.output
    reports = _reports(res)
    assert sorted(reports) == [0]  # rank 1 ran (the all_reduce needs it) but is not shown
    assert reports[0]["sum"] == 3.0
    assert (reports[0]["hccl_timeout"], reports[0]["hccl_buffsize"], reports[0]["node_id"]) == ("77", "32", "boxA")
    assert "HCCL_BUFFSIZE=32 HCCL_EXEC_TIMEOUT=77" in res.summary_lines()[0]
    assert "id 'boxA'" in res.summary_lines()[0]


def test_module_mode(tmp_path):
    res = run_npurun(["--device", "cpu", "--nproc", "2", "-m", "pkg_entry", "x", "y"], tmp_path,
                     env={"PYTHONPATH": os.pathsep.join(filter(None, [str(SCRIPTS), os.environ.get("PYTHONPATH")]))})
    assert res.returncode == 0, res.output
    assert sorted(worker_lines(res, "MODULE").values()) == [
        "rank=0 name=__main__ argv=['x', 'y']", "rank=1 name=__main__ argv=['x', 'y']"]


def test_run_path_mode(tmp_path):
    res = run_npurun(["--device", "cpu", "--nproc", "2", "--run-path", str(SCRIPTS / "report_cpu.py"), "z"],
                     tmp_path)
    assert res.returncode == 0, res.output
    reports = _reports(res)
    assert sorted(reports) == [0, 1] and reports[1]["argv"] == ["z"] and reports[1]["sum"] == 3.0


def test_crashing_worker_fails_job_and_names_rank(tmp_path):
    res = run_npurun(["--device", "cpu", "--nproc", "2", str(SCRIPTS / "crash.py")], tmp_path,
                     env={"CRASH_RANK": "1", "SURVIVOR_SLEEP": "30"})
    assert res.returncode == 1, res.output
    failed = [ln for ln in res.summary_lines() if "FAILED" in ln]
    assert len(failed) == 1, res.output
    assert "rank 1 (local 1) exit code 1 (first failure)" in failed[0]
    assert "rank 0 (local 0) signal SIGTERM (stopped after the failure)" in failed[0]  # survivor was ended
    details = [ln for ln in res.summary_lines() if ln.startswith("npurun:   rank 1: ")]
    assert any("raise ValueError" in ln for ln in details), res.output
    assert details[-1].endswith("ValueError: corrupt batch at step 7 on rank 1")
    assert "DONE" not in res.stdout


def test_error_inside_torch_quotes_the_users_line(tmp_path):
    res = run_npurun(["--device", "cpu", "--nproc", "2", str(SCRIPTS / "crash.py")], tmp_path,
                     env={"CRASH_RANK": "1", "CRASH_MODE": "torch"})
    assert res.returncode == 1, res.output
    details = [ln[len("npurun:   rank 1: "):] for ln in res.summary_lines() if ln.startswith("npurun:   rank 1: ")]
    assert 'crash.py", line ' in details[0] and details[0].endswith(", in sync_grads"), res.output
    assert details[1].strip() == "dist.all_reduce(torch.ones(2))   # no process group: torch raises inside " \
                                 "distributed_c10d.py", res.output
    assert details[2].startswith("  (raised in torch/distributed/distributed_c10d.py, line "), res.output
    assert details[3].startswith("ValueError: Default process group has not been initialized"), res.output


def test_exit_code_failure_shows_its_stderr(tmp_path):
    res = run_npurun(["--device", "cpu", "--nproc", "2", str(SCRIPTS / "crash.py")], tmp_path,
                     env={"CRASH_RANK": "0", "CRASH_MODE": "exit"})
    assert res.returncode == 1, res.output
    assert "rank 0 (local 0) exit code 3" in res.output
    assert "npurun:   rank 0: giving up with exit code 3" in res.output  # from the rank's captured stderr


def test_signal_failure_names_the_signal(tmp_path):
    res = run_npurun(["--device", "cpu", "--nproc", "2", str(SCRIPTS / "crash.py")], tmp_path,
                     env={"CRASH_RANK": "1", "CRASH_MODE": "abort"})
    assert res.returncode == 1, res.output
    assert "rank 1 (local 1) signal SIGABRT" in res.output


def test_max_restarts_restarts_once(tmp_path):
    script = str(SCRIPTS / "crash.py")
    res = run_npurun(["--device", "cpu", "--nproc", "2", "--max-restarts", "1", script], tmp_path,
                     env={"CRASH_RANK": "1", "CRASH_ATTEMPTS": "1"})
    assert res.returncode == 0, res.output
    alive = re.findall(r"ALIVE rank=\d attempt=\d", res.stdout)
    assert sorted(alive) == ["ALIVE rank=0 attempt=0", "ALIVE rank=0 attempt=1",
                             "ALIVE rank=1 attempt=0", "ALIVE rank=1 attempt=1"]
    starts = [ln for ln in res.summary_lines() if " start attempt " in ln]
    assert ["attempt 1/2" in starts[0], "attempt 2/2" in starts[1], len(starts)] == [True, True, 2]
    restart = [ln for ln in res.summary_lines() if "restarting" in ln]
    assert len(restart) == 1 and "rank 1: ValueError: corrupt batch" in restart[0]


def test_max_restarts_exhausted_fails(tmp_path):
    # A worker that keeps failing uses up the single restart and fails the job.
    script = str(SCRIPTS / "crash.py")
    res = run_npurun(["--device", "cpu", "--nproc", "2", "--max-restarts", "1", script], tmp_path,
                     env={"CRASH_RANK": "1"})
    assert res.returncode == 1, res.output
    assert len(re.findall(r"ALIVE rank=1", res.stdout)) == 2
    assert "2 attempt(s)" in [ln for ln in res.summary_lines() if "FAILED" in ln][0]


def test_two_simulated_nodes_on_localhost(tmp_path):
    port = free_port()
    common = ["--device", "cpu", "--nnodes", "2", "--nproc", "2", "--master-addr", "127.0.0.1",
              "--master-port", str(port), str(SCRIPTS / "report_cpu.py")]
    results = run_two_nodes(common, tmp_path)
    for n, res in enumerate(results):
        assert res.returncode == 0, res.output
        reports = _reports(res)
        assert sorted(reports) == [2 * n, 2 * n + 1]
        for rank, rep in reports.items():
            assert (rep["world"], rep["group_rank"], rep["local_rank"]) == (4, n, rank - 2 * n)
            assert rep["node_id"] == f"sim{n}" and rep["sum"] == 10.0
        assert f"nodes 2 (this: node {n}, id 'sim{n}'), ranks {2 * n}-{2 * n + 1} of 4" in res.summary_lines()[0]


def test_sigterm_to_launcher_stops_workers(tmp_path):
    proc = start_npurun(["--device", "cpu", "--nproc", "2", str(SCRIPTS / "sleepy.py")], tmp_path)
    lines, reader = collect_lines(proc.stdout)
    deadline = time.monotonic() + 90
    while sum("ALIVE" in ln for ln in lines) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    pids = [int(m) for m in re.findall(r"ALIVE rank=\d pid=(\d+)", "".join(lines))]
    assert len(pids) == 2, "".join(lines)
    proc.send_signal(signal.SIGTERM)
    reader.join(timeout=LAUNCH_TIMEOUT)
    res = finish(proc, stdout_lines=lines)
    assert res.returncode == 128 + signal.SIGTERM, res.output
    assert any(ln.startswith("npurun: stopped by SIGTERM") for ln in res.summary_lines()), res.output
    for pid in pids:  # the agent ended its workers before exiting
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_tee_0_is_torchrun_raw_output_and_quiet_drops_summaries(tmp_path):
    res = run_npurun(["--device", "cpu", "--nproc", "2", "--tee", "0", "--quiet", str(SCRIPTS / "report_cpu.py")],
                     tmp_path)
    assert res.returncode == 0, res.output
    raw = [json.loads(ln.split("REPORT ", 1)[1]) for ln in res.stdout.splitlines() if ln.startswith("REPORT ")]
    assert sorted(r["rank"] for r in raw) == [0, 1]  # straight from the workers: no rank prefix
    assert "[rank" not in res.stdout and res.summary_lines() == []


def test_no_python_runs_the_command_as_is(tmp_path):
    res = run_npurun(["--nproc", "2", "--no-python", str(SCRIPTS / "nopy.sh"), "a", "b"], tmp_path)
    assert res.returncode == 0, res.output
    assert worker_lines(res, "NOPY") == {0: "rank=0 local=0 world=2 args=a b", 1: "rank=1 local=1 world=2 args=a b"}
    assert "(not bound: --no-python)" in res.summary_lines()[0]
