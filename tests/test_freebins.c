/* test_freebins.c - the segregated-fit index of free extents
 * (src/freebins.c), driven by thousands of random inserts and removes (fixed
 * seeds) beside a reference model, a plain array. After every operation:
 * the index's own check passes, count and bytes equal the model's, the
 * largest node is the model's maximum, and a search finds a node exactly when
 * the model has one that fits (aligned or not), never a node that does not
 * fit, and one no more than two bins (1/32) above the exact best fit; below
 * 64 KiB, where every bin holds one size, the exact best fit itself; and a
 * walk over the bins in size order visits exactly the model's nodes of at
 * least a size's bin, in rising sizes.
 */
#include "test_util.h"

#include "common.h"
#include "freebins.h"

#include <string.h>

#define POOL 500

typedef struct extent_s {
    uint64_t pad;          /* something before the node, so container_of matters */
    cuh_binnode_t node;
    uintptr_t addr;
    size_t size;
    int in;
} extent_t;

static extent_t pool[POOL];

static extent_t *ext_of(cuh_binnode_t *n) { return n ? cuh_container_of(n, extent_t, node) : NULL; }

static int fits(const extent_t *e, size_t size, size_t align)
{
    uintptr_t start = cuh_addr_align_up(e->addr, align);
    return start - e->addr + size <= e->size;
}

/* The model's answer: the smallest extent that fits, or NULL. */
static extent_t *model_best(size_t size, size_t align)
{
    extent_t *best = NULL;
    for (int i = 0; i < POOL; i++)
        if (pool[i].in && fits(&pool[i], size, align) && (!best || pool[i].size < best->size))
            best = &pool[i];
    return best;
}

static void check_find(const cuh_freebins_t *b, size_t size, size_t align)
{
    extent_t *got = ext_of(cuh_freebins_find(b, size, align));
    extent_t *best = model_best(size, align);
    if (!best) {
        assert_null(got);
        return;
    }
    if (!got)
        fail_msg("find(%zu, align %zu) found nothing; %zu bytes at 0x%lx fit", size, align, best->size,
                 (unsigned long)best->addr);
    assert_true(got->in);
    if (!fits(got, size, align))
        fail_msg("find(%zu, align %zu) returned %zu bytes at 0x%lx, which do not fit", size, align, got->size,
                 (unsigned long)got->addr);
    if (got->size > best->size + best->size / 32)
        fail_msg("find(%zu) returned %zu bytes; the best fit is %zu", size, got->size, best->size);
    if (align == 512 && best->size < 64 * KiB && size < 64 * KiB)
        assert_int_equal(got->size, best->size);
}

static size_t random_size(uint64_t *seed)
{
    /* Log-uniform from 512 B to 1 TiB, in 512-byte units. */
    uint64_t r = test_rand(seed);
    unsigned bits = 9 + (unsigned)(r % 31);
    size_t size = (size_t)1 << bits;
    size += (size_t)(test_rand(seed) % size);
    return cuh_align_up(size, 512);
}

/* Walking the bins in order from the bin of `size` visits every node the
 * model holds of at least that bin, each once, bin numbers rising and every
 * node's size no smaller than any node of an earlier bin. */
static void check_walk(const cuh_freebins_t *b, size_t size)
{
    unsigned first = cuh_freebins_bin(size), last = first;
    size_t seen = 0, prev_max = 0;
    for (unsigned bin = cuh_freebins_next(b, first); bin != CUH_BINS_NONE; bin = cuh_freebins_next(b, bin + 1)) {
        assert_true(bin >= last);
        last = bin;
        size_t bin_min = SIZE_MAX, bin_max = 0;
        for (cuh_binnode_t *n = cuh_freebins_head(b, bin); n; n = n->next) {
            assert_int_equal(cuh_freebins_bin(n->size), bin);
            bin_min = n->size < bin_min ? n->size : bin_min;
            bin_max = n->size > bin_max ? n->size : bin_max;
            seen++;
        }
        assert_true(seen > 0 && bin_min >= prev_max);
        prev_max = bin_max;
    }
    size_t model = 0;
    for (int k = 0; k < POOL; k++)
        model += pool[k].in && cuh_freebins_bin(pool[k].size) >= first;
    assert_int_equal(seen, model);
}

static void run_model(uint64_t seed, int ops)
{
    static cuh_freebins_t bins;
    memset(&bins, 0, sizeof bins);
    memset(pool, 0, sizeof pool);
    size_t count = 0, bytes = 0;
    for (int op = 0; op < ops; op++) {
        int i = (int)(test_rand(&seed) % POOL);
        extent_t *e = &pool[i];
        if (e->in) {
            cuh_freebins_remove(&bins, &e->node);
            e->in = 0;
            count--;
            bytes -= e->size;
        } else {
            e->size = random_size(&seed);
            e->addr = (uintptr_t)0x100000000000ull + (uintptr_t)i * ((uintptr_t)1 << 41) +
                      (uintptr_t)(test_rand(&seed) % 4096) * 512;
            cuh_freebins_insert(&bins, &e->node, e->size, e->addr, test_rand(&seed) % 8);
            e->in = 1;
            count++;
            bytes += e->size;
        }
        assert_int_equal(cuh_freebins_check(&bins), 0);
        assert_int_equal(bins.count, count);
        assert_int_equal(bins.bytes, bytes);
        extent_t *largest = ext_of(cuh_freebins_largest(&bins));
        extent_t *model_largest = NULL;
        for (int k = 0; k < POOL; k++)
            if (pool[k].in && (!model_largest || pool[k].size > model_largest->size))
                model_largest = &pool[k];
        if (model_largest)
            assert_int_equal(largest->size, model_largest->size);
        else
            assert_null(largest);
        if (op % 7 == 0) {
            size_t want = random_size(&seed);
            check_find(&bins, want, 512);
            check_find(&bins, want, 64 * KiB);
            check_walk(&bins, want);
            if (e->in)
                check_find(&bins, e->size, 512);   /* an exact size that is present */
        }
    }
}

static void test_random_operations_match_the_model_seed1(void **state)
{
    (void)state;
    run_model(1, 6000);
}

static void test_random_operations_match_the_model_seed2(void **state)
{
    (void)state;
    run_model(0xfeedface, 6000);
}

static void test_exact_bins_return_the_exact_best_fit_first_by_rank_then_address(void **state)
{
    (void)state;
    static cuh_freebins_t bins;
    memset(&bins, 0, sizeof bins);
    memset(pool, 0, sizeof pool);
    size_t sizes[] = {4096, 1024, 2048, 2048, 8192, 2048};
    uint64_t ranks[] = {0, 0, 1, 2, 0, 2};
    for (int i = 0; i < 6; i++) {
        pool[i].size = sizes[i];
        pool[i].addr = (uintptr_t)(0x10000000 + (6 - i) * 0x100000);
        pool[i].in = 1;
        cuh_freebins_insert(&bins, &pool[i].node, pool[i].size, pool[i].addr, ranks[i]);
    }
    /* Three of 2048: the lowest rank wins though its address is the highest. */
    assert_ptr_equal(ext_of(cuh_freebins_find(&bins, 1536, 512)), &pool[2]);
    cuh_freebins_remove(&bins, &pool[2].node);
    /* Two of rank 2: the lower address. */
    assert_ptr_equal(ext_of(cuh_freebins_find(&bins, 1536, 512)), &pool[5]);
    assert_ptr_equal(ext_of(cuh_freebins_find(&bins, 1024, 512)), &pool[1]);
    assert_ptr_equal(ext_of(cuh_freebins_find(&bins, 4097, 512)), &pool[4]);
    assert_null(cuh_freebins_find(&bins, 8193, 512));
    assert_ptr_equal(ext_of(cuh_freebins_largest(&bins)), &pool[4]);
    cuh_freebins_remove(&bins, &pool[4].node);
    assert_null(cuh_freebins_find(&bins, 4097, 512));
    assert_int_equal(cuh_freebins_check(&bins), 0);
}

static void test_aligned_search_skips_nodes_the_padding_does_not_fit(void **state)
{
    (void)state;
    static cuh_freebins_t bins;
    memset(&bins, 0, sizeof bins);
    memset(pool, 0, sizeof pool);
    /* 96 KiB at an address 512 past a 64 KiB boundary holds no aligned 64 KiB. */
    pool[0] = (extent_t){.size = 96 * KiB, .addr = 0x10000200, .in = 1};
    pool[1] = (extent_t){.size = 192 * KiB, .addr = 0x20000200, .in = 1};
    cuh_freebins_insert(&bins, &pool[0].node, pool[0].size, pool[0].addr, 0);
    cuh_freebins_insert(&bins, &pool[1].node, pool[1].size, pool[1].addr, 0);
    assert_ptr_equal(ext_of(cuh_freebins_find(&bins, 64 * KiB, 512)), &pool[0]);
    assert_ptr_equal(ext_of(cuh_freebins_find(&bins, 64 * KiB, 64 * KiB)), &pool[1]);
    cuh_freebins_remove(&bins, &pool[1].node);
    assert_null(cuh_freebins_find(&bins, 64 * KiB, 64 * KiB));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_operations_match_the_model_seed1),
        cmocka_unit_test(test_random_operations_match_the_model_seed2),
        cmocka_unit_test(test_exact_bins_return_the_exact_best_fit_first_by_rank_then_address),
        cmocka_unit_test(test_aligned_search_skips_nodes_the_padding_does_not_fit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
