"""Names shared by the worker side and the torch-free runner side (pool, expected list, report)."""

FORMS = ("function", "method", "inplace", "out", "out_resize", "backward")  # ways an op is called (forms.py)
MODES = ("async", "blocking")  # launch modes: the device's default, and ASCEND_LAUNCH_BLOCKING=1
