"""Masterminds semver v3, as far as the NVIDIA container toolkit's ``enable-cuda-compat``
hook uses it to compare a compat driver's version with the host's (buildmatrix.forward,
rule 4): ``NewVersion`` and ``Compare`` (github.com/Masterminds/semver, version.go).
"""

from __future__ import annotations

import re

# Masterminds/semver v3 ``looseSemVerRegex``, which ``NewVersion`` uses (its default
# ``CoerceNewVersion``); ``validatePrerelease``/``validateMetadata`` then check the parts.
_LOOSE_SEMVER = re.compile(
    r"v?([0-9]+)(\.[0-9]+)?(\.[0-9]+)?"
    r"(-([0-9A-Za-z\-]+(\.[0-9A-Za-z\-]+)*))?"
    r"(\+([0-9A-Za-z\-]+(\.[0-9A-Za-z\-]+)*))?"
)
_U64 = (1 << 64) - 1
SemVer = tuple[int, int, int, str]


def parse_semver(text: str) -> SemVer | None:
    """Masterminds semver's ``NewVersion`` (version.go, ``coerceNewVersion``): None
    where it returns an error."""
    m = _LOOSE_SEMVER.fullmatch(text) if len(text) <= 256 else None
    if m is None:
        return None
    nums = [int(m[1]), int((m[2] or ".0")[1:]), int((m[3] or ".0")[1:])]
    if any(n > _U64 for n in nums):
        return None  # strconv.ParseUint overflows
    pre = m[5] or ""
    for part in pre.split(".") if pre else ():
        if part.isdigit() and len(part) > 1 and part[0] == "0":
            return None  # validatePrerelease: ErrSegmentStartsZero
    return (nums[0], nums[1], nums[2], pre)


def semver_newer(a: SemVer, b: SemVer) -> bool:
    """``a.Compare(b) > 0`` (version.go ``Compare``, ``comparePrerelease``)."""
    if a[:3] != b[:3]:
        return a[:3] > b[:3]
    if a[3] == b[3]:
        return False
    if not a[3] or not b[3]:
        return not a[3]  # a release is newer than its prereleases
    for x, y in zip(a[3].split("."), b[3].split("."), strict=False):
        if x != y:
            if x.isdigit() and y.isdigit():
                return int(x) > int(y)
            if x.isdigit() or y.isdigit():
                return y.isdigit()  # numbers sort before words
            return x > y
    return len(a[3].split(".")) > len(b[3].split("."))
