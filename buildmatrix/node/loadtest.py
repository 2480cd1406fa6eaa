"""``smoke --load-test``: load an image's device code on each GPU model through the driver.

NVML cannot say whether the driver will accept a module; the driver can. For every
file with device code, each fatbinary container (one translation unit's module),
cubin or PTX file is handed to ``cuModuleLoadData`` in the primary context of one
GPU of each model, so the driver picks SASS or JIT-compiles PTX exactly as at run
time, then ``cuModuleUnload``. The only libcuda I/O in buildmatrix, with ``ctypes``
on ``libcuda.so.1`` (the driver ships it: no toolkit on the node, every branch).

API: CUDA Driver API reference, "Initialization", "Device Management", "Primary
Context Management", "Module Management"; versioned entry points as ``cuda.h``
maps them (``cuCtxPushCurrent`` -> ``cuCtxPushCurrent_v2``, ...).
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

from buildmatrix.arch import ComputeCapability
from buildmatrix.binary.elf import read_elf
from buildmatrix.binary.fatbin import container_spans, parse_fatbin
from buildmatrix.binary.report import FileReport
from buildmatrix.binary.source import CorruptBinary, FileSource, read_exact
from buildmatrix.compat import Verdict, judge_codes
from buildmatrix.cuda import CudaFacts
from buildmatrix.errors import EnvironmentUnavailable
from buildmatrix.node.results import LoadResult

_CC_MAJOR, _CC_MINOR = 75, 76  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR
_MAX_MODULE = 1 << 30  # no real module is near 1 GiB; refuse to buffer more


# What the driver answers on a GPU busy with other work (cuda.h): DEVICE_UNAVAILABLE
# (46) where another process holds a GPU in exclusive-process mode ("Devices are often
# unavailable due to use of CU_COMPUTEMODE_EXCLUSIVE_PROCESS or
# CU_COMPUTEMODE_PROHIBITED"; the runtime's cudaErrorDevicesUnavailable, 46, adds
# "memory constraints on a device that already has active CUDA work"), OUT_OF_MEMORY
# (2) where others' work fills its memory. Whether the GPU is busy or broken is told
# by NVML (node/checks.py, check_load): its compute mode and running processes.
BUSY_ERRORS = ("CUDA_ERROR_DEVICE_UNAVAILABLE", "CUDA_ERROR_OUT_OF_MEMORY")


class Busy(Exception):
    """The GPU refused the load test a context or memory (:data:`BUSY_ERRORS`)."""


class CudaUnavailable(EnvironmentUnavailable):
    """libcuda cannot be loaded or initialised here (:func:`load_test` reports it as
    the result of each model)."""


@dataclass(frozen=True, kw_only=True)
class Module:
    """One loadable image: where it came from, its bytes, and whether it needs JIT."""

    where: str
    data: bytes
    expects_jit: bool


def modules_of(report: FileReport, cc: ComputeCapability, facts: CudaFacts) -> Iterator[Module]:
    """Every module image of one scanned file (kept by the scan), in file order."""
    if report.stored is None:
        raise CorruptBinary(f"{report.path}: its bytes were not kept for the load test.")
    if report.format == "archive":
        return  # a static archive is linked at build time, never loaded
    fd = os.open(report.stored, os.O_RDONLY)
    try:
        src = FileSource(fd, name=report.path)
        if report.format in ("cubin", "ptx"):
            if src.size > _MAX_MODULE:
                raise CorruptBinary(f"{report.path}: {src.size} bytes, too large to load.")
            data = read_exact(src, 0, src.size, what="module")
            if report.format == "ptx":
                yield Module(where=report.path, data=data + b"\0", expects_jit=True)
            else:
                yield Module(where=report.path, data=data, expects_jit=False)
            return
        if report.format == "fatbin":
            start, length = 0, src.size
        else:
            section = read_elf(src).section(".nv_fatbin")
            if section is None:
                return  # relocatable device code only: linked at build time, never loaded
            start, length = section.offset, section.size
        spans = list(container_spans(src, start, length, where="fatbin"))
        for i, (offset, size) in enumerate(spans):
            if size > _MAX_MODULE:
                raise CorruptBinary(f"{report.path}: container {i} is {size} bytes; refused.")
            one = replace(report, entries=tuple(parse_fatbin(src, offset, size, where="module")))
            verdict = judge_codes(one.code_targets(), cc, driver=None, facts=facts).verdict
            yield Module(
                where=report.path if len(spans) == 1 else f"{report.path} (container {i})",
                data=read_exact(src, offset, size, what="fatbin container"),
                expects_jit=verdict is Verdict.JIT,
            )
    finally:
        os.close(fd)


class Driver:
    """The few driver API calls the load test needs, raising on any error."""

    def __init__(self) -> None:
        try:
            self._lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise CudaUnavailable(
                f"libcuda.so.1 cannot be loaded ({exc}); run on a GPU node, in a container "
                "started by the NVIDIA container toolkit with NVIDIA_DRIVER_CAPABILITIES "
                "including compute"
            ) from None
        self._lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        self._lib.cuModuleLoadData.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
        code = self._lib.cuInit(0)
        if code != 0:
            raise CudaUnavailable(f"cuInit failed: {self.error_name(code)}")

    def error_name(self, code: int) -> str:
        name = ctypes.c_char_p()
        if self._lib.cuGetErrorName(code, ctypes.byref(name)) != 0 or not name.value:
            return f"CUDA error {code}"
        return name.value.decode()

    def _call(self, fn: str, *args: object) -> None:
        code = getattr(self._lib, fn)(*args)
        if code != 0:
            raise RuntimeError(f"{fn}: {self.error_name(code)}")

    def devices(self) -> list[tuple[int, str, ComputeCapability]]:
        """(ordinal, name, compute capability) of every device the driver sees."""
        count = ctypes.c_int()
        self._call("cuDeviceGetCount", ctypes.byref(count))
        found = []
        for ordinal in range(count.value):
            dev = ctypes.c_int()
            self._call("cuDeviceGet", ctypes.byref(dev), ordinal)
            major, minor = ctypes.c_int(), ctypes.c_int()
            self._call("cuDeviceGetAttribute", ctypes.byref(major), _CC_MAJOR, dev)
            self._call("cuDeviceGetAttribute", ctypes.byref(minor), _CC_MINOR, dev)
            name = ctypes.create_string_buffer(256)
            self._call("cuDeviceGetName", name, 256, dev)
            cc = ComputeCapability(major.value, minor.value)
            found.append((dev.value, name.value.decode(), cc))
        return found

    def load_file(self, device: int, modules: Iterator[Module]) -> FileLoad:
        """Load and unload each module of one file in the device's primary context."""
        ctx = ctypes.c_void_p()
        code = self._lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device)
        if code != 0:
            name = self.error_name(code)
            if name in BUSY_ERRORS:
                raise Busy(f"cuDevicePrimaryCtxRetain: {name}")
            raise RuntimeError(f"cuDevicePrimaryCtxRetain: {name}")
        tally = FileLoad()
        try:
            self._call("cuCtxPushCurrent_v2", ctx)
            try:
                for module in modules:
                    handle = ctypes.c_void_p()
                    start = time.monotonic()
                    code = self._lib.cuModuleLoadData(ctypes.byref(handle), module.data)
                    took = time.monotonic() - start
                    if code != 0:
                        if self.error_name(code) == "CUDA_ERROR_OUT_OF_MEMORY":
                            raise Busy(f"{module.where}: CUDA_ERROR_OUT_OF_MEMORY")
                        tally.failures.append(f"{module.where}: {self.error_name(code)}")
                        continue
                    self._call("cuModuleUnload", handle)
                    tally.loaded += 1
                    if module.expects_jit:
                        tally.jit += 1
                        tally.jit_seconds += took
            finally:
                self._call("cuCtxPopCurrent_v2", ctypes.byref(ctypes.c_void_p()))
        finally:
            self._call("cuDevicePrimaryCtxRelease_v2", device)
        return tally


@dataclass
class FileLoad:
    """What the driver did with one file's modules."""

    loaded: int = 0
    jit: int = 0
    jit_seconds: float = 0.0
    failures: list[str] = field(default_factory=list)

    def line(self, path: str) -> str:
        if self.failures:
            return f"{path}: " + "; ".join(self.failures)
        how = f"{self.jit} by PTX JIT in {self.jit_seconds:.2f} s" if self.jit else "SASS"
        return f"{path}: {self.loaded} module(s) loaded ({how})"


def load_test(image: str, files: Sequence[FileReport], facts: CudaFacts) -> list[LoadResult]:
    """Load ``files`` on one GPU of each model; one result per model."""
    try:
        driver = Driver()
        devices = driver.devices()
    except (CudaUnavailable, RuntimeError) as exc:
        error = f"the load test cannot run: {exc}"
        return [LoadResult(image=image, model="this node", loaded=0, jit=0, error=error)]
    by_model: dict[tuple[str, ComputeCapability], list[int]] = {}
    for ordinal, name, cc in devices:
        by_model.setdefault((name, cc), []).append(ordinal)
    results = []
    for (name, cc), ordinals in by_model.items():
        refused: list[str] = []
        for ordinal in ordinals:  # the first GPU of the model that is not busy
            try:
                loads, stopped = _on_gpu(driver, ordinal, files, cc, facts)
            except Busy as exc:
                refused.append(f"GPU {ordinal}: {exc}")
                continue
            break
        else:
            error = f"the load test found every GPU of this model busy ({'; '.join(refused)})"
            results.append(
                LoadResult(
                    image=image, model=f"{name} ({cc})", loaded=0, jit=0, error=error, busy=True
                )
            )
            continue
        results.append(
            LoadResult(
                image=image,
                model=f"{name} ({cc})",
                loaded=sum(f.loaded for _, f in loads),
                jit=sum(f.jit for _, f in loads),
                jit_seconds=sum(f.jit_seconds for _, f in loads),
                failures=tuple(x for _, f in loads for x in f.failures),
                files=tuple(f.line(path) for path, f in loads),
                error=stopped,
            )
        )
    return results


def _on_gpu(
    driver: Driver,
    ordinal: int,
    files: Sequence[FileReport],
    cc: ComputeCapability,
    facts: CudaFacts,
) -> tuple[list[tuple[str, FileLoad]], str | None]:
    """Every file loaded on one GPU: each file's tally, and why the test stopped (None:
    it ran to the end). Raises :class:`Busy` where the GPU is (another is tried)."""
    loads: list[tuple[str, FileLoad]] = []
    try:
        for report in files:
            loads.append((report.path, driver.load_file(ordinal, modules_of(report, cc, facts))))
    except (CorruptBinary, RuntimeError) as exc:
        return loads, f"the load test stopped: {exc}"
    return loads, None
