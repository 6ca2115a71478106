/* torch_model.h - what PyTorch's own CUDA allocator would reserve for a trace.
 *
 * cuheap-replay answers "would this job fit in N GiB" for cuheap; users also
 * ask it of the allocator they run today. This is a model of PyTorch's
 * CUDACachingAllocator (PyTorch 2.x, default settings) in its two modes,
 * native (a cudaMalloc'd segment per cache miss) and expandable_segments:True
 * (one growing range of virtual memory per stream and pool), replayed over a
 * trace's allocations and frees: the same rounding, pools, best fit,
 * splitting and merging, and the same release-and-retry when the device is
 * full. It knows nothing of cuheap's heap and calls no CUDA: tool-side code,
 * never in the library.
 *
 * What it leaves out, and so cannot see: record_stream and CUDA events (a
 * trace frees a block when the program does), CUDA graph pools, and the
 * settings that change PyTorch's rules (max_split_size_mb,
 * roundup_power2_divisions, garbage_collection_threshold). Equal-sized free
 * blocks are told apart by address, as in PyTorch, with new native segments
 * at ever higher addresses. A full device refuses a segment (native) or a
 * page (expandable) as cudaMalloc and cuMemCreate do; an expandable range
 * spans 1.125 times the device.
 */
#ifndef CUH_TORCH_MODEL_H
#define CUH_TORCH_MODEL_H

#include "trace_read.h"

#include <stddef.h>
#include <stdint.h>

typedef enum cuh_torch_mode_e {
    CUH_TORCH_NATIVE = 0,      /* PyTorch's default caching allocator */
    CUH_TORCH_EXPANDABLE = 1,  /* PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True */
    CUH_TORCH_NUM_MODES = 2
} cuh_torch_mode_t;

typedef struct cuh_torch_result_s {
    uint64_t peak_reserved;    /* most bytes reserved at once */
    uint64_t device_allocs;    /* native: cudaMalloc calls; expandable: pages created */
    uint64_t releases;         /* cache releases before a retry (num_alloc_retries) */
    int oom;                   /* 1: an allocation failed after the retry */
    size_t oom_event;          /* its event index */
    uint64_t oom_request;      /* bytes it asked for */
    uint64_t oom_reserved;     /* bytes reserved when it failed */
    uint64_t oom_live;         /* bytes the program had live then */
} cuh_torch_result_t;

/* The device the model runs on: `capacity` bytes, `external` of them used by
 * others, and, when `limit` is not 0, the per-process cap PyTorch's
 * set_per_process_memory_fraction sets (checked, as PyTorch does, against
 * the whole size of a new segment before any device call, in either mode). */
typedef struct cuh_torch_device_s {
    uint64_t capacity;
    uint64_t external;
    uint64_t limit;
} cuh_torch_device_t;

/* Replays trace t through the model of `mode` on device d. Returns 0 with
 * *out filled (an out-of-memory is a result), or -1 with a message in err
 * when host memory ran out. */
int cuh_torch_model_run(const cuh_trace_t *t, cuh_torch_mode_t mode, const cuh_torch_device_t *d,
                        cuh_torch_result_t *out, char *err, size_t errlen);

/* The smallest device capacity, to within `grain` bytes, on which the model
 * of `mode` replays t without running out of memory (d's external memory
 * and limit kept), searched from t's live peak up to d->capacity; `top` is
 * the model's run on d itself, and *found is 0 when it ran out of memory.
 * Returns 0, or -1 as cuh_torch_model_run. */
int cuh_torch_model_min_capacity(const cuh_trace_t *t, cuh_torch_mode_t mode, const cuh_torch_device_t *d,
                                 const cuh_torch_result_t *top, uint64_t grain, uint64_t *result, int *found,
                                 char *err, size_t errlen);

/* "native" or "expandable". */
const char *cuh_torch_mode_name(cuh_torch_mode_t mode);

#endif /* CUH_TORCH_MODEL_H */
