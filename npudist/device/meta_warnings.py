"""Python warnings raised by a Meta kernel while the npu op path infers an op's outputs are not the caller's.

The op path (docs/op_path.md) runs an op's Meta kernel on meta stand-ins once per signature to learn its
outputs; the CPU kernel, which runs next, decides the result and its warnings. Python meta kernels
(torch._refs, torch._meta_registrations) may warn during that inference where the CPU kernel does not: an
in-place op whose other arguments do not broadcast to ``self`` warns about resizing ``self``, then raises
(CPU only raises). c10's warning handler, which the op path uses for C++ warnings, never sees Python
warnings, and Python offers no per-thread filter, so this module wraps the one function every Python
warning passes through before it is shown or recorded, ``warnings._showwarnmsg`` (the C accelerator calls
it too), and drops a warning while the calling thread is inside the inference (``_C._in_meta_inference``).
A patch of the standard library, unavoidable for that reason; installed once, by npudist.device, and a no-op
outside the inference.
"""
import warnings

from npudist import _C


def install() -> None:
    show = warnings._showwarnmsg
    if getattr(show, "npudist_meta_filter", False):
        return

    def _showwarnmsg(msg):
        if _C._in_meta_inference():
            return
        show(msg)

    _showwarnmsg.npudist_meta_filter = True
    warnings._showwarnmsg = _showwarnmsg
