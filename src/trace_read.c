/* trace_read.c - loads an allocation trace into an array of events.
 *
 * This file holds the whole reader: a line reader over zlib (gzread reads
 * gzip and plain files alike), the parsers of the two formats (cuheap's trace
 * v1 and RMM's logging-adaptor CSV), and a small open-addressing hash map from
 * id (or RMM pointer) to the index of its allocation event. One pass over the
 * file checks every record, pairs each free with its allocation and keeps the
 * running sum of live requested bytes, so that a replay afterwards is a plain
 * walk over an array. Errors are reported once, as "path:line: problem", and
 * nothing is kept of a trace that failed to load.
 */
#include "trace_read.h"

#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#define RMM_HEADER "Thread,Time,Action,Pointer,Size,Stream"
#define PPR_KEY "pytorch_peak_reserved="
/* The header trace:PATH writes (trace_write.c), up to the version. */
#define CUHEAP_SOURCE "trace v1 source=cuheap-"
#define USEC_PER_DAY (86400ull * 1000000ull)
/* Bytes asked of gzread at a time, and zlib's buffer size. */
#define READ_CHUNK ((size_t)8192)

/* ---- id map: key -> event index + 1 (0 marks an empty slot) ------------- */

typedef struct idmap_s {
    uint64_t *keys;
    size_t *vals;
    size_t cap;     /* a power of two */
    size_t count;
} idmap_t;

static uint64_t idmap_hash(uint64_t x)
{
    /* splitmix64's finalizer: ids and pointers are far from random. */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static int idmap_init(idmap_t *m, size_t cap)
{
    m->keys = calloc(cap, sizeof *m->keys);
    m->vals = calloc(cap, sizeof *m->vals);
    m->cap = cap;
    m->count = 0;
    if (!m->keys || !m->vals) {
        free(m->keys);
        free(m->vals);
        m->keys = NULL;
        m->vals = NULL;
        return -1;
    }
    return 0;
}

static void idmap_destroy(idmap_t *m)
{
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

static size_t idmap_probe(const idmap_t *m, uint64_t key)
{
    size_t mask = m->cap - 1;
    size_t i = (size_t)idmap_hash(key) & mask;
    while (m->vals[i] != 0 && m->keys[i] != key)
        i = (i + 1) & mask;
    return i;
}

static int idmap_grow(idmap_t *m)
{
    idmap_t bigger;
    if (m->cap > SIZE_MAX / 4 || idmap_init(&bigger, m->cap * 2) != 0)
        return -1;
    for (size_t i = 0; i < m->cap; i++) {
        if (m->vals[i] != 0) {
            size_t j = idmap_probe(&bigger, m->keys[i]);
            bigger.keys[j] = m->keys[i];
            bigger.vals[j] = m->vals[i];
        }
    }
    bigger.count = m->count;
    idmap_destroy(m);
    *m = bigger;
    return 0;
}

/* The value cell of `key`, inserted (holding 0) if absent; NULL when out of
 * memory. The cell is valid until the next call. */
static size_t *idmap_cell(idmap_t *m, uint64_t key)
{
    if ((m->count + 1) * 2 > m->cap && idmap_grow(m) != 0)
        return NULL;
    size_t i = idmap_probe(m, key);
    if (m->vals[i] == 0) {
        m->keys[i] = key;
        m->count++;
    }
    return &m->vals[i];
}

/* The value of `key`, 0 when absent. */
static size_t idmap_get(const idmap_t *m, uint64_t key)
{
    return m->vals[idmap_probe(m, key)];
}

/* ---- line reader --------------------------------------------------------- */

typedef struct reader_s {
    gzFile gz;
    char *buf;
    size_t cap;     /* buf holds cap bytes; one is always left for a '\0' */
    size_t start;   /* first byte not yet returned */
    size_t end;     /* one past the last byte read */
    int eof;
    size_t lineno;  /* number of the line last returned */
    int unterminated;   /* that line ended the file without a newline */
} reader_t;

/* 1 with the next line (NUL-terminated, without its "\n" or "\r\n"), 0 at the
 * end of the file, -1 on a read error with the zlib message in *why. */
static int reader_next(reader_t *r, char **line, size_t *len, const char **why, int *errnum)
{
    for (;;) {
        char *nl = memchr(r->buf + r->start, '\n', r->end - r->start);
        size_t stop;
        if (nl) {
            stop = (size_t)(nl - r->buf);
        } else if (r->eof) {
            if (r->start == r->end)
                return 0;
            stop = r->end;   /* a last line without a newline */
        } else {
            if (r->start > 0) {
                memmove(r->buf, r->buf + r->start, r->end - r->start);
                r->end -= r->start;
                r->start = 0;
            }
            if (r->end + 1 >= r->cap) {
                size_t ncap = r->cap * 2;
                char *nbuf = ncap > r->cap ? realloc(r->buf, ncap) : NULL;
                if (!nbuf) {
                    *why = "out of memory for a line";
                    *errnum = Z_MEM_ERROR;
                    return -1;
                }
                r->buf = nbuf;
                r->cap = ncap;
            }
            /* Small reads: zlib drops what it decoded in a call that fails,
             * so a smaller call puts a gzip error nearer its line. */
            size_t room = r->cap - r->end - 1;
            if (room > READ_CHUNK)
                room = READ_CHUNK;
            int n = gzread(r->gz, r->buf + r->end, (unsigned)room);
            if (n < 0) {
                *why = gzerror(r->gz, errnum);
                return -1;
            }
            if (n == 0) {
                /* gzread reports a stream cut short as a plain end of file
                 * (Z_BUF_ERROR): only gzerror tells the difference. */
                int e = Z_OK;
                const char *msg = gzerror(r->gz, &e);
                if (e != Z_OK) {
                    *why = msg;
                    *errnum = e;
                    return -1;
                }
                r->eof = 1;
            }
            r->end += (size_t)n;
            continue;
        }
        char *s = r->buf + r->start;
        size_t n = stop - r->start;
        if (n > 0 && s[n - 1] == '\r')
            n--;
        s[n] = '\0';
        r->start = nl ? stop + 1 : stop;
        r->unterminated = !nl;
        r->lineno++;
        *line = s;
        *len = n;
        return 1;
    }
}

/* ---- the loader ------------------------------------------------------------ */

typedef struct loader_s {
    const char *path;
    char *err;
    size_t errlen;
    cuh_trace_t *t;
    size_t ev_cap;
    idmap_t ids;            /* v1 id or RMM pointer -> allocation index + 1 */
    idmap_t streams;        /* RMM stream pointer -> number */
    uint64_t live;
    uint64_t last_t;
    size_t last_t_line;
    int have_desc;
    uint64_t last_comment_ppr;
    /* RMM CSV */
    int have_t0;
    uint64_t t0;
    uint64_t day_offset;
    uint64_t next_stream;
    uint64_t next_id;
    int tod_times;          /* times are HH:MM:SS.ffffff (they wrap at midnight) */
    int saw_end;            /* a "# end ..." comment: trace:PATH finished the file */
} loader_t;

__attribute__((format(printf, 3, 4)))
static int fail(loader_t *L, size_t line, const char *fmt, ...)
{
    char raw[768], msg[4 * 768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    cuh_escape_unprintable(raw, msg, sizeof msg);   /* pieces of the file, quoted */
    if (L->err && L->errlen > 0) {
        if (line > 0)
            snprintf(L->err, L->errlen, "%s:%zu: %s", L->path, line, msg);
        else
            snprintf(L->err, L->errlen, "%s: %s", L->path, msg);
    }
    return -1;
}

/* A length for "%.*s", at most max: messages quote a bounded piece. */
static int clip(size_t n, size_t max) { return (int)(n < max ? n : max); }

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\v' || c == '\f'; }

/* The next whitespace-separated token of [*p, end), 0 when there is none. */
static int next_token(const char **p, const char *end, const char **tok, size_t *toklen)
{
    const char *s = *p;
    while (s < end && is_space(*s))
        s++;
    if (s == end) {
        *p = s;
        return 0;
    }
    const char *e = s;
    while (e < end && !is_space(*e))
        e++;
    *tok = s;
    *toklen = (size_t)(e - s);
    *p = e;
    return 1;
}

/* Decimal digits only: 0, -1 when not a number, -2 when it overflows. */
static int parse_u64(const char *s, size_t n, uint64_t *out)
{
    uint64_t v = 0;
    if (n == 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        unsigned d = (unsigned)(s[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -2;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

/* Hexadecimal with an optional 0x: 0, -1 when not a number, -2 on overflow. */
static int parse_hex(const char *s, size_t n, uint64_t *out)
{
    uint64_t v = 0;
    if (n >= 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        s += 2;
        n -= 2;
    }
    if (n == 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned d;
        char c = s[i];
        if (c >= '0' && c <= '9')
            d = (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            d = (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            d = (unsigned)(c - 'A' + 10);
        else
            return -1;
        if (v >> 60)
            return -2;
        v = (v << 4) | d;
    }
    *out = v;
    return 0;
}

static int push_event(loader_t *L, size_t line, cuh_trace_event_t **ev)
{
    cuh_trace_t *t = L->t;
    if (t->num_events == L->ev_cap) {
        size_t ncap = L->ev_cap ? L->ev_cap * 2 : 4096;
        cuh_trace_event_t *n = realloc(t->events, ncap * sizeof *n);
        if (!n)
            return fail(L, line, "out of memory after %zu events", t->num_events);
        t->events = n;
        L->ev_cap = ncap;
    }
    *ev = &t->events[t->num_events];
    memset(*ev, 0, sizeof **ev);
    (*ev)->line = (uint32_t)line;
    return 0;
}

static int check_time(loader_t *L, size_t line, uint64_t t_us)
{
    if (L->last_t_line > 0 && t_us < L->last_t)
        return fail(L, line, "time goes backwards: %" PRIu64 " us after %" PRIu64 " us on line %zu",
                    t_us, L->last_t, L->last_t_line);
    L->last_t = t_us;
    L->last_t_line = line;
    return 0;
}

/* `what` names the key in messages: "id 77" or "pointer 0x7f0000000000". */
static int add_alloc(loader_t *L, size_t line, uint64_t t_us, uint64_t key, uint64_t id,
                     uint64_t size, uint64_t stream, const char *what)
{
    cuh_trace_t *t = L->t;
    size_t *cell = idmap_cell(&L->ids, key);
    if (!cell)
        return fail(L, line, "out of memory for the id map");
    if (*cell != 0) {
        const cuh_trace_event_t *prev = &t->events[*cell - 1];
        if (prev->match == CUH_TRACE_NO_MATCH)
            return fail(L, line, "%s allocated again while live (allocated on line %" PRIu32 ")",
                        what, prev->line);
    }
    if (L->live > UINT64_MAX - size)
        return fail(L, line, "live bytes overflow 64 bits");
    cuh_trace_event_t *ev;
    if (push_event(L, line, &ev) != 0)
        return -1;
    size_t idx = t->num_events++;
    *cell = idx + 1;
    ev->kind = CUH_TRACE_ALLOC;
    ev->t_us = t_us;
    ev->id = id;
    ev->size = size;
    ev->stream = stream;
    ev->match = CUH_TRACE_NO_MATCH;
    t->num_allocs++;
    L->live += size;
    if (L->live > t->peak_live) {
        t->peak_live = L->live;
        t->peak_live_event = idx;
    }
    return 0;
}

/* has_stream: the record names its stream (RMM), else the allocation's is
 * used. has_size: the record names its size, which must be the allocation's. */
static int add_free(loader_t *L, size_t line, uint64_t t_us, uint64_t key, int has_stream,
                    uint64_t stream, int has_size, uint64_t size, const char *what)
{
    cuh_trace_t *t = L->t;
    size_t v = idmap_get(&L->ids, key);
    if (v == 0)
        return fail(L, line, "free of %s which is not live (never allocated)", what);
    size_t a = v - 1;
    if (t->events[a].match != CUH_TRACE_NO_MATCH)
        return fail(L, line, "free of %s which is not live (already freed on line %" PRIu32 ")",
                    what, t->events[t->events[a].match].line);
    if (has_size && size != t->events[a].size)
        return fail(L, line, "free of %s with size %" PRIu64 ", but it was allocated with size %" PRIu64
                    " on line %" PRIu32, what, size, t->events[a].size, t->events[a].line);
    cuh_trace_event_t *ev;
    if (push_event(L, line, &ev) != 0)
        return -1;
    size_t idx = t->num_events++;
    cuh_trace_event_t *al = &t->events[a];
    ev->kind = CUH_TRACE_FREE;
    ev->t_us = t_us;
    ev->id = al->id;
    ev->size = al->size;
    ev->stream = has_stream ? stream : al->stream;
    ev->match = a;
    al->match = idx;
    t->num_frees++;
    L->live -= al->size;
    return 0;
}

/* ---- trace v1 -------------------------------------------------------------- */

/* Whether the trace's header is the one trace:PATH writes. */
static int is_cuheap_recording(const cuh_trace_t *t)
{
    return t->description && strncmp(t->description, CUHEAP_SOURCE, strlen(CUHEAP_SOURCE)) == 0;
}

const char *cuh_trace_mode_name(cuh_trace_mode_t mode)
{
    switch (mode) {
    case CUH_TRACE_MODE_NATIVE: return "native";
    case CUH_TRACE_MODE_EXPANDABLE: return "expandable";
    case CUH_TRACE_MODE_ASYNC: return "async";
    case CUH_TRACE_NUM_MODES: break;
    }
    return "?";
}

/* The value of "key=value" among the words of [s, end), or NULL. */
static const char *word_value(const char *s, const char *end, const char *key, size_t *len)
{
    size_t kn = strlen(key);
    while (s < end) {
        while (s < end && is_space(*s))
            s++;
        const char *w = s;
        while (s < end && !is_space(*s))
            s++;
        if ((size_t)(s - w) > kn && memcmp(w, key, kn) == 0 && w[kn] == '=') {
            *len = (size_t)(s - w) - kn - 1;
            return w + kn + 1;
        }
    }
    return NULL;
}

/* "# pytorch mode=M peak_reserved=B peak_allocated=B total_ms=T ...": what
 * the recording run measured of one of PyTorch's modes. */
static int v1_measured(loader_t *L, size_t line, const char *s, const char *end)
{
    size_t n;
    const char *v = word_value(s, end, "mode", &n);
    int mode = -1;
    for (int m = 0; v && m < CUH_TRACE_NUM_MODES; m++)
        if (strlen(cuh_trace_mode_name((cuh_trace_mode_t)m)) == n &&
            memcmp(v, cuh_trace_mode_name((cuh_trace_mode_t)m), n) == 0)
            mode = m;
    if (mode < 0)
        return fail(L, line, "'# pytorch' line without a known mode= (native, expandable or async)");
    cuh_trace_measured_t *m = &L->t->measured[mode];
    if (m->present)
        return fail(L, line, "a second '# pytorch' line for mode %s", cuh_trace_mode_name((cuh_trace_mode_t)mode));
    static const char *const keys[] = {"peak_reserved", "peak_allocated"};
    uint64_t *fields[] = {&m->peak_reserved, &m->peak_allocated};
    for (int k = 0; k < 2; k++) {
        v = word_value(s, end, keys[k], &n);
        if (!v || parse_u64(v, n, fields[k]) != 0)
            return fail(L, line, "'# pytorch' line for mode %s: %s must be a number of bytes, not '%.*s'",
                        cuh_trace_mode_name((cuh_trace_mode_t)mode), keys[k], clip(v ? n : 0, 40), v ? v : "");
    }
    v = word_value(s, end, "total_ms", &n);
    char num[48];
    char *stop = NULL;
    if (v && n < sizeof num) {
        memcpy(num, v, n);
        num[n] = '\0';
        m->total_ms = strtod(num, &stop);
    }
    if (!v || n == 0 || n >= sizeof num || *stop != '\0' || !(m->total_ms >= 0))
        return fail(L, line, "'# pytorch' line for mode %s: total_ms must be a number of milliseconds, not '%.*s'",
                    cuh_trace_mode_name((cuh_trace_mode_t)mode), clip(v ? n : 0, 40), v ? v : "");
    m->present = 1;
    return 0;
}

/* "# corpus job=NAME way=WAY ...": which job of the corpus this is. */
static int v1_corpus(loader_t *L, size_t line, const char *s, const char *end)
{
    size_t jn, wn;
    const char *job = word_value(s, end, "job", &jn), *way = word_value(s, end, "way", &wn);
    if (!job || jn == 0 || jn >= sizeof L->t->job || !way || wn == 0 || wn >= sizeof L->t->way)
        return fail(L, line, "'# corpus' line needs job=NAME (1 to %zu characters) and way=WAY (1 to %zu)",
                    sizeof L->t->job - 1, sizeof L->t->way - 1);
    memcpy(L->t->job, job, jn);
    L->t->job[jn] = '\0';
    memcpy(L->t->way, way, wn);
    L->t->way[wn] = '\0';
    size_t cn;
    const char *cache = word_value(s, end, "pytorch_cache", &cn);
    if (cache && !((cn == 2 && memcmp(cache, "on", 2) == 0) || (cn == 3 && memcmp(cache, "off", 3) == 0)))
        return fail(L, line, "'# corpus' line: pytorch_cache must be on or off, not '%.*s'", clip(cn, 40), cache);
    L->t->pytorch_cache = cache ? cn == 2 : -1;
    return 0;
}

static int v1_comment(loader_t *L, size_t line, const char *s, size_t n)
{
    const char *end = s + n;
    s++;   /* the '#' */
    while (s < end && is_space(*s))
        s++;
    while (end > s && is_space(end[-1]))
        end--;
    if (end - s >= 4 && memcmp(s, "end ", 4) == 0)
        L->saw_end = 1;   /* the closing line of trace:PATH */
    if (end - s >= 5 && memcmp(s, "mark ", 5) == 0) {
        cuh_trace_t *t = L->t;
        const size_t had = t->num_marks;
        if (had == 0 || (had >= 8 && (had & (had - 1)) == 0)) {   /* room for 8, then doubled when full */
            size_t *grown = realloc(t->mark_events, (had ? 2 * had : 8) * sizeof *grown);
            if (!grown)
                return fail(L, line, "out of memory for the trace's marks");
            t->mark_events = grown;
        }
        t->mark_events[t->num_marks++] = t->num_events;
    }
    if (end - s >= 8 && memcmp(s, "pytorch ", 8) == 0 && v1_measured(L, line, s + 8, end) != 0)
        return -1;
    if (end - s >= 7 && memcmp(s, "corpus ", 7) == 0 && v1_corpus(L, line, s + 7, end) != 0)
        return -1;
    if (!L->have_desc) {
        size_t dn = (size_t)(end - s);
        char *d = malloc(dn + 1);
        if (!d)
            return fail(L, line, "out of memory");
        memcpy(d, s, dn);
        d[dn] = '\0';
        free(L->t->description);
        L->t->description = d;
        L->have_desc = 1;
    }
    /* Only the last comment line counts: each comment replaces the value. */
    L->last_comment_ppr = 0;
    const char *k = s;
    while ((k = strstr(k, PPR_KEY)) != NULL && k < end) {
        if (k == s || is_space(k[-1]))
            break;
        k += sizeof PPR_KEY - 1;
    }
    if (k && k < end) {
        const char *v = k + sizeof PPR_KEY - 1, *ve = v;
        while (ve < end && !is_space(*ve))
            ve++;
        uint64_t val;
        if (parse_u64(v, (size_t)(ve - v), &val) != 0)
            return fail(L, line, "bad pytorch_peak_reserved value '%.*s' in comment",
                        clip((size_t)(ve - v), 40), v);
        L->last_comment_ppr = val;
    }
    return 0;
}

/* Parses one numeric field of a v1 record. */
static int v1_field(loader_t *L, size_t line, const char **p, const char *end, const char *name,
                    const char *record, const char *usage, uint64_t *out)
{
    const char *tok;
    size_t tn;
    if (!next_token(p, end, &tok, &tn))
        return fail(L, line, "missing %s field in %s record (expected '%s')", name, record, usage);
    int r = parse_u64(tok, tn, out);
    if (r == -2)
        return fail(L, line, "%s field '%.*s' is out of range", name, clip(tn, 40), tok);
    if (r != 0) {
        uint64_t neg;
        if (tn > 1 && tok[0] == '-' && parse_u64(tok + 1, tn - 1, &neg) == 0 &&
            strcmp(name, "size") == 0)
            return fail(L, line, "size %.*s is not positive (an allocation asks for at least one byte)",
                        clip(tn, 40), tok);
        return fail(L, line, "%s field '%.*s' is not a non-negative integer", name,
                    clip(tn, 40), tok);
    }
    return 0;
}

static int v1_trailing(loader_t *L, size_t line, const char *p, const char *end, const char *record)
{
    const char *tok;
    size_t tn;
    if (next_token(&p, end, &tok, &tn)) {
        size_t rest = (size_t)(end - tok);
        return fail(L, line, "trailing garbage '%.*s' after %s record", clip(rest, 40),
                    tok, record);
    }
    return 0;
}

static int v1_line(loader_t *L, size_t line, const char *s, size_t n)
{
    static const char a_usage[] = "a <t_us> <id> <size> <stream>";
    static const char f_usage[] = "f <t_us> <id>";
    const char *end = s + n, *p = s, *tok;
    size_t tn;
    if (!next_token(&p, end, &tok, &tn))
        return 0;   /* blank line */
    if (tok[0] == '#')
        return v1_comment(L, line, tok, (size_t)(end - tok));
    char what[48];
    uint64_t t_us, id, size, stream;
    if (tn == 1 && tok[0] == 'a') {
        if (v1_field(L, line, &p, end, "t_us", "allocation", a_usage, &t_us) ||
            v1_field(L, line, &p, end, "id", "allocation", a_usage, &id) ||
            v1_field(L, line, &p, end, "size", "allocation", a_usage, &size) ||
            v1_field(L, line, &p, end, "stream", "allocation", a_usage, &stream) ||
            v1_trailing(L, line, p, end, "allocation"))
            return -1;
        if (size == 0)
            return fail(L, line, "size 0 is not positive (an allocation asks for at least one byte)");
        if (check_time(L, line, t_us) != 0)
            return -1;
        snprintf(what, sizeof what, "id %" PRIu64, id);
        return add_alloc(L, line, t_us, id, id, size, stream, what);
    }
    if (tn == 1 && tok[0] == 'f') {
        if (v1_field(L, line, &p, end, "t_us", "free", f_usage, &t_us) ||
            v1_field(L, line, &p, end, "id", "free", f_usage, &id) ||
            v1_trailing(L, line, p, end, "free"))
            return -1;
        if (check_time(L, line, t_us) != 0)
            return -1;
        snprintf(what, sizeof what, "id %" PRIu64, id);
        return add_free(L, line, t_us, id, 0, 0, 0, 0, what);
    }
    return fail(L, line, "unknown record kind '%.*s' (expected 'a', 'f' or a '#' comment)",
                clip(tn, 40), tok);
}

/* ---- RMM logging-adaptor CSV ---------------------------------------------- */

static void trim(const char **s, const char **e)
{
    while (*s < *e && is_space(**s))
        (*s)++;
    while (*e > *s && is_space((*e)[-1]))
        (*e)--;
}

/* "HH:MM:SS.ffffff" (spdlog's %H:%M:%S.%f) or "seconds.ffffff" -> us. */
static int rmm_time(loader_t *L, const char *s, size_t n, uint64_t *us)
{
    const char *end = s + n, *dot = memchr(s, '.', n);
    const char *ie = dot ? dot : end;
    uint64_t secs = 0, frac = 0;
    if (memchr(s, ':', (size_t)(ie - s))) {
        uint64_t h, m, sec;
        const char *c1 = memchr(s, ':', (size_t)(ie - s));
        const char *c2 = memchr(c1 + 1, ':', (size_t)(ie - c1 - 1));
        if (!c2 || parse_u64(s, (size_t)(c1 - s), &h) || parse_u64(c1 + 1, (size_t)(c2 - c1 - 1), &m) ||
            parse_u64(c2 + 1, (size_t)(ie - c2 - 1), &sec) || h > 23 || m > 59 || sec > 60)
            return -1;
        secs = (h * 60 + m) * 60 + sec;
        L->tod_times = 1;
    } else if (parse_u64(s, (size_t)(ie - s), &secs) != 0 || secs > UINT64_MAX / 2000000) {
        return -1;
    }
    if (dot) {
        size_t fd = (size_t)(end - dot - 1);
        if (fd == 0)
            return -1;
        for (size_t i = 0; i < fd; i++) {
            if (dot[1 + i] < '0' || dot[1 + i] > '9')
                return -1;
            if (i < 6)
                frac = frac * 10 + (uint64_t)(dot[1 + i] - '0');
        }
        for (size_t i = fd; i < 6; i++)
            frac *= 10;
    }
    *us = secs * 1000000 + frac;
    return 0;
}

static int rmm_line(loader_t *L, size_t line, const char *s, size_t n)
{
    static const char *const names[6] = {"Thread", "Time", "Action", "Pointer", "Size", "Stream"};
    const char *fs[6], *fe[6];
    const char *p = s, *end = s + n;
    int nf = 0;
    {
        const char *b = s, *e = end;
        trim(&b, &e);
        if (b == e)
            return 0;   /* blank line */
    }
    while (nf < 6) {
        const char *c = memchr(p, ',', (size_t)(end - p));
        fs[nf] = p;
        fe[nf] = c ? c : end;
        trim(&fs[nf], &fe[nf]);
        nf++;
        if (!c) {
            p = end;
            break;
        }
        p = c + 1;
        if (nf == 6)
            return fail(L, line, "trailing garbage ',%.*s' after the Stream field",
                        clip((size_t)(end - p), 40), p);
    }
    if (nf < 6)
        return fail(L, line, "missing %s field (expected '" RMM_HEADER "')", names[nf]);
    for (int i = 0; i < 6; i++)
        if (fs[i] == fe[i])
            return fail(L, line, "empty %s field", names[i]);

    uint64_t tod, t_us;
    if (rmm_time(L, fs[1], (size_t)(fe[1] - fs[1]), &tod) != 0)
        return fail(L, line, "Time field '%.*s' is not HH:MM:SS.ffffff or seconds.ffffff",
                    clip((size_t)(fe[1] - fs[1]), 40), fs[1]);
    uint64_t abs_t = L->day_offset + tod;
    if (L->tod_times && L->have_t0 && abs_t + USEC_PER_DAY / 2 < L->t0 + L->last_t) {
        /* A clock of the day went past midnight. */
        L->day_offset += USEC_PER_DAY;
        abs_t += USEC_PER_DAY;
    }
    if (!L->have_t0) {
        L->t0 = abs_t;
        L->have_t0 = 1;
    }
    if (abs_t < L->t0)
        return fail(L, line, "time goes backwards: %.*s is before the first row's time",
                    clip((size_t)(fe[1] - fs[1]), 40), fs[1]);
    t_us = abs_t - L->t0;

    size_t an = (size_t)(fe[2] - fs[2]);
    int kind;
    if (an == 8 && memcmp(fs[2], "allocate", 8) == 0)
        kind = CUH_TRACE_ALLOC;
    else if ((an == 4 && memcmp(fs[2], "free", 4) == 0) ||
             (an == 10 && memcmp(fs[2], "deallocate", 10) == 0))
        kind = CUH_TRACE_FREE;
    else if (an == 16 && memcmp(fs[2], "allocate failure", 16) == 0) {
        if (check_time(L, line, t_us) != 0)
            return -1;
        L->t->num_skipped++;
        return 0;
    } else
        return fail(L, line, "unknown action '%.*s' (expected allocate, free or allocate failure)",
                    clip(an, 40), fs[2]);

    uint64_t ptr, size, sptr;
    int r = parse_hex(fs[3], (size_t)(fe[3] - fs[3]), &ptr);
    if (r != 0)
        return fail(L, line, "Pointer field '%.*s' is not a hexadecimal address",
                    clip((size_t)(fe[3] - fs[3]), 40), fs[3]);
    r = parse_u64(fs[4], (size_t)(fe[4] - fs[4]), &size);
    if (r != 0) {
        if (fs[4][0] == '-')
            return fail(L, line, "size %.*s is not positive (an allocation asks for at least one byte)",
                        clip((size_t)(fe[4] - fs[4]), 40), fs[4]);
        return fail(L, line, "Size field '%.*s' is not a non-negative integer",
                    clip((size_t)(fe[4] - fs[4]), 40), fs[4]);
    }
    if (parse_hex(fs[5], (size_t)(fe[5] - fs[5]), &sptr) != 0)
        return fail(L, line, "Stream field '%.*s' is not a hexadecimal stream",
                    clip((size_t)(fe[5] - fs[5]), 40), fs[5]);
    uint64_t stream = 0;
    if (sptr != 0) {
        size_t *cell = idmap_cell(&L->streams, sptr);
        if (!cell)
            return fail(L, line, "out of memory for the stream map");
        if (*cell == 0)
            *cell = (size_t)++L->next_stream;
        stream = *cell;
    }
    if (check_time(L, line, t_us) != 0)
        return -1;
    char what[48];
    snprintf(what, sizeof what, "pointer 0x%" PRIx64, ptr);
    if (kind == CUH_TRACE_ALLOC) {
        if (size == 0)
            return fail(L, line, "size 0 is not positive (an allocation asks for at least one byte)");
        return add_alloc(L, line, t_us, ptr, L->next_id++, size, stream, what);
    }
    return add_free(L, line, t_us, ptr, 1, stream, 1, size, what);
}

/* ---- entry points ---------------------------------------------------------- */

const char *cuh_trace_kind_name(cuh_trace_kind_t kind)
{
    return kind == CUH_TRACE_ALLOC ? "alloc" : kind == CUH_TRACE_FREE ? "free" : "?";
}

void cuh_trace_free(cuh_trace_t *trace)
{
    if (!trace)
        return;
    free(trace->path);
    free(trace->description);
    free(trace->events);
    free(trace->mark_events);
    memset(trace, 0, sizeof *trace);
}

static int load(loader_t *L, reader_t *r)
{
    cuh_trace_t *t = L->t;
    int fd = open(L->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return fail(L, 0, "cannot open: %s", strerror(errno));
    unsigned char magic[2];
    ssize_t got = read(fd, magic, sizeof magic);
    if (got < 0) {
        int e = errno;
        close(fd);
        return fail(L, 0, "cannot read: %s", strerror(e));
    }
    t->compressed = got == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
    close(fd);
    /* gzread reads a plain file as it is. */
    errno = 0;
    r->gz = gzopen(L->path, "rb");
    if (!r->gz)
        return fail(L, 0, "cannot open: %s", errno ? strerror(errno) : "out of memory");
    gzbuffer(r->gz, READ_CHUNK);
    r->cap = 64 * 1024;
    r->buf = malloc(r->cap);
    if (!r->buf)
        return fail(L, 0, "out of memory");
    if (idmap_init(&L->ids, 1024) != 0 || idmap_init(&L->streams, 16) != 0)
        return fail(L, 0, "out of memory");

    int decided = 0;
    for (;;) {
        char *s;
        size_t n;
        const char *why = NULL;
        int zerr = Z_OK;
        int rc = reader_next(r, &s, &n, &why, &zerr);
        if (rc < 0) {
            const char *what = zerr == Z_BUF_ERROR ? "truncated gzip stream"
                               : zerr == Z_DATA_ERROR ? "corrupt gzip stream"
                               : zerr == Z_ERRNO ? "read error"
                               : "cannot read";
            if (zerr == Z_ERRNO)
                why = strerror(errno);
            else if (!why)
                why = "zlib error";
            /* gzerror says "path: message": the path is already there. */
            size_t pl = strlen(L->path);
            if (strncmp(why, L->path, pl) == 0 && strncmp(why + pl, ": ", 2) == 0)
                why += pl + 2;
            return fail(L, r->lineno + 1, "%s (%s)", what, why);
        }
        if (rc == 0)
            break;
        size_t line = r->lineno;
        if (line > UINT32_MAX)
            return fail(L, line, "too many lines (at most %" PRIu32 ")", UINT32_MAX);
        if (line == 1 && n >= 3 && memcmp(s, "\xef\xbb\xbf", 3) == 0) {
            s += 3;   /* a UTF-8 byte order mark */
            n -= 3;
        }
        if (!decided) {
            const char *b = s, *e = s + n;
            trim(&b, &e);
            if (b == e)
                continue;
            decided = 1;
            if (strncmp(b, "Thread,", 7) == 0) {
                if ((size_t)(e - b) != sizeof RMM_HEADER - 1 || memcmp(b, RMM_HEADER, sizeof RMM_HEADER - 1) != 0)
                    return fail(L, line, "CSV header '%.*s' is not RMM's '" RMM_HEADER "'",
                                clip((size_t)(e - b), 80), b);
                t->format = CUH_TRACE_FORMAT_RMM_CSV;
                continue;
            }
            t->format = CUH_TRACE_FORMAT_V1;
        }
        /* trace:PATH ends every line with a newline: a last line without
         * one was cut short as the file was written (a full disk, a killed
         * program), and its numbers may be cut too. It is left out. */
        if (r->unterminated && t->format == CUH_TRACE_FORMAT_V1 && is_cuheap_recording(t)) {
            t->cut_line = (uint32_t)line;
            break;
        }
        int prc = t->format == CUH_TRACE_FORMAT_V1 ? v1_line(L, line, s, n) : rmm_line(L, line, s, n);
        if (prc != 0)
            return -1;
    }
    if (t->format == CUH_TRACE_FORMAT_RMM_CSV) {
        const char *d = "RMM logging_resource_adaptor CSV";
        free(t->description);
        t->description = strdup(d);
        if (!t->description)
            return fail(L, 0, "out of memory");
    } else {
        t->pytorch_peak_reserved = L->last_comment_ppr;
        t->unfinished = !L->saw_end && is_cuheap_recording(t);
    }
    if (!t->description) {
        t->description = strdup("");
        if (!t->description)
            return fail(L, 0, "out of memory");
    }
    t->live_at_end = t->num_allocs - t->num_frees;
    if (t->num_events > 0 && t->num_events < L->ev_cap) {
        cuh_trace_event_t *shrunk = realloc(t->events, t->num_events * sizeof *shrunk);
        if (shrunk)
            t->events = shrunk;
    }
    return 0;
}

int cuh_trace_load(const char *path, cuh_trace_t *out, char *err, size_t errlen)
{
    loader_t L;
    reader_t r;
    memset(&L, 0, sizeof L);
    memset(&r, 0, sizeof r);
    memset(out, 0, sizeof *out);
    out->pytorch_cache = -1;
    if (err && errlen > 0)
        err[0] = '\0';
    L.path = path ? path : "(null)";
    L.err = err;
    L.errlen = errlen;
    L.t = out;
    int rc;
    if (!path)
        rc = fail(&L, 0, "no path given");
    else if (!(out->path = strdup(path)))
        rc = fail(&L, 0, "out of memory");
    else
        rc = load(&L, &r);
    if (r.gz) {
        int zrc = gzclose_r(r.gz);
        if (rc == 0 && zrc != Z_OK)
            rc = fail(&L, r.lineno, "error closing the file (zlib error %d)", zrc);
    }
    free(r.buf);
    idmap_destroy(&L.ids);
    idmap_destroy(&L.streams);
    if (rc != 0) {
        cuh_trace_free(out);
        return -1;
    }
    return 0;
}
