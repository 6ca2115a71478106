/* config.h - cuheap's settings, parsed from CUHEAP_CONF="key:value,key:value".
 *
 * The syntax is the one PyTorch users know from PYTORCH_CUDA_ALLOC_CONF. Every
 * key lives in one table in config.c (name, kind of value, default, meaning);
 * the parser validates each value there and nowhere else. An unknown key or a
 * bad value is an error that names it and lists the valid keys: nothing is
 * silently ignored.
 */
#ifndef CUH_CONFIG_H
#define CUH_CONFIG_H

#include <stddef.h>

typedef struct cuh_config_s {
    /* First the settings every allocation and free reads (heap.h: the heap
     * keeps them in the cache line of its device pointer). */
    size_t small_max;        /* requests up to this size come from size classes */
    size_t vmm;              /* 1: general region on CUDA virtual memory */
    size_t step_plan;        /* vmm: lay out each step's blocks as the steps before asked for them (heap_plan.c) */
    size_t wait_before_grow; /* 1: a device-wide malloc waits for cudaFree batches before growing */
    size_t device_fences;    /* 1: cudaFree batches are fenced by one event and one wait over the device */
    size_t ipc_safe;         /* 1: every block starts a segment of its own */
    size_t thread_cache;     /* most bytes of small objects each thread keeps for itself; 0 = none */
    size_t workspace;        /* bytes preallocated at first use; 0 = none */
    size_t limit_bytes;      /* cap on reserved bytes; 0 = none */
    double limit_fraction;   /* cap as a fraction of device memory; 0 = none */
    size_t segment_min;      /* smallest segment asked of the device */
    double grow_fraction;    /* a new segment is at least this share of reserved */
    double vmm_margin;       /* vmm: new pages up to (1 + margin) x live peak, then move pages */
    size_t vmm_page;         /* vmm: bytes of physical memory per page (rounded to the device's granularity) */
    size_t vmm_unit;         /* vmm: most bytes of one physical allocation (a unit), mapped and moved as one; 0: auto */
    size_t reuse_across_streams; /* 1: before growing, streams' pending frees serve others, ordered on the GPU */
    size_t meminfo_cached;   /* 1: hooked cudaMemGetInfo counts ready cached bytes as free */
    size_t pinned;           /* 1: hooked cudaHostAlloc & co. are served from the pinned cache */
    size_t pinned_chunk;     /* bytes of page-locked memory taken from CUDA at a time */
    char report[512];        /* report path ("%p" = process id), "" = none */
    char trace[512];         /* event trace path ("%p" = process id), "" = none */
    char ipc_callers[512];   /* a device-wide malloc from a library whose file name contains this
                                gets a segment of its own ("" = none) */
} cuh_config_t;

void cuh_config_defaults(cuh_config_t *cfg);

/* The ways in besides the C API: as PyTorch's allocator (the plugin, whose
 * defaults are the C API's) and in place of CUDA's own calls (LD_PRELOAD,
 * whose defaults differ). */
#define CUH_WAY_PLUGIN 1u
#define CUH_WAY_INTERPOSER 2u

/* The defaults of a heap reached through `ways` (CUH_WAY_* bits; 0 is the C
 * API): one place for every way's defaults, used by the library and by
 * cuheap-replay --way alike. */
void cuh_config_defaults_for(cuh_config_t *cfg, unsigned ways);

/* Parses `text` over the values already in *cfg. Returns 0, or -1 with a
 * message in err that names the key and lists the valid ones. */
int cuh_config_parse(const char *text, cuh_config_t *cfg, char *err, size_t errlen);

/* The limit in bytes for a device of `device_total` bytes; 0 when unlimited. */
size_t cuh_config_limit(const cuh_config_t *cfg, size_t device_total);

/* Writes the table of keys (name, default, meaning) as Markdown. */
void cuh_config_print_table(void *file /* FILE* */);

/* Writes "key:value,..." with every key's effective value into buf. */
void cuh_config_format(const cuh_config_t *cfg, char *buf, size_t len);

#endif /* CUH_CONFIG_H */
