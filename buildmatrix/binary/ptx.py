"""PTX text files: the ``.version`` (PTX ISA) and ``.target`` directives."""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass

from packaging.version import Version

from buildmatrix.arch import Arch, CodeKind, ComputeCapability, Suffix
from buildmatrix.binary.source import ByteSource, CorruptBinary

# Both directives precede any code (PTX ISA reference, "PTX Module Directives").
PTX_HEAD = 1 << 16
# The module's head as ptxas reads it (established with ptxas 13.0,
# tests/test_ptx_head.py): whitespace and C comments (``//`` to the end of the line,
# ``/* ... */`` unnested) between tokens, though not inside ``.version MAJOR.MINOR``,
# which comes first; then one or more ``.target`` directives, each a comma list of
# names, the first an SM. A ``.version`` or ``.target`` inside a comment is no directive.
# Besides SMs, ptxas 13.0 takes these target options, and refuses any other name
# ("Unsupported .target 'foo'"), ``map_f64_to_f32`` for every SM from 1.3 on, and the
# two texture modes together ("Conflicting .target option"). ``debug`` is accepted
# here: nvcc -G writes it, and ptxas then wants the debug sections that follow.
_OPTIONS = frozenset({b"texmode_unified", b"texmode_independent", b"debug"})
# The SMs a ``.target`` may name: those ptxas 13.0 knows (tests/test_ptx_targets_ptxas_
# refuses.py asks it for every two- and three-digit name) and every arch of
# buildmatrix/data/cuda.yaml (a newer release's SMs). ptxas refuses any other name
# ("Unsupported .target 'sm_85'"), and so does a driver's JIT: no GPU runs it.
_PLAIN = "10 11 12 13 20 21 30 32 35 37 50 52 53 60 61 62 70 72 75 80 82 86 87 88 89 90"
_PTXAS_13_0 = frozenset(
    [f"sm_{n}" for n in _PLAIN.split()]
    + ["sm_90a"]
    + [f"sm_{n}{s}" for n in (100, 101, 103, 110, 120, 121) for s in ("", "a", "f")]
)


def _known_sm(name: str) -> bool:
    from buildmatrix.cuda import load_cuda_facts

    return name in _PTXAS_13_0 or load_cuda_facts().arch_support(name) is not None


# The oldest ``.version`` each ``.target`` takes (PTX ISA reference, "Release Notes"
# and each target's "Target ISA notes"; ptxas 13.0 refuses an older one: "PTX .version
# 7.0 does not support .target sm_90"). Read off ptxas 13.0 for every target it knows
# and every ISA version (tests/test_ptx_isa_table.py compares the two exhaustively),
# except sm_70 and sm_88, which PTX ISA 6.0 and 9.0 introduce (the PTX ISA release
# notes) though ptxas 13.0 takes them from 5.1 and 7.3: the newer of the two is kept
# (fail closed). sm_82 is ptxas's alone (no release compiles for it). A target of a
# newer release (buildmatrix/data/cuda.yaml) needs the ISA of the first release that
# knows it.
_MIN_ISA_TEXT = """
    sm_10 sm_11 1.0; sm_12 sm_13 1.2; sm_20 sm_21 2.0; sm_30 3.0; sm_35 3.1;
    sm_32 sm_50 4.0; sm_37 sm_52 4.1; sm_53 4.2; sm_60 sm_61 sm_62 5.0; sm_70 6.0; sm_82 6.2;
    sm_72 6.1; sm_75 6.3; sm_80 7.0; sm_86 7.1; sm_87 7.4; sm_89 sm_90 7.8; sm_90a 8.0;
    sm_100 sm_100a sm_101 sm_101a 8.6; sm_120 sm_120a 8.7;
    sm_100f sm_101f sm_103 sm_103a sm_103f sm_120f sm_121 sm_121a sm_121f 8.8;
    sm_88 sm_110 sm_110a sm_110f 9.0
"""
MIN_ISA = {
    name: Version(row.split()[-1]) for row in _MIN_ISA_TEXT.split(";") for name in row.split()[:-1]
}
# The PTX ISA versions that exist up to ptxas 13.0's (9.0): ptxas refuses any other
# ("Unsupported .version 8.9"), as a driver's JIT does. A newer one is judged by the
# release that emits it (buildmatrix.jit), or as newer than any known.
_ISA_TEXT = "1.0-1.5 2.0-2.3 3.0-3.2 4.0-4.3 5.0-5.1 6.0-6.5 7.0-7.8 8.0-8.8 9.0-9.0"
ISA_VERSIONS = frozenset(
    Version(f"{major}.{minor}")
    for span in _ISA_TEXT.split()
    for major, low, high in [(span[0], int(span[2]), int(span[-1]))]
    for minor in range(low, high + 1)
)
_PTXAS_ISA = Version("9.0")


def min_isa(target: str) -> Version | None:
    """The oldest PTX ISA whose ``.target`` may name ``target`` (``sm_90a``); None
    where neither ptxas 13.0 nor the CUDA table knows it."""
    if target in MIN_ISA:
        return MIN_ISA[target]
    from buildmatrix.cuda import load_cuda_facts

    facts = load_cuda_facts()
    support = facts.arch_support(target)
    first = facts.toolkit(support.first) if support is not None else None
    return first.ptx_isa if first is not None else None


def _head_refusal(sm: re.Match[str], isa: Version) -> str | None:
    """Why ptxas refuses a head of ``.version isa`` and ``.target`` ``sm`` (None: it
    takes it)."""
    if isa <= _PTXAS_ISA and isa not in ISA_VERSIONS:
        return f"PTX ISA {isa} does not exist (ptxas: 'Unsupported .version {isa}')"
    need = min_isa(sm[0])
    if need is None or isa < need:
        floor = f"; {sm[0]} needs {need} or later" if need is not None else ""
        return (
            f"PTX .version {isa} does not support .target {sm[0]}{floor} (PTX ISA "
            "reference, target ISA notes)"
        )
    return None


_TEXMODES = frozenset({b"texmode_unified", b"texmode_independent"})
_GAP = re.compile(rb"(?:[ \t\r\n]+|//[^\n]*|/\*.*?\*/)*", re.S)
_VERSION = re.compile(rb"\.version[ \t]+(\d+)\.(\d+)(?![\w$.])")  # no comment or newline inside
_TARGET = re.compile(rb"\.target(?![\w$])")
_NAME = re.compile(rb"[A-Za-z_$%][\w$]*")
_ADDRESS_SIZE = re.compile(rb"\.address_size(?![\w$])")
# A PTX integer constant (PTX ISA reference, "Integer Constants"): hexadecimal, octal,
# binary or decimal, an optional U; ptxas takes ``.address_size 0x40`` as 64.
_INTEGER = re.compile(rb"(0[xX][0-9a-fA-F]+|0[bB][01]+|0[0-7]*|[1-9][0-9]*)U?(?![\w$.])")
# The head's directives: another of them after the head is a syntax error to ptxas.
_HEAD_DIRECTIVE = re.compile(rb"\.(?:version|target|address_size)(?![\w$])")
_SM = re.compile(r"sm_(\d{2,3})([af]?)")


_NVVM_HEADER = b"// Generated by NVIDIA NVVM Compiler"


def looks_like_ptx(head: bytes, path: str) -> bool:
    """PTX by content, not only by name: nvcc's PTX starts with the NVVM banner within
    its first lines, hand-written PTX with a ``.version`` directive after any comments;
    ``.ptx`` in any case counts too (kernels.PTX, or no extension at all, are still
    PTX)."""
    text = head.lstrip()
    return (
        path.lower().endswith(".ptx")
        or _VERSION.match(head, _skip(head, 0)) is not None
        or (text.startswith(b"//") and _NVVM_HEADER in head)
    )


def ptx_undecided(head: bytes) -> bool:
    """Whether more of a text whose first bytes are ``head`` could still make
    :func:`looks_like_ptx` say yes: ``head`` is whitespace and comments so far (a
    licence header, nvcc's banner), ending inside one or at a ``.version`` not yet
    whole. The image readers then read further (buildmatrix.binary.scan.read_head),
    as cuModuleLoad takes PTX by content whatever its name."""
    rest = head[_skip(head, 0) :]
    if rest in (b"", b"/") or rest.startswith(b"/*"):  # _GAP stops at an unclosed /*
        return True
    return b"\n" not in rest and (rest.startswith(b".version") or b".version".startswith(rest))


def _skip(head: bytes, p: int) -> int:
    """Where the next token after ``p`` starts (whitespace and comments skipped)."""
    gap = _GAP.match(head, p)
    return gap.end() if gap else p


def ptx_directives(head: bytes) -> tuple[Arch, Version] | None:
    """The ``.target`` arch (as ``compute_XY``) and ``.version`` of PTX text whose
    first bytes are ``head``; None when ptxas refuses its head (:func:`head_refusal`
    says why)."""
    return _read_directives(head).found


def head_refusal(head: bytes) -> str:
    """Why ptxas refuses the head of the PTX text ``head`` ("" where it takes it)."""
    return _read_directives(head).why


def directives_settled(head: bytes) -> bool:
    """Whether ``head``, the start of a PTX text, already shows its directives: read
    whole, with the token after them in full view, so no longer text that starts
    with ``head`` reads otherwise (a compressed entry's head is decoded a little at
    a time: buildmatrix.binary.fatbin)."""
    read = _read_directives(head)
    end = read.end
    return read.found is not None and end + 16 <= len(head) and not head.startswith(b"/*", end)


@dataclass(frozen=True)
class _Head:
    """ptx_directives's answer, where the reading stopped (the next token) and, where
    the answer is None, why."""

    found: tuple[Arch, Version] | None
    end: int
    why: str = ""


_NO_HEAD = "no '.version' then '.target sm_XY' as ptxas reads them"


def _read_directives(head: bytes) -> _Head:
    """The head as ptxas 13.0 reads it: ``.version``, then one or more ``.target``
    directives, then at most one ``.address_size`` (PTX ISA reference, "PTX Module
    Directives"; every rule below is ptxas's: tests/test_ptx_head.py,
    tests/test_ptx_isa_table.py)."""
    number = _VERSION.match(head, _skip(head, 0))
    if number is None:
        return _Head(None, 0, _NO_HEAD)
    sms: list[re.Match[str]] = []
    texmodes: set[bytes] = set()
    p = _skip(head, number.end())
    while target := _TARGET.match(head, p):
        p = target.end()
        while name := _NAME.match(head, _skip(head, p)):
            sm = _SM.fullmatch(name[0].decode())
            if sm is not None and not _known_sm(sm[0]):
                return _Head(None, p, f"ptxas: 'Unsupported .target {sm[0]}'")
            if sm is None and (not sms or name[0] not in _OPTIONS):
                # ptxas: "Target architecture not defined", "Unsupported .target",
                # "map_f64_to_f32 is not supported with SM 1.3 or higher"
                return _Head(None, p, f"ptxas refuses '.target {name[0].decode()}' there")
            if name[0] in _TEXMODES:
                texmodes.add(name[0])
            sms += [sm] if sm else []
            p = _skip(head, name.end())
            if head[p : p + 1] != b",":
                break
            p += 1
        p = _skip(head, p)
    if len(sms) != 1 or len(texmodes) > 1:
        # no SM, or several (ptxas takes the last; nvcc never writes two), or both
        # texture modes (ptxas: "Conflicting .target option")
        return _Head(None, p, f"{_NO_HEAD}: one SM, options ptxas takes")
    isa = Version(f"{int(number[1])}.{int(number[2])}")
    why = _head_refusal(sms[0], isa)
    if why is None:
        p, why = _address_size(head, p, isa)
    if why is None and (
        _HEAD_DIRECTIVE.match(head, p) or head[p : p + 1] not in (b".", b"", b"\0")
    ):
        # every statement of a module's body is a directive (.visible, .entry, .global,
        # .file, ...), or the text ends (a fatbinary's PTX ends at a NUL: cuBLAS 12.8
        # holds modules that are a head alone); a head directive once more, or anything
        # else, is ptxas's "Parsing error ... syntax error"
        why = "no directive after the head, or a head directive once more (ptxas: syntax error)"
    if why is not None:
        return _Head(None, p, why)
    cc = ComputeCapability.from_number(int(sms[0][1]))
    return _Head((Arch(cc, CodeKind.PTX, Suffix(sms[0][2])), isa), p)


def _address_size(head: bytes, p: int, isa: Version) -> tuple[int, str | None]:
    """Past an ``.address_size`` at ``p``, if any: (the next token, why ptxas refuses
    it or None). ptxas 13.0 takes only 64 ("32-Bit compilation is no longer
    supported"; 32-bit addressing "is not supported on sm_90 or higher
    architectures"; CUDA 12.0 removed 32-bit compilation), and the directive only
    from PTX ISA 2.3 on; left out, ptxas compiles the module all the same."""
    directive = _ADDRESS_SIZE.match(head, p)
    if directive is None:
        return p, None
    value = _INTEGER.match(head, _skip(head, directive.end()))
    if value is None:
        return p, "an '.address_size' without a number (ptxas: syntax error)"
    p = _skip(head, value.end())
    digits = value[1].decode()
    base = {"0x": 16, "0X": 16, "0b": 2, "0B": 2}.get(digits[:2], 8 if digits[0] == "0" else 10)
    size = int(digits[2:] if base in (2, 16) else digits, base)
    if isa < Version("2.3"):
        return p, "'.address_size' needs PTX ISA 2.3 or later (ptxas)"
    if size == 32:
        return p, "'.address_size 32': ptxas and the driver's JIT compile no 32-bit PTX"
    if size != 64:
        return p, f"'.address_size {size}': ptxas takes only 32 or 64"
    return p, None


def ptx_target(src: ByteSource) -> tuple[Arch, Version]:
    """The ``compute_XY`` arch and PTX ISA version of a PTX text file."""
    read = _read_directives(src.read_at(0, min(src.size, PTX_HEAD)))
    if read.found is None:
        raise CorruptBinary(
            f"{src.name}: PTX whose head ptxas refuses ({read.why}; the first "
            f"{PTX_HEAD // 1024} KiB read as ptxas reads them); no JIT compiler accepts it."
        )
    return read.found


# How specific a suffix is: ``a`` code runs on one SM, ``f`` on a family, none on all newer.
_RANK = {Suffix.NONE: 0, Suffix.FAMILY: 1, Suffix.ARCH: 2}


def checked_ptx_entry(
    src: ByteSource, *, header: Arch, isa: Version, name: str
) -> tuple[Arch, Version]:
    """The arch and PTX ISA to judge an uncompressed fatbinary PTX entry by, whose
    text is ``src``: the driver picks the entry by its header's arch, then its JIT
    compiles the text, which ptxas refuses for a GPU older than the text's
    ``.target`` and a driver refuses for a ``.version`` newer than it knows. So a text
    ``.target`` other than the header's arch, or more specific (``a``/``f``) than it,
    is refused (:class:`CorruptBinary`, the check fails closed); of the two ISA
    versions, the newer is kept (docs/security.md, "Device code that tries not to be
    seen")."""
    read = _read_directives(src.read_at(0, min(src.size, PTX_HEAD)))
    if read.found is None:
        raise CorruptBinary(
            f"{name}: PTX entry for {header} whose head ptxas refuses ({read.why}; the "
            f"first {PTX_HEAD // 1024} KiB read as ptxas reads them); no JIT compiler "
            "accepts it."
        )
    text, text_isa = read.found
    if text.cc != header.cc or _RANK[text.suffix] > _RANK[header.suffix]:
        raise CorruptBinary(
            f"{name}: the fatbinary entry header says {header} but the PTX text says "
            f"'.target sm_{text.cc.number}{text.suffix.value}'; the JIT compiles the text, "
            "so the file is refused rather than judged by either. Rebuild it with nvcc."
        )
    return header, max(isa, text_isa)


# A PTX module's kernels: each ``.entry NAME`` directive, after any linkage directives
# (PTX ISA reference, "Kernel and Function Directives: .entry" and "Linking
# Directives: .extern, .visible, .weak"). Comments are skipped as ptxas skips them
# (``//`` to the end of the line, ``/* ... */``, an unterminated one to the end of the
# text), and so are strings (``.file`` names, ``.pragma "nounroll"``; ptxas knows no
# escape in them: ``"a\"`` ends at its second quote): a ``.entry`` in either is no
# directive. nvcc writes no ``/* */`` comment, and a line comment or a
# string ends with its line, so only the lines of the directives are looked at (a
# large PTX text is read at memory speed); a text with a ``/*`` has its comments and
# strings blanked out first (about 60 MB/s).
_NOT_CODE = re.compile(rb'//[^\n]*|/\*.*?(?:\*/|\Z)|"[^"\n]*"?', re.S)
# The look-behind (no name or directive just before) is checked apart: at the start
# of the pattern it would be tried at every byte, 20 times slower.
_DIRECTIVE = re.compile(rb"\.(entry|visible|weak|extern)(?![\w$])")
_WORD = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_$.%")
_BETWEEN = re.compile(rb"(?:[ \t\r\n]+|//[^\n]*)*")


class _Lines:
    """Whether a place of a text without block comments is outside every line comment
    and string of its line. Each line's comments and strings are found once, however
    many directives it holds (ptxas takes a whole module on one line): linear time."""

    def __init__(self, text: bytes) -> None:
        self._text = text
        self._line = (0, -1)  # [start, end) of the line whose spans are kept
        self._starts: list[int] = []
        self._ends: list[int] = []

    def in_code(self, at: int) -> bool:
        """Asked in increasing order of ``at``: each line is looked at once."""
        text = self._text
        if not self._line[0] <= at < self._line[1]:
            start = text.rfind(b"\n", max(self._line[1], 0), at) + 1
            end = text.find(b"\n", at)
            end = len(text) if end < 0 else end
            self._line = (start, end)
            if text.find(b"//", start, end) < 0 and text.find(b'"', start, end) < 0:
                spans = []
            else:
                spans = [m.span() for m in _NOT_CODE.finditer(text, start, end)]
            self._starts = [s for s, _ in spans]
            self._ends = [e for _, e in spans]
        i = bisect_right(self._starts, at) - 1
        return i < 0 or at >= self._ends[i]


def ptx_kernels(text: bytes) -> tuple[str, ...]:
    """The kernels a PTX module defines: the names of its ``.entry`` directives, in
    order, once each. An ``.extern .entry`` only declares a kernel another module
    defines (PTX ISA reference, "Linking Directives: .extern"), so it defines none
    here: the JIT-compiled module cannot launch it."""
    if b"/*" in text:
        text = _NOT_CODE.sub(b" ", text)
    names: dict[str, None] = {}
    linkage: set[bytes] = set()  # the directives just before the next one
    end = 0
    lines = _Lines(text)
    for m in _DIRECTIVE.finditer(text):
        if (m.start() and text[m.start() - 1] in _WORD) or not lines.in_code(m.start()):
            continue
        if _BETWEEN.fullmatch(text, end, m.start()) is None:
            linkage = set()  # something else came between: they were not its linkage
        end = m.end()
        if m[1] != b"entry":
            linkage.add(m[1])
            continue
        name = _NAME.match(text, _BETWEEN.match(text, end).end())  # type: ignore[union-attr]
        if name is not None and b"extern" not in linkage:
            names[name[0].decode("ascii")] = None
        linkage = set()
    return tuple(names)
