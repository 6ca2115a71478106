/* test_ptrmap.c - tests of the block hash map and the slab page map
 * (src/ptrmap.c).
 *
 * Hash map: insert/get/remove agree with a reference model (a flag and a
 * value per key of a fixed key pool) over ~100k random operations on keys
 * that are multiples of 512: sequential addresses, random addresses, and keys
 * that differ only in their high bits (which share a home slot in every table
 * of up to 2048 slots, so they form long probe runs). Growth from capacity 16
 * happens at half load, an absent key removes as NULL, the count is exact,
 * and removing keys from the middle of probe runs (including runs that wrap
 * around the end of the table) leaves every other key reachable: the
 * backward-shift deletion.
 *
 * Page map: ranges of 64 KiB pages map to a value for every byte inside them
 * (first and last byte included) and not one page beyond; NULL unmaps;
 * ranges far apart in the 64-bit space and across radix-level boundaries
 * coexist; a random sequence of set/unset agrees with a per-page model; and
 * destroy frees every node (LeakSanitizer checks that in the sanitized run).
 */
#include "test_util.h"

#include "ptrmap.h"

#include <stdlib.h>
#include <string.h>

/* ---- hash map ------------------------------------------------------------ */

#define SEQ_KEYS 3000
#define RAND_KEYS 3000
#define HIGH_KEYS 400
#define NKEYS (SEQ_KEYS + RAND_KEYS + HIGH_KEYS)

typedef struct ref_s {
    uintptr_t keys[NKEYS];
    void *values[NKEYS];   /* NULL = absent */
    size_t count;
} ref_t;

/* Keys differing only in bits 52..63: (key >> 9) differs only in bits >= 43,
 * so any multiplicative hash that keeps bits 32..42 maps them alike. */
static uintptr_t high_key(size_t i) { return (uintptr_t)0x200 + ((uintptr_t)(i + 1) << 52); }

static void make_keys(ref_t *r, uint64_t *rng)
{
    size_t k = 0;
    for (size_t i = 0; i < SEQ_KEYS; i++)
        r->keys[k++] = (uintptr_t)0x7f0000000000ull + (uintptr_t)i * 512;
    while (k < SEQ_KEYS + RAND_KEYS) {
        uintptr_t key = (uintptr_t)(test_rand(rng) & 0x0000ffffffffffffull) & ~(uintptr_t)511;
        int dup = key == 0;
        for (size_t j = 0; j < k && !dup; j++)
            dup = r->keys[j] == key;
        if (!dup)
            r->keys[k++] = key;
    }
    for (size_t i = 0; i < HIGH_KEYS; i++)
        r->keys[k++] = high_key(i);
    memset(r->values, 0, sizeof r->values);
    r->count = 0;
}

static void *value_for(uint64_t op) { return (void *)(uintptr_t)(0x1000 + op * 16); }

/* Every key of the model is where it should be, and nothing else is in the table. */
static void check_all(const cuh_ptrmap_t *m, const ref_t *r)
{
    assert_int_equal(m->count, r->count);
    for (size_t i = 0; i < NKEYS; i++) {
        void *got = cuh_ptrmap_get(m, r->keys[i]);
        if (got != r->values[i])
            fail_msg("get(0x%lx): %p, expected %p", (unsigned long)r->keys[i], got, r->values[i]);
    }
    size_t occupied = 0;
    for (size_t i = 0; i <= m->mask; i++)
        occupied += m->slots[i].key != 0;
    assert_int_equal(occupied, r->count);
}

static void test_insert_get_remove_basic(void **state)
{
    (void)state;
    cuh_ptrmap_t m;
    assert_int_equal(cuh_ptrmap_init(&m, 0), 0);
    assert_int_equal(m.mask + 1, 16);
    assert_int_equal(m.count, 0);
    assert_null(cuh_ptrmap_get(&m, 0x1000));
    assert_null(cuh_ptrmap_remove(&m, 0x1000));
    int a, b, c;
    assert_int_equal(cuh_ptrmap_insert(&m, 0x1000, &a), 0);
    assert_int_equal(cuh_ptrmap_insert(&m, 0x1200, &b), 0);
    assert_int_equal(cuh_ptrmap_insert(&m, 0x7f0000000000ull, &c), 0);
    assert_int_equal(m.count, 3);
    assert_ptr_equal(cuh_ptrmap_get(&m, 0x1000), &a);
    assert_ptr_equal(cuh_ptrmap_get(&m, 0x1200), &b);
    assert_ptr_equal(cuh_ptrmap_get(&m, 0x7f0000000000ull), &c);
    assert_null(cuh_ptrmap_get(&m, 0x1400));
    assert_ptr_equal(cuh_ptrmap_remove(&m, 0x1200), &b);
    assert_int_equal(m.count, 2);
    assert_null(cuh_ptrmap_get(&m, 0x1200));
    assert_null(cuh_ptrmap_remove(&m, 0x1200));   /* twice: absent now */
    assert_int_equal(m.count, 2);
    assert_null(cuh_ptrmap_remove(&m, 0x9999800));
    assert_int_equal(m.count, 2);
    assert_ptr_equal(cuh_ptrmap_get(&m, 0x1000), &a);
    /* Re-insert a removed key with another value. */
    assert_int_equal(cuh_ptrmap_insert(&m, 0x1200, &c), 0);
    assert_ptr_equal(cuh_ptrmap_get(&m, 0x1200), &c);
    assert_int_equal(m.count, 3);
    cuh_ptrmap_destroy(&m);
    assert_null(m.slots);
    assert_int_equal(m.count, 0);
}

static void test_init_rounds_capacity_to_power_of_two(void **state)
{
    (void)state;
    const size_t asked[] = {0, 1, 16, 17, 100, 1024, 1025};
    const size_t want[] = {16, 16, 16, 32, 128, 1024, 2048};
    for (size_t i = 0; i < sizeof asked / sizeof asked[0]; i++) {
        cuh_ptrmap_t m;
        assert_int_equal(cuh_ptrmap_init(&m, asked[i]), 0);
        assert_int_equal(m.mask + 1, want[i]);
        for (size_t j = 0; j <= m.mask; j++)
            assert_int_equal(m.slots[j].key, 0);
        cuh_ptrmap_destroy(&m);
    }
}

static void test_grows_from_16_at_half_load_keeping_every_key(void **state)
{
    (void)state;
    cuh_ptrmap_t m;
    assert_int_equal(cuh_ptrmap_init(&m, 16), 0);
    const size_t n = 5000;
    for (size_t i = 0; i < n; i++) {
        uintptr_t key = (uintptr_t)0x7f0000000000ull + (uintptr_t)i * 512;
        assert_int_equal(cuh_ptrmap_insert(&m, key, value_for(i)), 0);
        /* Capacity: the smallest power of two >= 16 that keeps load <= 1/2. */
        size_t cap = 16;
        while (cap < 2 * (i + 1))
            cap *= 2;
        if (m.mask + 1 != cap)
            fail_msg("after %zu inserts capacity is %zu, expected %zu", i + 1, m.mask + 1, cap);
        assert_int_equal(m.count, i + 1);
        /* Spot-check an early key after every growth step. */
        if (((i + 1) & i) == 0)
            for (size_t j = 0; j <= i; j++)
                assert_ptr_equal(cuh_ptrmap_get(&m, (uintptr_t)0x7f0000000000ull + (uintptr_t)j * 512),
                                 value_for(j));
    }
    for (size_t i = 0; i < n; i++)
        assert_ptr_equal(cuh_ptrmap_get(&m, (uintptr_t)0x7f0000000000ull + (uintptr_t)i * 512), value_for(i));
    assert_null(cuh_ptrmap_get(&m, (uintptr_t)0x7f0000000000ull + (uintptr_t)n * 512));
    cuh_ptrmap_destroy(&m);
}

static void run_random_mix(uint64_t seed, int ops)
{
    uint64_t rng = seed;
    ref_t *r = calloc(1, sizeof *r);
    assert_non_null(r);
    make_keys(r, &rng);
    cuh_ptrmap_t m;
    assert_int_equal(cuh_ptrmap_init(&m, 16), 0);
    for (int op = 1; op <= ops; op++) {
        uint64_t x = test_rand(&rng);
        /* Pick a family: the colliding one often enough to build long runs. */
        size_t i;
        switch (x % 3) {
        case 0: i = (size_t)((x >> 8) % SEQ_KEYS); break;
        case 1: i = SEQ_KEYS + (size_t)((x >> 8) % RAND_KEYS); break;
        default: i = SEQ_KEYS + RAND_KEYS + (size_t)((x >> 8) % HIGH_KEYS); break;
        }
        /* Phases: mostly inserting, then mixed, then mostly removing. */
        unsigned pct = (unsigned)((x >> 40) % 100);
        unsigned insert_pct = op < ops / 3 ? 70 : op < 2 * ops / 3 ? 50 : 25;
        if (pct < insert_pct && (x >> 20) % 4 == 0) {
            /* put: inserts, or replaces what is there and returns it */
            void *v = value_for((uint64_t)op), *old = (void *)1;
            assert_int_equal(cuh_ptrmap_put(&m, r->keys[i], v, &old), 0);
            assert_ptr_equal(old, r->values[i]);
            if (!r->values[i])
                r->count++;
            r->values[i] = v;
        } else if (pct < insert_pct) {
            if (!r->values[i]) {
                void *v = value_for((uint64_t)op);
                assert_int_equal(cuh_ptrmap_insert(&m, r->keys[i], v), 0);
                r->values[i] = v;
                r->count++;
            } else {
                assert_ptr_equal(cuh_ptrmap_get(&m, r->keys[i]), r->values[i]);
            }
        } else if (pct < 95) {
            void *got = cuh_ptrmap_remove(&m, r->keys[i]);
            if (got != r->values[i])
                fail_msg("op %d: remove(0x%lx) returned %p, expected %p", op, (unsigned long)r->keys[i], got,
                         r->values[i]);
            if (r->values[i]) {
                r->values[i] = NULL;
                r->count--;
            }
        } else {
            assert_ptr_equal(cuh_ptrmap_get(&m, r->keys[i]), r->values[i]);
        }
        assert_int_equal(m.count, r->count);
        if (op % 5000 == 0)
            check_all(&m, r);
    }
    check_all(&m, r);
    /* Remove everything that is left; the table ends empty. */
    for (size_t i = 0; i < NKEYS; i++) {
        assert_ptr_equal(cuh_ptrmap_remove(&m, r->keys[i]), r->values[i]);
        if (r->values[i]) {
            r->values[i] = NULL;
            r->count--;
        }
    }
    check_all(&m, r);
    assert_int_equal(m.count, 0);
    cuh_ptrmap_destroy(&m);
    free(r);
}

static void test_random_mix_matches_reference_seed1(void **state)
{
    (void)state;
    run_random_mix(0x9e3779b97f4a7c15ull, 100000);
}

static void test_random_mix_matches_reference_seed2(void **state)
{
    (void)state;
    run_random_mix(12345, 50000);
}

/* A run of keys sharing one home slot: removing any one of them, in any
 * position of the run, must leave the others reachable. */
static void test_remove_from_middle_of_colliding_run_keeps_others_reachable(void **state)
{
    (void)state;
    enum { RUN = 7 };
    for (size_t victim = 0; victim < RUN; victim++) {
        for (uintptr_t base = 0x200; base < 0x200 + 64 * 512; base += 512) {
            cuh_ptrmap_t m;
            assert_int_equal(cuh_ptrmap_init(&m, 16), 0);
            uintptr_t keys[RUN];
            for (size_t i = 0; i < RUN; i++) {
                keys[i] = base + ((uintptr_t)(i + 1) << 52);
                assert_int_equal(cuh_ptrmap_insert(&m, keys[i], value_for(i)), 0);
            }
            /* A neighbour key (another home) that probes may pass through. */
            uintptr_t other = base + 512 * 1000;
            assert_int_equal(cuh_ptrmap_insert(&m, other, value_for(99)), 0);
            assert_int_equal(m.mask + 1, 16);
            assert_ptr_equal(cuh_ptrmap_remove(&m, keys[victim]), value_for(victim));
            for (size_t i = 0; i < RUN; i++) {
                if (i == victim)
                    assert_null(cuh_ptrmap_get(&m, keys[i]));
                else if (cuh_ptrmap_get(&m, keys[i]) != value_for(i))
                    fail_msg("base 0x%lx: after removing run member %zu, member %zu is lost",
                             (unsigned long)base, victim, i);
            }
            assert_ptr_equal(cuh_ptrmap_get(&m, other), value_for(99));
            assert_int_equal(m.count, RUN);
            /* Then remove the rest one by one from the front. */
            for (size_t i = 0; i < RUN; i++) {
                if (i == victim)
                    continue;
                assert_ptr_equal(cuh_ptrmap_remove(&m, keys[i]), value_for(i));
                for (size_t j = i + 1; j < RUN; j++)
                    if (j != victim)
                        assert_ptr_equal(cuh_ptrmap_get(&m, keys[j]), value_for(j));
                assert_ptr_equal(cuh_ptrmap_get(&m, other), value_for(99));
            }
            assert_int_equal(m.count, 1);
            cuh_ptrmap_destroy(&m);
        }
    }
}

/* Many small tables filled to the growth threshold (8 of 16 slots) with
 * random keys, emptied in random order: every removal in every position of
 * every probe run, including runs that wrap from the last slot to the first. */
static void test_backward_shift_deletion_in_full_small_tables(void **state)
{
    (void)state;
    uint64_t rng = 0x5eed;
    int wrapped = 0, displaced = 0;
    for (int trial = 0; trial < 20000; trial++) {
        cuh_ptrmap_t m;
        assert_int_equal(cuh_ptrmap_init(&m, 16), 0);
        uintptr_t keys[8];
        int live[8];
        for (size_t i = 0; i < 8; i++) {
            uintptr_t k;
            int dup;
            do {
                /* Few distinct low bits, so homes collide often. */
                k = (uintptr_t)((test_rand(&rng) % 64) + 1) * 512;
                if (test_rand(&rng) & 1)
                    k += (uintptr_t)(test_rand(&rng) % 16) << 52;
                dup = 0;
                for (size_t j = 0; j < i; j++)
                    dup |= keys[j] == k;
            } while (dup);
            keys[i] = k;
            live[i] = 1;
            assert_int_equal(cuh_ptrmap_insert(&m, k, value_for(i)), 0);
        }
        assert_int_equal(m.mask + 1, 16);   /* 8 of 16: not grown yet */
        if (m.slots[15].key && m.slots[0].key)
            wrapped++;
        for (size_t i = 0; i < 8; i++)
            if (m.slots[i].key && m.slots[(i + 15) & 15].key)
                displaced++;
        for (int left = 8; left > 0; left--) {
            size_t v;
            do
                v = (size_t)(test_rand(&rng) % 8);
            while (!live[v]);
            assert_ptr_equal(cuh_ptrmap_remove(&m, keys[v]), value_for(v));
            live[v] = 0;
            assert_int_equal(m.count, (size_t)left - 1);
            for (size_t i = 0; i < 8; i++) {
                void *got = cuh_ptrmap_get(&m, keys[i]);
                if (got != (live[i] ? value_for(i) : NULL))
                    fail_msg("trial %d: after removing 0x%lx, get(0x%lx) = %p", trial, (unsigned long)keys[v],
                             (unsigned long)keys[i], got);
            }
            size_t occupied = 0;
            for (size_t i = 0; i < 16; i++)
                occupied += m.slots[i].key != 0;
            assert_int_equal(occupied, (size_t)left - 1);
        }
        cuh_ptrmap_destroy(&m);
    }
    /* The trials did exercise wrapping runs and adjacent (colliding) slots. */
    assert_true(wrapped > 100);
    assert_true(displaced > 1000);
}

/* ---- page map ------------------------------------------------------------- */

#define PAGE ((uintptr_t)1 << CUH_PAGEMAP_SHIFT)

static void expect_range(const cuh_pagemap_t *pm, uintptr_t addr, size_t len, void *value)
{
    for (uintptr_t a = addr; a < addr + len; a += PAGE) {
        if (cuh_pagemap_get(pm, a) != value || cuh_pagemap_get(pm, a + PAGE / 2) != value ||
            cuh_pagemap_get(pm, a + PAGE - 1) != value)
            fail_msg("page 0x%lx of [0x%lx, +%zu): expected %p", (unsigned long)a, (unsigned long)addr, len, value);
    }
    assert_ptr_equal(cuh_pagemap_get(pm, addr + len - 1), value);   /* last byte of the range */
}

static void test_pagemap_range_maps_every_page_and_nothing_beyond(void **state)
{
    (void)state;
    cuh_pagemap_t pm;
    assert_int_equal(cuh_pagemap_init(&pm), 0);
    int v1, v2;
    const uintptr_t a = (uintptr_t)0x7f0000200000ull;
    const size_t len = 40 * PAGE;
    assert_null(cuh_pagemap_get(&pm, a));
    assert_int_equal(cuh_pagemap_set(&pm, a, len, &v1), 0);
    expect_range(&pm, a, len, &v1);
    assert_null(cuh_pagemap_get(&pm, a - 1));          /* last byte of the page before */
    assert_null(cuh_pagemap_get(&pm, a - PAGE));
    assert_null(cuh_pagemap_get(&pm, a + len));        /* first byte after */
    assert_null(cuh_pagemap_get(&pm, a + len + PAGE - 1));
    /* Overwrite the middle with another value; the ends keep theirs. */
    assert_int_equal(cuh_pagemap_set(&pm, a + 10 * PAGE, 5 * PAGE, &v2), 0);
    expect_range(&pm, a, 10 * PAGE, &v1);
    expect_range(&pm, a + 10 * PAGE, 5 * PAGE, &v2);
    expect_range(&pm, a + 15 * PAGE, 25 * PAGE, &v1);
    /* Unset part, then all. */
    assert_int_equal(cuh_pagemap_set(&pm, a, 10 * PAGE, NULL), 0);
    expect_range(&pm, a, 10 * PAGE, NULL);
    expect_range(&pm, a + 10 * PAGE, 5 * PAGE, &v2);
    assert_int_equal(cuh_pagemap_set(&pm, a, len, NULL), 0);
    expect_range(&pm, a - 4 * PAGE, len + 8 * PAGE, NULL);
    /* Unmapping what was never mapped is harmless. */
    assert_int_equal(cuh_pagemap_set(&pm, (uintptr_t)0x123450000ull, 3 * PAGE, NULL), 0);
    assert_null(cuh_pagemap_get(&pm, (uintptr_t)0x123450000ull));
    /* Zero length maps nothing. */
    assert_int_equal(cuh_pagemap_set(&pm, a, 0, &v1), 0);
    assert_null(cuh_pagemap_get(&pm, a));
    cuh_pagemap_destroy(&pm);
    assert_null(pm.root);
}

static void test_pagemap_ranges_far_apart_and_across_levels(void **state)
{
    (void)state;
    cuh_pagemap_t pm;
    assert_int_equal(cuh_pagemap_init(&pm), 0);
    int v[5];
    /* Low, the simulated device's base, across a 256 MiB leaf boundary,
     * across a 1 TiB boundary, and high in the 64-bit space. */
    const uintptr_t base[5] = {0x10000, (uintptr_t)0x7f0000000000ull, (uintptr_t)(256 * MiB) - 3 * PAGE,
                               ((uintptr_t)1 << 40) - 2 * PAGE, (uintptr_t)0xfff0000000000000ull};
    const size_t len[5] = {PAGE, 32 * PAGE, 6 * PAGE, 4 * PAGE, 3 * PAGE};
    for (int i = 0; i < 5; i++)
        assert_int_equal(cuh_pagemap_set(&pm, base[i], len[i], &v[i]), 0);
    for (int i = 0; i < 5; i++) {
        expect_range(&pm, base[i], len[i], &v[i]);
        assert_null(cuh_pagemap_get(&pm, base[i] - 1));
        assert_null(cuh_pagemap_get(&pm, base[i] + len[i]));
    }
    assert_null(cuh_pagemap_get(&pm, 0));
    assert_null(cuh_pagemap_get(&pm, 0xffff));
    /* Same low bits, different high bits: distinct entries. */
    assert_null(cuh_pagemap_get(&pm, (uintptr_t)0x7f0000000000ull + 0x10000000000ull));
    assert_null(cuh_pagemap_get(&pm, 0x10000 + ((uintptr_t)1 << 52)));
    /* Unmapping one leaves the others. */
    assert_int_equal(cuh_pagemap_set(&pm, base[1], len[1], NULL), 0);
    expect_range(&pm, base[1], len[1], NULL);
    for (int i = 0; i < 5; i++)
        if (i != 1)
            expect_range(&pm, base[i], len[i], &v[i]);
    cuh_pagemap_destroy(&pm);
}

#define WIN_PAGES 6000

static void test_pagemap_random_sets_match_per_page_model(void **state)
{
    (void)state;
    /* Three windows of pages; the 2nd straddles a leaf (4096-page) boundary,
     * the 3rd a 2^24-page (1 TiB) boundary. */
    const uintptr_t win_page[3] = {1, ((uintptr_t)0x7f0000000000ull >> 16) - 2000, ((uintptr_t)1 << 24) - 3000};
    static void *model[3][WIN_PAGES];
    memset(model, 0, sizeof model);
    static int vals[8];
    cuh_pagemap_t pm;
    assert_int_equal(cuh_pagemap_init(&pm), 0);
    uint64_t rng = 99;
    for (int op = 0; op < 3000; op++) {
        int w = (int)(test_rand(&rng) % 3);
        size_t start = (size_t)(test_rand(&rng) % WIN_PAGES);
        size_t n = 1 + (size_t)(test_rand(&rng) % 200);
        if (start + n > WIN_PAGES)
            n = WIN_PAGES - start;
        void *value = (test_rand(&rng) % 4 == 0) ? NULL : &vals[test_rand(&rng) % 8];
        uintptr_t addr = (win_page[w] + start) << 16;
        assert_int_equal(cuh_pagemap_set(&pm, addr, n << 16, value), 0);
        for (size_t p = start; p < start + n; p++)
            model[w][p] = value;
        /* The edges and a few random pages of every window. */
        for (int k = 0; k < 3; k++) {
            size_t ps[4] = {start, start + n - 1, start ? start - 1 : 0,
                            (size_t)(test_rand(&rng) % WIN_PAGES)};
            for (int q = 0; q < 4; q++) {
                uintptr_t pa = (win_page[k] + ps[q]) << 16;
                assert_ptr_equal(cuh_pagemap_get(&pm, pa), model[k][ps[q]]);
                assert_ptr_equal(cuh_pagemap_get(&pm, pa + PAGE - 1), model[k][ps[q]]);
            }
        }
    }
    for (int w = 0; w < 3; w++)
        for (size_t p = 0; p < WIN_PAGES; p++) {
            uintptr_t pa = (win_page[w] + p) << 16;
            if (cuh_pagemap_get(&pm, pa + 12345) != model[w][p])
                fail_msg("window %d page %zu: %p, expected %p", w, p, cuh_pagemap_get(&pm, pa + 12345),
                         model[w][p]);
        }
    /* Pages just outside every window were never set. */
    for (int w = 0; w < 3; w++) {
        assert_null(cuh_pagemap_get(&pm, (win_page[w] - 1) << 16));
        assert_null(cuh_pagemap_get(&pm, (win_page[w] + WIN_PAGES) << 16));
    }
    cuh_pagemap_destroy(&pm);
}

static void test_pagemap_maps_the_top_page_of_the_address_space(void **state)
{
    (void)state;
    cuh_pagemap_t m;
    int v;
    assert_int_equal(cuh_pagemap_init(&m), 0);
    uintptr_t top = ~(uintptr_t)0 - (64 * KiB - 1);
    assert_int_equal(cuh_pagemap_set(&m, top, 64 * KiB, &v), 0);
    assert_ptr_equal(cuh_pagemap_get(&m, top), &v);
    assert_ptr_equal(cuh_pagemap_get(&m, ~(uintptr_t)0), &v);
    assert_null(cuh_pagemap_get(&m, top - 1));
    cuh_pagemap_destroy(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_insert_get_remove_basic),
        cmocka_unit_test(test_init_rounds_capacity_to_power_of_two),
        cmocka_unit_test(test_grows_from_16_at_half_load_keeping_every_key),
        cmocka_unit_test(test_random_mix_matches_reference_seed1),
        cmocka_unit_test(test_random_mix_matches_reference_seed2),
        cmocka_unit_test(test_remove_from_middle_of_colliding_run_keeps_others_reachable),
        cmocka_unit_test(test_backward_shift_deletion_in_full_small_tables),
        cmocka_unit_test(test_pagemap_range_maps_every_page_and_nothing_beyond),
        cmocka_unit_test(test_pagemap_ranges_far_apart_and_across_levels),
        cmocka_unit_test(test_pagemap_random_sets_match_per_page_model),
        cmocka_unit_test(test_pagemap_maps_the_top_page_of_the_address_space),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
