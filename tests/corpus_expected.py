"""What each package of the corpus documents: the GPU code its wheel is built with,
from its own build script or NVIDIA's release notes, and NVIDIA's rule for where that
code runs, restated here apart from ``buildmatrix/compat.py``.

A row's expected cell is "pass" where the documented code runs on the GPU, else
"fail". ``truth`` overrides a cell where the wheel's files, read with cuobjdump, say
otherwise, with the reason: a file that really lacks code the package documents (a
true failure), code the package does not document but really ships, or a package
whose code for a GPU exists only as data it loads itself ("skipped-only").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

# NVIDIA, CUDA C++ Programming Guide, "Binary Compatibility" and "PTX Compatibility",
# and the CUDA 12.9 blog on family-specific targets: SASS sm_XY runs on X.Z with
# Z >= Y; sm_XYa on X.Y alone; sm_XYf on X.Z, Z >= Y; PTX compute_XY JIT-compiles for
# any later capability (driver R580 reads every PTX ISA up to 9.0, CUDA 13.0); the
# integrated GPUs' SMs (7.2, 8.7, 8.8, 10.1 in CUDA 12, 11.0) are not binary-compatible
# with the desktop ones of their major, and no profile is one of them.
_ARCH = re.compile(r"^(sm|compute)_(\d+?)(\d)([af]?)$")
_TEGRA = {72, 87, 88, 101, 110}


def runs_on(arch: str, cc: str) -> bool:
    """Whether code ``arch`` (``sm_90a``, ``compute_80``) runs on compute capability
    ``cc`` (``"9.0"``) with driver R580."""
    m = _ARCH.match(arch)
    if m is None:
        raise ValueError(f"not an arch name: {arch}")
    kind, major, minor, suffix = m[1], int(m[2]), int(m[3]), m[4]
    gpu_major, gpu_minor = (int(x) for x in cc.split("."))
    if major * 10 + minor in _TEGRA:
        return False
    if suffix == "a":
        return (major, minor) == (gpu_major, gpu_minor)
    if kind == "sm" or suffix == "f":
        return major == gpu_major and gpu_minor >= minor
    return (gpu_major, gpu_minor) >= (major, minor)


@dataclass(frozen=True, kw_only=True)
class Documented:
    archs: tuple[str, ...]
    source: str
    truth: Mapping[str, str] = field(default_factory=dict)

    def expected(self, cc: str) -> tuple[str, str]:
        """(status, why): status "pass", "fail" or "skipped-only"."""
        if cc in self.truth:
            status, _, why = self.truth[cc].partition(": ")
            return status, why
        if any(runs_on(a, cc) for a in self.archs):
            return "pass", ""
        return "fail", "not documented (" + ", ".join(self.archs) + ")"


_TORCH_CU128 = ("sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120")
# What NVIDIA's CUDA 12 libraries document: every GPU from Maxwell to Blackwell
_CUDA12_LIBRARY_ARCHS = (
    "sm_50",
    "sm_60",
    "sm_70",
    "sm_75",
    "sm_80",
    "sm_86",
    "sm_89",
    "sm_90",
    "sm_100",
    "sm_120",
)
_CUDA_12_8_LIBRARY = (
    "NVIDIA CUDA Toolkit 12.8 release notes: the CUDA 12.8 libraries support every GPU "
    "of compute capability 5.0 to 12.0 (Maxwell to Blackwell); their wheels' cuobjdump "
    "lists sm_50 ... sm_120 SASS"
)
_FLASHINFER_DATA = (
    "skipped-only: flashinfer-python compiles its kernels at run time (JIT) and ships "
    "none; flashinfer-cubin's cubins are data flashinfer loads for Blackwell 10.x "
    "(cuobjdump: sm_100, sm_100a, sm_103a cubins only)"
)

DOCUMENTED: dict[str, Documented] = {
    "torch": Documented(
        archs=_TORCH_CU128,
        source="pytorch/pytorch v2.8.0 .ci/manywheel/build_cuda.sh: CUDA 12.8, "
        'TORCH_CUDA_ARCH_LIST="7.0;7.5;8.0;8.6;9.0;10.0;12.0" (no PTX)',
    ),
    "torchvision": Documented(
        archs=_TORCH_CU128,
        source="pytorch/vision release 0.23: the domain library of torch 2.8.0, built "
        "by pytorch/test-infra for the same cu128 GPUs (cuobjdump: sm_50 ... sm_120, "
        "compute_50)",
    ),
    "torchaudio": Documented(
        archs=_TORCH_CU128,
        source="pytorch/audio release 2.8.0: the domain library of torch 2.8.0, built "
        "for the same cu128 GPUs (cuobjdump: sm_50 ... sm_120, compute_50)",
    ),
    "xformers": Documented(
        archs=("sm_75", "sm_80", "compute_80", "sm_90a"),
        source="facebookresearch/xformers .github/workflows/wheels_build.yml: the "
        'official wheels use TORCH_CUDA_ARCH_LIST="7.5 8.0+PTX 9.0a" (quoted in '
        "vllm-project/vllm PR 20358 and in vLLM's dependency-upgrade notes for "
        "xformers v0.0.32.post2)",
    ),
    "vllm": Documented(
        archs=("sm_70", "sm_75", "sm_80", "sm_89", "sm_90", "sm_100", "sm_120"),
        source="vllm-project/vllm v0.10.2 docker/Dockerfile "
        "torch_cuda_arch_list='7.0 7.5 8.0 8.9 9.0 10.0 12.0', intersected with "
        "CMakeLists.txt CUDA_SUPPORTED_ARCHS for CUDA >= 12.8; FlashAttention 2/3 "
        "(vllm_fa_cmake_gpu_arches='80-real;90-real') and FlashMLA (9.0a) are "
        "imported in a try and used only where vLLM's capability test allows "
        "(vllm/vllm_flash_attn/flash_attn_interface.py, vllm/attention/ops/flashmla.py)",
    ),
    "bitsandbytes": Documented(
        archs=("sm_70", "sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"),
        source="bitsandbytes-foundation/bitsandbytes .github/scripts/build-cuda.sh: "
        'CUDA 12.8/12.9 x86_64 build_capability="70;75;80;86;89;90;100;120"; the '
        "wheel holds one library per CUDA release (cuda118 ... cuda132) and loads "
        "the one of torch's CUDA (bitsandbytes/cextension.py), here cuda128",
    ),
    "flashinfer": Documented(
        archs=("sm_100f", "sm_103a"),
        source="flashinfer-ai/flashinfer README and docs/installation.rst: "
        "flashinfer-python JIT-compiles for sm75 to sm120; flashinfer-cubin ships the "
        "prebuilt trtllm-gen/DeepGEMM cubins for Blackwell (sm100a/sm100f/sm103a)",
        truth=dict.fromkeys(
            ("7.0", "7.5", "8.0", "8.6", "8.9", "9.0", "12.0", "12.1"), _FLASHINFER_DATA
        ),
    ),
    "sgl-kernel": Documented(
        archs=("sm_80", "sm_89", "sm_90", "sm_90a", "sm_100a", "sm_120a"),
        source="sgl-project/sglang sgl-kernel/CMakeLists.txt: SGL_KERNEL_CUDA_FLAGS "
        "gencode sm_80, sm_89, sm_90, sm_90a, and with CUDA >= 12.8 sm_100a and "
        "sm_120a; flash_ops (FlashAttention 3) is used on Hopper alone "
        "(sgl_kernel/flash_attn.py checks the capability)",
    ),
    "cupy": Documented(
        archs=(
            "sm_50",
            "sm_60",
            "sm_70",
            "sm_75",
            "sm_80",
            "sm_86",
            "sm_89",
            "sm_90",
            "sm_100f",
            "sm_120f",
            "compute_100",
        ),
        source="cupy/cupy-release-tools dist_config.py: cupy-cuda12x's nvcc gencode "
        "(compute capability 5.0 to 12.0, family-specific Blackwell, compute_100 PTX)",
    ),
    "jax-cuda12": Documented(
        archs=("sm_50", "sm_60", "sm_70", "sm_80", "sm_90", "sm_100", "compute_120"),
        source="jax-ml/jax CUDA 12.8 wheel build: HERMETIC_CUDA_COMPUTE_CAPABILITIES="
        '"sm_50,sm_60,sm_70,sm_80,sm_90,sm_100,compute_120" (the plugin\'s cuobjdump '
        "lists exactly these)",
    ),
    "onnxruntime-gpu": Documented(
        archs=("sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90a", "compute_90"),
        source="microsoft/onnxruntime tools/ci_build/github/linux/"
        'build_linux_python_package.sh: CUDA 12.8 CUDA_ARCHS="60-real;70-real;75-real;'
        '80-real;86-real;90a-real;90-virtual" (8.9 runs sm_86, later GPUs JIT compute_90)',
    ),
    "nvidia-cublas": Documented(archs=_CUDA12_LIBRARY_ARCHS, source=_CUDA_12_8_LIBRARY),
    "nvidia-cudnn": Documented(
        archs=_CUDA12_LIBRARY_ARCHS,
        source="NVIDIA cuDNN 9.10 support matrix: CUDA 12.x build, compute capability 5.0 to 12.0",
    ),
    "nvidia-cufft": Documented(archs=_CUDA12_LIBRARY_ARCHS, source=_CUDA_12_8_LIBRARY),
    "nvidia-curand": Documented(archs=_CUDA12_LIBRARY_ARCHS, source=_CUDA_12_8_LIBRARY),
    "nvidia-cusolver": Documented(archs=_CUDA12_LIBRARY_ARCHS, source=_CUDA_12_8_LIBRARY),
    "nvidia-cusparse": Documented(archs=_CUDA12_LIBRARY_ARCHS, source=_CUDA_12_8_LIBRARY),
    "nvidia-cusparselt": Documented(
        archs=("sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"),
        source="NVIDIA cuSPARSELt release notes: SM 8.0 and 8.6 (v0.1), 8.9 and 9.0, "
        "Blackwell 10.0 and 12.0 (v0.7); Thor and 12.1 only from v0.8.0",
        truth=dict.fromkeys(
            ("7.0", "7.5"),
            "pass: undocumented, but the library holds compute_52 PTX (cuobjdump), "
            "which JIT-compiles there; cuSPARSELt refuses a GPU below 8.0 itself, "
            "which no reading of its binary can show",
        ),
    ),
    "nvidia-nccl": Documented(
        archs=_CUDA12_LIBRARY_ARCHS,
        source="NVIDIA NCCL 2.27 release notes (CUDA 12.x builds: compute capability "
        "5.0 to 12.0; cuobjdump: sm_50 ... sm_120a, compute_120)",
    ),
}
