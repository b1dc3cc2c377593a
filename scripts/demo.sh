#!/usr/bin/env bash
# The demo (`make demo` runs `bash scripts/demo.sh <builddir>`): trains a
# ResNet-20 on Fashion-MNIST (Debian's dataset-fashion-mnist package) for a
# few minutes on the CPU, saves a training checkpoint to out/demo.safetensors,
# validates that file on the full test set, and shows what the memory
# strategy it trained with saves against plain (examples/memreport).
#
# Environment: DEMO_THREADS (default 2), DEMO_STRATEGY (default recompute:
# the same function and gradients as plain, about a quarter less memory per
# step, no extra time; docs/TRAINING.md has the measurements), DEMO_DATA
# (default /usr/share/datasets/fashion-mnist).
set -euo pipefail

build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
threads=${DEMO_THREADS:-2}
strategy=${DEMO_STRATEGY:-recompute}
data=${DEMO_DATA:-/usr/share/datasets/fashion-mnist}
target=85

for prog in train validate; do
    if [ ! -x "$build/examples/$prog" ]; then
        echo "demo: $build/examples/$prog is missing; build it with make BUILD=$build all" >&2
        exit 1
    fi
done
if [ ! -e "$data/train-images-idx3-ubyte.gz" ] && [ ! -e "$data/train-images-idx3-ubyte" ]; then
    echo "demo: no Fashion-MNIST in $data (install Debian's dataset-fashion-mnist: bash scripts/install-deps.sh demo)" >&2
    exit 1
fi
mkdir -p out

echo "== 1. train ResNet-20 on Fashion-MNIST (strategy $strategy, $threads threads)"
"$build/examples/train" --model resnet20 --data "fashion-mnist:$data" --strategy "$strategy" \
    --batch 128 --epochs 1 --optimizer adamw --lr 0.002 --wd 0.01 --schedule cosine \
    --limit-train 32000 --limit-test 2000 \
    --threads "$threads" --log-every 20 --save out/demo.safetensors

echo
echo "== 2. validate out/demo.safetensors on the 10000 test images"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$build/examples/validate" --checkpoint out/demo.safetensors --data "fashion-mnist:$data" \
    --batch 128 --threads "$threads" | tee "$log"

echo
echo "== 3. memory of one training step: $strategy against plain"
if [ -x "$build/examples/memreport" ]; then
    OMP_NUM_THREADS=$threads "$build/examples/memreport" --model resnet20 --batch 128 --in-channels 1 \
        --size 28 --strategies "plain,$strategy"
else
    echo "(skipped: $build/examples/memreport is not built)"
fi

acc=$(sed -n 's/^accuracy \([0-9.]*\)%.*/\1/p' "$log")
echo
if [ -n "$acc" ] && awk -v a="$acc" -v t="$target" 'BEGIN { exit !(a >= t) }'; then
    echo "demo: test accuracy $acc% (target $target%): ok; checkpoint in out/demo.safetensors"
else
    echo "demo: test accuracy ${acc:-unknown}% is below the $target% target" >&2
    exit 1
fi
