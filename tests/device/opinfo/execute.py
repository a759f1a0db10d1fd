"""Run one OpInfo op in one dtype on cpu and on npu (inside a worker process) and compare.

Samples are made on cpu (seeded). For every sample, each form the op defines (``forms``: function,
method, in-place, out=) runs once on cpu and ``CALLS`` times on npu, each call on fresh copies of the
arguments: the first npu call of an argument signature runs synchronously, later ones are queued under
asynchronous launch, so the second call is where the launch path differs. Every npu call is compared with
the cpu call (``observe``, ``compare``): exception type, result shape/dtype/device/layout, values, and
warnings. Where the op supports autograd in that dtype, each npu call's function-form outputs are
differentiated with the same random grad_outputs as cpu's (``backward``). The ``inference`` and ``autocast``
forms run on npu only, each call compared bit for bit with the same call made synchronously
(``sync_reference``); in a sampled run (``max_samples`` set) they run on the first sample that reaches npu only.

Random numbers: a call draws if the CPU or npu generator advanced across it (``observe``). The npu
generator is independent of CPU's (as CUDA's is), so the values of a sample whose cpu call drew are not
compared (its backward neither); its metadata is, and the npu call must have drawn too. Such samples are
counted per form (``drew``), so the expected-failure list can excuse exactly them (status ``random``).
"""
import itertools
import time

import torch

from . import forms as F
from .compare import AGREE, ERROR, MISMATCH, WARNING, Mismatch, compare_results
from .names import SYNC_FORMS
from .observe import SEED, compare_warnings, observe, seed
from .samples import copy_to, mentions_npu, tensors
from .sync_reference import run_against_sync

CALLS = 2  # npu calls per sample and form
SAMPLED_SYNC_SAMPLES = 1  # samples of the SYNC_FORMS in a sampled run (the CI budget; the long run: every sample)

_RANK = {AGREE: 0, WARNING: 1, MISMATCH: 2, ERROR: 3}


def op_id(op) -> str:
    """``name`` or ``name.variant`` (unique in op_db)."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _short(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"


def compare_calls(cpu, npu, where):
    """Compare an observed npu call with the cpu call; return (failures, bitwise, drew), ``failures`` a list
    of (kind, message): an exception that differs is the only failure reported; otherwise warnings and
    results are judged apart, so a warning difference does not hide a wrong value.

    ``drew``: the cpu call drew random numbers, so values are not compared; the npu call must then have
    drawn too. An npu call that draws where cpu's does not is still compared on values (its result
    must not depend on what it drew)."""
    drew = cpu.drew
    if cpu.exc is not None and npu.exc is None:
        return [(ERROR, f"{where}: CPU raised {_short(cpu.exc)} but npu returned a result")], False, drew
    if cpu.exc is not None and not isinstance(npu.exc, type(cpu.exc)):
        return [(ERROR, f"{where}: CPU raised {_short(cpu.exc)}, npu raised {_short(npu.exc)}")], False, drew
    if cpu.exc is None and npu.exc is not None:
        return [(ERROR, f"{where}: npu raised {_short(npu.exc)}")], False, drew
    failures, bitwise = [], cpu.exc is not None  # both raised: the error matches
    warned = compare_warnings(cpu, npu)
    if warned:
        failures.append((WARNING, f"{where}: {warned}"))
    if cpu.drew and not npu.drew:
        failures.append((MISMATCH, f"{where}: cpu drew from its random generator, npu drew from none"))
    elif cpu.exc is None:
        try:
            bitwise = compare_results(cpu.out, npu.out, where, values=not drew) and not drew
        except Mismatch as m:
            failures.append((ERROR if m.kind == "device" else MISMATCH, str(m)))
    return failures, bitwise and not failures, drew


class FormTally:
    """Counts of one form (function, method, inplace, out, backward) of one op x dtype. A sample counts
    once: agreeing if every call of it agreed, bitwise if every call's values were compared and equal bit
    for bit, ``drew`` if its cpu call drew random numbers (``random_agree``: drew and agreed otherwise).
    ``failures``: the first message of each failure kind seen."""

    def __init__(self):
        self.samples = self.calls = self.agree = self.bitwise = self.drew = self.random_agree = 0
        self.failures = {}
        self._current = None  # [index, agrees, bitwise, drew] of the sample being counted

    def add(self, index, failures, bitwise, drew):
        """One npu call of sample ``index``."""
        if self._current is None or self._current[0] != index:
            self._fold()
            self._current = [index, True, True, False]
        cur = self._current
        self.calls += 1
        cur[1] = cur[1] and not failures
        cur[2] = cur[2] and not failures and bool(bitwise) and not drew
        cur[3] = cur[3] or drew
        for kind, message in failures:
            self.failures.setdefault(kind, f"sample {index}: {message}")

    def _fold(self):
        if self._current is not None:
            _, agrees, bitwise, drew = self._current
            self.samples += 1
            self.agree += agrees
            self.bitwise += agrees and bitwise
            self.drew += drew
            self.random_agree += agrees and drew
            self._current = None

    def as_dict(self):
        self._fold()
        worst = max(self.failures, key=_RANK.get, default=AGREE)
        return {"samples": self.samples, "calls": self.calls, "agree": self.agree, "bitwise": self.bitwise,
                "drew": self.drew, "random_agree": self.random_agree, "failures": dict(self.failures),
                "status": worst, "message": self.failures.get(worst, "")}


def run_op_dtype(op, dtype, max_samples, progress, more_forms=()):
    """Compare ``op`` in ``dtype`` over at most ``max_samples`` samples (None = all), and over the remaining
    samples in ``more_forms`` only ("*": every form).

    ``progress(i, form, call)`` is called before each call that could crash the process.
    Returns {"forms": {form: tally dict}, "seconds", "cpu_seconds"} or {"harness_error": ...}.
    """
    start, cpu_start = time.monotonic(), time.process_time()
    grad = op.supports_autograd and dtype in op.supported_backward_dtypes("cpu")
    seed(SEED)
    tallies = {form: FormTally() for form in F.forms_of(op, grad)}
    later = set(tallies) if "*" in more_forms else set(more_forms) & set(tallies)
    samples, sync_samples = None, 0
    for i in itertools.count():
        active = set(tallies) if max_samples is None or i < max_samples else set(later)
        if max_samples is not None and sync_samples >= SAMPLED_SYNC_SAMPLES:
            active -= set(SYNC_FORMS) - later
        else:
            active |= set(SYNC_FORMS) & set(tallies)
        if not active:
            break
        try:  # op_db's own sample code failing on CPU is not the device's fault: reported apart
            # sample_inputs_func directly: OpInfo.sample_inputs adds per-sample reseeding and test-name
            # lookups by stack inspection (unittest bookkeeping that cost a third of the run here)
            samples = samples or iter(op.sample_inputs_func(op, "cpu", dtype, grad))
            sample = next(samples)
        except StopIteration:
            break
        except Exception as e:  # noqa: BLE001
            return {"harness_error": _short(e), "seconds": time.monotonic() - start,
                    "cpu_seconds": time.process_time() - cpu_start}
        sync_samples += _run_sample(op, sample, i, tallies, progress, active)
        seed(SEED + i + 1)  # the next sample does not depend on this one's draws
    counts = {form: t.as_dict() for form, t in tallies.items()}
    return {"forms": {form: c for form, c in counts.items() if c["samples"]},
            "seconds": time.monotonic() - start,
            "cpu_seconds": time.process_time() - cpu_start}  # the load-independent cost, for CI budgeting


def _run_sample(op, sample, i, tallies, progress, active):
    """The ``active`` forms of one sample; returns whether it reached npu."""
    pristine = copy_to(F.args_of(sample), "cpu", grad=False)  # before any call can write the sample
    npu_args = [copy_to(F.args_of(sample), "npu", grad=True) for _ in range(CALLS)]
    if not mentions_npu(npu_args[0]):
        return False  # e.g. arange(2): no tensor or device argument, so the op never meets npu
    post = _zero_values if op.has_nondeterministic_output else (lambda out: out)
    if active - set(SYNC_FORMS):
        _run_forms(op, sample, i, tallies, progress, active, pristine, npu_args, post)
    for form in SYNC_FORMS:
        if form in active:
            run_against_sync(tallies[form], i, form, progress, lambda: F.SYNC_CALLS[form](op, pristine, "npu"),
                             post, CALLS)
    return True


def _run_forms(op, sample, i, tallies, progress, active, pristine, npu_args, post):
    """The forms compared with cpu."""
    if active & {"function", "backward"}:  # the backward differentiates the function form's calls
        reference = _run_function(op, sample, npu_args, i, tallies, progress, post, "backward" in active)
    else:
        cpu = observe(lambda: op.op(sample.input, *sample.args, **sample.kwargs), on_npu=False)
        reference = None if cpu.exc is not None else cpu.out
    if "method" in active:
        _run_form(tallies["method"], i, "method", progress,
                  lambda device: F.method_call(op, pristine, device), post)
    if "inplace" in active:
        _run_form(tallies["inplace"], i, "inplace", progress,
                  lambda device: F.inplace_call(op, pristine, device), post)
    if reference is None or F.out_call(op, pristine, "cpu", reference, "right shape") is None:
        return  # out= needs a result of tensors to shape its outputs after
    if "out" in active:
        _run_form(tallies["out"], i, "out (right shape)", progress,
                  lambda device: F.out_call(op, pristine, device, reference, "right shape"), post)
    if "out_resize" in active and i == 0:
        for case in F.RESIZE_CASES:
            _run_form(tallies["out_resize"], i, f"out_resize ({case})", progress,
                      lambda device: F.out_call(op, pristine, device, reference, case), post)


def _run_form(tally, i, where, progress, make_call, post):
    """Once on cpu, CALLS times on npu, each on fresh arguments; every npu call compared with cpu's."""
    progress(i, where.split(" ")[0], 0)
    cpu_call = make_call("cpu")
    cpu = observe(lambda: post(cpu_call()), on_npu=False)
    for k in range(1, CALLS + 1):
        progress(i, where.split(" ")[0], k)
        npu_call = make_call("npu")
        npu = observe(lambda: post(npu_call()), on_npu=True)
        tally.add(i, *compare_calls(cpu, npu, f"{where} call {k}"))


def _run_function(op, sample, npu_args, i, tallies, progress, post, backward):
    """The function form and its backward; returns cpu's result (the out= form's template) or None."""
    progress(i, "function", 0)
    cpu = observe(lambda: op.op(sample.input, *sample.args, **sample.kwargs), on_npu=False)
    npus = []
    for k, (inp, args, kwargs) in enumerate(npu_args, 1):
        progress(i, "function", k)
        npu = observe(lambda: op.op(inp, *args, **kwargs), on_npu=True)
        cpu_cmp, npu_cmp = _with_out(cpu, post(cpu.out)), _with_out(npu, post(npu.out))
        failures, bitwise, drew = compare_calls(cpu_cmp, npu_cmp, f"function call {k}")
        tallies["function"].add(i, failures, bitwise, drew)
        npus.append((npu, all(kind == WARNING for kind, _ in failures)))
    if backward and "backward" in tallies and cpu.exc is None:
        _run_backward(op, sample, npu_args, cpu, npus, i, tallies["backward"], progress)
    return None if cpu.exc is not None else cpu.out


def _with_out(call, out):
    if out is call.out:
        return call
    c = type(call)(**vars(call))
    c.out = out
    return c


def _run_backward(op, sample, npu_args, cpu, npus, i, tally, progress):
    try:
        outs = _differentiable_outputs(sample.output_process_fn_grad(cpu.out))
    except Exception:  # noqa: BLE001 - then the observed cpu backward below raises the same
        outs = []
    seed(SEED)  # drawn outside the observed calls: the grad_outputs are not the op's draws
    grads = [torch.randn_like(o.detach()) for o in outs]
    progress(i, "backward", 0)
    cpu_g = observe(lambda: _backward(sample.output_process_fn_grad, F.args_of(sample), cpu.out, grads),
                    on_npu=False)
    if cpu_g.exc is None and cpu_g.out is None:
        return  # nothing differentiable in this sample
    cpu_g.drew = cpu_g.drew or cpu.drew  # gradients of a forward that drew depend on its draws
    npu_grads = [g.to("npu") for g in grads]
    for k, ((npu, forward_ok), args) in enumerate(zip(npus, npu_args), 1):
        if not forward_ok:
            continue  # the forward's wrong result is already the function form's failure
        progress(i, "backward", k)
        npu_g = observe(lambda: _backward(sample.output_process_fn_grad, args, npu.out, npu_grads), on_npu=True)
        npu_g.drew = npu_g.drew or npu.drew
        tally.add(i, *compare_calls(cpu_g, npu_g, f"grad of call {k}"))


def _differentiable_outputs(out):
    return [t for t in tensors(out) if t.requires_grad and (t.is_floating_point() or t.is_complex())]


def _backward(output_process_fn_grad, args, out, grads):
    """Gradients of the sample's differentiable inputs for the given output ``out``."""
    outs = _differentiable_outputs(output_process_fn_grad(out))
    inputs = [t for t in tensors(args) if t.requires_grad]
    if not outs or not inputs:
        return None
    return torch.autograd.grad(outs, inputs, grads, allow_unused=True)


def _zero_values(out):
    """Uninitialized memory (empty*): only metadata is meaningful, so values are replaced by zeros."""
    if isinstance(out, torch.Tensor):
        with torch.no_grad():
            return torch.zeros_like(out)
    if isinstance(out, (list, tuple)):
        return type(out)(_zero_values(x) for x in out) if not hasattr(out, "_fields") else out
    return out
