/* trace_write.c - the trace recorder (see trace_write.h).
 *
 * Lines go to a fixed 64 KiB buffer written with write(2) when full, not
 * through stdio: a forked child that exits flushes stdio buffers, and would
 * write a second copy of whatever the parent had buffered. Allocation ids
 * count up from 0; streams are numbered in order of first use, 0 for the
 * legacy default stream, as the format asks.
 */
#include "trace_write.h"

#include "common.h"
#include "ptrmap.h"

#include <cuheap.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BUFFER 65536
#define MAX_STREAMS 1024

struct cuh_trace_writer_s {
    pthread_mutex_t lock;
    int fd;
    pid_t owner;
    struct timespec t0;
    cuh_ptrmap_t live;           /* ptr -> id + 1 */
    uint64_t next_id, allocs, frees;
    uintptr_t streams[MAX_STREAMS];
    size_t num_streams;
    size_t used;
    int failed;
    int finished;
    char buf[BUFFER];
};

static void flush_locked(cuh_trace_writer_t *w)
{
    size_t off = 0;
    while (off < w->used && !w->failed) {
        ssize_t n = write(w->fd, w->buf + off, w->used - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            cuh_log("trace: writing failed (%s); the rest of the trace is lost", strerror(errno));
            w->failed = 1;
            break;
        }
        off += (size_t)n;
    }
    w->used = 0;
}

static void emit_locked(cuh_trace_writer_t *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void emit_locked(cuh_trace_writer_t *w, const char *fmt, ...)
{
    if (w->used > BUFFER - 256)
        flush_locked(w);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(w->buf + w->used, BUFFER - w->used, fmt, ap);
    va_end(ap);
    if (n > 0)
        w->used += (size_t)n < BUFFER - w->used ? (size_t)n : BUFFER - w->used - 1;
}

static uint64_t micros(const cuh_trace_writer_t *w)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)(now.tv_sec - w->t0.tv_sec) * 1000000u + (uint64_t)((now.tv_nsec - w->t0.tv_nsec) / 1000);
}

cuh_trace_writer_t *cuh_trace_writer_open(const char *path, char *err, size_t errlen)
{
    char file[4096];
    size_t o = 0;
    for (const char *p = path; *p && o + 24 < sizeof file; p++) {
        if (p[0] == '%' && p[1] == 'p') {
            o += (size_t)snprintf(file + o, sizeof file - o, "%d", (int)getpid());
            p++;
        } else {
            file[o++] = *p;
        }
    }
    file[o] = '\0';
    cuh_trace_writer_t *w = calloc(1, sizeof *w);
    if (!w || cuh_ptrmap_init(&w->live, 1024)) {
        free(w);
        snprintf(err, errlen, "trace:%s: out of host memory", path);
        return NULL;
    }
    w->fd = open(file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        snprintf(err, errlen, "trace:%s: cannot create %s: %s", path, file, strerror(errno));
        cuh_ptrmap_destroy(&w->live);
        free(w);
        return NULL;
    }
    pthread_mutex_init(&w->lock, NULL);
    w->owner = getpid();
    clock_gettime(CLOCK_MONOTONIC, &w->t0);
    w->streams[w->num_streams++] = 0;   /* the legacy default stream is 0 */
    emit_locked(w, "# trace v1 source=cuheap-%s pid=%d\n", CUHEAP_VERSION, (int)w->owner);
    return w;
}

static unsigned stream_number_locked(cuh_trace_writer_t *w, uintptr_t stream)
{
    for (size_t i = 0; i < w->num_streams; i++)
        if (w->streams[i] == stream)
            return (unsigned)i;
    if (w->num_streams == MAX_STREAMS)
        return MAX_STREAMS - 1;   /* past 1024 streams, the last number is shared */
    w->streams[w->num_streams] = stream;
    return (unsigned)w->num_streams++;
}

void cuh_trace_writer_alloc(cuh_trace_writer_t *w, uintptr_t ptr, size_t size, uintptr_t stream)
{
    pthread_mutex_lock(&w->lock);
    if (w->finished) {
        pthread_mutex_unlock(&w->lock);
        return;
    }
    uint64_t id = w->next_id++;
    if (cuh_ptrmap_insert(&w->live, ptr, (void *)(uintptr_t)(id + 1)) == 0) {
        emit_locked(w, "a %llu %llu %zu %u\n", (unsigned long long)micros(w), (unsigned long long)id, size,
                    stream_number_locked(w, stream));
        w->allocs++;
    }
    pthread_mutex_unlock(&w->lock);
}

void cuh_trace_writer_free(cuh_trace_writer_t *w, uintptr_t ptr)
{
    pthread_mutex_lock(&w->lock);
    if (w->finished) {
        pthread_mutex_unlock(&w->lock);
        return;
    }
    uintptr_t id = (uintptr_t)cuh_ptrmap_remove(&w->live, ptr);
    if (id) {
        emit_locked(w, "f %llu %llu\n", (unsigned long long)micros(w), (unsigned long long)(id - 1));
        w->frees++;
    }
    pthread_mutex_unlock(&w->lock);
}

void cuh_trace_writer_mark(cuh_trace_writer_t *w, const char *label)
{
    pthread_mutex_lock(&w->lock);
    if (!w->finished)
        emit_locked(w, "# mark %llu %s\n", (unsigned long long)micros(w), label);
    pthread_mutex_unlock(&w->lock);
}

void cuh_trace_writer_finish(cuh_trace_writer_t *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->lock);
    if (!w->finished) {
        if (getpid() == w->owner) {
            emit_locked(w, "# end allocs=%llu frees=%llu live_at_end=%zu\n", (unsigned long long)w->allocs,
                        (unsigned long long)w->frees, w->live.count);
            flush_locked(w);
        }
        close(w->fd);
        w->finished = 1;
    }
    pthread_mutex_unlock(&w->lock);
}

void cuh_trace_writer_close(cuh_trace_writer_t *w)
{
    if (!w)
        return;
    cuh_trace_writer_finish(w);
    pthread_mutex_destroy(&w->lock);
    cuh_ptrmap_destroy(&w->live);
    free(w);
}
