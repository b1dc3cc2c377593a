/* The planner bench's helpers, without PyTorch: bench/planner_join.py (its
 * table picks the right runs for each budget, its SVG has every point, and
 * malformed records are refused naming the file and line) and the heap-peak
 * shim bench/peak_alloc.c (compiled here with the flags `make bench` uses,
 * preloaded into a python3 that allocates through ctypes: each entry point
 * moves the count by what it allocated). Both need python3 (not torch) and
 * run from the repository root, as `make test` runs them; they skip without
 * python3 or a C compiler. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testlib.h"

static const char *python(void) {
    return access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : NULL;
}

static bool make_dir(char *tmpl) { return mkdtemp(tmpl) != NULL; }

static void remove_dir(const char *dir) {
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "    could not remove %s\n", dir);
}

static bool write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f)
        return false;
    bool ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok;
}

/* Runs the joiner on dir/rec.tsv (and --svg dir/plot.svg); its exit status. */
static int join(const char *dir, bool with_svg) {
    char cmd[4 * PATH_MAX];
    snprintf(cmd, sizeof cmd,
             "%s bench/planner_join.py %s%s%s --date 'test date' '%s/rec.tsv' > '%s/out.md' "
             "2> '%s/err.txt'",
             python(), with_svg ? "--svg '" : "", with_svg ? dir : "", with_svg ? "/plot.svg'" : "",
             dir, dir, dir);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* The table row whose first cell is `first`, with its spaces removed. */
static bool row(const char *text, const char *first, char *out, size_t cap) {
    char want[64];
    snprintf(want, sizeof want, "\n| %s ", first);
    const char *p = strstr(text, want);
    if (!p)
        return false;
    p++;
    size_t n = 0;
    for (; *p && *p != '\n' && n + 1 < cap; p++)
        if (*p != ' ')
            out[n++] = *p;
    out[n] = 0;
    return true;
}

static int count(const char *text, const char *needle) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)); p++)
        n++;
    return n;
}

#define MIB_ "1048576"

/* Plain 100 ms; the planner at budgets 5, 7 and 12 MiB (the first over its
 * budget); PyTorch plain 10 MiB 100 ms and three checkpoint_sequential runs. */
static const char records[] =
    "# a note\n"
    "P\tmodel\tresnet8\t4\t5\t3\t2\n"
    "P\tload\tbefore\t0.10\t0.20\t0.30\n"
    "P\tfixed\tplain\t12582912\t100.0\n"
    "P\tfixed\tcheckpoint\t7340032\t130.0\n"
    "P\tfixed\tcheckpoint:2\t8388608\t125.0\n"
    "P\tplan\t5242880\t5000000\t5452595\t150.0\t2\t-\n"
    "P\tplan\t7340032\t7000000\t7000000\t120.0\t1\tcheckpoint\n"
    "P\tplan\t12582912\t12000000\t12000000\t101.0\t1\t-\n"
    "P\tload\tafter\t0.40\t0.50\t0.60\n"
    "T\tmodel\tresnet8\t4\t5\t3\t2\n"
    "T\tplain\t10485760\t100.0\n"
    "T\tckpt\t2\t8388608\t130.0\n"
    "T\tckpt\t3\t6291456\t120.0\n"
    "T\tckpt\t4\t5242880\t140.0\n";

static void test_join_table_and_svg(void) {
    if (!python())
        SKIP("no /usr/bin/python3");
    char dir[] = "/tmp/frugal_planner_join_XXXXXX", path[PATH_MAX];
    if (!make_dir(dir)) {
        CHECK(!"mkdtemp");
        return;
    }
    snprintf(path, sizeof path, "%s/rec.tsv", dir);
    CHECK(write_file(path, records));
    CHECK(join(dir, true) == 0);
    snprintf(path, sizeof path, "%s/out.md", dir);
    char *out = fr_t_read_file(path, NULL), line[512];
    CHECK_NOTNULL(out);
    if (out) {
        /* 5 MiB: the planner over its budget, no fixed schedule fits, PyTorch's K=4 */
        CHECK(row(out, "5.00", line, sizeof line));
        CHECK(strstr(line, "|5.20OVER|150.0|+50.0%|2|doesnotfit|doesnotfit|4|5.00|140.0|+40.0%|"));
        /* 7 MiB = checkpoint's peak: Chen fits, sqrt(N) does not; PyTorch's fastest fitting is K=3 */
        CHECK(row(out, "7.00", line, sizeof line));
        CHECK(strstr(line, "|checkpoint|6.68|6.68|120.0|+20.0%|1|doesnotfit|+30.0%|3|6.00|120.0|+20.0%|"));
        /* 12 MiB: everything fits; PyTorch's plain is the fastest */
        CHECK(row(out, "12.00", line, sizeof line));
        CHECK(strstr(line, "|+1.0%|1|+25.0%|+30.0%|plain|10.00|100.0|+0.0%|"));
        CHECK(strstr(out, "OVER on 1 budget(s)"));
        CHECK(strstr(out, "# a note"));
        CHECK(strstr(out, "frugal 0.10-0.40"));
        CHECK(row(out, "torch checkpoint_sequential K=4", line, sizeof line));
        CHECK(strstr(line, "|5.00|140.0|+40.0%|"));
    }
    free(out);
    snprintf(path, sizeof path, "%s/plot.svg", dir);
    char *svg = fr_t_read_file(path, NULL);
    CHECK_NOTNULL(svg);
    if (svg) {
        CHECK(!strncmp(svg, "<svg ", 5) && strstr(svg, "</svg>\n"));
        CHECK(strstr(svg, "resnet8 batch 4") && strstr(svg, "test date"));
        CHECK(count(svg, "<circle") == 3 + 1);  /* plans + legend */
        CHECK(count(svg, "<rect x=") == 3 + 1 + 1); /* fixed schedules, legend, plot frame */
        CHECK(count(svg, "<polygon") == 4 + 1); /* PyTorch plain, 3 K + legend */
        CHECK(strstr(svg, ">checkpoint:2</text>"));
    }
    free(svg);
    remove_dir(dir);
}

static void test_join_rejects_malformed(void) {
    if (!python())
        SKIP("no /usr/bin/python3");
    static const struct {
        const char *text, *needle;
    } bad[] = {
        {"P\tmodel\tr\t4\t5\t3\t2\nP\tplan\t1\t2\t3\t4.0\t1\n", "rec.tsv:2: P plan takes 6 fields, got 5"},
        {"P\tmodel\tr\t4\t5\t3\t2\nP\tfixed\tplain\tabc\t1.0\n", "rec.tsv:2: field peak"},
        {"P\tmodel\tr\t4\t5\t3\t2\nhello\n", "rec.tsv:2: not a planner record"},
        {"P\tmodel\tr\t4\t5\t3\t2\nT\tckpt\t2\t-5\t1.0\n", "rec.tsv:2: field peak: '-5' out of range"},
        {"T\tplain\t10\t1.0\n", "no bench_planner records"},
        {"P\tmodel\tr\t4\t5\t3\t2\nP\tfixed\tcheckpoint\t10\t1.0\n", "no frugal plain step"},
    };
    char dir[] = "/tmp/frugal_planner_join_XXXXXX", path[PATH_MAX];
    if (!make_dir(dir)) {
        CHECK(!"mkdtemp");
        return;
    }
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(path, sizeof path, "%s/rec.tsv", dir);
        CHECK(write_file(path, bad[i].text));
        CHECK(join(dir, false) == 2);
        snprintf(path, sizeof path, "%s/err.txt", dir);
        char *err = fr_t_read_file(path, NULL);
        CHECK(err && strstr(err, bad[i].needle));
        if (err && !strstr(err, bad[i].needle))
            fprintf(stderr, "    case %zu: %s", i, err);
        free(err);
    }
    remove_dir(dir);
}

/* Every entry point's effect on the count, from ctypes, in MiB. */
static const char shim_check[] =
    "import ctypes, sys\n"
    "lib = ctypes.CDLL(None)\n"
    "cur, peak = lib.peak_alloc_current, lib.peak_alloc_peak\n"
    "cur.restype = peak.restype = ctypes.c_int64\n"
    "for f in (lib.malloc, lib.calloc, lib.realloc, lib.memalign, lib.aligned_alloc, lib.valloc):\n"
    "    f.restype = ctypes.c_void_p\n"
    "lib.free.argtypes = [ctypes.c_void_p]\n"
    "lib.realloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]\n"
    "M = 1 << 20\n"
    "def moved(fn):\n"
    "    c0 = cur(); r = fn(); return (cur() - c0) / M, r\n"
    "def near(v, want, what):\n"
    "    if abs(v - want) > 0.5: sys.exit(f'{what}: moved {v:.3f} MiB, not {want}')\n"
    "d, p = moved(lambda: lib.malloc(ctypes.c_size_t(100 * M))); near(d, 100, 'malloc')\n"
    "lib.peak_alloc_reset(); p0 = peak()\n"
    "d, p = moved(lambda: lib.realloc(p, 150 * M)); near(d, 50, 'realloc')\n"
    "near((peak() - p0) / M, 50, 'peak after realloc')\n"
    "d, _ = moved(lambda: lib.free(ctypes.c_void_p(p))); near(d, -150, 'free')\n"
    "d, p = moved(lambda: lib.calloc(ctypes.c_size_t(10), ctypes.c_size_t(3 * M))); near(d, 30, 'calloc')\n"
    "lib.free(ctypes.c_void_p(p))\n"
    "box = ctypes.c_void_p()\n"
    "d, rc = moved(lambda: lib.posix_memalign(ctypes.byref(box), ctypes.c_size_t(64),\n"
    "                                         ctypes.c_size_t(20 * M)))\n"
    "near(d, 20, 'posix_memalign')\n"
    "if rc != 0 or box.value % 64: sys.exit('posix_memalign: bad result')\n"
    "lib.free(box)\n"
    "if lib.posix_memalign(ctypes.byref(box), ctypes.c_size_t(3), ctypes.c_size_t(8)) == 0:\n"
    "    sys.exit('posix_memalign accepted alignment 3')\n"
    "for f in (lambda: lib.memalign(ctypes.c_size_t(4096), ctypes.c_size_t(5 * M)),\n"
    "          lambda: lib.aligned_alloc(ctypes.c_size_t(256), ctypes.c_size_t(5 * M)),\n"
    "          lambda: lib.valloc(ctypes.c_size_t(5 * M))):\n"
    "    d, p = moved(f); near(d, 5, 'memalign/aligned_alloc/valloc'); lib.free(ctypes.c_void_p(p))\n"
    "d, big = moved(lambda: bytearray(64 * M)); near(d, 64, 'a bytearray (through the allocator of Python)')\n"
    "print('shim ok')\n";

static void test_peak_alloc_shim(void) {
    if (!python())
        SKIP("no /usr/bin/python3");
    if (system("command -v cc > /dev/null 2>&1") != 0)
        SKIP("no C compiler (cc) to build the shim");
    char dir[] = "/tmp/frugal_peak_alloc_XXXXXX", path[PATH_MAX], cmd[4 * PATH_MAX];
    if (!make_dir(dir)) {
        CHECK(!"mkdtemp");
        return;
    }
    snprintf(cmd, sizeof cmd,
             "cc -std=c11 -O2 -fPIC -shared -Wall -Wextra -Werror bench/peak_alloc.c -o '%s/p.so'", dir);
    CHECK(system(cmd) == 0);
    snprintf(path, sizeof path, "%s/check.py", dir);
    CHECK(write_file(path, shim_check));
    snprintf(cmd, sizeof cmd, "LD_PRELOAD='%s/p.so' %s '%s/check.py' > '%s/out.txt' 2>&1", dir,
             python(), dir, dir);
    int rc = system(cmd);
    snprintf(path, sizeof path, "%s/out.txt", dir);
    char *out = fr_t_read_file(path, NULL);
    CHECK(rc == 0 && out && strstr(out, "shim ok"));
    if (rc != 0 && out)
        fprintf(stderr, "    %s", out);
    free(out);
    remove_dir(dir);
}

int main(void) {
    RUN(test_join_table_and_svg);
    RUN(test_join_rejects_malformed);
    RUN(test_peak_alloc_shim);
    return TEST_SUMMARY();
}
