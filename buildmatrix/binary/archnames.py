"""Kernel names that name a GPU architecture (``cutlass_70_simt_*``, ``Volta_*``).

Pure. A library whose kernels are named so picks them by the GPU's compute
capability; the per-translation-unit rule reads it as a sign of that
(buildmatrix.binary.report.dispatch_signs; docs/check.md, "Per translation unit"), and the
scan uses it to decide which compressed cubins must be read
(buildmatrix.binary.kernels).
"""

from __future__ import annotations

import re

from buildmatrix.binary.demangle import demangle

# A kernel named for a GPU architecture: a whole token of its demangled name is a
# generation's name, or an SM number (sm80, sm_90a, SM100) or a CUTLASS arch tag
# (cutlass_70_...) spelled as tokens. Kernel names of NVIDIA's libraries carry them
# where a kernel is one GPU's variant (cuBLAS 13's sm_75-only container holds
# cutlass_70_simt_* kernels, its sm_120-only one *_forwardCompat_* kernels tagged
# cutlass_80; cuDNN 9's Volta_*). Tokens: the identifiers of the demangled name
# (buildmatrix.binary.demangle), each cut at underscores, at digit runs and at camelCase
# humps; so voltage_update, capturing, chopper, parallelism64 or prism100 name nothing.
_GENERATIONS = frozenset({"volta", "turing", "ampere", "hopper", "blackwell"})
_TAGS = frozenset({"sm", "cutlass"})  # followed by the SM number: sm_90a, cutlass_70_
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
_KEYS = (*_GENERATIONS, *_TAGS)


def named_for_architecture(name: str) -> bool:
    """Whether a whole token of the kernel's demangled name names a GPU architecture
    (a name that does not demangle names nothing). Tokens are read in one pass; two
    are of one identifier where only underscores lie between them."""
    lowered = name.lower()
    if not any(key in lowered for key in _KEYS):  # every identifier is in the name as is
        return False
    text = demangle(name)
    if text is None:
        return False
    previous, end = "", -1
    for m in _WORD.finditer(text):
        word = m.group().lower()
        if word in _GENERATIONS:
            return True
        joined = not text[end : m.start()].strip("_")
        if previous in _TAGS and joined and word.isdigit() and 2 <= len(word) <= 3:
            return True
        previous, end = word, m.end()
    return False
