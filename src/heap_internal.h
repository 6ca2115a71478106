/* heap_internal.h - the heap's types, and what its rooms call of each other.
 *
 * The heap of one device (heap.h is its public interface, and lists the
 * rules it keeps) lives in rooms, one concern each, over this header:
 *   heap.c             the front: the public heap API, a request's path, the allocation ladder
 *   heap_streams.c     streams, events and fences; fences for memory outside the heap
 *   heap_small.c       small objects: size-class slabs and each stream's rings of freed objects
 *   heap_tcache.c      thread caches and the parked block: where frees wait outside the arena
 *   heap_chunks.c      a thread's chunks: the heap sharded per thread while threads contend
 *   heap_place.c       placement: which free extent a block takes (best fit, whole segments, mapped fits)
 *   heap_segments.c    growth and release of plain segments
 *   heap_pages.c       virtual memory (vmm:1): pages mapped, lent, moved and released, a unit at a time
 *   heap_plan.c        step plans (step_plan:1): a repeating step's blocks laid out once and placed there
 *   heap_devicewide.c  device-wide frees in batches, take-backs, reuse across streams
 *   heap_holds.c       blocks held for record_stream's streams and graph pools; captures
 *   heap_oom.c         out of memory: the record that proves its cause
 *   heap_stats.c       statistics and the timeline, the consistency check, snapshots
 *
 * Names: a function another room calls is cuh_hp_NAME, declared here, or
 * defined here inline when it is small or on every malloc and free (the
 * cuh_ prefix keeps libcuheap.a's symbols in cuheap's own namespace, and
 * cuh_heap_ is the public API); everything else is static to its room.
 * Functions whose names end in _locked expect the heap's lock held.
 */
#ifndef CUH_HEAP_INTERNAL_H
#define CUH_HEAP_INTERNAL_H

#include "heap.h"
#include "page_plan.h"
#include "step_detect.h"

#include "arena.h"
#include "common.h"
#include "lock.h"
#include "ptrmap.h"
#include "slab.h"
#include "tcache.h"

#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

/* ---- types ----------------------------------------------------------------- */

typedef struct small_entry_s {
    uintptr_t addr;
    uint64_t epoch;
} small_entry_t;

/* Deque of freed small objects of one class on one stream, oldest at head.
 * Epochs rise from head to tail: reuse pops the newest (warmest), fences
 * release the oldest. */
typedef struct small_ring_s {
    small_entry_t *entries;
    uint32_t capacity;   /* power of two, or 0 */
    uint32_t head;
    uint32_t count;
} small_ring_t;

typedef struct fence_s {
    cuh_event_t event;
    uint64_t number;
} fence_t;

typedef struct stream_state_s {
    uint32_t tag;                /* first: what every allocation reads (the heap's device_wide) */
    int retired;                 /* the program destroyed the stream: never record on it again */
    cuh_stream_t handle;
    uint64_t completed;          /* fences [0, completed) have completed */
    fence_t *fences;             /* outstanding, oldest first */
    size_t num_fences, cap_fences;
    size_t small_unfenced;       /* bytes in the rings no fence covers yet */
    size_t small_fenced;         /* bytes in the rings a fence covers */
    small_ring_t small[CUH_MAX_CLASSES];
} stream_state_t;

typedef struct size_class_s {
    size_t size;
    size_t slab_bytes;
    cuh_slab_t *partial;         /* slabs with avail objects */
} size_class_t;

typedef struct stat_s {
    size_t current;
    size_t peak;
} stat_t;

typedef enum { GROW_OK, GROW_LIMIT, GROW_DEVICE, GROW_ERROR } grow_result_t;

/* Old mappings of pages that moved before the GPU passed their frees, as
 * DRAIN extents: once `event` (recorded on the freeing stream after the
 * move) has completed, the extents become free memory and the old mappings
 * kept ones (cuh_hp_drains_poll_locked). */
typedef struct vm_drain_s {
    struct vm_drain_s *next;
    cuh_event_t event;
    size_t num_extents;
    cuh_extent_t *extents[];
} vm_drain_t;

/* An event kept until it completes (unsettled_add_locked). */
typedef struct kept_event_s {
    cuh_event_t event;
    cuh_stream_t stream;
} kept_event_t;

/* An event recorded on the default stream behind the work a take-back left
 * running, and the generation of the pages that take-back returned
 * (cuh_hp_take_back_all_locked). */
typedef struct gen_event_s {
    cuh_event_t event;
    uint64_t gen;
} gen_event_t;

/* Take-backs whose work is followed one by one; beyond, the newest event
 * stands for the take-backs after it too (one stream: a later event
 * completes after an earlier one). */
#define GEN_EVENTS_MAX 32

/* A freed block held back: until every event in it has completed (streams
 * that used the block, from record_stream), or until its graph pool is
 * released (blocks a CUDA graph captured: replays still write them). Then it
 * is freed on the stream the program freed it on. */
typedef struct hold_s {
    uintptr_t addr;
    size_t size;                 /* block bytes */
    size_t requested;
    uint32_t free_tag;           /* stream it was freed on */
    uint64_t pool;               /* graph pool, 0 if none */
    uint64_t capture_pool;       /* a block of `pool` freed while another pool's graph was
                                  * captured: that pool too, 0 if none */
    size_t num_events;
    cuh_event_t events[];
} hold_t;

/* Blocks freed device-wide (cudaFree's promise: after all work issued before
 * the free, on every stream) wait in batches. The open batch collects them;
 * closing it records one event on every stream the heap knows and on the
 * default stream; when all of those have completed, the batch's blocks turn
 * global. A batch closes when none is in flight (so a run of frees costs one
 * event per stream per batch, not per free), when memory runs short, and
 * when everything is settled. No free waits on the GPU. */
typedef struct batch_entry_s {
    uintptr_t addr;
    size_t size;                 /* block bytes */
    size_t requested;
    cuh_slab_t *slab;            /* a small object's slab (its held bit set), or NULL */
    cuh_extent_t *ext;           /* a block's extent (its held flag set), or NULL */
} batch_entry_t;

/* A batch's arrays start inside it (first_*: a cudaFree of a block makes a
 * batch of one entry and one device-wide event), so that such a batch is two
 * cache lines, not five (issue 45: each line a pair touches is a miss when
 * Python has emptied the caches); they move to the host heap when they grow.
 * Made by cuh_hp_batch_new, freed by cuh_hp_batch_free. */
typedef struct free_batch_s {
    struct free_batch_s *next;   /* closed batches, oldest first */
    batch_entry_t *entries;      /* held by a bit of their own, not in the held map (unlike holds) */
    cuh_event_t *events;
    cuh_stream_t *event_streams;  /* the stream each event was recorded on */
    uint32_t num_entries, cap_entries;
    size_t num_events, cap_events;
    size_t num_blocks;           /* entries that are blocks (extents) */
    size_t bytes;                /* the entries' sizes added up */
    batch_entry_t first_entry[1];
    cuh_event_t first_event[1];
    cuh_stream_t first_stream[1];
} free_batch_t;

/* A fence for memory outside the heap (cuh_heap_fence): like a closed
 * batch's events, without blocks. */
struct cuh_heap_fence_s {
    cuh_heap_fence_t *prev, *next;   /* the heap's outstanding fences */
    int recorded;                    /* 0: made during a graph capture, events still to record */
    size_t num_events, cap;
    cuh_event_t events[];
};

typedef struct use_list_s {
    size_t count, capacity;
    cuh_stream_t streams[];
} use_list_t;

/* A live block found from its address. */
typedef struct live_block_s {
    cuh_extent_t *ext;           /* large block, or NULL */
    cuh_slab_t *slab;            /* small object's slab, or NULL */
    uint32_t index;              /* small object's index in its slab */
    size_t size;                 /* block bytes */
    size_t requested;
    unsigned label;              /* its allocator's label (cuh_heap_malloc_labelled), 0 for none */
} live_block_t;

/* How many block sizes the heap follows for recurring page moves. */
#define MOVERS 16

/* Geometric growth (segment_size_for) stops at this size: a larger segment
 * was sized to the one request it was made for. */
#define GROW_CAP CUH_GiB

/* One block event of a step, as step_plan records it (heap_plan.c). */
typedef struct plan_event_s {
    uint64_t seq;                /* the block's number among block allocations */
    size_t size;                 /* alloc: bytes, rounded as the heap rounds them */
    cuh_stream_t stream;         /* its lane: alloc, its stream; free, the stream it was freed on;
                                  * cudaMalloc and cudaFree: the device-wide lane (heap_plan.c) */
    uint8_t free;                /* 0: an allocation, 1: a free */
} plan_event_t;

typedef struct plan_s {
    plan_event_t *events[2];     /* the step under way [cur] and the one before [!cur] */
    size_t num_events[2], cap_events[2];
    uint64_t first_seq[2];       /* block allocations before each step */
    uint64_t first_older;        /* block allocations before the step before the previous one */
    int cur, have_prev;
    uint64_t next_seq;           /* block allocations so far */
    /* The layout in force: the step's block allocations in order, what each
     * asks for, and where it goes in the window. */
    int active;
    uint32_t gen;                /* the plan in force (extents it placed carry it), from 1 */
    size_t num_allocs;
    size_t *sizes;
    uintptr_t *addrs;            /* where each goes; 0: not planned */
    cuh_stream_t *streams;
    cuh_stream_t stream;         /* the planned blocks' lane */
    size_t room_bytes;           /* memory the plan took out of the arena for its blocks */
    cuh_extent_t **rooms;        /* the room: used extents no block owns, by address */
    size_t num_rooms, cap_rooms;
    size_t pos;                  /* block allocations of this step so far */
    int off_track;               /* this step asked for something else: no more placements */
    int mapping;                 /* pages for a planned block are being mapped: moved first */
    int unrecorded, prev_unrecorded; /* host memory ran out recording the step (the one before) */
    /* A program that marks no steps: its steps found in its block
     * allocations (step_detect.h), given the live bytes of recorded blocks. */
    cuh_step_detect_t detect;
    int program_marks;           /* the program marks its steps: none are looked for */
    int detect_failed;           /* host memory ran out for the detector */
    uint64_t found_period;       /* the step the detector last began to mark */
    uint64_t live_blocks;
    uint64_t made, steps_followed, placed, missed, dropped;
} plan_t;

struct cuh_heap_s {
    /* The lock has its cache lines to itself (two: a core may fetch lines
     * in pairs): waiters spin reading it, and every read takes the line
     * from the holder, which would then miss on whatever shared the line
     * with it (the settings below, read by every thread cache's fast path
     * without the lock). */
    _Alignas(128) cuh_lock_t lock;
    _Alignas(128) cuh_device_t *dev;
    cuh_config_t cfg;
    /* Thread caches: read by their fast paths without the lock, so kept
     * apart from what the lock's holders write. */
    uint64_t id;                 /* unique among the process's heaps, ever */
    _Atomic int tcache_closed;   /* a graph capture is underway: fast paths stay shut */
    _Atomic uint32_t device_wide_slots;   /* threads' slots holding a cudaFree'd block (heap_tcache.c) */
    cuh_tcache_t *tcaches;       /* every thread's cache of this heap (under the lock) */
    size_t device_total;
    size_t limit;
    cuh_segment_t *workspace;

    /* What every allocation and free under the lock reads or writes, in a
     * few cache lines of its own: a Python program's interpreter empties the
     * CPU's caches between two tensors, and each line touched is a miss
     * then (issue 45; scripts/cold_misses.sh counts them). */
    _Alignas(64) int started;
    int captures;                /* graph captures underway on this device */
    int shareable_call;          /* the allocation underway must start a segment of its own */
    uint32_t contended;          /* see "a thread's large block" below */
    int device_fences;           /* cfg.device_fences, while the device has them (cuh_hp_record_all_locked) */
    uint32_t live_other_streams; /* streams neither retired nor the default one (what cuh_hp_next_live_stream
                                    walks, kept: every device-wide malloc and poll asks) */
    cuh_slab_t *last_slab;       /* the slab of the last small lookup, or NULL */
    cuh_extent_t *parked;        /* see "the parked block" below */
    cuh_tcache_t *large_tcs;     /* see "a thread's large block" below */
    free_batch_t *open_batch;    /* device-wide frees no event covers yet */
    cuh_segment_t *vm;           /* see "virtual memory" below */
    size_t vm_page;
    size_t physical_pages;       /* held: mapped, or in hand while moving */
    size_t small_fenced_total;
    size_t held_bytes;           /* see "holds" below */
    size_t held_requested;
    stat_t requested, allocated, reserved, cached, pending;
    uint64_t num_allocs, num_frees, num_cache_hits;
    uint64_t sample_every, ops_since_sample;   /* see "timeline" below */
    uint64_t slot_samples[2];    /* samples a thread's slot took at a free [0] and a take [1] (heap_tcache.c), for tests */
    size_t last_sampled_reserved;
    /* The label of the block last counted live and its address: a labelled
     * malloc (cuh_heap_malloc_labelled) writes its label there. */
    uint8_t *marked_label;
    uintptr_t marked_addr;
    cuh_ptrmap_t held;           /* address -> hold_t (see "holds") */
    cuh_ptrmap_t uses;           /* address -> use_list_t: streams from record_stream */
    cuh_ptrmap_t graph;          /* address -> graph pool id, for blocks allocated in a capture */
    uint64_t num_segment_allocs, num_segment_frees, num_retries, num_ooms;
    size_t num_holds;            /* holds (below) */
    size_t num_chunks;           /* chunks lent to threads now (heap_chunks.c) */
    int chunk_call;              /* the allocation underway is a chunk: no heavy ways to memory */
    uint32_t last_take_tag;      /* the tag of the free extent cuh_hp_take_locked cut from last */
    uint32_t num_streams;        /* streams (below) */
    /* cudaFree's batches (heap_devicewide.c): a block's pair under LD_PRELOAD
     * touches each of these. */
    free_batch_t *closed_batches;
    free_batch_t *spare_batch;   /* a finished batch kept with its arrays for the next (one a cudaFree, else) */
    uint64_t allocs_at_close;    /* num_allocs when the last batch closed (cuh_hp_batches_poll_locked) */
    uint64_t allocs_at_take_back; /* num_allocs at the last take-back (cuh_hp_take_back_all_locked) */
    cuh_event_t *spare_events;
    size_t num_spare_events, cap_spare_events;
    /* The block a search would hand out again were it released (the last
     * search_would_take that said yes), and the arena's index_changes
     * after it was handed out: while the free index stands still, the
     * answer stands (heap_devicewide.c, same_block_locked). */
    const cuh_extent_t *same_ok;
    uint64_t same_ok_changes;
    const cuh_extent_t *same_in_map;   /* the block just handed out again, left in the block map */
    /* The fence of a cudaFree'd block a thread's slot found running, in the
     * batch it went back to: not asked again (heap_tcache.c, "a thread's
     * cudaFree'd block"). */
    cuh_event_t asked_event;

    cuh_arena_t arena;
    cuh_ptrmap_t blocks;         /* large block address -> extent */
    /* Allocations for no stream (cudaMalloc: any stream may use the block at
     * once) take global memory only: this state has the global tag, no
     * handle, and is never fenced or listed. Its head shares the block
     * map's last cache line. */
    stream_state_t device_wide;
    cuh_pagemap_t pages;         /* 64 KiB page -> slab */
    unsigned keep_class;         /* a class whose allocation waits on a take-back, or CUH_MAX_CLASSES */
    cuh_slab_t *kept_slab;       /* the slab of keep_class that the take-back emptied, kept for it */
    size_class_t classes[CUH_MAX_CLASSES];
    unsigned num_classes;

    stream_state_t **streams;    /* index = tag - 1 */
    uint32_t cap_streams;        /* num_streams (above) in use */
    stream_state_t *last_stream;

    uint64_t num_cpu_waits;      /* times the CPU waited for the GPU (an event or the device) */

    int has_oom;
    cuh_oom_info_t last_oom;

    /* Blocks the program freed that nobody may reuse yet ("holds": the map
     * `held` and the bytes are in the lines above). */
    hold_t **holds;
    size_t cap_holds;
    int took_back;               /* streams waited stream by stream: new streams must wait too (stream_joins_locked) */
    /* Under vmm:1, the events recorded when other streams got memory before
     * the GPU passed its frees (reuse_across_streams): that memory is theirs
     * at once, but no page may be unmapped (steal_pages_locked) before these
     * complete. */
    kept_event_t *unsettled;
    size_t num_unsettled, cap_unsettled;
    /* Under vmm:1, a take-back that leaves work running stamps the pages of
     * the blocks it returns with its generation (page_gen) and keeps an
     * event that completes after that work, oldest first (gen_events). A
     * page stamped above settled_gen may still be touched by the work
     * before those frees and is not unmapped; the others move while later
     * take-backs' work still runs (settled_gen_locked). */
    gen_event_t gen_events[GEN_EVENTS_MAX];
    size_t num_gen_events;
    uint64_t take_back_gen;      /* the generation of the last take-back that left work running */
    uint64_t settled_gen;        /* every take-back up to this generation has its work done */
    double poll_closed_at;       /* cuh_hp_seconds_since(born) when cuh_heap_poll last closed a batch */
    cuh_heap_fence_t *fences;    /* outstanding fences for memory outside the heap (cuh_heap_fence) */
    /* Virtual memory (vmm:1): the general region is one reservation (`vm`,
     * above, with the page size) whose pages are mapped on demand;
     * page_handle[i] is the physical allocation (the unit, page_plan.h)
     * behind page i, 0 when unmapped. */
    size_t unit_pages;           /* the most pages a new unit holds (vmm_unit); 0: auto (heap_pages.c) */
    uint64_t *page_handle;
    uint64_t *page_mapped;       /* bit i: page_handle[i] != 0 (ranges test 64 pages a word) */
    uint64_t *page_gen;          /* the last take-back generation that returned memory on page i */
    uint64_t *drain_head;        /* bit i: an old mapping of a unit that moved begins at page i (DRAIN) */
    uint64_t *drain_handle;      /* the unit whose old mapping lies at page i of a DRAIN extent */
    /* Kept mappings (heap_pages.c): a unit that moved stays mapped where it
     * was, at pages the heap counts as unmapped, until something is mapped
     * over them or the unit goes back to the device. */
    uint64_t *kept_handle;       /* the unit still mapped at page i, 0 if none (never where page_handle[i] is set) */
    uint64_t *kept_head;         /* bit i: a kept mapping begins at page i */
    size_t kept_pages;           /* pages with a kept mapping */
    uint64_t num_kept_hits;      /* units placed where a kept mapping of theirs lay: no map call */
    size_t num_pages, mapped_pages;
    size_t pages_high;           /* no page at or above this index was ever mapped */
    uint64_t num_page_maps, num_page_steals;
    uint64_t num_map_calls;      /* vm_map and vm_unmap calls made (a unit a call) */
    /* Block sizes (in pages) that needed pages while the heap was above its
     * margin, with the story of their last mappings (mover_recurs). */
    struct {
        size_t pages;
        uint8_t history;         /* bit i: the mapping i+1 back needed moved pages */
        uint8_t seen;            /* mappings recorded, up to 255 */
    } movers[MOVERS];
    unsigned movers_next;        /* the entry a new size takes */
    /* step_plan: the steps' block events and the layout learned from them
     * (heap_plan.c). */
    plan_t plan;
    /* Pages a stream's own recent frees lent to its next block before the
     * GPU passed those frees (lend_own_pages_locked): each physical page is
     * mapped at its new place and still at its old one, whose address range
     * is a DRAIN extent until the stream's work up to the move is done. */
    vm_drain_t *drains;          /* oldest first */
    /* The last large block freed on a stream, not yet given back to the
     * arena (`parked`, above; see "the parked block"): still in the block
     * map, counted as freed. Any other heap operation gives it back first. */
    stream_state_t *parked_st;   /* the stream it was freed on */
    uint64_t parked_epoch;       /* that stream's fences recorded at the free */
    const cuh_tcache_t *parked_tc;   /* the freeing thread's cache (compared, never followed) */
    /* Thread caches that hold a large block (`large_tcs`, above; see "a
     * thread's large block"), and how many more uncontended allocations and
     * frees the heap treats as contended since one found its lock held
     * (`contended`, above). */
    int assume_waits;            /* cuh_heap_assume_waits: every large allocation counts as having waited */
    uint64_t num_chunks_lent;    /* ever */
    uint64_t chunks_short_at;    /* num_allocs when memory for chunks last ran short */
    const cuh_tcache_t *last_chunk_asker;   /* whose large allocation asked last (compared, never followed) */

    /* Timeline for reports: a sample every sample_every operations (above)
     * and at every change of reserved bytes; when full, every other sample
     * goes and the interval doubles, so it always spans the heap's whole
     * life. */
    struct timespec born;
    cuh_sample_t timeline[CUH_TIMELINE_SAMPLES];
    size_t num_samples;
    /* Steps the program marked (cuh_heap_mark_step): the counters at the
     * last mark, the last CUH_STEP_HISTORY steps in a ring (the oldest at
     * steps_marked % CUH_STEP_HISTORY once it is full) and the step that
     * mapped the most pages. */
    struct {
        uint64_t marked;
        double at;
        uint64_t page_maps, page_moves, map_calls, device_allocs, cpu_waits;
        cuh_snap_step_t ring[CUH_STEP_HISTORY];
        cuh_snap_step_t most_maps;
    } steps;
    uint64_t capture_pool;
    /* Graph pools released while a capture was underway: released when the
     * last capture ends (cuh_heap_release_pool). */
    uint64_t *pools_to_release;
    size_t num_pools_to_release;
};

/* The stream a device-wide event stands for in a batch's event_streams and
 * a take-back's list: all of them. */
#define ALL_STREAMS ((cuh_stream_t)UINTPTR_MAX)

/* Whose large-block slots cuh_hp_large_slots_empty_locked empties: this
 * thread's held block, every thread's held block, or every slot. */
typedef enum { LARGE_MINE_HELD, LARGE_ALL_HELD, LARGE_ALL } large_which_t;

/* Whether free extent e may serve `size` bytes: the test of a placement
 * search (heap_place.c). */
typedef int (*extent_test_t)(const cuh_heap_t *h, const cuh_extent_t *e, size_t size);

/* After an allocation or a free found the heap's lock held, how many more
 * the heap treats as contended (heap_tcache.c, "a thread's large block"). */
#define CONTENDED_HOLD 4096

/* ---- what the rooms call of each other ---------------------------------------- */

/* heap.c: the front */
cuh_extent_t *cuh_hp_extent_alloc_locked(cuh_heap_t *h, stream_state_t *st, size_t size, size_t align,
                                         cuh_extent_state_t state, cuheap_status_t *status, grow_result_t *why_out);
void cuh_hp_large_mark_live_locked(cuh_heap_t *h, cuh_extent_t *e, size_t size);
cuheap_status_t cuh_hp_find_live_locked(cuh_heap_t *h, uintptr_t addr, live_block_t *b);
void cuh_hp_release_block_locked(cuh_heap_t *h, const live_block_t *b, uintptr_t addr, stream_state_t *st);

/* heap_streams.c: streams, events, fences */
cuh_dev_status_t cuh_hp_cpu_wait_event(cuh_heap_t *h, cuh_event_t e);
cuh_dev_status_t cuh_hp_cpu_wait_device(cuh_heap_t *h);
cuh_event_t cuh_hp_event_get_locked(cuh_heap_t *h);
void cuh_hp_event_put_locked(cuh_heap_t *h, cuh_event_t e);
void cuh_hp_device_fences_refused_locked(cuh_heap_t *h, cuh_dev_status_t rc);
cuh_dev_status_t cuh_hp_record_all_locked(cuh_heap_t *h, cuh_event_t *out);
int cuh_hp_next_live_stream(const cuh_heap_t *h, uint32_t *i, cuh_stream_t *handle);
stream_state_t *cuh_hp_stream_find_locked(cuh_heap_t *h, cuh_stream_t handle);
void cuh_hp_stream_all_done_locked(cuh_heap_t *h, stream_state_t *st);
int cuh_hp_stream_fence_locked(cuh_heap_t *h, stream_state_t *st);
int cuh_hp_stream_poll_locked(cuh_heap_t *h, stream_state_t *st, int wait);
int cuh_hp_poll_all_locked(cuh_heap_t *h, int wait);
int cuh_hp_fence_others_locked(cuh_heap_t *h, const stream_state_t *except, size_t size);
void cuh_hp_settle_all_locked(cuh_heap_t *h);
void cuh_hp_wait_for_stream_locked(cuh_heap_t *h, stream_state_t *st);
int cuh_hp_events_done_locked(cuh_heap_t *h, cuh_event_t *events, size_t *num_events, int wait);

/* heap_small.c: small objects */
small_entry_t cuh_hp_ring_pop_oldest(small_ring_t *r);
void cuh_hp_slab_object_home_locked(cuh_heap_t *h, uintptr_t addr);
int cuh_hp_cache_small_locked(cuh_heap_t *h, stream_state_t *st, const cuh_slab_t *s, uintptr_t addr);
cuheap_status_t cuh_hp_small_alloc_locked(cuh_heap_t *h, stream_state_t *st, size_t size, uintptr_t *addr);

/* heap_tcache.c: thread caches and the parked block */
void cuh_hp_tcache_flush_one_locked(cuh_heap_t *h, cuh_tcache_t *tc, int all_streams, cuh_stream_t stream,
                                    int forget_live);
void cuh_hp_tcache_flush_locked(cuh_heap_t *h);
cuheap_status_t cuh_hp_tcache_take_locked(cuh_heap_t *h, const cuh_slab_t *s, uintptr_t addr);
void cuh_hp_tcaches_orphan(cuh_heap_t *h);
cuh_tcache_t *cuh_hp_tcache_mine_locked(cuh_heap_t *h);
int cuh_hp_tcache_adopt_locked(cuh_heap_t *h, const live_block_t *b, uintptr_t addr, cuh_stream_t stream);
void cuh_hp_park_locked(cuh_heap_t *h, const live_block_t *b, stream_state_t *st);
size_t cuh_hp_large_slots_empty_locked(cuh_heap_t *h, large_which_t which);
void cuh_hp_unpark_held_locked(cuh_heap_t *h);
void cuh_hp_unpark_all_locked(cuh_heap_t *h);
int cuh_hp_large_slot_adopt_locked(cuh_heap_t *h, const live_block_t *b, stream_state_t *st, cuh_stream_t stream);
void cuh_hp_device_wide_slot_adopt_locked(cuh_heap_t *h, cuh_extent_t *e);
/* A slot's take and free of the operation that takes the timeline's sample,
 * under the heap's lock (heap_tcache.c); 0 if the heap must serve it. */
uintptr_t cuh_hp_device_wide_slot_sample_take(cuh_heap_t *h, cuh_tcache_t *tc, size_t size, unsigned label);
int cuh_hp_device_wide_slot_sample_free(cuh_heap_t *h, cuh_tcache_t *tc, uintptr_t addr, cuh_heap_freed_t *freed);
void cuh_hp_device_wide_slots_empty_locked(cuh_heap_t *h);
cuheap_status_t cuh_hp_large_slot_take_back_locked(cuh_heap_t *h, cuh_extent_t *e);
cuh_extent_t *cuh_hp_take_parked_locked(cuh_heap_t *h, stream_state_t *st, size_t size);

/* heap_place.c: placement */
cuh_extent_t *cuh_hp_take_locked(cuh_heap_t *h, cuh_extent_t *free_ext, size_t size, size_t align,
                                 cuh_extent_state_t state, stream_state_t *st);
int cuh_hp_at_growth_edge(const cuh_heap_t *h, const cuh_extent_t *e);
/* The same for a range of seg ending at `end` with extent `above` after it
 * (an extent a release would make, not yet made). */
int cuh_hp_range_at_growth_edge(const cuh_heap_t *h, const cuh_segment_t *seg, uintptr_t end,
                                const cuh_extent_t *above);
int cuh_hp_mapped_fits_off_the_edge(const cuh_heap_t *h, const cuh_extent_t *e, size_t size);
cuh_extent_t *cuh_hp_smallest_fit_by_bins_locked(cuh_heap_t *h, size_t size, size_t align, uint32_t tag,
                                                 extent_test_t accept);
cuh_extent_t *cuh_hp_smallest_mapped_fit_locked(cuh_heap_t *h, size_t size, size_t align, uint32_t tag);
cuh_extent_t *cuh_hp_fewest_new_pages_fit_locked(cuh_heap_t *h, size_t size, size_t align, uint32_t tag,
                                                 uintptr_t *at);
cuh_extent_t *cuh_hp_find_fit_locked(cuh_heap_t *h, size_t size, size_t align, uint32_t tag);

/* heap_segments.c: growth and release */
void cuh_hp_fence_if_left_idle_locked(cuh_heap_t *h, stream_state_t *st, const cuh_segment_t *seg, size_t used);
grow_result_t cuh_hp_grow_locked(cuh_heap_t *h, size_t size, size_t align);
size_t cuh_hp_release_free_segments_locked(cuh_heap_t *h);

/* heap_pages.c: virtual memory */
void cuh_hp_stamp_pages_locked(cuh_heap_t *h, uintptr_t addr, size_t size, uint64_t gen);
void cuh_hp_keep_drain_locked(cuh_heap_t *h, const cuh_extent_t *x);
void cuh_hp_unmap_all_units_locked(cuh_heap_t *h);
int cuh_hp_drains_poll_locked(cuh_heap_t *h, int wait);
int cuh_hp_map_range_locked(cuh_heap_t *h, uintptr_t addr, size_t size, stream_state_t *st, grow_result_t *why);

/* ---- step plans (heap_plan.c) ---- */
/* A block for st and `size` bytes (heap.c). */
cuheap_status_t cuh_hp_large_alloc_locked(cuh_heap_t *h, stream_state_t *st, size_t size, uintptr_t *addr);
/* With step_plan: a block for st (on `stream`, or device_wide: cudaMalloc),
 * placed where the layout learned from the steps before puts it, else as
 * always (cuh_hp_large_alloc_locked); the allocation is recorded for the
 * next plan. */
cuheap_status_t cuh_hp_plan_alloc_locked(cuh_heap_t *h, stream_state_t *st, cuh_stream_t stream, int device_wide,
                                         size_t size, uintptr_t *addr);
/* Block e, freed by cudaFree, whose batch has finished (the GPU passed the
 * free, or every stream's later work waits for it): 1 if it went back to a
 * device-wide plan's room (out of the heap's blocks), 0 if it is not the
 * plan's (the caller releases it). */
int cuh_hp_plan_room_finished_locked(cuh_heap_t *h, cuh_extent_t *e);
/* With step_plan: block e, allocated on `stream` for `size` bytes outside
 * the plan (a parked block taken again), is recorded for the next plan. */
void cuh_hp_plan_note_alloc_locked(cuh_heap_t *h, cuh_extent_t *e, cuh_stream_t stream, size_t size);
/* With step_plan: block e, freed on `stream` (device_wide: by cudaFree), is
 * recorded for the next plan. */
void cuh_hp_plan_note_free_locked(cuh_heap_t *h, const cuh_extent_t *e, cuh_stream_t stream, int device_wide);
/* 1 if block b at addr, freed on `stream`, went back to the window's room
 * (the caller does nothing more); 0 if the caller releases it as always. */
int cuh_hp_plan_room_locked(cuh_heap_t *h, const live_block_t *b, uintptr_t addr, cuh_stream_t stream);
/* A step ends: its counters go to the history, and with step_plan the plan
 * is kept, dropped or made (cuh_heap_mark_step, or a step found in the
 * allocations). */
void cuh_hp_mark_step_locked(cuh_heap_t *h);
/* The program marks its steps (cuh_heap_mark_step): steps are no longer
 * looked for in its allocations. */
void cuh_hp_plan_program_marks_locked(cuh_heap_t *h);
/* A step ended (cuh_heap_mark_step) in which `pages_moved` pages moved: the
 * plan is kept, dropped or made. */
void cuh_hp_plan_step_locked(cuh_heap_t *h, uint64_t pages_moved);
/* The window's room goes back to the arena, private to the plan's stream
 * (global for cudaMalloc's lane), and no more blocks are placed. */
void cuh_hp_plan_drop_locked(cuh_heap_t *h);
/* 1 if e is a plan's room: a used extent no block owns. */
int cuh_hp_plan_is_room(const cuh_extent_t *e);
/* The plan's books agree with the arena (`room`: the bytes of room extents
 * found there): its room list sorted, disjoint and all room, and no room
 * without a plan in force. 0, or -1 with msg. */
int cuh_hp_plan_check_locked(const cuh_heap_t *h, size_t room, char *msg, size_t len);
/* Frees the plan's records (the heap is going away). */
void cuh_hp_plan_free_records(cuh_heap_t *h);
int cuh_hp_needs_pages_locked(const cuh_heap_t *h, uintptr_t addr, size_t size);
size_t cuh_hp_release_free_pages_locked(cuh_heap_t *h);
size_t cuh_hp_largest_free_locked(const cuh_heap_t *h, size_t cached);
/* Units of several pages that blocks partly use, and the bytes of their
 * pages that lie wholly in free extents (which cannot move: a unit moves
 * whole). 0 if out of host memory to count them. */
int cuh_hp_partly_used_units_locked(const cuh_heap_t *h, size_t *units, size_t *free_bytes);
uint64_t cuh_hp_gen_open_locked(cuh_heap_t *h);
int cuh_hp_keep_until_done_locked(cuh_heap_t *h, stream_state_t *st);
void cuh_hp_start_vm_locked(cuh_heap_t *h);

/* heap_devicewide.c: device-wide frees and take-backs */
int cuh_hp_same_batch_adoptable_locked(const cuh_heap_t *h, const cuh_extent_t *e);
free_batch_t *cuh_hp_same_batch_take_locked(cuh_heap_t *h);
void cuh_hp_same_batch_return_locked(cuh_heap_t *h, free_batch_t *batch, size_t requested, int asked);
void cuh_hp_same_batch_recycle_locked(cuh_heap_t *h, free_batch_t *batch);
int cuh_hp_take_back_all_locked(cuh_heap_t *h);
int cuh_hp_take_back_for_block_locked(cuh_heap_t *h, const stream_state_t *st, size_t size, size_t align,
                                      cuh_extent_t **same);
int cuh_hp_may_take_private_locked(const cuh_heap_t *h, const stream_state_t *st, size_t size);
int cuh_hp_take_private_locked(cuh_heap_t *h, stream_state_t *st, size_t size);
void cuh_hp_release_block_global_locked(cuh_heap_t *h, const live_block_t *b, uintptr_t addr);
void cuh_hp_batch_close_locked(cuh_heap_t *h);
int cuh_hp_batches_poll_locked(cuh_heap_t *h, int wait);
int cuh_hp_batch_add_locked(cuh_heap_t *h, uintptr_t addr, const live_block_t *b);
size_t cuh_hp_free_slack_locked(const cuh_heap_t *h);
/* A batch with room for one entry and one event inside it, or NULL. */
free_batch_t *cuh_hp_batch_new(void);
/* Frees a batch and its arrays (NULL: nothing). */
void cuh_hp_batch_free(free_batch_t *batch);

/* heap_chunks.c: a thread's chunks */
uintptr_t cuh_hp_chunk_alloc_locked(cuh_heap_t *h, stream_state_t *st, cuh_stream_t stream, size_t size,
                                    int waited);
size_t cuh_hp_chunks_dissolve_locked(cuh_heap_t *h, cuh_tcache_t *tc, int all_streams, cuh_stream_t stream);
size_t cuh_hp_chunks_dissolve_all_locked(cuh_heap_t *h);
int cuh_hp_chunk_dissolve_at_locked(cuh_heap_t *h, uintptr_t addr);
void cuh_hp_chunks_short_locked(cuh_heap_t *h);
size_t cuh_hp_chunk_block_size_locked(cuh_heap_t *h, uintptr_t addr);
int cuh_hp_chunks_check_locked(cuh_heap_t *h, const cuh_tcache_t *tc, int64_t *allocated_adjust,
                               int64_t *requested_adjust, size_t *count, char *msg, size_t len);

/* heap_holds.c: held blocks and captures */
int cuh_hp_unhold_locked(cuh_heap_t *h, uintptr_t addr, size_t size, size_t requested, live_block_t *b);
int cuh_hp_holds_poll_locked(cuh_heap_t *h, int wait);
int cuh_hp_maybe_hold_locked(cuh_heap_t *h, uintptr_t addr, size_t size, size_t requested, stream_state_t *st);

/* heap_oom.c: out of memory */
void cuh_hp_record_oom_locked(cuh_heap_t *h, stream_state_t *st, size_t request, size_t block, size_t align,
                              grow_result_t why);

/* heap_stats.c: statistics, check, snapshots */
void cuh_hp_sample_locked(cuh_heap_t *h);

/* ---- inline: small, or on every malloc and free ---------------------------------- */

/* Every heap operation first gives back the block parked outside the arena,
 * the large blocks threads hold and lent chunks (heap_tcache.c): inline, so
 * that an operation finds none in one test (issue 45). */
static inline void cuh_hp_unpark_locked(cuh_heap_t *h)
{
    if (cuh_unlikely(h->parked != NULL || h->large_tcs != NULL || h->num_chunks))
        cuh_hp_unpark_held_locked(h);
}

static inline void cuh_hp_stat_set(stat_t *s, size_t value)
{
    s->current = value;
    if (value > s->peak)
        s->peak = value;
}

/* A step plan is in force. Plans come only with step_plan, so the plan's
 * own line is read only where the setting is on (issue 45: a line a pair
 * touches is a miss when Python has emptied the caches). */
static inline int cuh_hp_plan_in_force(const cuh_heap_t *h)
{
    return h->cfg.step_plan && h->plan.active;
}

/* A block that must start a segment of its own: every block with ipc_safe:1,
 * and the one being allocated by cuh_heap_malloc_shareable. Not under
 * virtual memory, which legacy IPC cannot share anyway. */
static inline int cuh_hp_own_segment_locked(const cuh_heap_t *h)
{
    return h->cfg.ipc_safe || h->shareable_call;
}

/* vmm:1 asked for, but the device gave no virtual memory when the heap
 * started (cuh_hp_start_vm_locked said so on stderr): plain segments. */
static inline int cuh_hp_vm_unavailable(const cuh_heap_t *h)
{
    return h->cfg.vmm && h->started && !h->vm;
}

/* Device memory the heap holds: its segments, and under virtual memory the
 * pages mapped in the reservation (the reservation itself is address space). */
static inline size_t cuh_hp_reserved_bytes(const cuh_heap_t *h)
{
    if (!h->vm)
        return h->arena.reserved;
    return h->arena.reserved - h->vm->size + h->physical_pages * h->vm_page;
}

static inline double cuh_hp_seconds_since(const struct timespec *born)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - born->tv_sec) + (double)(now.tv_nsec - born->tv_nsec) * 1e-9;
}

static inline void cuh_hp_refresh_stats_locked(cuh_heap_t *h)
{
    size_t reserved = cuh_hp_reserved_bytes(h);
    cuh_hp_stat_set(&h->reserved, reserved);
    cuh_hp_stat_set(&h->cached, reserved - h->allocated.current);
    cuh_hp_stat_set(&h->pending, cuh_arena_pending_bytes(&h->arena) + h->small_fenced_total + h->held_bytes);
    if (cuh_unlikely(++h->ops_since_sample >= h->sample_every || reserved != h->last_sampled_reserved))
        cuh_hp_sample_locked(h);
}

/* The state of stream `handle`, created if new; NULL when out of host
 * memory. The stream of the last call is checked first (inline: every
 * malloc and free asks). */
static inline stream_state_t *cuh_hp_stream_get_locked(cuh_heap_t *h, cuh_stream_t handle)
{
    stream_state_t *last = h->last_stream;
    if (cuh_likely(last && last->handle == handle && !last->retired))
        return last;
    return cuh_hp_stream_find_locked(h, handle);
}

/* The slab holding addr, or NULL. The last one found is checked first: a
 * program's small frees and reuses come in runs on the same slab. */
static inline cuh_slab_t *cuh_hp_slab_of_locked(cuh_heap_t *h, uintptr_t addr)
{
    cuh_slab_t *s = h->last_slab;
    if (s && addr - s->base < s->span)
        return s;
    s = cuh_pagemap_get(&h->pages, addr);
    if (s)
        h->last_slab = s;
    return s;
}

/* A segment that may go back to the device when nothing is left in it: a
 * plain general segment (not the workspace, not the vmm:1 reservation). */
static inline int cuh_hp_returnable_segment(const cuh_segment_t *s)
{
    return s->region == CUH_REGION_GENERAL && !s->virtual_space;
}

static inline uintptr_t cuh_hp_page_va(const cuh_heap_t *h, size_t p)
{
    return h->vm->base + (uintptr_t)p * h->vm_page;
}

/* 1 if page p of the reservation lies wholly inside [addr, addr + size). */
static inline int cuh_hp_page_inside(const cuh_heap_t *h, size_t p, uintptr_t addr, size_t size)
{
    return cuh_hp_page_va(h, p) >= addr && cuh_hp_page_va(h, p) + h->vm_page <= addr + size;
}

/* How many streams a batch's events and a take-back's waits cover: the live
 * streams the heap knows and the default stream. */
static inline uint64_t cuh_hp_covered_streams_locked(const cuh_heap_t *h)
{
    return (uint64_t)h->live_other_streams + 1;
}

/* 1 if the heap knows a live stream besides the default stream. */
static inline int cuh_hp_other_streams_locked(const cuh_heap_t *h) { return h->live_other_streams != 0; }

/* 1 if a batch close or a take-back costs calls on every known stream: no
 * device-wide fences now, and streams besides the default one known. */
static inline int cuh_hp_fences_per_stream_locked(const cuh_heap_t *h)
{
    return cuh_hp_other_streams_locked(h) && !(h->device_fences && !h->captures);
}

/* Every operation, once it holds the heap's lock: a cudaFree'd block a
 * thread's slot holds goes back first, whoever contends (heap_tcache.c, "a
 * thread's cudaFree'd block"). */
static inline void cuh_hp_slots_back_locked(cuh_heap_t *h)
{
    if (cuh_unlikely(atomic_load_explicit(&h->device_wide_slots, memory_order_relaxed)))
        cuh_hp_device_wide_slots_empty_locked(h);
}

/* The heap's lock, for any operation. */
static inline void cuh_hp_lock(cuh_heap_t *h)
{
    cuh_lock(&h->lock);
    cuh_hp_slots_back_locked(h);
}

/* The same for an allocation or a free: notes whether it was held, and
 * returns 1 if it was. */
static inline int cuh_hp_heap_lock(cuh_heap_t *h)
{
    int waited = 0;
    if (cuh_likely(cuh_trylock(&h->lock))) {
        if (cuh_unlikely(h->contended))
            h->contended--;
    } else {
        cuh_lock(&h->lock);
        h->contended = CONTENDED_HOLD;
        waited = 1;
    }
    cuh_hp_slots_back_locked(h);
    return waited;
}


/* ---- the thread caches' fast paths (heap_tcache.c keeps their rules) ---------- */

/* This thread's caches, one per heap it used: defined in heap_tcache.c, read
 * here by the fast paths of every malloc and free, which take no heap lock. */
extern _Thread_local cuh_tcache_t *cuh_hp_my_tcaches;

static inline cuh_tcache_t *cuh_hp_my_tcache(const cuh_heap_t *h)
{
    for (cuh_tcache_t *tc = cuh_hp_my_tcaches; tc; tc = tc->thread_next)
        if (tc->heap == h && tc->heap_id == h->id)
            return tc;
    return NULL;
}

static inline int cuh_hp_tcache_open(cuh_heap_t *h)
{
    return !atomic_load_explicit(&h->tcache_closed, memory_order_acquire);
}

/* Fast path of cuh_heap_malloc: an object of size's class this thread
 * freed on `stream`, from its cache, or for a large request the block the
 * cache holds if it has the request's size and was freed on `stream`, else
 * a block cut from the thread's chunks for `stream`. 0 if there is none. */
static inline uintptr_t cuh_hp_tcache_alloc(cuh_heap_t *h, size_t size, cuh_stream_t stream)
{
    cuh_tcache_t *tc = cuh_hp_my_tcache(h);
    if (!tc)
        return 0;
    uintptr_t addr = 0;
    cuh_spin_lock(&tc->lock);
    if (cuh_likely(!tc->dead && cuh_hp_tcache_open(h))) {
        if (size > h->cfg.small_max) {
            size_t block = cuh_align_up(size, CUH_ALIGN);
            addr = cuh_tcache_large_take(tc, block, size, (uintptr_t)stream);
            if (!addr && tc->num_chunks)
                addr = cuh_tcache_chunk_take(tc, block, size, (uintptr_t)stream);
        } else if ((addr = cuh_tcache_pop(tc, cuh_sizeclass_index(size), (uintptr_t)stream))) {
            cuh_tcache_hand_out(tc, cuh_tcache_find(tc, addr), (uint32_t)size);
        }
        tc->num_allocs += addr != 0;
    }
    cuh_spin_unlock(&tc->lock);
    return addr;
}

/* Fast path of cuh_heap_free: an object, the large block or a chunk's
 * block this thread's cache handed out, freed on the stream it was
 * allocated on, goes back to the cache. 0 if the heap must see the free
 * (not the cache's, another stream, no room). */
static inline int cuh_hp_tcache_free(cuh_heap_t *h, uintptr_t addr, cuh_stream_t stream)
{
    cuh_tcache_t *tc = cuh_hp_my_tcache(h);
    if (!tc)
        return 0;
    int done = 0;
    cuh_spin_lock(&tc->lock);
    if (cuh_likely(!tc->dead && cuh_hp_tcache_open(h))) {
        cuh_tc_entry_t *e;
        if (tc->large.addr == addr) {
            done = cuh_tcache_large_give(tc, addr, (uintptr_t)stream);
        } else if (tc->num_chunks && cuh_tcache_chunk_give(tc, addr, (uintptr_t)stream)) {
            done = 1;
        } else if ((e = cuh_tcache_find(tc, addr)) && e->state == CUH_TC_LIVE && e->stream == (uintptr_t)stream &&
                   tc->cached_bytes + e->size <= h->cfg.thread_cache &&
                   cuh_tcache_push(tc, e->size_class, addr, (uintptr_t)stream) == 0) {
            cuh_tcache_hold(tc, e, (uintptr_t)stream);
            done = 1;
        }
        tc->num_frees += (uint64_t)done;
    }
    cuh_spin_unlock(&tc->lock);
    return done;
}

/* A thread's slot holding a cudaFree'd block (heap_tcache.c, "a thread's
 * cudaFree'd block"), its tc's lock held. It may serve a request of `size`
 * bytes: [lowest, counted], the block's size rounded, a block's request,
 * none above the one the heap counts; not once a take found its fence
 * running. No capture test: a capture's start empties the slots, and none
 * fills one while it runs. */
static inline int cuh_hp_slot_serves(const cuh_tc_large_t *l, size_t size)
{
    return l->state == CUH_TC_CACHED && l->stream == CUH_TC_DEVICE_WIDE && size - l->lowest <= l->counted - l->lowest &&
           !l->asked;
}

/* It handed block `addr` out. */
static inline int cuh_hp_slot_handed_out(const cuh_tc_large_t *l, uintptr_t addr)
{
    return l->state == CUH_TC_LIVE && l->addr == addr && l->stream == CUH_TC_DEVICE_WIDE;
}

/* Its block handed out for a request of `size` labelled `label`, its fence
 * found done. */
static inline uintptr_t cuh_hp_slot_take(cuh_tc_large_t *l, size_t size, unsigned label)
{
    l->state = CUH_TC_LIVE;
    l->requested = size;
    l->label = (uint8_t)label;
    l->ops++;
    return l->addr;
}

/* Its block back, its fence recorded. */
static inline void cuh_hp_slot_give(cuh_tc_large_t *l, cuh_heap_freed_t *freed)
{
    l->state = CUH_TC_CACHED;
    l->ops++;
    if (freed)
        *freed = (cuh_heap_freed_t){.requested = l->requested, .label = l->label};
}

/* Fast path of a device-wide malloc labelled `label` (0: none): the block
 * this thread's slot holds, if it has the request's size and its fence is
 * done. 0 if not; a fence found running is marked asked, and the heap's
 * take-back does not ask again. */
static inline uintptr_t cuh_hp_tcache_alloc_device_wide(cuh_heap_t *h, size_t size, unsigned label)
{
    cuh_tcache_t *tc = cuh_hp_my_tcache(h);
    if (!tc)
        return 0;
    uintptr_t addr = 0;
    cuh_spin_lock(&tc->lock);
    cuh_tc_large_t *l = &tc->large;
    if (cuh_hp_slot_serves(l, size)) {
        if (cuh_unlikely(l->ops >= l->budget)) {   /* this one takes the timeline's sample */
            cuh_spin_unlock(&tc->lock);
            return cuh_hp_device_wide_slot_sample_take(h, tc, size, label);
        }
        if (h->dev->ops->event_query(h->dev, l->event) == CUH_DEV_OK)
            addr = cuh_hp_slot_take(l, size, label);
        else
            l->asked = 1;
    }
    cuh_spin_unlock(&tc->lock);
    return addr;
}

/* Fast path of a device-wide free: the block this thread's slot handed out
 * goes back to it behind a device-wide fence recorded now. 0 if the heap
 * must see the free (not the slot's block, or the fence failed: the heap
 * tries again and judges). */
static inline int cuh_hp_tcache_free_device_wide(cuh_heap_t *h, uintptr_t addr, cuh_heap_freed_t *freed)
{
    cuh_tcache_t *tc = cuh_hp_my_tcache(h);
    if (!tc)
        return 0;
    int done = 0;
    cuh_spin_lock(&tc->lock);
    cuh_tc_large_t *l = &tc->large;
    if (cuh_hp_slot_handed_out(l, addr)) {
        if (cuh_unlikely(l->ops >= l->budget)) {   /* this one takes the timeline's sample */
            cuh_spin_unlock(&tc->lock);
            return cuh_hp_device_wide_slot_sample_free(h, tc, addr, freed);
        }
        if (h->dev->ops->event_record_all(h->dev, l->event) == CUH_DEV_OK) {
            cuh_hp_slot_give(l, freed);
            done = 1;
        }
    }
    cuh_spin_unlock(&tc->lock);
    return done;
}

#endif /* CUH_HEAP_INTERNAL_H */
