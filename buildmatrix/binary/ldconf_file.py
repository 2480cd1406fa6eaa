"""The loader's configuration files, kept as text where the image readers meet them:
``/etc/ld.so.conf`` and every file of ``/etc/ld.so.conf.d``, the files glibc's
``ldconfig`` reads first (``elf/ldconfig.c`` ``main``: ``parse_conf`` of the
``-f`` file, which the NVIDIA container toolkit's hooks pass as ``/etc/ld.so.conf``).
buildmatrix.ldsoconf follows them on the final view.

Captured by the path a layer writes them at; a file reached otherwise (an
``include`` of another folder, a symlink out of ``/etc/ld.so.conf.d``) has no text,
and buildmatrix.ldsoconf then fails closed. Each file is kept up to ``CONF_LIMIT``
bytes; a larger one keeps only its size (and fails closed there too).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from buildmatrix.binary.source import ByteSource

CONF = "etc/ld.so.conf"
CONF_D = "etc/ld.so.conf.d"
CONF_LIMIT = 64 << 10


@dataclass(frozen=True, kw_only=True, slots=True)
class ConfFile:
    """A configuration file's bytes (None: larger than ``CONF_LIMIT``)."""

    path: str
    size: int
    text: bytes | None


def is_conf(path: str) -> bool:
    """Whether a layer path is one of the files kept as text."""
    return path == CONF or posixpath.dirname(path) == CONF_D


def read_conf(src: ByteSource, path: str) -> ConfFile:
    """The file's text, bounded by ``CONF_LIMIT``."""
    size = src.size
    text = src.read_at(0, size) if size <= CONF_LIMIT else None
    return ConfFile(path=path, size=size, text=text)
