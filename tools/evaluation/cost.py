"""What a model costs: latency and throughput (median of interleaved, seeded-order runs) and size on disk."""

from __future__ import annotations

import math
import os
import random
import statistics
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from tools.clock import counts_as
from tools.evaluation.common import EvaluationError, eval_mode

__all__ = ["SERVING_BLOCK", "compare_latencies", "file_size_mb", "measure_latency", "measure_throughput"]


# ---------------------------------------------------------------------------------------------- timing


def _invoke(model: Callable[..., Any], example: Any) -> Any:
    if isinstance(example, Mapping):
        return model(**example)
    return model(example)


def _needs_cuda_sync(example: Any) -> bool:
    values = example.values() if isinstance(example, Mapping) else [example]
    return any(isinstance(v, torch.Tensor) and v.is_cuda for v in values)


def _batch_size_of(example: Any) -> int:
    values = list(example.values()) if isinstance(example, Mapping) else [example]
    for value in values:
        if isinstance(value, torch.Tensor) and value.ndim > 0:
            return int(value.shape[0])
        if hasattr(value, "shape") and len(value.shape) > 0:
            return int(value.shape[0])
    raise EvaluationError("cannot tell the batch size: pass a tensor (or dict of tensors) with a batch dim")


def _check_counts(warmup: int, repeats: int, block: int = 1) -> None:
    if warmup < 0:
        raise EvaluationError(f"warmup must be >= 0, not {warmup}")
    if repeats < 1:
        raise EvaluationError(f"repeats must be >= 1, not {repeats}")
    if block < 1:
        raise EvaluationError(f"block must be >= 1, not {block}")


#: Calls of a model in a row per interleaved repetition when the tool times deployment candidates
#: (``tools.stages.ops.compare_latency``): a deployed model serves call after call with its weights and code in cache,
#: while a call that follows another model's runs cold, and cold caches slow runtimes unequally. Measured on an AMD EPYC
#: with AVX512-VNNI (``benchmarks/runtimes_vs_original.py``, 1 thread, batch 1): cifar10-swin-tiny's deployed OpenVINO
#: FP32 ran 0.87 ms against 1.00 for the original's (1.15x) one call each, 0.37 against 0.52 (1.41x) in blocks of 20;
#: CIFAR ResNet-32's original in OpenVINO int8 0.52 ms against bf16 0.58 one call each, 0.26 against 0.36 in blocks.
#: Five calls make the median a warm call; timing costs five times the calls.
SERVING_BLOCK = 5


#: The most repetitions ``compare_latencies(min_seconds=...)`` grows to.
MAX_REPEATS = 2000


def _warm_up(models: Mapping[str, Callable[..., Any]], example_input: Any, warmup: int) -> dict[str, float]:
    """Call each model in turn, ``warmup`` rounds (at least one) under ``torch.no_grad``; each one's last seconds."""
    warm: dict[str, float] = {}
    with torch.no_grad():  # a cache a model fills on its first call must not hold an inference tensor
        for _ in range(max(1, warmup)):
            for name in models:
                start = time.perf_counter()
                _invoke(models[name], example_input)
                warm[name] = time.perf_counter() - start
    return warm


def _repetitions(
    warm: dict[str, float], repeats: int, block: int, *, max_seconds: float | None, min_seconds: float | None
) -> tuple[int, dict[str, int]]:
    """The repetitions to run (grown for ``min_seconds``) and how many of them each model takes part in (fewer for
    one slower than ``max_seconds``), from each model's warm-up seconds (see :func:`compare_latencies`)."""
    if min_seconds is not None:
        fastest = max(block * min(warm.values()), 1e-9)
        repeats = max(repeats, min(MAX_REPEATS, math.ceil(min_seconds / fastest)))
    rounds = {
        name: repeats
        if max_seconds is None
        else min(repeats, max(3, math.ceil(max_seconds / max(block * seconds, 1e-9))))
        for name, seconds in warm.items()
    }
    return repeats, rounds


@counts_as("time")
def compare_latencies(
    models: Mapping[str, Callable[..., Any]],
    example_input: Any,
    *,
    warmup: int = 3,
    repeats: int = 10,
    block: int = 1,
    max_seconds: float | None = None,
    min_seconds: float | None = None,
) -> dict[str, float]:
    """Median seconds per call of each model on ``example_input``, measured interleaved.

    Each repetition runs every model once, in a fresh seeded random order, so that drifting machine load
    affects all models alike and no model always runs after the same neighbour (which measurably biases
    the one that follows, e.g. an ONNX Runtime session after a PyTorch model); the ratios then hold.
    Works for nn.Modules (run in eval mode; the warm-up calls under ``torch.no_grad``, so that a cache a model
    fills on its first call holds an ordinary tensor, the timed ones under ``torch.inference_mode``, as a user
    would serve it) and any callable (e.g. an ONNX Runtime wrapper).
    A dict input is passed as keyword arguments. ``block``: each model runs that many calls in a row per repetition
    (all timed): with 1 every call follows another model's, so it runs with cold caches among many models; with
    20 most calls find the model's weights and code in cache, as in a service that runs one model.
    ``max_seconds``: a model slower than that much over its ``repeats`` (judged by its last warm-up call) takes part
    in fewer repetitions, at least three: a 60 ms PyTorch model timed beside 7 ms int8 builds cost most of a
    deployment's timing, and its median is no contender's. ``min_seconds``: the repetitions grow (to at most
    :data:`MAX_REPEATS`) until the fastest model's calls add up to about that much: twenty repetitions of a 0.3-ms
    CIFAR ResNet-20 in OpenVINO int8 gave its ratio to a pruned round a standard deviation of 2 % over eight
    timings on an idle core, four hundred 0.5 % (the rounds of ``--objective latency`` differ by a few per cent).
    """
    _check_counts(warmup, repeats, block)
    if not models:
        raise EvaluationError("no models to time: pass a mapping name -> model")
    names = list(models)
    sync = _needs_cuda_sync(example_input) and torch.cuda.is_available()
    times: dict[str, list[float]] = {name: [] for name in names}
    with eval_mode(list(models.values())):
        warm = _warm_up(models, example_input, warmup)
        if sync:
            torch.cuda.synchronize()
        repeats, rounds = _repetitions(warm, repeats, block, max_seconds=max_seconds, min_seconds=min_seconds)
        order = random.Random(0)
        for repetition in range(repeats):
            for name in order.sample(names, len(names)):
                if repetition >= rounds[name]:
                    continue
                for _ in range(block):
                    start = time.perf_counter()
                    with torch.inference_mode():
                        _invoke(models[name], example_input)
                    if sync:
                        torch.cuda.synchronize()
                    times[name].append(time.perf_counter() - start)
    return {name: float(statistics.median(values)) for name, values in times.items()}


@counts_as("time")
def measure_latency(model: Callable[..., Any], example_input: Any, *, warmup: int = 3, repeats: int = 10) -> float:
    """Median seconds per call at the batch of ``example_input`` (give a batch of 1 for per-image latency)."""
    return compare_latencies({"model": model}, example_input, warmup=warmup, repeats=repeats)["model"]


@counts_as("time")
def measure_throughput(model: Callable[..., Any], example_batch: Any, *, warmup: int = 1, repeats: int = 3) -> float:
    """Images per second at the batch size of ``example_batch`` (batch / median seconds per call)."""
    batch = _batch_size_of(example_batch)
    seconds = measure_latency(model, example_batch, warmup=warmup, repeats=repeats)
    return batch / seconds if seconds > 0 else float("inf")


# ---------------------------------------------------------------------------------------------- size


def file_size_mb(*paths: Path | str) -> float:
    """Total size in MB (10^6 bytes) of files and directories (directories: every file below, recursively)."""
    total = 0
    for raw in paths:
        path = Path(raw)
        if path.is_file():
            total += path.stat().st_size
        elif path.is_dir():
            for dirpath, _dirnames, filenames in os.walk(path):
                for name in filenames:
                    file = Path(dirpath, name)
                    if file.is_file():
                        total += file.stat().st_size
        else:
            raise FileNotFoundError(f"{path} does not exist: cannot measure its size")
    return total / 1e6
