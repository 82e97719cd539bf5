#!/usr/bin/env bash
# Regenerate every figure of README.md's "Measured" section (see benchmarks/README.md, "README figures").
# Needs ../shared beside the repo. About an hour on a 2-core CPU (DISTILL=1 adds about another hour).
#
#   bash benchmarks/figures.sh                 # writes runs/figures/
#   OUT=elsewhere SHARED=/path/to/shared bash benchmarks/figures.sh
#
# A run directory that already holds a report.json is reused, not run again (delete it to re-run).
# The bench figures the README quotes (uniform baselines at the agent's size) come from benchmarks/run.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED=${SHARED:-../shared}
OUT=${OUT:-runs/figures}
HALVES="$OUT/halves"
mkdir -p "$OUT"

# CIFAR-10's test split in two halves of symbolic links: every second image of each class (5,000 each).
# The runs get half a; the checks evaluate what they saved on half b, images the runs never saw.
python benchmarks/split_halves.py --source "$SHARED/data/cifar10-test" --out "$HALVES"

# run NAME ARGS...: one `profiling-agent run` into $OUT/NAME on half a, its wall time in $OUT/NAME.time.
run() {
    local name=$1
    shift
    if [[ -f "$OUT/$name/report.json" ]]; then
        echo "$OUT/$name: finished before, reused"
        return
    fi
    local start=$SECONDS
    profiling-agent run --dataset "$HALVES/a" --run-dir "$OUT/$name" --threads 1 --no-progress "$@"
    echo "$name: whole run $((SECONDS - start)) s" | tee "$OUT/$name.time"
}

# The three shared Hugging Face CIFAR-10 models: default settings, 5 rounds, 1 thread.
for name in vit swin resnet; do
    run "$name" --model "$SHARED/models/cifar10-$name-tiny" --iterations 5
done

# Table "Pruning that keeps accuracy": the runs' best pruned (and deployed) models on the unseen half.
python benchmarks/unseen_half.py "$OUT/vit" "$OUT/swin" "$OUT/resnet" --data "$HALVES/b" \
    --json "$OUT/unseen_half.json" | tee "$OUT/unseen_half.txt"

# Pruning's own speed-up (PyTorch, float): original vs best pruned, batch 1 and 32, 1 and 2 threads.
python benchmarks/pruned_latency.py "$OUT/vit" "$OUT/swin" "$OUT/resnet" --threads 1 2 --batches 1 32 \
    --json "$OUT/pruned_latency.json" | tee "$OUT/pruned_latency.txt"

# Table "Deployment through the fastest runtime": the deployed models vs what each runtime gives for the original
# (ONNX Runtime FP32 and dynamic int8, OpenVINO FP32 and int8, NNCF's defaults), batch 1 and 32, 1 thread,
# interleaved; runtime x precision x pruning factors. The same runs with --int8-cpu no-vnni ("vit-nv" ...) build the
# int8 an AVX2-only CPU gets; their deployed models are also checked on the emulated CPU where QEMU is installed.
for name in vit swin resnet; do
    run "$name-nv" --model "$SHARED/models/cifar10-$name-tiny" --iterations 5 --int8-cpu no-vnni
done
python benchmarks/runtimes_vs_original.py "$OUT/vit" "$OUT/swin" "$OUT/resnet" "$OUT/vit-nv" "$OUT/swin-nv" \
    "$OUT/resnet-nv" --data "$HALVES/b" --calibration "$HALVES/a" --threads 1 --out "$OUT/runtimes-vs-original" \
    --json "$OUT/runtimes_vs_original.json" | tee "$OUT/runtimes_vs_original.txt"
if command -v qemu-x86_64 >/dev/null; then  # the no-VNNI builds' accuracy where VNNI is missing (emulated Zen 3)
    qemu-x86_64 -cpu EPYC-Milan "$(command -v python)" benchmarks/unseen_half.py "$OUT/vit-nv" "$OUT/swin-nv" \
        "$OUT/resnet-nv" --data "$HALVES/b" 2>/dev/null | tee "$OUT/unseen_half-no-vnni-emulated.txt"
fi

# The plain-PyTorch CIFAR ResNets from a factory and a checkpoint, 3 rounds (issue 20's setting).
run resnet20 --model tools.zoo.cifar_resnet:resnet20 --weights "$SHARED/models/cifar10-resnet20.th" \
    --labels airplane,automobile,bird,cat,deer,dog,frog,horse,ship,truck --image-size 32 \
    --mean 0.485,0.456,0.406 --std 0.229,0.224,0.225 --iterations 3
python benchmarks/unseen_half.py "$OUT/resnet20" --data "$HALVES/b" --rounds \
    --json "$OUT/unseen_half-resnet20.json" | tee "$OUT/unseen_half-resnet20.txt"
run resnet56 --model tools.zoo.cifar_resnet:resnet56 --weights "$SHARED/models/cifar10-resnet56.th" \
    --labels airplane,automobile,bird,cat,deer,dog,frog,horse,ship,truck --image-size 32 \
    --mean 0.485,0.456,0.406 --std 0.229,0.224,0.225 --iterations 3
python benchmarks/runtimes_vs_original.py "$OUT/resnet20" "$OUT/resnet56" --data "$HALVES/b" \
    --calibration "$HALVES/a" --threads 1 --out "$OUT/runtimes-vs-original" \
    --json "$OUT/runtimes_vs_original-resnets.json" | tee "$OUT/runtimes_vs_original-resnets.txt"

# What a pruned convolution's channel count buys (--round-to): one stage of ResNet-56 narrowed to each width.
python benchmarks/channel_blocks.py --threads 1 | tee "$OUT/channel_blocks.txt"

# ViT-B/16 and ResNet-101 with random weights, nothing pruned: the deployed original vs what each runtime gives
# (latency and memory; no data, so static int8 is calibrated on 32 synthetic inputs).
for model in vit-b16 resnet-101; do
    if [[ ! -f "$OUT/$model/report.json" ]]; then
        profiling-agent run --model "$model" --no-prune --run-dir "$OUT/$model" --threads 1 --no-progress
    fi
    python benchmarks/deployed_original.py "$OUT/$model" --threads 1 --repeats 40 --out "$OUT/deployed-original" \
        | tee "$OUT/deployed_original-$model.txt"
done

# Int8 settings per CPU kind ("Int8 on every CPU kind"): the same int8 files evaluated on this CPU and, where QEMU's
# user-mode emulator is installed (Debian's qemu-user), on an emulated AMD Zen 3 (AVX2, no VNNI).
for name in resnet vit swin; do
    python benchmarks/int8_settings.py build --model "$SHARED/models/cifar10-$name-tiny" --out "$OUT/int8-settings/$name"
done
python benchmarks/int8_settings.py build --model tools.zoo.cifar_resnet:resnet20 --out "$OUT/int8-settings/resnet20" \
    --weights "$SHARED/models/cifar10-resnet20.th" --labels airplane,automobile,bird,cat,deer,dog,frog,horse,ship,truck \
    --image-size 32 --mean 0.485,0.456,0.406 --std 0.229,0.224,0.225
for name in resnet vit swin resnet20; do
    python benchmarks/int8_settings.py eval "$OUT/int8-settings/$name" | tee "$OUT/int8-settings-$name.txt"
    if command -v qemu-x86_64 >/dev/null; then
        qemu-x86_64 -cpu EPYC-Milan "$(command -v python)" benchmarks/int8_settings.py eval "$OUT/int8-settings/$name" \
            --images 1000 2>/dev/null | tee "$OUT/int8-settings-$name-no-vnni.txt"
    fi
done

# Distillation (DISTILL=1): the ViT run above again with knowledge distillation after every prune (default
# settings otherwise), every round's candidate on the unseen half. About 4 minutes a round on a 2-core CPU.
if [[ "${DISTILL:-0}" == 1 ]]; then
    run vit-kd --model "$SHARED/models/cifar10-vit-tiny" --iterations 5 --finetune-steps 1000 --finetune-samples 2048
    python benchmarks/unseen_half.py "$OUT/vit" "$OUT/vit-kd" --data "$HALVES/b" --rounds \
        --json "$OUT/unseen_half-distill.json" | tee "$OUT/unseen_half-distill.txt"
fi

# Automatic distillation (AUTO_KD=1): the five CIFAR models again with --finetune-steps auto, every round on the
# unseen half, and the deployed models' speed (README, "distillation sized by the model's cost"). About 1.5 hours.
if [[ "${AUTO_KD:-0}" == 1 ]]; then
    run vit-auto --model "$SHARED/models/cifar10-vit-tiny" --iterations 5 --finetune-steps auto
    run swin-auto --model "$SHARED/models/cifar10-swin-tiny" --iterations 5 --finetune-steps auto
    run resnet-auto --model "$SHARED/models/cifar10-resnet-tiny" --iterations 5 --finetune-steps auto
    for depth in 20 56; do
        run "resnet$depth-auto" --model "tools.zoo.cifar_resnet:resnet$depth" \
            --weights "$SHARED/models/cifar10-resnet$depth.th" --labels airplane,automobile,bird,cat,deer,dog,frog,horse,ship,truck \
            --image-size 32 --mean 0.485,0.456,0.406 --std 0.229,0.224,0.225 --iterations 3 --finetune-steps auto
    done
    python benchmarks/unseen_half.py "$OUT"/{vit,swin,resnet,resnet20,resnet56}-auto --data "$HALVES/b" --rounds \
        --json "$OUT/unseen_half-auto-kd.json" | tee "$OUT/unseen_half-auto-kd.txt"
    python benchmarks/runtimes_vs_original.py "$OUT/swin-auto" "$OUT/resnet-auto" --data "$HALVES/b" \
        --calibration "$HALVES/a" --threads 1 --out "$OUT/runtimes-vs-original" --json "$OUT/runtimes-auto-kd.json" \
        | tee "$OUT/runtimes-auto-kd.txt"
fi
echo "figures: $OUT/*.txt (and .json)"
