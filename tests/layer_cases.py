"""Generated layer stacks for the overlay2 differential test (test_layer_semantics.py).

Each stack is built so that the Docker engine accepts it: the generator keeps, per
layer, what the layer itself already holds and never writes what the engine refuses
(the rules of docs/check.md, "Layer semantics", and buildmatrix.image.tree's
``LayerSummary``): a path twice in one layer, a hard link to a file the layer does not
hold, an entry under a non-folder of the same layer (a file, a symlink, a whiteout),
a whiteout over an entry of the same layer. Everything else is drawn toward what makes
layers interact: upper layers whiteout, make opaque (``.wh..wh..opq``), replace by
symlinks and hard links the names and folders that lower layers hold. One stack in
``REFUSED_EVERY`` gets one deliberate violation instead, so that both sides are still
compared on refusals.
"""

from __future__ import annotations

import posixpath
import random

from tests.images import Dir, Entry, Hardlink, Symlink, fixture

SM80 = fixture("libsass_sm80.so")
HOPPER = fixture("libhopper_a.so")
TEXT = b"text\n"

FOLDERS = ["d", "d/s", "e", "e/t"]
FILES = ["d/a", "d/b", "d/s/c", "e/f", "e/t/g", "h"]
LINK_TARGETS = ["d", "/d", "../d", "d/a", "/d/s/c", "s", "e/t", "nowhere", "h", "../../e"]
# Upper layers draw mostly what makes them interact with the layers below.
UPPER_OPS = ["whiteout"] * 4 + ["opaque"] * 4 + ["file"] * 2 + ["symlink"] * 2 + ["hardlink"] * 2
LOWER_OPS = ["file"] * 6 + ["symlink"] * 2 + ["hardlink"] * 2 + ["dir", "opaque", "whiteout"]
REFUSED_EVERY = 8
REFUSALS = ["twice", "hardlink-missing", "under-file", "whiteout-same", "through-symlink"]


class _Layer:
    """One layer being generated: its entries in order, and what it holds so far."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, Entry]] = []
        self.kinds: dict[str, str] = {}  # explicit entry path -> file/dir/symlink/whiteout
        self.folders: set[str] = set()  # folders the entries imply (MkdirAll)

    def free(self, path: str) -> bool:
        """Whether ``path`` can be written: not held yet, and no parent a non-folder."""
        if path in self.kinds or path in self.folders:
            return False
        parent = posixpath.dirname(path)
        while parent:
            if self.kinds.get(parent, "dir") != "dir":
                return False
            parent = posixpath.dirname(parent)
        return True

    def put(self, path: str, entry: Entry, kind: str) -> None:
        self.entries.append((path, entry))
        path = path.rstrip("/")
        self.kinds[path] = kind
        parent = posixpath.dirname(path)
        while parent:
            self.folders.add(parent)
            parent = posixpath.dirname(parent)


def _whiteout(path: str) -> str:
    folder, base = posixpath.split(path)
    return posixpath.join(folder, f".wh.{base}")


def _op(rng: random.Random, layer: _Layer, op: str, below: list[str]) -> None:
    """Add one entry of kind ``op`` if the layer can take it (else nothing)."""
    names = below if below and rng.random() < 0.8 else FILES + FOLDERS
    name = rng.choice(names)
    if op == "file" and layer.free(name):
        layer.put(name, rng.choice([SM80, HOPPER, TEXT]), "file")
    elif op == "dir" and layer.free(name):
        layer.put(name + "/", Dir(), "dir")
    elif op == "symlink" and layer.free(name):
        layer.put(name, Symlink(rng.choice(LINK_TARGETS)), "symlink")
    elif op == "hardlink":
        held = [p for p, k in layer.kinds.items() if k == "file"]
        if held and layer.free(name):
            layer.put(name, Hardlink(rng.choice(held)), "file")
    elif op == "whiteout" and layer.free(name) and layer.free(_whiteout(name)):
        layer.put(_whiteout(name), b"", "whiteout")
        layer.kinds[name] = "whiteout"
    elif op == "opaque":
        # A folder that lower layers put something in, where there is one.
        filled = sorted({posixpath.dirname(n) for n in below} & set(FOLDERS))
        folder = rng.choice(filled if filled and rng.random() < 0.9 else FOLDERS)
        marker = f"{folder}/.wh..wh..opq"
        if layer.kinds.get(folder, "dir") == "dir" and layer.free(marker):
            layer.put(marker, b"", "whiteout")
            # Entries of the same layer stay in its opaque folder: give it one sometimes.
            inside = f"{folder}/n{len(layer.entries)}"
            if rng.random() < 0.5 and layer.free(inside):
                layer.put(inside, rng.choice([SM80, HOPPER, TEXT]), "file")


def _refusal(rng: random.Random, layer: _Layer) -> None:
    """One entry the engine refuses, of a kind drawn from ``REFUSALS``."""
    kind = rng.choice(REFUSALS)
    if kind == "twice":
        layer.entries += [("twice", TEXT), ("twice", TEXT)]
    elif kind == "hardlink-missing":
        layer.entries.append(("hl", Hardlink("not-in-this-layer")))
    elif kind == "under-file":
        layer.entries += [("f", TEXT), ("f/under", TEXT)]
    elif kind == "whiteout-same":
        layer.entries += [("w", TEXT), (".wh.w", b"")]
    else:
        layer.entries += [("ln", Symlink("missing")), ("ln/x", TEXT)]


def generate(rng: random.Random, *, refused: bool) -> list[list[tuple[str, Entry]]]:
    """A stack of 2 to 4 layers, accepted by the engine unless ``refused``."""
    layers: list[_Layer] = []
    below: list[str] = []  # names lower layers hold (entries and folders)
    for i in range(rng.randint(2, 4)):
        layer = _Layer()
        ops = UPPER_OPS if i else LOWER_OPS
        for _ in range(rng.randint(2, 5) if i else rng.randint(4, 8)):
            _op(rng, layer, rng.choice(ops), below)
        layers.append(layer)
        below = sorted({*below, *layer.kinds, *layer.folders} - {""})
        below = [name for name in below if ".wh." not in name]
    if refused:
        _refusal(rng, rng.choice(layers))
    return [layer.entries for layer in layers]
