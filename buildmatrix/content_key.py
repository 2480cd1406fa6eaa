"""A variant's content key: one sha256 over everything that shapes what it builds.

The key covers the generated Dockerfile's text (template, labels,
``NVIDIA_REQUIRE_ARCH`` and the base references with any pinned digest or mirror,
buildmatrix.bases), the platform, the build arguments, and the files of the build
context that the Dockerfile reads: the sources of ``COPY``/``ADD`` and of
``RUN --mount=type=bind`` without ``from=`` (Dockerfile reference, "COPY", "ADD",
"RUN --mount=type=bind"). Where a source cannot be known without building (a
variable, a heredoc, another escape character), the whole context counts. A
``.dockerignore`` in the context counts as a file, and the files it excludes still
count: the key may change when the build would see nothing new, never the other way
(docs/generate.md, "Content keys").

Files count by path, type, content and whether any execute bit is set (the one mode
bit git records, so two checkouts agree whatever their umask); never by mtime or
owner. Paths are sorted. A symlink counts by its target, as the build context sends
it (BuildKit's fsutil sends links, not what they point to).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import posixpath
import re
import shlex
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path

from buildmatrix.bases import external_refs

VERSION = "buildmatrix content key v1"
SHORT = 16  # hex digits of the key in an immutable tag: 64 bits
WHOLE = "."  # the source that stands for the whole context
_INSTRUCTION = re.compile(r"^\s*(?P<op>[A-Za-z]+)\s+(?P<args>.*)$", re.DOTALL)
_DIRECTIVE = re.compile(r"^#\s*escape\s*=\s*(?P<char>\S)", re.IGNORECASE)
_FLAGS = re.compile(r"^(?P<flags>(?:--\S+\s+)*)(?P<rest>.*)$", re.DOTALL)
_URL = re.compile(r"^(?:https?://|git@|git://)", re.IGNORECASE)


def _instructions(text: str) -> list[str] | None:
    """The Dockerfile's instructions with continuation lines joined and comment lines
    dropped; None where the escape character is not ``\\`` (not parsed here)."""
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        m = _DIRECTIVE.match(line)
        if m and m["char"] != "\\":
            return None
    out: list[str] = []
    current = ""
    for raw in text.splitlines():
        if raw.lstrip().startswith("#"):
            continue  # comments may sit between continuation lines
        stripped = raw.rstrip()
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += raw
        if current.strip():
            out.append(current.strip())
        current = ""
    if current.strip():
        out.append(current.strip())
    return out


def _words(args: str) -> list[str] | None:
    """An instruction's arguments: the JSON (exec) form or shell-like words."""
    if args.startswith("["):
        try:
            value = json.loads(args)
        except ValueError:
            return None
        return [str(v) for v in value] if isinstance(value, list) else None
    try:
        return shlex.split(args, posix=True)
    except ValueError:
        return None


def _mount_sources(args: str) -> list[str] | None:
    """Context paths a RUN binds: ``--mount=type=bind`` (the default type) without
    ``from=``; its ``source`` defaults to the context root."""
    found: list[str] = []
    for flag in re.findall(r"--mount=(\S+)", args):
        opts = {k: v for k, _, v in (o.partition("=") for o in flag.split(","))}
        if opts.get("type", "bind") != "bind" or "from" in opts:
            continue
        source = opts.get("source", opts.get("src", WHOLE))
        if "$" in source:
            return None
        found.append(source)
    return found


def used_sources(text: str) -> list[str] | None:
    """The context paths (globs allowed) a Dockerfile reads, or None where they cannot
    be known from its text: then the whole context counts."""
    instructions = _instructions(text)
    if instructions is None:
        return None
    sources: list[str] = []
    for instruction in instructions:
        m = _INSTRUCTION.match(instruction)
        if m is None:
            continue
        op, args = m["op"].upper(), m["args"]
        if op == "RUN":
            bound = _mount_sources(args)
            if bound is None:
                return None
            sources += bound
            continue
        if op not in ("COPY", "ADD"):
            continue
        if "<<" in args:
            return None  # a heredoc: its lines are in the text, its sources are not parsed
        head = _FLAGS.match(args)
        flags, rest = (head["flags"].split(), head["rest"]) if head else ([], args)
        if any(f.lower().startswith("--from=") for f in flags):
            continue  # another stage or image, not the context
        words = _words(rest)
        if words is None:
            return None
        paths = words[:-1]  # the last word is the destination
        for path in paths:
            if _URL.match(path):
                continue  # fetched, named in the text
            if "$" in path:
                return None
            sources.append(path)
    return sources


def _clean(source: str) -> str:
    """A source as a path inside the context: '..' cannot climb above the root
    (BuildKit resolves sources within the context)."""
    path = posixpath.normpath("/" + source).lstrip("/")
    return path or WHOLE


def _matches(pattern: str, path: str) -> bool:
    """Go's filepath.Match over whole path segments: '*' stops at '/'."""
    parts, names = pattern.split("/"), path.split("/")
    return len(parts) == len(names) and all(
        fnmatch.fnmatchcase(n, p) for p, n in zip(parts, names, strict=True)
    )


def _entry(path: Path) -> str:
    """One context entry's descriptor: type, normalised mode, content."""
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode):
        return f"link {path.readlink().as_posix()}"
    if stat.S_ISDIR(info.st_mode):
        return "dir"
    if not stat.S_ISREG(info.st_mode):
        return "special"  # a socket or FIFO: never read (it could block)
    mode = "755" if info.st_mode & 0o111 else "644"
    return f"file {mode} sha256:{hashlib.sha256(path.read_bytes()).hexdigest()}"


def _tree(context: Path) -> dict[str, Path]:
    """Every entry under ``context`` by its posix path (links not followed)."""
    found: dict[str, Path] = {}
    for path in context.rglob("*"):
        found[path.relative_to(context).as_posix()] = path
    return found


def context_files(context: Path, sources: Iterable[str] | None) -> dict[str, str]:
    """path -> descriptor for the context entries ``sources`` reach (a folder brings
    everything below it; a glob matches within its segments), plus ``.dockerignore``;
    a source that matches nothing counts as ``missing`` (the build would fail, and
    the key changes when the file appears). ``None``: the whole context."""
    tree = _tree(context)
    chosen: dict[str, str] = {}
    wanted = [WHOLE] if sources is None else [_clean(s) for s in sources]
    for source in wanted:
        if source == WHOLE:
            hits = list(tree)
        else:
            tops = [p for p in tree if _matches(source, p)]
            hits = [p for p in tree if any(p == t or p.startswith(t + "/") for t in tops)]
            if not tops:
                chosen[source] = "missing"
        for path in hits:
            chosen[path] = _entry(tree[path])
    if ".dockerignore" in tree:
        chosen[".dockerignore"] = _entry(tree[".dockerignore"])
    return dict(sorted(chosen.items()))


def content_key(
    *,
    dockerfile: str,
    platform: str,
    files: Mapping[str, str],
    build_args: Mapping[str, str] | None = None,
) -> str:
    """The key (64 hex digits) of one variant on one platform. Pure."""
    doc = {
        "version": VERSION,
        "dockerfile": "sha256:" + hashlib.sha256(dockerfile.encode()).hexdigest(),
        "bases": external_refs(dockerfile),
        "platform": platform,
        "build_args": dict(sorted((build_args or {}).items())),
        "files": dict(sorted(files.items())),
    }
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def combined_key(keys: Mapping[str, str]) -> str:
    """The key of a multi-platform tag: over its platforms' keys, sorted by platform."""
    blob = json.dumps({"version": VERSION, "platforms": dict(sorted(keys.items()))})
    return hashlib.sha256(blob.encode()).hexdigest()
