"""An upper bound on the length of a mangled C++ name's demangled text, read from the
mangled name alone (Itanium C++ ABI, "Mangling": ``<encoding>``, ``<name>``,
``<type>``, ``<template-args>``, ``<substitution>``, ``<template-param>``).

A demangler prints a back-reference (``S<seq-id>_``, ``T<n>_``) by printing what it
refers to again (GCC's ``libiberty/cp-demangle.c``, ``d_print_comp``), so a 200-byte
name whose references nest prints 2^N bytes, and ``__cxa_demangle`` takes its time
and memory doing so (docs/security.md, "Limits"). This reader walks the grammar once
and bounds each component's printed length; a reference counts as the largest
component read before it, whatever it names, so the bound holds even where this
reader numbers the substitution table differently from the demangler. It stops as
soon as the bound passes the limit. Constructs it does not read (expressions,
special names) raise :class:`Unreadable`; :mod:`buildmatrix.binary.demangle`
decides what then.
"""

from __future__ import annotations

_BUILTIN = frozenset("vwbcahstijlmxynofdegz")  # <builtin-type>, one letter
_SEP = 8  # printed separators around one component: "::", ", ", "<>", "()", " const"
_STD = 128  # Sa, Sb, Ss, Si, So, Sd: at most "std::basic_iostream<char, ...> >"
_MAX_DEPTH = 256


class Unreadable(Exception):
    """The name uses a construct this reader does not bound."""


class TooLarge(Exception):
    """The demangled text would be longer than the limit."""


def demangled_bound(name: str, limit: int) -> int:
    """An upper bound on ``len(demangle(name))`` for a ``_Z`` name; raises
    :class:`TooLarge` once it passes ``limit``, :class:`Unreadable` for what this
    reader does not read."""
    reader = _Reader(name, limit)
    reader.expect("_Z")
    size = reader.encoding()
    if reader.i < len(name):
        if name[reader.i] != ".":  # a clone suffix (.constprop.0) is printed as is
            raise Unreadable(name[reader.i :])
        size += 2 * (len(name) - reader.i)
    return reader.note(size)


class _Reader:
    def __init__(self, s: str, limit: int) -> None:
        self.s, self.i, self.limit = s, 0, limit
        self.biggest = 0  # the largest component read so far: what a reference may print
        self.pack = 1  # the most arguments of a template argument pack (J...E) so far
        self.depth = 0

    def peek(self, n: int = 1) -> str:
        return self.s[self.i : self.i + n]

    def take(self, text: str) -> bool:
        if self.s.startswith(text, self.i):
            self.i += len(text)
            return True
        return False

    def expect(self, text: str) -> None:
        if not self.take(text):
            raise Unreadable(f"expected {text!r} at {self.i}")

    def note(self, size: int) -> int:
        if size > self.limit:
            raise TooLarge
        self.biggest = max(self.biggest, size)
        return size

    def number(self) -> int:
        start = self.i
        while self.peek().isdigit():
            self.i += 1
        if start == self.i:
            raise Unreadable(f"expected a number at {start}")
        return int(self.s[start : self.i])

    def reference(self) -> int:
        """``S<seq-id>_`` or ``T<n>_``, past the letter: the largest component so far."""
        while self.peek().isdigit() or self.peek().isupper():
            self.i += 1
        self.expect("_")
        return self.biggest

    def enter(self) -> None:
        self.depth += 1
        if self.depth > _MAX_DEPTH:
            raise Unreadable("nested too deep")

    def encoding(self) -> int:
        if self.peek() in ("T", "G"):
            raise Unreadable("special name")
        size = self.name()
        while self.i < len(self.s) and self.peek() not in ("E", "."):
            size += self.type() + _SEP  # return type and parameters
        return self.note(size + _SEP)

    def name(self) -> int:
        self.enter()
        c = self.peek()
        if c == "N":
            size = self.nested()
        elif c == "Z":
            size = self.local()
        else:
            size = self.substitution() if c == "S" else self.unqualified()
            if self.peek() == "I":
                size += self.template_args()
        self.depth -= 1
        return self.note(size)

    def nested(self) -> int:
        self.expect("N")
        size = 0
        while self.peek() and self.peek() in "rVKRO":
            self.i += 1
            size += _SEP + 2
        while not self.take("E"):
            c = self.peek()
            if not c:
                raise Unreadable("unterminated nested name")
            if c == "S":
                size += self.substitution()
            elif c == "I":
                size += self.template_args()
            elif c == "T":
                self.i += 1
                size += self.reference()
            elif c == "M":
                self.i += 1
            else:
                size += _SEP + self.unqualified()
            self.note(size)
        return size

    def local(self) -> int:
        self.expect("Z")
        size = self.encoding()
        self.expect("E")
        if self.take("s"):
            size += 16
        else:
            size += self.name()
        if self.take("_"):
            self.take("_")
            self.number()
            self.take("_")
        return self.note(size + 32)  # "::", "{default arg#N}"

    def unqualified(self) -> int:
        c, size = self.peek(), 0
        if c.isdigit():
            size = self.source_name()
        elif c == "L":
            self.i += 1
            size = self.source_name()
        elif c == "C" or (c == "D" and self.peek(2)[1:] in tuple("012345")):
            if self.take("CI"):  # inheriting constructor: CI1 <base class type>
                self.i += 1
                size += self.type()
            else:
                self.i += 2
            size += self.biggest + 2  # a constructor repeats its class's name
        elif c == "U":
            size = self.unnamed()
        elif c.islower():
            size = self.operator()
        else:
            raise Unreadable(f"name at {self.i}")
        while self.take("B"):  # ABI tags: [abi:tag]
            size += _SEP + self.source_name()
        return self.note(size)

    def source_name(self) -> int:
        n = self.number()
        if n <= 0 or self.i + n > len(self.s):
            raise Unreadable("source name runs past the end")
        self.i += n
        return max(n, 21)  # _GLOBAL__N_1 prints "(anonymous namespace)"

    def unnamed(self) -> int:
        if self.take("Ut"):
            size = 32
        elif self.take("Ul"):
            size = 32
            while not self.take("E"):
                if not self.peek():
                    raise Unreadable("unterminated lambda")
                size += self.type() + _SEP
        else:
            raise Unreadable("unnamed name")
        while self.peek().isdigit():
            self.i += 1
        self.expect("_")
        return size

    def operator(self) -> int:
        code = self.peek(2)
        if len(code) < 2:
            raise Unreadable("operator")
        self.i += 2
        if code == "cv":
            return 16 + self.type()
        if code == "li":
            return 16 + self.source_name()
        if code[0] == "v" and code[1].isdigit():
            return 16 + self.source_name()
        return 24  # "operator new[]", "operator->*", ...

    def substitution(self) -> int:
        self.expect("S")
        if self.peek() and self.peek() in "tabsiod":
            std = self.peek() == "t"
            self.i += 1
            return 5 + self.unqualified() if std else _STD
        return self.reference()

    def template_args(self) -> int:
        self.expect("I")
        size = _SEP
        while not self.take("E"):
            if not self.peek():
                raise Unreadable("unterminated template arguments")
            size += self.template_arg() + _SEP
        return self.note(size)

    def template_arg(self) -> int:
        c = self.peek()
        if c == "L":
            return self.literal()
        if c == "J":
            self.i += 1
            size, count = 0, 0
            while not self.take("E"):
                if not self.peek():
                    raise Unreadable("unterminated pack")
                size += self.template_arg() + _SEP
                count += 1
            self.pack = max(self.pack, count)
            return self.note(size)
        if c == "X":
            raise Unreadable("expression")
        return self.type()

    def literal(self) -> int:
        self.expect("L")
        if self.take("_Z"):
            size = self.encoding()
        else:
            size = self.type()
            start = self.i
            while self.peek() and self.peek() != "E":
                self.i += 1
            size += 2 * (self.i - start) + 16  # "(type)value", "true"
        self.expect("E")
        return self.note(size + _SEP)

    def type(self) -> int:
        self.enter()
        size = self._type()
        self.depth -= 1
        return self.note(size)

    def _type(self) -> int:
        c = self.peek()
        if not c:
            raise Unreadable("type runs past the end")
        if c in _BUILTIN:
            self.i += 1
            return 24
        if c == "u":
            self.i += 1
            return self.source_name()
        if c in "rVK":
            self.i += 1
            return _SEP + 2 + self.type()
        if c in "PROCG":
            self.i += 1
            return _SEP + self.type()
        if c == "F":
            return self.function()
        if c == "A":
            self.i += 1
            dim = self.number() if self.peek().isdigit() else 0
            self.expect("_")
            return dim // 10**9 + 32 + self.type()
        if c == "M":
            self.i += 1
            return self.type() + self.type() + 2 * _SEP
        if c == "T":
            self.i += 1
            size = self.reference()
            return size + (self.template_args() if self.peek() == "I" else 0)
        if c == "S":
            size = self.substitution()
            return size + (self.template_args() if self.peek() == "I" else 0)
        if c == "D":
            return self.d_type()
        if c in "NZ" or c.isdigit():
            return self.name()
        raise Unreadable(f"type at {self.i}")

    def function(self) -> int:
        self.expect("F")
        self.take("Y")
        size = 2 * _SEP
        while not self.take("E"):
            if not self.peek():
                raise Unreadable("unterminated function type")
            if self.peek(2) in ("RE", "OE"):
                self.i += 1
                size += 4
                continue
            size += self.type() + _SEP
        return size

    def d_type(self) -> int:
        code = self.peek(2)
        self.i += 2
        if code == "Dp":  # a pack expansion prints its pattern once per argument
            return self.type() * self.pack
        if code == "Dv":
            self.number()
            self.expect("_")
            return 32 + self.type()
        if code == "DF":
            self.number()
            self.take("_") or self.take("x") or self.take("b")
            return 24
        if len(code) == 2 and code[1] in "defhisuacn":
            return 24
        raise Unreadable(f"type {code!r}")
