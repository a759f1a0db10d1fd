"""``atc``: npudist's offline model converter, CANN's ``atc`` command line for ONNX models.

    atc --model=net.onnx --framework=5 --output=net --soc_version=Ascend910B [--input_shape="x:1,3,224,224"]

writes ``net.om`` in npudist's own offline-model format (npudist/cann/offline/omfile.py; not Huawei's
undocumented binary format), which the emulated pyACL's ``acl.mdl`` loads and executes (docs/cann.md). Errors
print ``ATC run failed`` and an error-code line (``E10001`` argument, ``E19999`` model) and exit 1.
"""
import os
import sys

USAGE = """usage: atc --model=<model.onnx> --framework=5 --output=<path without .om> --soc_version=<SoC>
           [--input_shape="name:d1,d2,...;name2:..."] [--input_format=NCHW|ND] [--log=<level>]
           [--precision_mode=<mode>] [--mode=0]

npudist's emulated ATC: converts an ONNX model (framework 5) into an npudist offline model (<output>.om)
that the emulated pyACL (acl.mdl) loads. Only ONNX is supported; the .om is npudist's own format."""

_FRAMEWORKS = {"0": "Caffe", "1": "MindSpore", "3": "TensorFlow", "5": "ONNX"}
_KNOWN = {"model", "framework", "output", "soc_version", "input_shape", "input_format", "log", "precision_mode",
          "mode", "help", "h"}


class AtcError(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def _bad(value, parameter, reason):
    return AtcError("E10001", f"Value [{value}] for parameter [--{parameter}] is invalid. Reason: {reason}")


def parse_args(argv):
    args = {}
    it = iter(argv)
    for arg in it:
        if not arg.startswith("-"):
            raise _bad(arg, "(positional)", "atc takes --name=value arguments only")
        key, sep, value = arg.lstrip("-").partition("=")
        if key not in _KNOWN:
            raise _bad(arg, key, "unknown parameter (npudist's atc knows --" + ", --".join(sorted(_KNOWN - {"h"}))
                       + ")")
        if key in ("help", "h"):
            args["help"] = "1"
            continue
        if not sep:
            value = next(it, None)
            if value is None:
                raise _bad("", key, "the parameter needs a value")
        args[key] = value
    return args


def run(argv):
    args = parse_args(argv)
    if "help" in args:
        print(USAGE)
        return None
    for required in ("model", "framework", "output", "soc_version"):
        if not args.get(required):
            raise _bad(args.get(required, ""), required, "the parameter is required")
    if args.get("mode", "0") != "0":
        raise _bad(args["mode"], "mode", "npudist's atc only converts models (--mode=0)")
    if args["framework"] != "5":
        name = _FRAMEWORKS.get(args["framework"])
        raise _bad(args["framework"], "framework", f"{name} models are not supported by npudist's atc; only ONNX "
                   "(5)" if name else "the value must be one of 0 (Caffe), 1 (MindSpore), 3 (TensorFlow), 5 (ONNX), "
                   "and npudist's atc converts only 5 (ONNX)")
    if not os.path.isfile(args["model"]):
        raise _bad(args["model"], "model", "the model file does not exist or is not a file")
    if not args["soc_version"].startswith("Ascend"):
        raise _bad(args["soc_version"], "soc_version", "expected an Ascend SoC name such as Ascend910B")
    fmt = args.get("input_format", "NCHW")
    if fmt not in ("NCHW", "ND", "NCDHW"):
        raise _bad(fmt, "input_format", "npudist's atc keeps the ONNX layout: NCHW, NCDHW or ND")
    out_dir = os.path.dirname(os.path.abspath(args["output"]))
    if not os.path.isdir(out_dir):
        raise _bad(args["output"], "output", f"the directory {out_dir} does not exist")

    from npudist.cann.offline import convert, omfile

    try:
        graph, weights = convert.convert(args["model"], args.get("input_shape"), args["soc_version"])
    except convert.ConvertError as e:
        raise AtcError(e.code, str(e)) from None
    graph["input_format"] = fmt
    path = args["output"] + ".om"
    try:
        omfile.write(path, graph, weights)
    except OSError as e:
        raise _bad(args["output"], "output", f"cannot write {path}: {e.strerror}") from None
    return path


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        path = run(argv)
    except AtcError as e:
        code, message = e.code, str(e)
    except Exception as e:  # a failure of atc itself: reported as ATC reports its inner errors, no traceback
        code, message = "E19999", f"Inner Error! {type(e).__name__}: {e}"
    else:
        if path:
            print("ATC run success, welcome to the next use.")
        return 0
    print("ATC run failed, Please check the detail log, Try 'atc --help' for more information")
    print(f"{code}: {message}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
