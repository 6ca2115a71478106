/* log.c - messages: the per-thread last-error string behind cuheap_last_error
 * and the one behind a device's failed call (cuh_dev_error_text), stderr
 * logging with the "cuheap:" prefix, byte formatting for humans, and the
 * escaping of bytes a terminal would act on in what a message quotes.
 */
#include "common.h"
#include "device.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <time.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char cuh_error_text[CUH_ERROR_MAX];
static _Thread_local char cuh_device_error_text[CUH_DEV_ERROR_LEN];

char *cuh_dev_error_text(const cuh_device_t *dev)
{
    (void)dev;
    return cuh_device_error_text;
}

void cuh_dev_keep_lost_text(cuh_device_t *dev)
{
    int none = 0;
    if (!atomic_compare_exchange_strong(&dev->lost_told, &none, 1))
        return;   /* the first call to lose the device told why */
    memcpy(dev->lost_error, cuh_device_error_text, sizeof dev->lost_error);
    atomic_store_explicit(&dev->lost_told, 2, memory_order_release);
}

const char *cuh_dev_lost_text(const cuh_device_t *dev)
{
    return atomic_load_explicit(&dev->lost_told, memory_order_acquire) == 2 ? dev->lost_error : "";
}

void cuh_set_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cuh_error_text, sizeof cuh_error_text, fmt, ap);
    va_end(ap);
}

const char *cuh_get_error(void) { return cuh_error_text; }

void cuh_clear_error(void) { cuh_error_text[0] = '\0'; }

/* Failures noted, over every thread: a mark taken when a call starts tells
 * at its end, from one atomic load and no thread-local access, whether
 * anything can have failed during it (cudaMalloc and cudaFree ask, at every
 * call: issue 45). */
static _Atomic unsigned long cuh_failures;

unsigned long cuh_failure_mark(void) { return atomic_load_explicit(&cuh_failures, memory_order_relaxed); }

unsigned long cuh_failure_tick(void) { return atomic_fetch_add_explicit(&cuh_failures, 1, memory_order_relaxed) + 1; }

static _Thread_local struct {
    int code;
    unsigned long seq;   /* its tick */
} cuh_lost_note;

void cuh_note_lost(int code)
{
    cuh_lost_note.code = code;
    cuh_lost_note.seq = cuh_failure_tick();
}

int cuh_noted_lost_since(unsigned long mark)
{
    if (cuh_failure_mark() == mark)
        return 0;
    return cuh_lost_note.seq > mark ? cuh_lost_note.code : 0;
}

void cuh_log(const char *fmt, ...)
{
    char line[CUH_ERROR_MAX + 256];   /* an error message and what is said around it */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cuheap: %s\n", line);
}

void cuh_escape_unprintable(const char *in, char *out, size_t len)
{
    size_t o = 0;
    if (!len)
        return;
    for (const unsigned char *c = (const unsigned char *)in; *c; c++) {
        char piece[5];
        size_t n = 1;
        piece[0] = (char)*c;
        if (*c == '\r' || *c == '\t' || *c == '\n')
            n = (size_t)snprintf(piece, sizeof piece, "\\%c", *c == '\r' ? 'r' : *c == '\t' ? 't' : 'n');
        else if (*c < 0x20 || *c >= 0x7f)
            n = (size_t)snprintf(piece, sizeof piece, "\\x%02x", *c);
        if (o + n >= len)
            break;   /* cut, as snprintf would, but never inside an escape */
        memcpy(out + o, piece, n);
        o += n;
    }
    out[o] = '\0';
}

char *cuh_format_bytes(char *buf, size_t len, uint64_t bytes)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    unsigned u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%" PRIu64 " B", bytes);
    else
        snprintf(buf, len, "%.2f %s", v, units[u]);
    return buf;
}

void cuh_log_rate_limited(const char *fmt, ...)
{
    static _Atomic long last_second = -1;
    static _Atomic unsigned long held_back;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long prev = atomic_load(&last_second);
    if (now.tv_sec == prev || !atomic_compare_exchange_strong(&last_second, &prev, (long)now.tv_sec)) {
        atomic_fetch_add(&held_back, 1);
        return;
    }
    unsigned long skipped = atomic_exchange(&held_back, 0);
    char line[CUH_ERROR_MAX + 256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (skipped)
        cuh_log("%s (%lu similar messages in the last second not shown)", line, skipped);
    else
        cuh_log("%s", line);
}

void cuh_log_error_rate_limited(const char *what)
{
    cuh_log_rate_limited("%s: %s", what, cuh_get_error());
}
