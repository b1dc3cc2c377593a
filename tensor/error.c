/* error.c: the per-thread error channel and FR_ASSERT's landing point. */
#include "fr_base.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Thread-local so the prefetch thread's errors never overwrite the trainer's. */
static _Thread_local char last_message[1024];
static _Thread_local fr_status last_code;

static const char *const status_names[] = {
    "ok", "bad argument", "shape mismatch", "unsupported dtype", "wrong device",
    "out of memory", "i/o error", "malformed file", "inplace version conflict",
    "autograd graph error", "cuda error",
};
FR_STATIC_ASSERT(sizeof status_names / sizeof *status_names == FR_ERR_COUNT,
                 "status_names must name every fr_status");

const char *fr_status_name(fr_status s) {
    return (unsigned)s < FR_ERR_COUNT ? status_names[s] : "unknown status";
}

const char *fr_last_error(void) { return last_message; }
fr_status fr_last_status(void) { return last_code; }

void fr_clear_error(void) {
    last_message[0] = '\0';
    last_code = FR_OK;
}

fr_status fr_error(fr_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_message, sizeof last_message, fmt, ap);
    va_end(ap);
    last_code = code;
    return code;
}

#define NULL_AFTER " is NULL, the result of an earlier failure: "

fr_status fr_error_null(const char *op, const char *arg) {
    if (last_code == FR_OK)
        return fr_error(FR_ERR_ARG, "%s: %s is NULL", op, arg);
    /* a chain of NULLs names the latest op and the first cause, unnested */
    const char *first = strstr(last_message, NULL_AFTER);
    char cause[sizeof last_message];
    snprintf(cause, sizeof cause, "%s", first ? first + strlen(NULL_AFTER) : last_message);
    return fr_error(last_code, "%s: %s" NULL_AFTER "%s", op, arg, cause);
}

void fr_assert_fail(const char *cond, const char *file, int line) {
    fprintf(stderr, "frugal: internal error: assertion `%s` failed at %s:%d\n",
            cond, file, line);
    abort();
}
