/* json.c: see json.h. */
#include "json.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *s;
    size_t n, i;
    const char *context;
} j_parser;

void fr_json_free(fr_json *v) {
    if (!v)
        return;
    free(v->str);
    for (int k = 0; k < v->n; k++) {
        fr_json_free(&v->kids[k]);
        if (v->keys)
            free(v->keys[k]);
    }
    free(v->kids);
    free(v->keys);
}

static fr_status j_fail(j_parser *p, const char *what) {
    return fr_error(FR_ERR_FORMAT, "%s: malformed JSON at byte %zu: %s", p->context, p->i, what);
}

static void j_ws(j_parser *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' ||
                           p->s[p->i] == '\r'))
        p->i++;
}

static int j_hex4(j_parser *p, unsigned *out) {
    if (p->n - p->i < 4)
        return 0;
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        char c = p->s[p->i++];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return 0;
    }
    *out = v;
    return 1;
}

static size_t j_utf8(char *o, unsigned cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* At an opening quote; decodes into a new malloc'd string. */
static fr_status j_string(j_parser *p, char **out) {
    p->i++;
    /* The decoded text is never longer than the encoded text. */
    size_t start = p->i, len = 0;
    char *buf = malloc(p->n - start + 1);
    if (!buf)
        return fr_error(FR_ERR_OOM, "%s: out of memory parsing JSON", p->context);
    for (;;) {
        if (p->i >= p->n) {
            free(buf);
            return j_fail(p, "unterminated string");
        }
        unsigned char c = (unsigned char)p->s[p->i];
        if (c == '"') {
            p->i++;
            break;
        }
        if (c < 0x20) {
            free(buf);
            return j_fail(p, "control character inside a string");
        }
        if (c != '\\') {
            buf[len++] = (char)c;
            p->i++;
            continue;
        }
        p->i++;
        char e = p->i < p->n ? p->s[p->i++] : '\0';
        unsigned cp;
        switch (e) {
        case '"': buf[len++] = '"'; break;
        case '\\': buf[len++] = '\\'; break;
        case '/': buf[len++] = '/'; break;
        case 'b': buf[len++] = '\b'; break;
        case 'f': buf[len++] = '\f'; break;
        case 'n': buf[len++] = '\n'; break;
        case 'r': buf[len++] = '\r'; break;
        case 't': buf[len++] = '\t'; break;
        case 'u':
            if (!j_hex4(p, &cp)) {
                free(buf);
                return j_fail(p, "bad \\u escape");
            }
            if (cp >= 0xD800 && cp < 0xDC00) {
                unsigned lo;
                if (p->n - p->i < 2 || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u') {
                    free(buf);
                    return j_fail(p, "unpaired surrogate in \\u escape");
                }
                p->i += 2;
                if (!j_hex4(p, &lo) || lo < 0xDC00 || lo > 0xDFFF) {
                    free(buf);
                    return j_fail(p, "unpaired surrogate in \\u escape");
                }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                free(buf);
                return j_fail(p, "unpaired surrogate in \\u escape");
            }
            if (cp == 0) {
                free(buf);
                return j_fail(p, "\\u0000 is not allowed in strings");
            }
            len += j_utf8(buf + len, cp);
            break;
        default:
            free(buf);
            return j_fail(p, "unknown escape in string");
        }
    }
    buf[len] = '\0';
    *out = buf;
    return FR_OK;
}

static fr_status j_value(j_parser *p, fr_json *v, int depth);

static fr_status j_push(j_parser *p, fr_json *v, char *key) {
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 4;
        fr_json *kids = realloc(v->kids, (size_t)cap * sizeof *kids);
        if (kids)
            v->kids = kids;
        char **keys = v->kind == FR_JSON_OBJ ? realloc(v->keys, (size_t)cap * sizeof *keys) : NULL;
        if (keys)
            v->keys = keys;
        if (!kids || (v->kind == FR_JSON_OBJ && !keys)) {
            free(key);
            return fr_error(FR_ERR_OOM, "%s: out of memory parsing JSON", p->context);
        }
        v->cap = cap;
    }
    memset(&v->kids[v->n], 0, sizeof v->kids[v->n]);
    if (v->kind == FR_JSON_OBJ)
        v->keys[v->n] = key;
    v->n++;
    return FR_OK;
}

/* Objects and arrays share one loop; `close` is '}' or ']'. */
static fr_status j_container(j_parser *p, fr_json *v, int depth) {
    char close = v->kind == FR_JSON_OBJ ? '}' : ']';
    p->i++;
    j_ws(p);
    if (p->i < p->n && p->s[p->i] == close) {
        p->i++;
        return FR_OK;
    }
    for (;;) {
        char *key = NULL;
        j_ws(p);
        if (v->kind == FR_JSON_OBJ) {
            if (p->i >= p->n || p->s[p->i] != '"')
                return j_fail(p, "expected a string key");
            FR_TRY(j_string(p, &key));
            j_ws(p);
            if (p->i >= p->n || p->s[p->i] != ':') {
                free(key);
                return j_fail(p, "expected ':' after a key");
            }
            p->i++;
        }
        FR_TRY(j_push(p, v, key));
        FR_TRY(j_value(p, &v->kids[v->n - 1], depth + 1));
        j_ws(p);
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            continue;
        }
        if (p->i < p->n && p->s[p->i] == close) {
            p->i++;
            return FR_OK;
        }
        if (p->i >= p->n)
            return j_fail(p, "unexpected end of input");
        return j_fail(p, v->kind == FR_JSON_OBJ ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static size_t j_digits(j_parser *p) {
    size_t start = p->i;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9')
        p->i++;
    return p->i - start;
}

/* The rest of a number with a fraction or an exponent (RFC 8259's
 * grammar): read, its value not kept (FR_JSON_NUM: nothing frugal reads
 * is one; a metadata value that is one is named and ignored). */
static fr_status j_fraction(j_parser *p, fr_json *v) {
    if (p->s[p->i] == '.') {
        p->i++;
        if (!j_digits(p))
            return j_fail(p, "expected a digit after '.'");
    }
    if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
        p->i++;
        if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-'))
            p->i++;
        if (!j_digits(p))
            return j_fail(p, "expected a digit in the exponent");
    }
    v->kind = FR_JSON_NUM;
    return FR_OK;
}

static fr_status j_int(j_parser *p, fr_json *v) {
    bool neg = p->s[p->i] == '-';
    if (neg)
        p->i++;
    if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9')
        return j_fail(p, "expected a digit");
    if (p->s[p->i] == '0' && p->i + 1 < p->n && p->s[p->i + 1] >= '0' && p->s[p->i + 1] <= '9')
        return j_fail(p, "leading zero in a number");
    uint64_t x = 0;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        unsigned d = (unsigned)(p->s[p->i] - '0');
        if (x > ((uint64_t)INT64_MAX - d) / 10)
            return j_fail(p, "integer too large");
        x = x * 10 + d;
        p->i++;
    }
    if (p->i < p->n && (p->s[p->i] == '.' || p->s[p->i] == 'e' || p->s[p->i] == 'E'))
        return j_fraction(p, v);
    v->kind = FR_JSON_INT;
    v->num = neg ? -(int64_t)x : (int64_t)x;
    return FR_OK;
}

static fr_status j_value(j_parser *p, fr_json *v, int depth) {
    if (depth > FR_JSON_MAX_DEPTH)
        return j_fail(p, "nesting too deep");
    j_ws(p);
    if (p->i >= p->n)
        return j_fail(p, "unexpected end of input");
    v->pos = p->i;
    char c = p->s[p->i];
    if (c == '{' || c == '[') {
        v->kind = c == '{' ? FR_JSON_OBJ : FR_JSON_ARR;
        return j_container(p, v, depth);
    }
    if (c == '"') {
        v->kind = FR_JSON_STR;
        return j_string(p, &v->str);
    }
    if (c == '-' || (c >= '0' && c <= '9'))
        return j_int(p, v);
    static const char *const words[] = {"true", "false", "null"};
    for (int w = 0; w < 3; w++) {
        size_t len = strlen(words[w]);
        if (p->n - p->i >= len && !memcmp(p->s + p->i, words[w], len)) {
            p->i += len;
            v->kind = w < 2 ? FR_JSON_BOOL : FR_JSON_NULL;
            v->num = w == 0;
            return FR_OK;
        }
    }
    return j_fail(p, "expected an object, array, string, number, true, false or null");
}

fr_status fr_json_parse(fr_json *root, const char *text, size_t len, const char *context) {
    j_parser p = {text, len, 0, context};
    memset(root, 0, sizeof *root);
    FR_TRY(j_value(&p, root, 0));
    j_ws(&p);
    if (p.i != len)
        return j_fail(&p, "trailing characters after the value");
    return FR_OK;
}
