"""PyTorch's OpInfo database (``op_db``) as a conformance suite for the npu device.

Every op's samples run on cpu and, copied, on npu; results, gradients, errors and output devices are
compared. Each op runs in a worker process so a crash is that op's failure, not the run's end.
Modules: ``compare`` (result comparison), ``execute`` (one op x dtype inside a worker), ``worker``
(the worker process), ``pool`` (workers, crash/timeout recovery), ``expected`` (the checked-in
expected-failure list), ``report`` (counts), ``run`` (command line).
"""
