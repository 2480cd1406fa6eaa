"""What ``check`` judges an image against: its options, and the target GPUs they, a
node snapshot or the image's family label name (else every profile: where does the
image run?).

Pure: profiles, the scanned image and the options in, targets out; buildmatrix.check
judges each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from buildmatrix.arch import parse_sm
from buildmatrix.cuda import DriverVersion
from buildmatrix.errors import InputError
from buildmatrix.image.scanned import ScannedImage
from buildmatrix.profiles import Profile, ProfileSet
from buildmatrix.snapshot import Snapshot
from buildmatrix.target_verdict import Target

FAMILY_LABEL = "io.buildmatrix.family"
ALL_FAMILIES = "all"  # --family all: every profile
# declared["source"] where neither flags, a snapshot nor the label name targets: every
# profile is judged, to say where the image runs (runs_on), not to gate it.
EVERY_PROFILE = "profiles"


@dataclass(frozen=True, kw_only=True)
class Options:
    families: Sequence[str] = ()
    sms: Sequence[str] = ()
    driver: DriverVersion | None = None
    snapshot: Snapshot | None = None
    require_sass: bool = False
    ignore: Sequence[str] = ()
    allow_empty: bool = False
    strict: bool = False  # every fatbinary container counts, specialised ones too


def _family_targets(profiles: ProfileSet, names: Sequence[str]) -> list[Target]:
    every = [f.value for f in profiles.families]
    names = [x for n in names for x in (every if n == ALL_FAMILIES else [n])]
    return [_profile_target(profiles, p, name=n) for n in names for p in profiles.family(n)]


def _profile_target(profiles: ProfileSet, profile: Profile, *, name: str) -> Target:
    return Target(
        name=name,
        cc=profile.cc,
        profile=profile,
        hardware_floor=profiles.hardware_floor(profile.cc),
        products=profile.products,
    )


def _label_families(label: str | None) -> list[str]:
    return [x.strip() for x in (label or "").split(",") if x.strip()]


def validate_targets(profiles: ProfileSet, opts: Options) -> None:
    """Check --family and --sm against the profiles before any image is read."""
    for name in opts.families:
        if name != ALL_FAMILIES:
            profiles.family(name)
    for text in opts.sms:
        try:
            sm = parse_sm(text)
        except InputError as exc:
            raise InputError(f"--sm {exc}{profiles.product_hint(text)}") from None
        profiles.get(f"sm_{sm.cc.number}")


def resolve_targets(
    profiles: ProfileSet, image: ScannedImage, opts: Options
) -> tuple[list[Target], dict[str, str | None], list[str]]:
    """Targets, where they came from, and problems with the image's own claim.

    With a snapshot the node's GPU models are the question and the image's family
    label is only a claim checked against them; else --family/--sm; else the label;
    else every profile (where does the image run?, source EVERY_PROFILE).
    """
    targets: list[Target] = []
    claims: list[str] = []
    label = image.config.labels.get(FAMILY_LABEL)
    if opts.snapshot is not None:
        models = sorted({(g.cc, g.name) for g in opts.snapshot.gpus})
        for cc, product in models:
            brands = {g.brand for g in opts.snapshot.gpus if g.name == product}
            targets.append(
                Target(
                    name=product,
                    cc=cc,
                    profile=profiles.by_cc(cc),
                    hardware_floor=profiles.hardware_floor(cc, product),
                    products=(product,),
                    brand=brands.pop() if len(brands) == 1 else None,
                )
            )
        declared: dict[str, str | None] = {"family": label, "source": "snapshot"}
        if label is not None:
            claimed = _label_families(label)
            for cc, product in models:
                profile = profiles.by_cc(cc)
                family = profile.family.value if profile else f"cc {cc}"
                if family not in claimed:
                    claims.append(
                        f"{product} ({family}): the image's {FAMILY_LABEL} label claims "
                        f"'{label}', which does not include this GPU's family"
                    )
    elif opts.families or opts.sms:
        declared = {"family": label, "source": "flags"}
    elif label is not None:
        targets = _family_targets(profiles, _label_families(label))
        declared = {"family": label, "source": "label"}
    else:
        targets = _family_targets(profiles, [ALL_FAMILIES])
        declared = {"family": None, "source": EVERY_PROFILE}
    if opts.families:
        targets += _family_targets(profiles, opts.families)
    for text in opts.sms:
        profile = profiles.get(f"sm_{parse_sm(text).cc.number}")
        targets.append(_profile_target(profiles, profile, name=profile.sm))
    if not targets:
        where = "the snapshot lists no GPU" if opts.snapshot else f"label '{label}' names none"
        raise InputError(
            f"'{image.ref}': no target GPU to check against ({where}); a check without "
            "targets proves nothing. Pass --family F or --sm SM."
        )
    unique = list({(t.name, t.cc): t for t in targets}.values())
    return unique, declared, claims
