"""Layer tar headers that Python's tarfile and Go's archive/tar (Docker, containerd) would
read differently are refused; ordinary tars from every writer still read.

Each case takes a real tar (Python's tarfile writes it), changes one thing in one
header block, and recomputes the checksum where the case is not about the checksum.
"""

from __future__ import annotations

import io
import random
import tarfile
from collections.abc import Callable
from typing import Any

import pytest

from buildmatrix.errors import InputError
from buildmatrix.image.layers import scan_layer
from buildmatrix.image.tarheaders import StrictTarInfo
from buildmatrix.image.tree import LayerSummary, merge
from tests.images import fixture, scan_in_place

SM80 = fixture("libsass_sm80.so")
HOPPER = fixture("libhopper_a.so")


def _tar(fmt: int = tarfile.USTAR_FORMAT) -> bytearray:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name, data in (("usr/lib/libok.so", HOPPER), ("usr/lib/libbad.so", SM80)):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o755
            tar.addfile(info, io.BytesIO(data))
    return bytearray(buf.getvalue())


def _header(raw: bytearray, n: int) -> int:
    """Offset of the n-th member's header block."""
    pos = 0
    for _ in range(n):
        size = int(raw[pos + 124 : pos + 136].strip(b" \0") or b"0", 8)
        pos += 512 + (size + 511) // 512 * 512
    return pos


def _fix_checksum(raw: bytearray, at: int) -> None:
    raw[at + 148 : at + 156] = b" " * 8
    raw[at + 148 : at + 156] = b"%06o\0 " % sum(raw[at : at + 512])


def _read(raw: bytes) -> dict[str, list[str]]:
    """The layer read as a stream and in place (as in a docker-archive file): both
    readers must refuse it with the same message, or read the same."""
    views: list[dict[str, list[str]] | InputError] = []
    readers: list[Callable[[], LayerSummary]] = [
        lambda: scan_layer(io.BytesIO(raw), name="layer"),
        lambda: scan_in_place(raw),
    ]
    for read in readers:
        try:
            summary = read()
        except InputError as exc:
            views.append(exc)
            continue
        views.append(
            {
                path: node.result.sass  # type: ignore[union-attr]
                for path, node in merge([summary]).files()
            }
        )
    streamed, in_place = views
    if isinstance(streamed, InputError):
        assert str(in_place) == str(streamed)
        raise streamed
    assert in_place == streamed
    return streamed


def test_an_ordinary_tar_reads() -> None:
    for fmt in (tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        assert _read(bytes(_tar(fmt))) == {
            "usr/lib/libbad.so": ["sm_80"],
            "usr/lib/libok.so": ["sm_90a"],
        }


def _size_with_leading_nul(raw: bytearray, at: int) -> None:
    size = int(raw[at + 124 : at + 136].strip(b" \0"), 8)
    raw[at + 124 : at + 136] = b"\0" + b"%010o" % size + b"\0"  # Go: size; Python: 0
    _fix_checksum(raw, at)


def _v7_with_prefix(raw: bytearray, at: int) -> None:
    raw[at + 257 : at + 265] = b"\0" * 8  # no magic: V7, which has no prefix field
    raw[at + 345 : at + 349] = b"opt\0"  # Python would still read it as a prefix
    _fix_checksum(raw, at)


def _bad_checksum(raw: bytearray, at: int) -> None:
    raw[at + 148 : at + 156] = b"0000000\0"


def _python_only_octal(raw: bytearray, at: int) -> None:
    raw[at + 100 : at + 108] = b"+000755\0"  # int("+000755", 8) works; Go refuses
    _fix_checksum(raw, at)


def _underscore_octal(raw: bytearray, at: int) -> None:
    raw[at + 136 : at + 148] = b"0000000_000\0"
    _fix_checksum(raw, at)


def _unknown_type(raw: bytearray, at: int) -> None:
    raw[at + 156 : at + 157] = b"S"  # GNU sparse: never written into image layers
    _fix_checksum(raw, at)


def _unknown_magic(raw: bytearray, at: int) -> None:
    raw[at + 257 : at + 265] = b"ustar\0XY"
    _fix_checksum(raw, at)


def _star_ambiguity(raw: bytearray, at: int) -> None:
    raw[at + 345 : at + 476] = b"p" * 131  # a prefix with no NUL, and the star trailer
    raw[at + 508 : at + 512] = b"tar\0"
    _fix_checksum(raw, at)


def _truncated_in_a_header(raw: bytearray, at: int) -> None:
    del raw[at + 300 :]


def _binary_checksum(raw: bytearray, at: int) -> None:
    # base-256: Go parses the checksum as octal only (format.go, getFormat); found by
    # tests/test_fuzz.py as a ValueError traceback
    raw[at + 148 : at + 156] = b"\xff\xff2235\0 "


def _zero_block_then_more(raw: bytearray, at: int) -> None:
    raw[at:at] = b"\0" * 512  # Python stops at it; Go wants a second zero block


CASES: dict[str, tuple[Callable[[bytearray, int], None], str]] = {
    "size field with a leading NUL": (_size_with_leading_nul, "numeric field (bytes 124..136)"),
    "V7 header with a prefix": (_v7_with_prefix, "has bytes in it"),
    "bad checksum": (_bad_checksum, "checksum does not match"),
    "base-256 checksum": (_binary_checksum, "checksum does not match"),
    "octal with a sign": (_python_only_octal, "numeric field (bytes 100..108)"),
    "octal with an underscore": (_underscore_octal, "numeric field (bytes 136..148)"),
    "sparse type": (_unknown_type, "type flag b'S'"),
    "unknown magic": (_unknown_magic, "unknown magic"),
    "ustar/star ambiguity": (_star_ambiguity, "ustar and star"),
    "truncated header": (_truncated_in_a_header, "truncated"),
    "zero block then entries": (_zero_block_then_more, "follows a single end-of-archive block"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_headers_read_differently_are_refused_mid_layer(case: str) -> None:
    """The second member is changed: the first has been read, so a reader that stops
    quietly would have missed the library that fails."""
    mutate, message = CASES[case]
    raw = _tar()
    mutate(raw, _header(raw, 1))
    with pytest.raises(InputError) as err:
        _read(bytes(raw))
    assert message in str(err.value)
    assert "the image is refused" in str(err.value) or "truncated or corrupt" in str(err.value)


def test_a_tar_without_end_marker_still_reads() -> None:
    """Go's reader and Python's both accept a stream that ends at a header boundary."""
    raw = _tar()
    end = _header(raw, 2)
    assert len(_read(bytes(raw[:end]))) == 2


def _plain_blocks() -> list[bytes]:
    """Header blocks tarfile writes (ustar, with the prefix field for long names, and
    GNU), of every plain type, as written and with numeric fields in the other octal
    forms both readers take (leading spaces, space or NUL padding)."""
    rnd = random.Random(7)
    names = ["a", "d/", "usr/lib/libé.so", "x" * 99, "p" * 60 + "/" + "q" * 90, "s/./t/", "/abs"]
    blocks = []
    for fmt in (tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT):
        for kind in b"0123456":
            for name in names:
                info = tarfile.TarInfo(name)
                info.type, info.linkname = bytes([kind]), rnd.choice(["", "t", "../é/" + "l" * 90])
                info.size = rnd.choice([0, 1, 511, 8**11 - 1]) if kind == ord("0") else 0
                info.mtime, info.mode = rnd.choice([0, 1_700_000_000]), rnd.choice([0o644, 0o7777])
                info.uid, info.gid, info.uname = rnd.randrange(8**7), 0, rnd.choice(["", "root"])
                info.devmajor, info.devminor = rnd.randrange(8**7), rnd.randrange(8**7)
                buf = bytearray(info.tobuf(fmt, "utf-8", "surrogateescape")[-512:])
                blocks.append(bytes(buf))  # as written
                for start, end in ((100, 108), (108, 116), (124, 136), (329, 337)):
                    digits = bytes(buf[start:end]).strip(b" \0").lstrip(b"0") or b"0"
                    pad = end - start - len(digits)
                    lead = rnd.randrange(pad + 1)
                    trail = bytes(rnd.choice(b" \0") for _ in range(pad - lead))
                    buf[start:end] = b" " * lead + digits + trail
                _fix_checksum(buf, 0)
                blocks.append(bytes(buf))
    return blocks


def test_plain_headers_read_as_tarfile_reads_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """The strict reader builds plain header blocks itself (tarheaders.StrictTarInfo.
    _plain); every attribute must be what tarfile's own TarInfo.frombuf reads."""
    blocks = _plain_blocks()
    assert len(blocks) == 2 * 7 * 7 * 2
    built: list[bytes] = []
    plain = StrictTarInfo._plain

    def counted(cls: type[StrictTarInfo], buf: bytes, *rest: Any) -> StrictTarInfo:
        built.append(buf)
        return plain(buf, *rest)

    monkeypatch.setattr(StrictTarInfo, "_plain", classmethod(counted))
    for buf in blocks:
        ours = StrictTarInfo.frombuf(buf, "utf-8", "surrogateescape")
        theirs = tarfile.TarInfo.frombuf(buf, "utf-8", "surrogateescape")
        for attr in tarfile.TarInfo.__slots__:
            mine = getattr(ours, attr, "unset")
            assert mine == getattr(theirs, attr, "unset"), (attr, buf)
        assert ours.raw_type == theirs.type
    assert len(built) == len(blocks)  # each through the strict reader's own build
