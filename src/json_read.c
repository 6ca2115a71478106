/* json_read.c - the strict JSON reader behind json_read.h.
 *
 * One recursive-descent pass over the input. Every node of the tree is
 * built on a stack of values (and one of object members) and copied once,
 * when its array or object closes, into an arena that the document owns, so
 * an array's elements and an object's members lie contiguous and the whole
 * tree is freed at once. Strings are decoded through a scratch buffer and
 * copied into the arena. Each byte of input is looked at a bounded number of
 * times; the only step above linear is sorting the keys of objects with many
 * members (for lookup and the duplicate check).
 */
#include "json_read.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- arena ---------------------------------------------------------------- */

#define ARENA_CHUNK ((size_t)1 << 20)

typedef struct chunk_s {
    struct chunk_s *next;
    size_t used, cap;
    max_align_t data[];
} chunk_t;

struct cuh_json_doc_s {
    chunk_t *chunks;
    cuh_json_t root;
};

static void *arena_alloc(cuh_json_doc_t *doc, size_t size)
{
    const size_t align = sizeof(max_align_t);
    if (size > SIZE_MAX - align)
        return NULL;
    size = (size + align - 1) & ~(align - 1);
    if (size == 0)
        size = align;
    chunk_t *c = doc->chunks;
    if (!c || c->cap - c->used < size) {
        size_t cap = size > ARENA_CHUNK / 4 ? size : ARENA_CHUNK;
        chunk_t *n = malloc(sizeof *n + cap);
        if (!n)
            return NULL;
        n->used = 0;
        n->cap = cap;
        if (c && cap != ARENA_CHUNK) {
            /* A large piece of its own: keep filling the current chunk. */
            n->next = c->next;
            c->next = n;
            n->used = size;
            return n->data;
        }
        n->next = c;
        doc->chunks = c = n;
    }
    void *p = (char *)c->data + c->used;
    c->used += size;
    return p;
}

void cuh_json_free(cuh_json_doc_t *doc)
{
    if (!doc)
        return;
    for (chunk_t *c = doc->chunks, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    free(doc);
}

/* ---- parser --------------------------------------------------------------- */

typedef struct parser_s {
    const unsigned char *start, *p, *end;
    uint32_t line;
    const unsigned char *line_start;
    unsigned depth, max_depth;
    cuh_json_doc_t *doc;
    cuh_json_t *vals;                 /* elements of the open arrays */
    size_t num_vals, cap_vals;
    cuh_json_member_t *mems;          /* members of the open objects */
    size_t num_mems, cap_mems;
    char *scratch;                    /* the string being decoded */
    size_t cap_scratch;
    cuh_json_error_t *err;
    int failed;
} parser_t;

/* Line and column of `at`, counted from the start (only on the error path). */
static void position_of(const parser_t *ps, const unsigned char *at, uint32_t *line, uint32_t *column)
{
    uint32_t l = 1;
    const unsigned char *ls = ps->start;
    for (const unsigned char *q = ps->start; q < at; q++)
        if (*q == '\n') {
            l++;
            ls = q + 1;
        }
    *line = l;
    *column = (uint32_t)(at - ls) + 1;
}

__attribute__((format(printf, 3, 4)))
static void fail(parser_t *ps, const unsigned char *at, const char *fmt, ...)
{
    if (ps->failed)
        return;
    ps->failed = 1;
    if (!ps->err)
        return;
    position_of(ps, at, &ps->err->line, &ps->err->column);
    ps->err->offset = (size_t)(at - ps->start);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ps->err->message, sizeof ps->err->message, fmt, ap);
    va_end(ap);
}

static void fail_memory(parser_t *ps)
{
    fail(ps, ps->p, "out of memory");
}

/* What is at `at`, for "found ...": "end of input", "'x'", "byte 0xC3". */
static const char *found(const parser_t *ps, const unsigned char *at, char *buf, size_t len)
{
    if (at >= ps->end)
        snprintf(buf, len, "the end of the input");
    else if (*at == '\'')
        snprintf(buf, len, "\"'\"");
    else if (*at > 0x20 && *at < 0x7f)
        snprintf(buf, len, "'%c'", *at);
    else if (*at == '\n')
        snprintf(buf, len, "a line break");
    else
        snprintf(buf, len, "byte 0x%02X", *at);
    return buf;
}

static void skip_ws(parser_t *ps)
{
    const unsigned char *p = ps->p, *end = ps->end;
    while (p < end) {
        if (*p == ' ' || *p == '\t' || *p == '\r') {
            p++;
        } else if (*p == '\n') {
            p++;
            ps->line++;
            ps->line_start = p;
        } else {
            break;
        }
    }
    ps->p = p;
}

static int push_value(parser_t *ps, const cuh_json_t *v)
{
    if (ps->num_vals == ps->cap_vals) {
        size_t cap = ps->cap_vals ? 2 * ps->cap_vals : 64;
        cuh_json_t *n = realloc(ps->vals, cap * sizeof *n);
        if (!n) {
            fail_memory(ps);
            return -1;
        }
        ps->vals = n;
        ps->cap_vals = cap;
    }
    ps->vals[ps->num_vals++] = *v;
    return 0;
}

static cuh_json_member_t *push_member(parser_t *ps)
{
    if (ps->num_mems == ps->cap_mems) {
        size_t cap = ps->cap_mems ? 2 * ps->cap_mems : 64;
        cuh_json_member_t *n = realloc(ps->mems, cap * sizeof *n);
        if (!n) {
            fail_memory(ps);
            return NULL;
        }
        ps->mems = n;
        ps->cap_mems = cap;
    }
    return &ps->mems[ps->num_mems++];
}

static int scratch_reserve(parser_t *ps, size_t need)
{
    if (need <= ps->cap_scratch)
        return 0;
    size_t cap = ps->cap_scratch ? ps->cap_scratch : 256;
    while (cap < need)
        cap *= 2;
    char *n = realloc(ps->scratch, cap);
    if (!n) {
        fail_memory(ps);
        return -1;
    }
    ps->scratch = n;
    ps->cap_scratch = cap;
    return 0;
}

static int hex4(const unsigned char *p, const unsigned char *end, unsigned *out)
{
    unsigned v = 0;
    if (end - p < 4)
        return -1;
    for (int i = 0; i < 4; i++) {
        unsigned c = p[i], d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else
            return -1;
        v = v * 16 + d;
    }
    *out = v;
    return 0;
}

/* Length of the valid UTF-8 sequence at p (its first byte >= 0x80), or 0. */
static size_t utf8_sequence(const unsigned char *p, const unsigned char *end)
{
    unsigned c = p[0];
    size_t n;
    unsigned lo = 0x80, hi = 0xBF;   /* range of the second byte */
    if (c >= 0xC2 && c <= 0xDF)
        n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0)
            lo = 0xA0;               /* no overlong forms */
        else if (c == 0xED)
            hi = 0x9F;               /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;               /* nothing above U+10FFFF */
    } else
        return 0;
    if ((size_t)(end - p) < n || p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xBF)
            return 0;
    return n;
}

static size_t utf8_encode(unsigned cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* The string at ps->p (on its '"'), decoded into the arena. */
static int parse_string(parser_t *ps, const char **out, size_t *out_len)
{
    const unsigned char *open = ps->p, *p = ps->p + 1, *end = ps->end;
    size_t n = 0;
    char fb[32];
    for (;;) {
        /* Room for the longest piece one step adds (4 bytes) and a NUL. */
        if (scratch_reserve(ps, n + 8) != 0)
            return -1;
        if (p >= end) {
            uint32_t l, c;
            position_of(ps, open, &l, &c);
            fail(ps, p, "unterminated string (it begins at line %u, column %u)", (unsigned)l, (unsigned)c);
            return -1;
        }
        unsigned ch = *p;
        if (ch == '"') {
            p++;
            break;
        }
        if (ch < 0x20) {
            fail(ps, p, "control character 0x%02X in a string (write it as an escape, \\u%04X)", ch, ch);
            return -1;
        }
        if (ch >= 0x80) {
            size_t len = utf8_sequence(p, end);
            if (!len) {
                fail(ps, p, "invalid UTF-8 in a string (byte 0x%02X)", ch);
                return -1;
            }
            memcpy(ps->scratch + n, p, len);
            n += len;
            p += len;
            continue;
        }
        if (ch != '\\') {
            /* A run of plain bytes at once. */
            const unsigned char *q = p;
            while (q < end && *q != '"' && *q != '\\' && *q >= 0x20 && *q < 0x80)
                q++;
            size_t len = (size_t)(q - p);
            if (scratch_reserve(ps, n + len + 8) != 0)
                return -1;
            memcpy(ps->scratch + n, p, len);
            n += len;
            p = q;
            continue;
        }
        const unsigned char *esc = p;
        p++;
        if (p >= end) {
            fail(ps, p, "unterminated string: an escape at the end of the input");
            return -1;
        }
        switch (*p) {
        case '"': ps->scratch[n++] = '"'; p++; break;
        case '\\': ps->scratch[n++] = '\\'; p++; break;
        case '/': ps->scratch[n++] = '/'; p++; break;
        case 'b': ps->scratch[n++] = '\b'; p++; break;
        case 'f': ps->scratch[n++] = '\f'; p++; break;
        case 'n': ps->scratch[n++] = '\n'; p++; break;
        case 'r': ps->scratch[n++] = '\r'; p++; break;
        case 't': ps->scratch[n++] = '\t'; p++; break;
        case 'u': {
            unsigned cp;
            if (hex4(p + 1, end, &cp) != 0) {
                fail(ps, esc, "expected four hexadecimal digits after \\u");
                return -1;
            }
            p += 5;
            if (cp >= 0xDC00 && cp <= 0xDFFF) {
                fail(ps, esc, "lone low surrogate \\u%04X (it must follow a high surrogate \\uD800-\\uDBFF)", cp);
                return -1;
            }
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                unsigned lo;
                if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || hex4(p + 2, end, &lo) != 0 || lo < 0xDC00 ||
                    lo > 0xDFFF) {
                    fail(ps, esc, "lone high surrogate \\u%04X (expected a low surrogate \\uDC00-\\uDFFF after it)", cp);
                    return -1;
                }
                p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            n += utf8_encode(cp, ps->scratch + n);
            break;
        }
        default:
            if (*p > 0x20 && *p < 0x7f)
                fail(ps, esc, "invalid escape '\\%c' in a string (expected one of \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)", *p);
            else
                fail(ps, esc, "invalid escape in a string: expected one of \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX after '\\', found %s",
                     found(ps, p, fb, sizeof fb));
            return -1;
        }
    }
    ps->p = p;
    char *s = arena_alloc(ps->doc, n + 1);
    if (!s) {
        fail_memory(ps);
        return -1;
    }
    memcpy(s, ps->scratch, n);
    s[n] = '\0';
    *out = s;
    *out_len = n;
    return 0;
}

/* The magnitude of a number (validated: digits [.digits] [e[+-]digits],
 * from the first digit `digits` to `end`; the integer part ends at int_end)
 * when it is exactly an integer that fits in 64 bits: 1, 1.0, 1e3, 2.50e1.
 * Decided on the decimal digits, not on the rounded double. */
static int exact_integer(const unsigned char *digits, const unsigned char *int_end, const unsigned char *end,
                         uint64_t *out)
{
    const unsigned char *frac = int_end, *frac_end = int_end;
    if (frac < end && *frac == '.') {
        frac++;
        frac_end = frac;
        while (frac_end < end && *frac_end >= '0' && *frac_end <= '9')
            frac_end++;
    }
    long exponent = 0;
    const unsigned char *q = frac_end;
    if (q < end && (*q == 'e' || *q == 'E')) {
        q++;
        int neg = 0;
        if (*q == '+' || *q == '-')
            neg = *q++ == '-';
        for (; q < end && *q >= '0' && *q <= '9'; q++)
            if (exponent < 100000)
                exponent = exponent * 10 + (*q - '0');
        if (neg)
            exponent = -exponent;
    }
    /* The digits of the integer and fraction parts as one sequence. */
    size_t n_int = (size_t)(int_end - digits), n_frac = frac > int_end ? (size_t)(frac_end - frac) : 0;
    size_t n = n_int + n_frac, first = 0, last = n;
#define DIGIT(k) ((k) < n_int ? digits[k] : frac[(k) - n_int])
    while (first < n && DIGIT(first) == '0')
        first++;
    if (first == n) {
        *out = 0;
        return 1;
    }
    while (DIGIT(last - 1) == '0')
        last--;
    /* value = digits[first..last) * 10^scale */
    long scale = exponent - (long)n_frac + (long)(n - last);
    if (scale < 0 || scale > 20)
        return 0;
    uint64_t mag = 0;
    for (size_t k = first; k < last; k++) {
        unsigned dg = (unsigned)(DIGIT(k) - '0');
        if (mag > (UINT64_MAX - dg) / 10)
            return 0;
        mag = mag * 10 + dg;
    }
#undef DIGIT
    for (long k = 0; k < scale; k++) {
        if (mag > UINT64_MAX / 10)
            return 0;
        mag *= 10;
    }
    *out = mag;
    return 1;
}

static int parse_number(parser_t *ps, cuh_json_t *v)
{
    const unsigned char *start = ps->p, *p = ps->p, *end = ps->end;
    char fb[32];
    int negative = 0;
    if (*p == '-') {
        negative = 1;
        p++;
    }
    if (p < end && *p == '0') {
        p++;
        if (p < end && *p >= '0' && *p <= '9') {
            fail(ps, p - 1, "a number may not begin with a zero (leading zeros are not allowed)");
            return -1;
        }
    } else if (p < end && *p >= '1' && *p <= '9') {
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    } else {
        fail(ps, p, "expected a digit after '-', found %s", found(ps, p, fb, sizeof fb));
        return -1;
    }
    const unsigned char *int_end = p;
    if (p < end && *p == '.') {
        p++;
        if (p >= end || *p < '0' || *p > '9') {
            fail(ps, p, "expected a digit after the decimal point, found %s", found(ps, p, fb, sizeof fb));
            return -1;
        }
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        if (p >= end || *p < '0' || *p > '9') {
            fail(ps, p, "expected a digit in the exponent, found %s", found(ps, p, fb, sizeof fb));
            return -1;
        }
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    }
    size_t len = (size_t)(p - start);
    /* strtod needs a terminated copy (and would read hex or "inf" on its own). */
    char small[128], *copy = len < sizeof small ? small : malloc(len + 1);
    if (!copy) {
        fail_memory(ps);
        return -1;
    }
    memcpy(copy, start, len);
    copy[len] = '\0';
    errno = 0;
    double d = strtod(copy, NULL);
    if (copy != small)
        free(copy);
    if (isinf(d)) {
        fail(ps, start, "number out of range: %.*s", len > 40 ? 40 : (int)len, (const char *)start);
        return -1;
    }
    v->type = CUH_JSON_NUMBER;
    v->v.number.d = d;
    v->v.number.i = 0;
    v->v.number.u = 0;
    v->v.number.flags = 0;
    uint64_t mag;
    if (exact_integer(start + negative, int_end, p, &mag)) {
        if (!negative) {
            v->v.number.u = mag;
            v->v.number.flags |= CUH_JSON_UINT64;
            if (mag <= (uint64_t)INT64_MAX) {
                v->v.number.i = (int64_t)mag;
                v->v.number.flags |= CUH_JSON_INT64;
            }
        } else if (mag <= (uint64_t)INT64_MAX + 1) {
            v->v.number.i = mag == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)mag;
            v->v.number.flags |= CUH_JSON_INT64;
            if (mag == 0) {
                v->v.number.u = 0;
                v->v.number.flags |= CUH_JSON_UINT64;
            }
        }
    }
    ps->p = p;
    return 0;
}

static int parse_value(parser_t *ps, cuh_json_t *v);

static int key_cmp(const char *a, size_t alen, const char *b, size_t blen)
{
    int c = memcmp(a, b, alen < blen ? alen : blen);
    if (c)
        return c;
    return alen < blen ? -1 : alen > blen;
}

static int member_ptr_cmp(const void *x, const void *y)
{
    const cuh_json_member_t *a = *(const cuh_json_member_t *const *)x;
    const cuh_json_member_t *b = *(const cuh_json_member_t *const *)y;
    int c = key_cmp(a->key, a->key_len, b->key, b->key_len);
    if (c)
        return c;
    return a < b ? -1 : a > b;   /* document order among equals */
}

/* Objects of up to this many members are searched in order. */
#define SMALL_OBJECT 12

static void fail_duplicate(parser_t *ps, const cuh_json_member_t *first, const cuh_json_member_t *again)
{
    /* The error's position is that of the second key: rebuild its pointer. */
    const unsigned char *at = ps->start;
    uint32_t l = 1;
    for (const unsigned char *q = ps->start; q < ps->end && l < again->key_line; q++)
        if (*q == '\n') {
            l++;
            at = q + 1;
        }
    at += again->key_column - 1;
    fail(ps, at, "duplicate key \"%.*s\" (first at line %u, column %u)", again->key_len > 60 ? 60 : (int)again->key_len,
         again->key, (unsigned)first->key_line, (unsigned)first->key_column);
}

static int parse_object(parser_t *ps, cuh_json_t *v)
{
    char fb[32];
    size_t base = ps->num_mems;
    ps->p++;   /* '{' */
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == '}') {
        ps->p++;
    } else {
        for (;;) {
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != '"') {
                fail(ps, ps->p, "expected a string (a key)%s, found %s", ps->num_mems == base ? " or '}'" : "",
                     found(ps, ps->p, fb, sizeof fb));
                return -1;
            }
            uint32_t kl = ps->line, kc = (uint32_t)(ps->p - ps->line_start) + 1;
            const char *key;
            size_t key_len;
            if (parse_string(ps, &key, &key_len) != 0)
                return -1;
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') {
                fail(ps, ps->p, "expected ':' after the key \"%.*s\", found %s", key_len > 60 ? 60 : (int)key_len, key,
                     found(ps, ps->p, fb, sizeof fb));
                return -1;
            }
            ps->p++;
            cuh_json_t value;
            if (parse_value(ps, &value) != 0)
                return -1;
            cuh_json_member_t *m = push_member(ps);
            if (!m)
                return -1;
            m->key = key;
            m->key_len = key_len;
            m->key_line = kl;
            m->key_column = kc;
            m->value = value;
            skip_ws(ps);
            if (ps->p < ps->end && *ps->p == ',') {
                ps->p++;
                continue;
            }
            if (ps->p < ps->end && *ps->p == '}') {
                ps->p++;
                break;
            }
            fail(ps, ps->p, "expected ',' or '}' after an object member, found %s", found(ps, ps->p, fb, sizeof fb));
            return -1;
        }
    }
    size_t n = ps->num_mems - base;
    cuh_json_member_t *members = NULL;
    const cuh_json_member_t **sorted = NULL;
    if (n) {
        members = arena_alloc(ps->doc, n * sizeof *members);
        if (!members) {
            fail_memory(ps);
            return -1;
        }
        memcpy(members, ps->mems + base, n * sizeof *members);
    }
    ps->num_mems = base;
    if (n <= SMALL_OBJECT) {
        for (size_t i = 1; i < n; i++)
            for (size_t j = 0; j < i; j++)
                if (!key_cmp(members[i].key, members[i].key_len, members[j].key, members[j].key_len)) {
                    fail_duplicate(ps, &members[j], &members[i]);
                    return -1;
                }
    } else {
        sorted = arena_alloc(ps->doc, n * sizeof *sorted);
        if (!sorted) {
            fail_memory(ps);
            return -1;
        }
        for (size_t i = 0; i < n; i++)
            sorted[i] = &members[i];
        qsort(sorted, n, sizeof *sorted, member_ptr_cmp);
        for (size_t i = 1; i < n; i++)
            if (!key_cmp(sorted[i]->key, sorted[i]->key_len, sorted[i - 1]->key, sorted[i - 1]->key_len)) {
                fail_duplicate(ps, sorted[i - 1], sorted[i]);
                return -1;
            }
    }
    v->type = CUH_JSON_OBJECT;
    v->v.object.members = members;
    v->v.object.n = n;
    v->v.object.sorted = sorted;
    return 0;
}

static int parse_array(parser_t *ps, cuh_json_t *v)
{
    char fb[32];
    size_t base = ps->num_vals;
    ps->p++;   /* '[' */
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == ']') {
        ps->p++;
    } else {
        for (;;) {
            cuh_json_t item;
            if (parse_value(ps, &item) != 0 || push_value(ps, &item) != 0)
                return -1;
            skip_ws(ps);
            if (ps->p < ps->end && *ps->p == ',') {
                ps->p++;
                continue;
            }
            if (ps->p < ps->end && *ps->p == ']') {
                ps->p++;
                break;
            }
            fail(ps, ps->p, "expected ',' or ']' after an array element, found %s", found(ps, ps->p, fb, sizeof fb));
            return -1;
        }
    }
    size_t n = ps->num_vals - base;
    cuh_json_t *items = NULL;
    if (n) {
        items = arena_alloc(ps->doc, n * sizeof *items);
        if (!items) {
            fail_memory(ps);
            return -1;
        }
        memcpy(items, ps->vals + base, n * sizeof *items);
    }
    ps->num_vals = base;
    v->type = CUH_JSON_ARRAY;
    v->v.array.items = items;
    v->v.array.n = n;
    return 0;
}

static int literal(parser_t *ps, const char *word, size_t len)
{
    if ((size_t)(ps->end - ps->p) < len || memcmp(ps->p, word, len) != 0) {
        fail(ps, ps->p, "invalid literal: expected %s", word);
        return -1;
    }
    ps->p += len;
    return 0;
}

static int parse_value(parser_t *ps, cuh_json_t *v)
{
    char fb[32];
    skip_ws(ps);
    memset(v, 0, sizeof *v);
    v->line = ps->line;
    v->column = (uint32_t)(ps->p - ps->line_start) + 1;
    if (ps->p >= ps->end) {
        fail(ps, ps->p, "expected a value, found the end of the input");
        return -1;
    }
    switch (*ps->p) {
    case '{':
    case '[': {
        if (ps->depth >= ps->max_depth) {
            fail(ps, ps->p, "nested deeper than %u arrays and objects", ps->max_depth);
            return -1;
        }
        ps->depth++;
        int rc = *ps->p == '{' ? parse_object(ps, v) : parse_array(ps, v);
        ps->depth--;
        return rc;
    }
    case '"':
        v->type = CUH_JSON_STRING;
        return parse_string(ps, &v->v.string.s, &v->v.string.len);
    case 't':
        v->type = CUH_JSON_BOOL;
        v->v.boolean = 1;
        return literal(ps, "true", 4);
    case 'f':
        v->type = CUH_JSON_BOOL;
        v->v.boolean = 0;
        return literal(ps, "false", 5);
    case 'n':
        v->type = CUH_JSON_NULL;
        return literal(ps, "null", 4);
    default:
        if (*ps->p == '-' || (*ps->p >= '0' && *ps->p <= '9'))
            return parse_number(ps, v);
        fail(ps, ps->p, "expected a value (an object, array, string, number, true, false or null), found %s",
             found(ps, ps->p, fb, sizeof fb));
        return -1;
    }
}

static void clear_error(cuh_json_error_t *err)
{
    if (err)
        memset(err, 0, sizeof *err);
}

__attribute__((format(printf, 2, 3)))
static void plain_error(cuh_json_error_t *err, const char *fmt, ...)
{
    if (!err)
        return;
    memset(err, 0, sizeof *err);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
}

cuh_json_doc_t *cuh_json_parse(const char *text, size_t len, const cuh_json_limits_t *limits, cuh_json_error_t *err)
{
    size_t max_size = limits && limits->max_size ? limits->max_size : CUH_JSON_MAX_SIZE;
    unsigned max_depth = limits && limits->max_depth ? limits->max_depth : CUH_JSON_MAX_DEPTH;
    clear_error(err);
    if (len > max_size) {
        plain_error(err, "the document is larger than the limit (%zu bytes, at most %zu)", len, max_size);
        return NULL;
    }
    cuh_json_doc_t *doc = calloc(1, sizeof *doc);
    if (!doc) {
        plain_error(err, "out of memory");
        return NULL;
    }
    const unsigned char *start = (const unsigned char *)text;
    parser_t ps = {.start = start, .p = start, .end = start + len, .line = 1, .line_start = start,
                   .max_depth = max_depth, .doc = doc, .err = err};
    /* A UTF-8 byte order mark may be ignored (RFC 8259, 8.1). */
    if (len >= 3 && start[0] == 0xEF && start[1] == 0xBB && start[2] == 0xBF)
        ps.p += 3;
    int rc = parse_value(&ps, &doc->root);
    if (rc == 0) {
        skip_ws(&ps);
        if (ps.p < ps.end) {
            char fb[32];
            fail(&ps, ps.p, "expected the end of the input after the top-level value, found %s",
                 found(&ps, ps.p, fb, sizeof fb));
            rc = -1;
        }
    }
    free(ps.vals);
    free(ps.mems);
    free(ps.scratch);
    if (rc != 0) {
        cuh_json_free(doc);
        return NULL;
    }
    return doc;
}

cuh_json_doc_t *cuh_json_parse_file(const char *path, const cuh_json_limits_t *limits, cuh_json_error_t *err)
{
    size_t max_size = limits && limits->max_size ? limits->max_size : CUH_JSON_MAX_SIZE;
    int is_stdin = strcmp(path, "-") == 0;
    FILE *f = is_stdin ? stdin : fopen(path, "rb");
    if (!f) {
        plain_error(err, "cannot open: %s", strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    int too_large = 0;
    while (buf) {
        if (len == cap) {
            if (len > max_size) {
                too_large = 1;
                break;
            }
            char *n = realloc(buf, cap * 2);
            if (!n) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = n;
            cap *= 2;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0)
            break;
    }
    int read_error = buf && !too_large && ferror(f);
    int saved = errno;
    if (!is_stdin)
        fclose(f);
    cuh_json_doc_t *doc = NULL;
    if (!buf)
        plain_error(err, "out of memory reading it");
    else if (read_error)
        plain_error(err, "cannot read: %s", strerror(saved));
    else if (too_large || len > max_size)
        plain_error(err, "larger than the limit of %zu bytes", max_size);
    else
        doc = cuh_json_parse(buf, len, limits, err);
    free(buf);
    return doc;
}

const cuh_json_t *cuh_json_root(const cuh_json_doc_t *doc) { return doc ? &doc->root : NULL; }

const cuh_json_t *cuh_json_get(const cuh_json_t *object, const char *key)
{
    if (!object || object->type != CUH_JSON_OBJECT)
        return NULL;
    size_t klen = strlen(key), n = object->v.object.n;
    if (!object->v.object.sorted) {
        for (size_t i = 0; i < n; i++) {
            const cuh_json_member_t *m = &object->v.object.members[i];
            if (m->key_len == klen && memcmp(m->key, key, klen) == 0)
                return &m->value;
        }
        return NULL;
    }
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const cuh_json_member_t *m = object->v.object.sorted[mid];
        int c = key_cmp(m->key, m->key_len, key, klen);
        if (c == 0)
            return &m->value;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

const cuh_json_t *cuh_json_at(const cuh_json_t *array, size_t i)
{
    if (!array || array->type != CUH_JSON_ARRAY || i >= array->v.array.n)
        return NULL;
    return &array->v.array.items[i];
}

size_t cuh_json_count(const cuh_json_t *value)
{
    if (!value)
        return 0;
    if (value->type == CUH_JSON_ARRAY)
        return value->v.array.n;
    if (value->type == CUH_JSON_OBJECT)
        return value->v.object.n;
    return 0;
}

const char *cuh_json_type_name(cuh_json_type_t type)
{
    switch (type) {
    case CUH_JSON_NULL: return "null";
    case CUH_JSON_BOOL: return "a boolean";
    case CUH_JSON_NUMBER: return "a number";
    case CUH_JSON_STRING: return "a string";
    case CUH_JSON_ARRAY: return "an array";
    case CUH_JSON_OBJECT: return "an object";
    }
    return "an unknown value";
}

const char *cuh_json_describe(const cuh_json_t *value)
{
    if (!value)
        return "nothing";
    if (value->type == CUH_JSON_BOOL)
        return value->v.boolean ? "true" : "false";
    if (value->type == CUH_JSON_NUMBER && (value->v.number.flags & (CUH_JSON_INT64 | CUH_JSON_UINT64)))
        return value->v.number.i < 0 && (value->v.number.flags & CUH_JSON_INT64) ? "a negative integer" : "an integer";
    return cuh_json_type_name(value->type);
}
