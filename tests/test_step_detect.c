/* test_step_detect.c - a program's steps found in its allocations
 * (src/step_detect.c): a step that repeats is found and said every period;
 * the layers of a forward pass, which repeat but keep their activations,
 * are no step, nor the micro-batches of an accumulation step or a loop over
 * equal layers in the optimizer once the whole step has repeated; steps
 * whose shapes change are never said; a new kind of step takes over from
 * the old; a step longer than the history is not found.
 */
#include "test_util.h"

#include "step_detect.h"

#include <stdlib.h>
#include <string.h>

/* A simulated program: allocations (key = size) and frees, with the live
 * bytes the detector is given, and the step starts it says. */
typedef struct prog_s {
    cuh_step_detect_t d;
    uint64_t live;
    uint64_t allocs;
    uint64_t starts[4096];   /* allocation numbers that began a step */
    size_t num_starts;
    uint64_t kept[1 << 14];  /* sizes allocated and not yet freed, a stack */
    size_t num_kept;
} prog_t;

static prog_t *prog_new(size_t history)
{
    prog_t *p = calloc(1, sizeof *p);
    assert_non_null(p);
    assert_int_equal(cuh_step_detect_init(&p->d, history), 0);
    return p;
}

static void prog_free(prog_t *p)
{
    cuh_step_detect_free(&p->d);
    free(p);
}

static void alloc_kept(prog_t *p, uint64_t size)
{
    if (cuh_step_detect_push(&p->d, size, p->live) && p->num_starts < 4096)
        p->starts[p->num_starts++] = p->allocs;
    p->allocs++;
    p->live += size;
    p->kept[p->num_kept++] = size;
}

static void free_last(prog_t *p)
{
    p->live -= p->kept[--p->num_kept];
}

/* A temporary: allocated and freed at once. */
static void temp(prog_t *p, uint64_t size)
{
    alloc_kept(p, size);
    free_last(p);
}

static void free_all(prog_t *p)
{
    while (p->num_kept)
        free_last(p);
}

/* A transformer's training step: 12 equal layers forward (each keeps eight
 * activations and uses eight temporaries), the same backward (freeing
 * them), then the optimizer over the 12 layers' equal parameters. */
enum { LAYERS = 12 };
static uint64_t transformer_step(prog_t *p, uint64_t tokens)
{
    const uint64_t first = p->allocs;
    alloc_kept(p, 4000 * tokens);   /* the embedding's output */
    for (int l = 0; l < LAYERS; l++) {   /* 16 allocations a layer: as many as a step must have */
        for (uint64_t k = 0; k < 8; k++) {
            alloc_kept(p, (1000 + k) * tokens);
            temp(p, (9000 + k) * tokens);
        }
    }
    for (int l = 0; l < LAYERS; l++) {
        for (uint64_t k = 0; k < 8; k++) {
            temp(p, (7000 + k) * tokens);
            free_last(p);
        }
    }
    free_last(p);
    for (int l = 0; l < LAYERS; l++) {
        temp(p, 123456);
        temp(p, 654321);
    }
    return p->allocs - first;
}

static void assert_starts_every(const prog_t *p, uint64_t period, size_t from, size_t to)
{
    assert_true(to <= p->num_starts);
    for (size_t k = from + 1; k < to; k++)
        assert_int_equal(p->starts[k] - p->starts[k - 1], period);
}

static void test_a_repeating_step_is_found(void **state)
{
    (void)state;
    prog_t *p = prog_new(1 << 12);
    uint64_t step = 0;
    for (int s = 0; s < 10; s++) {
        const uint64_t at = p->allocs;
        for (uint64_t k = 0; k < 40; k++)
            alloc_kept(p, 1000 + k);
        free_all(p);
        step = p->allocs - at;
    }
    /* Found once the step has repeated in full: from the third step on. */
    assert_true(p->num_starts >= 7);
    assert_true(p->starts[0] <= 3 * step);
    assert_starts_every(p, step, 0, p->num_starts);
    prog_free(p);
}

static void test_layers_that_keep_activations_are_no_step(void **state)
{
    (void)state;
    prog_t *p = prog_new(1 << 12);
    uint64_t step = 0;
    for (int s = 0; s < 8; s++)
        step = transformer_step(p, 16);
    /* Every step start said is a whole step apart: the optimizer's loop over
     * equal layers may be said before the whole step has repeated (in the
     * first two steps), never after. */
    size_t first_whole = 0;
    while (first_whole < p->num_starts && p->starts[first_whole] < 2 * step)
        first_whole++;
    assert_true(p->num_starts - first_whole >= 5);
    assert_starts_every(p, step, first_whole, p->num_starts);
    assert_int_equal(p->d.period, step);
    prog_free(p);
}

static void test_micro_batches_give_way_to_the_whole_step(void **state)
{
    (void)state;
    prog_t *p = prog_new(1 << 12);
    uint64_t step = 0;
    for (int s = 0; s < 10; s++) {
        const uint64_t at = p->allocs;
        for (int m = 0; m < 4; m++) {   /* four micro-batches of 20 allocations, each leaving nothing */
            alloc_kept(p, 4000);
            for (uint64_t l = 0; l < 18; l++)
                alloc_kept(p, 3000 + l);
            temp(p, 777);
            for (int l = 0; l < 18; l++)
                free_last(p);
            free_last(p);
        }
        temp(p, 55555);   /* the optimizer */
        temp(p, 66666);
        step = p->allocs - at;
    }
    assert_int_equal(p->d.period, step);
    /* From the fourth step on, every start is a whole step apart. */
    size_t from = 0;
    while (from < p->num_starts && p->starts[from] < 3 * step)
        from++;
    assert_true(p->num_starts - from >= 6);
    assert_starts_every(p, step, from, p->num_starts);
    prog_free(p);
}

static void test_steps_whose_shapes_change_are_never_said(void **state)
{
    (void)state;
    prog_t *p = prog_new(1 << 12);
    for (int s = 0; s < 12; s++)
        transformer_step(p, 16 + (uint64_t)s);   /* the sequence length changes every step */
    assert_int_equal(p->num_starts, 0);
    assert_int_equal(p->d.period, 0);
    prog_free(p);
}

static void test_a_new_kind_of_step_takes_over(void **state)
{
    (void)state;
    prog_t *p = prog_new(1 << 12);
    for (int s = 0; s < 6; s++)
        transformer_step(p, 16);
    uint64_t step = 0;
    for (int s = 0; s < 8; s++)
        step = transformer_step(p, 32);   /* longer sequences from here on */
    assert_int_equal(p->d.period, step);
    prog_free(p);
}

/* Training, a while of evaluation (its own repeating step), training again:
 * the training step is said again as soon as it has repeated. */
static void test_the_step_comes_back_after_evaluation(void **state)
{
    (void)state;
    prog_t *p = prog_new(1 << 12);
    uint64_t step = 0;
    for (int s = 0; s < 12; s++)
        step = transformer_step(p, 16);
    for (int s = 0; s < 3; s++) {   /* evaluation: the forward pass only, activations freed as it goes */
        alloc_kept(p, 4000 * 16);
        for (int l = 0; l < LAYERS; l++) {
            for (uint64_t k = 0; k < 8; k++) {
                alloc_kept(p, (1000 + k) * 16);
                temp(p, (9000 + k) * 16);
                free_last(p);
            }
        }
        free_last(p);
    }
    const size_t before = p->num_starts;
    const uint64_t back = p->allocs;
    for (int s = 0; s < 4; s++)
        transformer_step(p, 16);
    assert_int_equal(p->d.period, step);
    assert_true(p->num_starts > before);
    size_t k = before;
    while (k < p->num_starts && p->starts[k] < back)
        k++;
    assert_true(k < p->num_starts && p->starts[k] <= back + 3 * step);
    prog_free(p);
}

static void test_a_step_longer_than_the_history_is_not_found(void **state)
{
    (void)state;
    prog_t *p = prog_new(64);
    for (int s = 0; s < 6; s++) {
        for (uint64_t k = 0; k < 100; k++)
            alloc_kept(p, 1000 + k);
        free_all(p);
    }
    assert_int_equal(p->num_starts, 0);
    prog_free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_repeating_step_is_found),
        cmocka_unit_test(test_layers_that_keep_activations_are_no_step),
        cmocka_unit_test(test_micro_batches_give_way_to_the_whole_step),
        cmocka_unit_test(test_steps_whose_shapes_change_are_never_said),
        cmocka_unit_test(test_a_new_kind_of_step_takes_over),
        cmocka_unit_test(test_the_step_comes_back_after_evaluation),
        cmocka_unit_test(test_a_step_longer_than_the_history_is_not_found),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
