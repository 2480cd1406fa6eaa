"""buildmatrix: the GPU architecture as a first-class axis of builds and node admission."""

from importlib.metadata import PackageNotFoundError, version

# The distribution's name on the package index (the import name stays buildmatrix).
DISTRIBUTION = "buildmatrix-gpu"

try:
    # set at build time from the release tag (pyproject.toml, [tool.hatch.version])
    __version__ = version(DISTRIBUTION)
except PackageNotFoundError:  # a source tree on sys.path, never installed
    __version__ = "0+unknown"
