import npudist  # noqa: F401  (registers the npu device and the npu operators)
