"""PyTorch's OpInfo database as a conformance suite: every op_db op on npu vs cpu (tests/device/opinfo).

CI runs every op in every dtype the CPU supports, in every form (function, method, in-place, out=, backward),
each sample once on cpu and twice on npu, in both launch modes, on the first ``MAX_SAMPLES`` samples of each
op x dtype (every sample in the forms the expected-failure list names for the op), spread over ``SHARDS`` tests
per mode so ``-n 2 --dist loadgroup`` keeps both xdist workers busy. The ``inference`` (inside
``torch.inference_mode()``) and ``autocast`` (under ``torch.autocast("npu")``) forms compare each npu call bit for
bit with the same call made synchronously (task-queue level 0); to keep CI's time they run on the first sample of
each op x dtype only (``execute.SAMPLED_SYNC_SAMPLES``; every sample where the list names them). The long run
(every sample, every form) is ``python -m tests.device.opinfo.run``; docs/device.md records why and the last result.
"""
import contextlib
import os
import signal
import sys
import textwrap
import threading
import warnings

import pytest
import torch

from .opinfo import expected
from .opinfo.names import MODES
from .opinfo.pool import Pool
from .opinfo.run import run_modes, select_tasks

SHARDS = 4  # per launch mode
MAX_SAMPLES = 3
PAIR_TIMEOUT = 120.0  # seconds per op x dtype; a hang is killed and recorded as that pair's failure


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shard", range(SHARDS))
def test_op_db_agrees_with_cpu(shard, mode):
    entries = expected.load()
    with Pool(1, MAX_SAMPLES, PAIR_TIMEOUT, mode=mode) as pool:
        catalog = pool.load_catalog()
        tasks = select_tasks(catalog, shard=(shard, SHARDS), more_forms=expected.listed_forms(entries))
        records = list(pool.run(tasks))
    assert records, "no op x dtype ran"
    assert {r["mode"] for r in records} == {mode}
    problems = expected.check(records, entries, {t.op for t in tasks}, catalog if shard == 0 else None)
    assert not problems, f"{len(problems)} problem(s) in shard {shard} ({mode}):\n" + "\n".join(problems)


def test_expected_failures_have_reasons():
    entries = expected.load()  # raises ValueError on a line without status or reason
    for op_entries in entries.values():
        for e in op_entries:
            assert len(e.reason.split(":", 1)[1].strip()) > 10, f"line {e.line}: reason too short"



# -- the harness itself, on a scripted worker (no torch): crashes, hangs, failures, modes, stale entries ----
_FAKE_ZYGOTE = textwrap.dedent('''
    import os, signal, sys, time
    sys.path.insert(0, os.getcwd())
    from tests.device.opinfo.worker import serve_zygote

    def run_task(task, send):
        with open(f"/dev/shm/npudist-usage-{os.getpid()}", "w") as f:  # as the device's memory record
            f.write("fake opinfo worker")
        for d in task["dtypes"]:
            send(t="begin", dtype=d)
            send(t="progress", sample=1, form="inplace", call=2)
            if task["op"] == "segv" and d == "float32":
                os.kill(os.getpid(), signal.SIGSEGV)
            if task["op"] == "abort":
                os.abort()
            if task["op"] == "hang" and d == "float32":
                time.sleep(60)
            status = "mismatch" if task["op"] == "bad" else "agree"
            message = "sample 1: function call 2: differs" if status != "agree" else ""
            tally = {"samples": 2, "calls": 4, "agree": 2 if status == "agree" else 1, "bitwise": 1, "drew": 0,
                     "random_agree": 0, "failures": {status: message} if message else {}, "status": status,
                     "message": message}
            # the sample limit and the forms beyond it are echoed, for the test of listed forms
            send(t="pair", op=task["op"], dtype=d, result={"forms": {"function": tally},
                                                           "seconds": task["max_samples"] or -1,
                                                           "cpu_seconds": len(task["more_forms"])})

    # the launch mode as the device reads it, or the opposite when asked to lie
    blocking = os.environ.get("ASCEND_LAUNCH_BLOCKING") == "1"
    serve_zygote({"ok": ["float32", "int64"], "segv": ["float32", "int64"], "abort": ["float32"],
                  "hang": ["float32", "int64"], "bad": ["float32"]}, run_task,
                 blocking != (sys.argv[1:] == ["lie"]))
''')


@pytest.fixture
def fake_zygote(tmp_path):
    script = tmp_path / "fake_zygote.py"
    script.write_text(_FAKE_ZYGOTE)
    return [sys.executable, str(script)]


@pytest.fixture
def fake_pool(fake_zygote):
    with Pool(2, 3, pair_timeout=3.0, startup_timeout=30.0, zygote_argv=fake_zygote) as pool:
        yield pool


def test_pool_records_crashes_and_hangs_and_carries_on(fake_pool):
    catalog = fake_pool.load_catalog()
    records = list(fake_pool.run(select_tasks(catalog, more_forms={"ok": {"out", "inplace"}})))
    by = {(r["op"], r["dtype"]): r for r in records}
    assert len(records) == 8 and len(by) == 8
    assert by["segv", "float32"]["status"] == "crash"
    assert f"({signal.Signals.SIGSEGV.name}) at sample 1 (inplace npu call 2)" in by["segv", "float32"]["message"]
    assert by["segv", "float32"]["forms"]["inplace"]["status"] == "crash"  # the form it died in
    assert by["segv", "int64"]["status"] == "agree"  # the op's remaining dtypes ran in a new worker
    assert by["abort", "float32"]["status"] == "crash" and "SIGABRT" in by["abort", "float32"]["message"]
    assert by["hang", "float32"]["status"] == "timeout" and by["hang", "int64"]["status"] == "agree"
    assert by["bad", "float32"]["status"] == "mismatch" and "call 2" in by["bad", "float32"]["message"]
    assert by["ok", "float32"]["status"] == by["ok", "int64"]["status"] == "agree"
    assert fake_pool.restarts == 3
    assert {r["mode"] for r in records} == {"async"}
    assert by["ok", "float32"]["seconds"] == by["bad", "float32"]["seconds"] == 3  # the pool's sample limit
    assert by["ok", "float32"]["cpu_seconds"] == 2 and by["bad", "float32"]["cpu_seconds"] == 0  # forms beyond it
    fake_pool.close()  # reaps the idle workers: no memory record of a worker is left behind, killed or not
    records = [n for n in os.listdir("/dev/shm") if n.startswith("npudist-usage-")]
    assert not [n for n in records if open(f"/dev/shm/{n}", "rb").read() == b"fake opinfo worker"]


def test_pools_run_each_launch_mode_and_check_it(fake_zygote):
    records, tasks, _, _ = run_modes(MODES, lambda mode: Pool(1, None, 3.0, 30.0, fake_zygote, mode=mode),
                                     lambda catalog: select_tasks(catalog, ops=["ok"]))
    assert sorted((r["mode"], r["dtype"]) for r in records) == [
        ("async", "float32"), ("async", "int64"), ("blocking", "float32"), ("blocking", "int64")]
    with pytest.raises(RuntimeError, match="blocking launch True, the pool asked for async"):
        with Pool(1, None, 3.0, 30.0, fake_zygote + ["lie"], mode="async") as pool:
            pool.load_catalog()
    with pytest.raises(ValueError, match="launch mode"):
        Pool(mode="eager")


def _entries(tmp_path, text):
    path = tmp_path / "expected.txt"
    path.write_text(text)
    return expected.load(str(path))


def _rec(op, dtype, mode="async", **forms):
    """A record; each form given as a status string or (status, drew)."""
    tallies = {}
    for form, spec in forms.items():
        status, drew = spec if isinstance(spec, tuple) else (spec, 0)
        agree, random_agree = (3, drew) if status == "agree" else (2, 0)
        message = "" if status == "agree" else f"sample 2: {form} call 2: differs"
        tallies[form] = {"samples": 3, "calls": 6, "agree": agree, "bitwise": agree - random_agree,
                         "drew": drew, "random_agree": random_agree, "status": status, "message": message,
                         "failures": {status: message} if message else {}}
    status = next((t["status"] for t in tallies.values() if t["status"] != "agree"), "agree")
    return {"op": op, "dtype": dtype, "mode": mode, "status": status, "message": "", "forms": tallies}


def test_check_judges_each_form_and_mode(tmp_path):
    recs = [_rec("a", "float32", function="agree", out="crash"),
            _rec("b", "float32", function="agree", method="agree"),
            _rec("c", "int64", function="agree", inplace="error"),
            _rec("d", "float32", out="mismatch"), _rec("d", "float32", "blocking", out="agree"),
            _rec("e", "float32", function="agree", backward="agree")]
    entries = _entries(tmp_path, "b * method mismatch bug: the method form was wrong\n"
                                 "c int64 inplace mismatch bug: something being fixed\n"
                                 "d float32 out@async mismatch bug: the queued out= call differs\n"
                                 "e float32,int64 backward mismatch bug: a gradient\n"
                                 "gone * * crash bug: an op that left op_db\n")
    problems = expected.check(recs, entries, {"a", "b", "c", "d", "e"}, catalog={"a", "b", "c", "d", "e"})
    text = "\n".join(problems)
    assert "crash: a float32 out@async" in text  # off the list
    assert "stale expected failure: b float32 method@async no longer fails with mismatch" in text
    assert "error: c int64 inplace@async: sample 2: inplace call 2: differs (listed: mismatch line 2)" in text
    assert "stale expected failure: c int64 inplace@async no longer fails with mismatch" in text
    assert "stale expected failure: e float32 backward@async no longer fails" in text
    assert "stale expected failure: e int64 was not run" in text
    assert "gone is not in op_db" in text
    assert len(problems) == 7  # d: out fails under async only, as listed for async only


def test_check_judges_each_failure_kind_of_a_unit(tmp_path):
    entries = _entries(tmp_path, "a * out warning bug: the out= form warns twice\n")
    both = _rec("a", "float32", out="warning")
    both["forms"]["out"]["failures"]["mismatch"] = "sample 3: out (right shape) call 2: values differ"
    text = "\n".join(expected.check([both], entries, {"a"}))
    assert text == ("mismatch: a float32 out@async: sample 3: out (right shape) call 2: values differ "
                    "(listed: warning line 1)")  # the listed warning does not excuse the wrong value
    _entries(tmp_path, "a * out warning bug: warns twice\na * out mismatch bug: a wrong value\n")  # no overlap


def test_check_random_draws_in_both_directions(tmp_path):
    entries = _entries(tmp_path, "r * * random random: values of samples that draw are not compared\n"
                                 "s float32 function random random: values of samples that draw are not compared\n"
                                 "s float32 function mismatch bug: a sample that draws nothing differs\n")
    recs = [_rec("r", "float32", function=("agree", 2), backward=("agree", 2)),
            _rec("q", "float32", function=("agree", 1)),           # draws, not listed
            _rec("r", "int64", function="agree"),                   # listed, draws nothing: stale
            _rec("s", "float32", function=("mismatch", 1))]         # both entries apply to one unit
    text = "\n".join(expected.check(recs, entries, {"q", "r", "s"}))
    assert "random: q float32 function@async: 1 sample(s) drew from a random generator" in text
    assert "stale expected failure: r int64 function@async drew no random numbers" in text
    assert len(text.splitlines()) == 2
    crash = _rec("r", "int64", backward="crash")  # a crash says nothing about draws: no stale random
    assert expected.check([crash], entries, {"r"}) == ["crash: r int64 backward@async: sample 2: backward call 2: differs"]


@pytest.mark.parametrize("text, error", [
    ("a * * mismatch\n", "reason"),
    ("a * * mismatch because\n", "reason"),
    ("a * * mismatch random: it draws\n", "status 'random' goes with a 'random:' reason"),
    ("a * outt mismatch bug: x is wrong\n", "form 'outt'"),
    ("a * out@eager mismatch bug: x is wrong\n", "form 'out@eager'"),
    ("a float32 * mismatch bug: x is wrong\na * out mismatch bug: y differs\n", "overlap"),
    ("a * out mismatch bug: x is wrong\na * out@async mismatch bug: y differs\n", "overlap"),
])
def test_expected_list_rejects_malformed_entries(tmp_path, text, error):
    with pytest.raises(ValueError, match=error):
        _entries(tmp_path, text)


def test_expected_list_accepts_entries_of_other_statuses_on_one_unit(tmp_path):
    # entries of other statuses may cover the same unit; one form in two modes does not overlap
    entries = _entries(tmp_path, "a * * mismatch bug: x is wrong\na * * random random: it draws numbers\n"
                                 "b * out@async mismatch bug: x is wrong\nb * out@blocking mismatch bug: y differs\n")
    assert [e.status for e in entries["a"]] == ["mismatch", "random"] and len(entries["b"]) == 2


def test_write_regenerates_the_list(tmp_path):
    recs = [_rec("d", "float32", out="mismatch", function="agree"),
            _rec("d", "float32", "blocking", out="agree", function="agree"),
            _rec("d", "int64", out="mismatch", function="agree"),
            _rec("d", "int64", "blocking", out="agree", function="agree"),
            _rec("r", "float32", function=("agree", 1)), _rec("r", "float32", "blocking", function=("agree", 1))]
    path = tmp_path / "list.txt"
    expected.write(recs, {}, str(path), header="# header\n")
    lines = path.read_text().splitlines()
    assert lines[0] == "# header"
    assert lines[1].split()[:4] == ["d", "*", "out@async", "mismatch"] and "bug: sample 2: out call 2" in lines[1]
    assert lines[2].split(None, 4)[:4] == ["r", "*", "*", "random"]
    assert expected.check(recs, expected.load(str(path)), {"d", "r"}) == []


def test_runner_rejects_unknown_ops():
    with pytest.raises(ValueError, match="unknown op"):
        select_tasks({"conj": ["complex64"]}, ops=["conjj"])
    assert [t.op for t in select_tasks({"linalg.pinv": ["float32"], "linalg.pinv.hermitian": ["float32"],
                                        "linalg.pinv_x": ["float32"]}, ops=["linalg.pinv"])] == \
        ["linalg.pinv", "linalg.pinv.hermitian"]


def test_report_counts(tmp_path):
    from .opinfo.report import count
    recs = [_rec("a", "float32", function="agree", backward="agree"),
            _rec("b", "float32", function="mismatch"),
            _rec("r", "float32", function=("agree", 1)),
            {"op": "b", "dtype": "int64", "mode": "async", "status": "nosamples", "message": "none", "forms": {}}]
    recs[0]["forms"]["backward"]["bitwise"] = 1  # 2 of its 3 agreeing samples within tolerance only
    c = count(recs, _entries(tmp_path, "b float32 function mismatch bug: the op is being fixed\n"
                                       "r * function random random: values of samples that draw\n"))
    assert (c["ops"], c["pairs"], c["nosamples_records"]) == (3, 3, 1)
    assert c["outcomes"] == {"agree": 1, "expected-fail": 1, "random": 1}
    assert c["failure_kinds"] == {"mismatch": 1}
    assert (c["ops_without_failure"], c["ops_as_listed"]) == (2, 3)
    assert c["forms"]["function"]["pairs"] == 3 and c["forms"]["function"]["calls"] == 18
    assert c["bitwise_share"] == pytest.approx(8 / 10)  # drawing samples' values were not compared


# -- one op x dtype on fake ops, in this process: forms, repeated calls, warnings, draws ---------------------
class _Sample:
    def __init__(self, inp, *args, **kwargs):
        self.input, self.args, self.kwargs = inp, args, kwargs
        self.output_process_fn_grad = lambda x: x


class _FakeOp:
    """The OpInfo attributes execute.run_op_dtype uses; ``npu_*`` hooks misbehave on npu calls only."""
    name, variant_test_name, has_nondeterministic_output, supports_autograd = "fake", "", False, True

    def __init__(self, fn, samples, method=None, inplace=None, supports_out=False):
        self.op, self.method_variant, self.inplace_variant = fn, method, inplace
        self.supports_out, self._samples = supports_out, samples

    def supported_backward_dtypes(self, device):
        return {torch.float32}

    def sample_inputs_func(self, op, device, dtype, requires_grad):
        return iter([_Sample(x.clone().requires_grad_(requires_grad), *a, **k) for x, a, k in self._samples])


_SAMPLES = [(torch.arange(6.0).reshape(2, 3), (), {}), (torch.ones(4), (), {})]


def _run(op, samples=None, max_samples=None, more_forms=()):
    from .opinfo.execute import run_op_dtype
    if samples is not None:
        op._samples = samples
    return run_op_dtype(op, torch.float32, max_samples, lambda *a: None, more_forms)["forms"]


def _npu_calls():
    """A counter of npu calls, to misbehave from the second on (where a queued launch differs)."""
    n = {"npu": 0}

    def count(x):
        if x.device.type != "npu":
            return 0
        n["npu"] += 1
        return n["npu"]
    return count


def test_every_form_runs_twice_per_sample_and_agrees():
    def add_out(x, *, out=None):  # out= as PyTorch's structured kernels treat it, in Python
        r = x + 1
        if out is None:
            return r
        if out.numel() and out.shape != r.shape:
            warnings.warn(f"An output with one or more elements was resized since it had shape {list(out.shape)}")
        return out.resize_(r.shape).copy_(r)
    op = _FakeOp(add_out, _SAMPLES, method=lambda x: x.add(1), inplace=lambda x: x.add_(1), supports_out=True)
    forms = _run(op)
    assert set(forms) == {"function", "method", "inplace", "out", "out_resize", "backward", "inference", "autocast"}
    # the sync forms call once per sample under blocking launch (test_sync_forms_call_once_under_blocking_launch)
    sync_calls = 2 if torch.npu.launch.is_blocking() else 4
    for form in ("function", "method", "inplace", "out", "backward", "inference", "autocast"):
        calls = sync_calls if form in ("inference", "autocast") else 4
        assert (forms[form]["samples"], forms[form]["calls"], forms[form]["agree"]) == (2, calls, 2), form
    # the first sample also with a wrongly-shaped out (resized with a warning on both) and an empty one
    assert (forms["out_resize"]["samples"], forms["out_resize"]["calls"], forms["out_resize"]["status"]) == \
        (1, 4, "agree")
    # a sampled run: the first sample in every form, the rest in the forms named to go on; the forms checked
    # against a synchronous run on one sample only, however many the others run
    forms = _run(op, max_samples=1, more_forms=("inplace", "backward", "autocast"))
    assert {f: t["samples"] for f, t in forms.items()} == {"function": 2, "backward": 2, "method": 1, "inplace": 2,
                                                            "out": 1, "out_resize": 1, "inference": 1, "autocast": 2}
    forms = _run(op, max_samples=2)
    assert (forms["function"]["samples"], forms["inference"]["samples"], forms["autocast"]["samples"]) == (2, 1, 1)


def test_a_wrong_second_call_fails_naming_the_form_and_call():
    calls = _npu_calls()
    op = _FakeOp(lambda x: x + 1, _SAMPLES, method=lambda x: x + (2 if calls(x) >= 2 else 1))
    forms = _run(op)
    assert forms["function"]["status"] == "agree"
    assert forms["method"]["status"] == "mismatch" and forms["method"]["agree"] == 0
    assert list(forms["method"]["failures"]) == ["mismatch"]
    assert forms["method"]["message"].startswith("sample 0: method call 2: ")


def test_out_and_inplace_forms_check_what_they_return():
    def out_ignored_on_npu(x, *, out=None):
        r = torch.add(x, 1)
        if out is not None and x.device.type != "npu":
            return out.copy_(r) if out.shape == r.shape else out.resize_(0).resize_(r.shape).copy_(r)
        return r
    op = _FakeOp(out_ignored_on_npu, _SAMPLES[:1], inplace=lambda x: x.add(1), supports_out=True)
    forms = _run(op)
    assert forms["out"]["status"] == "mismatch" and "out (right shape) call 1" in forms["out"]["message"]
    assert forms["inplace"]["status"] == "agree"  # not in place on either side: same behaviour


@pytest.fixture
def stderr_in_a_file(tmp_path):
    """fd 2 on a regular file, as in a pool worker (pytest's -s would leave it on a terminal)."""
    saved = os.dup(2)
    with open(tmp_path / "stderr", "wb") as f:
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def test_warnings_must_match_in_message_and_channel(stderr_in_a_file):
    def warns(x, on_npu_extra=False, thread=False):
        if x.device.type == "npu" and thread:
            t = threading.Thread(target=lambda: os.write(2, b"[W1204 10:00:00.000 Resize.cpp:30] Warning: "
                                                           b"resized since it had shape [] (function f)\n"))
            t.start()
            t.join()
        warnings.warn("both warn", UserWarning)
        if x.device.type == "npu" and on_npu_extra:
            warnings.warn("only npu warns", FutureWarning)
        return x * 2
    assert _run(_FakeOp(warns, _SAMPLES))["function"]["status"] == "agree"
    extra = _run(_FakeOp(lambda x: warns(x, on_npu_extra=True), _SAMPLES))["function"]
    assert extra["failures"].keys() == {"warning"} and "npu warned FutureWarning('only npu warns')" in extra["message"]
    fewer = _run(_FakeOp(lambda x: x * 3 if x.device.type == "npu" else warns(x), _SAMPLES))["function"]
    assert "npu did not warn UserWarning('both warn') as cpu did" in fewer["failures"]["warning"]
    assert "Tensor-likes are not close" in fewer["failures"]["mismatch"]  # a warning does not hide a value
    printed = _run(_FakeOp(lambda x: warns(x, thread=True), _SAMPLES))["function"]
    assert "npu printed 1 C++ warning(s) to stderr from another thread: 'resized since it had shape []'" in \
        printed["message"]


def test_draws_are_detected_and_values_compared_only_without_them():
    from torch.testing._utils import wrapper_set_seed

    from .opinfo.observe import expose_draws

    def maybe_dropout(x, p):
        return torch.nn.functional.dropout(x, p=p, training=True)
    samples = [(torch.ones(4, 4), (0.5,), {}), (torch.ones(4, 4), (0.0,), {})]  # p=0 draws nothing
    forms = _run(_FakeOp(maybe_dropout, samples), samples)
    assert (forms["function"]["drew"], forms["function"]["random_agree"], forms["function"]["status"]) == (1, 1, "agree")
    assert (forms["backward"]["drew"], forms["backward"]["status"]) == (1, "agree")
    # a draw hidden by op_db's wrapper_set_seed (seed 42, generators restored afterwards) is still seen
    with contextlib.ExitStack() as stack:
        import torch.testing._utils as tu
        stack.callback(setattr, tu, "freeze_rng_state", tu.freeze_rng_state)
        expose_draws()
        forms = _run(_FakeOp(lambda x, p: wrapper_set_seed(maybe_dropout, x, p), samples), samples)
    assert forms["function"]["drew"] == 1
    # the metadata of a drawing sample is compared; a cpu draw the npu does not make fails
    wrong = _run(_FakeOp(lambda x, p: maybe_dropout(x, p)[:2] if x.device.type == "npu" else maybe_dropout(x, p),
                         samples), samples)["function"]
    assert wrong["status"] == "mismatch" and "sample 0" in wrong["message"] and "(4, 4)" in wrong["message"]
    lazy = _run(_FakeOp(lambda x, p: x if x.device.type == "npu" else maybe_dropout(x, p), samples),
                samples)["function"]
    assert "cpu drew from its random generator, npu drew from none" in lazy["message"]


# -- the inference and autocast forms: each npu call against the same call made synchronously ----------------
# These compare a queued call with its synchronous reference in this process: they need asynchronous launch here
# (under ASCEND_LAUNCH_BLOCKING=1 every call is synchronous; test_sync_forms_call_once_under_blocking_launch covers it).
needs_async = pytest.mark.skipif(torch.npu.launch.is_blocking(),
                                 reason="ASCEND_LAUNCH_BLOCKING=1 selected blocking launch")


def _sync_level():
    """Whether npu kernels launch synchronously here (task-queue level 0), as the op sees it."""
    return torch.npu.get_task_queue_enable() == 0


@needs_async
def test_sync_forms_run_in_their_context_against_a_synchronous_reference():
    seen = []

    def record(x):
        if x.device.type == "npu":
            seen.append((torch.is_inference_mode_enabled(), torch.is_autocast_enabled("npu"), x.is_inference(),
                         _sync_level()))
        return torch.mm(x, x.t())  # autocast casts mm to float16 on npu
    forms = _run(_FakeOp(record, _SAMPLES[:1]))
    assert forms["inference"]["status"] == forms["autocast"]["status"] == "agree"
    # function: 2 calls; inference: the synchronous reference, then 2 calls in the test's (async) launch mode
    assert seen[2:5] == [(True, False, True, True), (True, False, True, False), (True, False, True, False)]
    assert seen[5:] == [(False, True, False, True), (False, True, False, False), (False, True, False, False)]
    assert torch.npu.get_task_queue_enable() == 1  # restored


def test_sync_forms_call_once_under_blocking_launch(monkeypatch):
    # every call of a blocking-launch worker runs as the reference did: one call per sample checks it
    monkeypatch.setattr(torch.npu.launch, "is_blocking", lambda: True)
    forms = _run(_FakeOp(lambda x: x * 2, _SAMPLES))
    assert (forms["inference"]["samples"], forms["inference"]["calls"], forms["autocast"]["calls"]) == (2, 2, 2)
    assert forms["function"]["calls"] == 4


@needs_async
def test_sync_forms_fail_where_queued_launch_differs():
    shifted = _run(_FakeOp(lambda x: x + (0 if x.device.type == "npu" and _sync_level() else 1), _SAMPLES))
    assert shifted["function"]["status"] == "agree"  # no synchronous call in the cpu-compared forms
    for form in ("inference", "autocast"):
        assert shifted[form]["status"] == "mismatch" and shifted[form]["agree"] == 0
        assert shifted[form]["message"].startswith(f"sample 0: {form} call 1 vs the synchronous run")
    # within assert_close's tolerance passes against cpu but not against the synchronous run: bit for bit
    ulp = _run(_FakeOp(lambda x: x * (1 + 2 ** -20 if x.device.type == "npu" and not _sync_level() else 1),
                       _SAMPLES))
    assert ulp["function"]["status"] == "agree" and ulp["function"]["bitwise"] == 0
    assert "values are close but not bitwise equal" in ulp["inference"]["message"]
    drift = _run(_FakeOp(lambda x: x.cpu() if x.device.type == "npu" and not _sync_level() and
                         torch.is_autocast_enabled("npu") else x * 2, _SAMPLES[:1]))["autocast"]
    assert drift["status"] == "error" and "reference result is on npu:0 but this one is on cpu" in drift["message"]


@needs_async
def test_sync_forms_compare_exceptions_and_draws():
    def raises(x, kind):
        raise kind("no kernel") if x.device.type == "npu" and not _sync_level() else ValueError("bad value")
    same = _run(_FakeOp(lambda x: raises(x, ValueError), _SAMPLES[:1]))
    assert same["inference"]["status"] == "agree" and same["inference"]["agree"] == 1  # both raise ValueError
    other = _run(_FakeOp(lambda x: raises(x, RuntimeError), _SAMPLES[:1]))["inference"]
    assert other["status"] == "error"
    assert "the synchronous run raised ValueError: bad value, this run raised RuntimeError: no kernel" in \
        other["message"]
    # both runs start from the same seed: a call that draws gives the same values, and must draw in both
    drawn = _run(_FakeOp(lambda x: x + torch.rand_like(x), _SAMPLES[:1]))
    assert (drawn["inference"]["status"], drawn["inference"]["drew"]) == ("agree", 1)
    lazy = _run(_FakeOp(lambda x: x if x.device.type == "npu" and not _sync_level() else x + torch.rand_like(x),
                        _SAMPLES[:1]))["autocast"]
    assert "the synchronous run drew random numbers, this run drew no random numbers" in lazy["message"]
    scaled = _run(_FakeOp(lambda x: x + torch.rand_like(x) * (2 if _sync_level() else 1), _SAMPLES[:1]))
    assert scaled["autocast"]["status"] == "mismatch" and "not close" in scaled["autocast"]["message"]


def test_expected_list_names_the_sync_forms(tmp_path):
    entries = _entries(tmp_path, "a * inference@async,autocast mismatch bug: a queued kernel differs\n")
    assert entries["a"][0].covers("float32", "inference", "async")
    assert not entries["a"][0].covers("float32", "inference", "blocking")
    assert entries["a"][0].covers("float32", "autocast", "blocking")
