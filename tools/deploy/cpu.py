"""The CPU an int8 model is built and run on, and the int8 settings that hold accuracy there.

x86 CPUs compute int8 dot products (unsigned 8-bit activations x signed 8-bit weights) in one of two ways:

* with **VNNI** (AVX512-VNNI, AVX-VNNI, and AMX on the newest Xeons) the products are summed straight into 32 bits:
  nothing overflows;
* without it (AVX2 only, or AVX-512 without VNNI: most AMD Zen 2/3 and pre-2019 Intel CPUs) ONNX Runtime's and
  oneDNN's kernels use ``vpmaddubsw``, which adds each pair of products into a **16-bit** sum that saturates:
  255 x 127 x 2 = 64,770 does not fit 32,767. The same int8 model is then accurate on a VNNI CPU and loses points
  on an AVX2 one (measured under QEMU as an AVX2-only EPYC: ONNX Runtime static int8 of ``cifar10-resnet-tiny``
  -4.7 points, OpenVINO int8 without NNCF's overflow fix -5.8).

:func:`int8_settings` picks what holds on the target kind: 7-bit weights where pairs can saturate (ONNX Runtime's
``reduce_range``, weights in [-64, 64]: 255 x 64 x 2 = 32,640 fits) and NNCF's ``overflow_fix`` on every layer;
NNCF's default (first layer only) and full 8-bit weights with VNNI. A model built for CPUs without VNNI runs
accurately on every kind; one built for VNNI loses accuracy on CPUs without it, which :meth:`Int8Settings.warning`
says in one line on load.

:func:`detect_cpu` reads the features from ``cpuid`` itself (a few bytes of machine code run through ctypes; NumPy's
dispatch table where executable memory is refused), kept only where ``/proc/cpuinfo`` also lists them (the kernel
must enable AVX-512 and AMX state). ``cpuid`` is what an emulator answers: QEMU presenting an AVX2-only EPYC on an
AMX host is read as the EPYC, where the host's ``/proc/cpuinfo`` still lists AMX. ``ONEDNN_MAX_CPU_ISA`` (oneDNN's
own cap, which OpenVINO's and PyTorch's oneDNN kernels obey: ``AVX2`` runs their int8 with ``vpmaddubsw`` on a VNNI
CPU, natively) caps the features found the same way; ONNX Runtime's kernels do not read it.
``PROFILING_AGENT_INT8_CPU`` (``vnni`` / ``no-vnni``) or ``--int8-cpu`` builds for another kind than the one found.

The same features say whether the CPU computes **bf16** natively (AMX-BF16, AVX512-BF16): the ``openvino-bf16``
backend runs there; elsewhere OpenVINO would silently run it in FP32.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import mmap
import os
import platform
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, computed_field

logger = logging.getLogger(__name__)

Int8Target = Literal["vnni", "no-vnni"]
"""What an int8 model is built for: CPUs with 32-bit int8 dot products (VNNI, AMX), or without (AVX2, AVX-512)."""
INT8_TARGETS: tuple[str, ...] = ("auto", "vnni", "no-vnni")
"""What ``--int8-cpu`` takes: ``auto`` (this machine's kind) or a target."""
ENV_TARGET = "PROFILING_AGENT_INT8_CPU"

#: Feature name (as /proc/cpuinfo spells it) -> how reports name it; the ones that decide the kernels, in order.
FEATURES: dict[str, str] = {
    "avx2": "AVX2",
    "avx512bw": "AVX-512",
    "avx512_vnni": "AVX512-VNNI",
    "avx_vnni": "AVX-VNNI",
    "amx_int8": "AMX-INT8",
    "avx512_bf16": "AVX512-BF16",
    "amx_bf16": "AMX-BF16",
}
_VNNI = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})
_BF16 = frozenset({"avx512_bf16", "amx_bf16"})
#: Where ``cpuid`` reports each feature: (leaf, subleaf, register 0-3 for EAX/EBX/ECX/EDX, bit).
_CPUID_BITS: dict[str, tuple[int, int, int, int]] = {
    "avx2": (7, 0, 1, 5),
    "avx512bw": (7, 0, 1, 30),
    "avx512_vnni": (7, 0, 2, 11),
    "amx_bf16": (7, 0, 3, 22),
    "amx_int8": (7, 0, 3, 25),
    "avx_vnni": (7, 1, 0, 4),
    "avx512_bf16": (7, 1, 0, 5),
}
#: oneDNN's ISA cap (``ONEDNN_MAX_CPU_ISA``, case-insensitive) -> the features of :data:`FEATURES` its kernels may use;
#: an unknown value caps nothing (oneDNN ignores it too).
ISA_CAP_ENV = "ONEDNN_MAX_CPU_ISA"
_ISA_CAPS: dict[str, frozenset[str]] = {
    "SSE41": frozenset(),
    "AVX": frozenset(),
    "AVX2": frozenset({"avx2"}),
    "AVX2_VNNI": frozenset({"avx2", "avx_vnni"}),
    "AVX2_VNNI_2": frozenset({"avx2", "avx_vnni"}),
    "AVX512_CORE": frozenset({"avx2", "avx512bw"}),
    "AVX512_CORE_VNNI": frozenset({"avx2", "avx512bw", "avx512_vnni"}),
    "AVX512_CORE_BF16": frozenset({"avx2", "avx512bw", "avx512_vnni", "avx512_bf16"}),
    "AVX512_CORE_FP16": frozenset({"avx2", "avx512bw", "avx512_vnni", "avx512_bf16"}),
    "AVX10_1_512": frozenset({"avx2", "avx512bw", "avx512_vnni", "avx512_bf16"}),
}
for _amx in ("AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16", "AVX10_1_512_AMX", "AVX10_1_512_AMX_FP16"):
    _ISA_CAPS[_amx] = _ISA_CAPS["AVX10_1_512"] | {"amx_int8", "amx_bf16"}
#: NumPy's cpuid-based names of the features it detects (the fallback where ``cpuid`` cannot be run here).
_NUMPY_NAMES = {"avx2": "AVX2", "avx512bw": "AVX512BW", "avx512_vnni": "AVX512VNNI", "avx512_bf16": "AVX512BF16"}


class CpuFeatures(BaseModel):
    """What this CPU offers int8 kernels, as detected (or as a forced target says)."""

    model_name: str = Field(description="The CPU's model name (/proc/cpuinfo), or the platform's processor string.")
    machine: str = Field(description="platform.machine(): x86_64, aarch64, ...")
    features: list[str] = Field(default_factory=list, description="The int8-relevant features present (FEATURES).")
    detected_by: str = Field(default="", description="Where the features came from.")
    isa_cap: str = Field(
        default="", description="The ONEDNN_MAX_CPU_ISA value that removed features the CPU has ('' where none did)."
    )

    @computed_field  # type: ignore[prop-decorator]
    @property
    def vnni(self) -> bool:
        """Whether int8 dot products sum into 32 bits (VNNI or AMX): nothing saturates."""
        return bool(_VNNI & set(self.features))

    @computed_field  # type: ignore[prop-decorator]
    @property
    def bf16(self) -> bool:
        """Whether the CPU computes bf16 natively (AMX-BF16 or AVX512-BF16)."""
        return bool(_BF16 & set(self.features))

    @property
    def x86(self) -> bool:
        return self.machine.lower() in {"x86_64", "amd64", "i686", "i386", "x86"}

    @computed_field  # type: ignore[prop-decorator]
    @property
    def kind(self) -> str:
        """``vnni`` or ``no-vnni`` on x86; ``other`` elsewhere (ARM's int8 dot products do not saturate)."""
        if not self.x86:
            return "other"
        return "vnni" if self.vnni else "no-vnni"

    def describe(self) -> str:
        """``AMD EPYC (x86_64; AVX2, AVX-512, AVX512-VNNI: int8 sums in 32 bits)``."""
        names = ", ".join(FEATURES[f] for f in FEATURES if f in self.features) or "none of " + ", ".join(
            FEATURES.values()
        )
        how = (
            "int8 sums in 32 bits"
            if self.vnni
            else ("no VNNI: int8 pair sums saturate at 16 bits" if self.x86 else "not x86")
        )
        cap = f", capped by {ISA_CAP_ENV}={self.isa_cap}" if self.isa_cap else ""
        return f"{self.model_name} ({self.machine}; {names}: {how}{cap})"


def _cpuinfo() -> tuple[str, set[str]]:
    """The model name and the flags of the first processor in /proc/cpuinfo (empty where there is none)."""
    path = Path("/proc/cpuinfo")
    name, flags = "", set[str]()
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return name, flags
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "model name" and not name:
            name = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return name, flags


#: ``cpuid(leaf, subleaf, out)`` for the System V x86-64 calling convention (leaf in EDI, subleaf in ESI, ``out`` in
#: RDX): push rbx; mov r8, rdx; mov eax, edi; mov ecx, esi; cpuid; mov [r8], eax; mov [r8+4], ebx;
#: mov [r8+8], ecx; mov [r8+12], edx; pop rbx; ret.
_CPUID_CODE = bytes.fromhex("53 4989d0 89f8 89f1 0fa2 418900 41895804 41894808 4189500c 5b c3".replace(" ", ""))


def _cpuid() -> tuple[set[str], str] | None:
    """The features of :data:`_CPUID_BITS` that ``cpuid`` reports, run here, and the CPU's brand string (None where it
    cannot be run: not Linux or macOS on x86-64, or executable memory refused)."""
    if platform.machine().lower() not in {"x86_64", "amd64"} or os.name != "posix":
        return None
    try:
        page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    except (OSError, ValueError, AttributeError):
        return None
    try:
        page.write(_CPUID_CODE)
        registers = ctypes.c_uint32 * 4
        address = ctypes.addressof(ctypes.c_char.from_buffer(page))
        call = ctypes.CFUNCTYPE(None, ctypes.c_uint32, ctypes.c_uint32, ctypes.POINTER(registers))(address)

        def cpuid(leaf: int, subleaf: int) -> tuple[int, ...]:
            out = registers()
            call(leaf, subleaf, ctypes.byref(out))
            return tuple(out)

        max_leaf = cpuid(0, 0)[0]
        leaves = {(7, 0): cpuid(7, 0)} if max_leaf >= 7 else {}
        if leaves and leaves[(7, 0)][0] >= 1:
            leaves[(7, 1)] = cpuid(7, 1)
        brand = b""
        if cpuid(0x80000000, 0)[0] >= 0x80000004:
            brand = b"".join(
                v.to_bytes(4, "little") for leaf in (0x80000002, 0x80000003, 0x80000004) for v in cpuid(leaf, 0)
            )
        found = set()
        for name, (leaf, subleaf, register, bit) in _CPUID_BITS.items():
            values = leaves.get((leaf, subleaf))
            if values is not None and values[register] >> bit & 1:
                found.add(name)
        return found, brand.split(b"\0", 1)[0].decode("ascii", "replace").strip()
    finally:
        page.close()


def _numpy_features() -> dict[str, bool] | None:
    """NumPy's runtime dispatch table (from cpuid, so it sees the CPU an emulator presents), or None."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__
    except ImportError:  # numpy < 2
        try:
            from numpy.core._multiarray_umath import __cpu_features__  # type: ignore[no-redef]
        except ImportError:
            return None
    return dict(__cpu_features__)


@functools.cache
def detect_cpu() -> CpuFeatures:
    """This machine's CPU: the features ``cpuid`` reports that /proc/cpuinfo lists too (the kernel enabled them) and
    ``cpuid``'s brand string; NumPy's cpuid table where ``cpuid`` cannot be run here; /proc/cpuinfo alone elsewhere."""
    name, flags = _cpuinfo()
    machine = platform.machine() or "unknown"
    x86 = machine.lower() in {"x86_64", "amd64"}
    read = _cpuid() if x86 else None
    numpy_features = _numpy_features() if x86 and read is None else None
    found: set[str]
    if read is not None:
        found, brand = read
        name = brand or name  # an emulated CPU's own name, not the host's
        detected_by = "cpuid" + (" and /proc/cpuinfo" if flags else "")
    elif numpy_features is not None:
        found = {f for f, numpy_name in _NUMPY_NAMES.items() if numpy_features.get(numpy_name)}
        # what NumPy does not detect, /proc/cpuinfo says (only on a CPU that has AVX2 at all)
        found |= {f for f in ("avx_vnni", "amx_int8", "amx_bf16") if f in flags and "avx2" in found}
        detected_by = "cpuid (NumPy)" + (" and /proc/cpuinfo" if flags else "")
    else:
        found = set(flags)
        detected_by = "/proc/cpuinfo" if flags else "nothing (no cpuid, no /proc/cpuinfo)"
    if flags:  # what the kernel has not enabled (AVX-512 or AMX state) does not run
        found &= flags
    cap = os.environ.get(ISA_CAP_ENV, "").strip().upper()
    if cap in _ISA_CAPS and found - _ISA_CAPS[cap]:
        found &= _ISA_CAPS[cap]
    else:
        cap = ""
    return CpuFeatures(
        model_name=name or platform.processor() or "unknown CPU",
        machine=machine,
        features=[f for f in FEATURES if f in found],
        detected_by=detected_by,
        isa_cap=cap,
    )


OverflowFix = Literal["disable", "first_layer_only", "enable"]
NncfPreset = Literal["mixed", "performance"]


class Int8Settings(BaseModel):
    """How int8 models are built for one kind of CPU, and the CPU they were built (and validated) on."""

    target: Int8Target = Field(description="The CPU kind the int8 model is built for.")
    reduce_range: bool = Field(
        description="ONNX Runtime: 7-bit weights (reduce_range), so that pair sums of u8 x s8 products fit 16 bits."
    )
    overflow_fix: OverflowFix = Field(
        description="NNCF's overflow fix: 7-bit weights on every layer (enable: what holds where u8 x s8 pair sums "
        "can saturate, attention models and CNNs alike), the first layer only (NNCF's default, with VNNI), or none."
    )
    transformer_preset: NncfPreset = Field(
        default="mixed",
        description="NNCF's preset for attention models (transformer model type): asymmetric activations (mixed) or "
        "symmetric ones (performance). Other models take performance.",
    )
    fast_bias_correction_cnn: bool = Field(
        default=False,
        description="NNCF's fast bias correction for models without attention (its default) instead of the full "
        "one, which measures each layer's output shift on the calibration images. Full, measured against each model's "
        "own float on CIFAR-10's 10,000 test images (AVX512-VNNI): 2.8-4.1 % of top-1 answers changed by int8 fell to "
        "1.7-2.5 % on nine CNNs (the HF ResNet-tiny 4.1 to 1.7 %), 0.16 points less accuracy lost on average; on ViT "
        "and Swin it changed nothing measurable, so attention models keep the fast one. Which loses less accuracy is "
        "the model's (CIFAR ResNet-56: full -0.36 / -0.40 points on the halves of the test split, fast -0.06 / -0.16): "
        "openvino-int8-fast-bias builds a CNN with the fast one beside it.",
    )
    per_channel: bool = Field(default=True, description="One weight scale per output channel.")
    built_on: CpuFeatures = Field(description="The CPU the model was built, evaluated and timed on.")

    def nncf_fast_bias_correction(self, transformer: bool) -> bool:
        """Whether NNCF corrects biases the fast way for a model with (``transformer``) or without attention."""
        return True if transformer else self.fast_bias_correction_cnn

    def nncf_preset(self, transformer: bool) -> NncfPreset:
        """NNCF's quantization preset for a model with (``transformer``) or without attention."""
        return self.transformer_preset if transformer else "performance"

    def describe(self) -> str:
        """One line for reports."""
        if self.target == "no-vnni":
            what = (
                "built for CPUs without VNNI (holds on every x86 CPU): ONNX Runtime 7-bit weights (reduce_range), "
                "NNCF overflow fix on every layer"
            )
        else:
            what = (
                "built for CPUs with VNNI/AMX: full 8-bit weights, NNCF overflow fix on the first layer only "
                f"(loses accuracy on CPUs without VNNI), NNCF {self.transformer_preset} preset for attention models"
            )
        scales = "per-channel" if self.per_channel else "per-tensor"
        bias = "fast" if self.fast_bias_correction_cnn else "full"
        return (
            f"{what}; {scales} weight scales; NNCF {bias} bias correction for models without attention; built and "
            f"validated on {self.built_on.describe()}"
        )

    def holds_on(self, cpu: CpuFeatures) -> bool:
        """Whether this model's int8 arithmetic is exact on ``cpu`` (built for no-VNNI, or ``cpu`` has VNNI)."""
        return self.target == "no-vnni" or cpu.vnni or not cpu.x86

    def warning(self, cpu: CpuFeatures, artifact: str | Path) -> str | None:
        """One line when ``cpu`` is a kind this model was not built for (None when it was)."""
        if self.holds_on(cpu):
            return None
        return (
            f"{artifact}: int8 built for CPUs with VNNI on {self.built_on.model_name}, loaded on {cpu.model_name} "
            "without VNNI, where its 8-bit products can saturate and cost accuracy: deploy it again on this CPU "
            "(profiling-agent run ... --int8-cpu no-vnni builds int8 that holds on every x86 CPU), or deploy a "
            "float backend (--deploy onnxruntime-fp32 or openvino)"
        )


def channel_block(bf16: bool, cpu: CpuFeatures | None = None) -> int:
    """The channel count CPU kernels compute in blocks of (in bf16 with ``bf16``, else FP32 or int8), here: what
    pruned widths should be multiples of to run faster (``--round-to``). Measured (``benchmarks/channel_blocks.py``,
    CIFAR ResNet-56, one stage's inner convolutions narrowed, batch 1): with AVX2 32 -> 24 channels ran 1.07x in
    FP32; with AVX-512 1.00x, 32 -> 16 1.11x; in bf16 on AMX 32 -> 24 0.95x (slower), 32 -> 16 1.03x, 64 -> 48
    0.96x, 64 -> 32 1.12x."""
    cpu = cpu or detect_cpu()
    if bf16 and "amx_bf16" in cpu.features:
        return 32
    return 16 if "avx512bw" in cpu.features else 8


def resolve_target(target: str = "auto", cpu: CpuFeatures | None = None) -> Int8Target:
    """``auto`` -> this CPU's kind (``PROFILING_AGENT_INT8_CPU`` first); ``vnni``/``no-vnni`` as given."""
    if target == "auto":
        target = os.environ.get(ENV_TARGET, "auto").strip().lower() or "auto"
    if target not in INT8_TARGETS:
        raise ValueError(f"unknown int8 CPU target {target!r}: choose one of {', '.join(INT8_TARGETS)}")
    if target == "auto":
        return "vnni" if (cpu or detect_cpu()).kind != "no-vnni" else "no-vnni"
    return "vnni" if target == "vnni" else "no-vnni"


def int8_recipe_key(target: str) -> str:
    """What decides an int8 build for ``target`` besides its inputs (part of a quantized artifact's recipe hash):
    the settings :func:`int8_settings` gives that kind, without the CPU they run on. A setting changed between
    versions (NNCF's bias correction) so rebuilds an artifact a resumed run would otherwise reuse."""
    settings = int8_settings(target).model_dump(mode="json", exclude={"built_on", "target"})
    return ",".join(f"{k}={v}" for k, v in sorted(settings.items()))


def int8_settings(target: str = "auto", cpu: CpuFeatures | None = None) -> Int8Settings:
    """The int8 settings that hold accuracy on ``target`` (``auto``: this machine's kind).

    Measured (``cifar10-*`` models, 1,000-2,000 CIFAR-10 test images, agreement of top-1 with the FP32 model):
    without VNNI (QEMU as an AVX2-only EPYC), ONNX Runtime static int8 with 8-bit weights agreed 87.2 % on
    ResNet-tiny (-4.7 points) and 93.8 % on ViT-tiny, with 7-bit weights 98.8 % and 97.9 %; ONNX Runtime dynamic
    int8 97.4 % vs 98.8 % on ViT-tiny; OpenVINO int8 on ViT-tiny 87.2 % without overflow fix, 94.4 % with it on
    the first layer, 96.6 % on every layer (Swin-tiny 88.2 / 96.7 / 98.3 %); on ResNets (ResNet-tiny, CIFAR ResNet-20)
    the first layer alone held (96.2 and 96.5 %, as with VNNI; every layer 96.1 and 95.8 %), on a mobile CNN it did
    not (a 224-px MobileNetV2, 500 images, OpenVINO's kernels capped at AVX2: 96.8 % on the first layer against 99.0 %
    with VNNI, 98.4 % on every layer; its pruned round 96.6 / 98.6 %), so builds without VNNI fix every layer of every
    model: 7-bit weights cannot saturate, whatever the activations. With VNNI (AMD EPYC
    Zen 4) every variant agreed within half a point of the others, so the 8-bit weights and NNCF's default stay
    there. NNCF's preset for attention models, with VNNI (Intel Xeon with AMX, 1,744 images, batch 1, 1 thread):
    symmetric activations (performance) agreed 98.97 % on ViT-tiny and 98.80 % on Swin-tiny and ran 0.62 and
    1.04 ms, asymmetric ones (mixed) 98.57 % and 98.05 % at 0.76 and 1.16 ms (ViT-B/16: 48.0 vs 49.8 ms).
    """
    cpu = cpu or detect_cpu()
    resolved = resolve_target(target, cpu)
    saturating = resolved == "no-vnni"
    return Int8Settings(
        target=resolved,
        reduce_range=saturating,
        overflow_fix="enable" if saturating else "first_layer_only",
        transformer_preset="mixed" if saturating else "performance",
        built_on=cpu,
    )


__all__ = [
    "ENV_TARGET",
    "FEATURES",
    "INT8_TARGETS",
    "ISA_CAP_ENV",
    "CpuFeatures",
    "Int8Settings",
    "Int8Target",
    "channel_block",
    "detect_cpu",
    "int8_recipe_key",
    "int8_settings",
    "resolve_target",
]
