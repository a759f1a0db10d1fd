"""npudist's emulated CANN toolkit home: what Ascend code finds beneath torch_npu when no real CANN is configured.

``home/`` is laid out as ``$ASCEND_HOME_PATH`` of an Ascend toolkit (``include/acl/``, ``lib64/libascendcl.so``,
``python/site-packages/acl``, an ``ascend_toolkit_install.info``); ``environment.py`` points the process at it,
``build.py`` builds its libraries, ``smi.py`` is ``npu-smi``. docs/cann.md.
"""
