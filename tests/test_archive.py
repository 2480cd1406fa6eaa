"""Static archives (``.a``): listed member by member as cuobjdump lists them (the
parity test is tests/test_inspect_vs_cuobjdump.py), reported by ``check`` but never
deciding its verdict, since an archive is linked at build time and never loaded."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from buildmatrix.binary.archive import members
from buildmatrix.binary.scan import inspect_file
from buildmatrix.binary.source import BytesSource, CorruptBinary
from tests.conftest import CliRunner
from tests.images import Image, fixture, write_docker_archive

ARCHIVE = "libtwo_static.a"


def test_each_member_is_a_translation_unit() -> None:
    report = inspect_file(Path(__file__).parent / "fixtures" / "bin" / ARCHIVE)
    assert report is not None
    assert report.format == "archive"
    assert (report.sass, report.ptx) == (["sm_80", "sm_90"], [])
    units = report.units()
    assert [sorted(str(c.arch) for c in u.codes) for u in units] == [
        ["sm_80", "sm_90"],
        ["sm_80"],
    ]


def _ar(tmp_path: Path, *members: tuple[str, bytes], long_names: bool = False) -> bytes:
    """An archive written by binutils' ar itself, from files of the given names."""
    folder = tmp_path / "ar"
    folder.mkdir(exist_ok=True)
    paths = []
    for name, data in members:
        (folder / name).write_bytes(data)
        paths.append(name)
    out = folder / "out.a"
    out.unlink(missing_ok=True)
    subprocess.run(
        ["ar", "rcs" if not long_names else "rc", str(out), *paths], cwd=folder, check=True
    )
    return out.read_bytes()


def test_gnu_long_names_and_odd_sizes(tmp_path: Path) -> None:
    long = "a_member_name_longer_than_sixteen_characters.o"
    data = _ar(
        tmp_path,
        ("odd.o", b"x" * 3),
        (long, fixture("kernels_sm80.cubin")),
        long_names=True,
    )
    found = [(m.name, m.source.size) for m in members(BytesSource(data, name="t.a"))]
    assert found == [("odd.o", 3), (long, len(fixture("kernels_sm80.cubin")))]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d[:-10], "runs past the end"),
        (lambda d: d[:8] + d[8:66].replace(b"`\n", b"xx") + d[68:], "header"),
        (lambda d: d[:56] + b"zz" + d[58:], "no valid size"),
        (lambda d: b"!<thin>\n" + d[8:], "thin archive"),
    ],
)
def test_corrupt_archives_are_refused(tmp_path: Path, mutate: object, message: str) -> None:
    data = _ar(tmp_path, ("k.o", fixture("kernels_sm80.cubin")))
    bad = mutate(data)  # type: ignore[operator]
    with pytest.raises(CorruptBinary, match=message):
        list(members(BytesSource(bad, name="t.a")))


def test_check_reports_archives_without_judging_them(cli: CliRunner, tmp_path: Path) -> None:
    """The archive's second object has sm_80 code only: loaded, it would fail 9.0;
    linked into the library beside it, it is that library that is judged."""
    image = Image(
        layers=[
            {
                "usr/lib/libtwo_static.a": fixture(ARCHIVE),
                "usr/lib/libsass_ptx.so": fixture("libsass_ptx.so"),
            }
        ]
    )
    archive = write_docker_archive(tmp_path / "img.tar", image)
    r = cli("check", f"docker-archive:{archive}", "--sm", "9.0", "--json")
    assert r.code == 0, r.out
    files = {f["path"]: f["format"] for f in r.json()["files"]}
    assert files == {"usr/lib/libtwo_static.a": "archive", "usr/lib/libsass_ptx.so": "elf"}
    r = cli("check", f"docker-archive:{archive}", "--sm", "9.0", "-v")
    assert "usr/lib/libtwo_static.a (static archive: reported, not judged)" in r.out
    only = write_docker_archive(
        tmp_path / "only.tar", Image(layers=[{"usr/lib/libtwo_static.a": fixture(ARCHIVE)}])
    )
    r = cli("check", f"docker-archive:{only}", "--sm", "8.0", "--json")
    assert r.code == 1
    assert "only in static archives" in " ".join(r.json()["problems"])
