#!/usr/bin/env bash
# Runs every test program in the given folder, prints each one's output, and
# ends with the totals: "N passed, N failed[, N skipped]". Exits non-zero if
# any test failed or any program crashed or printed no summary.
set -u
dir=${1:-build/tests}
passed=0 failed=0 skipped=0 broken=0
for t in "$dir"/test_*; do
    [ -x "$t" ] || continue
    case "$t" in *.d|*.o) continue ;; esac
    echo "== $(basename "$t")"
    out=$(timeout 600 "$t" 2>&1)
    rc=$?
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
