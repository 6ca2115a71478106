/* support.c - the helpers every LD_PRELOAD test program links (support.h). */
#define _GNU_SOURCE
#include "support.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

int expect(int ok, const char *fmt, ...)
{
    if (ok)
        return 1;
    failures++;
    va_list ap;
    va_start(ap, fmt);
    fputs("FAIL: ", stdout);
    vprintf(fmt, ap);
    fputc('\n', stdout);
    va_end(ap);
    fflush(stdout);
    return 0;
}

void heap_stats_of(int device, cuheap_stats_t *out)
{
    memset(out, 0, sizeof *out);
    void *sym = dlsym(RTLD_DEFAULT, "cuheap_get_stats");
    cuheap_status_t (*get_stats)(int, cuheap_stats_t *);
    memcpy(&get_stats, &sym, sizeof sym);
    if (expect(get_stats != NULL, "cuheap_get_stats is not in the process (libcuheap.so not preloaded)"))
        expect(get_stats(device, out) == CUHEAP_OK, "cuheap_get_stats(%d) failed", device);
}

void heap_stats(cuheap_stats_t *out)
{
    heap_stats_of(0, out);
}

void host_stats(cuheap_host_stats_t *out)
{
    memset(out, 0, sizeof *out);
    void *sym = dlsym(RTLD_DEFAULT, "cuheap_get_host_stats");
    cuheap_status_t (*get_stats)(cuheap_host_stats_t *);
    memcpy(&get_stats, &sym, sizeof sym);
    if (expect(get_stats != NULL, "cuheap_get_host_stats is not in the process (libcuheap.so not preloaded)"))
        expect(get_stats(out) == CUHEAP_OK, "cuheap_get_host_stats failed");
}

#define LOAD(field, name)                                                    \
    do {                                                                     \
        void *sym_ = lookup(name);                                           \
        if (!sym_) {                                                         \
            expect(0, "the fake driver has no %s", name);                    \
            exit(finish("setup"));                                           \
        }                                                                    \
        memcpy(&out->field, &sym_, sizeof sym_);                             \
    } while (0)

void fake_helpers_load(fake_helpers_t *out, void *(*lookup)(const char *name))
{
    LOAD(calls, "fake_cuda_calls");
    LOAD(hold, "fake_cuda_hold");
    LOAD(enqueue_check, "fake_cuda_enqueue_check");
    LOAD(enqueue_fill, "fake_cuda_enqueue_fill");
    LOAD(complete, "fake_cuda_complete");
    LOAD(complete_all, "fake_cuda_complete_all");
    LOAD(corrupt_bytes, "fake_cuda_corrupt_bytes");
    LOAD(alloc_foreign, "fake_cuda_alloc_foreign");
    LOAD(stream_create_unseen, "fake_cuda_stream_create_unseen");
    LOAD(set_capturing, "fake_cuda_set_capturing");
    LOAD(pause_ctx_events, "fake_cuda_pause_ctx_events");
}

fake_cuda_calls_t fake_calls(const fake_helpers_t *fake)
{
    fake_cuda_calls_t c;
    fake->calls(&c);
    return c;
}

void pattern_fill(void *p, size_t n, unsigned seed)
{
    unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)(seed * 131u + i * 7u + (i >> 8));
}

int pattern_intact(const void *p, size_t n, unsigned seed)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != (unsigned char)(seed * 131u + i * 7u + (i >> 8)))
            return 0;
    return 1;
}

int finish(const char *mode)
{
    if (failures)
        printf("%s: %d expectation%s failed\n", mode, failures, failures == 1 ? "" : "s");
    else
        printf("ok %s\n", mode);
    return failures ? 1 : 0;
}
