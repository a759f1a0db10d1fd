"""PyTorch's OpInfo database (``op_db``) as a conformance suite for the npu device.

Every op's samples run on cpu and, copied, on npu, in every form the op defines (function, method,
in-place, out=, backward), twice per sample on npu, in both launch modes; results, gradients, errors,
warnings and output devices are compared, and samples that draw random numbers on metadata only. The
``inference`` and ``autocast`` forms (the function form inside ``torch.inference_mode()`` and under
``torch.autocast("npu")``) are compared bit for bit with the same npu call made synchronously. Each op
runs in a worker process so a crash is that op's failure, not the run's end. Modules: ``samples`` (fresh
argument copies per call), ``forms`` (the ways an op is called), ``observe`` (one call: result, warnings,
draws), ``compare`` (result comparison), ``sync_reference`` (the forms checked against a synchronous
run), ``execute`` (one op x dtype inside a worker), ``worker`` (the
worker process), ``pool`` (workers per launch mode, crash/timeout recovery), ``expected`` (the checked-in
expected-failure list), ``report`` (counts), ``run`` (command line), ``names`` (shared names).
"""
