"""``NVIDIA_REQUIRE_*`` as the NVIDIA container toolkit evaluates it before a container
starts. Pure.

The legacy hook (nvidia-container-runtime-hook, which ``docker run --gpus`` runs)
collects every ``NVIDIA_REQUIRE_*`` value but ``NVIDIA_REQUIRE_JETPACK*``, and for a
legacy image (``CUDA_VERSION`` set, ``NVIDIA_REQUIRE_CUDA`` unset or empty) adds
``cuda>=MAJOR.MINOR`` of ``CUDA_VERSION``; ``NVIDIA_DISABLE_REQUIRE`` set to a true
value of Go's strconv.ParseBool drops them all (nvidia-container-toolkit
``internal/config/image/cuda_image.go``: ``GetRequirements``, ``HasDisableRequire``,
``IsLegacy``). libnvidia-container then evaluates each with every visible GPU
(``src/cli/configure.c``: ``configure_command``, at most 16, "too many
requirements") by ``dsl_evaluate`` (``src/cli/dsl.c``), which this module follows
step by step: space-separated alternatives, each a comma-separated list of
conditions on ``cuda`` (the driver's CUDA version), ``driver``, ``arch`` (compute
capability) and ``brand``; an unknown key, operator or empty value is "invalid
expression"; versions compare number by number (``dsl_compare_version``). A failure
refuses to start the container ("requirement error: unsatisfied condition: ...").

Properties this module is not told (the driver without ``--driver`` or a snapshot,
the GPU's brand) are tried at every value that can change an answer; the answer is
``None`` where it depends on them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import product

_OPERATORS = ("=", "!=", "<", "<=", ">", ">=")  # dsl.c's order, which decides "!"
_RULES = ("cuda", "driver", "arch", "brand")
_MAX_REQUIREMENTS = 16  # configure.c: char *reqs[16]
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})  # Go's strconv.ParseBool
_SEMVER = re.compile(r"v?(\d+)(?:\.(\d+))?(?:\.\d+)?(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?")
_INVALID = -1
# The names libnvidia-container gives NVML's brands (src/driver.c,
# driver_get_device_brand_1_svc; "Unknown" for one it does not name), with those of
# the newer brands as nvidia/cuda images' NVIDIA_REQUIRE_CUDA spells them: a brand not
# known is tried as each.
_BRANDS = frozenset(
    [
        "unknown",
        "quadro",
        "tesla",
        "nvs",
        "grid",
        "geforce",
        "titan",
        "vapps",
        "vpc",
        "vcs",
        "vws",
        "cloudgaming",
        "quadrortx",
        "nvidiartx",
        "nvidia",
        "geforcertx",
        "titanrtx",
    ]
)


@dataclass(frozen=True, kw_only=True)
class Known:
    """What is known of the GPU and driver a requirement is evaluated with (None:
    unknown). ``cuda``: the CUDA version the driver reports, as MAJOR.MINOR."""

    cuda: str | None
    driver: str | None
    arch: str
    brand: str | None = None
    cuda_at_least: str | None = None  # where ``cuda`` is not known: a lower bound


def requirements(env: Mapping[str, str]) -> tuple[list[str], str | None]:
    """(the requirements the hook passes on, why the hook fails before evaluating any)."""
    if env.get("NVIDIA_DISABLE_REQUIRE") in _TRUE:
        return [], None
    found = [
        value
        for name, value in sorted(env.items())
        if name.startswith("NVIDIA_REQUIRE_") and not name.startswith("NVIDIA_REQUIRE_JETPACK")
    ]
    if env.get("CUDA_VERSION") and not env.get("NVIDIA_REQUIRE_CUDA"):
        version = _SEMVER.fullmatch(env["CUDA_VERSION"])
        if version is None:
            return found, (
                f"CUDA_VERSION={env['CUDA_VERSION']} is no version, and the image is a legacy "
                "CUDA image (no NVIDIA_REQUIRE_CUDA): the hook fails ('failed to get version')"
            )
        found.append(f"cuda>={int(version[1])}.{int(version[2] or 0)}")
    if len(found) > _MAX_REQUIREMENTS:
        return found, f"{len(found)} requirements ('too many requirements': at most 16)"
    return found, None


def compare_version(v1: str, op: str, v2: str) -> int:
    """dsl_compare_version: 1 true, 0 false, -1 (invalid) where either holds a
    character other than digits and dots or a part that is no number."""
    if v1.strip("0123456789.") or v2.strip("0123456789."):
        return _INVALID
    i = j = 0
    while i < len(v1) and j < len(v2):
        m1, m2 = re.match(r"\d+", v1[i:]), re.match(r"\d+", v2[j:])
        if m1 is None or m2 is None:
            return _INVALID  # strtoumax read nothing (a part that starts with a dot)
        n1, n2 = int(m1[0]), int(m2[0])
        if max(n1, n2) >= 2**64 - 1:
            return _INVALID  # UINTMAX_MAX
        if n1 != n2:
            if op in ("=", "!="):
                return int(op == "!=")
            return int(n1 < n2) if op in ("<", "<=") else int(n1 > n2)
        i, j = _past_dots(v1, i + len(m1[0])), _past_dots(v2, j + len(m2[0]))
    return _tail(v1[i:], op, v2[j:])


def _past_dots(text: str, at: int) -> int:
    while at < len(text) and text[at] == ".":
        at += 1
    return at


def _tail(rest1: str, op: str, rest2: str) -> int:
    """What is left after the common parts (strspn of ".0" skipped) decides."""
    a, b = rest1.lstrip(".0") == "", rest2.lstrip(".0") == ""
    if op == "!=":
        return int(not a or not b)
    if op in ("=", "<=", ">=") and a and b:
        return 1
    if op == "=":
        return 0
    return int(a and not b) if op in ("<", "<=") else int(not a and b)


def _rule(expr: str, known: Mapping[str, str]) -> int:
    """evaluate_rule: one condition with the property values ``known``."""
    n = len(re.match(r"[^<>=!]*", expr)[0])  # type: ignore[index]
    run = len(re.match(r"[<>=!]*", expr[n:])[0])  # type: ignore[index]
    if n == 0 or run == 0:
        return _INVALID
    # strncmp(ptr, op, run): the first operator whose first ``run`` characters are the
    # run (so a lone "!" is "!=")
    op = next((o for o in _OPERATORS if len(o) >= run and o[:run] == expr[n : n + run]), None)
    value = expr[n + run :]
    name = expr[:n].lower()
    if op is None or not value or name not in _RULES:
        return _INVALID
    have = known[name]
    if name == "brand":
        return int((have.lower() == value.lower()) == (op == "=")) if op in ("=", "!=") else -1
    return compare_version(have, op, value)


def _evaluate(predicate: str, known: Mapping[str, str]) -> str | None:
    """dsl_evaluate: None where the predicate holds, else libnvidia-container's error."""
    ret = 1
    for alternative in predicate.split(" "):
        if not alternative:
            continue
        whole = True
        for condition in alternative.split(","):
            if not condition:
                continue
            ret = _rule(condition, known)
            if ret < 0:
                return "invalid expression"
            if not ret:
                whole = False
                break
        if whole:
            break
    if ret:
        return None
    first = predicate.split(" ", 1)[0]
    if first.startswith("cuda>="):
        return (
            f"unsatisfied condition: {first}, please update your driver to a newer version, "
            "or use an earlier cuda container"
        )
    return f"unsatisfied condition: {first}"


def _versions_around(values: list[str]) -> list[str]:
    """Property values at which comparisons with ``values`` can change: each value,
    one just below and one just above it, and the extremes."""
    out = {"0", "99999999"}
    for v in values:
        if not v or v.strip("0123456789."):
            continue
        out |= {v, v + ".0.0.0.1"}
        parts = [p for p in v.split(".") if p]
        for k in range(len(parts) - 1, -1, -1):
            if parts[k].strip("0"):
                out.add(".".join([*parts[:k], str(int(parts[k]) - 1), "99999999"]))
                break
    return sorted(out)


def _assignments(reqs: list[str], known: Known) -> Iterator[dict[str, str]]:
    """Every combination of values worth trying for the properties not known."""
    mentioned: dict[str, list[str]] = {r: [] for r in _RULES}
    for req in reqs:
        for condition in re.split(r"[ ,]", req):
            m = re.match(r"([^<>=!]+)[<>=!]+(.*)", condition)
            if m and m[1].lower() in mentioned:
                mentioned[m[1].lower()].append(m[2])
    cuda = _versions_around(mentioned["cuda"])
    if known.cuda_at_least is not None:
        floor = known.cuda_at_least
        cuda = [floor, *(v for v in cuda if compare_version(v, ">=", floor) == 1)]
    choices = {
        "cuda": [known.cuda] if known.cuda is not None else cuda,
        "driver": (
            [known.driver] if known.driver is not None else _versions_around(mentioned["driver"])
        ),
        "arch": [known.arch],
        "brand": [known.brand]
        if known.brand is not None
        else sorted({b.lower() for b in mentioned["brand"]} | _BRANDS),
    }
    for values in product(*(choices[r] for r in _RULES)):
        yield dict(zip(_RULES, values, strict=True))


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """Whether the toolkit starts the container: ``refused`` with its error where it
    never does, ``maybe`` where it depends on what is not known, and whether only the
    GPU's brand decides that (``by_brand``: some brand passes whatever else holds)."""

    refused: str | None = None
    maybe: str | None = None
    by_brand: bool = False


def evaluate(reqs: list[str], known: Known) -> Outcome:
    """All requirements, each with the GPU (configure_command): the first failure stops."""
    by_rest: dict[tuple[str, str], set[str | None]] = {}
    for values in _assignments(reqs, known):
        error = next((e for req in reqs if (e := _evaluate(req, values)) is not None), None)
        by_rest.setdefault((values["cuda"], values["driver"]), set()).add(error)
    results = set().union(*by_rest.values())
    if results == {None}:
        return Outcome()
    failures = sorted(e for e in results if e is not None)
    if None not in results:
        return Outcome(refused=failures[0])
    return Outcome(maybe=failures[0], by_brand=all(None in r for r in by_rest.values()))
