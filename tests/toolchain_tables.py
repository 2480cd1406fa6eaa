"""What the CUDA 13.0 compilers accept, asked of them once and cached: the oracle of
the arch rules (tests/test_integrated_nvlink.py) and of the PTX head rules
(tests/test_ptx_isa_table.py).

- :func:`nvlink_links`: for each SM ptxas compiles for (``ptxas --help``'s list), the
  SMs a program may be linked for with nvlink from a relocatable cubin of that SM
  alone (``nvlink -arch=sm_B a.o``: "Input file 'a.o' arch does not match target").
- :func:`ptxas_compiles`: for each ``.target`` of that list, the SMs ptxas compiles
  that PTX for (what a driver's JIT does with it).
- :func:`isa_table`: the PTX ISA versions ptxas knows (``.version X.Y`` for X 1-9,
  Y 0-9: "Unsupported .version"), and for each ``.target`` name it knows, the versions
  it takes with it ("PTX .version 7.0 does not support .target sm_90").

Several thousand compiler runs (about two minutes on two cores), so the answers are
kept under ~/.cache/buildmatrix/toolchain-tables, keyed by the tools' ``--version``
output and this file's content, as tests/fixtures/build.py keeps its builds.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import cast

from tests.conftest import USER_CACHE

CACHE = USER_CACHE / "buildmatrix" / "toolchain-tables"
HAVE_TOOLS = all(shutil.which(t) for t in ("ptxas", "nvlink"))
_BODY = ".visible .entry k()\n{\nret;\n}\n"
Table = dict[str, list[str]]


def ptxas_gpus() -> list[str]:
    """The SMs ``ptxas --help`` lists for --gpu-name (sm_75 ... sm_121f)."""
    text = subprocess.run(["ptxas", "--help"], capture_output=True, text=True, check=True).stdout
    return sorted(set(re.findall(r"'(sm_\d+[af]?)'", re.sub(r"\s+", "", text))))


def _key(name: str, salt: str) -> str:
    versions = "".join(
        subprocess.run([t, "--version"], capture_output=True, text=True, check=True).stdout
        for t in ("ptxas", "nvlink")
    )
    mine = Path(__file__).read_bytes()
    return hashlib.sha256(versions.encode() + mine + (name + salt).encode()).hexdigest()[:32]


def _cached(name: str, compute: Callable[[Path], object], salt: str = "") -> object:
    path = CACHE / f"{name}-{_key(name, salt)}.json"
    if path.is_file():
        return json.loads(path.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        value = compute(Path(tmp))
    CACHE.mkdir(parents=True, exist_ok=True)
    staging = path.with_suffix(".tmp")
    staging.write_text(json.dumps(value, sort_keys=True))
    staging.replace(path)
    return value


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, check=False)


def _ptx(target: str, version: str = "9.0") -> str:
    return f".version {version}\n.target {target}\n.address_size 64\n{_BODY}"


def nvlink_links() -> Table:
    def compute(tmp: Path) -> Table:
        gpus = ptxas_gpus()
        for sm in gpus:
            (tmp / f"{sm}.ptx").write_text(_ptx(sm))
            done = _run(
                ["ptxas", "-c", f"-arch={sm}", str(tmp / f"{sm}.ptx"), "-o", f"{tmp}/{sm}.o"]
            )
            assert done.returncode == 0, done.stderr

        def links(code: str) -> list[str]:
            out = f"{tmp}/{code}.cubin"
            return [
                b
                for b in gpus
                if _run(["nvlink", f"-arch={b}", f"{tmp}/{code}.o", "-o", out]).returncode == 0
            ]

        with ThreadPoolExecutor(2) as pool:
            return dict(zip(gpus, pool.map(links, gpus), strict=True))

    return cast(Table, _cached("nvlink", compute))


def ptxas_compiles() -> Table:
    def compute(tmp: Path) -> Table:
        gpus = ptxas_gpus()

        def compiles(target: str) -> list[str]:
            src = tmp / f"{target}.ptx"
            src.write_text(_ptx(target))
            out = f"{tmp}/{target}.cubin"
            return [
                b
                for b in gpus
                if _run(["ptxas", f"-arch={b}", str(src), "-o", out]).returncode == 0
            ]

        with ThreadPoolExecutor(2) as pool:
            return dict(zip(gpus, pool.map(compiles, gpus), strict=True))

    return cast(Table, _cached("ptxas-jit", compute))


def isa_table(names: list[str]) -> tuple[list[str], Table]:
    """(the ISA versions ptxas knows, the versions each of ``names`` takes). Every
    module is compiled for sm_75, the oldest GPU ptxas 13.0 compiles for: the
    version check comes first, so its message says whether the version and target
    go together whatever the GPU ("SM version specified by .target is higher" and
    the like come after it)."""

    def compute(tmp: Path) -> dict[str, object]:
        def refusal(job: tuple[str, str]) -> str:
            target, version = job
            src = tmp / f"{target}-{version}.ptx"
            src.write_text(f".version {version}\n.target {target}\n{_BODY}")
            return _run(["ptxas", "-arch=sm_75", str(src), "-o", f"{src}.cubin"]).stderr

        every = [f"{x}.{y}" for x in range(1, 10) for y in range(10)]
        with ThreadPoolExecutor(2) as pool:
            said = list(pool.map(refusal, [("sm_10", v) for v in every]))
            known = [v for v, e in zip(every, said, strict=True) if "Unsupported .version" not in e]
            jobs = [(n, v) for n in names for v in known]
            said = list(pool.map(refusal, jobs))
        takes: Table = {n: [] for n in names}
        for (n, v), e in zip(jobs, said, strict=True):
            if "does not support .target" not in e and "Unsupported .target" not in e:
                takes[n].append(v)
        return {"known": known, "takes": takes}

    got = cast(dict[str, object], _cached("isa", compute, ",".join(names)))
    return cast(list[str], got["known"]), cast(Table, got["takes"])
