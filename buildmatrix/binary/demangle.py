"""C++ symbol names (Itanium ABI, what nvcc emits for kernels) demangled by the C++
runtime's own demangler: ``__cxa_demangle`` of libstdc++ (GCC's ``libiberty/cp-demangle.c``,
which ``c++filt`` and ``cuobjdump`` print through). Names that are not mangled are
returned as they are; a mangled name the demangler refuses, or a machine without
libstdc++, gives None, and callers treat the name as unread."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any

_MAX_NAME = 1 << 16  # longer names are not demangled (a kernel name is far shorter)


@functools.cache
def _cxa_demangle() -> tuple[Any, Any] | None:
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
