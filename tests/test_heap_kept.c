/* test_heap_kept.c - kept mappings under vmm:1 (src/heap_pages.c): a unit
 * that moves stays mapped where it was until that range is needed; the
 * device agrees with the heap's books after every operation, with and
 * without refused unmaps; a peer grant drops the kept mappings; and a kept
 * mapping the device would not let go as its unit went back is never taken
 * for a new unit with the same handle value (the orphan rule).
 */
#include "heap_test.h"

/* Kept mappings against the device: after every operation each page under a
 * live block is mapped on the (simulated) device, and the device maps exactly
 * the pages in use and the kept ones: none lost, none left behind. */
static void kept_agree_with_device(cuh_heap_t *heap, cuh_device_t *sim, const uintptr_t *addr, const size_t *size,
                                   size_t slots)
{
    for (size_t i = 0; i < slots; i++)
        for (uintptr_t va = addr[i] & ~(2 * MiB - 1); addr[i] && va < addr[i] + size[i]; va += 2 * MiB)
            if (!cuh_sim_handle_at(sim, va, NULL))
                fail_msg("page 0x%lx of a live block is not mapped on the device", (unsigned long)va);
    cuh_heap_snapshot_t *snap = cuh_heap_snapshot(heap, 0);
    assert_non_null(snap);
    uint64_t mapped = 0, draining = 0;
    for (size_t i = 0; i < snap->num_segments; i++)
        if (snap->segments[i].virtual_space) {
            mapped += snap->segments[i].mapped + snap->segments[i].kept_pages * 2 * MiB + snap->segments[i].draining;
            draining += snap->segments[i].draining;
        }
    cuh_heap_snapshot_free(snap);
    cuh_sim_counters_t c;
    cuh_sim_counters(sim, &c);
    /* An old mapping whose unmap the device refused keeps its whole range
     * out of use, though the rest of it was unmapped (draining is then an
     * upper bound). */
    if (c.vm_mapped < mapped - draining || c.vm_mapped > mapped)
        fail_msg("the device maps %zu bytes; in use and kept %llu, draining %llu", c.vm_mapped,
                 (unsigned long long)(mapped - draining), (unsigned long long)draining);
}

/* Random blocks (cudaMalloc and cudaFree, the GPU keeping up) under a margin
 * of 0, so that pages move at almost every allocation that needs them: a unit that moves stays mapped where it was
 * (no unmap), some come back to where they stayed (no map, no grant), the
 * device agrees with the books after every operation, and with `fail_unmaps`
 * a fifth of the unmaps are refused (a kept mapping that cannot go stays,
 * recorded, and a block that needed its pages fails cleanly or finds others).
 * Giving the cache back (empty_cache) takes every kept mapping with it. */
static void kept_random_operations(int fail_unmaps)
{
    fault_heap_t t = fault_heap_new(GiB, "vmm:1,vmm_margin:0,small_max:0");
    if (fail_unmaps)
        cuh_fault_random(t.dev, CUH_FAULT_VM_UNMAP, 0.2, 7, CUH_DEV_ERROR);
    enum { SLOTS = 48, OPS = 3000 };
    uintptr_t addr[SLOTS] = {0};
    size_t size[SLOTS] = {0};
    uint64_t rng = 0x5eed + (uint64_t)fail_unmaps, failed = 0;
    cuh_sim_counters_t c0, c1;
    cuh_sim_counters(t.sim, &c0);
    for (int op = 0; op < OPS; op++) {
        const uint64_t r = test_rand(&rng);
        const size_t i = r % SLOTS;
        if (addr[i]) {
            assert_int_equal(cuh_heap_free_device_wide(t.heap, addr[i]), CUHEAP_OK);
            addr[i] = 0;
        } else {
            size[i] = (1 + (r >> 8) % 12) * MiB + ((r >> 16) % 3) * 512 * 1024;
            const cuheap_status_t rc = cuh_heap_malloc_device_wide(t.heap, size[i], &addr[i]);
            if (rc != CUHEAP_OK) {
                assert_true(fail_unmaps);
                assert_int_equal(rc, CUHEAP_ERR_DEVICE);
                assert_non_null(strstr(cuheap_last_error(), "unmap"));
                addr[i] = 0;
                failed++;
            }
        }
        if (op % 500 == 499)
            cuh_heap_release_cached(t.heap);
        heap_ok(t.heap);
        kept_agree_with_device(t.heap, t.sim, addr, size, SLOTS);
    }
    cuh_sim_counters(t.sim, &c1);
    uint64_t moves, kept, hits;
    vm_totals(t.heap, &moves, &kept, &hits);
    print_message("%llu pages moved, %llu back where they stayed mapped, %llu unmaps\n", (unsigned long long)moves,
                  (unsigned long long)hits, (unsigned long long)(c1.vm_unmaps - c0.vm_unmaps));
    assert_true(moves > 300);
    assert_true(fail_unmaps || hits > 0);
    /* Each move needed an unmap before; kept mappings save part of them. */
    assert_true(c1.vm_unmaps - c0.vm_unmaps < moves);
    if (fail_unmaps)
        assert_true(cuh_fault_injected(t.dev, CUH_FAULT_VM_UNMAP) > 0);
    cuh_fault_clear(t.dev);
    for (size_t i = 0; i < SLOTS; i++)
        if (addr[i])
            assert_int_equal(cuh_heap_free_device_wide(t.heap, addr[i]), CUHEAP_OK);
    cuh_sim_complete_all(t.sim);
    /* Nothing live: giving the cache back leaves nothing mapped at all. */
    cuh_heap_release_cached(t.heap);
    cuh_sim_counters(t.sim, &c1);
    assert_int_equal(c1.vm_mapped, 0);
    fault_heap_free(&t);
}

static void test_vmm_kept_mappings_agree_with_the_device_over_random_operations(void **state)
{
    (void)state;
    kept_random_operations(0);
}

static void test_vmm_kept_mappings_that_the_device_will_not_unmap_stay_recorded(void **state)
{
    (void)state;
    kept_random_operations(1);
}

/* A peer granted access after a unit moved would lack it at a kept mapping
 * the unit came back to: the grant unmaps the kept mappings first, so every
 * mapping made afterwards is granted (one grant per map). */
static void test_vmm_a_peer_grant_takes_the_kept_mappings_away(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, "vmm:1,vmm_margin:0,small_max:0");
    uintptr_t a = must_alloc(t.heap, 2 * MiB, 0);
    uintptr_t b = must_alloc(t.heap, 2 * MiB, 0);
    must_free(t.heap, a, 0);
    uintptr_t c = must_alloc(t.heap, 4 * MiB, S1);   /* a's page moves behind c once the GPU passed a's free */
    assert_int_equal(kept_pages(t.heap), 1);
    assert_int_equal(cuh_heap_allow_peer(t.heap, 1), CUHEAP_OK);
    assert_int_equal(kept_pages(t.heap), 0);
    cuh_sim_counters_t c0;
    cuh_sim_counters(t.dev, &c0);
    assert_int_equal(c0.vm_mapped, 6 * MiB);
    must_free(t.heap, b, 0);
    must_free(t.heap, c, S1);
    heap_ok(t.heap);
    test_heap_free(&t);
}

/* A kept mapping that the device will not unmap as its unit goes back to
 * the device is an orphan: the range stays out of use while the refusal
 * lasts, and is mapped anew afterwards, even for a unit to which the
 * driver gives the released unit's handle value again (the simulated
 * device does, with cuh_sim_reuse_handles). Taken for that unit's own kept
 * mapping, the range would keep the released allocation, which the mapping
 * keeps alive, behind a block. */
static void test_vmm_a_kept_mapping_left_by_a_released_unit_is_never_taken_for_a_new_one(void **state)
{
    (void)state;
    fault_heap_t t = fault_heap_new(GiB, "vmm:1,vmm_margin:0,small_max:0");
    cuh_sim_reuse_handles(t.sim, 1);
    uintptr_t a = must_alloc(t.heap, 2 * MiB, 0);
    uintptr_t b = must_alloc(t.heap, 2 * MiB, 0);
    const uint64_t ha = cuh_sim_handle_at(t.sim, a, NULL);
    must_free(t.heap, a, 0);
    uintptr_t c = must_alloc(t.heap, 4 * MiB, S1);   /* a's unit moves behind c, and stays mapped at a */
    assert_int_equal(kept_pages(t.heap), 1);
    must_free(t.heap, c, S1);
    cuh_sim_complete_all(t.sim);
    /* Giving the cache back: the device keeps the mapping at a, and a's unit
     * goes back to it all the same. */
    cuh_fault_unmap_stuck(t.dev, a);
    assert_int_equal(cuh_heap_release_cached(t.heap), CUHEAP_OK);
    assert_true(cuh_fault_injected(t.dev, CUH_FAULT_VM_UNMAP) >= 1);
    assert_int_equal(kept_pages(t.heap), 1);                 /* recorded: nothing is mapped over it */
    assert_int_equal(cuh_sim_handle_at(t.sim, a, NULL), ha);
    assert_true(cuh_sim_released_at(t.sim, a));
    /* While the device refuses, a block that needs the range fails, naming the call. */
    uintptr_t x = 0;
    assert_int_equal(cuh_heap_malloc(t.heap, 2 * MiB, 0, &x), CUHEAP_ERR_DEVICE);
    assert_non_null(strstr(cuheap_last_error(), "vm_unmap"));
    heap_ok(t.heap);
    /* Once it lets go, the range is mapped anew, with the new unit that got
     * the released one's handle value, not taken to be that unit's already. */
    cuh_fault_clear(t.dev);
    x = must_alloc(t.heap, 2 * MiB, 0);
    assert_int_equal(x, a);
    assert_int_equal(cuh_sim_handle_at(t.sim, x, NULL), ha);   /* the value, given again */
    assert_false(cuh_sim_released_at(t.sim, x));                /* the allocation, a new one */
    assert_int_equal(kept_pages(t.heap), 0);
    heap_ok(t.heap);
    must_free(t.heap, x, 0);
    must_free(t.heap, b, 0);
    fault_heap_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vmm_kept_mappings_agree_with_the_device_over_random_operations),
        cmocka_unit_test(test_vmm_kept_mappings_that_the_device_will_not_unmap_stay_recorded),
        cmocka_unit_test(test_vmm_a_peer_grant_takes_the_kept_mappings_away),
        cmocka_unit_test(test_vmm_a_kept_mapping_left_by_a_released_unit_is_never_taken_for_a_new_one),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
