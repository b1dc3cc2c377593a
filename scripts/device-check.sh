#!/usr/bin/env bash
# device-check.sh: builds frugal with CUDA and runs its tests (and the bench,
# when there is one) on a GPU machine that has nvcc but no package manager.
#
#   bash scripts/device-check.sh --prepare   # HERE, before sending the tree:
#       copies the headers that machine lacks (stb, zlib, libpng, TurboJPEG)
#       into .carry/include and the libpng / TurboJPEG libraries into .carry/lib
#   bash scripts/device-check.sh             # THERE (with .carry carried):
#       writes preflight.log, build.log, tests.log, tests-im2col.log (the
#       CUDA tests with FR_CUDNN=0), bench-gpu.md (the bench's GPU section:
#       its notes and tables), bench-gpu.log (its progress and exit status),
#       bench-gpu-raw/ (its records), bench.log (the CPU sections),
#       nccl.log (a data-parallel run on NCCL, when the machine has MPI) and
#       nvidia-smi.txt under $OUT (default ./out)
#
# Libraries the toolkit folder lacks (cuDNN or cuBLAS shipped as Python
# wheels, an unversioned libz.so) are found and offered to the compiler and
# linker through CPATH / LIBRARY_PATH / LD_LIBRARY_PATH, never by editing the
# tree. Environment: JOBS (default 16), BENCH_GPU_TIMEOUT seconds for the
# GPU section (default 300), BENCH_TIMEOUT seconds for the CPU sections
# (default 240).
set -u -o pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1
build=build-cuda
carry_inc=.carry/include

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
    echo "prepare: $(find "$carry_inc" -type f | wc -l) headers under $carry_inc; carry .carry"
    exit 0
fi

OUT=${OUT:-$root/out}
mkdir -p "$OUT"
jobs=${JOBS:-16}
rc=0

# ---- preflight: where the pieces are (run in this shell so exports stay) ----
libdir=$(mktemp -d)
trap 'rm -rf "$libdir"' EXIT

# Folders of the NVIDIA Python wheels (site-packages/nvidia/<pkg>), where an
# image may keep cuDNN or cuBLAS instead of the toolkit folder.
wheel_dirs() {
    local py
    py=$(command -v python3) || return 0
    "$py" -c '
import os, site
for base in site.getsitepackages() + [site.getusersitepackages()]:
    d = os.path.join(base, "nvidia")
    if os.path.isdir(d):
        for sub in sorted(os.listdir(d)):
            if os.path.isdir(os.path.join(d, sub)):
                print(os.path.join(d, sub))
' 2>/dev/null
}

find_header() { # name -> the folder holding it, or nothing
    local d
    for d in /usr/local/cuda/include /usr/include "$root/$carry_inc" $inc_dirs; do
        [ -f "$d/$1" ] && { echo "$d"; return; }
    done
}

find_lib() { # stem -> libstem.so or libstem.so.N, or nothing
    local d f
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
        /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu /usr/lib64 $lib_dirs "$root/.carry/lib"; do
        for f in "$d/lib$1.so" "$d"/lib"$1".so.[0-9]*; do
            [ -f "$f" ] && { echo "$f"; return; }
        done
    done
}

preflight() {
    local nvcc_bin h d l f
    echo "== $(date -u +%FT%TZ) $(uname -srm)"
    nvcc_bin=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    echo "nvcc: $nvcc_bin: $("$nvcc_bin" --version 2>&1 | tail -n 1)"
    echo "cc: $(cc --version 2>&1 | head -n 1)"
    [ -f "$carry_inc/stb/stb_image.h" ] || [ -f /usr/include/stb/stb_image.h ] ||
        echo "WARNING: no stb headers (run scripts/device-check.sh --prepare first, carry .carry)"
    for h in cuda_runtime.h cublas_v2.h cudnn.h zlib.h png.h turbojpeg.h; do
        d=$(find_header "$h")
        echo "header $h: ${d:-MISSING}"
        case "$d" in
        "" | /usr/include | /usr/local/cuda/include | "$root/$carry_inc") ;;
        *) CPATH="$d${CPATH:+:$CPATH}" ;;
        esac
    done
    for l in cudart cublas cublasLt cudnn z png16 turbojpeg; do
        f=$(find_lib "$l")
        echo "library $l: ${f:-MISSING}"
        [ -n "$f" ] || continue
        # -l<stem> needs an unversioned name; the private folder supplies one.
        ln -sf "$f" "$libdir/lib$l.so"
        d=$(dirname "$f")
        case ":$LD_LIBRARY_PATH:" in *":$d:"*) ;; *)
            case "$d" in /usr/lib/x86_64-linux-gnu | /lib/x86_64-linux-gnu | /usr/lib64) ;;
            *) LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;;
            esac ;;
        esac
    done
    LIBRARY_PATH="$libdir${LIBRARY_PATH:+:$LIBRARY_PATH}"
    export LIBRARY_PATH LD_LIBRARY_PATH
    # an empty CPATH element would mean "the current folder": only when set
    if [ -n "$CPATH" ]; then export CPATH; else unset CPATH; fi
    echo "CPATH=${CPATH:-}"
    echo "LIBRARY_PATH=$LIBRARY_PATH"
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
}

wheels=$(wheel_dirs)
inc_dirs=$(for w in $wheels; do echo "$w/include"; done)
lib_dirs=$(for w in $wheels; do echo "$w/lib"; done)
CPATH=${CPATH:-}
LIBRARY_PATH=${LIBRARY_PATH:-}
LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
preflight >"$OUT/preflight.log" 2>&1
cat "$OUT/preflight.log"

nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || echo "nvidia-smi failed" >>"$OUT/nvidia-smi.txt"

# ---- build and test ----
extra="-I$carry_inc"
if ! make BUILD=$build EXTRA_CFLAGS="$extra" -j"$jobs" -k tests 2>&1 | tee "$OUT/build.log"; then
    echo "device-check: the build failed (see build.log); running what was built" |
        tee -a "$OUT/build.log"
    rc=1
fi
bash tests/run_tests.sh $build/tests 2>&1 | tee "$OUT/tests.log" || rc=1

# ---- the im2col + cuBLAS fallback: the CUDA test programs again, cuDNN off ----
# (a few seconds; test_cuda_conv compares both backends itself when cuDNN is
# on, this run also covers the network and the allocator without cuDNN)
fallback=$(mktemp -d)
for t in test_cuda_conv test_cuda test_cuda_alloc; do
    [ -x "$build/tests/$t" ] && ln -s "$root/$build/tests/$t" "$fallback/$t"
done
FR_CUDNN=0 bash tests/run_tests.sh "$fallback" 2>&1 | tee "$OUT/tests-im2col.log" || rc=1
rm -rf "$fallback"

# ---- data parallel on NCCL (cuda/nccl.cu, in the CUDA backend), when this
# machine has MPI: a short CUDA run of train under mpirun, one process per
# GPU (one GPU: a one-rank communicator, which still runs every NCCL call);
# nccl.log. test_nccl (tests.log) checks the backend's NCCL calls without
# MPI; test_dist's GPU cases compare with gradient accumulation when there
# are 2 GPUs and MPI. ----
fmnist=/usr/share/datasets/fashion-mnist
if ! command -v mpirun >/dev/null; then
    echo "device-check: no mpirun on this machine: the NCCL run of train is skipped" | tee "$OUT/nccl.log"
elif ! nm -D "$build/libfrugal_cuda.so.0" 2>/dev/null | grep -q ' T fr_cuda_nccl_new'; then
    echo "device-check: the CUDA backend was built without NCCL (no nccl.h): the NCCL run is skipped" |
        tee "$OUT/nccl.log"
elif [ ! -d "$fmnist" ]; then
    echo "device-check: no Fashion-MNIST in $fmnist: the NCCL run of train is skipped" | tee "$OUT/nccl.log"
elif make BUILD=$build EXTRA_CFLAGS="$extra" -j"$jobs" all >"$OUT/nccl-build.log" 2>&1; then
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    [ "$gpus" -ge 1 ] || gpus=1
    root_flag=""
    [ "$(id -u)" -eq 0 ] && root_flag=--allow-run-as-root
    timeout 300 mpirun -np "$gpus" $root_flag "$build/examples/train" --device cuda \
        --model resnet8 --limit-train 512 --limit-test 128 --batch 32 --epochs 1 2>&1 |
        tee "$OUT/nccl.log" || { echo "device-check: the NCCL run failed" | tee -a "$OUT/nccl.log"; rc=1; }
else
    echo "device-check: the build for the NCCL run failed (nccl-build.log)" | tee "$OUT/nccl.log"
    rc=1
fi

# ---- bench: what `make bench` does, minus its apt-based deps step ----
# The GPU section first and alone (the figures this machine is for), with its
# own time limit; its records go to bench-gpu-raw/ as they come, so a run cut
# short still leaves a table (joined again below). Then the CPU sections.
if ls bench/*.c >/dev/null 2>&1 && [ -f bench/run.sh ]; then
    bins=$(ls bench/*.c | sed "s|^bench/\(.*\)\.c$|$build/bench/\1|")
    if make BUILD=$build EXTRA_CFLAGS="$extra" -j"$jobs" all $bins 2>&1 | tee "$OUT/bench.log"; then
        raw="$OUT/bench-gpu-raw"
        rm -rf "$raw"
        BENCH_ONLY=gpu BENCH_KEEP_DIR="$raw" timeout "${BENCH_GPU_TIMEOUT:-300}" \
            bash bench/run.sh $build >"$OUT/bench-gpu.md" 2>"$OUT/bench-gpu.log"
        grc=$?
        echo "device-check: the GPU section exited $grc" >>"$OUT/bench-gpu.log"
        # Cut short before its join: join what it left.
        if ! grep -q '^## gpu' "$OUT/bench-gpu.md" && [ -s "$raw/gpu.frugal.tsv" ]; then
            echo "device-check: the GPU section stopped before its tables (exit $grc); these are" \
                "joined from the records it left in bench-gpu-raw/" >>"$OUT/bench-gpu.md"
            records=("$raw/gpu.frugal.tsv")
            [ -f "$raw/gpu.torch.tsv" ] && records+=("$raw/gpu.torch.tsv")
            "$(command -v python3 || echo /usr/bin/python3)" bench/join.py "${records[@]}" \
                >>"$OUT/bench-gpu.md" 2>>"$OUT/bench-gpu.log"
        fi
        cat "$OUT/bench-gpu.md" "$OUT/bench-gpu.log"
        BENCH_GPU=0 timeout "${BENCH_TIMEOUT:-240}" bash bench/run.sh $build 2>&1 |
            tee -a "$OUT/bench.log" ||
            echo "device-check: the bench failed or timed out" | tee -a "$OUT/bench.log"
    else
        echo "device-check: the bench failed to build" | tee -a "$OUT/bench.log"
    fi
fi

echo "device-check: done, exit $rc; logs in $OUT"
exit $rc
