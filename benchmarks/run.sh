#!/usr/bin/env bash
# Reproduce the benchmark tables (see benchmarks/README.md). Needs ../shared beside the repo.
# README.md's "Measured" figures come from benchmarks/figures.sh; the bench figures quoted there from the first command.
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED=${SHARED:-../shared}
OUT=${OUT:-runs/bench}
export PROFILING_AGENT_LATENCY_REPEATS=${PROFILING_AGENT_LATENCY_REPEATS:-50}

# Tables 1, 3 and 4 on the real CIFAR-10 models (Hugging Face ViT, ResNet and Swin), default settings:
# 256 calibration images and 1000 evaluation images (disjoint), activation-aware importance, reconstruction
# after every prune; every uniform baseline without and with that recovery. 1 thread.
profiling-agent bench --model "$SHARED/models/cifar10-vit-tiny" --model "$SHARED/models/cifar10-resnet-tiny" \
    --model "$SHARED/models/cifar10-swin-tiny" \
    --dataset "$SHARED/data/cifar10-test" --out "$OUT/cifar10" --eval-samples 1000 --threads 1 \
    --quant-backend onnxruntime "$@"

# A plain-PyTorch CIFAR-10 ResNet-20 built from a factory and a checkpoint.
profiling-agent bench --model tools.zoo.cifar_resnet:resnet20 --weights "$SHARED/models/cifar10-resnet20.th" \
    --labels airplane,automobile,bird,cat,deer,dog,frog,horse,ship,truck --image-size 32 \
    --mean 0.485,0.456,0.406 --std 0.229,0.224,0.225 \
    --dataset "$SHARED/data/cifar10-test" --out "$OUT/resnet20" --eval-samples 1000 --threads 1 \
    --quant-backend onnxruntime "$@"

# ViT-B/16 with random weights: latency and memory only (no data: no calibration, so no recovery), 2 threads.
profiling-agent bench --model vit-b16 --out "$OUT/vit-b16" --threads 2 --iterations 2 --quant-backend onnxruntime "$@"
