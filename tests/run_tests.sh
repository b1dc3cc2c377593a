#!/usr/bin/env bash
# Runs every test program in the given folder, prints each one's output, and
# ends with the totals: "N passed, N failed[, N skipped]". Exits non-zero if
# any test failed or any program crashed or printed no summary.
# FR_TEST_TIMEOUT: each program's limit in seconds (default 600); a program
# stopped by it counts as failed and is named, and the run goes on, so one
# hang cannot use up a short GPU lease (scripts/device-check.sh gives 120).
set -u
dir=${1:-build/tests}
limit=${FR_TEST_TIMEOUT:-600}
case "$limit" in '' | *[!0-9]* | 0) echo "run_tests: FR_TEST_TIMEOUT must be a positive number of seconds, not '$limit'" >&2; exit 2 ;; esac
passed=0 failed=0 skipped=0 broken=0
for t in "$dir"/test_*; do
    [ -x "$t" ] || continue
    case "$t" in *.d|*.o) continue ;; esac
    echo "== $(basename "$t")"
    out=$(timeout -k 10 "$limit" "$t" 2>&1)
    rc=$?
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        printf '%s\n' "$out"
        echo "   $(basename "$t") stopped after its limit of $limit s (FR_TEST_TIMEOUT)"
        broken=$((broken + 1))
        continue
    fi
    printf '%s\n' "$out" | grep -v -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$'
    last=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' | tail -n 1)
    if [ -z "$last" ]; then
        echo "   $(basename "$t") crashed or printed no summary (exit $rc)"
        broken=$((broken + 1))
        continue
    fi
    read -r p _ f _ s _ <<<"$(echo "$last" | tr -d ,)"
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "   $(basename "$t") exited $rc"
        broken=$((broken + 1))
    fi
done
failed=$((failed + broken))
if [ "$skipped" -gt 0 ]; then
    echo "$passed passed, $failed failed, $skipped skipped"
else
    echo "$passed passed, $failed failed"
fi
[ "$failed" -eq 0 ]
