/* heap.h - one device's heap: what the entry points call.
 *
 * A heap serves requests for one device from segments it obtains through the
 * device interface. It knows nothing of hooks or of CUDA: streams are opaque
 * numbers and "has the work finished" is a question put to the device.
 *
 * Rules it keeps (each proved in tests/test_heap*.c; in brackets the file of
 * the heap that keeps it, src/heap_internal.h maps them):
 *   - every block is aligned to CUH_ALIGN (512) bytes [heap.c];
 *   - a block freed on stream s is reusable on s at once and on another stream
 *     only after an event recorded on s after the free has completed
 *     [heap_streams.c]; the same holds byte for byte for slab objects
 *     [heap_small.c] and, under vmm:1, for the physical pages behind them,
 *     wherever a page moves, and a page's old mapping stays until that work
 *     is done (the page-rule model) [heap_pages.c];
 *     These hold through the places a freed block may wait outside the
 *     arena: a thread's cache of small objects, a thread's last large block
 *     and the parked large block [heap_tcache.c], a thread's chunks
 *     [heap_chunks.c], and a step plan's room, which takes back only blocks
 *     freed on the plan's stream [heap_plan.c];
 *   - when the device (or the limit) refuses a segment, the heap waits for
 *     pending frees, gives back what thread caches and chunks hold, releases
 *     cached segments and retries before it reports out-of-memory [heap.c, the
 *     allocation ladder; heap_oom.c, the report]; under vmm:1 with pages of
 *     the device's granularity, wholly free pages that add up to a request
 *     serve it [heap_pages.c];
 *   - a block freed device-wide is reused only after the work issued before
 *     the free on every stream, and no such free waits [heap_devicewide.c];
 *     a block that streams named by record_stream use, or that a graph
 *     captured, is held for them [heap_holds.c];
 *   - a double free or a pointer it does not own is an error that leaves the
 *     heap unchanged [heap.c];
 *   - every function is thread-safe [heap.c, heap_tcache.c, heap_chunks.c].
 */
#ifndef CUH_HEAP_H
#define CUH_HEAP_H

#include "callers.h"
#include "config.h"
#include "device.h"
#include "sizeclass.h"

#include <cuheap.h>
#include <stdio.h>

typedef struct cuh_heap_s cuh_heap_t;

typedef enum cuh_oom_cause_e {
    CUH_OOM_NONE = 0,
    CUH_OOM_CAPACITY,        /* live bytes + request exceed what the device can give */
    CUH_OOM_FRAGMENTATION,   /* enough free bytes in total, no free extent large enough */
    CUH_OOM_STREAM_PENDING,  /* enough memory, but still waiting for GPU work */
    CUH_OOM_LIMIT,           /* the configured limit refused it, not the device */
    CUH_OOM_EXTERNAL,        /* memory used outside cuheap is what is missing */
    CUH_OOM_DEVICE_REFUSED   /* the driver refused memory it reported free */
} cuh_oom_cause_t;

/* How many of the blocks holding the most stranded memory a record names. */
#define CUH_OOM_TOP_HOLDERS 4

/* The heap's state at the moment a request failed: the proof of its cause. */
typedef struct cuh_oom_info_s {
    cuh_oom_cause_t cause;
    size_t request;          /* bytes asked for */
    size_t block;            /* the request rounded to a block */
    cuh_stream_t stream;
    size_t live;             /* requested bytes live */
    size_t allocated;
    size_t reserved;
    size_t cached;
    size_t pending;
    size_t largest_free;     /* largest free extent in the heap */
    size_t num_free_extents;
    size_t device_free;
    size_t device_total;
    size_t external;         /* bytes in use on the device outside this heap */
    size_t limit;            /* 0 = none */
    struct {
        uint64_t stream;
        uint64_t pending;    /* freed on this stream, GPU work not yet seen to finish */
    } pending_by_stream[8];  /* the streams with the most pending bytes */
    size_t num_pending_streams;
    double t;                /* seconds since the heap was created */
    char action[384];        /* one concrete thing that would help */
    /* Free memory stranded in mostly empty segments (plain segments at most
     * 1/8 used): blocks cannot move, so the few still in such a segment keep
     * all of it from going back to the device. */
    struct {
        int known;           /* 0: not looked at (a report written before this existed) */
        size_t segments;     /* such segments */
        size_t bytes;        /* their size */
        size_t free;         /* their free bytes */
        size_t blocks;       /* blocks and slabs in them */
        size_t block_bytes;  /* what those take */
        int would_fit;       /* 1: with those segments back, the device (and the limit) had room for the
                              * request and for the blocks that the heap's other free memory could not take */
        uintptr_t top_base;  /* the one with the most free bytes */
        size_t top_size, top_used, top_blocks;
        struct {
            uintptr_t addr;
            size_t size;
        } top_holders[CUH_OOM_TOP_HOLDERS];   /* its largest blocks or slabs, largest first */
        size_t num_top_holders;
    } stranded;
    /* Under vmm:1, where whole free pages move to where they are needed:
     * the free bytes in mapped pages that blocks partly use, which cannot. */
    struct {
        int known;           /* 0: not vmm:1, or a report written before this existed */
        size_t pages;        /* such pages */
        size_t free;         /* the free bytes in them */
    } partial_pages;
    /* Under vmm:1, where a unit of several pages (vmm_unit) moves only whole:
     * the whole free pages of units that blocks still partly use, which
     * cannot move either. */
    struct {
        int known;           /* 0: not vmm:1, or a report written before this existed */
        size_t units;        /* such units */
        size_t free;         /* the bytes of their whole free pages */
    } partial_units;
} cuh_oom_info_t;

const char *cuh_oom_cause_name(cuh_oom_cause_t cause);

/* Creates a heap on `dev` (the heap does not own dev). The workspace is taken
 * at the first allocation. NULL with a message in err on failure. */
cuh_heap_t *cuh_heap_create(cuh_device_t *dev, const cuh_config_t *cfg, char *err, size_t errlen);
/* Returns every segment to the device and frees the heap. */
void cuh_heap_destroy(cuh_heap_t *heap);

/* size 0 gives *addr = 0 and CUHEAP_OK. */
cuheap_status_t cuh_heap_malloc(cuh_heap_t *heap, size_t size, cuh_stream_t stream, uintptr_t *addr);
/* CUHEAP_ERR_NOT_OWNED for a pointer outside every segment of this heap;
 * CUHEAP_ERR_DOUBLE_FREE for a block already free; CUHEAP_ERR_INVALID_ARGUMENT
 * for an address inside a segment that is not the start of a block. */
cuheap_status_t cuh_heap_free(cuh_heap_t *heap, uintptr_t addr, cuh_stream_t stream);
/* Allocates for no stream in particular (cudaMalloc's promise: any stream
 * may use the block at once): only memory no stream's work can still touch. */
cuheap_status_t cuh_heap_malloc_device_wide(cuh_heap_t *heap, size_t size, uintptr_t *addr);
/* The same, and the block starts a segment of its own (a free one at most a
 * quarter larger, or a new one sized to it), so that an IPC handle of it names
 * exactly it: what ipc_safe:1 does for every block, for this one. Under vmm:1
 * an ordinary device-wide allocation. */
cuheap_status_t cuh_heap_malloc_shareable(cuh_heap_t *heap, size_t size, uintptr_t *addr);
/* Frees the block at addr with cudaFree's promise: nobody gets it again
 * before all work issued so far has finished, on every stream the heap
 * knows (see cuh_heap_register_stream) and the default stream. It never
 * waits: blocks freed this way wait in batches, one event per stream per
 * batch. Errors as for cuh_heap_free. */
cuheap_status_t cuh_heap_free_device_wide(cuh_heap_t *heap, uintptr_t addr);

/* A label the allocator gives a block (1-255; 0 for none), kept with the
 * block's record and handed back at its free: the hooks label cudaMalloc's
 * blocks with the calling library, so that cudaFree needs no map of its own
 * to know whose bytes went (callers.h). Only device-wide allocations and
 * allocations under the heap's lock carry one: a labelled malloc never
 * comes from a thread's cache. */
typedef struct cuh_heap_freed_s {
    size_t requested;   /* the bytes the block was asked for */
    unsigned label;     /* its label, 0 for none */
} cuh_heap_freed_t;
/* cuh_heap_malloc (device_wide 0), _device_wide or _shareable (device_wide
 * and shareable), the block labelled `label` (at most 255). */
cuheap_status_t cuh_heap_malloc_labelled(cuh_heap_t *heap, size_t size, int device_wide, int shareable,
                                         cuh_stream_t stream, unsigned label, uintptr_t *addr);
/* cuh_heap_free or _device_wide; on success *freed says what the block
 * was, its label 0 where none was given (or a thread's cache took the free,
 * requested 0 then too). The label is forgotten with the block. */
cuheap_status_t cuh_heap_free_labelled(cuh_heap_t *heap, uintptr_t addr, int device_wide, cuh_stream_t stream,
                                       cuh_heap_freed_t *freed);
/* The requested bytes of the live blocks labelled k, added to by_label[k]
 * (k in 1-255). */
void cuh_heap_live_by_label(cuh_heap_t *heap, uint64_t by_label[256]);
/* The program has a stream the heap may not have seen (it created it):
 * device-wide frees must cover it too. */
cuheap_status_t cuh_heap_register_stream(cuh_heap_t *heap, cuh_stream_t stream);
/* Stream `stream` uses the live block at addr too (PyTorch's record_stream):
 * when the block is freed, it is held until the work issued on every such
 * stream before the free has finished. */
cuheap_status_t cuh_heap_record_stream(cuh_heap_t *heap, uintptr_t addr, cuh_stream_t stream);
/* A CUDA graph capture into pool `pool` begins / ends on this device. While
 * one is underway the heap makes no event call (it would break the capture),
 * and blocks allocated in it, or freed during it, are held for the pool. */
void cuh_heap_capture_begin(cuh_heap_t *heap, uint64_t pool);
void cuh_heap_capture_end(cuh_heap_t *heap);
/* The graphs of `pool` are gone: waits for the device, frees the pool's
 * held blocks, and its live blocks become ordinary ones. */
void cuh_heap_release_pool(cuh_heap_t *heap, uint64_t pool);
/* Replaces the limit (bytes, 0 = none); releases cached segments if the heap
 * holds more than the new limit. */
void cuh_heap_set_limit(cuh_heap_t *heap, size_t limit);
size_t cuh_heap_device_total(cuh_heap_t *heap);
/* The segment holding addr: 1 with its base and size, else 0. */
int cuh_heap_segment_of(cuh_heap_t *heap, uintptr_t addr, uintptr_t *base, size_t *size);
/* 1 when addr lies in the heap's virtual memory reservation (vmm:1), which
 * no legacy IPC handle can name: blocks allocated as shareable get plain
 * segments of their own beside it. */
int cuh_heap_in_virtual_memory(cuh_heap_t *heap, uintptr_t addr);

/* The program is about to destroy `stream`: cuheap records one last fence on
 * it (covering every block freed on it) and never uses the handle again. A
 * later stream with the same handle is a new stream. */
void cuh_heap_retire_stream(cuh_heap_t *heap, cuh_stream_t stream);
/* 1 when addr lies inside one of the heap's segments. */
int cuh_heap_owns(cuh_heap_t *heap, uintptr_t addr);
/* Size of the live block at addr (its request), 0 if none. */
size_t cuh_heap_block_size(cuh_heap_t *heap, uintptr_t addr);

/* Fences for memory outside the heap that keeps cudaFree's rule (pinned host
 * memory: the real cudaFreeHost synchronizes). A fence covers all work
 * issued so far on the device: an event on the default stream and on every
 * live stream the heap knows. It never waits; NULL when the device had to
 * be synchronized instead (nothing left to wait for). During a graph
 * capture its events are recorded at the first query after the capture.
 * cuh_heap_fence_passed: 1 when that work has finished; wait: waits for it
 * first (not possible during a capture: 0). Fences still outstanding when
 * the heap is destroyed go with it. */
typedef struct cuh_heap_fence_s cuh_heap_fence_t;
cuh_heap_fence_t *cuh_heap_fence(cuh_heap_t *heap);
int cuh_heap_fence_passed(cuh_heap_t *heap, cuh_heap_fence_t *fence, int wait);
void cuh_heap_fence_free(cuh_heap_t *heap, cuh_heap_fence_t *fence);

void cuh_heap_stats(cuh_heap_t *heap, cuheap_stats_t *out);
/* Takes in the frees whose GPU work has finished, without waiting. */
void cuh_heap_poll(cuh_heap_t *heap);

/* Device `peer` may access this heap's memory from now on (peer access was
 * enabled from it): under vmm:1 every mapped page and every page mapped
 * later is made accessible to it; plain segments need nothing. */
cuheap_status_t cuh_heap_allow_peer(cuh_heap_t *heap, int peer);
void cuh_heap_reset_peaks(cuh_heap_t *heap);
/* Marks the end of a step: what the heap asked of the device since the last
 * mark (or its start) becomes a step of its reports (cuh_snap_step_t). */
void cuh_heap_mark_step(cuh_heap_t *heap);
cuheap_status_t cuh_heap_release_cached(cuh_heap_t *heap);
/* 1 and *out filled if an allocation has failed since creation (the last one). */
int cuh_heap_last_oom(cuh_heap_t *heap, cuh_oom_info_t *out);
cuh_device_t *cuh_heap_device(cuh_heap_t *heap);

/* Verifies every invariant of the heap's books (for tests): 0, or -1 with a
 * description in msg. Walks everything: not for hot paths. */
int cuh_heap_check(cuh_heap_t *heap, char *msg, size_t len);
/* For tests: the next `ops` allocations and frees behave as if threads had
 * just contended for the heap's lock (heap_tcache.c, "a thread's large block"):
 * each thread then keeps the large block it freed while others allocate. */
void cuh_heap_assume_contention(cuh_heap_t *heap, unsigned ops);
/* For tests: while on, every large allocation through the heap's lock
 * counts as having found it held, so a thread gets a chunk at its 8th
 * (heap_chunks.c) while contention is assumed. */
void cuh_heap_assume_waits(cuh_heap_t *heap, int on);
/* For tests: how many threads' slots hold a cudaFree'd block now
 * (heap_tcache.c, "a thread's cudaFree'd block"), without the heap's lock,
 * which would give them back. */
unsigned cuh_heap_device_wide_slots(cuh_heap_t *heap);
/* For tests: how many of the timeline's samples such a slot took, serving
 * the operation that takes one without giving its block back: at a
 * cudaFree's free (*frees) and at a cudaMalloc's take (*takes). */
void cuh_heap_device_wide_slot_samples(cuh_heap_t *heap, uint64_t *frees, uint64_t *takes);
/* For tests: the timeline samples every `every` operations from now on (at
 * least 1), as it would once it had doubled its interval that often. */
void cuh_heap_set_sample_interval(cuh_heap_t *heap, uint64_t every);
/* For tests and benchmarks: how many chunks threads hold now (heap_chunks.c),
 * their bytes in *bytes and how many were ever lent in *lent (either may be
 * NULL). Gives nothing back. */
size_t cuh_heap_chunks(cuh_heap_t *heap, size_t *bytes, uint64_t *lent);

/* ---- snapshot: the one data model every report is rendered from ---- */

typedef enum { CUH_SNAP_FREE = 0, CUH_SNAP_BLOCK = 1, CUH_SNAP_SLAB = 2 } cuh_snap_kind_t;

typedef struct cuh_snap_extent_s {
    uint64_t addr, size;
    uint64_t requested;       /* block: bytes asked for; slab: bytes of its live objects */
    cuh_snap_kind_t kind;
    uint32_t stream_tag;      /* free: 0 global, else the stream (index + 1) it is private to */
    int pending;              /* free & private: a fence covers it, not yet complete */
    uint32_t size_class;      /* slab */
    uint32_t objs, live;      /* slab */
} cuh_snap_extent_t;

typedef struct cuh_snap_segment_s {
    uint64_t base, size;
    int workspace;
    int virtual_space;        /* a vmm:1 reservation: only `mapped` bytes are memory */
    uint64_t mapped;
    uint64_t page_size;       /* virtual: the device's granularity */
    uint64_t page_maps;       /* virtual: pages mapped since the heap began (new ones and moved ones) */
    uint64_t page_moves;      /* virtual: pages unmapped from free memory to be mapped elsewhere */
    uint64_t map_calls;       /* virtual: map and unmap calls made to the device since the heap began */
    uint64_t kept_pages;      /* virtual: pages where a unit that moved away stays mapped (not memory; not reported) */
    uint64_t kept_hits;       /* virtual: units placed again where they stayed mapped (no call) */
    uint64_t draining;        /* virtual: bytes of old mappings that stay until the work on them is done */
    size_t first_extent, num_extents;
    size_t first_run, num_runs;   /* virtual: its mapped ranges in the snapshot's runs */
} cuh_snap_segment_t;

/* A range of a vmm:1 reservation with physical pages behind it. */
typedef struct cuh_snap_run_s {
    uint64_t addr, size;
} cuh_snap_run_t;

typedef struct cuh_snap_class_s {
    uint64_t size, slab_bytes;
    uint64_t slabs, objs, live, cached;   /* cached: in streams' caches */
} cuh_snap_class_t;

typedef struct cuh_snap_stream_s {
    uint64_t handle;
    uint64_t private_bytes;   /* free, reusable at once by this stream only */
    uint64_t pending_bytes;   /* of those, covered by a fence not yet complete */
    uint64_t fences_outstanding;
} cuh_snap_stream_t;

/* One point of the heap's timeline. */
typedef struct cuh_sample_s {
    double t;                 /* seconds since the heap was created */
    uint64_t live;            /* requested bytes */
    uint64_t reserved;
    uint64_t cached;
} cuh_sample_t;

#define CUH_TIMELINE_SAMPLES 2048

/* One step the program marked (cuh_heap_mark_step, cuheap_mark_step): what
 * the heap asked of the device during it. A step runs from the mark before
 * (or the heap's start) to its own mark. */
typedef struct cuh_snap_step_s {
    uint64_t index;           /* 1 for the first step marked */
    double end;               /* seconds since the heap began, at its mark */
    double seconds;           /* how long it took */
    uint64_t page_maps;       /* virtual: pages mapped in it, new ones and moved ones */
    uint64_t page_moves;      /* virtual: of those, pages moved from free memory (kept mapped where they were) */
    uint64_t map_calls;       /* virtual: map and unmap calls to the device (one a unit, vmm_unit) */
    uint64_t device_allocs;   /* allocations asked of the device: segments, or new pages under vmm:1 */
    uint64_t cpu_waits;       /* times the CPU waited for the GPU */
} cuh_snap_step_t;

/* How many of the last steps a heap keeps (reports show them). */
#define CUH_STEP_HISTORY 32

/* step_plan (heap_plan.c): what the steps' layout did. */
typedef struct cuh_snap_plan_s {
    int active;               /* a plan is in force */
    uint64_t made;            /* plans made */
    uint64_t steps_followed;  /* steps that asked for what the plan in force expected */
    uint64_t placed;          /* blocks placed where a plan put them */
    uint64_t missed;          /* blocks a plan placed whose place was not free (served as always) */
    uint64_t dropped;         /* plans dropped: a step asked for something else */
    uint64_t room_bytes;      /* address space the plan in force holds for its blocks */
    uint64_t found_period;    /* a program that marks no steps: the step found in its allocations (block allocations), 0 none */
    uint64_t steps_found;     /* steps begun where the allocations said (step_detect.h) */
    uint64_t last_period;     /* the period of the last of them */
} cuh_snap_plan_t;

typedef struct cuh_heap_snapshot_s {
    int device;
    const char *device_kind;
    cuheap_stats_t stats;
    cuh_config_t config;
    size_t device_free, device_total;
    int device_free_unknown;  /* the device was not asked (a report at exit) or could not say: device_free is 0 */
    int no_virtual_memory;    /* vmm:1 asked for, the device gave none: the heap runs on plain segments */
    cuh_snap_segment_t *segments;
    size_t num_segments;
    cuh_snap_extent_t *extents;
    size_t num_extents;
    cuh_snap_run_t *runs;
    size_t num_runs;
    cuh_snap_class_t classes[CUH_MAX_CLASSES];
    unsigned num_classes;
    cuh_snap_stream_t *streams;
    size_t num_streams;
    int has_oom;
    cuh_oom_info_t oom;
    cuh_sample_t *timeline;   /* oldest first */
    size_t num_samples;
    double uptime;            /* seconds since the heap was created */
    uint64_t steps_marked;    /* steps marked since the heap began */
    cuh_snap_step_t steps[CUH_STEP_HISTORY];   /* the last num_steps of them, oldest first */
    size_t num_steps;
    cuh_snap_step_t most_maps; /* the step that mapped the most pages (the earliest of equals); index 0: none mapped any */
    cuh_snap_plan_t plan;     /* step_plan: the layout learned from the steps (heap_plan.c) */
} cuh_heap_snapshot_t;

/* A consistent copy of the heap's state; NULL if out of host memory.
 * ask_device 0 makes no device call (at process exit the driver may be
 * gone): device_free is then 0, device_free_unknown 1, and device_total
 * the one known. */
cuh_heap_snapshot_t *cuh_heap_snapshot(cuh_heap_t *heap, int ask_device);
void cuh_heap_snapshot_free(cuh_heap_snapshot_t *snap);

/* Who wrote a report and when: this process and now, or, when a report is
 * rendered again from its JSON (cuheap-report), the original's. */
typedef struct cuh_report_origin_s {
    int pid;
    long long time;           /* seconds since the epoch */
    const char *version;      /* cuheap's version that wrote it */
} cuh_report_origin_t;
cuh_report_origin_t cuh_report_origin_now(void);

/* What a report shows after its devices, each part only when there is
 * something to show: the pinned host memory cache's statistics (NULL when
 * the process never used pinned memory: no such section, and no
 * "pinned_host" in the JSON), and the device memory by the library that
 * asked for it (under LD_PRELOAD; none: no section, no "callers"). */
typedef struct cuh_report_extra_s {
    const cuheap_host_stats_t *pinned;
    const cuh_caller_stat_t *callers;
    size_t num_callers;
} cuh_report_extra_t;

/* report.c, report_html.c: render snapshots (several devices make one report)
 * and then `extra` (NULL: nothing more). */
void cuh_report_text(FILE *out, cuh_report_origin_t origin, cuh_heap_snapshot_t *const *snaps, size_t n,
                     const cuh_report_extra_t *extra);
void cuh_report_json(FILE *out, cuh_report_origin_t origin, cuh_heap_snapshot_t *const *snaps, size_t n,
                     const cuh_report_extra_t *extra);
void cuh_report_html(FILE *out, cuh_report_origin_t origin, cuh_heap_snapshot_t *const *snaps, size_t n,
                     const cuh_report_extra_t *extra);
/* The free bytes snapshot segment g strands, as an out-of-memory record
 * counts them (cuh_oom_info_t.stranded): all of a plain segment's free bytes
 * (not the workspace's) when at most 1/8 of it, and some, is in blocks and
 * slabs; else 0. */
uint64_t cuh_snap_stranded_bytes(const cuh_heap_snapshot_t *s, const cuh_snap_segment_t *g);
/* What every segment of s strands (cuh_snap_stranded_bytes), and in how
 * many segments. */
uint64_t cuh_snap_stranded_total(const cuh_heap_snapshot_t *s, size_t *segments);
/* "X in N mostly empty segments" for all of s's stranded bytes, or "". */
void cuh_report_stranded_note(const cuh_heap_snapshot_t *s, char *out, size_t len);
/* Writes s as a JSON string (quoted and escaped); the one escaping every JSON
 * that cuheap and its tools write uses. */
void cuh_json_write_string(FILE *out, const char *s);
/* Writes an out-of-memory's stranded memory as the JSON object of the report
 * schema ("stranded"), which cuheap-replay's --json also carries. */
void cuh_json_write_stranded(FILE *out, const cuh_oom_info_t *o);

#endif /* CUH_HEAP_H */
