"""What the figure scripts of ``benchmarks/`` share: a finished run's report, the unseen images, paired accuracy.

Not a package module: the scripts beside it (``unseen_half.py``, ``runtimes_vs_original.py``,
``pruned_latency.py``) import it as ``figure_common`` because Python puts a script's own folder on
``sys.path``. Everything here goes through the project's public functions (``tools.load_compressed``,
``tools.stages.ops``, ``tools.evaluation.*``), so the figures measure what a user's run would.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tools import load_compressed
from tools.artifacts.io import load_original
from tools.compression.forward import forward_logits
from tools.evaluation.datasets import EvalDataset, load_eval_dataset
from tools.evaluation.labels import LabelMatch, match_labels
from tools.evaluation.paired import paired_accuracy, predict_part
from tools.schemas import InputShape, PairedAccuracy, RunReport
from tools.stages import ops

__all__ = [
    "REPO",
    "SHARED",
    "Predictions",
    "RunImages",
    "RunInfo",
    "UnseenData",
    "fail",
    "machine_line",
    "pct",
    "points",
    "read_run",
    "run_images",
    "top1",
]

#: The repository root (benchmarks/..), and ``../shared`` beside it: the defaults of every path argument.
REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


def fail(message: str) -> SystemExit:
    """A one-line error for bad input (raise the result)."""
    return SystemExit(f"error: {message}")


def machine_line(threads: int | str) -> str:
    """The machine a figure was measured on: CPU model, its int8 features (VNNI or not), cores, library versions,
    torch threads, and the CPU kind int8 is built for."""
    from tools.deploy.cpu import detect_cpu, resolve_target

    cpu = f"{detect_cpu().describe()}; int8 built for {resolve_target()} CPUs"
    versions = [f"torch {torch.__version__}"]
    for package in ("onnxruntime", "openvino", "nncf"):
        try:
            versions.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return f"machine: {os.cpu_count()}-core {cpu}; {', '.join(versions)}; {threads} torch thread(s)"


def pct(fraction: float | None) -> str:
    return "n/a" if fraction is None else f"{100.0 * fraction:.2f} %"


def points(paired: PairedAccuracy) -> str:
    """``-0.56 [-1.08, -0.04]``: the paired change in points with its 95 % interval."""
    return f"{paired.delta_points:+.2f} [{paired.ci95_low_points:+.2f}, {paired.ci95_high_points:+.2f}]"


@dataclass(frozen=True)
class RunInfo:
    """A finished run as its ``report.json`` and ``settings.json`` describe it."""

    run_dir: Path
    report: RunReport
    settings: dict[str, Any]

    @property
    def name(self) -> str:
        return self.run_dir.name

    @property
    def original(self) -> Path:
        return Path(str(self.report.model["artifact"]))

    @property
    def shape(self) -> InputShape:
        return InputShape.model_validate(self.report.model["input_shape"])

    @property
    def context(self) -> dict[str, Any]:
        context: dict[str, Any] = self.settings.get("context", {})
        return context

    @property
    def dataset(self) -> str | None:
        dataset = self.settings.get("input", {}).get("dataset")
        return None if dataset is None else str(dataset)

    def preprocess(self) -> Callable[[list[Any]], torch.Tensor]:
        """Images -> the batch the original model expects (its own processor)."""
        return ops.preprocess_of(self.original, self.shape)


@dataclass(frozen=True)
class RunImages:
    """A finished run's calibration and evaluation images, preprocessed for its model, with the evaluation labels
    as the model's classes (-1 where none matches), and the same for images the run never saw."""

    calibration: torch.Tensor
    evaluation: torch.Tensor
    labels: torch.Tensor
    preprocess: Callable[[list[Any]], torch.Tensor]
    mapping: dict[int, int]

    def unseen(self, spec: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Every image of ``spec`` (the other half of the split), preprocessed, and its classes."""
        data = load_eval_dataset(spec, samples=None, seed=0)
        return self.preprocess(list(data.images)), _classes(self.mapping, data.labels)


def _classes(mapping: dict[int, int], labels: list[int]) -> torch.Tensor:
    """Dataset labels as the model's classes (-1 where none matches)."""
    return torch.tensor([mapping.get(label, -1) for label in labels])


def top1(model: Any, images: torch.Tensor) -> torch.Tensor:
    """The model's top-1 class of each preprocessed image, 256 at a time."""
    with torch.no_grad():
        return torch.cat([forward_logits(model, images[i : i + 256]).argmax(1) for i in range(0, len(images), 256)])


def run_images(run: RunInfo) -> RunImages:
    """The calibration and evaluation parts of ``run``'s data, as the run split them (its sizes and seed)."""
    report = json.loads((run.run_dir / "report.json").read_text(encoding="utf-8"))
    parts = report["baseline"]["data_parts"]
    sizes = {name: parts.get(name, 0) for name in ("calibration", "confirm", "finetune")}
    dataset, seed = report["dataset"]["spec"], int(run.context.get("seed", 0))
    mapping = {int(k): int(v) for k, v in report["dataset"]["label_match"]["mapping"].items()}
    preprocess = run.preprocess()

    def part(name: str) -> EvalDataset:
        return load_eval_dataset(dataset, samples=parts["evaluation"], seed=seed, part=name, sizes=sizes)

    calibration, evaluation = part("calibration"), part("evaluation")
    return RunImages(
        calibration=preprocess(list(calibration.images)),
        evaluation=preprocess(list(evaluation.images)),
        labels=_classes(mapping, evaluation.labels),
        preprocess=preprocess,
        mapping=mapping,
    )


def read_run(run_dir: Path) -> RunInfo:
    """The run in ``run_dir``; a one-line error when it has not finished or its models have moved."""
    report_path, settings_path = run_dir / "report.json", run_dir / "settings.json"
    if not report_path.is_file():
        raise fail(f"{report_path} not found: pass the --run-dir of a finished `profiling-agent run`")
    report = RunReport.model_validate(json.loads(report_path.read_text(encoding="utf-8")))
    settings = json.loads(settings_path.read_text(encoding="utf-8")) if settings_path.is_file() else {}
    info = RunInfo(run_dir=run_dir, report=report, settings=settings)
    if not (info.original / "artifact.json").is_file():
        raise fail(f"{run_dir}: its original model {info.original} is gone; the run directory must not be moved")
    return info


@dataclass(frozen=True)
class Predictions:
    """One model's top-1 class and correctness (1/0) on each image, in dataset order."""

    predicted: list[int]
    correct: list[int]

    @property
    def accuracy(self) -> float | None:
        return sum(self.correct) / len(self.correct) if self.correct else None

    def against(self, reference: Predictions) -> PairedAccuracy:
        """This model's accuracy change against ``reference`` on the same images, with its 95 % interval."""
        return paired_accuracy(reference.correct, self.correct, reference.predicted, self.predicted)


class UnseenData:
    """Every image of a labelled folder (or any dataset spec), its classes matched to the run's model."""

    def __init__(self, spec: str, run: RunInfo, batch_size: int = 32) -> None:
        if not Path(spec).exists():
            raise fail(f"{spec} not found: make the halves with benchmarks/split_halves.py, or pass --data")
        self.spec = spec
        self.data: EvalDataset = load_eval_dataset(spec, samples=None, seed=0)
        self.match: LabelMatch = match_labels(load_original(run.original).id2label, self.data.label_names)
        if not self.match.mapping:
            raise fail(f"no class of {spec} matches a class of {run.original}: pass the other half of its data")
        self.preprocess = run.preprocess()
        self.batch_size = batch_size

    @property
    def samples(self) -> int:
        return sum(1 for label in self.data.labels if label in self.match.mapping)

    def predict(self, model: Callable[..., Any] | Path) -> Predictions:
        """Predictions of a model (or of an artifact, loaded with ``load_compressed``) on every matched image."""
        loaded = load_compressed(model) if isinstance(model, Path) else model
        predicted, correct = predict_part(
            loaded, self.preprocess, self.data, self.match, batch_size=self.batch_size, progress=False
        )
        return Predictions(predicted=predicted, correct=correct)
