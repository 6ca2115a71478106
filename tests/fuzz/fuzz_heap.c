/* fuzz_heap.c - a coverage-guided search for a broken rule of the heap.
 *
 * The random-operation models of tests/test_heap*.c draw their operations
 * from a seed; this target reads them from its input, so that libFuzzer can
 * steer towards code the seeds never reach: every setting that changes a
 * path (vmm, page size and margin, thread caches, slabs, IPC-safe blocks,
 * reuse across streams, the workspace, limits, a device without
 * device-wide fences, falling segment addresses), device-wide and
 * stream-ordered frees, record_stream, graph captures and their pools,
 * partial completion of streams' work, polls, cache releases, limit
 * changes, memory other processes take, streams destroyed and made again,
 * double frees and foreign pointers; and it renders every report of the
 * heap's state now and then.
 *
 * After every step it checks what DESIGN.md promises:
 *  - a block is aligned to 512 bytes and overlaps no live block;
 *  - bytes a block freed on stream s used (by address, and under vmm:1 by
 *    physical page) go to another stream only once s's work up to the free
 *    is done or that stream waits for it; a block freed device-wide counts as
 *    used by every stream, one allocated device-wide is used by every stream
 *    at once; a block of a graph pool waits for the pool's release too;
 *  - a page stays mapped where it was while work on it may still run;
 *  - no event call, device synchronize or segment free during a capture;
 *  - a double free says so, a pointer inside a block or outside the heap
 *    is refused, and neither changes anything;
 *  - an allocation fails only with CUHEAP_ERR_OUT_OF_MEMORY, and under
 *    vmm:1 never while free memory is plentiful;
 *  - requested bytes equal the live requests, the books are sound
 *    (cuh_heap_check), and at the end every byte and event goes back.
 * A broken rule aborts with a message naming the step.
 *
 * Built with clang's -fsanitize=fuzzer by `make fuzz`; built without it
 * (FUZZ_MAIN) it runs the files or folders given on the command line, which
 * is how `make test` replays tests/fuzz/corpus/heap.
 */
#include "common.h"
#include "device.h"
#include "heap.h"
#include "../heap_model.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef FUZZ_FAULTS
#define FUZZ_FAULTS 0
#endif

#define KiB CUH_KiB
#define MiB CUH_MiB
#define GiB CUH_GiB

enum { SLOTS = 48, NSTREAMS = 3, MAX_PIECES = 100000, MAX_OPS = 4000 };

/* A stream that never runs work: waits_for on it means "done". */
#define PROBE ((cuh_stream_t)0x9000)

static const cuh_stream_t streams[NSTREAMS] = {0, (cuh_stream_t)0x1000, (cuh_stream_t)0x2000};

typedef struct input_s {
    const uint8_t *p;
    size_t left;
} input_t;

static unsigned take8(input_t *in)
{
    if (!in->left)
        return 0;
    in->left--;
    return *in->p++;
}

static unsigned take16(input_t *in)
{
    unsigned lo = take8(in);
    return lo | take8(in) << 8;
}

typedef struct slot_s {
    uintptr_t addr;
    size_t size;
    cuh_stream_t stream;
    int device_wide;
    unsigned users;   /* bit k: streams[k] uses it too (record_stream) */
    uint64_t pool;    /* allocated during a capture into this pool's generation, else 0 */
} slot_t;

typedef struct run_s {
    cuh_device_t *dev;       /* what the heap calls: the simulated GPU, behind a fault plan in fuzz_faults */
    cuh_device_t *sim;
    int lost_seen;           /* the device was lost (fuzz_faults): the simulated GPU's work was dropped */
    cuh_heap_t *heap;
    size_t page;        /* vmm_page, or 2 MiB: sizes of whole pages */
    size_t capacity;
    int vmm;
    int limited;             /* a limit is set */
    int external;            /* others hold device memory */
    slot_t slot[SLOTS];
    heap_model_t model;      /* what frees left behind (tests/heap_model.h) */
    uint64_t capture_pool;   /* 0: none underway */
    int pool_live[4];        /* pools 1..3 captured and not yet released */
    /* The heap knows pools 1..3 by number, and a number captured into again
     * after its release is a new pool (a new graph): the model tells them
     * apart by generation, numbered from 1 across all pools. */
    uint64_t pool_gen[4];
    uint64_t last_gen;
    cuh_sim_counters_t at_capture;
    int op;
    int verbose;             /* FUZZ_HEAP_VERBOSE set: each step on stderr */
    char conf[256];
} run_t;

#define SAY(r, ...)                           \
    do {                                      \
        if ((r)->verbose)                     \
            fprintf(stderr, __VA_ARGS__);     \
    } while (0)

__attribute__((format(printf, 2, 3), noreturn)) static void broken(const run_t *r, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "fuzz_heap: settings '%s', step %d: ", r->conf, r->op);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}


/* Settings from the input's first two bytes. */
static void settings(input_t *in, run_t *r, int *device_fences, int *top_down)
{
    unsigned a = take8(in), b = take8(in);
    static const char *const limits[] = {"", ",limit:64M", ",limit:160M", ",limit:400M"};
    static const char *const small[] = {"", ",small_max:0", ",small_max:1M", ""};
    r->vmm = a & 1;
    r->page = r->vmm && (b & 0x10) ? 4 * MiB : 2 * MiB;
    r->limited = (b & 3) != 0;
    snprintf(r->conf, sizeof r->conf, "vmm:%d%s%s%s%s%s%s%s%s%s%s%s", r->vmm, r->page == 4 * MiB ? ",vmm_page:4M" : "",
             r->vmm && (b & 0x80) ? ",vmm_unit:16M" : "",
             r->vmm && (b & 0x20) ? ",vmm_margin:0" : "", small[(a >> 1) & 3], (a & 8) ? ",thread_cache:0" : "",
             !r->vmm && (a & 0x10) ? ",ipc_safe:1" : "", (a & 0x20) ? ",reuse_across_streams:1" : "",
             (a & 0x40) ? ",wait_before_grow:0" : "", (b & 4) && !(!r->vmm && (a & 0x10)) ? ",workspace:32M" : "",
             (b & 8) && !r->vmm ? ",grow_fraction:0,segment_min:20M" : "", limits[b & 3]);
    *device_fences = !(a & 0x80);
    *top_down = (b & 0x40) != 0;
}

/* The size of an allocation from two input bytes and a kind. */
static size_t size_of(unsigned kind, unsigned v)
{
    switch (kind % 5) {
    case 0:
        return 1 + v % (96 * KiB);   /* slabs */
    case 1:
        return 1 + (size_t)v * 48;   /* up to 3 MiB */
    case 2:
        return 1 + (size_t)v * 384;  /* up to 24 MiB */
    case 3:
        return (1 + v % 3) * 12 * MiB;   /* recurring sizes */
    default:
        return (size_t)(1 + v % 16) * 2 * MiB;   /* whole pages */
    }
}

static int generation_live(const run_t *r, uint64_t gen)
{
    for (int p = 1; p <= 3; p++)
        if (gen && r->pool_live[p] && r->pool_gen[p] == gen)
            return 1;
    return 0;
}

/* The model's question: is that pool generation not yet released? */
static int model_pool_live(void *ctx, uint64_t gen) { return generation_live(ctx, gen); }

static void model_fail(void *ctx, const char *what) { broken(ctx, "%s", what); }

/* The generation of the pool being captured, or 0. */
static uint64_t capture_gen(const run_t *r) { return r->capture_pool ? r->pool_gen[r->capture_pool] : 0; }

static void check_new_block(run_t *r, int i)
{
    const slot_t *s = &r->slot[i];
    if (!s->addr || s->addr % 512)
        broken(r, "block 0x%lx of %zu bytes is not aligned to 512", (unsigned long)s->addr, s->size);
    for (int k = 0; k < SLOTS; k++)
        if (k != i && r->slot[k].addr && heap_model_overlap(s->addr, s->size, r->slot[k].addr, r->slot[k].size))
            broken(r, "block 0x%lx+%zu overlaps live block 0x%lx+%zu", (unsigned long)s->addr, s->size,
                   (unsigned long)r->slot[k].addr, r->slot[k].size);
    heap_model_check(&r->model, s->addr, s->size, s->stream, s->device_wide, streams, NSTREAMS);
}

static size_t live_requested(const run_t *r)
{
    size_t n = 0;
    for (int k = 0; k < SLOTS; k++)
        if (r->slot[k].addr)
            n += r->slot[k].size;
    return n;
}

static void books_ok(run_t *r)
{
    char msg[512];
    if (cuh_heap_check(r->heap, msg, sizeof msg))
        broken(r, "books unsound: %s", msg);
    cuheap_stats_t st;
    cuh_heap_stats(r->heap, &st);
    if (st.requested.current != live_requested(r))
        broken(r, "requested bytes %llu, live requests %zu", (unsigned long long)st.requested.current,
               live_requested(r));
}

/* Device calls failed on purpose so far (fuzz_faults), 0 in fuzz_heap. */
static uint64_t injected(const run_t *r)
{
    uint64_t n = 0;
#if FUZZ_FAULTS
    for (int k = 0; k < CUH_FAULT_NUM_CALLS; k++)
        n += cuh_fault_injected(r->dev, (cuh_fault_call_t)k);
#else
    (void)r;
#endif
    return n;
}

/* The device's sticky error, 0 while it is not lost. */
static int lost(const run_t *r)
{
    return atomic_load_explicit(&r->dev->lost, memory_order_relaxed);
}

/* A call made on a lost device: refused with a device error that says so,
 * and nothing changed. 1 if the device was lost. */
static int refused_lost(run_t *r, int was_lost, const cuheap_stats_t *before, cuheap_status_t rc, const char *what)
{
    if (!was_lost)
        return 0;
    if (rc != CUHEAP_ERR_DEVICE || !strstr(cuh_get_error(), "cuheap refuses new work"))
        broken(r, "%s on a lost device answered %s (%s), not the device's error", what, cuheap_status_string(rc),
               cuh_get_error());
    cuheap_stats_t now;
    cuh_heap_stats(r->heap, &now);
    if (now.num_allocs != before->num_allocs || now.num_frees != before->num_frees ||
        now.requested.current != before->requested.current || now.reserved.current != before->reserved.current)
        broken(r, "%s on a lost device changed the statistics", what);
    SAY(r, "  (refused: %s)\n", cuh_get_error());
    return 1;
}

/* A public call failed with `rc` after `before` injected failures: only a
 * device error it met may explain it, and its message says which call. */
static int failed_by_fault(run_t *r, uint64_t before, cuheap_status_t rc, const char *what)
{
    if (rc != CUHEAP_ERR_DEVICE || injected(r) == before)
        return 0;
    if (!strstr(cuh_get_error(), "failed: injected"))
        broken(r, "%s failed with a device error whose message names no failed call: %s", what, cuh_get_error());
    SAY(r, "  (failed by a fault: %s)\n", cuh_get_error());
    return 1;
}

static void do_alloc(run_t *r, int i, unsigned how, size_t size)
{
    slot_t *s = &r->slot[i];
    s->size = size;
    s->stream = streams[how % NSTREAMS];
    s->device_wide = (how >> 2) % 4 == 0;
    s->users = 0;
    s->pool = capture_gen(r);
    int shareable = s->device_wide && (how >> 4) % 4 == 0;
    cuheap_stats_t st;
    cuh_heap_stats(r->heap, &st);
    SAY(r, "  malloc%s %zu on %#lx\n", shareable ? "_shareable" : s->device_wide ? "_device_wide" : "", size,
        (unsigned long)s->stream);
    uint64_t faults = injected(r);
    int was_lost = lost(r);
    cuheap_status_t rc = shareable       ? cuh_heap_malloc_shareable(r->heap, size, &s->addr)
                         : s->device_wide ? cuh_heap_malloc_device_wide(r->heap, size, &s->addr)
                                          : cuh_heap_malloc(r->heap, size, s->stream, &s->addr);
    if (refused_lost(r, was_lost, &st, rc, "malloc") || failed_by_fault(r, faults, rc, "malloc")) {
        if (s->addr)
            broken(r, "a refused malloc gave an address");
        s->addr = 0;
        return;
    }
    if (rc == CUHEAP_ERR_OUT_OF_MEMORY && injected(r) != faults) {
        s->addr = 0;   /* a device call that failed with out-of-memory: a fault plan's */
        return;
    }
    if (rc == CUHEAP_ERR_OUT_OF_MEMORY) {
        /* Under vmm:1 free pages move to where they are needed: with room
         * for every live block twice over (a page each besides), no limit
         * and nobody else on the device, a request must succeed. */
        size_t need = 2 * (live_requested(r) + size) + (SLOTS + 2) * 2 * r->page + 64 * MiB;
        int pools = r->pool_live[1] || r->pool_live[2] || r->pool_live[3];
        if (r->vmm && !r->limited && !r->external && !pools && need <= r->capacity)
            broken(r, "malloc of %zu bytes ran out of memory with %zu live on a %zu-byte device", size,
                   live_requested(r), r->capacity);
        s->addr = 0;
        return;
    }
    if (rc != CUHEAP_OK)
        broken(r, "malloc of %zu bytes failed: %s", size, cuheap_status_string(rc));
    check_new_block(r, i);
    if (!s->device_wide && (how >> 6) % 4 == 0) {
        int u = (int)((how >> 8) % NSTREAMS);
        if (streams[u] != s->stream) {
            SAY(r, "  record_stream 0x%lx on %#lx\n", (unsigned long)s->addr, (unsigned long)streams[u]);
            if (cuh_heap_record_stream(r->heap, s->addr, streams[u]) != CUHEAP_OK)
                broken(r, "record_stream on a live block failed");
            s->users |= 1u << u;
        }
    }
}

static void do_free(run_t *r, int i, unsigned how)
{
    slot_t *s = &r->slot[i];
    int wide = s->device_wide || (how & 3) == 0;
    /* The block's last kernels: on every stream before a device-wide free,
     * else on its stream and the streams record_stream added. */
    /* A block of one pool freed while another's graph is captured: both
     * graphs may use it. */
    uint64_t also = capture_gen(r) != s->pool ? capture_gen(r) : 0;
    const size_t pieces_before = r->model.num;
    for (int k = 0; k < NSTREAMS; k++) {
        if (!wide && streams[k] != s->stream && !(s->users >> k & 1))
            continue;
        heap_model_add(&r->model, s->addr, s->size, streams[k], cuh_sim_enqueue_work(r->sim, streams[k]), s->pool,
                       also);
    }
    SAY(r, "  free%s 0x%lx (%zu) on %#lx\n", wide ? "_device_wide" : "", (unsigned long)s->addr, s->size,
        (unsigned long)s->stream);
    uint64_t faults = injected(r);
    int was_lost = lost(r);
    cuheap_stats_t st;
    cuh_heap_stats(r->heap, &st);
    cuheap_status_t rc = wide ? cuh_heap_free_device_wide(r->heap, s->addr) : cuh_heap_free(r->heap, s->addr, s->stream);
    if (refused_lost(r, was_lost, &st, rc, "free") || failed_by_fault(r, faults, rc, "free")) {
        /* Refused: the block stays the program's, to be freed again, and
         * what this free would have told the model (a graph pool holding
         * the block, if a capture is underway) did not happen. */
        r->model.num = pieces_before;
        return;
    }
    if (rc != CUHEAP_OK)
        broken(r, "free of live block 0x%lx failed: %s", (unsigned long)s->addr, cuheap_status_string(rc));
    uintptr_t gone = s->addr;
    s->addr = 0;
    if ((how >> 2) % 8 == 0) {
        /* Freed again at once: a double free, and nothing changes. */
        cuheap_stats_t a, b;
        cuh_heap_stats(r->heap, &a);
        SAY(r, "  free%s 0x%lx again\n", (how >> 5) & 1 ? "_device_wide" : "", (unsigned long)gone);
        int lost_now = lost(r);
        rc = (how >> 5) & 1 ? cuh_heap_free_device_wide(r->heap, gone) : cuh_heap_free(r->heap, gone, s->stream);
        if (refused_lost(r, lost_now, &a, rc, "a double free"))
            return;
        if (rc != CUHEAP_ERR_DOUBLE_FREE)
            broken(r, "a second free of 0x%lx answered %s, not a double free", (unsigned long)gone,
                   cuheap_status_string(rc));
        cuh_heap_stats(r->heap, &b);
        if (a.num_frees != b.num_frees || a.requested.current != b.requested.current)
            broken(r, "a double free changed the statistics");
    }
}

static void do_foreign_free(run_t *r, int i, unsigned how)
{
    const slot_t *s = &r->slot[i];
    cuheap_stats_t a, b;
    cuh_heap_stats(r->heap, &a);
    cuheap_status_t rc;
    int was_lost = lost(r);
    if (s->addr && s->size > 512) {
        uintptr_t inside = s->addr + (s->size > 1024 && how % 2 ? 1024 : 512);
        SAY(r, "  free 0x%lx, inside block 0x%lx (%zu)\n", (unsigned long)inside, (unsigned long)s->addr, s->size);
        rc = cuh_heap_free(r->heap, inside, s->stream);
        if (refused_lost(r, was_lost, &a, rc, "a free inside a block"))
            return;
        if (rc != CUHEAP_ERR_INVALID_ARGUMENT && rc != CUHEAP_ERR_NOT_OWNED)
            broken(r, "a free inside live block 0x%lx answered %s", (unsigned long)s->addr, cuheap_status_string(rc));
    } else {
        rc = cuh_heap_free(r->heap, (uintptr_t)0x10000 + 512 * how, streams[how % NSTREAMS]);
        if (refused_lost(r, was_lost, &a, rc, "a free outside the heap"))
            return;
        if (rc != CUHEAP_ERR_NOT_OWNED)
            broken(r, "a free of a pointer outside the heap answered %s", cuheap_status_string(rc));
    }
    cuh_heap_stats(r->heap, &b);
    if (a.num_frees != b.num_frees || a.requested.current != b.requested.current)
        broken(r, "a refused free changed the statistics");
}

/* The heap as every report shows it, rendered where nobody reads it: the
 * renderers must take any state the heap can be in. */
static void render_reports(run_t *r)
{
    /* Asking the device half the time (a fault plan may fail its answer). */
    cuh_heap_snapshot_t *snap = cuh_heap_snapshot(r->heap, r->op & 1);
    if (!snap)
        broken(r, "no snapshot");
    FILE *out = fopen("/dev/null", "w");
    if (!out)
        abort();
    cuh_report_origin_t origin = cuh_report_origin_now();
    cuh_report_text(out, origin, &snap, 1, NULL);
    cuh_report_json(out, origin, &snap, 1, NULL);
    cuh_report_html(out, origin, &snap, 1, NULL);
    fclose(out);
    cuh_heap_snapshot_free(snap);
}

static void capture_begin(run_t *r, unsigned pool)
{
    if (r->capture_pool)
        return;
    r->capture_pool = 1 + pool % 3;
    SAY(r, "  capture into pool %llu\n", (unsigned long long)r->capture_pool);
    if (!r->pool_live[r->capture_pool])
        r->pool_gen[r->capture_pool] = ++r->last_gen;
    r->pool_live[r->capture_pool] = 1;
    cuh_sim_counters(r->sim, &r->at_capture);
    cuh_sim_capturing(r->sim, 1);
    cuh_heap_capture_begin(r->heap, r->capture_pool);
}

/* During a capture the heap made no event call, waited for nothing and
 * freed no segment: any of them would break the capture. */
static void capture_check(run_t *r)
{
    if (!r->capture_pool)
        return;
    cuh_sim_counters_t c;
    cuh_sim_counters(r->sim, &c);
    const cuh_sim_counters_t *b = &r->at_capture;
    if (heap_model_capture_broken(b, &c))
        broken(r, "during a capture: %llu events recorded, %llu queried, %llu waited for, %llu stream waits, %llu "
                  "synchronizes, %llu segments and %llu pages freed",
               (unsigned long long)(c.events_recorded - b->events_recorded),
               (unsigned long long)(c.event_queries - b->event_queries),
               (unsigned long long)(c.event_waits - b->event_waits),
               (unsigned long long)(c.stream_waits - b->stream_waits),
               (unsigned long long)(c.synchronizes - b->synchronizes),
               (unsigned long long)(c.mem_frees - b->mem_frees), (unsigned long long)(c.vm_releases_used - b->vm_releases_used));
}

static void capture_end(run_t *r)
{
    if (!r->capture_pool)
        return;
    capture_check(r);
    cuh_heap_capture_end(r->heap);
    cuh_sim_capturing(r->sim, 0);
    r->capture_pool = 0;
}

static void release_pool(run_t *r, unsigned pool)
{
    uint64_t p = 1 + pool % 3;
    if (r->capture_pool == p || !r->pool_live[p])
        return;
    SAY(r, "  release pool %llu\n", (unsigned long long)p);
    cuh_heap_release_pool(r->heap, p);
    r->pool_live[p] = 0;
    for (int k = 0; k < SLOTS; k++)
        if (r->slot[k].pool == r->pool_gen[p])
            r->slot[k].pool = 0;   /* live blocks become ordinary ones */
}

#if FUZZ_FAULTS
/* A fault plan from the input: the Nth call of a kind, a kind failing at
 * random, a sticky error some calls from now, or no plan. */
static void plan_fault(run_t *r, unsigned arg, unsigned how)
{
    cuh_fault_call_t call = (cuh_fault_call_t)(arg % CUH_FAULT_NUM_CALLS);
    int alloc_call = call == CUH_FAULT_MEM_ALLOC || call == CUH_FAULT_VM_CREATE || call == CUH_FAULT_HOST_ALLOC ||
                     call == CUH_FAULT_VM_RESERVE;
    cuh_dev_status_t status = alloc_call && (how & 0x100) ? CUH_DEV_OOM : CUH_DEV_ERROR;
    switch (how % 8) {
    case 0: case 1: case 2: case 3:
        SAY(r, "  fault: call %u of %s from now fails (%s)\n", 1 + (how >> 3) % 8, cuh_fault_call_name(call),
            status == CUH_DEV_OOM ? "out of memory" : "error");
        cuh_fault_nth(r->dev, call, 1 + (how >> 3) % 8, status);
        break;
    case 4: case 5:
        SAY(r, "  fault: each %s fails with probability 1/%u\n", cuh_fault_call_name(call), 2 + (how >> 3) % 15);
        cuh_fault_random(r->dev, call, 1.0 / (2 + (how >> 3) % 15), how, status);
        break;
    case 6:
        SAY(r, "  fault: a sticky error in %u calls\n", 1 + (how >> 3) % 64);
        cuh_fault_sticky(r->dev, 1 + (how >> 3) % 64, CUH_DEV_ERROR);
        break;
    default:
        SAY(r, "  fault: no plan\n");
        cuh_fault_clear(r->dev);
        break;
    }
}
#endif

static void one_run(const uint8_t *data, size_t size)
{
    input_t in = {data, size};
    run_t *r = calloc(1, sizeof *r);
    if (!r)
        abort();
    int device_fences, top_down;
    settings(&in, r, &device_fences, &top_down);
    r->capacity = GiB;
    cuh_config_t cfg;
    char err[512];
    cuh_config_defaults(&cfg);
    if (cuh_config_parse(r->conf, &cfg, err, sizeof err))
        broken(r, "settings refused: %s", err);
    r->sim = cuh_sim_create(&(cuh_sim_params_t){.capacity = r->capacity, .top_down = top_down});
    r->dev = FUZZ_FAULTS && r->sim ? cuh_fault_wrap(r->sim) : r->sim;
    if (!r->dev)
        abort();
    cuh_sim_hold_events(r->sim, 1);
    cuh_sim_device_fences(r->sim, device_fences);
    r->heap = cuh_heap_create(r->dev, &cfg, err, sizeof err);
    if (!r->heap)
        broken(r, "heap creation failed: %s", err);
    for (int k = 1; k < NSTREAMS; k++)
        if (cuh_heap_register_stream(r->heap, streams[k]) != CUHEAP_OK)
            broken(r, "register_stream failed");
    /* The model follows the device's 2 MiB granules: a heap page of 4 MiB
     * need not start on a 4 MiB boundary of the address space, and a granule
     * is named exactly by its physical allocation and offset into it. */
    r->model = heap_model_new(r->sim, 2 * MiB, PROBE, MAX_PIECES, model_fail, r);
    r->model.pool_live = model_pool_live;
    r->verbose = getenv("FUZZ_HEAP_VERBOSE") != NULL;
    SAY(r, "settings %s, device-wide fences %d, falling addresses %d\n", r->conf, device_fences, top_down);
    for (r->op = 0; in.left && r->op < MAX_OPS; r->op++) {
        unsigned op = take8(&in), arg = take8(&in);
        int i = (int)(arg % SLOTS);
        static const char *const names[] = {"malloc/free", "malloc/free", "malloc/free", "malloc/free",
                                            "malloc/free", "malloc/free", "complete stream", "complete up to",
                                            "poll", "release cached", "foreign free", "capture begin/end",
                                            "release pool", "set limit", "assume contention", "external memory",
                                            "reports", "retire stream", "fault plan"};
        enum { NUM_OPS = FUZZ_FAULTS ? 19 : 18 };
        SAY(r, "step %d: %s, slot %d, arg %u\n", r->op, names[op % NUM_OPS], i, arg);
        uint64_t faults_before = injected(r);
        switch (op % NUM_OPS) {
        case 0: case 1: case 2: case 3: case 4: case 5:
            if (r->slot[i].addr)
                do_free(r, i, take8(&in));
            else {
                unsigned how = take16(&in);
                do_alloc(r, i, how, size_of(op / 16, take16(&in)));
            }
            break;
        case 6:
            cuh_sim_complete_stream(r->sim, streams[arg % NSTREAMS]);
            break;
        case 7:
            if (r->model.num) {
                const heap_model_piece_t *p = &r->model.pieces[take16(&in) % r->model.num];
                cuh_sim_complete_stream_upto(r->sim, p->stream, p->pos);
            }
            break;
        case 8:
            cuh_heap_poll(r->heap);
            break;
        case 9:
            if (cuh_heap_release_cached(r->heap) != CUHEAP_OK)
                broken(r, "release_cached failed");
            break;
        case 10:
            do_foreign_free(r, i, take8(&in));
            break;
        case 11:
            if (r->capture_pool)
                capture_end(r);
            else
                capture_begin(r, arg);
            break;
        case 12:
            release_pool(r, arg);
            break;
        case 13: {
            static const size_t limits[] = {0, 96 * MiB, 256 * MiB, 768 * MiB};
            r->limited = (arg & 3) != 0;
            cuh_heap_set_limit(r->heap, limits[arg & 3]);
            break;
        }
        case 14:
            /* Short contention (threads' large blocks), or long enough for
             * the chunks of heap_chunks.c (8 large allocations first). */
            cuh_heap_assume_contention(r->heap, arg & 0x40 ? 4096 : 1 + arg % 64);
            cuh_heap_assume_waits(r->heap, (arg & 0x40) != 0);
            break;
        case 15:
            cuh_sim_set_external(r->sim, (size_t)(arg % 4) * 256 * MiB);
            r->external = arg % 4 != 0;
            break;
        case 16:
            render_reports(r);
            break;
#if FUZZ_FAULTS
        case 18:
            plan_fault(r, arg, take16(&in));
            break;
#endif
        case 17:
            /* The program destroys a stream and makes another with the
             * same handle: a new stream to the heap. */
            if (!r->capture_pool) {
                cuh_heap_retire_stream(r->heap, streams[1 + arg % 2]);
                if (cuh_heap_register_stream(r->heap, streams[1 + arg % 2]) != CUHEAP_OK)
                    broken(r, "register_stream after a retirement failed");
            }
            break;
        }
        capture_check(r);
        if (injected(r) != faults_before)
            SAY(r, "  (%llu device calls failed on purpose, the last: %s)\n",
                (unsigned long long)(injected(r) - faults_before), cuh_dev_error_text(r->dev));
        if (lost(r) && !r->lost_seen) {
            /* A lost context runs no more work: what was queued never
             * touches memory again. */
            SAY(r, "  (the device is lost)\n");
            r->lost_seen = 1;
            cuh_sim_complete_all(r->sim);
        }
        r->lost_seen &= lost(r) != 0;   /* a plan cleared: the device works again */
        heap_model_prune(&r->model);
        books_ok(r);
    }
#if FUZZ_FAULTS
    /* The plan ends: every block, page and event must now go back. */
    cuh_fault_clear(r->dev);
    uint64_t waits_failed = cuh_fault_injected(r->dev, CUH_FAULT_EVENT_WAIT) +
                            cuh_fault_injected(r->dev, CUH_FAULT_SYNCHRONIZE);
#else
    uint64_t waits_failed = 0;
#endif
    capture_end(r);
    for (int k = 0; k < SLOTS; k++)
        if (r->slot[k].addr)
            do_free(r, k, 1);
    for (uint64_t p = 1; p <= 3; p++)
        release_pool(r, (unsigned)p - 1);
    cuh_sim_complete_all(r->sim);
    heap_model_prune(&r->model);
    if (cuh_heap_release_cached(r->heap) != CUHEAP_OK)
        broken(r, "release_cached failed");
    books_ok(r);
    cuheap_stats_t st;
    cuh_heap_stats(r->heap, &st);
    if (st.allocated.current || st.pending.current)
        broken(r, "after every free: %llu bytes allocated, %llu pending", (unsigned long long)st.allocated.current,
               (unsigned long long)st.pending.current);
    cuh_sim_counters_t c;
    cuh_sim_counters(r->sim, &c);
    if (st.num_cpu_waits != c.event_waits + c.synchronizes + waits_failed)
        broken(r, "%llu CPU waits counted, the device saw %llu (and %llu failed on purpose)",
               (unsigned long long)st.num_cpu_waits, (unsigned long long)(c.event_waits + c.synchronizes),
               (unsigned long long)waits_failed);
    cuh_heap_destroy(r->heap);
    cuh_sim_counters(r->sim, &c);
    if (c.used || c.live_events)
        broken(r, "destroyed, the heap left %zu bytes and %llu events on the device", c.used,
               (unsigned long long)c.live_events);
    r->dev->ops->destroy(r->dev);
    free(r->model.pieces);
    free(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    one_run(data, size);
    return 0;
}

#ifdef FUZZ_MAIN
#include "fuzz_main.h"
#endif
