"""The CUDA paths (``--device cuda``), skipped where no GPU is visible: the profile on the device, distillation
there, and a whole run whose float work runs on the GPU while its int8 artifacts and the deployment table stay on
the CPU, where their kernels are."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from langgraph.checkpoint.memory import InMemorySaver

from graph import Context, build_graph
from tests.helpers import save_tiny, tiny_resnet, tiny_vit
from tests.unit.test_fused_qkv_heads import Attention, Net, WindowAttention
from tests.unit.test_pruning import resnet, swin, vit
from tests.unit.test_unit_kinds import TinyMobileNet
from tools.zoo.cifar_resnet import resnet20

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")


def test_profile_on_cuda_times_the_device_and_ranks_operators_by_device_time() -> None:
    from tools.profiling.profile import profile_model

    model = tiny_resnet().cuda()
    x = torch.randn(1, 3, 32, 32, device="cuda")
    profile = profile_model(model, x, warmup=1, iters=3)
    assert profile.device.startswith("cuda")
    assert profile.latency_s > 0 and profile.peak_memory_mb > 0
    assert profile.total_params == sum(p.numel() for p in model.parameters()) and profile.total_macs > 0
    assert any(layer.latency_s > 0 for layer in profile.layers)
    device_times = [op.self_device_time_s for op in profile.operators]
    assert device_times[0] > 0  # the kernels the GPU spent time in, not the launches' CPU overhead
    assert device_times == sorted(device_times, reverse=True)
    assert next(model.parameters()).is_cuda  # the model stays where it was


def test_distillation_precision_auto_is_bf16_on_a_gpu_that_computes_it() -> None:
    from agents.evaluation import distill_precision

    expected = "bf16" if torch.cuda.get_device_capability() >= (8, 0) else "fp32"
    assert distill_precision(Context(device="cuda")) == expected
    assert distill_precision(Context(device="cuda", distill_precision="fp32")) == "fp32"


SENSITIVITY_MODELS = {
    "vit": vit,
    "swin": swin,
    "resnet": lambda: resnet("basic"),
    "cifar-resnet": resnet20,
    "mobile-se": lambda: TinyMobileNet(se=True),
    "timm-attention": lambda: Net(Attention),  # fused qkv, timm's layout
    "timm-window-attention": lambda: Net(WindowAttention),
}
#: Input shape per model where it is not a 32-px RGB image.
INPUT_SHAPES = {"timm-attention": (12, 3, 3), "timm-window-attention": (12, 3, 3)}


@pytest.mark.parametrize("method", ["reconstruct", "bn"])
@pytest.mark.parametrize("name", list(SENSITIVITY_MODELS))
def test_sensitivity_probes_on_cuda_measure_what_they_measure_on_the_cpu(name: str, method: str) -> None:
    from tools.compression.pruning import prunable_layers
    from tools.compression.recovery import RecoveryConfig
    from tools.compression.sensitivity import measure_sensitivity
    from tools.compression.units import prunable_units

    torch.manual_seed(0)
    model = SENSITIVITY_MODELS[name]().eval()
    images = torch.randn(24, *INPUT_SHAPES.get(name, (3, 32, 32)), generator=torch.Generator().manual_seed(1))
    targets = torch.randint(0, 5, (24,), generator=torch.Generator().manual_seed(2))
    units = prunable_units(prunable_layers(model, images[:1]).model_dump())
    recovery = RecoveryConfig(method=method)  # type: ignore[arg-type]
    on_cpu = measure_sensitivity(copy.deepcopy(model), images, units, targets=targets, ratios=(0.5,), recovery=recovery)
    gpu_model = copy.deepcopy(model).cuda()
    on_gpu = measure_sensitivity(gpu_model, images.cuda(), units, targets=targets, ratios=(0.5,), recovery=recovery)
    assert next(gpu_model.parameters()).is_cuda
    assert [u.pattern for u in on_gpu.units] == [u.pattern for u in on_cpu.units] and on_gpu.units
    for cpu_unit, gpu_unit in zip(on_cpu.units, on_gpu.units, strict=True):
        assert [p.params_saved for p in gpu_unit.points] == [p.params_saved for p in cpu_unit.points]
        for cpu_point, gpu_point in zip(cpu_unit.points, gpu_unit.points, strict=True):
            assert gpu_point.agreement == pytest.approx(cpu_point.agreement, abs=0.15), cpu_unit.pattern


def _run(model: str, run_dir: Path, **settings: Any) -> dict[str, Any]:
    ctx = Context(run_dir=str(run_dir), eval_samples=40, batch_size=20, latency_repeats=3, progress=False, **settings)
    graph = build_graph().compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t"}, "recursion_limit": 100}
    graph.invoke({"model": model, "dataset": "digits"}, config, context=ctx, durability="sync")
    return json.loads((run_dir / "report.json").read_text())


def test_full_run_on_cuda(tmp_path: Path) -> None:
    from tools.artifacts.io import load_compressed

    model_dir = save_tiny(tiny_vit(), tmp_path / "vit", 16)
    report = _run(
        str(model_dir), tmp_path / "run", device="cuda", iterations=1, max_accuracy_drop=100.0, finetune_steps=20
    )
    assert report["baseline"]["latency_device"].startswith("cuda")
    assert report["quantized"]["latency_device"] == "cpu"  # int8 kernels are CPU kernels
    assert report["rounds"] and report["pruned"]["params"] < report["baseline"]["params"]
    deployed = load_compressed(Path(report["quantized"]["artifact"]))  # saved for the CPU, loads there
    with torch.inference_mode():
        out = deployed(torch.randn(1, 3, 16, 16))
    assert torch.isfinite(out.logits if hasattr(out, "logits") else out).all()
