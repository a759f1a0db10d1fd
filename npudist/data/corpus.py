"""The default training corpus: docstrings of the Python standard library, gathered at first use.

Every Python installation ships this text, so a training run needs no download. The text is written once
to a cache file (atomically, so concurrent ranks cannot see a half-written file) and then read like any
user-supplied corpus. Modules are visited in sorted order and only pure-Python ones are imported, so the
corpus is the same on every rank and every run with the same Python version. The text is gathered in a fresh
interpreter: in a process that has imported other packages, the standard library's classes can carry methods
those packages added or replaced, and the text (and every loss trained on it) would depend on what the caller
imported before.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib
import inspect
import io
import os
import subprocess
import sys
import tempfile
import warnings

# Standard-library modules that are safe to import (no GUI, no side effects on import), in a fixed order.
_MODULES = (
    "abc argparse ast base64 bisect calendar collections contextlib copy csv dataclasses datetime decimal "
    "difflib enum fnmatch fractions functools getopt gettext glob graphlib gzip hashlib heapq hmac html "
    "inspect io ipaddress itertools json logging mailbox mimetypes numbers operator optparse os pathlib "
    "pickle pprint queue random re sched secrets shlex shutil smtplib socket statistics string struct "
    "subprocess tarfile tempfile textwrap threading timeit tokenize tomllib traceback types typing "
    "unittest urllib.parse uuid warnings weakref zipfile zoneinfo"
).split()

DEFAULT_MAX_BYTES = 1_500_000


def _docstrings(module) -> list[str]:
    """Module, class, function and method docstrings of one module, in definition order."""
    out = []
    doc = inspect.getdoc(module)
    if doc:
        out.append(doc)
    for name, obj in sorted(vars(module).items()):
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isclass(obj) or inspect.isfunction(obj):
            doc = inspect.getdoc(obj)
            if doc:
                out.append(f"{name}: {doc}")
            if inspect.isclass(obj):
                for mname, member in sorted(vars(obj).items()):
                    if mname.startswith("_") or not inspect.isfunction(member):
                        continue
                    mdoc = inspect.getdoc(member)
                    if mdoc:
                        out.append(f"{name}.{mname}: {mdoc}")
    return out


def build_stdlib_corpus(max_bytes: int = DEFAULT_MAX_BYTES) -> str:
    """Concatenate stdlib docstrings (one blank line apart) up to ``max_bytes`` UTF-8 bytes."""
    parts, total, seen = [], 0, set()
    for modname in _MODULES:
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                warnings.simplefilter("ignore")
                module = importlib.import_module(modname)
        except ImportError:
            continue
        for doc in _docstrings(module):
            if doc in seen:
                continue
            seen.add(doc)
            size = len(doc.encode("utf-8")) + 2
            if total + size > max_bytes:
                return "\n\n".join(parts) + "\n"
            parts.append(doc)
            total += size
    return "\n\n".join(parts) + "\n"


def _default_cache_dir() -> str:
    return os.environ.get("NPUDIST_DATA_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "npudist")


def default_corpus_path(cache_dir: str | None = None, max_bytes: int = DEFAULT_MAX_BYTES) -> str:
    """Path of the stdlib-docstring corpus, generating it on first use. The file name carries the Python
    version and size so a different interpreter never reuses another's text."""
    cache_dir = cache_dir or _default_cache_dir()
    tag = hashlib.sha1(f"fresh|{sys.version}|{max_bytes}|{' '.join(_MODULES)}".encode()).hexdigest()[:10]
    path = os.path.join(cache_dir, f"stdlib_docstrings_{tag}.txt")
    if os.path.exists(path):
        return path
    os.makedirs(cache_dir, exist_ok=True)
    text = _build_in_fresh_interpreter(max_bytes)
    fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=".corpus_")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)  # atomic: another rank generating the same text concurrently is harmless
    return path


def _build_in_fresh_interpreter(max_bytes: int) -> str:
    """build_stdlib_corpus run by this file in an isolated interpreter (-I: no user site, no PYTHONPATH), so the
    text does not depend on what the calling process imported (see the module docstring)."""
    res = subprocess.run([sys.executable, "-I", os.path.abspath(__file__), str(max_bytes)],
                         capture_output=True, timeout=300)
    if res.returncode != 0:
        raise RuntimeError(f"building the stdlib corpus failed: {res.stderr.decode(errors='replace')[-2000:]}")
    return res.stdout.decode("utf-8")


if __name__ == "__main__":
    sys.stdout.buffer.write(build_stdlib_corpus(int(sys.argv[1])).encode("utf-8"))

