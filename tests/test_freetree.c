/* test_freetree.c - tests of the AVL index of free extents (src/freetree.c).
 *
 * Drives the tree with thousands of random inserts and removes (fixed seeds)
 * next to a reference model, an array kept sorted by (size, address), and
 * after every operation proves that the tree's own check passes, that count
 * and bytes equal the model's, that lower_bound(n) is the model's first
 * extent of at least n bytes (for sizes equal to, between and beyond every
 * key, and NULL when none fits), that the first/next walk visits exactly the
 * model's order and that last is its maximum. Also proves that equal sizes
 * are ordered by address and that sorted insertion keeps the tree balanced.
 * Nodes are intrusive: each cuh_ftnode_t lives inside a test extent.
 */
#include "test_util.h"

#include "common.h"
#include "freetree.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define POOL 600

typedef struct extent_s {
    uint64_t tag;          /* something before the node, so container_of matters */
    cuh_ftnode_t node;
    uintptr_t addr;        /* unique per extent */
    size_t size;           /* valid while in the tree */
    int in_tree;
} extent_t;

typedef struct model_s {
    extent_t *items[POOL]; /* sorted by (size, addr) */
    size_t n;
    size_t bytes;
} model_t;

static extent_t pool[POOL];

static int ext_less(const extent_t *a, const extent_t *b)
{
    return a->size < b->size || (a->size == b->size && a->addr < b->addr);
}

static void model_insert(model_t *m, extent_t *e)
{
    size_t i = m->n;
    while (i > 0 && ext_less(e, m->items[i - 1])) {
        m->items[i] = m->items[i - 1];
        i--;
    }
    m->items[i] = e;
    m->n++;
    m->bytes += e->size;
}

static void model_remove(model_t *m, extent_t *e)
{
    size_t i = 0;
    while (i < m->n && m->items[i] != e)
        i++;
    assert_true(i < m->n);
    memmove(&m->items[i], &m->items[i + 1], (m->n - i - 1) * sizeof m->items[0]);
    m->n--;
    m->bytes -= e->size;
}

static extent_t *model_lower_bound(const model_t *m, size_t size)
{
    for (size_t i = 0; i < m->n; i++)
        if (m->items[i]->size >= size)
            return m->items[i];
    return NULL;
}

static extent_t *ext_of(cuh_ftnode_t *n) { return n ? cuh_container_of(n, extent_t, node) : NULL; }

static void check_lower_bound(const cuh_freetree_t *t, const model_t *m, size_t size)
{
    extent_t *got = ext_of(cuh_freetree_lower_bound(t, size));
    extent_t *want = model_lower_bound(m, size);
    if (got != want)
        fail_msg("lower_bound(%zu): got %s (size %zu addr 0x%lx), expected %s (size %zu addr 0x%lx)", size,
                 got ? "extent" : "NULL", got ? got->size : 0, got ? (unsigned long)got->addr : 0UL,
                 want ? "extent" : "NULL", want ? want->size : 0, want ? (unsigned long)want->addr : 0UL);
}

/* Everything the tree must agree on with the model, after any operation. */
static void check_against_model(const cuh_freetree_t *t, const model_t *m, uint64_t *rng)
{
    if (cuh_freetree_check(t) != 0)
        fail_msg("cuh_freetree_check failed with %zu nodes", m->n);
    assert_int_equal(t->count, m->n);
    assert_int_equal(t->bytes, m->bytes);

    /* In-order walk equals the model, node for node, keys intact. */
    size_t i = 0;
    for (cuh_ftnode_t *n = cuh_freetree_first(t); n; n = cuh_freetree_next(n), i++) {
        if (i >= m->n)
            fail_msg("walk visits more than the %zu nodes of the model", m->n);
        extent_t *e = ext_of(n);
        if (e != m->items[i])
            fail_msg("walk position %zu: size %zu addr 0x%lx, expected size %zu addr 0x%lx", i, e->size,
                     (unsigned long)e->addr, m->items[i]->size, (unsigned long)m->items[i]->addr);
        assert_int_equal(n->size, e->size);
        assert_int_equal(n->addr, e->addr);
    }
    assert_int_equal(i, m->n);
    assert_ptr_equal(ext_of(cuh_freetree_last(t)), m->n ? m->items[m->n - 1] : NULL);
    assert_ptr_equal(ext_of(cuh_freetree_first(t)), m->n ? m->items[0] : NULL);

    /* lower_bound at, between and beyond the keys. */
    check_lower_bound(t, m, 0);
    check_lower_bound(t, m, 1);
    check_lower_bound(t, m, SIZE_MAX);
    if (m->n) {
        size_t max = m->items[m->n - 1]->size;
        check_lower_bound(t, m, max);
        check_lower_bound(t, m, max + 1);
        for (int k = 0; k < 6; k++) {
            size_t s = m->items[test_rand(rng) % m->n]->size;
            check_lower_bound(t, m, s);
            check_lower_bound(t, m, s - 1);
            check_lower_bound(t, m, s + 1);
        }
    }
    for (int k = 0; k < 4; k++)
        check_lower_bound(t, m, (size_t)(test_rand(rng) % (64 * MiB)));
}

/* Random sizes: a few that repeat often (ties broken by address) and many that don't. */
static size_t random_size(uint64_t *rng)
{
    uint64_t r = test_rand(rng);
    switch (r % 4) {
    case 0: return (size_t)(1 + (r >> 8) % 8) * 2 * MiB;        /* heavy ties */
    case 1: return (size_t)(1 + (r >> 8) % 4096) * 512;         /* 512 B .. 2 MiB */
    case 2: return (size_t)(1 + (r >> 8) % 100000) * 512;       /* up to ~50 MiB */
    default: return (size_t)(1 + (r >> 8) % 3);                 /* tiny, odd sizes */
    }
}

static void init_pool(uint64_t *rng)
{
    /* Unique addresses in a shuffled order, so address order != pool order. */
    uintptr_t addrs[POOL];
    for (size_t i = 0; i < POOL; i++)
        addrs[i] = (uintptr_t)0x7f0000000000ull + (uintptr_t)i * 2 * MiB;
    for (size_t i = POOL - 1; i > 0; i--) {
        size_t j = (size_t)(test_rand(rng) % (i + 1));
        uintptr_t x = addrs[i];
        addrs[i] = addrs[j];
        addrs[j] = x;
    }
    memset(pool, 0, sizeof pool);
    for (size_t i = 0; i < POOL; i++) {
        pool[i].tag = 0xabcdef;
        pool[i].addr = addrs[i];
    }
}

static void run_random(uint64_t seed, int ops)
{
    uint64_t rng = seed;
    init_pool(&rng);
    cuh_freetree_t t = {0};
    model_t *m = calloc(1, sizeof *m);
    assert_non_null(m);
    check_against_model(&t, m, &rng);
    for (int op = 0; op < ops; op++) {
        /* Bias toward growth in the first half, toward shrinking in the second,
         * so both large trees and emptying out to zero happen. */
        uint64_t r = test_rand(&rng);
        int want_insert = (op < ops / 2) ? (r % 100 < 65) : (r % 100 < 35);
        extent_t *e = &pool[test_rand(&rng) % POOL];
        if (want_insert && !e->in_tree) {
            e->size = random_size(&rng);
            cuh_freetree_insert(&t, &e->node, e->size, e->addr);
            e->in_tree = 1;
            model_insert(m, e);
        } else if (!want_insert && m->n) {
            /* Remove a random member (of the model, so every position is hit). */
            extent_t *victim = m->items[test_rand(&rng) % m->n];
            cuh_freetree_remove(&t, &victim->node);
            victim->in_tree = 0;
            model_remove(m, victim);
        }
        check_against_model(&t, m, &rng);
    }
    /* Drain completely. */
    while (m->n) {
        extent_t *victim = m->items[test_rand(&rng) % m->n];
        cuh_freetree_remove(&t, &victim->node);
        victim->in_tree = 0;
        model_remove(m, victim);
        check_against_model(&t, m, &rng);
    }
    assert_null(t.root);
    assert_int_equal(t.count, 0);
    assert_int_equal(t.bytes, 0);
    free(m);
}

static void test_random_ops_match_sorted_array_model_seed1(void **state)
{
    (void)state;
    run_random(0x1234567887654321ull, 4000);
}

static void test_random_ops_match_sorted_array_model_seed2(void **state)
{
    (void)state;
    run_random(0xdeadbeefcafef00dull, 4000);
}

static void test_random_ops_match_sorted_array_model_seed3(void **state)
{
    (void)state;
    run_random(42, 3000);
}

static void test_lower_bound_returns_smallest_fitting_lowest_address(void **state)
{
    (void)state;
    cuh_freetree_t t = {0};
    extent_t e[6];
    memset(e, 0, sizeof e);
    /* sizes 4K@0x5000, 4K@0x1000, 8K@0x9000, 8K@0x2000, 16K@0x3000, 1M@0x4000 */
    const size_t sizes[6] = {4096, 4096, 8192, 8192, 16384, MiB};
    const uintptr_t addrs[6] = {0x5000, 0x1000, 0x9000, 0x2000, 0x3000, 0x4000};
    for (int i = 0; i < 6; i++)
        cuh_freetree_insert(&t, &e[i].node, sizes[i], addrs[i]);
    assert_int_equal(cuh_freetree_check(&t), 0);
    assert_ptr_equal(cuh_freetree_lower_bound(&t, 0), &e[1].node);
    assert_ptr_equal(cuh_freetree_lower_bound(&t, 1), &e[1].node);
    assert_ptr_equal(cuh_freetree_lower_bound(&t, 4096), &e[1].node);
    assert_ptr_equal(cuh_freetree_lower_bound(&t, 4097), &e[3].node);   /* 8K, lower address */
    assert_ptr_equal(cuh_freetree_lower_bound(&t, 8192), &e[3].node);
    assert_ptr_equal(cuh_freetree_lower_bound(&t, 8193), &e[4].node);
    assert_ptr_equal(cuh_freetree_lower_bound(&t, 16385), &e[5].node);
    assert_ptr_equal(cuh_freetree_lower_bound(&t, MiB), &e[5].node);
    assert_null(cuh_freetree_lower_bound(&t, MiB + 1));
    assert_null(cuh_freetree_lower_bound(&t, SIZE_MAX));
    assert_ptr_equal(cuh_freetree_first(&t), &e[1].node);
    assert_ptr_equal(cuh_freetree_last(&t), &e[5].node);
    /* Walk: 4K@1000, 4K@5000, 8K@2000, 8K@9000, 16K, 1M. */
    const int order[6] = {1, 0, 3, 2, 4, 5};
    cuh_ftnode_t *n = cuh_freetree_first(&t);
    for (int i = 0; i < 6; i++, n = cuh_freetree_next(n))
        assert_ptr_equal(n, &e[order[i]].node);
    assert_null(n);
    assert_int_equal(t.count, 6);
    assert_int_equal(t.bytes, 4096 + 4096 + 8192 + 8192 + 16384 + MiB);
    /* Removing the lowest-address 8K makes the other one the answer. */
    cuh_freetree_remove(&t, &e[3].node);
    assert_int_equal(cuh_freetree_check(&t), 0);
    assert_ptr_equal(cuh_freetree_lower_bound(&t, 4097), &e[2].node);
    assert_int_equal(t.bytes, 4096 + 4096 + 8192 + 16384 + MiB);
}

static void test_empty_tree_has_no_nodes(void **state)
{
    (void)state;
    cuh_freetree_t t = {0};
    assert_int_equal(cuh_freetree_check(&t), 0);
    assert_null(cuh_freetree_first(&t));
    assert_null(cuh_freetree_last(&t));
    assert_null(cuh_freetree_lower_bound(&t, 0));
    assert_null(cuh_freetree_lower_bound(&t, 1));
    extent_t one = {0};
    cuh_freetree_insert(&t, &one.node, 512, 0x1000);
    assert_ptr_equal(cuh_freetree_first(&t), &one.node);
    assert_ptr_equal(cuh_freetree_last(&t), &one.node);
    assert_null(cuh_freetree_next(&one.node));
    assert_null(cuh_freetree_lower_bound(&t, 513));
    cuh_freetree_remove(&t, &one.node);
    assert_null(t.root);
    assert_int_equal(t.count, 0);
    assert_int_equal(t.bytes, 0);
}

static void test_equal_sizes_are_ordered_by_address(void **state)
{
    (void)state;
    uint64_t rng = 7;
    init_pool(&rng);
    cuh_freetree_t t = {0};
    for (size_t i = 0; i < 200; i++)
        cuh_freetree_insert(&t, &pool[i].node, 2 * MiB, pool[i].addr);
    assert_int_equal(cuh_freetree_check(&t), 0);
    /* Expected: the 200 addresses in ascending order. */
    uintptr_t lowest = UINTPTR_MAX;
    for (size_t i = 0; i < 200; i++)
        if (pool[i].addr < lowest)
            lowest = pool[i].addr;
    assert_int_equal(cuh_freetree_lower_bound(&t, 1)->addr, lowest);
    assert_int_equal(cuh_freetree_lower_bound(&t, 2 * MiB)->addr, lowest);
    assert_null(cuh_freetree_lower_bound(&t, 2 * MiB + 1));
    size_t visited = 0;
    uintptr_t prev = 0;
    for (cuh_ftnode_t *n = cuh_freetree_first(&t); n; n = cuh_freetree_next(n)) {
        assert_true(n->addr > prev);
        prev = n->addr;
        visited++;
    }
    assert_int_equal(visited, 200);
    uintptr_t highest = 0;
    for (size_t i = 0; i < 200; i++)
        if (pool[i].addr > highest)
            highest = pool[i].addr;
    assert_int_equal(cuh_freetree_last(&t)->addr, highest);
}

static void test_sorted_insertion_stays_balanced(void **state)
{
    (void)state;
    /* Ascending then descending keys: the worst case for an unbalanced tree. */
    static extent_t e[2 * 1024];
    memset(e, 0, sizeof e);
    cuh_freetree_t t = {0};
    for (size_t i = 0; i < 1024; i++)
        cuh_freetree_insert(&t, &e[i].node, (i + 1) * 512, 0x1000);
    for (size_t i = 0; i < 1024; i++)
        cuh_freetree_insert(&t, &e[1024 + i].node, (2048 - i) * 512 + 1024 * 1024 * 1024, 0x2000);
    assert_int_equal(cuh_freetree_check(&t), 0);
    assert_int_equal(t.count, 2048);
    /* AVL bound: height < 1.4405 log2(n + 2) - 0.3277. */
    double bound = 1.4405 * log2(2048.0 + 2.0) - 0.3277;
    if ((double)t.root->height >= bound)
        fail_msg("height %d for 2048 nodes exceeds the AVL bound %.2f", t.root->height, bound);
    assert_ptr_equal(cuh_freetree_first(&t), &e[0].node);
    assert_ptr_equal(cuh_freetree_last(&t), &e[1024].node);
    assert_ptr_equal(cuh_freetree_lower_bound(&t, 1000 * 512 + 1), &e[1000].node);
    /* Remove every other node in ascending order; stays sound and balanced. */
    for (size_t i = 0; i < 2048; i += 2) {
        cuh_freetree_remove(&t, &e[i].node);
        if (cuh_freetree_check(&t) != 0)
            fail_msg("check failed after removing node %zu", i);
    }
    assert_int_equal(t.count, 1024);
    bound = 1.4405 * log2(1024.0 + 2.0) - 0.3277;
    assert_true((double)t.root->height < bound);
    assert_ptr_equal(cuh_freetree_first(&t), &e[1].node);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty_tree_has_no_nodes),
        cmocka_unit_test(test_lower_bound_returns_smallest_fitting_lowest_address),
        cmocka_unit_test(test_equal_sizes_are_ordered_by_address),
        cmocka_unit_test(test_sorted_insertion_stays_balanced),
        cmocka_unit_test(test_random_ops_match_sorted_array_model_seed1),
        cmocka_unit_test(test_random_ops_match_sorted_array_model_seed2),
        cmocka_unit_test(test_random_ops_match_sorted_array_model_seed3),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
