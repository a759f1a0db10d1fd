"""``torch_npu._C``: the names of torch_npu's C extension that client code imports (only those; the
extension itself does not exist here: npudist's device and hccl backend are its own C++ modules)."""
