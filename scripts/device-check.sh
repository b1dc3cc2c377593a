#!/usr/bin/env bash
# device-check.sh: frugal's first contact with a GPU in one prepared run that
# fits a GPU lease (one command of at most 10 minutes, at most 8 files back,
# no package manager there; docs/ARCHITECTURE.md, "device-check").
#
#   bash scripts/device-check.sh --prepare   # HERE, before sending the tree:
#       .carry/include: the headers that machine lacks (stb, zlib, libpng,
#       TurboJPEG); .carry/lib: the libpng / TurboJPEG libraries; .carry/data:
#       a slice of Fashion-MNIST (12800 training, 2000 test images) for the
#       training phase. Carry .carry.
#   bash scripts/device-check.sh             # THERE (or here: a dry run)
#
# It runs GPU work only (no CPU suite, no CPU bench), each phase under its own
# time limit cut to what is left of DEVICE_CHECK_SECONDS (default 540), so
# the whole run ends by itself inside the lease:
#   build      make CUDA=1 LINEINFO=1 tests bench-build (no -Werror retry
#              once, when the first try fails: a newer compiler's warnings)
#   tests      the CUDA test programs, FR_TEST_TIMEOUT=120 each, then the
#              convolution-heavy ones again with FR_CUDNN=0 (im2col + cuBLAS)
#   train      train --device cuda: ResNet-20, 200 steps, then validate on
#              its checkpoint; NCCL: test_nccl's one-rank communicator (in
#              tests) and, where mpirun exists, train under mpirun -np 1
#   bench      the bench's GPU section, BENCH_GPU_STEPS=5 (warm-up 2)
#   sanitizer  compute-sanitizer --tool memcheck over the CUDA test programs
#              (built with -lineinfo), with whatever time is left
# Files under $OUT (default ./out), each complete as soon as its phase ends,
# so a run cut short still returns what finished: summary.txt (a line per
# phase, then the verdict), env.txt, build.log, tests.log, train.log,
# bench-gpu.md, sanitizer.log, and raw.tar.gz (the bench's records and
# progress, the checkpoint's size, the full outputs). Seven plain files and
# one tarball. Without a GPU each GPU phase says so and is skipped; the exit
# status is 1 only for a failure (build, a test, a GPU phase that ran).
#
# Libraries the toolkit folder lacks (cuDNN or cuBLAS from Python wheels, an
# unversioned libz.so) are offered to the compiler and linker through CPATH,
# LIBRARY_PATH and an rpath in the backend, never by editing the tree;
# LD_LIBRARY_PATH gains them for frugal's programs only (the bench's PyTorch
# side runs with the environment it came with, so its own CUDA libraries are
# not shadowed). Environment: JOBS (default: the cores), DEVICE_CHECK_SECONDS,
# DEVICE_CHECK_BUILD (the build folder, default build-cuda), DEVICE_CHECK_PHASES
# (the phases to run, default all: "tests im2col train nccl bench sanitizer").
# A rerun on the still-warm machine rebuilds only what changed, e.g.
#   DEVICE_CHECK_SECONDS=200 DEVICE_CHECK_PHASES="tests train" bash scripts/device-check.sh
set -u -o pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1
carry_inc=.carry/include
data_slice=.carry/data/fashion-mnist

if [ "${1:-}" = "--prepare" ]; then
    mkdir -p "$carry_inc/stb"
    for h in stb_image.h stb_image_write.h; do
        cp "/usr/include/stb/$h" "$carry_inc/stb/" ||
            { echo "prepare: /usr/include/stb/$h is missing" >&2; exit 1; }
    done
    for h in zlib.h zconf.h png.h pngconf.h pnglibconf.h turbojpeg.h; do
        f=$(echo "#include <$h>" | cc -E -H -x c - 2>&1 >/dev/null | awk '/^\. /{print $2; exit}')
        [ -n "$f" ] && cp "$f" "$carry_inc/"
    done
    # the image decoders' shared libraries (an image without them has no apt)
    mkdir -p .carry/lib
    for l in png16 turbojpeg; do
        # under its soname (libpng16.so.16), the name the loader looks for
        f=$(readlink -f "/usr/lib/x86_64-linux-gnu/lib$l.so") &&
            so=$(objdump -p "$f" | awk '/SONAME/{print $2}') && [ -n "$so" ] &&
            cp "$f" ".carry/lib/$so" ||
            { echo "prepare: lib$l.so is missing (scripts/install-deps.sh installs it)" >&2; exit 1; }
    done
    # A slice of Fashion-MNIST in its own IDX format (the header's count
    # rewritten): 12800 training images are 200 steps of 64, in ~6 MB.
    src=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
    mkdir -p "$data_slice"
    python3 - "$src" "$data_slice" <<'EOF' || { echo "prepare: cannot slice $src" >&2; exit 1; }
import gzip, struct, sys
src, dst = sys.argv[1], sys.argv[2]
for name, keep in (("train", 12800), ("t10k", 2000)):
    for kind, ndim in (("images-idx3", 3), ("labels-idx1", 1)):
        f = "%s-%s-ubyte.gz" % (name, kind)
        raw = gzip.open("%s/%s" % (src, f)).read()
        dims = list(struct.unpack(">%dI" % ndim, raw[4:4 + 4 * ndim]))
        per = 1
        for d in dims[1:]:
            per *= d
        dims[0] = keep
        body = raw[4 + 4 * ndim:4 + 4 * ndim + keep * per]
        with gzip.open("%s/%s" % (dst, f), "wb") as out:
            out.write(raw[:4] + struct.pack(">%dI" % ndim, *dims) + body)
EOF
    echo "prepare: $(find "$carry_inc" -type f | wc -l) headers under $carry_inc," \
        "$(du -sh .carry | cut -f1) in .carry; carry .carry"
    exit 0
fi

OUT=${OUT:-$root/out}
mkdir -p "$OUT" || exit 1
build=${DEVICE_CHECK_BUILD:-build-cuda}
jobs=${JOBS:-$(nproc 2>/dev/null || echo 4)}
deadline=$((SECONDS + ${DEVICE_CHECK_SECONDS:-540}))
work=$(mktemp -d)
raw=$work/raw
mkdir -p "$raw" "$work/lib"
trap 'rm -rf "$work"' EXIT
failed=0
summary=$OUT/summary.txt
: >"$summary"

# ---- bookkeeping ----

# The seconds a phase may take: its own limit, cut to what is left minus a
# reserve for the phases' bookkeeping; 0 when too little is left.
limit() {
    local want=$1 left=$((deadline - SECONDS - 15))
    [ "$left" -lt "$want" ] && want=$left
    [ "$want" -lt 10 ] && want=0
    echo "$want"
}

# phase NAME STATUS START NOTE: a line of summary.txt, and the raw records
# packed again (raw.tar.gz is whole after every phase).
phase() {
    printf '%-10s %-5s %4ds  %s\n' "$1" "$2" $((SECONDS - $3)) "$4" | tee -a "$summary"
    [ "$2" = FAIL ] && failed=1
    tar -czf "$work/raw.tar.gz" -C "$raw" . 2>/dev/null && mv -f "$work/raw.tar.gz" "$OUT/raw.tar.gz"
    return 0
}

# Phases left out by DEVICE_CHECK_PHASES (a rerun on a warm machine can ask
# for a few: "tests train"); the build always runs.
unwanted() {
    [ -n "${DEVICE_CHECK_PHASES:-}" ] && case " $DEVICE_CHECK_PHASES " in *" $1 "*) false ;; *) true ;; esac
}
asked="not in DEVICE_CHECK_PHASES"

# ---- preflight: where the pieces are (in this shell, so the settings stay) ----

# Folders of the NVIDIA Python wheels (site-packages/nvidia/<pkg>), where an
# image may keep cuDNN, cuBLAS or NCCL instead of the toolkit folder.
wheel_dirs() {
    command -v python3 >/dev/null || return 0
    python3 -c '
import os, site
for base in site.getsitepackages() + [site.getusersitepackages()]:
    d = os.path.join(base, "nvidia")
    if os.path.isdir(d):
        for sub in sorted(os.listdir(d)):
            if os.path.isdir(os.path.join(d, sub)):
                print(os.path.join(d, sub))
' 2>/dev/null
}
wheels=$(wheel_dirs)

find_header() { # name -> the folder holding it, or nothing
    local d
    for d in /usr/local/cuda/include /usr/include "$root/$carry_inc" $(for w in $wheels; do echo "$w/include"; done); do
        [ -f "$d/$1" ] && { echo "$d"; return; }
    done
}

find_lib() { # stem -> libstem.so or libstem.so.N, or nothing
    local d f
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
        /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu /usr/lib64 \
        $(for w in $wheels; do echo "$w/lib"; done) "$root/.carry/lib"; do
        for f in "$d/lib$1.so" "$d"/lib"$1".so.[0-9]*; do
            [ -f "$f" ] && { echo "$f"; return; }
        done
    done
}

orig_ld=${LD_LIBRARY_PATH:-}
LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
LIBRARY_PATH=${LIBRARY_PATH:-}
CPATH=${CPATH:-}
rpaths=""
preflight() {
    local nvcc_bin h d l f
    echo "== $(date -u +%FT%TZ) $(uname -srm), $(nproc) cores"
    nvcc_bin=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    echo "nvcc: $nvcc_bin: $("$nvcc_bin" --version 2>&1 | tail -n 1)"
    echo "cc: $(cc --version 2>&1 | head -n 1)"
    echo "make: $(command -v make || echo 'none: nothing can be built')"
    echo "compute-sanitizer: $(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || echo none)"
    echo "mpirun: $(command -v mpirun || echo none)"
    [ -f "$carry_inc/stb/stb_image.h" ] || [ -f /usr/include/stb/stb_image.h ] ||
        echo "WARNING: no stb headers (run scripts/device-check.sh --prepare first, carry .carry)"
    for h in cuda_runtime.h cublas_v2.h cudnn.h nccl.h zlib.h png.h turbojpeg.h; do
        d=$(find_header "$h")
        echo "header $h: ${d:-MISSING}"
        case "$d" in
        "" | /usr/include | /usr/local/cuda/include | "$root/$carry_inc") ;;
        *) [ "$h" = nccl.h ] || CPATH="$d${CPATH:+:$CPATH}" ;; # the Makefile finds NCCL itself
        esac
    done
    for l in cudart cublas cublasLt cudnn nccl z png16 turbojpeg; do
        f=$(find_lib "$l")
        echo "library $l: ${f:-MISSING}"
        [ -n "$f" ] || continue
        # -l<stem> needs an unversioned name; the private folder supplies one.
        ln -sf "$f" "$work/lib/lib$l.so"
        d=$(dirname "$f")
        case "$d" in /usr/lib/x86_64-linux-gnu | /lib/x86_64-linux-gnu | /usr/lib64 | /usr/local/cuda/lib64) ;;
        *)
            case " $rpaths " in *" -Wl,-rpath,$d "*) ;; *) rpaths="$rpaths -Wl,-rpath,$d" ;; esac
            case ":${LD_LIBRARY_PATH:-}:" in *":$d:"*) ;; *) LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;; esac
            ;;
        esac
    done
    LIBRARY_PATH="$work/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
    export LIBRARY_PATH LD_LIBRARY_PATH
    # an empty CPATH element would mean "the current folder": only when set
    if [ -n "$CPATH" ]; then export CPATH; else unset CPATH; fi
    echo "CPATH=${CPATH:-}"
    echo "LIBRARY_PATH=$LIBRARY_PATH"
    echo "LD_LIBRARY_PATH (frugal's programs; PyTorch keeps '$orig_ld')=$LD_LIBRARY_PATH"
    echo "backend rpath:$rpaths"
    echo "== nvidia-smi"
    nvidia-smi 2>&1 || echo "nvidia-smi failed"
}
t0=$SECONDS
command -v make >/dev/null || { echo "device-check: no make on this machine" | tee "$summary"; exit 1; }
preflight >"$OUT/env.txt" 2>&1
mk=(make BUILD="$build" CUDA=1 LINEINFO=1 EXTRA_CFLAGS="-I$carry_inc" CUDA_EXTRA_LDFLAGS="$rpaths")
{ echo "== make print-cuda-config"; "${mk[@]}" print-cuda-config 2>&1; } >>"$OUT/env.txt"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
no_gpu=""
[ "${gpus:-0}" -ge 1 ] || no_gpu="no GPU here (nvidia-smi lists none)"
phase preflight ok "$t0" "${gpus:-0} GPU(s); $(grep -m1 '^nccl:' "$OUT/env.txt")"

# ---- build: the backend, the tests, train/validate and the bench programs ----
t0=$SECONDS
lim=$(limit 300)
timeout -k 10 "$lim" "${mk[@]}" -j"$jobs" tests bench-build >"$OUT/build.log" 2>&1
rc=$?
if [ "$rc" -eq 0 ]; then
    phase build ok "$t0" "make CUDA=1 LINEINFO=1 tests bench-build"
else
    # Once more: without -Werror after a failure (a newer compiler may warn
    # where CI's does not), as it was after the time limit (make goes on
    # from what is built).
    retry=(WERROR=0) why="failed"
    case $rc in 124 | 137) retry=() why="was stopped by its $lim s limit" ;; esac
    lim=$(limit 240)
    echo "== the first try $why; again${retry:+ with ${retry[*]}} (limit $lim s)" >>"$OUT/build.log"
    if [ "$lim" -gt 0 ] && timeout -k 10 "$lim" "${mk[@]}" "${retry[@]}" -j"$jobs" -k tests bench-build \
        >>"$OUT/build.log" 2>&1; then
        if [ ${#retry[@]} -gt 0 ]; then
            phase build WARN "$t0" "built only with WERROR=0: $(grep -c 'warning:' "$OUT/build.log") warnings in build.log"
        else
            phase build ok "$t0" "built in two tries (the first $why)"
        fi
    else
        phase build FAIL "$t0" "see build.log: $(grep -m1 -E 'error:|Error [0-9]' "$OUT/build.log" | cut -c1-160)"
    fi
fi
export LD_LIBRARY_PATH

# ---- tests: the CUDA test programs, then the im2col pass ----
cuda_tests=(test_cuda_alloc_host test_cuda_alloc test_cuda test_cuda_loader test_cuda_conv test_cuda_edges test_amp
    test_mixed test_nccl)
t0=$SECONDS
lim=$(limit 240)
sel=$work/tests && mkdir -p "$sel"
for t in "${cuda_tests[@]}"; do
    [ -x "$build/tests/$t" ] && ln -s "$root/$build/tests/$t" "$sel/$t"
done
if unwanted tests; then
    phase tests skip "$t0" "$asked"
elif [ "$lim" -eq 0 ]; then
    phase tests FAIL "$t0" "no time left"
else
    FR_TEST_TIMEOUT=120 timeout -k 10 "$lim" bash tests/run_tests.sh "$sel" >"$OUT/tests.log" 2>&1
    rc=$?
    last=$(tail -n 1 "$OUT/tests.log")
    note="$last${no_gpu:+ ($no_gpu: the GPU cases skip)}"
    [ "$rc" -eq 0 ] && phase tests ok "$t0" "$note" || phase tests FAIL "$t0" "exit $rc: $note"
fi
t0=$SECONDS
lim=$(limit 90)
if unwanted im2col; then
    phase im2col skip "$t0" "$asked"
elif [ -n "$no_gpu" ]; then
    phase im2col skip "$t0" "$no_gpu"
elif [ "$lim" -eq 0 ]; then
    phase im2col skip "$t0" "no time left"
else
    sel2=$work/im2col && mkdir -p "$sel2"
    for t in test_cuda_conv test_cuda test_cuda_edges; do
        [ -e "$sel/$t" ] && ln -s "$root/$build/tests/$t" "$sel2/$t"
    done
    echo "== the same with FR_CUDNN=0 (im2col + cuBLAS)" >>"$OUT/tests.log"
    FR_CUDNN=0 FR_TEST_TIMEOUT=60 timeout -k 10 "$lim" bash tests/run_tests.sh "$sel2" >>"$OUT/tests.log" 2>&1
    rc=$?
    [ "$rc" -eq 0 ] && phase im2col ok "$t0" "$(tail -n 1 "$OUT/tests.log")" ||
        phase im2col FAIL "$t0" "exit $rc: $(tail -n 1 "$OUT/tests.log")"
fi

# ---- train: ResNet-20 on the GPU for 200 steps, validate, NCCL ----
data=""
for d in "$root/$data_slice" /usr/share/datasets/fashion-mnist; do
    [ -f "$d/train-images-idx3-ubyte.gz" ] && { data=$d; break; }
done
t0=$SECONDS
lim=$(limit 150)
ckpt=$work/resnet20.ckpt
train=(timeout -k 5 "$lim" "$build/examples/train" --device cuda --model resnet20 --data "fashion-mnist:$data"
    --batch 64 --limit-train 12800 --limit-test 2000 --epochs 1 --schedule constant --log-every 20
    --save "$ckpt")
if unwanted train; then
    phase train skip "$t0" "$asked"
elif [ -z "$data" ]; then
    echo "device-check: no Fashion-MNIST (run --prepare and carry .carry)" >"$OUT/train.log"
    phase train "$([ -n "$no_gpu" ] && echo skip || echo FAIL)" "$t0" "no data: run --prepare and carry .carry"
elif [ "$lim" -eq 0 ]; then
    echo "device-check: no time left for training" >"$OUT/train.log"
    phase train skip "$t0" "no time left"
else
    echo "+ ${train[*]}" >"$OUT/train.log"
    "${train[@]}" >>"$OUT/train.log" 2>&1
    rc=$?
    if [ "$rc" -eq 0 ]; then
        lim=$(limit 60)
        echo "+ validate --device cuda --checkpoint (the run's)" >>"$OUT/train.log"
        timeout -k 5 "$lim" "$build/examples/validate" --device cuda --checkpoint "$ckpt" \
            --data "fashion-mnist:$data" --limit-test 2000 >>"$OUT/train.log" 2>&1
        vrc=$?
        ls -l "$ckpt" >"$raw/checkpoint.txt" 2>&1
        note="$(grep -m1 '^epoch 1/1:' "$OUT/train.log" | cut -c12-110); validate:"
        note="$note $(grep '^accuracy' "$OUT/train.log" | tail -n 1 | cut -c1-80)"
        [ "$vrc" -eq 0 ] && phase train ok "$t0" "$note" ||
            phase train FAIL "$t0" "train passed, validate exited $vrc"
    elif [ -n "$no_gpu" ]; then
        phase train skip "$t0" "$no_gpu: train says: $(tail -n 1 "$OUT/train.log" | cut -c1-120)"
    else
        phase train FAIL "$t0" "exit $rc: $(tail -n 1 "$OUT/train.log" | cut -c1-120)"
    fi
fi
# NCCL: test_nccl ran a one-rank communicator above; under mpirun, train's
# data-parallel path (dist/ over NCCL) for a few steps, where MPI exists.
t0=$SECONDS
lim=$(limit 60)
if unwanted nccl; then
    phase nccl skip "$t0" "$asked"
elif ! grep -q '^nccl: header' "$OUT/env.txt"; then
    phase nccl FAIL "$t0" "the backend was built without NCCL ($(grep -m1 '^nccl:' "$OUT/env.txt"))"
elif [ -n "$no_gpu" ]; then
    phase nccl skip "$t0" "$no_gpu (test_nccl's cases skipped in tests)"
elif ! command -v mpirun >/dev/null; then
    phase nccl ok "$t0" "one rank through test_nccl ($(grep -A30 '^== test_nccl' "$OUT/tests.log" |
        grep -m1 -E '^[0-9]+ passed' || echo 'see tests.log')); no mpirun for train"
elif [ "$lim" -gt 0 ] && [ -n "$data" ]; then
    root_flag=""
    [ "$(id -u)" -eq 0 ] && root_flag=--allow-run-as-root
    echo "+ mpirun -np 1 train --device cuda --model resnet8 (NCCL, one rank)" >>"$OUT/train.log"
    timeout -k 5 "$lim" mpirun -np 1 $root_flag "$build/examples/train" --device cuda --model resnet8 \
        --data "fashion-mnist:$data" --limit-train 1024 --limit-test 256 --batch 64 --epochs 1 \
        >>"$OUT/train.log" 2>&1 && phase nccl ok "$t0" "mpirun -np 1 train" ||
        phase nccl FAIL "$t0" "mpirun -np 1 train failed (train.log)"
else
    phase nccl skip "$t0" "no time left"
fi

# ---- bench: the GPU section, fewer steps ----
t0=$SECONDS
lim=$(limit 150)
if unwanted bench; then
    phase bench skip "$t0" "$asked"
elif [ -n "$no_gpu" ]; then
    echo "device-check: the GPU bench is skipped: $no_gpu" >"$OUT/bench-gpu.md"
    phase bench skip "$t0" "$no_gpu"
elif [ "$lim" -eq 0 ]; then
    echo "device-check: no time left for the GPU bench" >"$OUT/bench-gpu.md"
    phase bench skip "$t0" "no time left"
else
    # PyTorch's side runs with the environment it came with (its own CUDA
    # libraries), not with frugal's LD_LIBRARY_PATH.
    py=$(command -v python3 || echo /usr/bin/python3)
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%q exec %q "$@"\n' "$orig_ld" "$py" >"$work/python3"
    chmod +x "$work/python3"
    BENCH_ONLY=gpu BENCH_KEEP_DIR="$raw/bench" BENCH_GPU_STEPS=5 BENCH_GPU_WARMUP=2 \
        BENCH_GPU_PYTHON="$work/python3" timeout -k 10 "$lim" bash bench/run.sh "$build" \
        >"$OUT/bench-gpu.md" 2>"$raw/bench-gpu.log"
    rc=$?
    if ! grep -q '^## gpu' "$OUT/bench-gpu.md" && [ -s "$raw/bench/gpu.frugal.tsv" ]; then
        # cut short before its join: join what it left
        echo "device-check: the GPU section stopped (exit $rc) before its tables; joined from its records" \
            >>"$OUT/bench-gpu.md"
        records=("$raw/bench/gpu.frugal.tsv")
        [ -f "$raw/bench/gpu.torch.tsv" ] && records+=("$raw/bench/gpu.torch.tsv")
        "$work/python3" bench/join.py "${records[@]}" >>"$OUT/bench-gpu.md" 2>>"$raw/bench-gpu.log"
    fi
    if grep -q 'GPU section skipped' "$OUT/bench-gpu.md"; then
        phase bench FAIL "$t0" "the bench saw no GPU: $(grep -m1 'GPU section skipped' "$OUT/bench-gpu.md" | cut -c1-120)"
    elif [ "$rc" -eq 0 ]; then
        phase bench ok "$t0" "BENCH_ONLY=gpu, 5 steps"
    else
        phase bench FAIL "$t0" "exit $rc (raw.tar.gz: bench-gpu.log)"
    fi
fi

# ---- sanitizer: memcheck over the CUDA test programs, with what is left ----
t0=$SECONDS
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if unwanted sanitizer; then
    phase sanitizer skip "$t0" "$asked"
elif [ -n "$no_gpu" ]; then
    echo "device-check: memcheck skipped: $no_gpu" >"$OUT/sanitizer.log"
    phase sanitizer skip "$t0" "$no_gpu"
elif [ ! -x "$sanitizer" ]; then
    echo "device-check: memcheck skipped: no compute-sanitizer" >"$OUT/sanitizer.log"
    phase sanitizer skip "$t0" "no compute-sanitizer"
else
    : >"$OUT/sanitizer.log"
    errors=0 ran=0 cut=""
    # the smaller programs first: each finished one is a clean answer
    for t in test_cuda_alloc test_cuda_conv test_cuda test_amp test_cuda_edges; do
        [ -x "$build/tests/$t" ] || continue
        lim=$(limit 120)
        [ "$lim" -eq 0 ] && { cut="$cut $t"; continue; }
        echo "== memcheck $t (limit $lim s)" >>"$OUT/sanitizer.log"
        timeout -k 5 "$lim" "$sanitizer" --tool memcheck --leak-check no --error-exitcode 99 \
            --print-limit 20 "$build/tests/$t" >>"$OUT/sanitizer.log" 2>&1
        rc=$?
        echo "== $t: exit $rc" >>"$OUT/sanitizer.log"
        case $rc in 0) ran=$((ran + 1)) ;; 124 | 137) cut="$cut $t" ;; *) errors=$((errors + 1)) ;; esac
    done
    note="$ran clean, $errors with errors${cut:+; cut by the time limit:$cut}"
    [ "$errors" -eq 0 ] && phase sanitizer ok "$t0" "$note" || phase sanitizer FAIL "$t0" "$note"
fi

verdict=$([ "$failed" -eq 0 ] && echo "passed" || echo "FAILED")
echo "device-check: $verdict in $SECONDS s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')" | tee -a "$summary"
exit "$failed"
