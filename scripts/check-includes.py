#!/usr/bin/env python3
"""Checks the one-way include arrows between the library's folders that
docs/ARCHITECTURE.md opens with: a file may include a header of its own
folder or of a folder below it, never one above it or beside it (a peer).

The map is RANK below: a higher number is further up. Two exceptions are
the design, not drift, and are listed in ALLOWED: cpu/ and cuda/ implement
the kernel table of tensor/ (tensor/kernels.def) and include it and the
base headers it is written in; the top-level headers frugal.h and ext.h
gather every tier they publish. Tests, examples, the bench and the fuzz
harnesses sit outside the library and may include anything.

Run by `make test` (the Makefile's check-includes). Exit status 1 and one
line per wrong include, naming the file, its line and the two folders."""
import os
import re
import sys

# Folder -> floor. programs/ is the top; cpu/ and cuda/ the bottom.
RANK = {
    "programs": 8,
    "planner": 7,  # counts the optimizer's state: includes train/optim.h
    "train": 6, "models": 6, "dist": 6,
    "nn": 5,
    "autograd": 4, "io": 4, "data": 4,
    "tensor": 2,
    "cpu": 1, "cuda": 1,
}
# (from folder, to folder): arrows up the map that the design has.
ALLOWED = {("cpu", "tensor"), ("cuda", "tensor")}
SOURCE = re.compile(r"\.(c|h|cu|def)$")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def folder_of(path):
    parts = path.split("/")
    return parts[0] if len(parts) > 1 else ""


def resolve(src, inc):
    """The repository path an include names: beside the file, then from
    the root (-I.); None for what the build generates (config.h)."""
    for base in (os.path.dirname(src), "."):
        p = os.path.normpath(os.path.join(base, inc))
        if os.path.isfile(p):
            return p
    return None


def main():
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    bad = 0
    checked = 0
    for top in sorted(RANK):
        for dirpath, _, files in os.walk(top):
            for name in sorted(files):
                if not SOURCE.search(name):
                    continue
                src = os.path.join(dirpath, name)
                with open(src, encoding="utf-8") as f:
                    lines = f.readlines()
                for n, line in enumerate(lines, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    target = resolve(src, m.group(1))
                    if target is None:
                        continue
                    checked += 1
                    a, b = folder_of(src), folder_of(target)
                    if a == b or b not in RANK or (a, b) in ALLOWED:
                        continue
                    if RANK[b] >= RANK[a]:
                        where = "above" if RANK[b] > RANK[a] else "beside"
                        print(f"check-includes: {src}:{n} includes {target}: {b}/ is {where} {a}/ "
                              "in docs/ARCHITECTURE.md's map")
                        bad += 1
    if bad:
        return 1
    print(f"check-includes: {checked} includes point down the folder map")
    return 0


if __name__ == "__main__":
    sys.exit(main())
