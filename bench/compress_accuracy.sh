#!/usr/bin/env bash
# bench/compress_accuracy.sh: ResNet-20 on Fashion-MNIST under f32 plain and
# compress:8, compress:4, compress:2, in one run, same seed and data: a
# SHORTENED run of docs/TRAINING.md's recipe (TRAIN images, EPOCHS epochs;
# the issue's target is the full 4-epoch recipe). Prints one line per
# strategy with the final test accuracy.
#   bench/compress_accuracy.sh [BUILD_DIR]   (TRAIN, TEST, EPOCHS, BATCH override)
set -euo pipefail
build=${1:-build}
train=${TRAIN:-12800} test=${TEST:-2000} epochs=${EPOCHS:-1} batch=${BATCH:-128}
for s in plain compress:8 compress:4 compress:2; do
    out=$("$build/examples/train" --model resnet20 --strategy "$s" --epochs "$epochs" \
        --batch "$batch" --limit-train "$train" --limit-test "$test" --seed 1 2>&1) ||
        { echo "$s: train failed:"; echo "$out" | tail -3; exit 1; }
    echo "$s	$(echo "$out" | grep -iE 'test|acc' | tail -1)"
done
