#!/usr/bin/env bash
# bench/compress_accuracy.sh: ResNet-20 (MODEL) on Fashion-MNIST under f32 plain and
# compress:8, compress:4, compress:2, same seed, data and recipe (docs/TRAINING.md:
# AdamW lr 0.002 wd 0.05, cosine, batch 128, no augmentation). Defaults are a
# SHORTENED run (TRAIN images, EPOCHS epochs); the issue's target is
# EPOCHS=4 TRAIN=60000 TEST=10000. JOBS runs that many strategies at once,
# each on THREADS threads (results do not depend on the thread count). Prints
# each strategy's test accuracy after every epoch, then the final one.
#   bench/compress_accuracy.sh [BUILD_DIR]
#   (MODEL, TRAIN, TEST, EPOCHS, BATCH, JOBS, THREADS, STRATEGIES override;
#   issue 23's DenseNet run: MODEL=densenet-bc-100 BATCH=64)
set -euo pipefail
build=${1:-build}
train=${TRAIN:-12800} test=${TEST:-2000} epochs=${EPOCHS:-1} batch=${BATCH:-128}
jobs=${JOBS:-1} threads=${THREADS:-2} model=${MODEL:-resnet20}
strategies=${STRATEGIES:-plain compress:8 compress:4 compress:2}
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
run() {
    "$build/examples/train" --model "$model" --strategy "$1" --epochs "$epochs" \
        --batch "$batch" --limit-train "$train" --limit-test "$test" --seed 1 \
        --optimizer adamw --lr 0.002 --wd 0.05 --schedule cosine --threads "$threads" \
        >"$logs/${1//:/_}.log" 2>&1
}
pids=() names=()
for s in $strategies; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
    run "$s" & pids+=($!) names+=("$s")
done
status=0
for i in "${!pids[@]}"; do
    s=${names[$i]} log="$logs/${names[$i]//:/_}.log"
    if ! wait "${pids[$i]}"; then
        echo "$s: train failed:"; tail -3 "$log"; status=1; continue
    fi
    echo "$s	epochs: $(grep -ioE 'test[^%]*%' "$log" | grep -oE '[0-9.]+ ?%' | tr '\n' ' ')"
    echo "$s	$(grep -iE 'test|acc' "$log" | tail -1)"
done
exit $status
