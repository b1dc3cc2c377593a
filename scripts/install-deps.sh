#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks for one purpose; does nothing
# (and needs no network) when everything is present.
#   scripts/install-deps.sh [demo|test|bench|fuzz|all]   (default: all)
#
# set    packages (each set includes demo's)       needed by
# demo   build-essential (gcc, make)               building the library and examples/
#        libopenblas-dev                           CPU GEMM (cpu/gemm.c)
#        libdnnl-dev                               oneDNN CPU convolutions (cpu/conv_dnnl.c)
#        zlib1g-dev libpng-dev libturbojpeg0-dev   data/ (gzip IDX, PNG and JPEG images)
#        libstb-dev                                examples/gan.c's PNG grid (stb_image_write)
#        dataset-fashion-mnist                     the data set the demo trains on
# test   python3-torch python3-numpy               tests/fixtures/*.py (PyTorch comparisons)
#        python3-pip + the safetensors wheel       tests/test_interop.c (below)
#        libopenmpi-dev openmpi-bin                dist/comm.c over MPI, tests/test_dist.c
#        iptables                                  tests/multihost.sh's firewall and packet loss
#        pkg-config                                tests/install_test.sh (make check-install)
# bench  python3-torch python3-numpy               bench/torch_*.py, PyTorch's side
#        libopenmpi-dev openmpi-bin                bench/dist.sh (data parallel)
# fuzz   clang-14 libclang-rt-14-dev libomp-14-dev libFuzzer and OpenMP for clang (make fuzz)
# all    every set above (.ci/run, make deps)
set -euo pipefail
cd "$(dirname "$0")/.."

demo_pkgs="build-essential libopenblas-dev libdnnl-dev zlib1g-dev libpng-dev libturbojpeg0-dev libstb-dev dataset-fashion-mnist"
test_pkgs="python3-torch python3-numpy python3-pip libopenmpi-dev openmpi-bin iptables pkg-config"
bench_pkgs="python3-torch python3-numpy libopenmpi-dev openmpi-bin"
fuzz_pkgs="clang-14 libclang-rt-14-dev libomp-14-dev"
set_name=${1:-all}
case "$set_name" in
    demo) pkgs="$demo_pkgs" ;;
    test) pkgs="$demo_pkgs $test_pkgs" ;;
    bench) pkgs="$demo_pkgs $bench_pkgs" ;;
    fuzz) pkgs="$demo_pkgs $fuzz_pkgs" ;;
    all) pkgs="$demo_pkgs $test_pkgs $bench_pkgs $fuzz_pkgs" ;;
    *) echo "install-deps: unknown set '$set_name' (demo, test, bench, fuzz or all)" >&2; exit 2 ;;
esac

need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for p in $pkgs; do
    have_pkg "$p" || [[ " ${need[*]} " == *" $p "* ]] || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
    echo "install-deps: installing ($set_name) ${need[*]}"
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends "${need[@]}"
fi
case "$set_name" in test | all) ;; *) exit 0 ;; esac

# PyTorch's `safetensors` package, for the interop test in
# tests/test_safetensors.c (tests/fixtures/check_interop.py). Debian bookworm
# does not package it, so its wheel goes into the repo-local, ignored .pydeps
# folder for Debian's /usr/bin/python3 and its torch 1.13. The wheel is abi3
# (one build for every CPython >= 3.7); 0.4.5 is pinned as a version checked
# against torch 1.13. Without network this only warns: the test then skips.
SAFETENSORS_VERSION=0.4.5
have_safetensors() {
    /usr/bin/python3 -c "import sys; sys.path.insert(0, '.pydeps'); import safetensors" >/dev/null 2>&1
}
if [ -x /usr/bin/python3 ] && ! have_safetensors; then
    pip=""
    if /usr/bin/python3 -m pip --version >/dev/null 2>&1; then
        pip="/usr/bin/python3 -m pip"
    elif command -v python3 >/dev/null && python3 -m pip --version >/dev/null 2>&1; then
        pip="python3 -m pip"
    fi
    arch=$(uname -m)
    if [ -z "$pip" ]; then
        echo "install-deps: warning: no pip to install safetensors; the PyTorch interop test will skip"
    else
        echo "install-deps: installing safetensors $SAFETENSORS_VERSION into .pydeps"
        if ! PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore PIP_NO_INPUT=1 \
            $pip install -q --timeout 20 --retries 1 --target .pydeps --upgrade --no-deps \
            --only-binary=:all: --python-version 3.11 --implementation cp \
            --platform "manylinux2014_$arch" --platform "manylinux_2_17_$arch" \
            "safetensors==$SAFETENSORS_VERSION" || ! have_safetensors; then
            echo "install-deps: warning: could not install safetensors (no network?); the PyTorch interop test will skip"
        fi
    fi
fi
