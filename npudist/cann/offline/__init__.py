"""Offline models of npudist's emulated CANN: ``atc`` converts ONNX into a ``.om`` file (npudist's own format,
:mod:`npudist.cann.offline.omfile`), pyACL's ``acl.mdl`` loads and executes it (docs/cann.md, "Offline models").

* :mod:`.omfile` — the file format: write, read and validate.
* :mod:`.ops` — the ONNX operators the converted graphs use, as torch functions, and the graph executor.
* :mod:`.convert` — ONNX → graph (lazy ``import onnx``), static shapes, constant folding.
"""
