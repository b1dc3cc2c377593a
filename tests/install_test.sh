#!/usr/bin/env bash
# The installed library as a user meets it: `make install PREFIX=$tmp`, then
# an out-of-tree program (tests/install/small_cnn.c) built with nothing but
# `pkg-config --cflags --libs frugal` that trains a few steps and validates;
# then the installed frugal-train / frugal-validate on a tiny run, ldd of the
# installed programs and libraries (no CUDA library may appear), that
# <frugal/frugal.h> compiles alone, in C and in C++, <frugal/ext.h> in C, and that
# examples/custom_model.c and the README's C snippets build out of tree the
# same way. `make uninstall` must leave the prefix empty.
#   tests/install_test.sh [BUILD [MAKE_ARGS...]]   (make check-install)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
data=${FR_TEST_DATA:-/usr/share/datasets/fashion-mnist}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix="$tmp/prefix"
fail() { echo "install_test: FAILED: $*"; exit 1; }

echo "== make install PREFIX=$prefix"
make --no-print-directory -j2 BUILD="$build" PREFIX="$prefix" "$@" install >"$tmp/install.log" 2>&1 ||
    { tail -20 "$tmp/install.log"; fail "make install"; }
for f in lib/libfrugal.a lib/libfrugal_programs.a lib/libfrugal.so lib/pkgconfig/frugal.pc include/frugal/frugal.h \
    include/frugal/config.h bin/frugal-train bin/frugal-validate bin/frugal-memreport; do
    [ -e "$prefix/$f" ] || fail "$f was not installed"
done
soname=$(readelf -d "$prefix/lib/libfrugal.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[[ "$soname" == libfrugal.so.[0-9]* ]] || fail "libfrugal.so has soname '$soname'"
echo "soname $soname"
for h in tensor/kernels.h tensor/kernels.def tensor/staging.h cuda/fr_cuda.h io/json.h nn/layers.h \
    nn/seg_split.h nn/module_impl.h programs/cli_impl.h; do
    [ ! -e "$prefix/include/frugal/$h" ] || fail "internal header $h was installed"
done

echo "== ldd: no CUDA library in the installed programs and libfrugal.so"
for f in "$prefix"/bin/frugal-* "$prefix/lib/libfrugal.so"; do
    libs=$(ldd "$f")
    if grep -E 'libcud|libcublas|libcudnn' <<<"$libs"; then fail "$f links a CUDA library"; fi
    grep 'not found' <<<"$libs" && fail "$f has a missing library"
done
echo "none"

export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
flags=$(pkg-config --cflags --libs frugal)
echo "pkg-config --cflags --libs frugal: $flags"

echo "== <frugal/frugal.h> alone, C11 and C++17"
printf '#include <frugal/frugal.h>\nint main(void) { return fr_dtype_size(FR_F32) == 4 ? 0 : 1; }\n' >"$tmp/only.c"
cc -std=c11 -Wall -Wextra -Werror "$tmp/only.c" $flags -o "$tmp/only_c" || fail "C program"
"$tmp/only_c" || fail "C program did not run"
cp "$tmp/only.c" "$tmp/only.cpp"
c++ -std=c++17 -Wall -Wextra -Werror "$tmp/only.cpp" $flags -o "$tmp/only_cpp" || fail "C++ program"
"$tmp/only_cpp" || fail "C++ program did not run"
echo "ok"

echo "== <frugal/ext.h> alone (the op authors' tier)"
printf '#include <frugal/ext.h>\nint main(void) { return fr_should_record(0, NULL) ? 1 : 0; }\n' >"$tmp/ext.c"
cc -std=c11 -Wall -Wextra -Werror "$tmp/ext.c" $flags -o "$tmp/ext_c" || fail "C program with ext.h"
"$tmp/ext_c" || fail "C program with ext.h did not run"
echo "ok"

# What a user copies: examples/custom_model.c and the README's C snippets,
# compiled outside the tree with nothing but pkg-config (no -I into the repo).
echo "== examples/custom_model.c out of tree"
mkdir "$tmp/copy" && cp examples/custom_model.c "$tmp/copy/"
(cd "$tmp/copy" && cc -std=c11 -O2 -Wall -Wextra -Werror custom_model.c $flags -o custom_model) ||
    fail "examples/custom_model.c did not build against the install"
echo "ok"
echo "== the README's C snippets out of tree"
# Each ```c block of README.md becomes a file: its #include lines and its
# typedefs and static functions at file scope, its statements in the body of
# a function that takes the images and labels the snippets use.
awk -v dir="$tmp/copy" '
    /^```c$/ { n++; inblk = 1; top = dir "/readme" n ".top"; body = dir "/readme" n ".body";
               printf "" >top; printf "" >body; next }
    inblk && /^```$/ { inblk = 0; next }
    !inblk { next }
    filescope { print >top; if ($0 ~ /^}/ || ($0 ~ /;$/ && $0 !~ /^[ \t]/ && depth == 0)) filescope = 0;
                depth += gsub(/{/, "{") - gsub(/}/, "}"); next }
    /^#include/ { print >top; next }
    /^(typedef|static) / { depth = gsub(/{/, "{") - gsub(/}/, "}"); print >top;
                           if (depth > 0 || $0 !~ /;$/) filescope = 1; next }
    { print >body }
    END { print n >(dir "/readme.count") }' README.md
nsnip=$(cat "$tmp/copy/readme.count")
[ "${nsnip:-0}" -ge 2 ] || fail "README.md has ${nsnip:-no} C snippets (the model snippets are expected)"
for i in $(seq 1 "$nsnip"); do
    {
        # a snippet that continues an earlier one has no include of its own
        grep -q '^#include <frugal/frugal.h>' "$tmp/copy/readme$i.top" || echo '#include <frugal/frugal.h>'
        echo "#include <stdio.h>"
        cat "$tmp/copy/readme$i.top"
        echo "int readme_snippet(fr_tensor *images, fr_tensor *labels);"
        echo "int readme_snippet(fr_tensor *images, fr_tensor *labels) {"
        echo "    (void)images; (void)labels;"
        cat "$tmp/copy/readme$i.body"
        echo "    return 0;"
        echo "}"
        echo "int main(void) { return 0; }"
    } >"$tmp/copy/readme$i.c"
    (cd "$tmp/copy" && cc -std=c11 -Wall -Wextra -Werror "readme$i.c" $flags -o "readme$i") ||
        { cat -n "$tmp/copy/readme$i.c"; fail "README.md's C snippet $i did not build against the install"; }
done
echo "ok: $nsnip snippets"

if [ ! -e "$data/t10k-images-idx3-ubyte.gz" ] && [ ! -e "$data/t10k-images-idx3-ubyte" ]; then
    echo "install_test: skipped the training runs: no Fashion-MNIST at $data"
else
    echo "== an out-of-tree program: cc tests/install/small_cnn.c \$(pkg-config --cflags --libs frugal)"
    mkdir "$tmp/user" && cp tests/install/small_cnn.c "$tmp/user/"
    (cd "$tmp/user" && cc -std=c11 -O2 -Wall -Wextra -Werror small_cnn.c $flags -o small_cnn) ||
        fail "small_cnn did not build"
    (cd "$tmp/user" && ./small_cnn "$data" weights.safetensors) || fail "small_cnn"

    echo "== the same program linked statically (pkg-config --static, libfrugal.a)"
    static=$(pkg-config --cflags --libs --static frugal | sed 's/-lfrugal /-l:libfrugal.a /')
    (cd "$tmp/user" && cc -std=c11 -O2 small_cnn.c $static -o small_cnn_static && ./small_cnn_static "$data" w2.safetensors) ||
        fail "small_cnn linked statically"

    echo "== frugal-train and frugal-validate"
    "$prefix/bin/frugal-train" --model resnet8 --epochs 1 --batch 32 --limit-train 128 --limit-test 64 \
        --threads 2 --save "$tmp/r8.safetensors" --data "fashion-mnist:$data" || fail "frugal-train"
    "$prefix/bin/frugal-validate" --checkpoint "$tmp/r8.safetensors" --limit-test 64 --batch 32 \
        --data "fashion-mnist:$data" | tee "$tmp/validate.txt" || fail "frugal-validate"
    grep -q '^accuracy ' "$tmp/validate.txt" || fail "frugal-validate printed no accuracy"
fi

echo "== the CUDA loader, from the installed library"
printf '%s\n' '#include <frugal/frugal.h>' '#include <stdio.h>' \
    'int main(void) { int n = fr_cuda_device_count(); printf("%d GPU(s) %s\n", n, fr_cuda_unavailable_reason()); return n > 0 || fr_cuda_unavailable_reason()[0] ? 0 : 1; }' >"$tmp/why.c"
cc "$tmp/why.c" $flags -o "$tmp/why" && "$tmp/why" || fail "fr_cuda_unavailable_reason"

echo "== make uninstall"
make --no-print-directory BUILD="$build" PREFIX="$prefix" "$@" uninstall >/dev/null
left=$(find "$prefix" -type f -o -type l)
[ -z "$left" ] || fail "uninstall left: $left"
echo "install_test: ok"
