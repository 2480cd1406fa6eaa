"""C++ symbol names (Itanium ABI, what nvcc emits for kernels) demangled by the C++
runtime's own demangler: ``__cxa_demangle`` of libstdc++ (GCC's ``libiberty/cp-demangle.c``,
which ``c++filt`` and ``cuobjdump`` print through). Names that are not mangled are
returned as they are; a mangled name the demangler refuses, or a machine without
libstdc++, gives None, and callers treat the name as unread.

The demangler prints a back-reference by printing what it names again, so a short
name whose references nest prints 2^N bytes (docs/security.md, "Limits"). A name is
demangled only where :func:`buildmatrix.binary.mangled_size.demangled_bound` bounds
its text within :func:`output_limit` (or, where that reader does not read the name,
where the name holds no back-reference); otherwise it gives None, as a name the
demangler refuses, and its callers treat it as unread (docs/check.md)."""

from __future__ import annotations

import functools
import re
from typing import Any

from buildmatrix.binary.mangled_size import TooLarge, Unreadable, demangled_bound

_MAX_NAME = 1 << 16  # longer names are not demangled (a kernel name is far shorter)
_MIN_OUTPUT = 1 << 16  # demangled text allowed to any name, in bytes
_PER_BYTE = 128  # and per byte of the mangled name (real names bound within 88x)
# what may print something twice: S<seq-id>_, T<n>_ (and TL), pack expansions
_BACKREF = re.compile(r"S[0-9A-Z]*_|T[0-9A-Z_]|Dp|s[ZP]")


def output_limit(mangled_bytes: int) -> int:
    """The most demangled text a name of ``mangled_bytes`` bytes may print."""
    return max(_MIN_OUTPUT, _PER_BYTE * mangled_bytes)


@functools.cache
def _cxa_demangle() -> tuple[Any, Any] | None:
    # ctypes (and ctypes.util: subprocess, shutil, tempfile) only where a name is
    # demangled: inspect reads no kernel name
    import ctypes.util

    name = ctypes.util.find_library("stdc++") or "libstdc++.so.6"
    try:
        lib = ctypes.CDLL(name)
        libc = ctypes.CDLL(None)
        demangle, free = lib.__cxa_demangle, libc.free
    except (OSError, AttributeError):
        return None
    demangle.restype = ctypes.c_void_p
    demangle.argtypes = [
        ctypes.c_char_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_int),
    ]
    free.argtypes = [ctypes.c_void_p]
    free.restype = None
    return demangle, free


@functools.lru_cache(maxsize=1 << 16)
def demangle(name: str) -> str | None:
    """``name`` demangled; as it is when it is not a mangled name (``_Z`` prefix)."""
    if not name.startswith("_Z"):
        return name
    funcs = _cxa_demangle()
    raw = name.encode("utf-8", "surrogateescape")
    if funcs is None or len(raw) > _MAX_NAME or b"\0" in raw:
        return None
    limit = output_limit(len(raw))
    try:
        demangled_bound(name, limit)
    except TooLarge:
        return None  # its text would pass the limit: unread
    except Unreadable:
        if _BACKREF.search(name, 2):
            return None  # not bounded, and may print a part again
    text = _call(funcs, raw)
    return text if text is None or len(text) <= limit else None


def _call(funcs: tuple[Any, Any], raw: bytes) -> str | None:
    """``__cxa_demangle`` itself, on a name whose text is bounded."""
    import ctypes  # loaded already by _cxa_demangle

    demangle_fn, free = funcs
    status = ctypes.c_int(1)
    out = demangle_fn(raw, None, None, ctypes.byref(status))
    if not out:
        return None
    try:
        text = ctypes.string_at(out)
    finally:
        free(out)
    return text.decode("utf-8", "replace") if status.value == 0 else None
