"""The CPU kind int8 is built for: detection, the settings per kind, forcing a kind, the warning on another kind."""

from __future__ import annotations

import platform

import pytest

from tools.deploy.cpu import (
    ENV_TARGET,
    ISA_CAP_ENV,
    CpuFeatures,
    Int8Settings,
    detect_cpu,
    int8_settings,
    resolve_target,
)

AVX2_ONLY = CpuFeatures(model_name="AMD EPYC-Milan", machine="x86_64", features=["avx2"])
VNNI = CpuFeatures(model_name="Intel Xeon", machine="x86_64", features=["avx2", "avx512bw", "avx512_vnni"])
AMX = CpuFeatures(model_name="Intel Xeon 4th gen", machine="x86_64", features=["avx2", "avx512bw", "amx_int8"])
ARM = CpuFeatures(model_name="Neoverse", machine="aarch64", features=[])


def test_kinds_follow_the_int8_dot_product() -> None:
    assert (AVX2_ONLY.kind, VNNI.kind, AMX.kind, ARM.kind) == ("no-vnni", "vnni", "vnni", "other")
    assert not AVX2_ONLY.vnni and VNNI.vnni and AMX.vnni
    assert "no VNNI" in AVX2_ONLY.describe() and "AVX2" in AVX2_ONLY.describe()
    assert "AVX512-VNNI" in VNNI.describe() and "32 bits" in VNNI.describe()


def test_detection_reads_this_cpu() -> None:
    cpu = detect_cpu()
    assert cpu.model_name and cpu.machine == (platform.machine() or "unknown")
    if cpu.machine.lower() in {"x86_64", "amd64"} and not cpu.isa_cap:
        from numpy._core._multiarray_umath import __cpu_features__ as numpy_features

        # cpuid decides (an emulated CPU says what it emulates, whatever /proc/cpuinfo of the host says)
        assert ("avx512_vnni" in cpu.features) == bool(numpy_features.get("AVX512VNNI"))
        assert ("avx2" in cpu.features) == bool(numpy_features.get("AVX2"))
        assert ("avx512_bf16" in cpu.features) == bool(numpy_features.get("AVX512BF16"))
        assert cpu.kind in ("vnni", "no-vnni")


def test_cpuid_decodes_the_features_numpy_knows(monkeypatch: pytest.MonkeyPatch) -> None:
    """cpuid, run here, agrees with NumPy's table; where it cannot run, NumPy's table stands in."""
    import tools.deploy.cpu as cpu_module

    read = cpu_module._cpuid()
    if platform.machine().lower() not in {"x86_64", "amd64"}:
        assert read is None
        return
    assert read is not None, "cpuid runs on Linux x86-64"
    found, brand = read
    from numpy._core._multiarray_umath import __cpu_features__ as numpy_features

    for name, numpy_name in cpu_module._NUMPY_NAMES.items():
        assert (name in found) == bool(numpy_features.get(numpy_name)), name
    assert brand.isprintable()
    real = detect_cpu()
    with monkeypatch.context() as patch:  # the cache is cleared again once the patch is gone: later tests see cpuid's
        patch.setattr(cpu_module, "_cpuid", lambda: None)
        cpu_module.detect_cpu.cache_clear()
        try:
            fallback = cpu_module.detect_cpu()
        finally:
            cpu_module.detect_cpu.cache_clear()
    assert fallback.detected_by.startswith("cpuid (NumPy)")
    for name in ("avx2", "avx512bw", "avx512_vnni"):  # what NumPy's table knows (AMX and AVX-VNNI it takes from
        assert (name in fallback.features) == (name in real.features), name  # /proc/cpuinfo: the host's, emulated)
    assert detect_cpu() == real


def _detected_with_cap(monkeypatch: pytest.MonkeyPatch, cap: str | None) -> CpuFeatures:
    import tools.deploy.cpu as cpu_module

    with monkeypatch.context() as patch:  # the cache is cleared again once the patch is gone
        if cap is None:
            patch.delenv(ISA_CAP_ENV, raising=False)
        else:
            patch.setenv(ISA_CAP_ENV, cap)
        cpu_module.detect_cpu.cache_clear()
        try:
            return cpu_module.detect_cpu()
        finally:
            cpu_module.detect_cpu.cache_clear()


def test_onednn_isa_cap_caps_the_features_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """ONEDNN_MAX_CPU_ISA makes OpenVINO's and oneDNN's kernels use no more than it names (AVX2: vpmaddubsw, whose
    pair sums saturate, on any CPU): the int8 target and the report follow it."""
    found = _detected_with_cap(monkeypatch, None)
    capped = _detected_with_cap(monkeypatch, "avx2")  # oneDNN reads it in any case
    assert set(capped.features) == set(found.features) & {"avx2"}
    assert not capped.vnni and not capped.bf16
    if found.x86:
        assert capped.kind == "no-vnni" and resolve_target("auto", capped) == "no-vnni"
    if set(found.features) - {"avx2"}:
        assert capped.isa_cap == "AVX2" and "capped by ONEDNN_MAX_CPU_ISA=AVX2" in capped.describe()
    vnni_cap = _detected_with_cap(monkeypatch, "AVX512_CORE_VNNI")
    assert set(vnni_cap.features) == set(found.features) & {"avx2", "avx512bw", "avx512_vnni"}
    assert not {"amx_int8", "avx512_bf16"} & set(vnni_cap.features)
    for no_cap in ("ALL", "no-such-isa", ""):  # what oneDNN ignores caps nothing
        same = _detected_with_cap(monkeypatch, no_cap)
        assert same.features == found.features and not same.isa_cap, no_cap


def test_bf16_follows_the_features() -> None:
    spr = CpuFeatures(model_name="Xeon", machine="x86_64", features=["avx2", "avx512bw", "amx_int8", "amx_bf16"])
    assert spr.bf16 and not VNNI.bf16 and not AVX2_ONLY.bf16 and not ARM.bf16
    assert "AMX-BF16" in spr.describe()


def test_settings_per_kind() -> None:
    saturating = int8_settings("no-vnni", AVX2_ONLY)
    assert (saturating.target, saturating.reduce_range, saturating.overflow_fix) == ("no-vnni", True, "enable")
    # every layer of every model: a mobile CNN's int8 saturated with the first layer alone (MobileNetV2)
    exact = int8_settings("vnni", VNNI)
    assert (exact.target, exact.reduce_range, exact.overflow_fix) == ("vnni", False, "first_layer_only")
    # symmetric activations for attention models where products sum in 32 bits (measured faster and as accurate)
    assert (exact.nncf_preset(transformer=True), saturating.nncf_preset(transformer=True)) == ("performance", "mixed")
    assert exact.nncf_preset(transformer=False) == saturating.nncf_preset(transformer=False) == "performance"
    assert int8_settings("auto", AVX2_ONLY).target == "no-vnni"
    assert int8_settings("auto", AMX).target == "vnni"
    assert int8_settings("auto", ARM).target == "vnni", "ARM's int8 dot products do not saturate"
    assert saturating.built_on == AVX2_ONLY
    assert "every x86 CPU" in saturating.describe() and "7-bit" in saturating.describe()


def test_a_kind_can_be_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_TARGET, "no-vnni")
    assert resolve_target("auto", VNNI) == "no-vnni"
    assert int8_settings(cpu=VNNI).reduce_range, "the non-VNNI settings on a VNNI machine"
    assert resolve_target("vnni", AVX2_ONLY) == "vnni", "an explicit target wins over the environment"
    monkeypatch.setenv(ENV_TARGET, "sse")
    with pytest.raises(ValueError, match="auto, vnni, no-vnni"):
        resolve_target("auto", VNNI)


def test_an_int8_model_built_for_vnni_warns_where_vnni_is_missing() -> None:
    built_for_vnni = int8_settings("vnni", VNNI)
    message = built_for_vnni.warning(AVX2_ONLY, "runs/x/models/quantized")
    assert message is not None and "\n" not in message
    assert "without VNNI" in message and "runs/x/models/quantized" in message
    assert "--int8-cpu no-vnni" in message and "--deploy" in message, "it names what to do"
    assert built_for_vnni.warning(AMX, "x") is None
    portable = int8_settings("no-vnni", VNNI)
    assert portable.warning(AVX2_ONLY, "x") is None, "7-bit weights hold on every x86 CPU"
    assert Int8Settings.model_validate(portable.model_dump()) == portable, "settings round-trip through JSON"


def test_channel_blocks_follow_the_kernels_of_each_precision() -> None:
    from tools.deploy.cpu import channel_block

    spr = CpuFeatures(model_name="Xeon", machine="x86_64", features=["avx2", "avx512bw", "amx_int8", "amx_bf16"])
    assert channel_block(True, spr) == 32, "AMX tiles: 24 of 32 channels ran slower than 32 in bf16"
    assert channel_block(False, spr) == channel_block(False, VNNI) == 16
    assert channel_block(False, AVX2_ONLY) == channel_block(True, AVX2_ONLY) == 8
