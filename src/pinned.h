/* pinned.h - the pinned host memory cache: cudaHostAlloc served from jemalloc
 * arenas whose memory comes in large page-locked chunks.
 *
 * Page-locking is slow (cudaHostAlloc and cudaFreeHost cost microseconds to
 * milliseconds, and cudaFreeHost synchronizes the device), so programs that
 * allocate pinned buffers per batch pay it on every batch. Here jemalloc
 * manages pinned memory like any host memory: each arena gets its extents
 * from chunks obtained once from the chunk source (cuMemHostAlloc through the
 * device interface), and never gives them back while the process lives.
 *
 * Rules it keeps (each has a test in tests/test_pinned.c):
 *   - flags are honoured: one arena per flag set (portable, mapped), and for
 *     memory that is not portable one per device, since such memory is
 *     pinned only for the context that allocated it; an extent never spans
 *     two chunks, so every allocation lies in one page-locked allocation
 *     with exactly the flags asked for;
 *   - cudaFreeHost's promise: a freed buffer is not handed out again before
 *     the GPU work issued before the free has finished on every device
 *     (fences from the source); freeing never waits for it, and an
 *     allocation waits only when memory waiting that way outgrows both the
 *     chunk size and the live allocations;
 *   - a pointer it did not hand out is not owned (the hooks pass it to
 *     CUDA); a double free or a pointer inside an allocation is an error
 *     that changes nothing;
 *   - thread-safe.
 * It knows neither CUDA nor the device heaps: the source does.
 */
#ifndef CUH_PINNED_H
#define CUH_PINNED_H

#include <cuheap.h>
#include <stddef.h>

/* Flags cuheap serves (cudaHostAllocPortable, cudaHostAllocMapped; the
 * driver's CU_MEMHOSTALLOC_* have the same values). Write-combined memory is
 * left to CUDA: jemalloc keeps its metadata in the arena's memory, which the
 * host reads slowly when it is write-combined. */
#define CUH_PINNED_PORTABLE CUHEAP_HOST_PORTABLE
#define CUH_PINNED_MAPPED CUHEAP_HOST_MAPPED
#define CUH_PINNED_SERVED_FLAGS (CUH_PINNED_PORTABLE | CUH_PINNED_MAPPED)

typedef struct cuh_pinned_s cuh_pinned_t;

/* Where chunks and fences come from (the runtime, in api.c). */
typedef struct cuh_pinned_source_s {
    void *ctx;
    /* A page-locked chunk of `size` bytes with `flags`, allocated in
     * `device`'s context; CUHEAP_OK, CUHEAP_ERR_OUT_OF_MEMORY, or another
     * status with cuh_set_error's message. */
    cuheap_status_t (*chunk_alloc)(void *ctx, int device, unsigned flags, size_t size, void **ptr);
    void (*chunk_free)(void *ctx, int device, void *ptr, size_t size);
    /* A fence over all GPU work issued so far, on every device; NULL when
     * there is nothing to wait for. passed: 1 when that work has finished
     * (wait: waits first; 0 if it cannot wait now). */
    void *(*fence)(void *ctx);
    int (*fence_passed)(void *ctx, void *fence, int wait);
    void (*fence_free)(void *ctx, void *fence);
} cuh_pinned_source_t;

/* NULL with a message in err when jemalloc cannot make an arena. */
cuh_pinned_t *cuh_pinned_create(const cuh_pinned_source_t *source, size_t chunk_size, char *err, size_t errlen);
/* Destroys the arenas and returns every chunk (tests; a process that exits
 * leaves its pinned memory to the driver). */
void cuh_pinned_destroy(cuh_pinned_t *pinned);

/* `size` bytes (> 0) with `flags` (within CUH_PINNED_SERVED_FLAGS) for a
 * thread whose device is `device`; aligned to 256 bytes, to the page (4 KiB)
 * from 4 KiB up. CUHEAP_ERR_OUT_OF_MEMORY with a message when no chunk can be
 * had; CUHEAP_ERR_NOT_OWNED from a cache a device reset retired. */
cuheap_status_t cuh_pinned_alloc(cuh_pinned_t *pinned, size_t size, unsigned flags, int device, void **ptr);
/* CUHEAP_ERR_NOT_OWNED for a pointer outside every chunk; an error with a
 * message for a double free or a pointer inside an allocation. */
cuheap_status_t cuh_pinned_free(cuh_pinned_t *pinned, void *ptr);
/* 1 when ptr lies in one of the cache's chunks. */
int cuh_pinned_owns(cuh_pinned_t *pinned, const void *ptr);
/* A device reset destroys the context and the page-locked memory allocated
 * in it. cuh_pinned_uses_device: 1 when a chunk was allocated in `device`'s
 * context. cuh_pinned_abandon: the cache serves no more allocations (the
 * runtime makes a new one); frees of its allocations only update its books,
 * since its arenas may keep their metadata in memory that is gone. */
int cuh_pinned_uses_device(cuh_pinned_t *pinned, int device);
void cuh_pinned_abandon(cuh_pinned_t *pinned);
/* Takes back the frees whose GPU work has finished, without waiting. */
void cuh_pinned_poll(cuh_pinned_t *pinned);
void cuh_pinned_stats(cuh_pinned_t *pinned, cuheap_host_stats_t *out);

#endif /* CUH_PINNED_H */
