"""buildmatrix: the GPU architecture as a first-class axis of builds and node admission."""

from __future__ import annotations

from functools import cache
from pathlib import Path

# The distribution's name on the package index (the import name stays buildmatrix).
DISTRIBUTION = "buildmatrix-gpu"
# The folder of the user's arch profiles where --profiles is not given
# (profile_files.resolve_profiles_dir); here, so that the CLI can name it in its
# options without importing the profile loader.
PROFILES_ENV = "BUILDMATRIX_PROFILES"


@cache
def installed_version() -> str:
    """The installed distribution's version, set at build time from the release tag
    (pyproject.toml, [tool.hatch.version]); ``0+unknown`` for a source tree on sys.path
    that was never installed.

    Read on first use, not on import: importlib.metadata and its search of sys.path
    for the distribution's metadata cost a fresh process tens of milliseconds, which
    every command but ``--version`` would pay for nothing (docs/development.md,
    "Start-up time").
    """
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "0+unknown"


def package_file(*parts: str) -> Path:
    """A file shipped inside the package (``schemas/``, ``data/``, ``arch_profiles/``).

    The package is always read from a folder (an installed wheel or a checkout: the
    profiles are listed as a folder), so its own path serves; importlib.resources
    would give the same path after importing tempfile, shutil and zipfile, which
    every command would pay (docs/development.md, "Start-up time").
    """
    return Path(__file__).parent.joinpath(*parts)


def __getattr__(name: str) -> str:
    # ``buildmatrix.__version__`` stays available (PEP 562), read when asked for
    if name == "__version__":
        return installed_version()
    raise AttributeError(f"module 'buildmatrix' has no attribute {name!r}")
