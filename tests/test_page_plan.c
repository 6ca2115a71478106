/* test_page_plan.c - the runs of pages a block lacks and where units go
 * (src/page_plan.c): runs read from the mapped-page bitmap; a unit any
 * stream may use goes first over a page the block covers in part, a lent
 * unit only over whole pages; best fit among runs; a lent unit placed
 * inside a run cuts it in two; a unit longer than every run fits nowhere.
 */
#include "test_util.h"

#include "page_plan.h"

static void mark(uint64_t *bits, size_t p)
{
    bits[p >> 6] |= (uint64_t)1 << (p & 63);
}

static void test_runs_come_from_the_unmapped_pages(void **state)
{
    (void)state;
    uint64_t mapped[2] = {0, 0};
    mark(mapped, 3);
    mark(mapped, 4);
    mark(mapped, 70);
    cuh_page_plan_t pl;
    assert_true(cuh_page_plan_init(&pl, mapped, 0, 72, 1, 71));
    assert_int_equal(pl.num_runs, 3);
    assert_int_equal(pl.runs[0].start, 0);
    assert_int_equal(pl.runs[0].len, 3);
    assert_int_equal(pl.runs[1].start, 5);
    assert_int_equal(pl.runs[1].len, 65);
    assert_int_equal(pl.runs[2].start, 71);
    assert_int_equal(pl.runs[2].len, 1);
    assert_int_equal(pl.lacking, 69);
    cuh_page_plan_free(&pl);
}

static void test_units_go_to_partial_pages_best_fits_and_lent_ones_to_whole_pages(void **state)
{
    (void)state;
    /* Pages 0-9; 3 and 4 mapped; pages 0 and 9 covered in part. */
    uint64_t mapped[1] = {0};
    mark(mapped, 3);
    mark(mapped, 4);
    cuh_page_plan_t pl;
    assert_true(cuh_page_plan_init(&pl, mapped, 0, 10, 1, 9));
    size_t dest = 99;
    /* Not lent: the shortest run holding a partial page, over that page. */
    assert_true(cuh_page_plan_fit(&pl, 2, 0, &dest));
    assert_int_equal(dest, 0);
    assert_true(cuh_page_plan_fit(&pl, 4, 0, &dest));
    assert_int_equal(dest, 6);   /* ends at page 9, the partial one */
    /* Lent: whole pages only, best fit: [1, 3) before [5, 9). */
    assert_true(cuh_page_plan_fit(&pl, 2, 1, &dest));
    assert_int_equal(dest, 1);
    assert_false(cuh_page_plan_fit(&pl, 5, 1, &dest));   /* [5, 9) holds 4 */
    assert_false(cuh_page_plan_fit(&pl, 6, 0, &dest));   /* no run of 6 */
    assert_true(cuh_page_plan_place(&pl, 111, 1, 2, 1));
    assert_int_equal(pl.num_runs, 2);   /* [0, 1) and [5, 10) */
    assert_int_equal(pl.runs[0].len, 1);
    assert_int_equal(pl.lent, 2);
    assert_true(cuh_page_plan_fit(&pl, 4, 1, &dest));
    assert_int_equal(dest, 5);
    assert_true(cuh_page_plan_place(&pl, 222, 5, 4, 1));
    assert_int_equal(pl.num_runs, 2);   /* [0, 1) and [9, 10): partial pages only */
    assert_false(cuh_page_plan_fit(&pl, 1, 1, &dest));
    assert_true(cuh_page_plan_fit(&pl, 1, 0, &dest));
    assert_true(cuh_page_plan_place(&pl, 333, dest, 1, 0));
    assert_true(cuh_page_plan_fit(&pl, 1, 0, &dest));
    assert_true(cuh_page_plan_place(&pl, 444, dest, 1, 0));
    assert_int_equal(pl.lacking, 0);
    assert_int_equal(pl.num_runs, 0);
    assert_int_equal(pl.num_placed, 4);
    size_t covered = 0;
    for (size_t i = 0; i < pl.num_placed; i++)
        covered += pl.placed[i].pages;
    assert_int_equal(covered, 8);
    cuh_page_plan_free(&pl);
}

static void test_a_lent_unit_inside_a_run_cuts_it_in_two(void **state)
{
    (void)state;
    uint64_t mapped[1] = {0};
    cuh_page_plan_t pl;
    assert_true(cuh_page_plan_init(&pl, mapped, 0, 10, 1, 9));
    size_t dest = 99;
    assert_true(cuh_page_plan_fit(&pl, 3, 1, &dest));
    assert_int_equal(dest, 1);
    assert_true(cuh_page_plan_place(&pl, 7, dest, 3, 1));
    assert_int_equal(pl.num_runs, 2);
    assert_int_equal(pl.runs[0].start, 0);
    assert_int_equal(pl.runs[0].len, 1);
    assert_int_equal(pl.runs[1].start, 4);
    assert_int_equal(pl.runs[1].len, 6);
    assert_int_equal(pl.lacking, 7);
    /* A place outside every run is refused and changes nothing. */
    assert_false(cuh_page_plan_place(&pl, 8, 2, 1, 0));
    assert_int_equal(pl.lacking, 7);
    cuh_page_plan_free(&pl);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_runs_come_from_the_unmapped_pages),
        cmocka_unit_test(test_units_go_to_partial_pages_best_fits_and_lent_ones_to_whole_pages),
        cmocka_unit_test(test_a_lent_unit_inside_a_run_cuts_it_in_two),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
