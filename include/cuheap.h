/* cuheap.h - the public C API of cuheap, a CUDA device-memory allocator.
 *
 * cuheap serves device allocations from its own pools: size classes for small
 * requests, a best-fit arena for large ones, an optional preallocated
 * workspace. Allocation and free are stream-ordered: a block freed on stream s
 * may be handed out again on s at once, and on any other stream only after the
 * GPU work issued on s before the free has finished.
 *
 * Every function returns a cuheap_status_t; cuheap_last_error() gives the
 * sentence that explains the last failure of the calling thread.
 *
 * Configuration comes from CUHEAP_CONF="key:value,key:value" (read at first
 * use) or from cuheap_configure() called before the first allocation.
 */
#ifndef CUHEAP_H
#define CUHEAP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define CUHEAP_API __attribute__((visibility("default")))
#else
#define CUHEAP_API
#endif

#define CUHEAP_VERSION "0.1.0"

/* Same type as cudaStream_t and CUstream; NULL is the legacy default stream. */
struct CUstream_st;
typedef struct CUstream_st *cuheap_stream_t;

/* Pass as `device` to mean the calling thread's current CUDA device. */
#define CUHEAP_CURRENT_DEVICE (-1)

typedef enum cuheap_status_e {
    CUHEAP_OK = 0,
    CUHEAP_ERR_OUT_OF_MEMORY = 1,   /* no memory after release-and-retry */
    CUHEAP_ERR_INVALID_ARGUMENT = 2,
    CUHEAP_ERR_NOT_OWNED = 3,       /* the pointer was not handed out by cuheap */
    CUHEAP_ERR_DOUBLE_FREE = 4,     /* the block was already freed */
    CUHEAP_ERR_DEVICE = 5,          /* the CUDA driver reported an error */
    CUHEAP_ERR_CONFIG = 6,          /* CUHEAP_CONF or cuheap_configure() is wrong */
    CUHEAP_ERR_NO_DRIVER = 7,       /* libcuda.so.1 could not be loaded */
    CUHEAP_ERR_IO = 8               /* a report could not be written */
} cuheap_status_t;

typedef struct cuheap_stat_s {
    uint64_t current;
    uint64_t peak;
} cuheap_stat_t;

/* Statistics of one device's heap. Words as in the README:
 *   requested  bytes the program asked for, still live
 *   allocated  bytes of the blocks handed out (requests rounded up), still live
 *   reserved   bytes held in segments obtained from the device
 *   cached     reserved but not allocated (free blocks, free slab slots)
 *   pending    cached bytes freed but not yet safe for every stream: GPU work
 *              issued before the free may still run */
typedef struct cuheap_stats_s {
    cuheap_stat_t requested;
    cuheap_stat_t allocated;
    cuheap_stat_t reserved;
    cuheap_stat_t cached;
    cuheap_stat_t pending;
    uint64_t num_allocs;
    uint64_t num_frees;
    uint64_t num_segment_allocs;
    uint64_t num_segment_frees;
    uint64_t num_cache_hits;   /* allocations served without asking the device */
    uint64_t num_retries;      /* times cached segments were released to retry */
    uint64_t num_ooms;
    uint64_t largest_free_extent;  /* largest contiguous free range, bytes */
    uint64_t num_free_extents;
    uint64_t limit;            /* bytes; 0 = no limit besides the device */
    uint64_t workspace;        /* bytes of the preallocated workspace */
    uint64_t device_total;     /* the device's memory, 0 until first use */
    uint64_t num_cpu_waits;    /* times cuheap made the CPU wait for the GPU (an event or the device) */
} cuheap_stats_t;

/* Pinned (page-locked) host memory: the cache that serves cudaHostAlloc under
 * LD_PRELOAD, and cuheap_host_alloc. Words as above; in addition
 *   reserved   page-locked bytes held in chunks taken from CUDA
 *   pending    freed, not reused before GPU work issued before the free ends */
typedef struct cuheap_host_stats_s {
    cuheap_stat_t requested;
    cuheap_stat_t allocated;   /* requests rounded up to jemalloc's size classes */
    cuheap_stat_t reserved;
    cuheap_stat_t pending;
    uint64_t num_allocs;
    uint64_t num_frees;
    uint64_t num_chunks;       /* chunks held now */
    uint64_t num_chunk_allocs; /* chunks ever asked of CUDA */
    uint64_t num_waits;        /* allocations that waited for GPU work to release pending memory */
    uint64_t num_ooms;
    uint64_t chunk_size;       /* the pinned_chunk setting */
} cuheap_host_stats_t;

typedef enum cuheap_report_format_e {
    CUHEAP_REPORT_TEXT = 0,
    CUHEAP_REPORT_JSON = 1,   /* schema: include/cuheap_report.schema.json */
    CUHEAP_REPORT_HTML = 2    /* one self-contained page: no network, no other file */
} cuheap_report_format_t;

/* Sets the configuration ("key:value,..."), replacing CUHEAP_CONF. Only before
 * the first allocation; afterwards it returns CUHEAP_ERR_CONFIG. */
CUHEAP_API cuheap_status_t cuheap_configure(const char *conf);

/* Allocates `size` bytes on `device` for use on `stream`. The block is aligned
 * to at least 512 bytes. size 0 gives *ptr = NULL and CUHEAP_OK. */
CUHEAP_API cuheap_status_t cuheap_malloc(void **ptr, size_t size, int device,
                                         cuheap_stream_t stream);

/* Frees a block on `stream`: reusable at once on `stream`, elsewhere once the
 * work issued on `stream` before this call has finished. NULL is a no-op. */
CUHEAP_API cuheap_status_t cuheap_free(void *ptr, int device, cuheap_stream_t stream);

/* cudaMalloc's and cudaFree's promises, for code that does not track which
 * stream uses a block. The block may be used on any stream at once. The free
 * may come while work issued earlier on any stream still uses the block:
 * nobody gets it back before that work has finished, and the call does not
 * wait for it (the blocks wait in batches, one event per stream per batch).
 * The streams covered are the default stream and every stream cuheap has
 * seen: name streams that allocate nothing with cuheap_stream_register.
 * A device-wide block may also be freed with cuheap_free, and a stream-
 * ordered one with cuheap_free_device_wide. NULL frees are no-ops. */
CUHEAP_API cuheap_status_t cuheap_malloc_device_wide(void **ptr, size_t size, int device);
CUHEAP_API cuheap_status_t cuheap_free_device_wide(void *ptr, int device);
/* Tells cuheap that `stream` exists on `device` (device-wide frees then
 * cover it). Under LD_PRELOAD the hooks will do this from cudaStreamCreate. */
CUHEAP_API cuheap_status_t cuheap_stream_register(int device, cuheap_stream_t stream);

/* Call before destroying a stream on which blocks were freed with
 * cuheap_free: cuheap records a last event on it, so the blocks become safe
 * for other streams once its work finishes, and forgets the handle. (cuheap
 * records events on streams lazily; it must never touch a destroyed one.
 * Under LD_PRELOAD the hooks do this from cudaStreamDestroy.) */
CUHEAP_API cuheap_status_t cuheap_stream_retire(int device, cuheap_stream_t stream);

/* Fills *stats for `device`; zeros if the device's heap has not been used. */
CUHEAP_API cuheap_status_t cuheap_get_stats(int device, cuheap_stats_t *stats);

/* Returns every cached segment that holds no live block to the device (waits
 * for pending frees first). The workspace is kept. */
CUHEAP_API cuheap_status_t cuheap_release_cached(int device);

/* Resets the peaks of `device` to the current values. */
CUHEAP_API cuheap_status_t cuheap_reset_peaks(int device);

/* Page-locked host memory, as cudaHostAlloc(ptr, size, flags) gives it:
 * flags 0, or cudaHostAllocPortable (1) and/or cudaHostAllocMapped (2); the
 * calling thread's current device's context is the one it is pinned for
 * unless portable. Served from jemalloc arenas over large pinned chunks
 * (CUHEAP_CONF pinned_chunk); aligned to 4 KiB from 4 KiB up, to 256 bytes
 * below. size 0 gives NULL. Write-combined memory (4) is not served:
 * CUHEAP_ERR_INVALID_ARGUMENT. */
#define CUHEAP_HOST_PORTABLE 0x1u
#define CUHEAP_HOST_MAPPED 0x2u
CUHEAP_API cuheap_status_t cuheap_host_alloc(void **ptr, size_t size, unsigned int flags);
/* cudaFreeHost's promise without its wait: the buffer is not handed out
 * again before all GPU work issued before this call has finished, on every
 * device. NULL is a no-op; a pointer not from cuheap_host_alloc is
 * CUHEAP_ERR_NOT_OWNED. */
CUHEAP_API cuheap_status_t cuheap_host_free(void *ptr);
/* Zeros until the first pinned allocation. */
CUHEAP_API cuheap_status_t cuheap_get_host_stats(cuheap_host_stats_t *stats);

/* Writes a report of every used device to `path` ("-" is stdout). */
CUHEAP_API cuheap_status_t cuheap_dump_report(const char *path, cuheap_report_format_t format);

/* Marks the end of a training step on every device cuheap serves: reports
 * then show, for each of the last 32 steps, how long it took and what the
 * heap asked of the device in it (pages mapped and moved under vmm:1 and the
 * map and unmap calls they took, new device memory, CPU waits for the GPU),
 * and which step mapped the most
 * pages. A step runs from the mark before (or the heap's start) to its own
 * mark. Cheap (a lock per device); cuheap's PyTorch package calls it after
 * every optimizer step. It writes nothing into a trace: cuheap_trace_mark
 * does that. */
CUHEAP_API cuheap_status_t cuheap_mark_step(void);

/* Writes a mark into the trace being recorded (CUHEAP_CONF trace:PATH) as
 * "# mark <t_us> <label>", between the events before and after the call: a
 * training loop marks each step so that a replay can tell the steps apart.
 * `label`: 1 to 200 printable characters, no line break
 * (CUHEAP_ERR_INVALID_ARGUMENT otherwise). CUHEAP_ERR_CONFIG when no trace is
 * being recorded: trace: is not set, or no allocation has opened it yet. */
CUHEAP_API cuheap_status_t cuheap_trace_mark(const char *label);

CUHEAP_API const char *cuheap_status_string(cuheap_status_t status);

/* The message of the calling thread's last failed call, or "" if none. */
CUHEAP_API const char *cuheap_last_error(void);

#ifdef __cplusplus
}
#endif
#endif /* CUHEAP_H */
