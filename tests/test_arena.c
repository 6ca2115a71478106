/* test_arena.c - the arena's books: best fit, splitting, aligned carving,
 * coalescing, and the tag rules that keep stream-ordered reuse safe (a
 * private extent absorbs global neighbours, two streams' extents never merge,
 * a completed fence turns private extents global and merges them).
 */
#include "test_util.h"

#include "arena.h"

#define BASE ((uintptr_t)0x7f0000000000ull)

static void arena_ok(cuh_arena_t *a)
{
    char msg[512];
    if (cuh_arena_check(a, msg, sizeof msg))
        fail_msg("arena unsound: %s", msg);
}

static cuh_extent_t *take(cuh_arena_t *a, size_t size, size_t align, uint32_t tag)
{
    cuh_extent_t *e = cuh_arena_find(a, size, align, tag);
    assert_non_null(e);
    e = cuh_arena_take(a, e, size, align, CUH_EXTENT_BLOCK, tag);
    assert_non_null(e);
    assert_int_equal(e->addr % align, 0);
    return e;
}

static void test_best_fit_picks_the_smallest_extent_that_fits(void **state)
{
    (void)state;
    cuh_arena_t a;
    cuh_arena_init(&a);
    assert_non_null(cuh_arena_add_segment(&a, BASE, 8 * MiB, CUH_REGION_GENERAL));
    assert_non_null(cuh_arena_add_segment(&a, BASE + 64 * MiB, 4 * MiB, CUH_REGION_GENERAL));
    assert_non_null(cuh_arena_add_segment(&a, BASE + 128 * MiB, 6 * MiB, CUH_REGION_GENERAL));
    cuh_extent_t *e = take(&a, 5 * MiB, 512, CUH_TAG_GLOBAL);
    assert_int_equal(e->addr, BASE + 128 * MiB);   /* 6 MiB beats 8 MiB */
    e = take(&a, 4 * MiB, 512, CUH_TAG_GLOBAL);
    assert_int_equal(e->addr, BASE + 64 * MiB);    /* exact fit */
    assert_null(cuh_arena_find(&a, 9 * MiB, 512, CUH_TAG_GLOBAL));
    arena_ok(&a);
    cuh_arena_destroy(&a);
}

static void test_workspace_region_is_searched_first(void **state)
{
    (void)state;
    cuh_arena_t a;
    cuh_arena_init(&a);
    cuh_arena_add_segment(&a, BASE, 4 * MiB, CUH_REGION_GENERAL);
    cuh_arena_add_segment(&a, BASE + GiB, 64 * MiB, CUH_REGION_WORKSPACE);
    cuh_extent_t *e = take(&a, 2 * MiB, 512, CUH_TAG_GLOBAL);
    assert_int_equal(e->addr, BASE + GiB);
    arena_ok(&a);
    cuh_arena_destroy(&a);
}

static void test_freeing_coalesces_global_neighbours(void **state)
{
    (void)state;
    cuh_arena_t a;
    cuh_arena_init(&a);
    cuh_segment_t *seg = cuh_arena_add_segment(&a, BASE, 8 * MiB, CUH_REGION_GENERAL);
    cuh_extent_t *x = take(&a, 2 * MiB, 512, CUH_TAG_GLOBAL);
    cuh_extent_t *y = take(&a, 2 * MiB, 512, CUH_TAG_GLOBAL);
    cuh_extent_t *z = take(&a, 2 * MiB, 512, CUH_TAG_GLOBAL);
    cuh_arena_release(&a, x, CUH_TAG_GLOBAL);
    cuh_arena_release(&a, z, CUH_TAG_GLOBAL);
    assert_int_equal(a.free_extents, 2);
    assert_int_equal(cuh_arena_largest_free(&a), 4 * MiB);   /* z merged with the tail */
    cuh_arena_release(&a, y, CUH_TAG_GLOBAL);
    assert_int_equal(a.free_extents, 1);
    assert_true(cuh_arena_segment_is_free(seg));
    arena_ok(&a);
    cuh_arena_remove_segment(&a, seg);
    assert_int_equal(a.reserved, 0);
    cuh_arena_destroy(&a);
}

static void test_private_memory_is_invisible_to_other_streams_until_fenced(void **state)
{
    (void)state;
    cuh_arena_t a;
    cuh_arena_init(&a);
    assert_int_equal(cuh_arena_reserve_tags(&a, 3), 0);
    cuh_segment_t *seg = cuh_arena_add_segment(&a, BASE, 4 * MiB, CUH_REGION_GENERAL);
    cuh_extent_t *e = take(&a, 4 * MiB, 512, 1);
    cuh_arena_release(&a, e, 1);
    assert_non_null(cuh_arena_find(&a, 4 * MiB, 512, 1));
    assert_null(cuh_arena_find(&a, 4 * MiB, 512, 2));
    assert_null(cuh_arena_find(&a, 4 * MiB, 512, CUH_TAG_GLOBAL));
    assert_false(cuh_arena_segment_is_free(seg));
    assert_int_equal(cuh_arena_pending_bytes(&a), 0);
    uint64_t fence = cuh_arena_fence_recorded(&a, 1);
    assert_int_equal(cuh_arena_pending_bytes(&a), 4 * MiB);
    assert_null(cuh_arena_find(&a, 4 * MiB, 512, 2));   /* recorded, not complete */
    cuh_arena_fence_completed(&a, 1, fence + 1);
    assert_int_equal(cuh_arena_pending_bytes(&a), 0);
    assert_non_null(cuh_arena_find(&a, 4 * MiB, 512, 2));
    assert_true(cuh_arena_segment_is_free(seg));
    arena_ok(&a);
    cuh_arena_destroy(&a);
}

static void test_fence_covers_only_frees_before_it(void **state)
{
    (void)state;
    cuh_arena_t a;
    cuh_arena_init(&a);
    cuh_arena_reserve_tags(&a, 2);
    cuh_arena_add_segment(&a, BASE, 64 * MiB, CUH_REGION_GENERAL);
    cuh_extent_t *x = take(&a, 4 * MiB, 512, 1);
    cuh_extent_t *sep = take(&a, 4 * MiB, 512, 1);
    cuh_extent_t *y = take(&a, 4 * MiB, 512, 1);
    cuh_extent_t *sep2 = take(&a, 4 * MiB, 512, 1);
    cuh_arena_release(&a, x, 1);
    uint64_t fence = cuh_arena_fence_recorded(&a, 1);
    cuh_arena_release(&a, y, 1);   /* after the fence: not covered */
    cuh_arena_fence_completed(&a, 1, fence + 1);
    assert_int_equal(a.tags[CUH_TAG_GLOBAL].bins[CUH_REGION_GENERAL].bytes, 4 * MiB + 48 * MiB);
    assert_int_equal(a.tags[1].unfenced_bytes, 4 * MiB);
    arena_ok(&a);
    (void)sep;
    (void)sep2;
    cuh_arena_destroy(&a);
}

static void test_private_extent_absorbs_global_but_never_another_stream(void **state)
{
    (void)state;
    cuh_arena_t a;
    cuh_arena_init(&a);
    cuh_arena_reserve_tags(&a, 3);
    cuh_arena_add_segment(&a, BASE, 10 * MiB, CUH_REGION_GENERAL);
    cuh_extent_t *p = take(&a, 2 * MiB, 512, 1);
    cuh_extent_t *q = take(&a, 2 * MiB, 512, 1);
    cuh_extent_t *r = take(&a, 2 * MiB, 512, 1);
    cuh_extent_t *s = take(&a, 2 * MiB, 512, 1);
    /* [p][q][r][s][global 2M] */
    cuh_arena_release(&a, s, 1);   /* absorbs the global tail: 4 MiB private to 1 */
    assert_int_equal(a.tags[1].unfenced_bytes, 4 * MiB);
    assert_int_equal(a.tags[CUH_TAG_GLOBAL].bins[CUH_REGION_GENERAL].bytes, 0);
    cuh_arena_release(&a, q, 2);   /* stream 2's */
    cuh_arena_release(&a, r, 1);   /* joins s (same tag), not q (other stream) */
    assert_int_equal(a.tags[1].unfenced_bytes, 6 * MiB);
    assert_int_equal(a.tags[2].unfenced_bytes, 2 * MiB);
    assert_int_equal(a.free_extents, 2);
    cuh_arena_release(&a, p, CUH_TAG_GLOBAL);
    assert_int_equal(a.free_extents, 3);
    arena_ok(&a);
    cuh_arena_destroy(&a);
}

/* In a virtual-memory reservation a private extent keeps apart from the
 * global space after it; a block may still start in it and reach into that
 * space, which becomes the stream's for the bytes the block covers. */
static void test_take_spanning_a_private_extent_and_the_global_space_after_it(void **state)
{
    (void)state;
    cuh_arena_t a;
    cuh_arena_init(&a);
    cuh_arena_reserve_tags(&a, 2);
    cuh_segment_t *seg = cuh_arena_add_segment(&a, BASE, 16 * MiB, CUH_REGION_GENERAL);
    seg->virtual_space = 1;
    cuh_extent_t *p = take(&a, 4 * MiB, 512, 1);
    cuh_arena_release(&a, p, 1);   /* [private 4M][global 12M]: no merge */
    assert_int_equal(a.free_extents, 2);
    cuh_extent_t *priv = seg->first;
    assert_int_equal(priv->tag, 1);
    cuh_extent_t *b = cuh_arena_take_spanning(&a, priv, BASE + MiB, 6 * MiB, CUH_EXTENT_BLOCK, 1);
    assert_non_null(b);
    assert_int_equal(b->addr, BASE + MiB);
    assert_int_equal(b->size, 6 * MiB);
    assert_int_equal(a.used, 6 * MiB);
    /* [private 1M][block 6M][global 9M] */
    assert_int_equal(a.tags[1].unfenced_bytes, MiB);
    assert_int_equal(a.tags[CUH_TAG_GLOBAL].bins[CUH_REGION_GENERAL].bytes, 9 * MiB);
    assert_int_equal(a.free_extents, 2);
    arena_ok(&a);
    cuh_arena_release(&a, b, 1);   /* joins the private 1M, not the global rest */
    assert_int_equal(a.tags[1].unfenced_bytes, 7 * MiB);
    /* A block that takes the global space whole leaves no global extent. */
    b = cuh_arena_take_spanning(&a, seg->first, BASE, 16 * MiB, CUH_EXTENT_BLOCK, 1);
    assert_non_null(b);
    assert_int_equal(a.free_extents, 0);
    assert_int_equal(a.tags[1].unfenced_bytes, 0);
    assert_int_equal(a.tags[CUH_TAG_GLOBAL].bins[CUH_REGION_GENERAL].bytes, 0);
    arena_ok(&a);
    cuh_arena_destroy(&a);
}

/* A stream that waits (on the GPU) for tag 1's fence gets what the fence
 * covers as its own memory, merged as its own frees would be; what the
 * fence does not cover stays tag 1's. In a virtual-memory reservation the
 * handed memory keeps apart from the global space, as a free would. */
static void test_hand_over_gives_what_a_fence_covers_to_another_stream(void **state)
{
    (void)state;
    cuh_arena_t a;
    cuh_arena_init(&a);
    cuh_arena_reserve_tags(&a, 3);
    cuh_arena_add_segment(&a, BASE, 20 * MiB, CUH_REGION_GENERAL);
    cuh_extent_t *p = take(&a, 4 * MiB, 512, 1);
    cuh_extent_t *q = take(&a, 4 * MiB, 512, 1);
    cuh_extent_t *r = take(&a, 4 * MiB, 512, 2);
    cuh_extent_t *s = take(&a, 4 * MiB, 512, 1);
    /* [p][q][r][s][global 4M] */
    cuh_arena_release(&a, q, 1);
    uint64_t fence = cuh_arena_fence_recorded(&a, 1);
    cuh_arena_release(&a, p, 2);
    cuh_arena_release(&a, r, 2);
    cuh_arena_release(&a, s, 1);   /* after the fence; absorbs the global tail */
    /* [p: 2][q: 1, fenced][r: 2][s: 1, unfenced, 8M] */
    assert_int_equal(a.tags[1].fenced_bytes, 4 * MiB);
    assert_int_equal(a.tags[1].unfenced_bytes, 8 * MiB);
    assert_int_equal(a.tags[2].unfenced_bytes, 8 * MiB);
    cuh_arena_hand_over(&a, 1, fence + 1, 2);
    /* q joins p and r as stream 2's; s stays stream 1's. */
    assert_int_equal(a.tags[1].fenced_bytes, 0);
    assert_int_equal(a.fenced_bytes, 0);
    assert_int_equal(a.tags[1].unfenced_bytes, 8 * MiB);
    assert_int_equal(a.tags[2].unfenced_bytes, 12 * MiB);
    assert_int_equal(a.free_extents, 2);
    cuh_extent_t *e = cuh_arena_find(&a, 12 * MiB, 512, 2);
    assert_non_null(e);
    assert_int_equal(e->addr, BASE);
    assert_int_equal(e->tag, 2);
    assert_null(cuh_arena_find(&a, 4 * MiB, 512, CUH_TAG_GLOBAL));
    arena_ok(&a);
    cuh_arena_destroy(&a);

    cuh_arena_init(&a);
    cuh_arena_reserve_tags(&a, 3);
    cuh_segment_t *seg = cuh_arena_add_segment(&a, BASE, 16 * MiB, CUH_REGION_GENERAL);
    seg->virtual_space = 1;
    take(&a, 4 * MiB, 512, 1);
    q = take(&a, 4 * MiB, 512, 1);
    cuh_arena_release(&a, q, 1);   /* [used][q: 1][global 8M] */
    fence = cuh_arena_fence_recorded(&a, 1);
    cuh_arena_hand_over(&a, 1, fence + 1, 2);
    assert_int_equal(a.tags[2].unfenced_bytes, 4 * MiB);
    assert_int_equal(a.tags[CUH_TAG_GLOBAL].bins[CUH_REGION_GENERAL].bytes, 8 * MiB);
    assert_int_equal(a.free_extents, 2);
    arena_ok(&a);
    cuh_arena_destroy(&a);
}

static void test_aligned_take_leaves_the_padding_free(void **state)
{
    (void)state;
    cuh_arena_t a;
    cuh_arena_init(&a);
    cuh_arena_add_segment(&a, BASE, 8 * MiB, CUH_REGION_GENERAL);
    take(&a, 1024, 512, CUH_TAG_GLOBAL);
    cuh_extent_t *slab = cuh_arena_find(&a, 64 * KiB, 64 * KiB, CUH_TAG_GLOBAL);
    slab = cuh_arena_take(&a, slab, 64 * KiB, 64 * KiB, CUH_EXTENT_SLAB, CUH_TAG_GLOBAL);
    assert_int_equal(slab->addr % (64 * KiB), 0);
    assert_int_equal(slab->addr, BASE + 64 * KiB);
    assert_int_equal(a.used, 1024 + 64 * KiB);
    assert_int_equal(cuh_arena_free_bytes(&a), 8 * MiB - 1024 - 64 * KiB);
    arena_ok(&a);
    cuh_arena_destroy(&a);
}

static void test_segment_lookup_by_address(void **state)
{
    (void)state;
    cuh_arena_t a;
    cuh_arena_init(&a);
    cuh_segment_t *s1 = cuh_arena_add_segment(&a, BASE + 100 * MiB, 4 * MiB, CUH_REGION_GENERAL);
    cuh_segment_t *s0 = cuh_arena_add_segment(&a, BASE, 4 * MiB, CUH_REGION_GENERAL);
    assert_ptr_equal(cuh_arena_segment_of(&a, BASE), s0);
    assert_ptr_equal(cuh_arena_segment_of(&a, BASE + 4 * MiB - 1), s0);
    assert_null(cuh_arena_segment_of(&a, BASE + 4 * MiB));
    assert_ptr_equal(cuh_arena_segment_of(&a, BASE + 101 * MiB), s1);
    assert_null(cuh_arena_segment_of(&a, BASE - 1));
    cuh_arena_destroy(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_best_fit_picks_the_smallest_extent_that_fits),
        cmocka_unit_test(test_workspace_region_is_searched_first),
        cmocka_unit_test(test_freeing_coalesces_global_neighbours),
        cmocka_unit_test(test_private_memory_is_invisible_to_other_streams_until_fenced),
        cmocka_unit_test(test_fence_covers_only_frees_before_it),
        cmocka_unit_test(test_private_extent_absorbs_global_but_never_another_stream),
        cmocka_unit_test(test_take_spanning_a_private_extent_and_the_global_space_after_it),
        cmocka_unit_test(test_hand_over_gives_what_a_fence_covers_to_another_stream),
        cmocka_unit_test(test_aligned_take_leaves_the_padding_free),
        cmocka_unit_test(test_segment_lookup_by_address),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
