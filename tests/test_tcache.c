/* test_tcache.c - a thread cache's table and bins (tcache.h): every entry
 * inserted is found until removed, through growth and the backward shifts of
 * removals; bins pop the newest object of the asking stream, look only a few
 * objects deep, and refuse a push when full. The heap's rules for thread
 * caches are tested in test_heap_tcache.c. */
#include "test_util.h"
#include "tcache.h"

#include <string.h>

static void test_table_finds_every_entry_through_growth_and_removals(void **state)
{
    (void)state;
    cuh_tcache_t *tc = cuh_tcache_create();
    assert_non_null(tc);
    enum { N = 5000 };
    static uintptr_t addr[N];
    uint64_t seed = 7;
    for (int i = 0; i < N; i++) {
        /* 512-aligned like device blocks, many sharing their high bits. */
        addr[i] = (uintptr_t)0x7f0000000000 + (uintptr_t)(test_rand(&seed) % (1u << 22)) * 512;
        for (int j = 0; j < i; j++)
            if (addr[j] == addr[i]) {
                addr[i] += (uintptr_t)1 << 40;
                break;
            }
        cuh_tc_entry_t *e = cuh_tcache_insert(tc, addr[i]);
        assert_non_null(e);
        e->requested = (uint32_t)i;
    }
    assert_int_equal(tc->count, N);
    assert_true(tc->mask + 1 >= 2 * N);
    /* Remove every third; the rest are still there with their values. */
    for (int i = 0; i < N; i += 3) {
        cuh_tc_entry_t *e = cuh_tcache_find(tc, addr[i]);
        assert_non_null(e);
        cuh_tcache_remove(tc, e);
    }
    for (int i = 0; i < N; i++) {
        cuh_tc_entry_t *e = cuh_tcache_find(tc, addr[i]);
        if (i % 3 == 0) {
            assert_null(e);
        } else {
            assert_non_null(e);
            assert_int_equal(e->requested, (uint32_t)i);
        }
    }
    assert_null(cuh_tcache_find(tc, 0x1234000));
    cuh_tcache_destroy(tc);
}

static void test_bins_pop_the_newest_object_of_the_asking_stream(void **state)
{
    (void)state;
    cuh_tcache_t *tc = cuh_tcache_create();
    assert_int_equal(cuh_tcache_push(tc, 3, 0x1000, 1), 0);
    assert_int_equal(cuh_tcache_push(tc, 3, 0x2000, 2), 0);
    assert_int_equal(cuh_tcache_push(tc, 3, 0x3000, 1), 0);
    assert_int_equal(cuh_tcache_push(tc, 3, 0x4000, 2), 0);
    assert_int_equal(cuh_tcache_pop(tc, 4, 1), 0);           /* another class */
    assert_int_equal(cuh_tcache_pop(tc, 3, 9), 0);           /* another stream */
    assert_int_equal(cuh_tcache_pop(tc, 3, 1), 0x3000);
    assert_int_equal(cuh_tcache_pop(tc, 3, 2), 0x4000);
    assert_int_equal(cuh_tcache_pop(tc, 3, 1), 0x1000);
    assert_int_equal(tc->bins[3].count, 1);
    assert_int_equal(tc->bins[3].addr[0], 0x2000);
    cuh_tcache_destroy(tc);
}

static void test_bins_look_only_a_few_deep_and_refuse_when_full(void **state)
{
    (void)state;
    cuh_tcache_t *tc = cuh_tcache_create();
    assert_int_equal(cuh_tcache_push(tc, 0, 0xa000, 5), 0);   /* buried under other streams' */
    for (uintptr_t i = 1; i < CUH_TC_BIN_MAX; i++)
        assert_int_equal(cuh_tcache_push(tc, 0, 0xa000 + i * 512, 6), 0);
    assert_int_equal(cuh_tcache_push(tc, 0, 0xf0000, 6), -1);
    assert_int_equal(tc->bins[0].count, CUH_TC_BIN_MAX);
    assert_int_equal(cuh_tcache_pop(tc, 0, 5), 0);
    /* Unbinning keeps the others in order. */
    cuh_tcache_unbin(tc, 0, 1);
    assert_int_equal(tc->bins[0].count, CUH_TC_BIN_MAX - 1);
    assert_int_equal(tc->bins[0].addr[0], 0xa000);
    assert_int_equal(tc->bins[0].addr[1], 0xa000 + 2 * 512);
    assert_int_equal(tc->bins[0].stream[1], 6);
    cuh_tcache_destroy(tc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_finds_every_entry_through_growth_and_removals),
        cmocka_unit_test(test_bins_pop_the_newest_object_of_the_asking_stream),
        cmocka_unit_test(test_bins_look_only_a_few_deep_and_refuse_when_full),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
