/* model.c: strategy and precision names; see model.h. The model's life
 * (fr_model_new, fr_model_free) and its forward are in nn/build.c, which
 * owns the module tree they run. */
#include "model.h"
#include "../cpu/conv.h"
#include "../tensor/ops.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* K of "checkpoint:K": digits only, 1 to 2^31 - 1 (strtol skips blanks,
 * takes signs, and its long does not fit an int: "4294967297" was 1). */
static bool checkpoint_k(const char *text, int *out) {
    if (!*text || strspn(text, "0123456789") != strlen(text))
        return false;
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || v < 1 || v > INT32_MAX)
        return false;
    *out = (int)v;
    return true;
}

fr_status fr_strategy_parse(const char *text, fr_strategy *out) {
    static const char *const choices =
        "plain, or a '+'-joined set of recompute, abn, checkpoint[:K], compress[:8|4|2]";
    if (!text || !*text)
        return fr_error(FR_ERR_ARG, "empty memory strategy (choose %s)", choices);
    fr_strategy s = FR_STRATEGY_PLAIN;
    if (strcmp(text, "plain") != 0) {
        const char *p = text;
        while (*p) {
            size_t len = strcspn(p, "+");
            char word[32];
            if (len == 0 || len >= sizeof word)
                return fr_error(FR_ERR_ARG, "unknown memory strategy \"%s\" (choose %s)", text, choices);
            memcpy(word, p, len);
            word[len] = '\0';
            /* each switch once: "abn+abn" or a trailing '+' is a typo, not a strategy */
            const char *rest = p + len;
            size_t wlen = strcspn(word, ":");
            for (const char *q = text; q < p; q += strcspn(q, "+") + 1)
                if (!strncmp(q, word, wlen) && (q[wlen] == '+' || q[wlen] == ':'))
                    return fr_error(FR_ERR_ARG, "memory strategy \"%s\": \"%.*s\" is given twice", text,
                                    (int)wlen, word);
            if (*rest == '+' && !rest[1])
                return fr_error(FR_ERR_ARG, "memory strategy \"%s\" ends with '+'", text);
            if (!strcmp(word, "inplace"))
                /* it saved 0 bytes on every built-in model (the fused BN+ReLU
                 * keeps what its chain kept); its in-place writes live on
                 * inside recompute, docs/MODELS.md */
                return fr_error(FR_ERR_ARG, "memory strategy \"%s\": \"inplace\" was folded into "
                                "recompute (alone it saved 0 bytes on every built-in model); use "
                                "recompute, or plain for the same memory as inplace", text);
            else if (!strcmp(word, "recompute") || !strcmp(word, "efficient"))
                s.recompute = true;
            else if (!strcmp(word, "abn"))
                s.abn = true;
            else if (!strcmp(word, "abn_reference"))
                s.abn_reference = true;
            else if (!strcmp(word, "checkpoint"))
                s.checkpoint = -1;
            else if (!strncmp(word, "checkpoint:", 11) && checkpoint_k(word + 11, &s.checkpoint))
                ;
            else if (!strcmp(word, "compress") || !strcmp(word, "compress:8"))
                s.compress = 8;
            else if (!strcmp(word, "compress:4"))
                s.compress = 4;
            else if (!strcmp(word, "compress:2"))
                s.compress = 2;
            else
                return fr_error(FR_ERR_ARG, "unknown memory strategy \"%s\" in \"%s\" (choose %s)",
                                word, text, choices);
            p += len;
            if (*p == '+')
                p++;
        }
    }
    if (s.abn && s.abn_reference)
        return fr_error(FR_ERR_ARG, "memory strategy \"%s\": abn and abn_reference exclude each other",
                        text);
    *out = s;
    return FR_OK;
}

const char *fr_strategy_format(fr_strategy s, char *buf, size_t len) {
    size_t used = 0;
    buf[0] = '\0';
#define FR_APPEND(...) used += (size_t)snprintf(buf + used, used < len ? len - used : 0, __VA_ARGS__)
    if (s.recompute)
        FR_APPEND("%srecompute", used ? "+" : "");
    if (s.abn)
        FR_APPEND("%sabn", used ? "+" : "");
    if (s.abn_reference)
        FR_APPEND("%sabn_reference", used ? "+" : "");
    if (s.checkpoint < 0)
        FR_APPEND("%scheckpoint", used ? "+" : "");
    else if (s.checkpoint > 0)
        FR_APPEND("%scheckpoint:%d", used ? "+" : "", s.checkpoint);
    if (s.compress)
        FR_APPEND("%scompress:%d", used ? "+" : "", s.compress);
    if (!used)
        FR_APPEND("plain");
#undef FR_APPEND
    return buf;
}

bool fr_strategy_equal(fr_strategy a, fr_strategy b) {
    return a.recompute == b.recompute && a.abn == b.abn &&
           a.abn_reference == b.abn_reference && a.checkpoint == b.checkpoint &&
           a.compress == b.compress;
}

fr_status fr_precision_parse(const char *text, fr_dtype *out) {
    static const struct {
        const char *name;
        fr_dtype dtype;
    } names[] = {{"f32", FR_F32},  {"fp32", FR_F32},    {"float32", FR_F32},   {"f16", FR_F16},
                 {"fp16", FR_F16}, {"float16", FR_F16}, {"bf16", FR_BF16}, {"bfloat16", FR_BF16}};
    for (size_t i = 0; text && i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(text, names[i].name)) {
            *out = names[i].dtype;
            return FR_OK;
        }
    return fr_error(FR_ERR_ARG, "unknown precision \"%s\" (choose f32, f16 or bf16)", text ? text : "");
}

bool fr_model_channels_last(const fr_model *m, fr_device dev, const char **why) {
    const char *unused;
    why = why ? why : &unused;
    /* what the mode covers (model.h); the rest runs NCHW, never an error */
    if (m->cfg.layout == FR_LAYOUT_NCHW)
        *why = "NCHW (asked)";
    else if (!m->channels_last_capable)
        *why = "NCHW (model)";
    else if (m->cfg.precision != FR_F32)
        *why = "NCHW (precision)";
    else if (dev != FR_CPU)
        *why = "NCHW (device)";
    else if (fr_batch_norm_synced())
        *why = "NCHW (synchronised batch norm)";
    else if (m->cfg.layout == FR_LAYOUT_AUTO && !fr_cpu_channels_last_default())
        *why = "NCHW (not measured faster on this CPU)";
    else {
        *why = "channels last";
        return true;
    }
    return false;
}
