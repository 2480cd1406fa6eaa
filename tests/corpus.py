"""The real-package corpus: pinned wheels of widely used GPU packages, laid out as
installed Python trees ("images"), judged by ``check`` on every GPU of the shipped
profiles, and the table of what each package documents.

Shared by ``tests/test_corpus.py`` (which holds the verdicts to the documented table
and the file listings to cuobjdump) and ``benchmarks/corpus.py`` (which prints the
table and times ``check`` against cuobjdump).

An image is one package as ``pip install`` leaves it in a ``site-packages`` folder:
its wheel's tree, plus the companion wheel a package splits its code into where it
does (flashinfer-python + flashinfer-cubin, jax-cuda12-plugin + jax-cuda12-pjrt).
Dependencies are images of their own (torch's ``nvidia-*-cu12`` pins are eight
rows), so a row says which package a failure belongs to; an environment of several
runs where each of its rows runs. The versions form one environment: torch 2.8.0
(built with CUDA 12.8) and the exact ``nvidia-*-cu12`` pins of its wheel's METADATA,
and the releases of the other packages built against torch 2.8.0 (vLLM 0.10.2 pins
it; xformers 0.0.32.post2, torchvision 0.23.0, torchaudio 2.8.0, sgl-kernel
0.3.9.post2 are its builds).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tests.wheels import _locked, cache_dir, extracted

DRIVER = "580.65.06"  # R580: the CUDA 13.0 driver, new enough for every row's runtime
SITE = "usr/local/lib/python3.11/site-packages"  # where pip puts them in python:3.11


@dataclass(frozen=True, kw_only=True)
class Package:
    """One row: the wheels of one installed package."""

    name: str
    wheels: tuple[tuple[str, str], ...]


# torch 2.8.0's METADATA: Requires-Dist nvidia-*-cu12==... (Linux x86_64). The
# libraries without device code (cuda-runtime, nvrtc, cupti, nvjitlink, nvtx, cufile)
# are left out: they add nothing to judge.
NVIDIA_CU12 = {
    "nvidia-cublas-cu12": "12.8.4.1",
    "nvidia-cudnn-cu12": "9.10.2.21",
    "nvidia-cufft-cu12": "11.3.3.83",
    "nvidia-curand-cu12": "10.3.9.90",
    "nvidia-cusolver-cu12": "11.7.3.90",
    "nvidia-cusparse-cu12": "12.5.8.93",
    "nvidia-cusparselt-cu12": "0.7.1",
    "nvidia-nccl-cu12": "2.27.3",
}

PACKAGES: tuple[Package, ...] = (
    Package(name="torch", wheels=(("torch", "2.8.0"),)),
    Package(name="torchvision", wheels=(("torchvision", "0.23.0"),)),
    Package(name="torchaudio", wheels=(("torchaudio", "2.8.0"),)),
    Package(name="xformers", wheels=(("xformers", "0.0.32.post2"),)),
    Package(name="vllm", wheels=(("vllm", "0.10.2"),)),
    Package(name="bitsandbytes", wheels=(("bitsandbytes", "0.50.2"),)),
    Package(
        name="flashinfer",
        wheels=(("flashinfer-python", "0.5.0"), ("flashinfer-cubin", "0.5.0")),
    ),
    Package(name="sgl-kernel", wheels=(("sgl-kernel", "0.3.9.post2"),)),
    Package(name="cupy", wheels=(("cupy-cuda12x", "13.6.0"),)),
    Package(
        name="jax-cuda12",
        wheels=(("jax-cuda12-plugin", "0.7.1"), ("jax-cuda12-pjrt", "0.7.1")),
    ),
    Package(name="onnxruntime-gpu", wheels=(("onnxruntime-gpu", "1.22.0"),)),
    *(
        Package(name=name.removesuffix("-cu12"), wheels=((name, version),))
        for name, version in NVIDIA_CU12.items()
    ),
)


def gpus() -> list[str]:
    """Every GPU of the shipped profiles, as compute capabilities, oldest first."""
    from buildmatrix.profile_files import default_profiles_dir, load_profiles

    numbers = sorted({p.number for p in load_profiles(default_profiles_dir())})
    return [f"{n // 10}.{n % 10}" for n in numbers]


def image(package: Package) -> Path:
    """The package's installed tree, ``SITE`` under a folder of its own: the wheels'
    extracted trees hard-linked in (the cache's trees stay as they are; nothing is
    copied). Made once, beside the wheels."""
    root = cache_dir() / "corpus-images" / package.name
    root.parent.mkdir(exist_ok=True)
    with _locked(root.parent / f".{package.name}.lock"):  # one process lays it out
        if (root / ".complete").exists():
            return root
        trees = [extracted(name, version) for name, version in package.wheels]
        subprocess.run(["rm", "-rf", str(root)], check=True)
        site = root / SITE
        site.mkdir(parents=True)
        for tree in trees:
            # cp -al: hard links, so an image costs no disk; a later wheel's file of
            # the same path replaces the earlier one's, as pip would overwrite it
            subprocess.run(
                ["cp", "-al", "--remove-destination", f"{tree}/.", str(site)], check=True
            )
        (site / ".complete").unlink(missing_ok=True)
        (root / ".complete").touch()
    return root


def check(root: Path, sms: Sequence[str], *, strict: bool = False) -> dict:  # type: ignore[type-arg]
    """``python -m buildmatrix check ROOT --sm ... --driver DRIVER --json`` in a process
    of its own (as a user runs it), its JSON."""
    args = [sys.executable, "-m", "buildmatrix", "check", str(root), "--driver", DRIVER]
    args += [a for sm in sms for a in ("--sm", sm)]
    args += ["--json"] + (["--strict"] if strict else [])
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    proc = subprocess.run(args, capture_output=True, text=True, check=False, env=env)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"check {root} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def check_all(roots: dict[str, Path], sms: Sequence[str], *, workers: int = 2) -> dict[str, dict]:  # type: ignore[type-arg]
    """``check`` on each image, ``workers`` at a time (each reads its files once for
    every GPU)."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {name: pool.submit(check, root, sms) for name, root in roots.items()}
        return {name: f.result() for name, f in futures.items()}


@dataclass(frozen=True, kw_only=True)
class Cell:
    """One (package, GPU) verdict: ``status`` is "pass", "fail" or "skipped-only"
    (every file with code is one the package loads only where it runs, and none runs
    here); ``text`` is what the table shows."""

    status: str
    text: str


def _short(reason: str) -> str:
    """A target's failure reason as the table shows it: the file's name and the first
    clause of what is wrong with it."""
    body = reason.removeprefix("unreadable: ")
    path, _, rest = body.partition(": ")
    name = path.split(" (")[0].removeprefix(SITE + "/")
    if len(name) > 48:  # flashinfer's cubins are named for their whole configuration
        name = name[:20] + "..." + name[-25:]
    kind = "unreadable, " if reason.startswith("unreadable: ") else ""
    detail = (rest if rest else path.partition(" (")[2].rstrip(")")).split("; ")[0]
    return f"{name}: {kind}{detail[:72]}"


def skipped_paths(target: dict) -> set[str]:  # type: ignore[type-arg]
    """The files a target's verdict leaves out as optional (``skipped`` in check's
    JSON: objects with a ``path``)."""
    return {
        s["path"] if isinstance(s, dict) else str(s).split(": ")[0]
        for s in target.get("skipped", [])
    }


def cells(doc: dict) -> dict[str, Cell]:  # type: ignore[type-arg]
    """The cells of one image's ``check --json``, by compute capability."""
    coded = {f["path"] for f in doc["files"] if not f["path"].endswith(".a")}
    out: dict[str, Cell] = {}
    for t in doc["targets"]:
        cc = t["compute_capability"]
        if t["verdict"] == "none" or not t["driver_ok"]:
            failing = [r for r in t["reasons"] if SITE in r] or t["reasons"] or doc["problems"]
            out[cc] = Cell(status="fail", text="FAIL " + _short(failing[0]))
            continue
        skipped = skipped_paths(t)
        if skipped and coded <= skipped:
            out[cc] = Cell(status="skipped-only", text=f"skipped-only ({len(skipped)})")
        elif skipped:
            out[cc] = Cell(status="pass", text=f"pass, {len(skipped)} skipped")
        else:
            out[cc] = Cell(status="pass", text="pass")
    if doc["verdict"] == "fail" and all(c.status != "fail" for c in out.values()):
        # a failure of the image as a whole (no device code, a folder unread)
        text = "FAIL " + (doc["problems"][0][:100] if doc["problems"] else "?")
        out = {cc: Cell(status="fail", text=text) for cc in out}
    return out


def render(rows: dict[str, dict[str, str]], columns: Sequence[str]) -> str:
    """A Markdown table: one row per package, one column per GPU."""
    lines = ["| package | " + " | ".join(columns) + " |"]
    lines.append("|---" * (len(columns) + 1) + "|")
    for name, row in rows.items():
        lines.append(f"| {name} | " + " | ".join(row.get(c, "") for c in columns) + " |")
    return "\n".join(lines)
