#!/usr/bin/env bash
# Keeps the two header tiers closed (docs/ARCHITECTURE.md, "Public headers"):
#   check-headers.sh PUBLIC... -- EXT...
# PUBLIC is the user tier (Makefile: PUBLIC_HEADERS, frugal.h first), EXT the
# extension tier for op authors (EXT_HEADERS, ext.h first); paths from the
# repo root. It checks that
#  - a public header includes only public headers (and the generated config.h),
#  - an extension header includes only public or extension headers,
#  - the installed set is exactly the two tiers: every public header is
#    reached from frugal.h and every extension header from ext.h, so no
#    header is installed that neither tier's umbrella publishes.
# Everything else (the kernel table, staging, the CUDA backend's headers,
# the segment splitter, the layer structs, the programs' internals) stays
# internal and is not installed.
set -euo pipefail
cd "$(dirname "$0")/.."
declare -A tier=()
pub=() ext=()
side=public
for h in "$@"; do
    if [ "$h" = -- ]; then side=ext; continue; fi
    tier[$h]=$side
    if [ $side = public ]; then pub+=("$h"); else ext+=("$h"); fi
done
bad=0
includes() {  # the repo paths of the quoted includes of $1
    local dir; dir=$(dirname "$1")
    sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$1" | while read -r inc; do
        if [ "$inc" = config.h ] && [ "$dir" = . ]; then continue; fi
        realpath -m --relative-to=. "$dir/$inc"
    done
}
for h in "${pub[@]}" "${ext[@]}"; do
    [ -f "$h" ] || { echo "check-headers: $h is listed as installed but does not exist"; bad=1; continue; }
    while read -r target; do
        t=${tier[$target]:-internal}
        if [ "${tier[$h]}" = public ] && [ "$t" != public ]; then
            echo "check-headers: public header $h includes $target, which is $t (not in PUBLIC_HEADERS)"
            bad=1
        elif [ "${tier[$h]}" = ext ] && [ "$t" = internal ]; then
            echo "check-headers: extension header $h includes $target, which is internal"
            bad=1
        fi
    done < <(includes "$h")
done
# What each umbrella reaches, followed through the includes.
reach() {
    declare -A seen=()
    local todo=("$1") h
    while [ ${#todo[@]} -gt 0 ]; do
        h=${todo[0]}; todo=("${todo[@]:1}")
        [ -n "${seen[$h]:-}" ] || [ ! -f "$h" ] && continue
        seen[$h]=1
        echo "$h"
        while read -r t; do todo+=("$t"); done < <(includes "$h")
    done
}
if [ "$bad" -eq 0 ]; then
    from_public=$(reach "${pub[0]}" | sort -u)
    from_ext=$(reach "${ext[0]}" | sort -u)
    for h in "${pub[@]}"; do
        grep -qxF "$h" <<<"$from_public" || { echo "check-headers: $h is in PUBLIC_HEADERS but ${pub[0]} does not reach it"; bad=1; }
    done
    for h in "${ext[@]}"; do
        grep -qxF "$h" <<<"$from_ext" || { echo "check-headers: $h is in EXT_HEADERS but ${ext[0]} does not reach it"; bad=1; }
        [ "$h" = "${ext[0]}" ] || ! grep -qxF "$h" <<<"$from_public" ||
            { echo "check-headers: $h is in EXT_HEADERS but ${pub[0]} reaches it: it is public"; bad=1; }
    done
fi
[ "$bad" -eq 0 ] && echo "check-headers: ${#pub[@]} public and ${#ext[@]} extension headers, each tier closed"
exit "$bad"
