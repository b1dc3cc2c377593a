/* json.h: a small strict JSON parser for file headers (safetensors).
 *
 * Accepts objects, arrays, strings (all escapes, \u pairs decoded to UTF-8),
 * integers, other numbers (their value not kept), true, false and null (a
 * safetensors __metadata__ from elsewhere may hold them: the reader names
 * and ignores them); rejects integers past int64, leading zeros, control
 * characters in strings, \u0000, nesting deeper than FR_JSON_MAX_DEPTH and
 * trailing text. Internal to io/. */
#ifndef FR_JSON_H
#define FR_JSON_H

#include "../tensor/fr_base.h"

#define FR_JSON_MAX_DEPTH 32

typedef enum { FR_JSON_OBJ, FR_JSON_ARR, FR_JSON_STR, FR_JSON_INT, FR_JSON_NUM, FR_JSON_BOOL,
               FR_JSON_NULL } fr_json_kind;

typedef struct fr_json {
    fr_json_kind kind;
    size_t pos;          /* byte offset in the text, for messages */
    int64_t num;         /* FR_JSON_INT; FR_JSON_BOOL: 1 for true */
    char *str;           /* FR_JSON_STR, NUL-terminated (embedded NULs are rejected) */
    int n, cap;          /* FR_JSON_OBJ / FR_JSON_ARR: children */
    struct fr_json *kids;
    char **keys;         /* FR_JSON_OBJ only */
} fr_json;

/* Parses all of text[0, len) into *root (zeroed first). On failure returns
 * FR_ERR_FORMAT (or FR_ERR_OOM) with "<context>: malformed JSON at byte N:
 * what", and *root holds nothing to free beyond what fr_json_free releases. */
fr_status fr_json_parse(fr_json *root, const char *text, size_t len, const char *context);
/* Frees what a value owns (not the value itself). */
void fr_json_free(fr_json *v);

#endif
