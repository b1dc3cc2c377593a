/* error.c: the per-thread error channel and FR_ASSERT's landing point. */
#include "fr_base.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Thread-local so the prefetch thread's errors never overwrite the trainer's. */
static _Thread_local char last_message[1024];
static _Thread_local fr_status last_code;
/* The NULL chain after the pending error (fr_error_null): how many ops met
 * its NULL, and where the message ends after the first CHAIN_HEAD of them. */
static _Thread_local int chain_len;
static _Thread_local size_t chain_head_end;

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
    chain_len = 0;
}

fr_status fr_error(fr_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_message, sizeof last_message, fmt, ap);
    va_end(ap);
    last_code = code;
    chain_len = 0;
    return code;
}

/* A NULL met while an error is pending is that error's result: the first
 * failure leads the message (the op that really failed, docs/ARCHITECTURE.md,
 * "Errors"), and each op or layer its NULL reached follows in order as its
 * own "op: arg is NULL", the first CHAIN_HEAD of them and the latest, so a
 * whole model's forward after an early failure stays one readable line:
 *   mean_dims: x must be f32, f16 or bf16, got i32; then b0.se_fc1: x is
 *   NULL; then relu: x is NULL; ...; then ... (12 more); then fc: x is NULL */
#define CHAIN_THEN "; then "
#define CHAIN_HEAD 4

fr_status fr_error_null(const char *op, const char *arg) {
    if (last_code == FR_OK)
        return fr_error(FR_ERR_ARG, "%s: %s is NULL", op, arg);
    size_t len = strlen(last_message);
    char more[48] = "";
    if (chain_len > CHAIN_HEAD) { /* the previous latest entry makes way */
        len = chain_head_end;
        snprintf(more, sizeof more, CHAIN_THEN "... (%d more)", chain_len - CHAIN_HEAD);
    }
    snprintf(last_message + len, sizeof last_message - len, "%s" CHAIN_THEN "%s: %s is NULL", more,
             op, arg);
    if (++chain_len == CHAIN_HEAD)
        chain_head_end = strlen(last_message);
    return last_code;
}

void fr_assert_fail(const char *cond, const char *file, int line) {
    fprintf(stderr, "frugal: internal error: assertion `%s` failed at %s:%d\n",
            cond, file, line);
    abort();
}
