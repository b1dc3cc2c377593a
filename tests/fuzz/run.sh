#!/usr/bin/env bash
# Runs every libFuzzer harness in DIR for SECONDS each on a scratch copy of
# its seed corpus (the committed seeds stay as they are). Fails, naming the
# harness, on any crash, sanitizer report, leak, out-of-memory (2 GiB) or
# hang (one input over 10 s); the input that did it is kept in
# DIR/artifacts/<harness>/ and becomes a regression seed once fixed.
set -u
dir=${1:-build-fuzz}
secs=${2:-120}
here=$(cd "$(dirname "$0")" && pwd)
failed=0
for bin in "$dir"/fuzz_*; do
    [ -x "$bin" ] || continue
    name=$(basename "$bin")
    harness=${name#fuzz_}
    seeds="$here/corpus/$harness"
    work="$dir/corpus/$harness"
    art="$dir/artifacts/$harness/"
    mkdir -p "$work" "$art"
    [ -d "$seeds" ] && cp -n "$seeds"/* "$work"/ 2>/dev/null
    log="$dir/$name.log"
    echo "== $name: ${secs} s on $(ls "$work" | wc -l) inputs"
    ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
        "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
        -artifact_prefix="$art" "$work" >"$log" 2>&1
    rc=$?
    grep -E '^stat::number_of_executed_units|^stat::peak_rss_mb|cov: ' "$log" | tail -n 3 | sed 's/^/   /'
    if [ $rc -ne 0 ]; then
        echo "   $name FAILED (exit $rc); see $log and $art"
        grep -E 'ERROR|SUMMARY|runtime error|Test unit written' "$log" | head -n 5 | sed 's/^/   /'
        failed=$((failed + 1))
    fi
done
if [ $failed -gt 0 ]; then
    echo "fuzz: $failed harness(es) failed"
    exit 1
fi
echo "fuzz: every harness ran clean"
