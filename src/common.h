/* common.h - small helpers every module of cuheap uses: alignment arithmetic,
 * branch hints, the internal-visibility marker and error messages.
 *
 * Internal names start with cuh_ (functions, types cuh_x_t, macros CUH_); the
 * public API in include/cuheap.h starts with cuheap_. Nothing here allocates.
 */
#ifndef CUH_COMMON_H
#define CUH_COMMON_H

#include <stddef.h>
#include <stdint.h>

#define CUH_KiB ((size_t)1 << 10)
#define CUH_MiB ((size_t)1 << 20)
#define CUH_GiB ((size_t)1 << 30)

/* Every block cuheap hands out starts on this boundary and is a multiple of it. */
#define CUH_ALIGN ((size_t)512)
/* Segments are obtained from the device in multiples of this (its page). */
#define CUH_SEGMENT_GRAIN (2 * CUH_MiB)

#define cuh_likely(x) __builtin_expect(!!(x), 1)
/* Code that may run before a sanitizer runtime has set itself up: under
 * LD_PRELOAD, ASan's own start-up calls dlsym, which is cuheap's. */
#define CUH_EARLY __attribute__((no_sanitize("address", "undefined")))
#define cuh_unlikely(x) __builtin_expect(!!(x), 0)

#define cuh_container_of(ptr, type, member) \
    ((type *)(void *)((char *)(ptr) - offsetof(type, member)))

static inline size_t cuh_align_up(size_t x, size_t a) { return (x + a - 1) & ~(a - 1); }
static inline uintptr_t cuh_addr_align_up(uintptr_t x, size_t a)
{
    return (x + (uintptr_t)a - 1) & ~((uintptr_t)a - 1);
}
static inline size_t cuh_min_size(size_t a, size_t b) { return a < b ? a : b; }
static inline size_t cuh_max_size(size_t a, size_t b) { return a > b ? a : b; }

/* 1 if bits [first, last] of the bitmap are all set: two masked words at the
 * ends, whole words between (the heap's mapped-page test, vmm:1). */
static inline int cuh_bits_all_set(const uint64_t *bits, size_t first, size_t last)
{
    uint64_t head = ~(uint64_t)0 << (first & 63), tail = ~(uint64_t)0 >> (63 - (last & 63));
    size_t w = first >> 6, last_w = last >> 6;
    if (w == last_w)
        return (bits[w] & head & tail) == (head & tail);
    if ((bits[w] & head) != head)
        return 0;
    while (++w < last_w)
        if (bits[w] != ~(uint64_t)0)
            return 0;
    return (bits[last_w] & tail) == tail;
}

/* The first index in [from, end) whose bit is set (want 1) or clear (want 0),
 * or end; word by word (the heap's runs of mapped pages, vmm:1). */
static inline size_t cuh_bits_next(const uint64_t *bits, size_t from, size_t end, int want)
{
    while (from < end) {
        uint64_t w = want ? bits[from >> 6] : ~bits[from >> 6];
        w &= ~(uint64_t)0 << (from & 63);
        if (w) {
            size_t i = (from & ~(size_t)63) + (size_t)__builtin_ctzll(w);
            return i < end ? i : end;
        }
        from = (from | 63) + 1;
    }
    return end;
}

/* The number of set bits in [first, end) of the bitmap. */
static inline size_t cuh_bits_count(const uint64_t *bits, size_t first, size_t end)
{
    size_t n = 0;
    while (first < end) {
        size_t stop = cuh_min_size((first | 63) + 1, end);
        uint64_t w = bits[first >> 6] >> (first & 63);
        if (stop - first < 64)
            w &= ((uint64_t)1 << (stop - first)) - 1;
        n += (size_t)__builtin_popcountll(w);
        first = stop;
    }
    return n;
}

/* Copies `in` to `out` (room for len bytes) with every byte a terminal would
 * not print as itself written as an escape (\r, \t, \n, \xNN): messages
 * quote user input, and a carriage return in it would hide their start. */
void cuh_escape_unprintable(const char *in, char *out, size_t len);

/* Formats bytes as "1.50 GiB" into buf (at least 32 bytes); returns buf. */
char *cuh_format_bytes(char *buf, size_t len, uint64_t bytes);

/* Room for an error message: an out-of-memory's is the longest (its
 * figures, what strands memory, up to 383 bytes of advice, and under
 * LD_PRELOAD up to about 400 bytes naming the libraries that hold memory). */
#define CUH_ERROR_MAX 2048

/* The calling thread's last error message (what cuheap_last_error returns). */
void cuh_set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *cuh_get_error(void);
void cuh_clear_error(void);

/* Failures counted over every thread: cuh_failure_mark() before a call,
 * and after it the ..._since(mark) questions answer for what failed on the
 * calling thread during the call; cuh_failure_tick() counts one and gives
 * its number. */
unsigned long cuh_failure_mark(void);
unsigned long cuh_failure_tick(void);
/* The code of a lost device (cuh_device_t.lost) that made a call of the
 * calling thread fail since `mark`, 0 if none: the hooks give it to the
 * program. */
void cuh_note_lost(int code);
int cuh_noted_lost_since(unsigned long mark);

/* Writes "cuheap: <message>\n" to stderr. */
void cuh_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Writes "cuheap: <what>: <the calling thread's last error>" to stderr, one
 * line a second at most; the lines held back are counted in the next. */
void cuh_log_error_rate_limited(const char *what);
/* Writes "cuheap: <message>\n" to stderr under the same limit: for what a
 * failing device can make the heap say at every call. */
void cuh_log_rate_limited(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif /* CUH_COMMON_H */
