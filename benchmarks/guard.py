"""The speed guard: is this tree's ``check`` and ``inspect`` slower than its base's?

    .venv/bin/python benchmarks/guard.py [--base REV] [--rounds N] [--workdir DIR]

Measures, in one run and on one machine, a small image through three of ``check``'s
paths — a rootfs folder (``dir:``, the direct read), a ``docker save`` archive
(``docker-archive:``, read in place) and an OCI layout (``oci:``) — and ``inspect`` on
one real NVIDIA library (libcublas.so.13 of the nvidia-cublas 13.1.1.3 wheel), each with
this tree's code and with the base's, alternating the two trees round by round and
keeping the best of N rounds (4) after one warm-up round (noise on a shared machine
only ever adds time).

It fails (exit 1) when a path is more than 25 % slower than at the base, unless a
price for it is stated in ``benchmarks/prices.yaml`` (a new check has a price: it must
be stated, with its reason and measured cost, not discovered a week later). Only the
prices added since the base count. Exit 0 when every path is within bounds (or
priced), 3 when the base cannot be checked out or run (nothing to compare with).

The base (``--base``, else ``$BUILDMATRIX_GUARD_BASE``) defaults to the newest commit
at least four hours older than HEAD: the work of one sitting is compared with what was
there before it. ``.ci/run`` runs it after the suite; docs/development.md, "The speed
guard", says how to read and price its results.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

LIMIT = 1.25  # a path may be this much slower than at the base without a stated price
PATHS = ("direct", "archive", "oci", "inspect")
LIBRARY = ("nvidia-cublas", "13.1.1.3", "*/libcublas.so.13")


@dataclass(frozen=True, kw_only=True)
class Price:
    path: str
    cost: float  # the measured ratio, new time / old time, the commit states
    reason: str


@dataclass(frozen=True, kw_only=True)
class Outcome:
    path: str
    base: float | None  # best seconds, None where the base could not run it
    new: float
    allowed: float
    priced_by: tuple[str, ...] = ()

    @property
    def ratio(self) -> float | None:
        return None if self.base is None else self.new / self.base

    @property
    def ok(self) -> bool:
        return self.ratio is None or self.ratio <= self.allowed


def read_prices(text: str | None, *, source: str) -> list[Price]:
    """The ``prices`` list of a prices.yaml text (None: the file is absent)."""
    if text is None:
        return []
    doc = yaml.safe_load(text) or {}
    out = []
    for i, item in enumerate(doc.get("prices") or []):
        try:
            path, cost, reason = item["path"], float(item["cost"]), str(item["reason"]).strip()
        except (KeyError, TypeError, ValueError) as exc:
            raise SystemExit(f"{source}: prices[{i}] needs path, cost and reason ({exc})") from None
        if path not in PATHS or cost <= 0 or not reason:
            raise SystemExit(
                f"{source}: prices[{i}]: path must be one of {', '.join(PATHS)}, cost a "
                "ratio above 0 (new time / old time) and reason a sentence"
            )
        out.append(Price(path=path, cost=cost, reason=reason))
    return out


def judge(times: dict[str, tuple[float | None, float]], new_prices: list[Price]) -> list[Outcome]:
    """Pure: per path (best base seconds, best new seconds) and the prices stated since
    the base in, the outcomes out. A stated price allows its cost, and a tenth more for
    the noise of the measurement that stated it."""
    outcomes = []
    for path, (base, new) in times.items():
        priced = [p for p in new_prices if p.path == path]
        allowed = max([LIMIT, *(p.cost * 1.1 for p in priced)])
        outcomes.append(
            Outcome(
                path=path,
                base=base,
                new=new,
                allowed=allowed,
                priced_by=tuple(p.reason for p in priced),
            )
        )
    return outcomes


def default_base() -> str:
    env = os.environ.get("BUILDMATRIX_GUARD_BASE", "").strip()
    if env:
        return env
    head_time = int(_git("log", "-1", "--format=%ct", "HEAD"))
    found = _git("rev-list", "-1", f"--before={head_time - 4 * 3600}", "HEAD")
    return found or _git("rev-list", "--max-parents=0", "HEAD").splitlines()[-1]


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.strip()


def _workload(work: Path) -> dict[str, list[str]]:
    """The image in three forms and the library, made once; the command tail per path."""
    from tests.fixtures.build import BIN  # nvcc-built, committed
    from tests.images import Image, write_docker_archive, write_oci_layout
    from tests.wheels import member

    library = member(*LIBRARY)
    libs = {f"usr/lib/x86_64-linux-gnu/{p.name}": p.read_bytes() for p in sorted(BIN.glob("*.so"))}
    # many small files beside the libraries: what a Python environment's layer holds
    small = {f"opt/venv/lib/site-packages/pkg{i // 100}/m{i}.py": b"x = 1\n" for i in range(6000)}
    big = {"opt/venv/lib/nvidia/cu13/lib/libcublas.so.13": library.read_bytes()}
    layers: list[dict[str, bytes]] = [small, libs, big]
    image = Image(layers=[dict(layer) for layer in layers], env={"CUDA_VERSION": "12.8.1"})
    root = work / "rootfs"
    if not root.is_dir():
        for layer in layers:
            for name, data in layer.items():
                target = root / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
    archive = work / "image.tar"
    if not archive.is_file():
        write_docker_archive(archive, image, tag="bm-guard/image:1")
    layout = work / "layout"
    if not layout.is_dir():
        write_oci_layout(layout, image, tag="1")
    check = ["check", "--sm", "9.0", "--sm", "8.0", "--json", "--no-cache"]
    return {
        "direct": [*check, f"dir:{root}"],
        "archive": [*check, f"docker-archive:{archive}"],
        "oci": [*check, f"oci:{layout}:1"],
        "inspect": ["inspect", "--json", str(library)],
    }


def _run(tree: Path, args: list[str]) -> float | None:
    """Seconds of ``python -m buildmatrix ARGS`` with ``tree``'s code; None where it
    cannot run (exit 2 or 3: the base may lack an option or a reader)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "buildmatrix", *args],
        env=env,
        cwd=tree,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        check=False,
    )
    seconds = time.perf_counter() - start
    return None if proc.returncode >= 2 else seconds


def measure(
    trees: dict[str, Path], commands: dict[str, list[str]], rounds: int
) -> dict[str, tuple[float | None, float]]:
    best: dict[tuple[str, str], float | None] = {}
    for tree in trees.values():  # compile each tree's bytecode, fill the page cache
        for args in commands.values():
            _run(tree, args)
    for n in range(rounds):
        order = ["base", "new"] if n % 2 == 0 else ["new", "base"]  # alternate the trees
        for path, args in commands.items():
            for which in order:
                t = _run(trees[which], args)
                key = (which, path)
                if t is None or (key in best and best[key] is None):
                    best[key] = None
                else:
                    best[key] = min(t, best.get(key) or t)
    out: dict[str, tuple[float | None, float]] = {}
    for path, argv in commands.items():
        new = best[("new", path)]
        if new is None:
            raise SystemExit(f"guard: this tree cannot run the {path} path: {argv}")
        out[path] = (best[("base", path)], new)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--base", help="the revision to compare with (default: see above)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args()
    base = args.base or default_base()
    try:
        base_sha = _git("rev-parse", "--verify", f"{base}^{{commit}}")
    except subprocess.CalledProcessError:
        print(f"guard: no commit '{base}' to compare with", file=sys.stderr)
        return 3
    head_sha = _git("rev-parse", "HEAD")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bm-guard-"))
    work.mkdir(parents=True, exist_ok=True)
    base_tree = work / "base"
    try:
        if base_tree.exists():
            shutil.rmtree(base_tree)
        # the base's files as committed (git archive | tar -x): no worktree to clean up
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", f"--prefix={base_tree.name}/", base_sha],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-xf", "-", "-C", str(work)], input=archive, check=True)
        commands = _workload(work / "data")
        # both trees' bytecode under the work folder (the prefix mirrors their paths),
        # written by the warm-up round, never into the trees themselves
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
        os.environ["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
        start = time.perf_counter()
        times = measure({"base": base_tree, "new": REPO}, commands, args.rounds)
        spent = time.perf_counter() - start
        base_prices = read_prices(
            _show(base_sha, "benchmarks/prices.yaml"), source=f"{base_sha[:10]}:prices.yaml"
        )
        here = REPO / "benchmarks" / "prices.yaml"
        current = read_prices(
            here.read_text(encoding="utf-8") if here.is_file() else None, source=str(here)
        )
        outcomes = judge(times, [p for p in current if p not in base_prices])
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"speed guard: HEAD {head_sha[:10]} against base {base_sha[:10]}, best of {args.rounds} "
          f"rounds, alternating ({spent:.0f} s)")  # fmt: skip
    print(f"{'path':<9} {'base s':>8} {'new s':>8} {'ratio':>7} {'allowed':>8}  verdict")
    for o in outcomes:
        base_s = "-" if o.base is None else f"{o.base:.3f}"
        ratio = "-" if o.ratio is None else f"{o.ratio:.2f}"
        verdict = "ok" if o.ok else "SLOWER"
        if o.base is None:
            verdict = "ok (the base cannot run it)"
        elif o.priced_by:
            verdict += " (priced: " + "; ".join(o.priced_by) + ")"
        print(f"{o.path:<9} {base_s:>8} {o.new:>8.3f} {ratio:>7} {o.allowed:>8.2f}  {verdict}")
    slower = [o for o in outcomes if not o.ok]
    if slower:
        print(
            "guard: FAIL: " + ", ".join(o.path for o in slower) + f" more than "
            f"{LIMIT - 1:.0%} slower than the base. Make it fast again, or state the price in "
            "benchmarks/prices.yaml (path, cost = new/old time as measured here, reason).",
            file=sys.stderr,
        )
        return 1
    return 0


def _show(rev: str, path: str) -> str | None:
    proc = subprocess.run(
        ["git", "show", f"{rev}:{path}"], cwd=REPO, capture_output=True, text=True, check=False
    )
    return proc.stdout if proc.returncode == 0 else None


if __name__ == "__main__":
    raise SystemExit(main())
