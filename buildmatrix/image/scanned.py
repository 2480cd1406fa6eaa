"""What an image source hands to ``check``: the image's config, its final view's
device code (:class:`ScannedImage`), and the layer blobs a source reads (:class:`LayerBlob`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import IO, Any

from buildmatrix.binary.cudart import CudaRuntime
from buildmatrix.binary.report import FileReport, Links
from buildmatrix.forward import CompatSetup


@dataclass(frozen=True, kw_only=True)
class ImageConfig:
    labels: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    image_id: str | None = None
    # os/architecture[/variant] of the config (OCI image-spec config.md; the engine's
    # inspect spells them Os/Architecture/Variant); None where it names none
    platform: str | None = None

    @classmethod
    def from_json(
        cls,
        doc: dict[str, Any],
        *,
        image_id: str | None = None,
        source: str = "image config",
        blob: bool = True,
    ) -> ImageConfig:
        """From an image config blob (``{"config": {"Labels":…, "Env":[…]}}``); a field of
        the wrong type is an input error naming it (schema image-config), and so is a
        key Go's JSON reader would match otherwise (buildmatrix.image.gokeys; not for
        the engine's own inspect answer, ``blob=False``)."""
        from buildmatrix import schema
        from buildmatrix.image.gokeys import check_keys

        if blob:
            check_keys(doc, shape="config", name=source)
        schema.validate(doc, "image-config", source=source)
        cfg = doc.get("config") or doc.get("Config") or {}
        labels = {str(k): str(v) for k, v in (cfg.get("Labels") or {}).items()}
        env = {}
        for item in cfg.get("Env") or []:
            key, eq, value = str(item).partition("=")
            # A bare KEY unsets only a default of the engine's own (PATH, HOSTNAME),
            # never an earlier entry of the image: moby container/env.go and containerd
            # oci/spec_opts.go replaceOrAppendEnvValues look it up in the defaults only.
            if eq:
                env[key] = value
        parts = [str(doc.get(k) or doc.get(k.title()) or "") for k in ("os", "architecture")]
        variant = str(doc.get("variant") or doc.get("Variant") or "")
        platform = "/".join([*parts, variant] if variant else parts) if all(parts) else None
        return cls(labels=labels, env=env, image_id=image_id, platform=platform)


@dataclass(frozen=True, kw_only=True)
class ScannedImage:
    """An image reduced to what ``check`` needs."""

    ref: str
    digest: str | None
    config: ImageConfig
    files: list[FileReport]
    problems: list[str]
    paths: list[str]
    layers: int
    # The final view's symlinks (path -> target as written) and the CUDA forward
    # compatibility driver the NVIDIA container toolkit would find (buildmatrix.forward).
    symlinks: dict[str, str] = field(default_factory=dict)
    compat: CompatSetup | None = None
    # How the layers were read, where there was a choice (the local engine).
    read_from: str | None = None
    # The platforms the image offers (os/arch[/variant]): an index's entries, else the
    # config's own platform; () where neither names one (buildmatrix.image.offered).
    offered: tuple[str, ...] = ()
    # Requests that pick what another containerd generation runs for the platform
    # asked (os.features: buildmatrix.image.manifests.choose); each is judged too.
    also: tuple[str, ...] = ()
    # The digest of the index the REF named, the entry above was picked from; None
    # where the REF named a single manifest or the source keeps no index.
    index_digest: str | None = None
    # Each ELF file's DT_RPATH/DT_RUNPATH (binary.dynamic), and the compat lookup
    # (forward.find_compat) over this final view given other search paths: check
    # --ignore looks again without an ignored file's, which is never loaded and so
    # asks for no libcuda.so.1 (buildmatrix.check).
    searches: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    compat_lookup: Callable[..., CompatSetup | None] | None = field(default=None, compare=False)
    # How each ELF file of the final view that holds device code or loads other
    # files is loaded (buildmatrix.binary.report.Links), by path; None where the
    # source did not read it (one file given alone): every file then counts.
    links: dict[str, Links] | None = None
    # The final view's files that are or link in a CUDA runtime, read by content
    # (buildmatrix.binary.cudart; ``inner`` dropped): a renamed or static runtime.
    runtimes: tuple[CudaRuntime, ...] = ()

    def paths_found(self, pattern: re.Pattern[str]) -> tuple[re.Match[str], ...]:
        """``pattern.search`` of each path of the final view, the hits in path order.
        Kept per pattern: an image's paths (tens of thousands) are searched once,
        however many GPUs and drivers it is judged on (buildmatrix.runtime_sources).
        A source builds the image whole and nothing changes its lists after."""
        if pattern not in self._found:
            hits = (pattern.search(path) for path in self.paths)
            self._found[pattern] = tuple(m for m in hits if m is not None)
        return self._found[pattern]

    @cached_property
    def _found(self) -> dict[re.Pattern[str], tuple[re.Match[str], ...]]:
        return {}


Progress = Callable[[int], None]  # called with bytes read since the last call


@dataclass(frozen=True, kw_only=True)
class LayerBlob:
    """A layer to read: a name for messages, how to open it, the digest to verify."""

    name: str
    open: Callable[[], AbstractContextManager[IO[bytes]]]
    digest: str | None = None
    # Where the blob lies whole in a regular file (file, offset, size): a blob with
    # no digest to verify is then read in place (inplace.scan_layer_at).
    place: tuple[Path, int, int] | None = None
    # The config's rootfs.diff_ids entry: the digest of the uncompressed layer.
    diff_id: str | None = None
    # The local file the blob is read from (an OCI layout's): the layer cache trusts
    # its entry only while this file is the one a read verified.
    local: Path | None = None
    # A layer of a docker save archive that docker load reads: bzip2 and xz are
    # inflated too, as moby's DecompressStream does (tarstream.ENGINE_LOAD); every
    # other layer is decompressed as containerd does (tarstream.CONTAINERD).
    engine_load: bool = False
