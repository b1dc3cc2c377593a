#!/usr/bin/env bash
# Runs frugal's operator bench and the same cases in PyTorch, then prints them
# side by side (bench/join.py). Called by `make bench` as
#   bash bench/run.sh <builddir>
# Environment: BENCH_THREADS (default 2) sets the threads of both sides;
# BENCH_REPS (default 7) and BENCH_MIN_REP_MS (default 20) the timing;
# BENCH_ROUNDS (default 3) how often both sides run, alternating (the joiner
# keeps each case's best median: on shared cores a burst of someone else's
# work then hurts one round, not the comparison); BENCH_MATCH runs only the
# cases whose name contains it;
# BENCH_ONLY runs one section (gemm, conv, models); BENCH_PYTHON picks the
# interpreter with torch (default /usr/bin/python3, Debian's python3-torch).
# The models section (bench_models and torch_saved.py: whole training steps of
# ResNet-56 and DenseNet-BC-100 under each memory strategy) runs once, after
# the op rounds; BENCH_MODEL_STEPS overrides its timed steps per strategy.
set -u
build=${1:-build}
bin="$build/bench/bench_ops"
here=$(cd "$(dirname "$0")" && pwd)
threads=${BENCH_THREADS:-2}
reps=${BENCH_REPS:-7}
min_ms=${BENCH_MIN_REP_MS:-20}
rounds=${BENCH_ROUNDS:-3}
py=${BENCH_PYTHON:-/usr/bin/python3}
[ -x "$py" ] || py=$(command -v python3 || true)

models_bin="$build/bench/bench_models"
run_ops=1 run_models=1
case "${BENCH_ONLY:-}" in
    "") ;;
    models) run_ops=0 ;;
    *) run_models=0 ;;
esac
for b in "$bin" "$models_bin"; do
    if [ ! -x "$b" ]; then
        echo "bench: $b not found; build it with make BUILD=$build bench" >&2
        exit 1
    fi
done

# Both sides get the same thread count, through every knob they read:
# OpenMP (frugal's kernels, PyTorch's intra-op pool and oneDNN) and OpenBLAS
# (frugal's GEMM and torch.mm, whose BLAS here is the same OpenBLAS).
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
only=()
[ -n "${BENCH_ONLY:-}" ] && only=(--only "$BENCH_ONLY")
[ -n "${BENCH_MATCH:-}" ] && only+=(--match "$BENCH_MATCH")
model_args=()
[ -n "${BENCH_MATCH:-}" ] && model_args+=(--match "$BENCH_MATCH")
[ -n "${BENCH_MODEL_STEPS:-}" ] && model_args+=(--steps "$BENCH_MODEL_STEPS")

echo "bench: frugal and PyTorch on the CPU, $threads threads each (OMP_NUM_THREADS=$threads," \
    "OPENBLAS_NUM_THREADS=$threads, torch.set_num_threads($threads)); median of $reps repetitions" \
    "of >= $min_ms ms after warm-up, best of $rounds rounds"
start=$SECONDS
# On two shared cores anything else running shows up in the times (an OpenMP
# team waits a whole scheduler slice for a descheduled thread), so say how
# busy the machine was.
load_note() {
    echo "# bench: load average $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null) $1" \
        "(2 cores: above ~0.5 the times are not to be trusted)"
}
load_note "before the op rounds" >"$tmp/load.tsv"
frugal_rc=0 torch_ok=1 files=()
[ $run_ops -eq 1 ] || rounds=0
if [ $run_ops -eq 1 ]; then
    "$bin" "${only[@]}" --list >"$tmp/cases.tsv" || { echo "bench: $bin --list failed" >&2; exit 1; }
fi

for round in $(seq 1 "$rounds"); do
    out="$tmp/frugal.$round.tsv"
    "$bin" "${only[@]}" --reps "$reps" --min-rep-ms "$min_ms" >"$out"
    rc=$?
    if [ $rc -ne 0 ]; then
        frugal_rc=$rc
        echo "# frugal: bench_ops exited $rc in round $round (see its notes)" >>"$out"
    fi
    files+=("$out")
    [ $torch_ok -eq 1 ] || continue
    out="$tmp/torch.$round.tsv"
    if [ -z "$py" ]; then
        echo "# torch: unavailable (no python3); frugal's column only" >"$out"
        torch_ok=0
    else
        "$py" "$here/torch_ops.py" "$tmp/cases.tsv" --threads "$threads" --reps "$reps" \
            --min-rep-ms "$min_ms" >"$out"
        rc=$?
        # 3: torch cannot be imported (the script said why); no more rounds
        [ $rc -eq 3 ] && torch_ok=0
        if [ $rc -ne 0 ] && [ $rc -ne 3 ]; then
            echo "# torch: torch_ops.py exited $rc in round $round; the torch column may be incomplete" >>"$out"
        fi
    fi
    files+=("$out")
done
echo "# bench: $rounds rounds took $((SECONDS - start)) s" >"$tmp/total.tsv"
load_note "after the op rounds" >>"$tmp/total.tsv"
files=("$tmp/load.tsv" "${files[@]}" "$tmp/total.tsv")

# The models section: once (a ResNet-56 step takes about half a second here,
# a DenseNet-BC-100 step several), frugal first, then PyTorch.
if [ $run_models -eq 1 ]; then
    mstart=$SECONDS
    "$models_bin" "${model_args[@]}" --list >"$tmp/models.cases.tsv" ||
        { echo "bench: $models_bin --list failed" >&2; exit 1; }
    out="$tmp/models.frugal.tsv"
    "$models_bin" "${model_args[@]}" >"$out"
    rc=$?
    if [ $rc -ne 0 ]; then
        frugal_rc=$rc
        echo "# frugal: bench_models exited $rc (see its notes)" >>"$out"
    fi
    files+=("$out")
    out="$tmp/models.torch.tsv"
    if [ -z "$py" ]; then
        echo "# torch: unavailable (no python3); frugal's models only" >"$out"
    elif [ $torch_ok -eq 0 ]; then
        echo "# torch: unavailable (see above); frugal's models only" >"$out"
    else
        torch_steps=()
        [ -n "${BENCH_MODEL_STEPS:-}" ] && torch_steps=(--steps "$BENCH_MODEL_STEPS")
        "$py" "$here/torch_saved.py" "$tmp/models.cases.tsv" --threads "$threads" "${torch_steps[@]}" >"$out"
        rc=$?
        if [ $rc -ne 0 ] && [ $rc -ne 3 ]; then
            echo "# torch: torch_saved.py exited $rc; the models' torch rows may be missing" >>"$out"
        fi
    fi
    files+=("$out")
    echo "# bench: the models section took $((SECONDS - mstart)) s" >>"$tmp/total.tsv"
fi

if [ -n "$py" ]; then
    "$py" "$here/join.py" "${files[@]}"
else
    cat "${files[@]}"
fi
exit $frugal_rc
