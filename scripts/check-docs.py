#!/usr/bin/env python3
"""make check-docs: every repository path and every fr_/FR_ name that the
docs (README.md, docs/*.md, bench/README.md) and the comments of the sources
(C, CUDA, kernels.def, shell, Python, Makefile) cite must exist; otherwise
prints FILE:LINE: what is stale, one line each, and exits 1. Python 3
standard library only, one pass over the tracked files (about a second).

What counts as a citation (precise rules, so that the allow-list stays
small):
- a path: a word of the form dir/.../name.ext with a source or doc extension
  (PATH_EXT below), or a bare name.md, .c, .cu, .def, .py or .sh (not a bare
  .h: that is mostly a system header, dnnl.h, nccl.h). It must exist from
  the repository root or from the citing file's folder; `*` and a
  <placeholder> in it are globs that must match a file
  (tests/test_<family>.c). frugal/X, the installed spelling
  (<frugal/nn/build.h>), cites X in the tree; frugal/config.h is generated
  by the build. Words under a folder the build or a program writes (build*,
  out, ..., or a placeholder such as <build>/ or <prefix>/) or outside the
  tree (/usr/..., $VAR/..., ~/...) are not citations; neither is anything
  inside a URL. A trailing :LINE is not part of the path.
- a name: fr_xxx or FR_XXX. It must occur as an identifier (or in a string,
  for environment variables) in the code of a C/CUDA source or header, in a
  script (outside its comments) or in scripts/gen-config.sh (config.h's
  macros). fr_xxx_* and fr_xxx_<placeholder> are prefixes: some identifier
  must start with fr_xxx_. A plural (FR_ASSERTs) cites its singular.
A CHANGES file (old -> new names) is not checked. ALLOWED below lists the
few words that look like citations and are not.
"""
import fnmatch
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.chdir(ROOT)

PATH_EXT = r"(?:c|h|cu|cuh|def|md|sh|py|map|svg|json)"
# Folders that hold what builds and programs write, not sources.
WRITTEN = ("build", "build-asan", "build-cuda", "build-fuzz", "out", ".pydeps")
# Words that look like citations and are not, with why.
ALLOWED = {
    # the installed tree, under a prefix (docs/INSTALL.md)
    "include/frugal/config.h",
    # files a program writes: scripts/device-check.sh's GPU bench table, and
    # a placeholder folder in tests/test_bench_planner_tools.c
    "bench-gpu.md",
    "dir/plot.svg",
    # a user's program, out of tree (docs/INSTALL.md)
    "my_model.c",
}


def tracked_files():
    # tracked files and new ones not yet committed (not the ignored build output)
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, check=True).stdout
    return [f for f in out.decode().split("\0") if f and os.path.exists(f)]


FILES = tracked_files()
FILESET = set(FILES)
DIRS = {os.path.dirname(f) for f in FILES}
for d in list(DIRS):
    while d:
        d = os.path.dirname(d)
        DIRS.add(d)
BASENAMES = {os.path.basename(f) for f in FILES}


def c_split(text):
    """Yields (line, kind, text) pieces of C/CUDA source, kind 'comment' or 'code';
    string literals stay in the code."""
    i, n, line = 0, len(text), 1
    code_start, code_line = 0, 1
    pieces = []
    while i < n:
        ch = text[i]
        if ch == "/" and i + 1 < n and text[i + 1] in "*/":
            pieces.append((code_line, "code", text[code_start:i]))
            end = text.find("*/", i + 2) + 2 if text[i + 1] == "*" else text.find("\n", i)
            if end < 2 or end == -1:
                end = n
            pieces.append((line, "comment", text[i:end]))
            line += text.count("\n", i, end)
            i = end
            code_start, code_line = i, line
            continue
        if ch in "\"'":
            j = i + 1
            while j < n and text[j] != ch and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            line += text.count("\n", i, j + 1)
            i = j + 1
            continue
        if ch == "\n":
            line += 1
        i += 1
    pieces.append((code_line, "code", text[code_start:]))
    return pieces


def hash_split(text):
    """Shell, Python, Makefile: '#' comments (not #! and not inside quotes,
    roughly: a # at line start or after a space)."""
    pieces = []
    for k, ln in enumerate(text.split("\n"), 1):
        m = re.search(r"(^|\s)#(?!!)", ln)
        if m and not ln.lstrip().startswith("#!"):
            pieces.append((k, "code", ln[: m.start()]))
            pieces.append((k, "comment", ln[m.start():]))
        else:
            pieces.append((k, "code", ln))
    return pieces


def kind_of(f):
    ext = os.path.splitext(f)[1]
    if ext in (".c", ".h", ".cu", ".cuh", ".def"):
        return "c"
    if ext in (".sh", ".py") or os.path.basename(f) in ("Makefile", "run"):
        return "hash"
    if f in DOCS:
        return "doc"
    return None


# A CHANGES file is not checked: it lists old names that no longer exist, on purpose.
DOCS = {"README.md", "bench/README.md"} | {
    f for f in FILES if re.fullmatch(r"docs/[^/]+\.md", f) and not os.path.basename(f).startswith("CHANGES")
}

IDENT = re.compile(r"\b[A-Za-z_]\w*")
identifiers = set()
texts = []  # (file, line, text) to check
for f in FILES:
    k = kind_of(f)
    if k is None:
        continue
    with open(f, encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    if k == "doc":
        texts.append((f, 1, text))
        continue
    for line, kind, piece in c_split(text) if k == "c" else hash_split(text):
        if kind == "comment":
            texts.append((f, line, piece))
        else:
            identifiers.update(IDENT.findall(piece))
        if f == "scripts/gen-config.sh":
            identifiers.update(IDENT.findall(piece))

# Names made by token pasting from an X-macro list: `#define FR_ACT_LIST(X)`
# with lines `X(MISH, ...)` defines FR_ACT_MISH (the list's name less LIST,
# then each entry's first argument), which no source spells out.
for f in FILES:
    if kind_of(f) != "c":
        continue
    with open(f, encoding="utf-8", errors="replace") as fh:
        src = fh.read()
    for m in re.finditer(r"#define\s+((?:FR|fr)_\w*_)LIST\(X\)((?:[^\n]*\\\n)*[^\n]*)", src):
        identifiers.update(m.group(1) + e for e in re.findall(r"\bX\(\s*(\w+)", m.group(2)))

URL = re.compile(r"\w+://\S+")
SEG = r"(?:[\w.*-]|<[\w-]+>)"  # a path character or a whole <placeholder>
PATH = re.compile(
    r"(?<![\w./$~*>-])((?:" + SEG + r"+/)+" + SEG + r"*(?:[\w*]|<[\w-]+>)\." + PATH_EXT
    + r"|[\w-]+\.(?:md|c|cu|def|py|sh))(?![\w/*])"
)
NAME = re.compile(r"(?<![\w$])((?:fr|FR)_\w+)(\*|<)?")


def path_ok(p, citing):
    first = p.split("/")[0]
    if first == "frugal":  # the installed spelling, <frugal/nn/build.h>: the header in the tree
        p = p[len("frugal/"):]
        if p == "config.h":  # generated by the build (scripts/gen-config.sh)
            return True
    if p in ALLOWED or first in WRITTEN or first.startswith("<"):  # <build>/..., <prefix>/...
        return True
    here = os.path.dirname(citing)
    for cand in (p, os.path.normpath(os.path.join(here, p))):
        cand = re.sub(r"<[\w-]+>", "*", cand)
        if "*" in cand:
            if fnmatch.filter(FILES, cand):
                return True
        elif cand in FILESET:
            return True
    if "/" not in p:  # a bare file name: anywhere in the tree
        return p in BASENAMES
    return False


def name_ok(name, prefix):
    if prefix:
        return any(i.startswith(name) for i in identifiers)
    return name in identifiers or (name.endswith("s") and name[:-1] in identifiers)


stale = []
for f, first, text in texts:
    text = URL.sub(lambda m: " " * len(m.group()), text)
    for k, ln in enumerate(text.split("\n")):
        where = f"{f}:{first + k}"
        for m in PATH.finditer(ln):
            p = m.group(1)
            if not path_ok(p, f):
                stale.append(f"{where}: path {p} does not exist")
        for m in NAME.finditer(ln):
            name, star = m.group(1), m.group(2)
            if star is None and name.endswith("_"):
                star = "*"
            if not name_ok(name, star):
                what = f"no identifier starts with {name}" if star else f"{name} is not defined anywhere"
                stale.append(f"{where}: {what}")

for s in stale:
    print("check-docs: " + s)
if stale:
    print(f"check-docs: {len(stale)} stale citation(s); fix the citation, or the rule in "
          "scripts/check-docs.py if it is not one")
    sys.exit(1)
print(f"check-docs: every path and fr_/FR_ name cited in the docs and comments of "
      f"{len({f for f, _, _ in texts})} files exists")
