"""The folders an image's own loader configuration makes ``ldconfig`` search, and
whether it reads the file the NVIDIA container toolkit's hook writes.

The toolkit's ``enable-cuda-compat`` hook puts the compat folder in use only by
writing it to ``/etc/ld.so.conf.d/00-compat-*.conf`` (nvidia-container-toolkit
``cmd/nvidia-cdi-hook/cudacompat/cudacompat.go`` ``createLdsoconfdFile``); the
``update-ldcache`` hook then runs ``ldconfig -f /etc/ld.so.conf`` in the container
root, after creating that file, where it is missing, as
``include /etc/ld.so.conf.d/*.conf`` (``internal/ldconfig/ldconfig.go``
``UpdateLDCache``, ``ensureLdsoconfFile``). So:

- a conf of the image that names a compat folder puts its libcuda in the cache
  whatever the hook decided;
- an ``/etc/ld.so.conf`` that includes no ``/etc/ld.so.conf.d`` file leaves the
  hook's file unread: the compat folder is then not searched;
- a folder named before the hook's file is cached first (``LoaderConf.ahead``):
  the node's driver, where it is mounted there, comes before the compat driver.

The files are read as glibc's ``elf/ldconfig.c`` reads them: ``parse_conf`` (each
line cut at ``#``, leading white space dropped; ``include`` and one or more glob
patterns, relative ones to the including file's folder (``parse_conf_include``);
``hwcap`` lines ignored; any other line a folder, cut at ``=`` and stripped of
trailing white space and slashes, by ``add_dir_1``), globs as ``glob`` does with no
flags (sorted in the C locale, a leading ``.`` matched only by itself), paths
followed through the image's symlinks (the hook runs ``ldconfig`` after
``pivot_root``, so the kernel resolves them inside the root).

Where a step cannot be followed exactly (a file whose text was not kept, a glob
with ``[`` or ``\\``, a wildcard in a folder part, a relative folder, more than
``MAX_FILES`` files or ``MAX_DEPTH`` nested includes), the answer is unknown and
buildmatrix.forward fails closed.
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from buildmatrix.binary.ldconf_file import CONF, CONF_D, CONF_LIMIT, ConfFile

if TYPE_CHECKING:
    from collections.abc import Mapping

    from buildmatrix.ldconfig import FolderView

MAX_FILES = 256
MAX_DEPTH = 16
# What ensureLdsoconfFile writes where the image has no /etc/ld.so.conf.
HOOK_DEFAULT = b"include /etc/ld.so.conf.d/*.conf\n"
_SPACE = " \t\n\v\f\r"  # isspace in the C locale
_BLANK = " \t"  # isblank
# The hook's file is 00-compat-<R>.conf. Releases before May 2026 made it with
# os.CreateTemp, which puts a decimal uint32 in place of the "*" (Go os/tempfile.go
# nextRandom: 1 to 10 digits); later ones put uuid.NewString() there
# (cmd/nvidia-cdi-hook/cudacompat/cudacompat.go createLdsoconfdFile: 36 characters,
# lowercase hex in the 8-4-4-4-12 form). Each shape is a template: None a random
# character of the class given, else the fixed character.
_HEX, _DIGITS = "0123456789abcdef", "0123456789"
_HOOK_PREFIX, _HOOK_SUFFIX = "00-compat-", ".conf"
_HOOK_SHAPES: tuple[tuple[tuple[str, bool], ...], ...] = (
    *(((_DIGITS, True),) * n for n in range(1, 11)),
    tuple(("-", False) if i in (8, 13, 18, 23) else (_HEX, True) for i in range(36)),
)
# Every name the hook may write sorts, byte for byte, between these two.
_HOOK_FIRST = f"{_HOOK_PREFIX}0{_HOOK_SUFFIX}"
_HOOK_LAST = f"{_HOOK_PREFIX}{'f' * 36}{_HOOK_SUFFIX}"


@dataclass(frozen=True, kw_only=True)
class LoaderConf:
    """What the image's configuration makes ldconfig do, as far as it matters here."""

    folders: tuple[str, ...]  # the folders it names (final paths), in ldconfig's order
    # Whether ldconfig reads the hook's 00-compat-*.conf (None: an include pattern
    # matches some of the names the hook may give it only, or ``unknown``).
    hook_read: bool | None
    unknown: str | None = None  # why the configuration could not be followed
    # Every folder named, in order, those missing from the image too (the runtime may
    # mount the node's driver into one), and the first of them that ldconfig reads
    # before the hook's file (where it reads it; those of files that may sort before
    # it included): a folder ahead of the compat folder puts its libcuda.so.1 first.
    listed: tuple[str, ...] = ()
    ahead: tuple[str, ...] = ()


class _Unknown(Exception):
    pass


@dataclass
class _Reader:
    view: FolderView
    confs: Mapping[str, ConfFile]
    hook_dir: str
    children: dict[str, list[str]]
    folders: list[str] = field(default_factory=list)
    listed: list[str] = field(default_factory=list)
    hook_votes: list[bool | None] = field(default_factory=list)
    ahead: tuple[str, ...] | None = None
    files: int = 0

    def resolve(self, path: str) -> str | None:
        return self.view.resolve(path.lstrip("/"), self.view.symlinks)

    def is_folder(self, path: str) -> bool:
        return path == "" or path in self.view.folders

    def open(self, written: str, depth: int) -> None:
        """``parse_conf`` of a file named ``written`` (as the glob returned it)."""
        self.files += 1
        if self.files > MAX_FILES or depth > MAX_DEPTH:
            raise _Unknown(
                f"more than {MAX_FILES} configuration files or {MAX_DEPTH} nested includes"
            )
        final = self.resolve(written)
        if final is None or self.is_folder(final):
            return  # fopen fails, or getline on a folder reads nothing
        conf = self.confs.get(final)
        if conf is None:
            if final in self.view.entries:
                raise _Unknown(f"{written} (/{final}) is a file whose text was not read")
            return  # missing: parse_conf skips it
        if conf.text is None:
            raise _Unknown(f"{written} is larger than {CONF_LIMIT} bytes ({conf.size})")
        self.parse(written, conf.text, depth)

    def parse(self, written: str, text: bytes, depth: int) -> None:
        for raw in text.split(b"\n"):
            line = raw.split(b"\0", 1)[0].split(b"#", 1)[0]
            cp = line.decode("utf-8", "surrogateescape").lstrip(_SPACE)
            if not cp:
                continue
            if cp.startswith("include") and cp[7:8] in tuple(_BLANK):
                for word in re.split("[ \t]", cp[8:]):
                    if word:
                        self.include(written, word, depth)
            elif cp[:5].isascii() and cp[:5].lower() == "hwcap" and cp[5:6] in tuple(_BLANK):
                continue
            else:
                self.add_dir(cp)

    def add_dir(self, line: str) -> None:
        path = line.split("=", 1)[0].rstrip(_SPACE).rstrip("/")
        if not path:
            return
        if not path.startswith("/"):
            raise _Unknown(f"the relative folder '{path}' is named")
        final = self.resolve(path)
        if final is None or final in self.view.entries:
            return  # stat fails (ELOOP), or a file: no driver is mounted in it
        if final not in self.listed:
            self.listed.append(final)
        if self.is_folder(final) and final not in self.folders:
            self.folders.append(final)

    def include(self, config: str, pattern: str, depth: int) -> None:
        if not pattern.startswith("/") and "/" in config:
            pattern = f"{posixpath.dirname(config)}/{pattern}"
        if "[" in pattern or "\\" in pattern:
            raise _Unknown(f"the include pattern '{pattern}' has '[' or '\\'")
        head, _, base = pattern.rpartition("/")
        if _magic(head):
            raise _Unknown(f"the include pattern '{pattern}' has a wildcard in a folder")
        if not _magic(base):
            self.open(pattern, depth + 1)
            return
        folder = self.resolve(head or "/")
        if folder is None:
            return
        # The hook's file, where this glob reads it first, comes after every name
        # that sorts before all its possible names and those that may sort before it.
        hook = folder == self.hook_dir and self.ahead is None
        if hook:
            self.hook_votes.append(vote := _reads_hook_file(base))
            hook = vote is True
        names = [n for n in self.children.get(folder, ()) if _match(base, n)]
        for name in sorted(names, key=lambda n: n.encode("utf-8", "surrogateescape")):
            if hook and self.ahead is None and _hook_order(name) > 0:
                self.ahead = tuple(self.listed)
            self.open(f"{head}/{name}", depth + 1)
        if hook and self.ahead is None:
            self.ahead = tuple(self.listed)


def _magic(text: str) -> bool:
    return any(c in text for c in "*?[")


def _match(pattern: str, name: str) -> bool:
    """glibc ``fnmatch`` with ``FNM_PERIOD`` for a pattern of ``*``, ``?`` and plain
    characters: a leading ``.`` is matched only by a ``.``."""
    if name.startswith(".") and not pattern.startswith("."):
        return False
    return fnmatch.fnmatchcase(name, pattern)


def _reads_hook_file(base: str) -> bool | None:
    """Whether a glob's last part matches every name the hook may give its file
    (True), none (False), or some only (None); ``base`` holds no ``[`` or ``\\``.

    Exact on each template of :data:`_HOOK_SHAPES`: a match where a random character
    may meet only ``?`` or ``*`` holds for every character it takes (True), and
    where it fails even with a random character matching any literal of its class,
    no name of that shape matches (False)."""
    if base.startswith("."):  # FNM_PERIOD: the hook's names start with "0"
        return False
    every = all(_template_match(base, shape, loose=False) for shape in _HOOK_SHAPES)
    if every:
        return True
    if not any(_template_match(base, shape, loose=True) for shape in _HOOK_SHAPES):
        return False
    return None


def _template_match(pattern: str, shape: tuple[tuple[str, bool], ...], *, loose: bool) -> bool:
    """``fnmatch`` of ``pattern`` (``*``, ``?`` and plain characters) against the
    hook's name of ``shape``: a random character meets a plain one only where
    ``loose`` and it is of its class."""
    name = [(c, False) for c in _HOOK_PREFIX] + list(shape) + [(c, False) for c in _HOOK_SUFFIX]

    def meets(p: str, n: tuple[str, bool]) -> bool:
        chars, random = n
        return p == "?" or (chars == p if not random else loose and p in chars)

    # reach[j]: the pattern so far matches the first j characters of the name.
    reach = [True] + [False] * len(name)
    for p in pattern:
        if p == "*":
            reach = [any(reach[: j + 1]) for j in range(len(name) + 1)]
        else:
            reach = [False] + [reach[j] and meets(p, name[j]) for j in range(len(name))]
    return reach[-1]


def _hook_order(name: str) -> int:
    """Where ``name`` sorts against every name the hook may give its file: -1 before
    all, 1 after all, 0 between some (glob sorts by strcoll; C locale: bytes)."""
    raw = name.encode("utf-8", "surrogateescape")
    if raw < _HOOK_FIRST.encode():
        return -1
    return 1 if raw > _HOOK_LAST.encode() else 0


def read_loader_conf(view: FolderView, confs: Mapping[str, ConfFile]) -> LoaderConf:
    """The folders ``ldconfig -f /etc/ld.so.conf`` reads from the image's configuration
    (``confs``: the kept files by final path), and whether it reads the hook's file."""
    hook_dir = view.resolve(CONF_D, view.symlinks)
    children: dict[str, list[str]] = {}
    for path in {*view.entries, *view.folders}:
        if path:
            children.setdefault(posixpath.dirname(path), []).append(posixpath.basename(path))
    if hook_dir is None or hook_dir in view.entries:
        why = f"/{CONF_D} is not a folder the hook can write its file into"
        return LoaderConf(folders=(), hook_read=None, unknown=why)
    reader = _Reader(view=view, confs=confs, hook_dir=hook_dir, children=children)
    top = view.resolve(CONF, view.symlinks)
    try:
        if top is not None and (top in view.entries or top in view.folders or CONF in view.entries):
            reader.open(f"/{CONF}", 0)
        else:  # the hook writes one
            reader.parse(f"/{CONF}", HOOK_DEFAULT, 0)
    except _Unknown as exc:
        return LoaderConf(folders=tuple(reader.folders), hook_read=None, unknown=str(exc))
    votes = reader.hook_votes
    read = True if True in votes else (None if None in votes else False)
    return LoaderConf(
        folders=tuple(reader.folders),
        hook_read=read,
        listed=tuple(reader.listed),
        ahead=reader.ahead or (),
    )
