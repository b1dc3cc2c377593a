#!/usr/bin/env bash
# dist.sh: data-parallel throughput on this machine (bench/bench_dist.c):
# 1 process x 2 threads against 2 processes x 1 thread on the same global
# batch, and the share of the all-reduce hidden behind backward (the
# all-reduce time left after the last process ended backward, with overlap,
# against the same when every all-reduce starts after backward; see
# bench_dist.c). Prints the load average before and after.
#   bash bench/dist.sh [builddir]     (DIST_STEPS, DIST_BATCH, DIST_MODEL, DIST_BUCKET_MB)
# Across hosts over rate-limited TCP links (network namespaces; root), where
# the overlap is measurable: bash tests/multihost.sh --bench [builddir].
set -u
build=${1:-build}
bin="$build/bench/bench_dist"
[ -x "$bin" ] || { echo "dist: $bin not found; make BUILD=$build $bin" >&2; exit 1; }
command -v mpirun >/dev/null || { echo "dist: no mpirun (Open MPI); skipped"; exit 0; }
args=(--model "${DIST_MODEL:-resnet20}" --batch "${DIST_BATCH:-128}" --steps "${DIST_STEPS:-10}")
[ -n "${DIST_BUCKET_MB:-}" ] && args+=(--bucket-mb "$DIST_BUCKET_MB")
mpi=(mpirun -np 2 --oversubscribe --bind-to none)
[ "$(id -u)" -eq 0 ] && mpi+=(--allow-run-as-root)
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=1 "$bin" "${args[@]}" || exit 1
on=$(OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "${mpi[@]}" -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS \
    "$bin" "${args[@]}") || exit 1
echo "$on"
off=$(OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "${mpi[@]}" -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS \
    "$bin" "${args[@]}" --no-overlap) || exit 1
echo "$off"
wait_of() { sed -n 's/.*all-reduce wait \([0-9.]*\) ms.*/\1/p' <<<"$1"; }
exposed_of() { sed -n 's/.*exposed all-reduce \([0-9.]*\) ms.*/\1/p' <<<"$1"; }
awk -v a="$(exposed_of "$on")" -v b="$(exposed_of "$off")" -v wa="$(wait_of "$on")" -v wb="$(wait_of "$off")" 'BEGIN {
    if (b > 0) printf "all-reduce hidden behind backward: %.0f%% (exposed %.2f ms a step with overlap, %.2f ms without; waits %.2f / %.2f ms)\n", 100 * (1 - a / b), a, b, wa, wb }'
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
