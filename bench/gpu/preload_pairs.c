/* preload_pairs.c - what a cudaMalloc+cudaFree pair costs a program on a real
 * GPU, by size, under whatever is preloaded (cuheap, the floor of
 * bench/torch/floor.h, or nothing: CUDA's own, which synchronizes), and what
 * the fence behind cudaFree's promise costs by itself.
 *
 * PyTorch without its cache makes such a pair per tensor; issue 45 holds
 * cuheap's LD_PRELOAD path to the floor's cost. The program calls the CUDA
 * runtime (shared, so that LD_PRELOAD reaches it) in a loop, with the GPU
 * idle, so the figures are the host's work and the driver calls each pair
 * makes: the best of 5 timed loops per size.
 *
 *   preload_pairs [PAIRS] [--fences]
 *     PAIRS     pairs per timed loop (default 200000)
 *     --fences  also time an event recorded over the context and its query
 *               (cuCtxRecordEvent + cuEventQuery: the fence cuheap records
 *               for cudaFree'd memory), and one on the default stream
 *
 * STREAMS=N first creates N idle non-blocking streams, as PyTorch's stream
 * pool does. Prints one line: "pairs: SIZE:NS ...". Built and run by
 * scripts/gpu-bench.sh (part pairs).
 */
#define _POSIX_C_SOURCE 199309L
#include <cuda.h>
#include <cuda_runtime.h>

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

/* The best of 5 loops of `n` pairs of `size` bytes, ns a pair; -1 on failure. */
static double pairs(size_t size, long n)
{
    void *p;
    for (int i = 0; i < 1000; i++) {   /* warm */
        if (cudaMalloc(&p, size) != cudaSuccess)
            return -1;
        cudaFree(p);
    }
    double best = 1e300;
    for (int r = 0; r < 5; r++) {
        double t0 = now_ns();
        for (long i = 0; i < n; i++) {
            if (cudaMalloc(&p, size) != cudaSuccess)
                return -1;
            cudaFree(p);
        }
        double t = (now_ns() - t0) / (double)n;
        best = t < best ? t : best;
    }
    return best;
}

/* The best of 5 loops of `n` fences recorded and queried: over the context
 * (all_streams) or on the default stream. */
static double fences(long n, int all_streams)
{
    CUcontext ctx;
    CUevent ev;
    if (cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
        return -1;
    double best = 1e300;
    for (int r = 0; r < 5; r++) {
        double t0 = now_ns();
        for (long i = 0; i < n; i++) {
            if ((all_streams ? cuCtxRecordEvent(ctx, ev) : cuEventRecord(ev, 0)) != CUDA_SUCCESS)
                return -1;
            (void)cuEventQuery(ev);
        }
        double t = (now_ns() - t0) / (double)n;
        best = t < best ? t : best;
    }
    cuEventDestroy(ev);
    return best;
}

int main(int argc, char **argv)
{
    long n = 200000;
    int with_fences = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--fences") == 0) {
            with_fences = 1;
        } else {
            char *end;
            n = strtol(argv[i], &end, 10);
            if (*end || n < 1) {
                fprintf(stderr, "usage: %s [PAIRS] [--fences]\n", argv[0]);
                return 2;
            }
        }
    }
    if (cudaFree(0) != cudaSuccess) {
        fprintf(stderr, "preload_pairs: no CUDA device\n");
        return 1;
    }
    const char *s = getenv("STREAMS");
    for (int i = 0, k = s ? atoi(s) : 0; i < k; i++) {
        cudaStream_t st;
        cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    }
    static const size_t sizes[] = {512, 65536, 1 << 20, 64 << 20};
    printf("pairs:");
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        double ns = pairs(sizes[i], n);
        if (ns < 0) {
            printf("\npreload_pairs: cudaMalloc(%zu) failed\n", sizes[i]);
            return 1;
        }
        printf(" %zu:%.0f", sizes[i], ns);
    }
    printf("\n");
    if (with_fences)
        printf("fence over the context, recorded and queried: %.0f ns; on the default stream: %.0f ns\n",
               fences(n, 1), fences(n, 0));
    return 0;
}
