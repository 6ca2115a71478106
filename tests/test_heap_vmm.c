/* test_heap_vmm.c - virtual memory, vmm:1 (src/heap_pages.c): free pages move
 * to where a request needs them, only once the work on them has finished (to
 * a stream's own next block at once, the old mapping kept), and never while a
 * take-back's work may still touch them, checked over random operations
 * against the page-rule model of heap_model.h; a fit on mapped pages and off
 * the growth edge comes first; a peer gets every mapped page.
 */
#include "heap_test.h"

#include <pthread.h>
#include <sched.h>

/* ---- virtual memory (vmm:1) ------------------------------------------------------ */
/* 1 if every page of [addr, addr + size) has a physical page mapped. */
static int all_pages_mapped(cuh_device_t *dev, uintptr_t addr, size_t size)
{
    for (uintptr_t va = addr; va < addr + size; va += 2 * MiB)
        if (!cuh_sim_handle_at(dev, va, NULL))
            return 0;
    return 1;
}

/* The physical pages (handles) mapped at the 2 MiB pages of [addr, addr +
 * size), into h[] (0 where none): where pages were before they move. Since a
 * unit that moves stays mapped where it was (kept mappings), a move shows
 * as its handle behind the new block, not as its old range unmapped. */
static size_t handles_at(cuh_device_t *dev, uintptr_t addr, size_t size, uint64_t *h)
{
    size_t n = 0;
    for (uintptr_t va = addr; va < addr + size; va += 2 * MiB)
        h[n++] = cuh_sim_handle_at(dev, va, NULL);
    return n;
}

/* How many of the n handles h[] are now mapped behind a page of [addr, addr + size). */
static size_t handles_behind(cuh_device_t *dev, const uint64_t *h, size_t n, uintptr_t addr, size_t size)
{
    size_t found = 0;
    for (size_t i = 0; i < n; i++)
        for (uintptr_t va = addr; h[i] && va < addr + size; va += 2 * MiB)
            if (cuh_sim_handle_at(dev, va, NULL) == h[i]) {
                found++;
                break;
            }
    return found;
}

static void test_vmm_checkerboard_then_larger_blocks_fit_in_live_plus_two_pages(void **state)
{
    (void)state;
    /* 32 blocks of 2 MiB, every other one freed: 32 MiB free in 2 MiB holes.
     * Plain segments cannot give an 8 MiB block here; pages moved behind a
     * new range can. Capacity: the live peak (64 MiB) plus two pages. */
    test_heap_t t = test_heap_new(68 * MiB, "vmm:1,small_max:0,vmm_margin:0");
    uintptr_t a[32];
    for (int i = 0; i < 32; i++)
        a[i] = must_alloc(t.heap, 2 * MiB, 0);
    for (int i = 0; i < 32; i += 2)
        must_free(t.heap, a[i], 0);
    uintptr_t big[4];
    for (int i = 0; i < 4; i++)
        big[i] = must_alloc(t.heap, 8 * MiB, 0);
    heap_ok(t.heap);
    cuheap_stats_t s;
    cuh_heap_stats(t.heap, &s);
    assert_true(s.reserved.peak <= 68 * MiB);
    assert_int_equal(s.num_ooms, 0);
    cuh_sim_counters_t c;
    cuh_sim_counters(t.dev, &c);
    assert_true(page_moves(t.heap) >= 14);   /* pages were moved, not created */
    assert_true(c.vm_creates <= 34);
    for (int i = 0; i < 4; i++)
        must_free(t.heap, big[i], 0);
    for (int i = 1; i < 32; i += 2)
        must_free(t.heap, a[i], 0);
    /* The same layout on plain segments runs out of memory. */
    test_heap_t plain = test_heap_new(68 * MiB, "workspace:64M,small_max:0");
    for (int i = 0; i < 32; i++)
        a[i] = must_alloc(plain.heap, 2 * MiB, 0);
    for (int i = 0; i < 32; i += 2)
        must_free(plain.heap, a[i], 0);
    uintptr_t x;
    assert_int_equal(cuh_heap_malloc(plain.heap, 8 * MiB, 0, &x), CUHEAP_ERR_OUT_OF_MEMORY);
    for (int i = 1; i < 32; i += 2)
        must_free(plain.heap, a[i], 0);
    test_heap_free(&plain);
    test_heap_free(&t);
}

/* Steps (cuh_heap_mark_step): each marked step counts the pages mapped and
 * moved in it and the allocations asked of the device, as the device saw
 * them; the heap keeps the last CUH_STEP_HISTORY steps, oldest first, and the
 * step that mapped the most pages. */
static void test_vmm_steps_count_what_each_step_mapped_and_moved(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(68 * MiB, "vmm:1,small_max:0,vmm_margin:0");
    cuh_sim_counters_t c0, c1, c2;
    uintptr_t a[32];
    for (int i = 0; i < 8; i++)
        a[i] = must_alloc(t.heap, 2 * MiB, 0);
    cuh_sim_counters(t.dev, &c0);
    cuh_heap_mark_step(t.heap);   /* step 1: 8 new pages */
    for (int i = 8; i < 32; i++)
        a[i] = must_alloc(t.heap, 2 * MiB, 0);
    for (int i = 0; i < 32; i += 2)
        must_free(t.heap, a[i], 0);
    uintptr_t big[4];
    for (int i = 0; i < 4; i++)
        big[i] = must_alloc(t.heap, 8 * MiB, 0);   /* the limit is near: pages move */
    cuh_heap_poll(t.heap);
    cuh_sim_counters(t.dev, &c1);
    cuh_heap_mark_step(t.heap);   /* step 2: 24 new pages, 16 moved */
    cuh_heap_mark_step(t.heap);   /* step 3: nothing */
    cuh_sim_counters(t.dev, &c2);
    assert_int_equal(c2.vm_maps, c1.vm_maps);

    cuh_heap_snapshot_t *snap = cuh_heap_snapshot(t.heap, 0);
    assert_non_null(snap);
    assert_int_equal(snap->steps_marked, 3);
    assert_int_equal(snap->num_steps, 3);
    const cuh_snap_step_t *s = snap->steps;
    assert_int_equal(s[0].index, 1);
    assert_int_equal(s[0].page_maps, c0.vm_maps);
    assert_int_equal(s[0].page_maps, 8);
    assert_int_equal(s[0].device_allocs, c0.vm_creates);
    assert_int_equal(s[0].page_moves, 0);
    assert_int_equal(s[0].map_calls, c0.vm_maps + c0.vm_unmaps);   /* every call the device saw, none more */
    assert_int_equal(s[1].index, 2);
    assert_int_equal(s[1].map_calls, c1.vm_maps + c1.vm_unmaps - c0.vm_maps - c0.vm_unmaps);
    assert_int_equal(s[1].page_maps, c1.vm_maps - c0.vm_maps);
    assert_int_equal(s[1].device_allocs, c1.vm_creates - c0.vm_creates);
    assert_int_equal(s[1].page_moves, s[1].page_maps - s[1].device_allocs);   /* every map not of a new page moved one */
    assert_true(s[1].page_moves >= 14);
    assert_int_equal(s[2].page_maps + s[2].page_moves + s[2].map_calls + s[2].device_allocs + s[2].cpu_waits, 0);
    for (int i = 0; i < 3; i++)
        assert_true(s[i].seconds >= 0 && s[i].end >= s[i].seconds && (i == 0 || s[i].end >= s[i - 1].end));
    assert_int_equal(snap->most_maps.index, 2);
    assert_int_equal(snap->most_maps.page_maps, s[1].page_maps);
    cuh_heap_snapshot_free(snap);

    /* Past CUH_STEP_HISTORY steps the oldest go; the busiest step stays. */
    for (int i = 0; i < CUH_STEP_HISTORY + 5; i++)
        cuh_heap_mark_step(t.heap);
    snap = cuh_heap_snapshot(t.heap, 0);
    assert_non_null(snap);
    assert_int_equal(snap->steps_marked, 3 + CUH_STEP_HISTORY + 5);
    assert_int_equal(snap->num_steps, CUH_STEP_HISTORY);
    for (size_t i = 0; i < CUH_STEP_HISTORY; i++)
        assert_int_equal(snap->steps[i].index, 3 + 5 + 1 + i);
    assert_int_equal(snap->most_maps.index, 2);
    cuh_heap_snapshot_free(snap);
    for (int i = 0; i < 4; i++)
        must_free(t.heap, big[i], 0);
    for (int i = 1; i < 32; i += 2)
        must_free(t.heap, a[i], 0);
    test_heap_free(&t);
}

/* Steps marked while other threads allocate: every page mapped falls in
 * exactly one step (a step's counts are taken under the heap's lock), and
 * ThreadSanitizer, which runs this test too, sees no race. */
typedef struct {
    cuh_heap_t *heap;
    unsigned seed;
} stepper_arg_t;

static void *allocate_and_free(void *p)
{
    stepper_arg_t *a = p;
    uintptr_t live[8] = {0};
    for (int i = 0; i < 400; i++) {
        unsigned k = (unsigned)rand_r(&a->seed) % 8;
        if (live[k]) {
            assert_int_equal(cuh_heap_free(a->heap, live[k], 0), CUHEAP_OK);
            live[k] = 0;
        } else {
            size_t size = ((size_t)rand_r(&a->seed) % 6 + 1) * MiB;
            assert_int_equal(cuh_heap_malloc(a->heap, size, 0, &live[k]), CUHEAP_OK);
        }
    }
    for (int k = 0; k < 8; k++)
        if (live[k])
            assert_int_equal(cuh_heap_free(a->heap, live[k], 0), CUHEAP_OK);
    return NULL;
}

static void test_vmm_steps_marked_while_threads_allocate_count_every_page_once(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, "vmm:1,vmm_margin:0");
    pthread_t th[3];
    stepper_arg_t args[3];
    for (int i = 0; i < 3; i++) {
        args[i] = (stepper_arg_t){t.heap, (unsigned)(i + 1) * 7919u};
        assert_int_equal(pthread_create(&th[i], NULL, allocate_and_free, &args[i]), 0);
    }
    for (int i = 0; i < CUH_STEP_HISTORY - 1; i++) {
        cuh_heap_mark_step(t.heap);
        sched_yield();
    }
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    cuh_heap_mark_step(t.heap);   /* the last step: everything after the one before */
    cuh_heap_snapshot_t *snap = cuh_heap_snapshot(t.heap, 0);
    assert_non_null(snap);
    assert_int_equal(snap->num_steps, CUH_STEP_HISTORY);
    uint64_t maps = 0, moves = 0;
    for (size_t i = 0; i < snap->num_steps; i++) {
        maps += snap->steps[i].page_maps;
        moves += snap->steps[i].page_moves;
    }
    const cuh_snap_segment_t *reservation = NULL;
    for (size_t i = 0; i < snap->num_segments; i++)
        if (snap->segments[i].virtual_space)
            reservation = &snap->segments[i];
    assert_non_null(reservation);
    assert_true(reservation->page_maps > 0);
    assert_int_equal(maps, reservation->page_maps);
    assert_int_equal(moves, reservation->page_moves);
    cuh_heap_snapshot_free(snap);
    heap_ok(t.heap);
    test_heap_free(&t);
}

/* A checkerboard of 32 blocks of 8 MiB, every other one freed, then four
 * blocks of 32 MiB: they fit at the live peak plus two pages, without an
 * out-of-memory, and take the freed memory in 14-16 moves of 8 MiB (one
 * unmap each). *c0: the device's counters once the 8 MiB blocks are in;
 * *c1: after the 32 MiB blocks. Frees every block. */
static void checkerboard_of_8m_then_32m(test_heap_t *t, cuh_sim_counters_t *c0, cuh_sim_counters_t *c1)
{
    uintptr_t a[32];
    for (int i = 0; i < 32; i++)
        a[i] = must_alloc(t->heap, 8 * MiB, 0);
    cuh_sim_counters(t->dev, c0);
    for (int i = 0; i < 32; i += 2)
        must_free(t->heap, a[i], 0);
    uintptr_t big[4];
    for (int i = 0; i < 4; i++)
        big[i] = must_alloc(t->heap, 32 * MiB, 0);
    heap_ok(t->heap);
    cuheap_stats_t s;
    cuh_heap_stats(t->heap, &s);
    assert_true(s.reserved.peak <= (256 + 16) * MiB);
    assert_int_equal(s.num_ooms, 0);
    cuh_heap_poll(t->heap);
    cuh_sim_counters(t->dev, c1);
    assert_true(c1->vm_creates - c0->vm_creates <= 2);    /* moved, not created ... */
    assert_true(c1->vm_maps - c0->vm_maps >= 14);         /* ... 8 MiB per call */
    assert_true(c1->vm_maps - c0->vm_maps <= 16);
    for (int i = 0; i < 4; i++)
        must_free(t->heap, big[i], 0);
    for (int i = 1; i < 32; i += 2)
        must_free(t->heap, a[i], 0);
}

/* vmm_page:8M: pages are 8 MiB pieces, created, mapped and moved whole: a
 * page per 8 MiB block, not four, and a move per page. */
static void test_vmm_larger_pages_move_in_fewer_calls(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new((256 + 16) * MiB, "vmm:1,vmm_page:8M,small_max:0,vmm_margin:0");
    cuh_sim_counters_t c0, c1;
    checkerboard_of_8m_then_32m(&t, &c0, &c1);
    assert_int_equal(c0.vm_creates, 32);   /* a page per block, not four */
    test_heap_free(&t);
}

/* vmm_unit:8M: the pages a block lacks are created as units of up to 8 MiB,
 * one physical allocation each, mapped in one call; a free unit moves whole,
 * to a run of missing pages at least as long. The checkerboard of the test
 * above, with 2 MiB pages: a unit per 8 MiB block, not four pages, and each
 * 32 MiB block served by moved units, one unmap and one map each. */
static void test_vmm_units_are_created_mapped_and_moved_as_one(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new((256 + 16) * MiB, "vmm:1,vmm_unit:8M,small_max:0,vmm_margin:0");
    cuh_sim_counters_t c0, c1;
    checkerboard_of_8m_then_32m(&t, &c0, &c1);
    assert_int_equal(c0.vm_creates, 32);
    assert_int_equal(c0.vm_maps, 32);
    assert_int_equal(c0.vm_mapped, 256 * MiB);
    assert_true(c1.vm_maps - c0.vm_maps <= 18);
    /* A block longer than a unit gets several: 20 MiB is 8 + 8 + 4. */
    cuh_heap_release_cached(t.heap);
    cuh_heap_mark_step(t.heap);
    cuh_sim_counters(t.dev, &c0);
    uintptr_t x = must_alloc(t.heap, 20 * MiB, 0);
    cuh_sim_counters(t.dev, &c1);
    assert_int_equal(c1.vm_creates - c0.vm_creates, 3);
    assert_int_equal(c1.vm_maps - c0.vm_maps, 3);
    /* The step's record shows the 10 pages mapped, in 3 calls. */
    cuh_heap_mark_step(t.heap);
    cuh_heap_snapshot_t *snap = cuh_heap_snapshot(t.heap, 0);
    assert_non_null(snap);
    const cuh_snap_step_t *last = &snap->steps[snap->num_steps - 1];
    assert_int_equal(last->page_maps, 10);
    assert_int_equal(last->map_calls, 3);
    cuh_heap_snapshot_free(snap);
    must_free(t.heap, x, 0);
    heap_ok(t.heap);
    test_heap_free(&t);
}

/* The units vmm_unit:auto makes for `pages` lacking pages in one run, given
 * what the heap holds and what the device has free (both in pages, counted
 * on): each up to 1/1024 of the smaller, at least a page. */
static size_t auto_units(size_t *held, size_t *device_free, size_t pages)
{
    size_t units = 0;
    while (pages) {
        size_t k = (*held < *device_free ? *held : *device_free) / 1024;
        k = k < 1 ? 1 : k > pages ? pages : k;
        *held += k;
        *device_free -= k;
        pages -= k;
        units++;
    }
    return units;
}

/* vmm_unit:auto: units grow with what the heap holds and come
 * down to a page as the device fills (heap_pages.c, unit_pages_locked). On
 * a 64 GiB device with 8 GiB used by another process, three blocks that
 * need new pages: the first is pages until the heap holds 2 GiB (2,560
 * units for 3,072 pages), the second gets units of 3-10 pages (1,464 for
 * 8,192), the third takes the device to its last 64 MiB, its units
 * shrinking to a page as it fills. Every unit is one allocation and one
 * map. */
static void test_vmm_auto_units_grow_with_the_heap_and_shrink_as_the_device_fills(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(64 * GiB, "vmm:1,small_max:0,vmm_unit:auto");
    cuh_sim_set_external(t.dev, 8 * GiB);
    size_t free_bytes = 0, total = 0;
    assert_int_equal(t.dev->ops->mem_info(t.dev, &free_bytes, &total), CUH_DEV_OK);
    assert_int_equal(free_bytes, 56 * GiB);
    size_t held = 0, device_free = free_bytes / (2 * MiB);
    const size_t sizes[] = {6 * GiB, 16 * GiB, 56 * GiB - 22 * GiB - 64 * MiB};
    const size_t units[] = {2560, 1464, 4504};
    uintptr_t x[3];
    for (int i = 0; i < 3; i++) {
        cuh_sim_counters_t c0, c1;
        cuh_sim_counters(t.dev, &c0);
        x[i] = must_alloc(t.heap, sizes[i], 0);
        cuh_sim_counters(t.dev, &c1);
        assert_int_equal(auto_units(&held, &device_free, sizes[i] / (2 * MiB)), units[i]);
        assert_int_equal(c1.vm_creates - c0.vm_creates, units[i]);
        assert_int_equal(c1.vm_maps - c0.vm_maps, units[i]);
    }
    assert_int_equal(device_free, 32);
    cuheap_stats_t s;
    cuh_heap_stats(t.heap, &s);
    assert_int_equal(s.num_ooms, 0);
    for (int i = 0; i < 3; i++)
        must_free(t.heap, x[i], 0);
    heap_ok(t.heap);
    test_heap_free(&t);

    /* The default, vmm_unit:2M: a unit a page, however much the heap holds. */
    t = test_heap_new(GiB, "vmm:1,small_max:0");
    cuh_sim_counters_t c0, c1;
    cuh_sim_counters(t.dev, &c0);
    uintptr_t y = must_alloc(t.heap, 512 * MiB, 0);
    cuh_sim_counters(t.dev, &c1);
    assert_int_equal(c1.vm_creates - c0.vm_creates, 256);
    must_free(t.heap, y, 0);
    test_heap_free(&t);

    /* During a graph capture the device is not asked what it has free:
     * units of a page. */
    t = test_heap_new(64 * GiB, "vmm:1,small_max:0,vmm_unit:auto");
    uintptr_t w = must_alloc(t.heap, 6 * GiB, 0);
    cuh_heap_capture_begin(t.heap, 1);
    cuh_sim_counters(t.dev, &c0);
    y = must_alloc(t.heap, 2 * GiB, 0);
    cuh_sim_counters(t.dev, &c1);
    cuh_heap_capture_end(t.heap);
    assert_int_equal(c1.vm_creates - c0.vm_creates, 1024);
    must_free(t.heap, y, 0);
    must_free(t.heap, w, 0);
    test_heap_free(&t);

    /* A device that cannot say what it has free gets units of a page, and
     * the blocks still come. */
    fault_heap_t f = fault_heap_new(64 * GiB, "vmm:1,small_max:0,vmm_unit:auto");
    cuh_fault_random(f.dev, CUH_FAULT_MEM_INFO, 1.0, 1, CUH_DEV_ERROR);
    cuh_sim_counters(f.sim, &c0);
    uintptr_t z = must_alloc(f.heap, 6 * GiB, 0);
    cuh_sim_counters(f.sim, &c1);
    assert_int_equal(c1.vm_creates - c0.vm_creates, 3072);
    assert_true(cuh_fault_injected(f.dev, CUH_FAULT_MEM_INFO) >= 1);
    must_free(f.heap, z, 0);
    fault_heap_free(&f);
}

/* A free unit longer than the run a block lacks cannot serve it (a unit maps
 * whole). When the device is full, such a unit whose work is done goes back
 * to the device and a unit of the run's length is made: the device holding
 * the live bytes is enough, as with pages. */
static void test_vmm_a_unit_too_long_for_the_gap_goes_back_when_the_device_is_full(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(10 * MiB, "vmm:1,vmm_unit:8M,small_max:0,vmm_margin:0");
    cuh_sim_hold_events(t.dev, 1);
    uintptr_t u = must_alloc(t.heap, 8 * MiB, S1);   /* one unit of 4 pages */
    uintptr_t l = must_alloc(t.heap, 2 * MiB, S2);
    must_free(t.heap, u, S1);   /* its work still runs */
    cuh_sim_counters_t c0, c1;
    cuh_sim_counters(t.dev, &c0);
    uintptr_t z = must_alloc(t.heap, 4 * MiB, S2);
    cuh_sim_counters(t.dev, &c1);
    heap_ok(t.heap);
    cuheap_stats_t s;
    cuh_heap_stats(t.heap, &s);
    assert_int_equal(s.num_ooms, 0);
    assert_true(s.reserved.peak <= 10 * MiB);
    assert_true(c1.vm_releases > c0.vm_releases);   /* the 8 MiB unit went back ... */
    assert_true(c1.event_waits > c0.event_waits);   /* ... once its work was done */
    must_free(t.heap, z, S2);
    must_free(t.heap, l, S2);
    test_heap_free(&t);
}

static void test_vmm_moves_a_page_only_after_the_work_on_it_finished(void **state)
{
    (void)state;
    /* Room for four pages. S1 frees them while its work is still running;
     * S2 needs four: the heap must wait for S1 before unmapping them. */
    test_heap_t t = test_heap_new(8 * MiB, "vmm:1,small_max:0,vmm_margin:0");
    cuh_sim_hold_events(t.dev, 1);
    uintptr_t a = must_alloc(t.heap, 8 * MiB, S1);
    uint64_t ha[4];
    handles_at(t.dev, a, 8 * MiB, ha);
    must_free(t.heap, a, S1);
    cuh_sim_counters_t c0, c1;
    cuh_sim_counters(t.dev, &c0);
    uintptr_t b = must_alloc(t.heap, 8 * MiB, S2);
    cuh_sim_counters(t.dev, &c1);
    assert_true(c1.event_waits > c0.event_waits);
    assert_true(b != a);
    assert_int_equal(handles_behind(t.dev, ha, 4, b, 8 * MiB), 4);   /* a's four pages moved behind b */
    assert_int_equal(c1.vm_creates, c0.vm_creates);
    assert_int_equal(c1.vm_unmaps, 0);   /* their old mappings are kept */
    assert_int_equal(kept_pages(t.heap), 4);
    heap_ok(t.heap);
    must_free(t.heap, b, S2);
    test_heap_free(&t);
}

static void test_bits_all_set_agrees_with_a_bit_by_bit_model(void **state)
{
    (void)state;
    /* The mapped-page test of vmm:1 (needs_pages_locked): random bitmaps of
     * four words, mostly set, against every range that starts and ends
     * anywhere in them. */
    uint64_t seed = 42, bits[4];
    for (int round = 0; round < 200; round++) {
        for (int w = 0; w < 4; w++) {
            bits[w] = ~(uint64_t)0;
            for (int k = (int)(test_rand(&seed) % 3); k > 0; k--)
                bits[w] &= ~((uint64_t)1 << (test_rand(&seed) % 64));
        }
        for (size_t first = 0; first < 256; first += 1 + test_rand(&seed) % 7)
            for (size_t last = first; last < 256; last += 1 + test_rand(&seed) % 5) {
                int model = 1;
                for (size_t p = first; p <= last; p++)
                    model &= (int)((bits[p >> 6] >> (p & 63)) & 1);
                if (cuh_bits_all_set(bits, first, last) != model)
                    fail_msg("bits [%zu, %zu]: %d, the model says %d", first, last, !model, model);
            }
    }
}

static void test_vmm_a_streams_own_frees_move_before_the_gpu_passed_them(void **state)
{
    (void)state;
    /* Room for four pages, all S1's. S1 frees two of them, not adjacent,
     * while its work is still running, then needs a block of two pages. The
     * new block's work runs after the old (one stream), so the pages move at
     * once, without the CPU waiting; their old mappings stay, and nothing
     * else is placed there, until the GPU has passed S1's work. */
    test_heap_t t = test_heap_new(GiB, "vmm:1,small_max:0,vmm_margin:0,limit:8M");
    cuh_sim_hold_events(t.dev, 1);
    uintptr_t a[4];
    for (int i = 0; i < 4; i++)
        a[i] = must_alloc(t.heap, 2 * MiB, S1);
    must_free(t.heap, a[0], S1);
    must_free(t.heap, a[2], S1);
    cuh_sim_counters_t c0, c1, c2;
    cuh_sim_counters(t.dev, &c0);
    uintptr_t b = must_alloc(t.heap, 4 * MiB, S1);
    cuh_sim_counters(t.dev, &c1);
    assert_int_equal(c1.event_waits, c0.event_waits);   /* the CPU did not wait */
    assert_int_equal(c1.vm_creates, c0.vm_creates);     /* no new page */
    assert_int_equal(c1.vm_maps - c0.vm_maps, 2);       /* the two pages, mapped behind b */
    assert_int_equal(c1.vm_unmaps, c0.vm_unmaps);       /* their old mappings stay */
    assert_int_equal(c1.vm_mapped - c0.vm_mapped, 4 * MiB);
    heap_ok(t.heap);
    cuheap_stats_t s;
    cuh_heap_stats(t.heap, &s);
    assert_int_equal(s.reserved.peak, 8 * MiB);
    /* Another stream gets none of S1's memory before the GPU passed S1's
     * work: S2 waits for it. */
    must_free(t.heap, a[1], S1);
    uintptr_t c = must_alloc(t.heap, 2 * MiB, S2);
    cuh_sim_counters(t.dev, &c2);
    assert_true(c2.event_waits > c1.event_waits);
    heap_ok(t.heap);
    must_free(t.heap, c, S2);
    /* The GPU passes S1's work: the old mappings go (but those that moves
     * to another stream's blocks keep: kept mappings). */
    cuh_sim_complete_all(t.dev);
    cuh_heap_poll(t.heap);
    cuh_sim_counters(t.dev, &c2);
    assert_int_equal(c2.vm_mapped, 8 * MiB + kept_pages(t.heap) * 2 * MiB);
    heap_ok(t.heap);
    must_free(t.heap, b, S1);
    must_free(t.heap, a[3], S1);
    heap_ok(t.heap);
    test_heap_free(&t);
}

static void test_vmm_prefers_a_fit_on_mapped_pages_to_moving_pages(void **state)
{
    (void)state;
    /* Room for ten pages. A and C (4 pages each) are freed; E (8 pages)
     * starts on C's pages at the top and takes A's for the rest, leaving a
     * 4-page hole without pages. When E is freed its pages stay behind it.
     * A 4-page request must then land on E's mapped pages, not in the
     * best-fitting hole, which would move four pages (an unmap, a map and
     * an access grant each). */
    test_heap_t t = test_heap_new(GiB, "vmm:1,small_max:0,vmm_margin:0,limit:20M");
    uintptr_t a = must_alloc(t.heap, 8 * MiB, S1);
    uintptr_t b = must_alloc(t.heap, 2 * MiB, S1);
    uintptr_t c = must_alloc(t.heap, 8 * MiB, S1);
    must_free(t.heap, a, S1);
    must_free(t.heap, c, S1);
    uintptr_t e = must_alloc(t.heap, 16 * MiB, S1);
    cuh_heap_poll(t.heap);
    cuh_sim_counters_t c0, c1;
    cuh_sim_counters(t.dev, &c0);
    assert_int_equal(e, c);
    assert_int_equal(page_moves(t.heap), 4);   /* A's pages moved behind C's ... */
    assert_int_equal(kept_pages(t.heap), 4);   /* ... still mapped where they were */
    must_free(t.heap, e, S1);
    uintptr_t f = must_alloc(t.heap, 8 * MiB, S1);
    cuh_heap_poll(t.heap);
    cuh_sim_counters(t.dev, &c1);
    assert_int_equal(c1.vm_unmaps, c0.vm_unmaps);
    assert_int_equal(c1.vm_maps, c0.vm_maps);
    assert_true(f >= e && f + 8 * MiB <= e + 16 * MiB);
    heap_ok(t.heap);
    must_free(t.heap, f, S1);
    must_free(t.heap, b, S1);
    test_heap_free(&t);
}

static void test_vmm_takes_a_fit_at_the_growth_edge_last(void **state)
{
    (void)state;
    /* A (4 pages), B (3), C (4), D (2) from the bottom of the reservation;
     * B and D are freed: a 3-page hole on mapped pages and 2 free pages at
     * the top, below unused address space. A 2-page request fits D's place
     * best by size, but a block there would pin the edge: it goes into B's
     * hole, and a 5-page request then grows from D's free pages at the top,
     * mapping 3 new pages where it would otherwise have mapped 5 above the
     * pinned edge. */
    test_heap_t t = test_heap_new(GiB, "vmm:1,small_max:0,vmm_margin:1");
    uintptr_t a = must_alloc(t.heap, 8 * MiB, S1);
    uintptr_t b = must_alloc(t.heap, 6 * MiB, S1);
    uintptr_t c = must_alloc(t.heap, 8 * MiB, S1);
    uintptr_t d = must_alloc(t.heap, 4 * MiB, S1);
    assert_true(a < b && b < c && c < d);
    must_free(t.heap, d, S1);
    must_free(t.heap, b, S1);   /* last: a parked block of 4 MiB would serve the request below at once */
    cuh_sim_counters_t c0, c1;
    cuh_sim_counters(t.dev, &c0);
    uintptr_t small = must_alloc(t.heap, 4 * MiB, S1);
    assert_int_equal(small, b);   /* in the hole, not at the edge */
    uintptr_t large = must_alloc(t.heap, 10 * MiB, S1);
    assert_int_equal(large, d);   /* grows from the free pages at the top */
    cuh_sim_counters(t.dev, &c1);
    assert_int_equal(c1.vm_maps - c0.vm_maps, 3);
    assert_int_equal(c1.vm_unmaps, c0.vm_unmaps);
    heap_ok(t.heap);
    must_free(t.heap, a, S1);
    must_free(t.heap, c, S1);
    must_free(t.heap, small, S1);
    must_free(t.heap, large, S1);
    test_heap_free(&t);
}

static void test_vmm_release_cached_returns_free_pages(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, "vmm:1");
    uintptr_t keep = must_alloc(t.heap, 6 * MiB, S1);
    uintptr_t gone = must_alloc(t.heap, 40 * MiB, S1);
    uintptr_t small = must_alloc(t.heap, 1000, S1);
    must_free(t.heap, gone, S1);
    must_free(t.heap, small, S1);
    cuheap_stats_t s;
    cuh_heap_stats(t.heap, &s);
    assert_true(s.reserved.current >= 46 * MiB);
    cuh_heap_release_cached(t.heap);
    cuh_heap_stats(t.heap, &s);
    assert_int_equal(s.reserved.current, 6 * MiB);
    cuh_sim_counters_t c;
    cuh_sim_counters(t.dev, &c);
    assert_int_equal(c.vm_mapped, 6 * MiB);
    heap_ok(t.heap);
    must_free(t.heap, keep, S1);
    test_heap_free(&t);
}

/* Under vmm:1 free pages that add up to a request serve it, even when the
 * fit found first lies off a page boundary and would need one page more
 * than the limit leaves. */
static void test_vmm_free_pages_that_add_up_serve_a_request_off_a_page_boundary(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, "limit:8M,vmm:1,thread_cache:0");
    uintptr_t a[40];
    for (int i = 0; i < 40; i++)
        a[i] = must_alloc(t.heap, 64 * KiB, S1);   /* slabs over the first 2.5 MiB */
    for (int i = 0; i < 40; i++)
        must_free(t.heap, a[i], S1);
    uintptr_t big = must_alloc(t.heap, 8 * MiB, S2);
    assert_int_equal((big - a[0]) % (2 * MiB), 0);   /* on a page boundary: 4 pages, not 5 */
    cuheap_stats_t s;
    cuh_heap_stats(t.heap, &s);
    assert_true(s.reserved.peak <= 8 * MiB);
    must_free(t.heap, big, S2);
    heap_ok(t.heap);
    test_heap_free(&t);
}

/* A free extent can start on unmapped address space and go on over mapped
 * pages (pages released, then a mapped neighbour freed into it): a request
 * those mapped pages hold goes there, not to new pages. */
static void test_vmm_mapped_pages_past_a_free_extents_unmapped_start_serve_a_request(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, "vmm:1,thread_cache:0");
    uintptr_t a = must_alloc(t.heap, 4 * MiB, S1), b = must_alloc(t.heap, 4 * MiB, S1);
    uintptr_t guard = must_alloc(t.heap, 4 * MiB, S1);
    assert_int_equal(b, a + 4 * MiB);
    /* Device-wide frees (cudaFree) come back as global memory, which merges. */
    assert_int_equal(cuh_heap_free_device_wide(t.heap, a), CUHEAP_OK);
    assert_int_equal(cuh_heap_release_cached(t.heap), CUHEAP_OK);   /* a's pages go back */
    cuheap_stats_t s;
    cuh_heap_stats(t.heap, &s);
    assert_int_equal(s.reserved.current, 8 * MiB);
    assert_int_equal(cuh_heap_free_device_wide(t.heap, b), CUHEAP_OK);
    /* Taken back, b joins a: one free extent, a's unmapped pages then b's mapped ones. */
    uintptr_t c = must_alloc(t.heap, 4 * MiB, S1);
    assert_int_equal(c, b);
    cuh_heap_stats(t.heap, &s);
    assert_int_equal(s.reserved.current, 8 * MiB);   /* no page mapped for it */
    must_free(t.heap, c, S1);
    must_free(t.heap, guard, S1);
    heap_ok(t.heap);
    test_heap_free(&t);
}

/* Under vmm:1 a block that outgrows its stream's freed memory at the top of
 * the reservation starts there and maps only the pages it lacks, as an
 * expandable segment grows at its end; another stream, which may not use
 * that memory yet, gets address space of its own. */
static void test_vmm_block_grows_from_its_streams_free_memory_at_the_top(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(4 * GiB, "vmm:1,thread_cache:0");
    cuh_sim_hold_events(t.dev, 1);   /* every stream's frees stay its own */
    uintptr_t a = must_alloc(t.heap, 4 * MiB, S1);
    must_free(t.heap, a, S1);
    /* S2 may not use S1's freed memory, nor reach through it. */
    uintptr_t x = must_alloc(t.heap, 6 * MiB, S2);
    assert_true(x >= a + 4 * MiB);
    must_free(t.heap, x, S2);
    /* S1's 4 MiB are followed by S2's memory, not by free address space. */
    uintptr_t y = must_alloc(t.heap, 8 * MiB, S1);
    assert_true(y >= x + 6 * MiB);
    must_free(t.heap, y, S1);
    /* y's 8 MiB are S1's, at the top: 12 MiB start there and map the two
     * pages they lack (new or moved), not six. */
    cuh_sim_counters_t c0, c1;
    cuh_sim_counters(t.dev, &c0);
    uintptr_t z = must_alloc(t.heap, 12 * MiB, S1);
    assert_int_equal(z, y);
    cuh_sim_counters(t.dev, &c1);
    assert_int_equal(c1.vm_maps - c0.vm_maps, 2);
    must_free(t.heap, z, S1);
    /* Except a block of a GiB or more (SPAN_MAX in heap_place.c): it takes fresh
     * address space, leaving the freed memory to the smaller blocks. */
    uintptr_t huge = must_alloc(t.heap, GiB, S1);
    assert_true(huge >= z + 12 * MiB);
    must_free(t.heap, huge, S1);
    heap_ok(t.heap);
    cuh_sim_complete_all(t.dev);
    test_heap_free(&t);
}

/* Peer access under vmm:1: the pages mapped when it is enabled and every page
 * mapped later are made accessible to the peer; a heap without virtual memory
 * needs nothing (CUDA grants peers plain allocations itself). */
static void test_allow_peer_grants_mapped_and_later_pages(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, "vmm:1");
    uintptr_t a = must_alloc(t.heap, 8 * MiB, S1);
    cuh_sim_counters_t c0, c1, c2;
    cuh_sim_counters(t.dev, &c0);
    assert_int_equal(c0.vm_peer_grants, 0);
    assert_int_equal(cuh_heap_allow_peer(t.heap, 1), CUHEAP_OK);
    cuh_sim_counters(t.dev, &c1);
    assert_true(c1.vm_peers & 2);
    assert_true(c1.vm_peer_grants > 0);   /* a's pages, in runs of neighbours */
    uintptr_t b = must_alloc(t.heap, 64 * MiB, S1);
    cuh_sim_counters(t.dev, &c2);
    assert_true(c2.vm_maps > c1.vm_maps);
    assert_int_equal(c2.vm_peer_grants - c1.vm_peer_grants, c2.vm_maps - c1.vm_maps);   /* one per new mapping */
    assert_int_equal(cuh_heap_allow_peer(t.heap, 0), CUHEAP_ERR_DEVICE);   /* itself: refused, named */
    assert_non_null(strstr(cuheap_last_error(), "peer access for device 0"));
    must_free(t.heap, a, S1);
    must_free(t.heap, b, S1);
    heap_ok(t.heap);
    test_heap_free(&t);

    t = test_heap_new(GiB, NULL);
    must_free(t.heap, must_alloc(t.heap, 8 * MiB, S1), S1);
    assert_int_equal(cuh_heap_allow_peer(t.heap, 1), CUHEAP_OK);
    cuh_sim_counters(t.dev, &c0);
    assert_int_equal(c0.vm_peers, 0);
    assert_int_equal(c0.vm_peer_grants, 0);
    test_heap_free(&t);
}

/* ---- memory taken back while its work runs ------------------------------- */

/* Under vmm:1 a fit in address space without pages is growth: cudaFree'd
 * memory waiting for the GPU is taken back first, even when take-backs are
 * rationed (other streams known), and the block reuses its pages. */
static void test_vmm_takes_cudafree_memory_back_before_new_pages(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, "vmm:1,small_max:0");
    cuh_sim_hold_events(t.dev, 1);
    assert_int_equal(cuh_heap_register_stream(t.heap, S3), CUHEAP_OK);
    uintptr_t a, b;
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 64 * MiB, &a), CUHEAP_OK);
    assert_int_equal(cuh_heap_free_device_wide(t.heap, a), CUHEAP_OK);
    cuh_sim_counters_t c0, c1;
    cuh_sim_counters(t.dev, &c0);
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 64 * MiB, &b), CUHEAP_OK);
    cuh_sim_counters(t.dev, &c1);
    assert_int_equal(b, a);
    assert_int_equal(c1.vm_creates, c0.vm_creates);   /* no new pages */
    assert_true(gpu_waits(&c1) > gpu_waits(&c0));   /* the GPU, not the CPU, waits */
    assert_int_equal(c1.event_waits, c0.event_waits);
    assert_int_equal(cuh_heap_free_device_wide(t.heap, b), CUHEAP_OK);
    heap_ok(t.heap);
    cuh_sim_complete_all(t.dev);
    test_heap_free(&t);
}

/* vmm:1 and cudaFree: a take-back makes blocks reusable in stream order while
 * the GPU may still run work issued before their frees, but unmapping a page
 * is not stream-ordered. While that work runs, no such page is unmapped
 * (and the CPU never waits for it): a block that raises the live peak gets
 * new pages; once the work is done, the pages move. Without this a kernel
 * could see its memory unmapped under it. */
static void test_vmm_pages_of_taken_back_memory_move_only_after_their_work(void **state)
{
    (void)state;
    for (int others = 0; others <= 1; others++) {
        test_heap_t t = test_heap_new(GiB, "vmm:1,vmm_margin:0,small_max:0");
        cuh_sim_hold_events(t.dev, 1);
        if (others)
            assert_int_equal(cuh_heap_register_stream(t.heap, S3), CUHEAP_OK);
        uintptr_t a, b, x, y, w;
        assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 64 * MiB, &a), CUHEAP_OK);
        assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 64 * MiB, &b), CUHEAP_OK);
        assert_int_equal(cuh_heap_free_device_wide(t.heap, a), CUHEAP_OK);
        /* Taken back at once (the GPU has not passed a's free): x is cut
         * from a's hole, the other 32 MiB of it stay free with their pages. */
        assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 32 * MiB, &x), CUHEAP_OK);
        assert_true(x >= a && x < a + 64 * MiB);
        cuh_sim_counters_t c0, c1;
        cuh_sim_counters(t.dev, &c0);
        /* y needs 32 pages and brings the live bytes to a new peak (160 MiB
         * against 128): new ones, not a's free pages, whose work may still
         * run (alias moves serve only what stays under the live peak:
         * test_vmm_taken_back_pages_move_at_once_and_keep_their_old_mappings). */
        assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 64 * MiB, &y), CUHEAP_OK);
        cuh_sim_counters(t.dev, &c1);
        assert_int_equal(c1.vm_unmaps, c0.vm_unmaps);
        assert_true(c1.vm_creates > c0.vm_creates);
        assert_int_equal(c1.event_waits, c0.event_waits);
        /* The GPU passes the frees: now a's free pages move behind w (too
         * large for a's 32 MiB hole). */
        cuh_sim_complete_all(t.dev);
        uint64_t hole[16];
        handles_at(t.dev, x + 32 * MiB, 32 * MiB, hole);
        cuh_sim_counters(t.dev, &c0);
        assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 48 * MiB, &w), CUHEAP_OK);
        cuh_sim_counters(t.dev, &c1);
        assert_true(handles_behind(t.dev, hole, 16, w, 48 * MiB) > 0);
        assert_int_equal(c1.event_waits, c0.event_waits);
        assert_int_equal(cuh_heap_free_device_wide(t.heap, w), CUHEAP_OK);
        /* Many take-backs and no page moves: the events kept stay one per
         * stream, the newest, not one per take-back. */
        for (int i = 0; i < 100; i++) {
            uintptr_t z;
            assert_int_equal(cuh_heap_free_device_wide(t.heap, x), CUHEAP_OK);
            assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 32 * MiB, &z), CUHEAP_OK);
            x = z;
        }
        cuh_sim_counters(t.dev, &c0);
        assert_true(c0.live_events < 40);
        assert_int_equal(cuh_heap_free_device_wide(t.heap, b), CUHEAP_OK);
        assert_int_equal(cuh_heap_free_device_wide(t.heap, x), CUHEAP_OK);
        assert_int_equal(cuh_heap_free_device_wide(t.heap, y), CUHEAP_OK);
        heap_ok(t.heap);
        cuh_sim_complete_all(t.dev);
        test_heap_free(&t);
    }
}


/* The pages a take-back returns wait for the work issued before their frees,
 * but only they: memory an earlier take-back returned, whose work is done,
 * moves while a later take-back's work still runs. Without this a program
 * under LD_PRELOAD whose GPU runs behind (a take-back every few cudaMallocs)
 * would never move a page and would only grow. */
static void test_vmm_pages_move_while_a_later_take_back_runs(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, "vmm:1,vmm_margin:0,small_max:0");
    cuh_sim_hold_events(t.dev, 1);
    uintptr_t a, b, c, d, v, w, y, z;
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 32 * MiB, &a), CUHEAP_OK);
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 32 * MiB, &b), CUHEAP_OK);
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 32 * MiB, &c), CUHEAP_OK);
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 32 * MiB, &d), CUHEAP_OK);
    assert_true(b == a + 32 * MiB && c == b + 32 * MiB && d == c + 32 * MiB);
    /* a comes back by a take-back (v is cut from its hole), and the GPU then
     * passes its free. */
    assert_int_equal(cuh_heap_free_device_wide(t.heap, a), CUHEAP_OK);
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 2 * MiB, &v), CUHEAP_OK);
    assert_true(v >= a && v < b);
    cuh_sim_complete_all(t.dev);
    /* c comes back by a take-back while the work before its free may run. */
    assert_int_equal(cuh_heap_free_device_wide(t.heap, c), CUHEAP_OK);
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 2 * MiB, &w), CUHEAP_OK);
    assert_true(w >= a && w < b);   /* the smaller hole */
    /* y fits neither hole: beyond d, on pages moved from a's hole, not c's. */
    uint64_t ha[14], hc[16];
    handles_at(t.dev, a + 4 * MiB, 28 * MiB, ha);
    handles_at(t.dev, c, 32 * MiB, hc);
    cuh_sim_counters_t c0, c1;
    cuh_sim_counters(t.dev, &c0);
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 64 * MiB, &y), CUHEAP_OK);
    cuh_sim_counters(t.dev, &c1);
    assert_true(y >= d + 32 * MiB);
    assert_int_equal(handles_behind(t.dev, ha, 14, y, 64 * MiB), 14);
    assert_int_equal(handles_behind(t.dev, hc, 16, y, 64 * MiB), 0);
    assert_true(all_pages_mapped(t.dev, c, 32 * MiB));
    assert_int_equal(c1.event_waits, c0.event_waits);   /* the CPU never waited */
    /* Once the GPU has passed c's free, its pages move too. */
    cuh_sim_complete_all(t.dev);
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 64 * MiB, &z), CUHEAP_OK);
    assert_true(handles_behind(t.dev, hc, 16, z, 64 * MiB) > 0);
    uintptr_t blocks[] = {b, d, v, w, y, z};
    for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++)
        assert_int_equal(cuh_heap_free_device_wide(t.heap, blocks[i]), CUHEAP_OK);
    heap_ok(t.heap);
    cuh_sim_complete_all(t.dev);
    test_heap_free(&t);
}

/* Under vmm:1 a block legacy IPC may share (a library named in ipc_callers
 * allocates it) gets a plain segment of its own beside the reservation, which
 * no IPC handle could name; every other block stays in the reservation. The
 * segment is returned once free like any plain one. */
static void test_vmm_a_shareable_block_starts_a_plain_segment_of_its_own(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, "vmm:1");
    uintptr_t a = must_alloc(t.heap, 8 * MiB, 0), s[2], base;
    size_t size;
    assert_true(cuh_heap_in_virtual_memory(t.heap, a));
    assert_int_equal(cuh_heap_malloc_shareable(t.heap, 3 * MiB, &s[0]), CUHEAP_OK);
    assert_int_equal(cuh_heap_malloc_shareable(t.heap, 1000, &s[1]), CUHEAP_OK);
    for (int i = 0; i < 2; i++) {
        assert_false(cuh_heap_in_virtual_memory(t.heap, s[i]));
        assert_true(cuh_heap_segment_of(t.heap, s[i], &base, &size) && base == s[i]);
    }
    uintptr_t b = must_alloc(t.heap, 1000, 0);
    assert_true(cuh_heap_in_virtual_memory(t.heap, b));
    heap_ok(t.heap);
    for (int i = 0; i < 2; i++)
        assert_int_equal(cuh_heap_free_device_wide(t.heap, s[i]), CUHEAP_OK);
    must_free(t.heap, a, 0);
    must_free(t.heap, b, 0);
    cuh_sim_complete_all(t.dev);
    assert_int_equal(cuh_heap_release_cached(t.heap), CUHEAP_OK);
    cuh_sim_counters_t c;
    cuh_sim_counters(t.dev, &c);
    assert_int_equal(c.mem_frees, c.mem_allocs);   /* the plain segments went back */
    heap_ok(t.heap);
    test_heap_free(&t);
}

/* The alias-move setting: blocks p1 (32 MiB), g (32), p2 (32) and b (64)
 * device-wide, 160 MiB live; p1 and p2 freed while their work runs; then y,
 * 48 MiB, which fits neither 32 MiB hole and brings 144 MiB live, under the
 * peak: the take-back returns p1 and p2, and their pages move behind y. */
typedef struct alias_blocks_s {
    uintptr_t p1, g, p2, b, y;
} alias_blocks_t;

static alias_blocks_t alias_setting(cuh_heap_t *heap)
{
    alias_blocks_t a;
    assert_int_equal(cuh_heap_malloc_device_wide(heap, 32 * MiB, &a.p1), CUHEAP_OK);
    assert_int_equal(cuh_heap_malloc_device_wide(heap, 32 * MiB, &a.g), CUHEAP_OK);
    assert_int_equal(cuh_heap_malloc_device_wide(heap, 32 * MiB, &a.p2), CUHEAP_OK);
    assert_int_equal(cuh_heap_malloc_device_wide(heap, 64 * MiB, &a.b), CUHEAP_OK);
    assert_int_equal(cuh_heap_free_device_wide(heap, a.p1), CUHEAP_OK);
    assert_int_equal(cuh_heap_free_device_wide(heap, a.p2), CUHEAP_OK);
    assert_int_equal(cuh_heap_malloc_device_wide(heap, 48 * MiB, &a.y), CUHEAP_OK);
    return a;
}

/* Alias moves: pages a take-back returned while the work before their frees
 * may still run serve a block that does not raise the live peak at once,
 * rather than new pages: mapped behind the new block while their old
 * mappings stay (nothing is placed there) until that work is done, the CPU
 * waiting for nothing. Safe in GPU order: the take-back made all later work
 * wait for the frees' work. */
static void test_vmm_taken_back_pages_move_at_once_and_keep_their_old_mappings(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, "vmm:1,vmm_margin:0,small_max:0");
    cuh_sim_hold_events(t.dev, 1);
    cuh_sim_counters_t c0, c1;
    cuh_sim_counters(t.dev, &c0);
    const alias_blocks_t a = alias_setting(t.heap);   /* the GPU has passed neither free */
    cuh_sim_counters(t.dev, &c1);
    const uintptr_t p1 = a.p1, p2 = a.p2, b = a.b, g = a.g, y = a.y;
    assert_true(y >= b + 64 * MiB);
    /* 80 pages made and mapped for p1, g, p2 and b; none made for y, whose
     * 24 are p1's and p2's, mapped a second time. */
    assert_int_equal(c1.vm_creates - c0.vm_creates, 80);
    assert_int_equal(c1.vm_maps - c0.vm_maps, 80 + 24);
    assert_int_equal(c1.vm_unmaps, c0.vm_unmaps);         /* none unmapped under the running work */
    assert_int_equal(c1.event_waits + c1.synchronizes, c0.event_waits + c0.synchronizes);
    assert_true(all_pages_mapped(t.dev, y, 48 * MiB));
    assert_true(all_pages_mapped(t.dev, p1, 32 * MiB) && all_pages_mapped(t.dev, p2, 32 * MiB));
    heap_ok(t.heap);
    /* The GPU passes the frees: at the next poll the holes are free memory
     * again, and the old mappings kept ones (no call). */
    assert_int_equal(kept_pages(t.heap), 0);
    cuh_sim_complete_all(t.dev);
    cuh_heap_poll(t.heap);
    cuh_sim_counters(t.dev, &c0);
    assert_int_equal(c0.vm_unmaps, c1.vm_unmaps);
    assert_int_equal(kept_pages(t.heap), 24);
    uintptr_t blocks[] = {g, b, y};
    for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++)
        assert_int_equal(cuh_heap_free_device_wide(t.heap, blocks[i]), CUHEAP_OK);
    heap_ok(t.heap);
    cuh_sim_complete_all(t.dev);
    test_heap_free(&t);
}

/* An old mapping the device will not unmap stays recorded, and nothing is
 * mapped over it: a block that needs its pages fails with the refused call
 * named (the simulated device would refuse a second mapping there, and the
 * books stay sound); once the device unmaps again, the blocks fit. */
static void test_vmm_an_old_mapping_the_device_will_not_unmap_is_never_mapped_over(void **state)
{
    (void)state;
    fault_heap_t t = fault_heap_new(GiB, "vmm:1,vmm_margin:0,small_max:0");
    cuh_sim_hold_events(t.sim, 1);
    const alias_blocks_t a = alias_setting(t.heap);   /* p1's and p2's pages moved behind y */
    cuh_sim_complete_all(t.sim);
    cuh_heap_poll(t.heap);
    assert_int_equal(kept_pages(t.heap), 24);   /* their old mappings, kept */
    cuh_fault_random(t.dev, CUH_FAULT_VM_UNMAP, 1.0, 1, CUH_DEV_ERROR);
    uintptr_t z[4];
    int got = 0, refused = 0;
    for (int i = 0; i < 4; i++) {
        const cuheap_status_t rc = cuh_heap_malloc_device_wide(t.heap, 16 * MiB, &z[got]);
        if (rc == CUHEAP_OK) {
            got++;
            continue;
        }
        assert_int_equal(rc, CUHEAP_ERR_DEVICE);
        assert_non_null(strstr(cuheap_last_error(), "vm_unmap"));
        refused++;
        heap_ok(t.heap);
    }
    assert_true(refused > 0);
    assert_true(kept_pages(t.heap) > 0);
    cuh_fault_clear(t.dev);
    while (got < 4)
        assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 16 * MiB, &z[got++]), CUHEAP_OK);
    heap_ok(t.heap);
    uintptr_t blocks[] = {a.g, a.b, a.y, z[0], z[1], z[2], z[3]};
    for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++)
        assert_int_equal(cuh_heap_free_device_wide(t.heap, blocks[i]), CUHEAP_OK);
    fault_heap_free(&t);
}

/* A take-back's pages wait for its own event even when more take-backs run
 * at once than the heap follows one by one: the GPU passes the first N - 3
 * of N take-backs, and the pages the last three returned must stay where
 * they are while every other free page moves. (An event that stood for
 * later take-backs than its own would let those pages go early.) */
static void test_vmm_many_running_take_backs_keep_each_ones_pages(void **state)
{
    (void)state;
    enum { N = 100 };
    test_heap_t t = test_heap_new(GiB, "vmm:1,vmm_margin:0,small_max:0");
    cuh_sim_hold_events(t.dev, 1);
    uintptr_t x[N + 1], trigger[N], y;
    for (int i = 0; i <= N; i++)
        assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 4 * MiB, &x[i]), CUHEAP_OK);
    assert_true(x[0] % (2 * MiB) == 0 && x[N] == x[0] + (uintptr_t)N * 4 * MiB);
    uint64_t passed = 0;
    for (int i = 0; i < N; i++) {
        /* Take-back i + 1 returns x[i]; its trigger is cut from x[0]'s hole. */
        assert_int_equal(cuh_heap_free_device_wide(t.heap, x[i]), CUHEAP_OK);
        assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 512, &trigger[i]), CUHEAP_OK);
        assert_true(trigger[i] >= x[0] && trigger[i] < x[0] + 2 * MiB);
        if (i == N - 4)
            passed = cuh_sim_enqueue_work(t.dev, 0);
    }
    cuh_sim_complete_stream_upto(t.dev, 0, passed);
    uint64_t h1[2], late[6];
    handles_at(t.dev, x[1], 4 * MiB, h1);
    handles_at(t.dev, x[N - 3], 12 * MiB, late);
    cuh_sim_counters_t c0, c1;
    cuh_sim_counters(t.dev, &c0);
    /* More pages than are free: every page that may move does. */
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 512 * MiB, &y), CUHEAP_OK);
    cuh_sim_counters(t.dev, &c1);
    assert_int_equal(handles_behind(t.dev, h1, 2, y, 512 * MiB), 2);
    assert_int_equal(handles_behind(t.dev, late, 6, y, 512 * MiB), 0);
    assert_true(all_pages_mapped(t.dev, x[N - 3], 12 * MiB));
    assert_int_equal(c1.event_waits, c0.event_waits);
    for (int i = 0; i < N; i++)
        assert_int_equal(cuh_heap_free_device_wide(t.heap, trigger[i]), CUHEAP_OK);
    assert_int_equal(cuh_heap_free_device_wide(t.heap, x[N]), CUHEAP_OK);
    assert_int_equal(cuh_heap_free_device_wide(t.heap, y), CUHEAP_OK);
    heap_ok(t.heap);
    cuh_sim_complete_all(t.dev);
    test_heap_free(&t);
}

/* ---- the page rule over random operations -------------------------------- */

/* A page_rule_model failure: the settings, seed and operation, then what broke. */
typedef struct page_rule_run_s {
    const char *conf;
    uint64_t seed;
    int op;
} page_rule_run_t;

static void page_rule_fail(void *ctx, const char *what)
{
    const page_rule_run_t *run = ctx;
    fail_msg("%s, seed %llu, op %d: %s", run->conf, (unsigned long long)run->seed, run->op, what);
}

/* A model of the page rule of vmm:1 over random operations on three streams
 * whose work finishes late, under a tight limit (pages move all the time):
 *   - a new block of stream t may use bytes, by address or by physical page,
 *     that a block freed on stream s used only if t is s or s's work up to
 *     the free is done; a block freed device-wide (cudaFree) counts as used
 *     by every stream, and one allocated device-wide (cudaMalloc) may be used
 *     by every stream at once;
 *   - a page's old mapping stays until that work is done (unmapping is not
 *     stream-ordered: an unmap under running work would fault it).
 * The simulated device answers "done" exactly (cuh_sim_stream_waits_for, on a
 * stream that runs nothing), host waits included, and tells which physical
 * page is mapped where (cuh_sim_handle_at). `wide` percent of the
 * operations are device-wide. Without vmm:1 only addresses are checked.
 * `scale` multiplies the device and every size; above 1 the larger sizes
 * are 1, 2 or 3 times 12 x scale MiB, so that sizes recur (segments above
 * 1 GiB, a huge size coming back: heap_place.c). Returns how often a page of a
 * stream's own recent frees served its next block at another address. */
static size_t page_rule_model(const char *conf, size_t page, unsigned wide, uint64_t seed, int extras, size_t scale)
{
    test_heap_t t = test_heap_new(GiB * scale, conf);
    cuh_sim_hold_events(t.dev, 1);
    enum { SLOTS = 64, OPS = 6000, MAX_PIECES = 40000 };
    const cuh_stream_t streams[3] = {0, S1, S2};
    /* A device-wide free covers the streams the heap knows (the hooks
     * register them as the program creates them). */
    assert_int_equal(cuh_heap_register_stream(t.heap, S1), CUHEAP_OK);
    assert_int_equal(cuh_heap_register_stream(t.heap, S2), CUHEAP_OK);
    uintptr_t addr[SLOTS] = {0};
    size_t size[SLOTS];
    cuh_stream_t stream[SLOTS];
    int device_wide[SLOTS];
    unsigned users[SLOTS];   /* extras: streams record_stream added */
    page_rule_run_t run = {conf, seed, 0};
    heap_model_t model = heap_model_new(t.dev, page, S3, MAX_PIECES, page_rule_fail, &run);
    size_t own_reuse = 0;
    for (int op = 0; op < OPS; op++) {
        run.op = op;
        uint64_t r = test_rand(&seed);
        int i = (int)(r % SLOTS);
        if (addr[i]) {
            /* The block's last kernels (on every stream for a device-wide
             * free), then its free. */
            int wide_free = device_wide[i] || (r >> 50) % 100 < wide;
            for (int k = 0; k < 3; k++) {
                if (!wide_free && streams[k] != stream[i] && !(users[i] >> k & 1))
                    continue;
                heap_model_add(&model, addr[i], size[i], streams[k], cuh_sim_enqueue_work(t.dev, streams[k]), 0, 0);
            }
            if (wide_free)
                assert_int_equal(cuh_heap_free_device_wide(t.heap, addr[i]), CUHEAP_OK);
            else
                must_free(t.heap, addr[i], stream[i]);
            addr[i] = 0;
        } else {
            size[i] = (r >> 40) % 3 ? 1 + (size_t)(r >> 16) % (3 * MiB) : 1 + (size_t)(r >> 16) % (24 * MiB);
            if (scale > 1)
                size[i] = (r >> 40) % 3 ? size[i] * scale : (1 + (size_t)(r >> 16) % 3) * 12 * MiB * scale;
            stream[i] = streams[(r >> 8) % 3];
            device_wide[i] = (r >> 44) % 100 < wide;
            cuheap_status_t st = device_wide[i] ? cuh_heap_malloc_device_wide(t.heap, size[i], &addr[i])
                                                : cuh_heap_malloc(t.heap, size[i], stream[i], &addr[i]);
            if (st == CUHEAP_ERR_OUT_OF_MEMORY) {
                addr[i] = 0;   /* the limit: live blocks fill it */
                continue;
            }
            assert_int_equal(st, CUHEAP_OK);
            users[i] = 0;
            if (extras && !device_wide[i] && (r >> 56) % 10 == 0) {
                /* tensor.record_stream: the block is used on another stream too */
                int u = (int)((r >> 60) % 3);
                if (streams[u] != stream[i]) {
                    assert_int_equal(cuh_heap_record_stream(t.heap, addr[i], streams[u]), CUHEAP_OK);
                    users[i] |= 1u << u;
                }
            }
            own_reuse += heap_model_check(&model, addr[i], size[i], stream[i], device_wide[i], streams, 3);
        }
        /* Work done: forget it. Not done: its page must still be mapped
         * where it was. */
        if (op % 37 == 0)
            cuh_sim_complete_stream(t.dev, streams[(r >> 4) % 3]);
        if (extras && op % 50 == 0)
            cuh_heap_poll(t.heap);
        if (extras && op % 700 == 699)
            assert_int_equal(cuh_heap_release_cached(t.heap), CUHEAP_OK);
        heap_model_prune(&model);
        if (op % 500 == 0)
            heap_ok(t.heap);
    }
    for (int i = 0; i < SLOTS; i++)
        if (addr[i]) {
            if (device_wide[i])
                assert_int_equal(cuh_heap_free_device_wide(t.heap, addr[i]), CUHEAP_OK);
            else
                must_free(t.heap, addr[i], stream[i]);
        }
    cuh_sim_complete_all(t.dev);
    heap_ok(t.heap);
    free(model.pieces);
    test_heap_free(&t);
    return own_reuse;
}

static void test_vmm_random_operations_never_reuse_or_unmap_a_page_before_its_work(void **state)
{
    (void)state;
    static const struct {
        const char *conf;
        size_t page;
        unsigned wide;
        uint64_t seed;
        int lends;   /* pages of a stream's own frees must move to its next blocks */
        int extras;  /* record_stream, polls and cache releases mixed in */
        size_t scale;   /* device and sizes times this */
    } runs[] = {
        {"vmm:1,vmm_margin:0,small_max:0,limit:160M", 2 * MiB, 0, 4242, 1, 0, 1},
        {"vmm:1,vmm_margin:0,limit:160M", 2 * MiB, 0, 77, 1, 0, 1},   /* slabs on the same pages */
        {"vmm:1,vmm_margin:0,small_max:0,vmm_page:4M,limit:160M", 4 * MiB, 0, 4242, 1, 0, 1},
        /* cudaMalloc and cudaFree mixed in: device-wide blocks lend nothing,
         * and nothing is lent while a take-back's work may run (seed 3010
         * caught a page lent then) */
        {"vmm:1,vmm_margin:0,small_max:0,limit:160M", 2 * MiB, 25, 3010, 0, 0, 1},
        /* by address on plain segments (seed 5049 caught a slab cut from a
         * stream's pending frees) */
        {"limit:160M", 2 * MiB, 25, 5049, 0, 0, 1},
        {"vmm:1,vmm_margin:0,workspace:32M,limit:160M", 2 * MiB, 10, 9001, 0, 0, 1},
        {"wait_before_grow:0,limit:160M", 2 * MiB, 40, 10001, 0, 0, 1},
        {"ipc_safe:1,limit:200M", 2 * MiB, 25, 11001, 0, 0, 1},
        {"small_max:1M,limit:160M", 2 * MiB, 25, 12001, 0, 0, 1},
        {"grow_fraction:0,segment_min:20M,limit:200M", 2 * MiB, 25, 13001, 0, 0, 1},
        {"vmm:1,limit:400M", 2 * MiB, 25, 14001, 0, 0, 1},
        {"vmm:1,vmm_margin:0,vmm_page:4M,limit:200M", 4 * MiB, 25, 15001, 0, 0, 1},
        /* slabs of whole pages (seed 1816055 caught a page lent behind one) */
        {"vmm:1,vmm_margin:0,small_max:1M,limit:160M", 2 * MiB, 10, 1816055, 0, 0, 1},
        {"workspace:100M,limit:220M", 2 * MiB, 25, 17001, 0, 0, 1},
        {"vmm:1,vmm_margin:0,wait_before_grow:0,limit:160M", 2 * MiB, 40, 18001, 0, 0, 1},
        {"limit:64M", 2 * MiB, 25, 19001, 0, 0, 1},
        {"vmm:1,vmm_margin:0,limit:64M", 2 * MiB, 10, 20001, 0, 0, 1},
        {"vmm:1,vmm_margin:0,small_max:0,limit:160M", 2 * MiB, 10, 21001, 0, 1, 1},
        {"vmm:1,vmm_margin:0,limit:160M", 2 * MiB, 10, 22001, 0, 1, 1},
        {"limit:160M", 2 * MiB, 25, 23001, 0, 1, 1},
        {"vmm:1,limit:300M", 2 * MiB, 10, 24001, 0, 1, 1},
        /* other streams' pending frees serve a stream that waits for them,
         * or, device-wide, every stream */
        {"reuse_across_streams:1,limit:160M", 2 * MiB, 25, 25001, 0, 1, 1},
        {"vmm:1,vmm_margin:0,reuse_across_streams:1,limit:160M", 2 * MiB, 25, 26001, 0, 0, 1},
        /* seed 1626049 caught a take-back's event kept in place of a newer
         * one recorded when memory changed streams */
        {"vmm:1,vmm_margin:0,reuse_across_streams:1,limit:160M", 2 * MiB, 25, 1626049, 0, 0, 1},
        {"vmm:1,vmm_margin:0,small_max:0,reuse_across_streams:1,limit:160M", 2 * MiB, 0, 27001, 1, 0, 1},
        {"vmm:1,reuse_across_streams:1,limit:300M", 2 * MiB, 10, 28001, 0, 1, 1},
        /* segments above 1 GiB, sizes of 1.5, 3 and 4.5 GiB recurring: huge
         * segments are cut after a take-back, or grown again for a size
         * released idle (by address; a page is 64 MiB of bookkeeping) */
        {"limit:24G", 64 * MiB, 25, 29001, 0, 0, 128},
        {"limit:24G", 64 * MiB, 0, 30001, 0, 1, 128},
        /* units of several pages (vmm_unit), mapped, lent and moved whole */
        {"vmm:1,vmm_margin:0,small_max:0,vmm_unit:8M,limit:160M", 2 * MiB, 0, 31001, 1, 0, 1},
        {"vmm:1,vmm_margin:0,vmm_unit:16M,limit:160M", 2 * MiB, 25, 32001, 0, 1, 1},
        {"vmm:1,vmm_margin:0,reuse_across_streams:1,vmm_unit:8M,limit:160M", 2 * MiB, 25, 33001, 0, 0, 1},
        {"vmm:1,vmm_unit:32M,limit:300M", 2 * MiB, 10, 34001, 0, 1, 1},
        {"vmm:1,vmm_margin:0,vmm_page:4M,vmm_unit:16M,limit:200M", 4 * MiB, 25, 35001, 0, 0, 1},
    };
    /* CUHEAP_TEST_SEEDS=N runs every setting with N seeds more (a longer
     * search than CI's). */
    const char *more = getenv("CUHEAP_TEST_SEEDS");
    uint64_t extra = more ? strtoull(more, NULL, 10) : 0;
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++)
        for (uint64_t n = 0; n <= extra; n++) {
            size_t lent =
                page_rule_model(runs[k].conf, runs[k].page, runs[k].wide, runs[k].seed + n * 100003, runs[k].extras,
                                runs[k].scale);
            if (runs[k].lends && n == 0)
                assert_true(lent > 0);
        }
}

static void test_vmm_random_operations_keep_pages_behind_every_block(void **state)
{
    (void)state;
    /* heap_ok also checks that every page under a live block is mapped. */
    random_operations("vmm:1,vmm_margin:0", 4 * GiB, 8000, 24 * MiB, 53, 99);
    /* Pages larger than a granule: blocks share pages, and a page may only
     * move when no block lies on it. */
    random_operations("vmm:1,vmm_margin:0,vmm_page:6M", 4 * GiB, 8000, 24 * MiB, 53, 99);
    /* Units of several pages: a unit moves only when it lies wholly free. */
    random_operations("vmm:1,vmm_margin:0,vmm_unit:16M", 4 * GiB, 8000, 24 * MiB, 53, 99);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vmm_checkerboard_then_larger_blocks_fit_in_live_plus_two_pages),
        cmocka_unit_test(test_vmm_larger_pages_move_in_fewer_calls),
        cmocka_unit_test(test_vmm_units_are_created_mapped_and_moved_as_one),
        cmocka_unit_test(test_vmm_auto_units_grow_with_the_heap_and_shrink_as_the_device_fills),
        cmocka_unit_test(test_vmm_a_unit_too_long_for_the_gap_goes_back_when_the_device_is_full),
        cmocka_unit_test(test_vmm_moves_a_page_only_after_the_work_on_it_finished),
        cmocka_unit_test(test_bits_all_set_agrees_with_a_bit_by_bit_model),
        cmocka_unit_test(test_vmm_a_streams_own_frees_move_before_the_gpu_passed_them),
        cmocka_unit_test(test_vmm_takes_a_fit_at_the_growth_edge_last),
        cmocka_unit_test(test_vmm_release_cached_returns_free_pages),
        cmocka_unit_test(test_vmm_prefers_a_fit_on_mapped_pages_to_moving_pages),
        cmocka_unit_test(test_vmm_random_operations_keep_pages_behind_every_block),
        cmocka_unit_test(test_vmm_random_operations_never_reuse_or_unmap_a_page_before_its_work),
        cmocka_unit_test(test_allow_peer_grants_mapped_and_later_pages),
        cmocka_unit_test(test_vmm_pages_of_taken_back_memory_move_only_after_their_work),
        cmocka_unit_test(test_vmm_a_shareable_block_starts_a_plain_segment_of_its_own),
        cmocka_unit_test(test_vmm_taken_back_pages_move_at_once_and_keep_their_old_mappings),
        cmocka_unit_test(test_vmm_an_old_mapping_the_device_will_not_unmap_is_never_mapped_over),
        cmocka_unit_test(test_vmm_pages_move_while_a_later_take_back_runs),
        cmocka_unit_test(test_vmm_many_running_take_backs_keep_each_ones_pages),
        cmocka_unit_test(test_vmm_takes_cudafree_memory_back_before_new_pages),
        cmocka_unit_test(test_vmm_free_pages_that_add_up_serve_a_request_off_a_page_boundary),
        cmocka_unit_test(test_vmm_mapped_pages_past_a_free_extents_unmapped_start_serve_a_request),
        cmocka_unit_test(test_vmm_block_grows_from_its_streams_free_memory_at_the_top),
        cmocka_unit_test(test_vmm_steps_count_what_each_step_mapped_and_moved),
        cmocka_unit_test(test_vmm_steps_marked_while_threads_allocate_count_every_page_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
