"""Names shared by the worker side and the torch-free runner side (pool, expected list, report)."""

# Ways an op is called (forms.py). The first six are compared with the same call on cpu; the SYNC_FORMS with
# the same npu call run synchronously (task-queue level 0) in the same worker, bit for bit.
SYNC_FORMS = ("inference", "autocast")
FORMS = ("function", "method", "inplace", "out", "out_resize", "backward") + SYNC_FORMS
MODES = ("async", "blocking")  # launch modes: the device's default, and ASCEND_LAUNCH_BLOCKING=1
