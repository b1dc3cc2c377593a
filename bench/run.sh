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
# BENCH_ONLY runs one section (gemm, conv, bnact, models, planner, gpu); BENCH_PYTHON picks the
# interpreter with torch (default /usr/bin/python3, Debian's python3-torch).
# The models section (bench_models and torch_saved.py: whole training steps of
# ResNet-56 and DenseNet-BC-100 under each memory strategy) runs once, after
# the op rounds; BENCH_MODEL_STEPS overrides its timed steps per strategy.
# The GPU section (bench_models --gpu and torch_saved.py --gpu: the same models
# trained on the CUDA device) runs last; without a device it prints one line
# saying why it was skipped. BENCH_ONLY=gpu runs it alone, BENCH_GPU=0 leaves
# it out; BENCH_GPU_STEPS and BENCH_GPU_WARMUP set its timed and warm-up steps,
# BENCH_GPU_PYTHON its interpreter (default: BENCH_PYTHON, else the first of
# /usr/bin/python3 and python3 whose torch sees a GPU). BENCH_KEEP_DIR keeps
# the raw records (*.tsv) in that folder, written there as they come.
# The planner section (bench_planner and torch_checkpoint.py: step time against
# memory budget for frugal's planner, its fixed checkpoint schedules and
# PyTorch's checkpoint_sequential, joined by planner_join.py into a table and
# an SVG plot) runs after the models section; BENCH_ONLY=planner runs it
# alone, BENCH_PLANNER=0 leaves it out. BENCH_PLANNER_MODEL (resnet56),
# BENCH_PLANNER_BATCH (64), BENCH_PLANNER_BUDGETS (10) and BENCH_PLANNER_STEPS
# (3, timed steps per run on both sides) size it; BENCH_PLANNER_SEGMENTS
# (comma-separated K; default every K from 2 to the module count) picks
# PyTorch's segment counts; BENCH_PLANNER_SVG is where the plot goes (default
# <builddir>/bench/planner_<model>_b<batch>.svg).
# The compress section (bench_compress: issue 23's pack and unpack of saved
# activations at 8, 4 and 2 bits and the 1-bit sign mask, on every ISA path
# the CPU runs, against a copy of the same buffer, at 1 and BENCH_THREADS
# threads) runs after the op rounds and prints its own table;
# BENCH_ONLY=compress runs it alone, BENCH_COMPRESS=0 leaves it out,
# BENCH_COMPRESS_MIB (64) sets its buffer and BENCH_COMPRESS_REPS (5) its
# repetitions; BENCH_MATCH picks its cases too (e.g. "pack:4", "avx2").
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
planner_bin="$build/bench/bench_planner" shim="$build/bench/peak_alloc.so"
compress_bin="$build/bench/bench_compress"
run_ops=1 run_models=1 run_gpu=1 run_planner=1 run_compress=1
case "${BENCH_ONLY:-}" in
    "") ;;
    models) run_ops=0 run_gpu=0 run_planner=0 run_compress=0 ;;
    gpu) run_ops=0 run_models=0 run_planner=0 run_compress=0 ;;
    planner) run_ops=0 run_models=0 run_gpu=0 run_compress=0 ;;
    compress) run_ops=0 run_models=0 run_gpu=0 run_planner=0 ;;
    *) run_models=0 run_gpu=0 run_planner=0 run_compress=0 ;;
esac
[ "${BENCH_GPU:-1}" = 0 ] && run_gpu=0
[ "${BENCH_PLANNER:-1}" = 0 ] && run_planner=0
[ "${BENCH_COMPRESS:-1}" = 0 ] && run_compress=0
need=()
[ $run_ops -eq 1 ] && need+=("$bin")
[ $run_compress -eq 1 ] && need+=("$compress_bin")
[ $run_models -eq 1 ] || [ $run_gpu -eq 1 ] && need+=("$models_bin")
[ $run_planner -eq 1 ] && need+=("$planner_bin")
for b in "${need[@]}"; do
    if [ ! -x "$b" ]; then
        echo "bench: $b not found; build it with make BUILD=$build bench" >&2
        exit 1
    fi
done

# Both sides get the same thread count, through every knob they read:
# OpenMP (frugal's kernels, PyTorch's intra-op pool and oneDNN) and OpenBLAS
# (frugal's GEMM and torch.mm, whose BLAS here is the same OpenBLAS).
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads

if [ -n "${BENCH_KEEP_DIR:-}" ]; then
    tmp=$BENCH_KEEP_DIR
    mkdir -p "$tmp" || exit 1
else
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
fi
only=()
[ -n "${BENCH_ONLY:-}" ] && only=(--only "$BENCH_ONLY")
[ -n "${BENCH_MATCH:-}" ] && only+=(--match "$BENCH_MATCH")
model_args=()
[ -n "${BENCH_MATCH:-}" ] && model_args+=(--match "$BENCH_MATCH")
[ -n "${BENCH_MODEL_STEPS:-}" ] && model_args+=(--steps "$BENCH_MODEL_STEPS")

# The GPU section alone: say first whether it can run at all, so a machine
# without a GPU prints one line.
gpu_args=()
[ -n "${BENCH_MATCH:-}" ] && gpu_args+=(--match "$BENCH_MATCH")
[ -n "${BENCH_GPU_STEPS:-}" ] && gpu_args+=(--steps "$BENCH_GPU_STEPS")
[ -n "${BENCH_GPU_WARMUP:-}" ] && gpu_args+=(--warmup "$BENCH_GPU_WARMUP")
gpu_skip="" gpu_probed=0
gpu_probe() { # lists the GPU cases; sets gpu_skip when the section cannot run
    gpu_probed=1
    if ! "$models_bin" --gpu "${gpu_args[@]}" --list >"$tmp/gpu.cases.tsv"; then
        gpu_skip="$models_bin --gpu --list failed"
    elif ! grep -q '^C' "$tmp/gpu.cases.tsv"; then
        gpu_skip=$(sed -n 's/^# *gpu: *skipped: *//p' "$tmp/gpu.cases.tsv" | head -n 1)
        gpu_skip=${gpu_skip:-no GPU cases (BENCH_MATCH=${BENCH_MATCH:-})}
    fi
}
if [ $run_ops -eq 0 ] && [ $run_models -eq 0 ] && [ $run_planner -eq 0 ] && [ $run_compress -eq 0 ]; then
    [ $run_gpu -eq 1 ] && gpu_probe
    if [ "${BENCH_ONLY:-}" = planner ]; then
        echo "bench: planner section skipped: BENCH_PLANNER=0"
        exit 0
    fi
    if [ "${BENCH_ONLY:-}" = compress ]; then
        echo "bench: compress section skipped: BENCH_COMPRESS=0"
        exit 0
    fi
    if [ $run_gpu -eq 0 ] || [ -n "$gpu_skip" ]; then
        echo "bench: GPU section skipped: ${gpu_skip:-BENCH_GPU=0}"
        exit 0
    fi
fi

if [ $run_ops -eq 1 ] || [ $run_models -eq 1 ] || [ $run_planner -eq 1 ]; then
    echo "bench: frugal and PyTorch on the CPU, $threads threads each (OMP_NUM_THREADS=$threads," \
        "OPENBLAS_NUM_THREADS=$threads, torch.set_num_threads($threads)); median of $reps repetitions" \
        "of >= $min_ms ms after warm-up, best of $rounds rounds"
fi
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
if [ $run_ops -eq 1 ] || [ $run_models -eq 1 ]; then
    files=("$tmp/load.tsv" "${files[@]}" "$tmp/total.tsv")
fi

# Runs one frugal program of a section into a file: out, label, command...;
# a failure is noted in the file and kept as the exit status.
run_frugal() {
    local out=$1 label=$2 rc
    shift 2
    "$@" >"$out"
    rc=$?
    if [ $rc -ne 0 ]; then
        frugal_rc=$rc
        echo "# frugal: $label exited $rc (see its notes)" >>"$out"
    fi
    files+=("$out")
}

# The compress section: once, frugal only (PyTorch has no such kernels); its
# table is printed as it comes, after the joined op tables.
compress_out=""
if [ $run_compress -eq 1 ]; then
    cstart=$SECONDS
    compress_out="$tmp/compress.md"
    teams=1
    [ "$threads" != 1 ] && teams="1,$threads"
    compress_args=(--threads "$teams" --mib "${BENCH_COMPRESS_MIB:-64}" --reps "${BENCH_COMPRESS_REPS:-5}")
    [ -n "${BENCH_MATCH:-}" ] && compress_args+=(--match "$BENCH_MATCH")
    echo "bench: the compress section: pack/unpack against a copy, teams of $teams" >&2
    "$compress_bin" "${compress_args[@]}" >"$compress_out"
    rc=$?
    if [ $rc -ne 0 ]; then
        frugal_rc=$rc
        echo "# frugal: bench_compress exited $rc" >>"$compress_out"
    fi
    echo "# bench: the compress section took $((SECONDS - cstart)) s" >>"$compress_out"
fi

# The models section: once (a ResNet-56 step takes about half a second here,
# a DenseNet-BC-100 step several), frugal first, then PyTorch.
if [ $run_models -eq 1 ]; then
    mstart=$SECONDS
    "$models_bin" "${model_args[@]}" --list >"$tmp/models.cases.tsv" ||
        { echo "bench: $models_bin --list failed" >&2; exit 1; }
    run_frugal "$tmp/models.frugal.tsv" bench_models "$models_bin" "${model_args[@]}"
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

# The planner section: once, frugal first, then PyTorch under the heap-peak
# shim; joined apart from the other sections (its records are P and T lines).
planner_files=()
if [ $run_planner -eq 1 ]; then
    pstart=$SECONDS
    p_model=${BENCH_PLANNER_MODEL:-resnet56} p_batch=${BENCH_PLANNER_BATCH:-64}
    p_steps=${BENCH_PLANNER_STEPS:-3}
    echo "bench: the planner section: $p_model batch $p_batch, ${BENCH_PLANNER_BUDGETS:-10} budgets," \
        "$p_steps timed steps per run" >&2
    out="$tmp/planner.frugal.tsv"
    "$planner_bin" --model "$p_model" --batch "$p_batch" --budgets "${BENCH_PLANNER_BUDGETS:-10}" \
        --steps "$p_steps" >"$out"
    rc=$?
    if [ $rc -ne 0 ]; then
        frugal_rc=$rc
        echo "# frugal: bench_planner exited $rc (see its notes)" >>"$out"
    fi
    planner_files+=("$out")
    out="$tmp/planner.torch.tsv"
    if [ -z "$py" ]; then
        echo "# torch: unavailable (no python3); frugal's planner rows only" >"$out"
    elif [ $torch_ok -eq 0 ]; then
        echo "# torch: unavailable (see above); frugal's planner rows only" >"$out"
    elif [ ! -f "$shim" ]; then
        echo "# torch: $shim not built (make bench builds it); no PyTorch points" >"$out"
    else
        segs=()
        [ -n "${BENCH_PLANNER_SEGMENTS:-}" ] && segs=(--segments "$BENCH_PLANNER_SEGMENTS")
        "$py" "$here/torch_checkpoint.py" --shim "$shim" --model "$p_model" --batch "$p_batch" \
            --steps "$p_steps" --threads "$threads" "${segs[@]}" >"$out"
        rc=$?
        if [ $rc -ne 0 ] && [ $rc -ne 3 ]; then
            echo "# torch: torch_checkpoint.py exited $rc; some PyTorch points may be missing" >>"$out"
        fi
    fi
    planner_files+=("$out")
    echo "# bench: the planner section took $((SECONDS - pstart)) s" >>"$out"
fi

# The GPU section: once, frugal first, then PyTorch (an interpreter whose
# torch sees the GPU, where there is one).
gpu_python() {
    if [ -n "${BENCH_GPU_PYTHON:-}" ] || [ -n "${BENCH_PYTHON:-}" ]; then
        echo "${BENCH_GPU_PYTHON:-$BENCH_PYTHON}"
        return
    fi
    local c first=""
    for c in /usr/bin/python3 $(command -v python3 2>/dev/null); do
        [ -x "$c" ] || continue
        [ -n "$first" ] || first=$c
        if "$c" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' \
            >/dev/null 2>&1; then
            echo "$c"
            return
        fi
    done
    echo "$first"
}
[ $run_gpu -eq 1 ] && [ $gpu_probed -eq 0 ] && gpu_probe
if [ $run_gpu -eq 1 ] && [ -z "$gpu_skip" ]; then
    gstart=$SECONDS
    echo "bench: the GPU section: frugal and PyTorch training on the CUDA device (f32)" >&2
    run_frugal "$tmp/gpu.frugal.tsv" "bench_models --gpu" "$models_bin" --gpu "${gpu_args[@]}"
    out="$tmp/gpu.torch.tsv"
    gpy=$(gpu_python)
    if [ -z "$gpy" ]; then
        echo "# torch gpu: unavailable (no python3); frugal's columns only" >"$out"
    else
        # The cases carry the warm-up and timed steps (BENCH_GPU_STEPS included).
        "$gpy" "$here/torch_saved.py" "$tmp/gpu.cases.tsv" --gpu >"$out"
        rc=$?
        if [ $rc -ne 0 ] && [ $rc -ne 3 ]; then
            echo "# torch gpu: torch_saved.py --gpu exited $rc; some torch figures may be missing" >>"$out"
        fi
    fi
    files+=("$out")
    echo "# bench: the GPU section took $((SECONDS - gstart)) s" >"$tmp/gpu.total.tsv"
    files+=("$tmp/gpu.total.tsv")
fi

if [ ${#files[@]} -gt 0 ]; then
    if [ -n "$py" ]; then
        "$py" "$here/join.py" "${files[@]}"
    else
        cat "${files[@]}"
    fi
fi
[ -n "$compress_out" ] && cat "$compress_out"
if [ ${#planner_files[@]} -gt 0 ]; then
    svg=${BENCH_PLANNER_SVG:-$build/bench/planner_${p_model}_b$p_batch.svg}
    if [ -n "$py" ]; then
        "$py" "$here/planner_join.py" --svg "$svg" "${planner_files[@]}" || frugal_rc=1
    else
        cat "${planner_files[@]}"
    fi
fi
if [ $run_gpu -eq 1 ] && [ -n "$gpu_skip" ]; then
    echo "bench: GPU section skipped: $gpu_skip"
fi
exit $frugal_rc
