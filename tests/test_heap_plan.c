/* test_heap_plan.c - step plans, step_plan:1 (src/heap_plan.c): steps that
 * repeat get a layout learned from them, and once it is in force they put
 * every block where they put it the step before and move no page (without
 * step_plan the same steps keep moving pages); a step that asks for
 * something else is served as always and drops the plan, whose room serves
 * again, and releasing cached memory or a request that would run out of
 * memory gives the room back; a planned block freed on another stream does not go back to the
 * room; a device that refuses maps and memory leaves sound books; over
 * random repeating steps with deviations, other streams and cudaFree, no
 * block reuses memory before the work of the block before it, by address or
 * by physical page (heap_model.h).
 */
#include "heap_test.h"

/* One step of a job that moves pages every step (vmm_margin:0): 24
 * blocks of 2 MiB, every other one freed, three blocks of 8 MiB where the
 * freed ones leave only holes of 2 MiB, then everything freed. addrs gets
 * the step's 27 addresses in order of allocation. */
enum { STEP_BLOCKS = 27 };

static void checkerboard_step(cuh_heap_t *heap, uintptr_t *addrs, size_t big)
{
    uintptr_t small[24], large[3];
    for (int i = 0; i < 24; i++)
        addrs[i] = small[i] = must_alloc(heap, 2 * MiB, 0);
    for (int i = 0; i < 24; i += 2)
        must_free(heap, small[i], 0);
    for (int i = 0; i < 3; i++)
        addrs[24 + i] = large[i] = must_alloc(heap, big, 0);
    for (int i = 1; i < 24; i += 2)
        must_free(heap, small[i], 0);
    for (int i = 0; i < 3; i++)
        must_free(heap, large[i], 0);
}

/* The same step in cudaMalloc's blocks (LD_PRELOAD), each used by work on
 * stream S1 that the GPU has not run when cudaFree comes. */
static void checkerboard_step_cudamalloc(test_heap_t *t, uintptr_t *addrs, size_t big)
{
    uintptr_t small[24], large[3];
    for (int i = 0; i < 24; i++) {
        assert_int_equal(cuh_heap_malloc_device_wide(t->heap, 2 * MiB, &small[i]), CUHEAP_OK);
        addrs[i] = small[i];
        cuh_sim_enqueue_work(t->dev, S1);
    }
    for (int i = 0; i < 24; i += 2)
        assert_int_equal(cuh_heap_free_device_wide(t->heap, small[i]), CUHEAP_OK);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(cuh_heap_malloc_device_wide(t->heap, big, &large[i]), CUHEAP_OK);
        addrs[24 + i] = large[i];
        cuh_sim_enqueue_work(t->dev, S1);
    }
    for (int i = 1; i < 24; i += 2)
        assert_int_equal(cuh_heap_free_device_wide(t->heap, small[i]), CUHEAP_OK);
    for (int i = 0; i < 3; i++)
        assert_int_equal(cuh_heap_free_device_wide(t->heap, large[i]), CUHEAP_OK);
}

static cuh_snap_plan_t plan_of(cuh_heap_t *heap)
{
    cuh_heap_snapshot_t *snap = cuh_heap_snapshot(heap, 0);
    assert_non_null(snap);
    cuh_snap_plan_t p = snap->plan;
    cuh_heap_snapshot_free(snap);
    return p;
}

/* A heap under a tight limit whose plan is in force: six repeating steps. */
#define PLAN_CONF "vmm:1,small_max:0,vmm_margin:0,limit:128M,step_plan:1"

static void run_steps(cuh_heap_t *heap, int steps)
{
    uintptr_t now[STEP_BLOCKS];
    for (int step = 0; step < steps; step++) {
        checkerboard_step(heap, now, 8 * MiB);
        cuh_heap_mark_step(heap);
    }
    assert_true(plan_of(heap).active);
}

static void test_plan_repeating_steps_stop_moving_pages(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, PLAN_CONF);
    uintptr_t before[STEP_BLOCKS], now[STEP_BLOCKS];
    cuh_sim_counters_t c0, c1;
    int followed_steps = 0;
    for (int step = 0; step < 10; step++) {
        cuh_sim_counters(t.dev, &c0);
        checkerboard_step(t.heap, now, 8 * MiB);
        cuh_heap_poll(t.heap);
        cuh_sim_counters(t.dev, &c1);
        const cuh_snap_plan_t p = plan_of(t.heap);
        if (p.active && p.placed && step >= 1) {
            /* In force for the whole step: where the step before put its
             * blocks, and no page moved. */
            if (followed_steps++) {
                for (int i = 0; i < STEP_BLOCKS; i++)
                    if (now[i] != before[i])
                        fail_msg("step %d: block %d at 0x%lx, the step before at 0x%lx", step, i,
                                 (unsigned long)now[i], (unsigned long)before[i]);
                assert_int_equal(c1.vm_unmaps, c0.vm_unmaps);
                assert_int_equal(c1.vm_maps, c0.vm_maps);
            }
        }
        memcpy(before, now, sizeof now);
        cuh_heap_mark_step(t.heap);
        heap_ok(t.heap);
    }
    const cuh_snap_plan_t p = plan_of(t.heap);
    assert_int_equal(p.made, 1);
    assert_int_equal(p.dropped, 0);
    assert_true(p.active);
    assert_true(followed_steps >= 4);
    assert_true(p.steps_followed >= 4);
    assert_int_equal(p.missed, 0);
    assert_true(p.placed >= 4 * STEP_BLOCKS);
    cuheap_stats_t s;
    cuh_heap_stats(t.heap, &s);
    assert_int_equal(s.num_ooms, 0);
    assert_true(s.reserved.peak <= 56 * MiB);
    all_freed(t.heap);
    test_heap_free(&t);
}

/* cudaMalloc's blocks (LD_PRELOAD) get a plan too: with the GPU behind
 * every cudaFree, the steps repeat their addresses and move no page once it
 * is in force. */
static void test_plan_cudamalloc_steps_stop_moving_pages(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, PLAN_CONF);
    cuh_sim_hold_events(t.dev, 1);
    assert_int_equal(cuh_heap_register_stream(t.heap, S1), CUHEAP_OK);
    uintptr_t before[STEP_BLOCKS], now[STEP_BLOCKS];
    cuh_sim_counters_t c0, c1;
    int followed_steps = 0;
    for (int step = 0; step < 10; step++) {
        cuh_sim_counters(t.dev, &c0);
        checkerboard_step_cudamalloc(&t, now, 8 * MiB);
        cuh_sim_counters(t.dev, &c1);
        const cuh_snap_plan_t p = plan_of(t.heap);
        if (p.active && p.placed && followed_steps++) {
            assert_memory_equal(now, before, sizeof now);
            assert_int_equal(c1.vm_unmaps, c0.vm_unmaps);
            assert_int_equal(c1.vm_maps, c0.vm_maps);
        }
        memcpy(before, now, sizeof now);
        cuh_sim_complete_all(t.dev);
        cuh_heap_mark_step(t.heap);
        heap_ok(t.heap);
    }
    const cuh_snap_plan_t p = plan_of(t.heap);
    assert_int_equal(p.made, 1);
    assert_int_equal(p.dropped, 0);
    assert_true(followed_steps >= 4);
    assert_int_equal(p.missed, 0);
    cuheap_stats_t s;
    cuh_heap_stats(t.heap, &s);
    assert_int_equal(s.num_ooms, 0);
    all_freed(t.heap);
    test_heap_free(&t);
}

/* A program that marks no steps (LD_PRELOAD, the C API) gets its plan from
 * the steps found in its allocations (step_detect.h), for blocks on a
 * stream and for cudaMalloc's alike; once it is in force no page moves. */
static void plan_from_steps_found(int cudamalloc)
{
    test_heap_t t = test_heap_new(GiB, PLAN_CONF);
    if (cudamalloc) {
        cuh_sim_hold_events(t.dev, 1);
        assert_int_equal(cuh_heap_register_stream(t.heap, S1), CUHEAP_OK);
    }
    uintptr_t now[STEP_BLOCKS];
    cuh_sim_counters_t c0, c1;
    int quiet_steps = 0;
    for (int step = 0; step < 12; step++) {
        cuh_sim_counters(t.dev, &c0);
        if (cudamalloc)
            checkerboard_step_cudamalloc(&t, now, 8 * MiB);
        else
            checkerboard_step(t.heap, now, 8 * MiB);
        cuh_sim_complete_all(t.dev);
        cuh_sim_counters(t.dev, &c1);
        quiet_steps = c1.vm_unmaps == c0.vm_unmaps && c1.vm_maps == c0.vm_maps ? quiet_steps + 1 : 0;
        heap_ok(t.heap);
    }
    const cuh_snap_plan_t p = plan_of(t.heap);
    assert_int_equal(p.found_period, STEP_BLOCKS);
    assert_true(p.steps_found >= 6);
    assert_int_equal(p.made, 1);
    assert_int_equal(p.dropped, 0);
    assert_true(p.active);
    assert_true(p.placed >= 5 * STEP_BLOCKS);
    /* Found once the step has repeated in full, and planned at once from
     * the two steps found (without cutting them out of the record, the plan
     * would come two steps later). */
    assert_true(quiet_steps >= 8);
    all_freed(t.heap);
    test_heap_free(&t);
}

static void test_plan_from_steps_found_in_the_allocations(void **state)
{
    (void)state;
    plan_from_steps_found(0);
    plan_from_steps_found(1);
}

/* When the steps found change and no new one is in sight, the plan goes at
 * once (no mark will come to drop it), its room back for the requests that
 * differ. */
static void test_plan_from_found_steps_goes_when_they_change(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, PLAN_CONF);
    uintptr_t now[STEP_BLOCKS];
    for (int step = 0; step < 8; step++)
        checkerboard_step(t.heap, now, 8 * MiB);
    assert_true(plan_of(t.heap).active);
    /* Every step from here asks for other sizes: the first large one differs. */
    checkerboard_step(t.heap, now, 6 * MiB);
    const cuh_snap_plan_t p = plan_of(t.heap);
    assert_false(p.active);
    assert_int_equal(p.dropped, 1);
    assert_int_equal(p.room_bytes, 0);
    for (int step = 0; step < 3; step++)
        checkerboard_step(t.heap, now, (size_t)(3 + step) * MiB + 4 * KiB * (size_t)step);
    heap_ok(t.heap);
    all_freed(t.heap);
    test_heap_free(&t);
}

/* A program that marks its steps is taken at its word: no steps are looked
 * for in its allocations, so steps it leaves unmarked get no plan. */
static void test_plan_a_program_that_marks_is_not_second_guessed(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, PLAN_CONF);
    uintptr_t now[STEP_BLOCKS];
    cuh_heap_mark_step(t.heap);
    for (int step = 0; step < 10; step++)
        checkerboard_step(t.heap, now, 8 * MiB);
    const cuh_snap_plan_t p = plan_of(t.heap);
    assert_int_equal(p.steps_found, 0);
    assert_int_equal(p.made, 0);
    all_freed(t.heap);
    test_heap_free(&t);
}

/* A step too long to record (over 131,072 block allocations and frees) gets
 * no plan, and its record does not grow without end: a program that marks
 * rarely costs bounded host memory. */
static void test_plan_a_step_too_long_to_record_gets_none(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, PLAN_CONF);
    uintptr_t now[STEP_BLOCKS];
    for (int step = 0; step < 4; step++) {
        checkerboard_step(t.heap, now, 8 * MiB);
        for (int i = 0; i < 140000; i++)
            must_free(t.heap, must_alloc(t.heap, 256 * KiB, 0), 0);
        cuh_heap_mark_step(t.heap);
    }
    assert_int_equal(plan_of(t.heap).made, 0);
    /* The same steps, short enough, get one. */
    for (int step = 0; step < 4; step++) {
        checkerboard_step(t.heap, now, 8 * MiB);
        cuh_heap_mark_step(t.heap);
    }
    assert_int_equal(plan_of(t.heap).made, 1);
    all_freed(t.heap);
    test_heap_free(&t);
}

/* Near the limit no plan is made: moving into its window can take as much
 * memory as the window while the step before's blocks are where they were,
 * and running out there would leave the heap cut up. */
static void test_plan_needs_room_to_move_in(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, "vmm:1,small_max:0,vmm_margin:0,limit:56M,step_plan:1");
    uintptr_t now[STEP_BLOCKS];
    cuh_sim_counters_t c0, c1;
    for (int step = 0; step < 8; step++) {
        cuh_sim_counters(t.dev, &c0);
        checkerboard_step(t.heap, now, 8 * MiB);
        cuh_sim_counters(t.dev, &c1);
        if (step >= 2)
            assert_true(c1.vm_unmaps > c0.vm_unmaps);   /* it does move pages every step */
        cuh_heap_mark_step(t.heap);
    }
    assert_false(plan_of(t.heap).made);
    all_freed(t.heap);
    test_heap_free(&t);
}

/* Without step_plan the same steps move pages every step: the plan is what
 * stops them. */
static void test_plan_off_the_same_steps_keep_moving_pages(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, "vmm:1,small_max:0,vmm_margin:0,limit:128M");
    uintptr_t now[STEP_BLOCKS];
    cuh_sim_counters_t c0, c1;
    for (int step = 0; step < 6; step++) {
        cuh_sim_counters(t.dev, &c0);
        checkerboard_step(t.heap, now, 8 * MiB);
        cuh_heap_poll(t.heap);
        cuh_sim_counters(t.dev, &c1);
        if (step >= 2)
            assert_true(c1.vm_unmaps > c0.vm_unmaps);
        cuh_heap_mark_step(t.heap);
    }
    assert_false(plan_of(t.heap).made);
    all_freed(t.heap);
    test_heap_free(&t);
}

/* A step that asks for other sizes is served as always (no overlap, within
 * the limit), and at its mark the plan goes, its room back in the arena:
 * the heap's steps after it run as they did before the plan, and a plan is
 * made again once two steps repeat. */
static void test_plan_a_step_that_differs_drops_the_plan(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, PLAN_CONF);
    uintptr_t now[STEP_BLOCKS];
    run_steps(t.heap, 6);
    cuh_snap_plan_t p = plan_of(t.heap);
    assert_true(p.room_bytes > 0);
    /* 6 MiB where the plan expects 8 MiB: from there on, as always. */
    checkerboard_step(t.heap, now, 6 * MiB);
    heap_ok(t.heap);
    cuh_heap_mark_step(t.heap);
    p = plan_of(t.heap);
    assert_false(p.active);
    assert_int_equal(p.dropped, 1);
    assert_int_equal(p.room_bytes, 0);
    heap_ok(t.heap);
    /* The room is memory again: 48 MiB in one block fits under the limit. */
    uintptr_t all = must_alloc(t.heap, 48 * MiB, 0);
    must_free(t.heap, all, 0);
    for (int step = 0; step < 6; step++) {
        checkerboard_step(t.heap, now, 6 * MiB);
        cuh_heap_mark_step(t.heap);
        heap_ok(t.heap);
    }
    p = plan_of(t.heap);
    assert_true(p.made >= 1);
    cuheap_stats_t s;
    cuh_heap_stats(t.heap, &s);
    assert_int_equal(s.num_ooms, 0);
    all_freed(t.heap);
    test_heap_free(&t);
}

/* Releasing cached memory (torch.cuda.empty_cache) gives back the plan's
 * room too: the plan goes, and nothing but live blocks stays reserved; so
 * does a limit set below what the heap holds. */
static void test_plan_release_cached_gives_the_room_back(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, PLAN_CONF);
    run_steps(t.heap, 6);
    assert_true(plan_of(t.heap).room_bytes > 0);
    uintptr_t keep = must_alloc(t.heap, 2 * MiB, 0);
    cuh_sim_complete_all(t.dev);
    assert_int_equal(cuh_heap_release_cached(t.heap), CUHEAP_OK);
    const cuh_snap_plan_t p = plan_of(t.heap);
    assert_false(p.active);
    assert_int_equal(p.dropped, 1);
    cuheap_stats_t s;
    cuh_heap_stats(t.heap, &s);
    assert_int_equal(s.reserved.current, 2 * MiB);
    heap_ok(t.heap);
    must_free(t.heap, keep, 0);
    /* So does a limit below what the heap holds. */
    run_steps(t.heap, 6);
    cuh_sim_complete_all(t.dev);
    cuh_heap_set_limit(t.heap, 4 * MiB);
    assert_false(plan_of(t.heap).active);
    cuh_heap_stats(t.heap, &s);
    assert_true(s.reserved.current <= 4 * MiB);
    heap_ok(t.heap);
    all_freed(t.heap);
    test_heap_free(&t);
}

/* A request the plan does not serve (a cudaMalloc here) that finds no
 * memory but the room's gets it: the allocation ladder drops the plan and
 * runs again, and no out-of-memory is recorded. */
static void test_plan_room_serves_a_request_that_would_run_out(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, PLAN_CONF);
    run_steps(t.heap, 6);
    cuh_sim_complete_all(t.dev);
    uintptr_t x;
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 112 * MiB, &x), CUHEAP_OK);
    assert_false(plan_of(t.heap).active);
    cuheap_stats_t s;
    cuh_heap_stats(t.heap, &s);
    assert_int_equal(s.num_ooms, 0);
    assert_true(s.reserved.peak <= 128 * MiB);
    heap_ok(t.heap);
    assert_int_equal(cuh_heap_free_device_wide(t.heap, x), CUHEAP_OK);
    cuh_sim_complete_all(t.dev);
    all_freed(t.heap);
    test_heap_free(&t);
}

/* Room comes back only from planned blocks freed on the plan's stream: one
 * freed on another stream (after its work on the plan's stream is done, as
 * a program must) is that stream's memory, and the next step's block at its
 * place is served as always. */
static void test_plan_a_block_freed_on_another_stream_is_not_room(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, PLAN_CONF);
    uintptr_t now[STEP_BLOCKS];
    run_steps(t.heap, 6);
    cuh_snap_plan_t p = plan_of(t.heap);
    assert_true(p.placed);
    const uint64_t missed = p.missed;
    /* The step, but the first large block freed on S1. */
    uintptr_t small[24], large[3];
    for (int i = 0; i < 24; i++)
        small[i] = must_alloc(t.heap, 2 * MiB, 0);
    for (int i = 0; i < 24; i += 2)
        must_free(t.heap, small[i], 0);
    for (int i = 0; i < 3; i++)
        large[i] = must_alloc(t.heap, 8 * MiB, 0);
    for (int i = 1; i < 24; i += 2)
        must_free(t.heap, small[i], 0);
    cuh_sim_complete_all(t.dev);
    must_free(t.heap, large[0], S1);
    for (int i = 1; i < 3; i++)
        must_free(t.heap, large[i], 0);
    cuh_heap_mark_step(t.heap);
    heap_ok(t.heap);
    p = plan_of(t.heap);
    assert_true(p.active);   /* the same requests: the plan stays */
    checkerboard_step(t.heap, now, 8 * MiB);
    p = plan_of(t.heap);
    assert_true(p.missed > missed);   /* that block's place was not room */
    heap_ok(t.heap);
    cuh_heap_mark_step(t.heap);
    all_freed(t.heap);
    test_heap_free(&t);
}

/* A device that refuses maps and new memory now and then while a plan is in
 * force: a planned block whose pages cannot be mapped is served as always or
 * refused as out of memory, never left half placed; the books stay sound and
 * destroying the heap returns every byte and event. */
static void test_plan_device_failures_leave_sound_books(void **state)
{
    (void)state;
    fault_heap_t t = fault_heap_new(GiB, PLAN_CONF);
    run_steps(t.heap, 6);
    cuh_fault_random(t.dev, CUH_FAULT_VM_MAP, 0.3, 45, CUH_DEV_ERROR);
    cuh_fault_random(t.dev, CUH_FAULT_VM_CREATE, 0.3, 46, CUH_DEV_OOM);
    for (int step = 0; step < 8; step++) {
        uintptr_t got[STEP_BLOCKS];
        const size_t sizes[2] = {2 * MiB, 8 * MiB};
        for (int i = 0; i < STEP_BLOCKS; i++) {
            cuheap_status_t rc = cuh_heap_malloc(t.heap, sizes[i >= 24], 0, &got[i]);
            if (rc != CUHEAP_OK) {
                assert_true(rc == CUHEAP_ERR_OUT_OF_MEMORY || rc == CUHEAP_ERR_DEVICE);
                got[i] = 0;
            }
        }
        heap_ok(t.heap);
        for (int i = 0; i < STEP_BLOCKS; i++)
            if (got[i])
                must_free(t.heap, got[i], 0);
        cuh_heap_mark_step(t.heap);
        heap_ok(t.heap);
    }
    assert_true(cuh_fault_injected(t.dev, CUH_FAULT_VM_MAP) + cuh_fault_injected(t.dev, CUH_FAULT_VM_CREATE) > 0);
    fault_heap_free(&t);
}

/* ---- the reuse and page rules over random repeating steps -------------------- */

typedef struct plan_run_s {
    uint64_t seed;
    int step, op;
} plan_run_t;

static void plan_rule_fail(void *ctx, const char *what)
{
    const plan_run_t *run = ctx;
    fail_msg("seed %llu, step %d, op %d: %s", (unsigned long long)run->seed, run->step, run->op, what);
}

/* A step of SLOTS blocks, made once from the seed: each slot allocated once
 * a step, on the default stream mostly, and freed later in the step or in
 * the next one before its next allocation (its life wraps). Steps repeat,
 * but one in five differs: a size changes, a block is allocated (and freed)
 * on another stream, or freed by cudaFree. The GPU runs behind (work completes every 23
 * operations on one stream); the heap_model checks every new block against
 * what frees left, by address and physical page, and that no page is
 * unmapped under running work. With device_wide every block is cudaMalloc's
 * and cudaFree's, used by any of the streams (a differing step then uses
 * the odd slot on a stream no step used before). Without marks the heap
 * finds the steps itself. Returns the blocks plans placed. */
static uint64_t plan_rule_model(uint64_t seed, int device_wide, int marks)
{
    test_heap_t t = test_heap_new(GiB, "vmm:1,small_max:0,vmm_margin:0,limit:128M,step_plan:1");
    cuh_sim_hold_events(t.dev, 1);
    assert_int_equal(cuh_heap_register_stream(t.heap, S1), CUHEAP_OK);
    enum { SLOTS = 24, EVENTS = 2 * SLOTS, STEPS = 40, MAX_PIECES = 40000 };
    const cuh_stream_t streams[3] = {0, S1, S2};
    plan_run_t run = {seed, 0, 0};
    heap_model_t model = heap_model_new(t.dev, 2 * MiB, S3, MAX_PIECES, plan_rule_fail, &run);
    /* The step: event e is slot order[e] >> 1's allocation (even) or free (odd). */
    size_t size[SLOTS];
    cuh_stream_t stream[SLOTS];
    int order[EVENTS];
    for (int i = 0; i < SLOTS; i++) {
        uint64_t r = test_rand(&seed);
        size[i] = (r % 4 ? 1 + (size_t)(r >> 16) % (3 * MiB) : 4 * MiB + (size_t)(r >> 16) % (6 * MiB));
        stream[i] = (r >> 8) % 5 ? 0 : S1;
        order[2 * i] = 2 * i;
        order[2 * i + 1] = 2 * i + 1;
    }
    for (int e = EVENTS - 1; e > 0; e--) {
        int k = (int)(test_rand(&seed) % (uint64_t)(e + 1)), x = order[e];
        order[e] = order[k];
        order[k] = x;
    }
    uintptr_t addr[SLOTS] = {0};
    cuh_stream_t used_on[SLOTS];
    size_t sized[SLOTS];
    for (int step = 0; step < STEPS; step++) {
        run.step = step;
        const uint64_t r = test_rand(&seed);
        const int differs = step > 3 && r % 5 == 0;
        const int odd_slot = (int)((r >> 8) % SLOTS), how = (int)((r >> 16) % 3);
        for (int e = 0; e < EVENTS; e++) {
            run.op = e;
            const int i = order[e] >> 1;
            if (order[e] & 1) {
                if (!addr[i])
                    continue;   /* its first allocation is still to come */
                const int by_cudafree = device_wide || (differs && i == odd_slot && how == 2);
                for (int k = 0; k < 3; k++)
                    if (by_cudafree || streams[k] == used_on[i])
                        heap_model_add(&model, addr[i], sized[i], streams[k],
                                       cuh_sim_enqueue_work(t.dev, streams[k]), 0, 0);
                if (by_cudafree)
                    assert_int_equal(cuh_heap_free_device_wide(t.heap, addr[i]), CUHEAP_OK);
                else
                    must_free(t.heap, addr[i], used_on[i]);
                addr[i] = 0;
            } else {
                if (addr[i]) {   /* freed in the next step, after this allocation: a wrap that came late */
                    for (int k = 0; k < 3; k++)
                        if (device_wide || streams[k] == used_on[i])
                            heap_model_add(&model, addr[i], sized[i], streams[k],
                                           cuh_sim_enqueue_work(t.dev, streams[k]), 0, 0);
                    if (device_wide)
                        assert_int_equal(cuh_heap_free_device_wide(t.heap, addr[i]), CUHEAP_OK);
                    else
                        must_free(t.heap, addr[i], used_on[i]);
                }
                sized[i] = differs && i == odd_slot && how == 0 ? size[i] + 3 * MiB : size[i];
                used_on[i] = differs && i == odd_slot && how == 1 ? S2 : stream[i];
                cuheap_status_t st = device_wide ? cuh_heap_malloc_device_wide(t.heap, sized[i], &addr[i])
                                                 : cuh_heap_malloc(t.heap, sized[i], used_on[i], &addr[i]);
                if (st == CUHEAP_ERR_OUT_OF_MEMORY) {
                    addr[i] = 0;
                    continue;
                }
                assert_int_equal(st, CUHEAP_OK);
                for (int k = 0; k < SLOTS; k++)
                    if (k != i && addr[k] && heap_model_overlap(addr[i], sized[i], addr[k], sized[k]))
                        fail_msg("seed %llu step %d: block %d overlaps live block %d", (unsigned long long)run.seed,
                                 step, i, k);
                heap_model_check(&model, addr[i], sized[i], used_on[i], device_wide, streams, 3);
            }
            if ((step * EVENTS + e) % 23 == 0)
                cuh_sim_complete_stream(t.dev, streams[(r >> (e % 8)) % 3]);
            heap_model_prune(&model);
        }
        if (marks)
            cuh_heap_mark_step(t.heap);
        heap_ok(t.heap);
    }
    const uint64_t placed = plan_of(t.heap).placed;
    for (int i = 0; i < SLOTS; i++)
        if (addr[i] && device_wide)
            assert_int_equal(cuh_heap_free_device_wide(t.heap, addr[i]), CUHEAP_OK);
        else if (addr[i])
            must_free(t.heap, addr[i], used_on[i]);
    cuh_sim_complete_all(t.dev);
    all_freed(t.heap);
    free(model.pieces);
    test_heap_free(&t);
    return placed;
}

static void test_plan_random_steps_never_reuse_or_unmap_a_page_before_its_work(void **state)
{
    (void)state;
    /* Most seeds must have blocks placed by a plan, or this tests nothing
     * of plans. */
    int planned = 0;
    for (uint64_t seed = 1; seed <= 12; seed++)
        planned += plan_rule_model(seed * 7919, 0, 1) > 0;
    assert_true(planned >= 6);
}

/* The same for cudaMalloc's blocks (LD_PRELOAD): a planned block's place
 * comes back only once the GPU has passed its cudaFree, or every stream's
 * later work waits for it. */
static void test_plan_random_cudamalloc_steps_never_reuse_or_unmap_a_page_before_its_work(void **state)
{
    (void)state;
    int planned = 0;
    for (uint64_t seed = 1; seed <= 12; seed++)
        planned += plan_rule_model(seed * 6007, 1, 1) > 0;
    assert_true(planned >= 6);
}

/* Until a plan is in force, step_plan changes nothing: random steps that
 * never repeat, with large blocks freed and asked for again (which the heap
 * parks and hands back), get every block at the same address as without the
 * setting. */
static void test_plan_without_a_plan_blocks_go_where_they_would(void **state)
{
    (void)state;
    enum { OPS = 3000, SLOTS = 48 };
    uintptr_t got[2][OPS];
    for (int run = 0; run < 2; run++) {
        test_heap_t t = test_heap_new(GiB, run ? "vmm:1,small_max:0,step_plan:1" : "vmm:1,small_max:0");
        uintptr_t live[SLOTS] = {0};
        size_t last = 0;
        uint64_t seed = 4242;
        for (int i = 0; i < OPS; i++) {
            const uint64_t r = test_rand(&seed);
            const int slot = (int)(r % SLOTS);
            if (live[slot]) {
                must_free(t.heap, live[slot], 0);
                live[slot] = 0;
                got[run][i] = 1;
            } else {
                /* Half the requests ask again for the size freed last. */
                const size_t size = (r >> 8) % 2 && last ? last : (1 + (r >> 16) % 64) * 256 * KiB;
                live[slot] = got[run][i] = must_alloc(t.heap, size, 0);
                last = size;
            }
            if (i % 97 == 96)
                cuh_heap_mark_step(t.heap);
        }
        assert_false(plan_of(t.heap).made);
        for (int k = 0; k < SLOTS; k++)
            if (live[k])
                must_free(t.heap, live[k], 0);
        all_freed(t.heap);
        test_heap_free(&t);
    }
    for (int i = 0; i < OPS; i++)
        if (got[0][i] != got[1][i])
            fail_msg("operation %d: 0x%lx with step_plan, 0x%lx without", i, (unsigned long)got[1][i],
                     (unsigned long)got[0][i]);
}

/* A block freed and asked for again within a step is parked and handed back
 * before the plan is made: that take is part of the step, so the plan made
 * from it is followed, not dropped at the first repeat. */
static void test_plan_counts_a_parked_block_taken_again(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, PLAN_CONF);
    uintptr_t now[STEP_BLOCKS];
    for (int step = 0; step < 8; step++) {
        checkerboard_step(t.heap, now, 8 * MiB);
        const uintptr_t a = must_alloc(t.heap, 4 * MiB, 0);
        must_free(t.heap, a, 0);
        const uintptr_t b = must_alloc(t.heap, 4 * MiB, 0);
        if (!plan_of(t.heap).active)
            assert_int_equal(b, a);   /* the parked block */
        must_free(t.heap, b, 0);
        cuh_heap_mark_step(t.heap);
        heap_ok(t.heap);
    }
    const cuh_snap_plan_t p = plan_of(t.heap);
    assert_int_equal(p.made, 1);
    assert_int_equal(p.dropped, 0);
    assert_true(p.steps_followed >= 4);
    all_freed(t.heap);
    test_heap_free(&t);
}

/* The same without marks: the steps the heap finds, cut out of its record
 * and dropped when a step differs, keep the rules too. */
static void test_plan_random_steps_found_keep_the_rules(void **state)
{
    (void)state;
    int planned = 0;
    for (uint64_t seed = 1; seed <= 12; seed++) {
        planned += plan_rule_model(seed * 7919, 0, 0) > 0;
        planned += plan_rule_model(seed * 6007, 1, 0) > 0;
    }
    assert_true(planned >= 6);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_repeating_steps_stop_moving_pages),
        cmocka_unit_test(test_plan_off_the_same_steps_keep_moving_pages),
        cmocka_unit_test(test_plan_cudamalloc_steps_stop_moving_pages),
        cmocka_unit_test(test_plan_needs_room_to_move_in),
        cmocka_unit_test(test_plan_a_step_too_long_to_record_gets_none),
        cmocka_unit_test(test_plan_from_steps_found_in_the_allocations),
        cmocka_unit_test(test_plan_from_found_steps_goes_when_they_change),
        cmocka_unit_test(test_plan_a_program_that_marks_is_not_second_guessed),
        cmocka_unit_test(test_plan_a_step_that_differs_drops_the_plan),
        cmocka_unit_test(test_plan_release_cached_gives_the_room_back),
        cmocka_unit_test(test_plan_room_serves_a_request_that_would_run_out),
        cmocka_unit_test(test_plan_a_block_freed_on_another_stream_is_not_room),
        cmocka_unit_test(test_plan_device_failures_leave_sound_books),
        cmocka_unit_test(test_plan_random_steps_never_reuse_or_unmap_a_page_before_its_work),
        cmocka_unit_test(test_plan_random_cudamalloc_steps_never_reuse_or_unmap_a_page_before_its_work),
        cmocka_unit_test(test_plan_random_steps_found_keep_the_rules),
        cmocka_unit_test(test_plan_without_a_plan_blocks_go_where_they_would),
        cmocka_unit_test(test_plan_counts_a_parked_block_taken_again),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
