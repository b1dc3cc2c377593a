/* fuzz_flags.c: the flag-value parsers (programs/cli.c, fr_strategy_parse in
 * nn/model.c, fr_data_spec_parse) on arbitrary text. The input is split at
 * NUL bytes into words; each word goes through every parser, and what a
 * parser accepts must be what it promises: digits only for sizes and
 * integers (no blanks, signs or wrap-around), a strategy that formats and
 * parses back to itself. Consecutive words also go through the
 * repeated-flag check. */
#include "fuzz_common.h"
#include "programs/cli_impl.h"

static bool digits_only(const char *s, bool sign) {
    if (sign && *s == '-')
        s++;
    if (!*s)
        return false;
    for (; *s; s++)
        if (*s < '0' || *s > '9')
            return false;
    return true;
}

static void one_word(const char *w) {
    size_t sz;
    if (fr_cli_size("--memory-limit", w, &sz) == FR_OK) {
        size_t n = strlen(w);
        char body[64];
        bool suffix = n && strchr("KkMmGg", w[n - 1]);
        snprintf(body, sizeof body, "%.*s", (int)(n - suffix), w);
        if (!sz || !digits_only(body, false))
            abort();
    }
    int64_t v;
    if (fr_cli_int("--batch", w, 0, INT64_MAX, &v) == FR_OK && (v < 0 || !digits_only(w, false)))
        abort();
    if (fr_cli_int("--offset", w, -1000, 1000, &v) == FR_OK && (v < -1000 || v > 1000 || !digits_only(w, true)))
        abort();
    double d;
    if (fr_cli_double("--lr", w, 0, 1e6, &d) == FR_OK && !(d >= 0 && d <= 1e6))
        abort();
    fr_strategy s, again;
    char text[128];
    if (fr_strategy_parse(w, &s) == FR_OK) {
        if (s.checkpoint < -1 || fr_strategy_parse(fr_strategy_format(s, text, sizeof text), &again) != FR_OK ||
            memcmp(&s, &again, sizeof s))
            abort();
    }
    fr_data_spec spec;
    (void)fr_data_spec_parse(w, &spec);
    fr_dtype p;
    (void)fr_cli_precision("--precision", w, &p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 4096)
        return 0;
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    fr_cli_seen seen = {.n = 0};
    for (size_t at = 0; at <= size; at += strlen(text + at) + 1) {
        const char *w = text + at;
        one_word(w);
        bool again = fr_cli_seen_get(&seen, w) != NULL;
        fr_status st = fr_cli_seen_add(&seen, w, w);
        if ((again && st == FR_OK) || (!again && st != FR_OK && seen.n < FR_CLI_MAX_FLAGS))
            abort(); /* refused exactly when given before (or when full) */
        (void)fr_cli_conflict(&seen, w, "--augment", "fuzz");
    }
    free(text);
    return 0;
}
