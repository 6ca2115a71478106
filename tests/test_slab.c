/* test_slab.c - tests of slab records (src/slab.c, src/slab.h).
 *
 * cuh_slab_index finds an object's index by multiplication instead of
 * division; this proves it equal to plain division for every size class
 * (and odd object sizes, which classes never use) at every object start, one
 * byte either side of it, and addresses below and past the slab. It also
 * proves take / give back: every object once, then none, then the one given
 * back.
 */
#include "test_util.h"

#include "arena.h"
#include "common.h"
#include "sizeclass.h"
#include "slab.h"

#include <string.h>

static int64_t index_by_division(uintptr_t base, size_t obj, uint32_t n, uintptr_t addr)
{
    if (addr < base || (addr - base) % obj)
        return -1;
    uintptr_t i = (addr - base) / obj;
    return i < n ? (int64_t)i : -1;
}

static void check_object_size(size_t obj, size_t slab_bytes)
{
    cuh_extent_t ext;
    memset(&ext, 0, sizeof ext);
    ext.addr = (uintptr_t)0x7f0000000000ull;
    ext.size = slab_bytes;
    cuh_slab_t *s = cuh_slab_create(&ext, 0, obj);
    assert_non_null(s);
    assert_int_equal(s->num_objs, slab_bytes / obj);
    const uintptr_t base = ext.addr;
    for (uint32_t i = 0; i <= s->num_objs; i++) {
        uintptr_t start = base + (uintptr_t)i * obj;
        for (int d = -1; d <= 1; d++) {
            uintptr_t a = start + (uintptr_t)(intptr_t)d;
            int64_t want = index_by_division(base, obj, s->num_objs, a);
            if (cuh_slab_index(s, a) != want)
                fail_msg("object size %zu, address base%+lld: index %lld, division says %lld", obj,
                         (long long)(a - base), (long long)cuh_slab_index(s, a), (long long)want);
        }
    }
    assert_int_equal(cuh_slab_index(s, base - obj), -1);
    assert_int_equal(cuh_slab_index(s, base + slab_bytes + obj), -1);
    assert_int_equal(cuh_slab_index(s, 0), -1);
    assert_int_equal(cuh_slab_index(s, UINTPTR_MAX), -1);
    cuh_slab_destroy(s);
}

static void test_index_equals_division_for_every_class(void **state)
{
    (void)state;
    for (unsigned c = 0; c < CUH_MAX_CLASSES; c++)
        check_object_size(cuh_sizeclass_size(c), cuh_sizeclass_slab_bytes(c));
}

static void test_index_equals_division_for_odd_sizes(void **state)
{
    (void)state;
    static const size_t odd[] = {2, 3, 7, 511, 513, 1000, 4097, 12345, 65535, 65537, 99991};
    for (size_t k = 0; k < sizeof odd / sizeof odd[0]; k++)
        check_object_size(odd[k], cuh_align_up(16 * odd[k], CUH_SLAB_PAGE));
}

static void test_take_hands_out_each_object_once(void **state)
{
    (void)state;
    cuh_extent_t ext;
    memset(&ext, 0, sizeof ext);
    ext.addr = (uintptr_t)0x7f0000000000ull;
    ext.size = 64 * KiB;
    cuh_slab_t *s = cuh_slab_create(&ext, 0, 512);
    assert_non_null(s);
    uint8_t seen[128] = {0};
    for (int i = 0; i < 128; i++) {
        int64_t x = cuh_slab_take(s);
        assert_true(x >= 0 && x < 128);
        assert_false(seen[x]);
        seen[x] = 1;
    }
    assert_int_equal(cuh_slab_take(s), -1);
    cuh_slab_give_back(s, 77);
    assert_int_equal(cuh_slab_take(s), 77);
    assert_int_equal(cuh_slab_take(s), -1);
    cuh_slab_destroy(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_index_equals_division_for_every_class),
        cmocka_unit_test(test_index_equals_division_for_odd_sizes),
        cmocka_unit_test(test_take_hands_out_each_object_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
