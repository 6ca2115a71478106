/* test_step_plan.c - the planned layout of a repeating step (src/step_plan.c):
 * blocks whose lives do not meet share bytes, those whose lives meet never
 * do (random steps, wrapping lives included, checked pair by pair); the
 * largest go first; the live peak bounds every layout from below; a trace's
 * step is cut from its marks, with blocks freed in the next step wrapping
 * round, blocks live through it left out, and a step that differs from the
 * next one said; a trace without the step is refused, naming it.
 */
#include "test_util.h"

#include "step_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static cuh_step_block_t blk(uint64_t size, size_t start, size_t end)
{
    return (cuh_step_block_t){.size = size, .start = start, .end = end};
}

static void test_lives_apart_share_bytes_and_lives_that_meet_stack(void **state)
{
    (void)state;
    cuh_step_block_t b[3] = {blk(100, 0, 4), blk(100, 4, 8), blk(50, 2, 6)};
    assert_int_equal(cuh_step_plan_layout(b, 3, 10), 150);
    assert_int_equal(b[0].offset, 0);
    assert_int_equal(b[1].offset, 0);   /* its life starts where the first one's ends */
    assert_int_equal(b[2].offset, 100);
    assert_int_equal(cuh_step_plan_live_peak(b, 3, 10), 150);
    assert_int_equal(cuh_step_plan_layout(NULL, 0, 10), 0);
}

/* Largest first: the big block takes offset 0 although it comes last in
 * the step, and the two small ones share the room above it. */
static void test_the_largest_block_is_placed_first(void **state)
{
    (void)state;
    cuh_step_block_t b[3] = {blk(60, 0, 5), blk(60, 5, 10), blk(100, 1, 9)};
    assert_int_equal(cuh_step_plan_layout(b, 3, 10), 160);
    assert_int_equal(b[2].offset, 0);
    assert_int_equal(b[0].offset, 100);
    assert_int_equal(b[1].offset, 100);
}

/* A life that wraps (freed in the next step) meets what runs at the step's
 * end and at its start, not what runs between. */
static void test_a_wrapping_life_meets_both_ends_of_the_step(void **state)
{
    (void)state;
    cuh_step_block_t b[3] = {blk(100, 8, 2), blk(100, 3, 7), blk(10, 1, 4)};
    assert_int_equal(cuh_step_plan_layout(b, 3, 10), 110);
    assert_int_equal(b[0].offset, 0);
    assert_int_equal(b[1].offset, 0);     /* [3, 7) misses [8, 10) and [0, 2) */
    assert_int_equal(b[2].offset, 100);   /* [1, 4) meets both */
    assert_int_equal(cuh_step_plan_live_peak(b, 3, 10), 110);
    /* Freed at the step's first event of the next step: one piece. */
    cuh_step_block_t c[2] = {blk(10, 5, 0), blk(10, 0, 5)};
    assert_int_equal(cuh_step_plan_layout(c, 2, 10), 10);
}

static int lives_meet(const cuh_step_block_t *a, const cuh_step_block_t *b, size_t len)
{
    /* Event by event: the slow, obvious way. */
    for (size_t t = 0; t < len; t++) {
        int in_a = a->end > a->start ? (t >= a->start && t < a->end) : (t >= a->start || t < a->end);
        int in_b = b->end > b->start ? (t >= b->start && t < b->end) : (t >= b->start || t < b->end);
        if (in_a && in_b)
            return 1;
    }
    return 0;
}

/* The rule the layout keeps: no byte has two owners at once. Random steps,
 * some lives wrapping, checked pair by pair; the footprint never below the
 * live peak, nor above the sum of the sizes. */
static void test_random_steps_never_give_a_byte_two_owners(void **state)
{
    (void)state;
    srand(45);
    enum { N = 120, LEN = 200 };
    cuh_step_block_t b[N];
    for (int round = 0; round < 40; round++) {
        uint64_t sum = 0;
        for (int i = 0; i < N; i++) {
            size_t s = (size_t)rand() % LEN, e = (size_t)rand() % LEN;
            if (e == s)
                e = (s + 1) % LEN;
            b[i] = blk(512 * (1 + (uint64_t)(rand() % 64)), s, e);
            sum += b[i].size;
        }
        const uint64_t fp = cuh_step_plan_layout(b, N, LEN);
        const uint64_t peak = cuh_step_plan_live_peak(b, N, LEN);
        assert_true(fp >= peak);
        assert_true(fp <= sum);
        for (int i = 0; i < N; i++) {
            assert_true(b[i].offset + b[i].size <= fp);
            for (int j = i + 1; j < N; j++)
                if (lives_meet(&b[i], &b[j], LEN))
                    assert_true(b[i].offset + b[i].size <= b[j].offset || b[j].offset + b[j].size <= b[i].offset);
        }
    }
}

static void write_trace(char *path, size_t len, const char *text)
{
    snprintf(path, len, "/tmp/cuh_test_step_plan.%d.trace", (int)getpid());
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    assert_int_equal(fclose(f), 0);
}

/* Three steps of one trace: weights (id 0) live throughout; each step
 * allocates an activation freed in it and a gradient freed in the next
 * step (ids 1 and 2, 3 and 4, 5 and 6). Step 2 is planned: its activation
 * and gradient, the gradient wrapping round to meet the activation again
 * at the step's start; the weights are persistent. */
static void test_a_trace_step_is_cut_from_its_marks(void **state)
{
    (void)state;
    char path[256], err[512];
    write_trace(path, sizeof path,
                "# trace v1 source=test\n"
                "a 1 0 4000 0\n"
                "# mark 2 step 0\n"
                "a 3 1 1000 0\na 4 2 2000 0\nf 5 1\n"
                "# mark 6 step 1\n"
                "a 7 3 1000 0\nf 8 2\na 9 4 2000 0\nf 10 3\n"
                "# mark 11 step 2\n"
                "a 12 5 1000 0\nf 13 4\na 14 6 2000 0\nf 15 5\n"
                "# mark 16 step 3\n"
                "a 17 7 1000 0\nf 18 6\na 19 8 2000 0\nf 20 7\n"
                "# mark 21 end\n");
    cuh_trace_t t;
    assert_int_equal(cuh_trace_load(path, &t, err, sizeof err), 0);
    cuh_step_plan_t p;
    assert_int_equal(cuh_step_plan_trace(&t, 3, 512, 4096, &p, err, sizeof err), 0);
    assert_int_equal(p.step, 3);
    assert_true(p.repeats);
    assert_int_equal(p.blocks, 2);
    assert_int_equal(p.persistent, 4096);   /* 4000 rounded up to 512 */
    /* The activation (1024) and the gradient (2048) meet: at the step's
     * start the last step's gradient is still live. */
    assert_int_equal(p.step_peak, 1024 + 2048);
    assert_int_equal(p.window, 4096);       /* 3072 rounded up to the page */
    /* Step 2 repeats in step 3; step 1, which frees no gradient of a step
     * before it, does not repeat in step 2. */
    assert_int_equal(cuh_step_plan_trace(&t, 2, 512, 4096, &p, err, sizeof err), 0);
    assert_true(p.repeats);
    assert_int_equal(cuh_step_plan_trace(&t, 1, 512, 4096, &p, err, sizeof err), 0);
    assert_false(p.repeats);
    /* Step 4 has no step after it. */
    assert_int_equal(cuh_step_plan_trace(&t, 4, 512, 4096, &p, err, sizeof err), -1);
    assert_non_null(strstr(err, "no step 4"));
    assert_non_null(strstr(err, path));
    cuh_trace_free(&t);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lives_apart_share_bytes_and_lives_that_meet_stack),
        cmocka_unit_test(test_the_largest_block_is_placed_first),
        cmocka_unit_test(test_a_wrapping_life_meets_both_ends_of_the_step),
        cmocka_unit_test(test_random_steps_never_give_a_byte_two_owners),
        cmocka_unit_test(test_a_trace_step_is_cut_from_its_marks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
