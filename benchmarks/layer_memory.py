"""Benchmark: memory and time of reading a layer of many empty files.

    .venv/bin/python benchmarks/layer_memory.py [ENTRIES] [stream|in-place]

Writes a layer tar of ENTRIES (default 1,000,000) empty files in 1,000 folders,
gzip-compressed for ``stream`` (read by ``scan_layer``) or plain inside a file for
``in-place`` (read by ``scan_layer_at``), then reads it in this process and prints
the peak RSS the read added, per entry, and the time it took. docs/security.md,
"Bounds", has the numbers.
"""

from __future__ import annotations

import gzip
import io
import resource
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import IO, cast

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from buildmatrix.image.inplace import scan_layer_at  # noqa: E402
from buildmatrix.image.layers import scan_layer  # noqa: E402


def write_layer(out: IO[bytes], entries: int) -> None:
    """The layer tar, header by header (tarfile's writer would keep every member and
    so raise the peak before the read is measured)."""
    for i in range(entries):
        out.write(tarfile.TarInfo(f"d{i // 1000}/f{i}").tobuf(tarfile.USTAR_FORMAT))
    out.write(b"\0" * 1024)


def main() -> None:
    entries = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    how = sys.argv[2] if len(sys.argv) > 2 else "stream"
    with tempfile.NamedTemporaryFile(prefix="bm-layer-") as f:
        if how == "stream":
            with gzip.GzipFile(fileobj=f, mode="wb", mtime=0) as gz:
                write_layer(cast(IO[bytes], gz), entries)
            f.flush()
            blob = Path(f.name).read_bytes()
            before, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter()
            scan_layer(io.BytesIO(blob), name="layer")
        else:
            write_layer(f, entries)
            f.flush()
            size = f.tell()
            before, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter()
            scan_layer_at(Path(f.name), 0, size, name="layer")
        took = time.perf_counter() - start
    added = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    print(
        f"{how}: {entries} entries: the read added {added >> 10} MiB to the peak RSS "
        f"({added * 1024 // entries} bytes per entry) in {took:.1f} s"
    )


if __name__ == "__main__":
    main()
