"""buildmatrix: the GPU architecture as a first-class axis of builds and node admission."""

__version__ = "0.1.0"
