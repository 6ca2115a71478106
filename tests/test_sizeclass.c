/* test_sizeclass.c - tests of the size-class arithmetic (src/sizeclass.c).
 *
 * Proves that every request size up to 1 MiB maps to the smallest class that
 * holds it, that classes are multiples of 512 and strictly increase, that the
 * waste stays under 512 bytes up to 4 KiB and at most 25% above, that the
 * class table equals one built independently from the documented scheme
 * (512-byte steps to 4 KiB, then four classes per doubling), that the class
 * counts for 0, 512, 64 KiB and 1 MiB are 0, 1, 24 and 40, and that every
 * slab is a whole number of 64 KiB pages holding at least 16 objects.
 */
#include "test_util.h"

#include "sizeclass.h"

/* The class table as sizeclass.h documents it, built without the code. */
static size_t ref_classes[CUH_MAX_CLASSES];
static unsigned ref_count;

static void build_reference(void)
{
    ref_count = 0;
    for (size_t s = 512; s <= 4096; s += 512)
        ref_classes[ref_count++] = s;
    for (size_t base = 4096; ref_count < CUH_MAX_CLASSES; base *= 2)
        for (size_t q = 1; q <= 4 && ref_count < CUH_MAX_CLASSES; q++)
            ref_classes[ref_count++] = base + q * (base / 4);
}

/* Smallest reference class >= s (linear search: independent of the code). */
static unsigned ref_index(size_t s)
{
    for (unsigned i = 0; i < ref_count; i++)
        if (ref_classes[i] >= s)
            return i;
    return ref_count;
}

static void check_size(size_t s)
{
    unsigned idx = cuh_sizeclass_index(s);
    size_t cls = cuh_sizeclass_size(idx);
    if (idx >= CUH_MAX_CLASSES)
        fail_msg("size %zu: index %u out of range", s, idx);
    if (cls < s)
        fail_msg("size %zu: class %u of %zu bytes does not hold it", s, idx, cls);
    if (cls % 512 != 0)
        fail_msg("size %zu: class %zu is not a multiple of 512", s, cls);
    if (idx > 0 && cuh_sizeclass_size(idx - 1) >= s)
        fail_msg("size %zu: class %u (%zu) is not the smallest; class %u (%zu) fits", s, idx, cls, idx - 1,
                 cuh_sizeclass_size(idx - 1));
    if (s <= 4096) {
        if (cls - s >= 512)
            fail_msg("size %zu: waste %zu >= 512 bytes", s, cls - s);
    } else if ((cls - s) * 4 > s) {
        fail_msg("size %zu: waste %zu is more than 25%%", s, cls - s);
    }
    unsigned want = ref_index(s);
    if (idx != want)
        fail_msg("size %zu: index %u, reference says %u (%zu bytes)", s, idx, want, ref_classes[want]);
}

static void test_every_size_maps_to_smallest_fitting_class(void **state)
{
    (void)state;
    build_reference();
    for (size_t s = 1; s <= 64 * KiB; s++)
        check_size(s);
    for (size_t s = 64 * KiB + 1; s <= MiB; s += 509)
        check_size(s);
    /* Boundaries of every class, where off-by-ones live. */
    for (unsigned i = 0; i < ref_count; i++) {
        size_t c = ref_classes[i];
        check_size(c);
        check_size(c - 1);
        if (c < MiB)
            check_size(c + 1);
    }
    check_size(MiB);
    assert_int_equal(cuh_sizeclass_index(MiB), CUH_MAX_CLASSES - 1);
}

static void test_class_sizes_match_documented_table_and_increase(void **state)
{
    (void)state;
    build_reference();
    assert_int_equal(ref_count, CUH_MAX_CLASSES);
    size_t prev = 0;
    for (unsigned i = 0; i < CUH_MAX_CLASSES; i++) {
        size_t c = cuh_sizeclass_size(i);
        if (c != ref_classes[i])
            fail_msg("class %u: %zu bytes, expected %zu", i, c, ref_classes[i]);
        if (c <= prev)
            fail_msg("class %u (%zu) does not exceed class %u (%zu)", i, c, i - 1, prev);
        assert_int_equal(c % 512, 0);
        /* A class size maps back to its own index. */
        assert_int_equal(cuh_sizeclass_index(c), i);
        prev = c;
    }
    /* Spot values written out by hand. */
    assert_int_equal(cuh_sizeclass_size(0), 512);
    assert_int_equal(cuh_sizeclass_size(7), 4096);
    assert_int_equal(cuh_sizeclass_size(8), 5120);
    assert_int_equal(cuh_sizeclass_size(11), 8192);
    assert_int_equal(cuh_sizeclass_size(12), 10240);
    assert_int_equal(cuh_sizeclass_size(23), 64 * KiB);
    assert_int_equal(cuh_sizeclass_size(39), MiB);
    assert_int_equal(cuh_sizeclass_index(1), 0);
    assert_int_equal(cuh_sizeclass_index(512), 0);
    assert_int_equal(cuh_sizeclass_index(513), 1);
    assert_int_equal(cuh_sizeclass_index(4096), 7);
    assert_int_equal(cuh_sizeclass_index(4097), 8);
    assert_int_equal(cuh_sizeclass_index(5121), 9);
    assert_int_equal(cuh_sizeclass_index(8193), 12);
}

static void test_class_counts_for_small_max(void **state)
{
    (void)state;
    assert_int_equal(cuh_sizeclass_count(0), 0);
    assert_int_equal(cuh_sizeclass_count(1), 1);
    assert_int_equal(cuh_sizeclass_count(512), 1);
    assert_int_equal(cuh_sizeclass_count(513), 2);
    assert_int_equal(cuh_sizeclass_count(4096), 8);
    assert_int_equal(cuh_sizeclass_count(64 * KiB), 24);
    assert_int_equal(cuh_sizeclass_count(64 * KiB + 1), 25);
    assert_int_equal(cuh_sizeclass_count(MiB), CUH_MAX_CLASSES);
    assert_int_equal(cuh_sizeclass_count(MiB), 40);
    /* count(m) classes must serve every size up to m, and no fewer would. */
    build_reference();
    for (size_t m = 1; m <= MiB; m += (m < 8192 ? 1 : 997)) {
        unsigned n = cuh_sizeclass_count(m);
        assert_int_equal(n, ref_index(m) + 1);
        assert_true(cuh_sizeclass_size(n - 1) >= m);
        if (n > 1)
            assert_true(cuh_sizeclass_size(n - 2) < m);
    }
}

static void test_slab_is_whole_pages_holding_at_least_16_objects(void **state)
{
    (void)state;
    for (unsigned i = 0; i < CUH_MAX_CLASSES; i++) {
        size_t obj = cuh_sizeclass_size(i);
        size_t slab = cuh_sizeclass_slab_bytes(i);
        if (slab == 0 || slab % CUH_SLAB_PAGE != 0)
            fail_msg("class %u: slab of %zu bytes is not a multiple of 64 KiB", i, slab);
        if (slab / obj < 16)
            fail_msg("class %u: slab of %zu bytes holds %zu objects of %zu", i, slab, slab / obj, obj);
        /* Not wastefully large: one page less would not hold 16 objects. */
        if (slab > CUH_SLAB_PAGE && (slab - CUH_SLAB_PAGE) / obj >= 16)
            fail_msg("class %u: slab of %zu bytes is a page larger than needed", i, slab);
    }
    assert_int_equal(cuh_sizeclass_slab_bytes(0), 64 * KiB);
    assert_int_equal(cuh_sizeclass_slab_bytes(23), MiB);          /* 16 x 64 KiB */
    assert_int_equal(cuh_sizeclass_slab_bytes(39), 16 * MiB);     /* 16 x 1 MiB */
    assert_int_equal(cuh_sizeclass_slab_bytes(8), 128 * KiB);     /* 16 x 5 KiB = 80 KiB -> 2 pages */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_size_maps_to_smallest_fitting_class),
        cmocka_unit_test(test_class_sizes_match_documented_table_and_increase),
        cmocka_unit_test(test_class_counts_for_small_max),
        cmocka_unit_test(test_slab_is_whole_pages_holding_at_least_16_objects),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
