/* bench_preload.c - what cuheap's LD_PRELOAD path costs the CPU per cudaMalloc
 * and cudaFree, without a GPU.
 *
 * Replays a trace (cuheap trace v1) as a program run without PyTorch's cache
 * would make it: every allocation a cudaMalloc, every free a cudaFree, in the
 * trace's order, through the fake CUDA runtime and driver the tests build
 * (host memory stands in for device memory and is never touched, so a 30 GiB
 * trace costs address space only). Run it twice, alone and under
 * LD_PRELOAD=libcuheap.so (scripts/bench.sh does): the difference is
 * cuheap's own time on that path - the hooks, the heap, and the events and
 * stream waits cudaFree's promise needs - with driver calls that cost next to
 * nothing, so it is an upper bound on what cuheap adds, not a GPU figure.
 *
 * usage: bench_preload [--streams N] TRACE
 *   --streams N   create N non-blocking streams first and leave them idle,
 *                 as PyTorch's stream pool does (cuheap must cover them)
 * Prints one line: trace, events, ns per event, and cuheap's statistics when
 * it is preloaded.
 */
#include "fake_cudart.h"
#include "trace_read.h"

#include <cuheap.h>

#include <dlfcn.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

int main(int argc, char **argv)
{
    long streams = 0;
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--streams") && i + 1 < argc) {
            char *end;
            streams = strtol(argv[++i], &end, 10);
            if (*end || streams < 0 || streams > 1024) {
                fprintf(stderr, "bench_preload: bad --streams value '%s' (0 to 1024)\n", argv[i]);
                return 2;
            }
        } else if (!path && argv[i][0] != '-') {
            path = argv[i];
        } else {
            fprintf(stderr, "usage: bench_preload [--streams N] TRACE\n");
            return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "usage: bench_preload [--streams N] TRACE\n");
        return 2;
    }
    cuh_trace_t t;
    char err[512];
    if (cuh_trace_load(path, &t, err, sizeof err) != 0) {
        fprintf(stderr, "bench_preload: %s\n", err);
        return 1;
    }
    void **ptrs = calloc(t.num_events, sizeof *ptrs);
    if (!ptrs) {
        fprintf(stderr, "bench_preload: out of memory for %zu events\n", t.num_events);
        return 1;
    }
    if (cudaFree(NULL) != cudaSuccess) {   /* CUDA's usual initialization */
        fprintf(stderr, "bench_preload: cudaFree(NULL) failed\n");
        return 1;
    }
    for (long i = 0; i < streams; i++) {
        cudaStream_t s;
        if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
            fprintf(stderr, "bench_preload: cannot create stream %ld\n", i);
            return 1;
        }
    }
    double t0 = now_ns();
    for (size_t i = 0; i < t.num_events; i++) {
        const cuh_trace_event_t *e = &t.events[i];
        cudaError_t rc = e->kind == CUH_TRACE_ALLOC ? cudaMalloc(&ptrs[i], (size_t)e->size)
                                                    : cudaFree(ptrs[e->match]);
        if (rc != cudaSuccess) {
            fprintf(stderr, "bench_preload: %s:%u: %s failed with error %d\n", path, e->line,
                    e->kind == CUH_TRACE_ALLOC ? "cudaMalloc" : "cudaFree", rc);
            return 1;
        }
    }
    double ns = (now_ns() - t0) / (double)t.num_events;
    /* cuheap's statistics, when it is preloaded (found by name, not linked). */
    typedef cuheap_status_t (*get_stats_fn)(int, cuheap_stats_t *);
    get_stats_fn get_stats = (get_stats_fn)dlsym(RTLD_DEFAULT, "cuheap_get_stats");
    cuheap_stats_t st;
    if (get_stats && get_stats(0, &st) == CUHEAP_OK)
        printf("%-28s %8zu events %8.1f ns/event  cuheap: %" PRIu64 " allocations, peak reserved %.3f GiB\n", path,
               t.num_events, ns, st.num_allocs, (double)st.reserved.peak / (double)(1ull << 30));
    else
        printf("%-28s %8zu events %8.1f ns/event  (fake CUDA alone)\n", path, t.num_events, ns);
    for (size_t i = 0; i < t.num_events; i++)
        if (t.events[i].kind == CUH_TRACE_ALLOC && t.events[i].match == CUH_TRACE_NO_MATCH)
            cudaFree(ptrs[i]);
    free(ptrs);
    cuh_trace_free(&t);
    return 0;
}
