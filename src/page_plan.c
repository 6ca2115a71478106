/* page_plan.c - the runs of pages a block lacks and the physical units
 * placed in them (page_plan.h says why units, and the placement rule).
 *
 * A plan is short-lived (one mapping under the heap's lock) and small: a
 * block lacks at most a few runs, so the runs are an array scanned whole.
 */
#include "page_plan.h"

#include <stdlib.h>
#include <string.h>

static int page_bit(const uint64_t *mapped, size_t p)
{
    return (int)((mapped[p >> 6] >> (p & 63)) & 1);
}

int cuh_page_plan_init(cuh_page_plan_t *pl, const uint64_t *mapped, size_t first, size_t end, size_t whole_lo,
                       size_t whole_hi)
{
    memset(pl, 0, sizeof *pl);
    pl->whole_lo = whole_lo;
    pl->whole_hi = whole_hi < whole_lo ? whole_lo : whole_hi;
    size_t runs = 0, lacking = 0;
    for (size_t p = first; p < end; p++)
        if (!page_bit(mapped, p)) {
            lacking++;
            runs += p == first || page_bit(mapped, p - 1);
        }
    /* Placing a lent unit inside a run may cut it in two, at most once at
     * each end of the block's whole pages. */
    pl->cap_runs = runs + 2;
    pl->cap_placed = lacking ? lacking : 1;
    pl->runs = malloc(pl->cap_runs * sizeof *pl->runs);
    pl->placed = malloc(pl->cap_placed * sizeof *pl->placed);
    if (!pl->runs || !pl->placed) {
        cuh_page_plan_free(pl);
        return 0;
    }
    for (size_t p = first; p < end; p++) {
        if (page_bit(mapped, p))
            continue;
        if (pl->num_runs && pl->runs[pl->num_runs - 1].start + pl->runs[pl->num_runs - 1].len == p)
            pl->runs[pl->num_runs - 1].len++;
        else
            pl->runs[pl->num_runs++] = (cuh_page_run_t){p, 1};
    }
    pl->lacking = lacking;
    return 1;
}

void cuh_page_plan_free(cuh_page_plan_t *pl)
{
    free(pl->runs);
    free(pl->placed);
    memset(pl, 0, sizeof *pl);
}

/* The part of run r a unit may take: all of it, or for a lent unit the
 * pages the block covers whole. */
static void usable(const cuh_page_plan_t *pl, const cuh_page_run_t *r, int lent, size_t *lo, size_t *hi)
{
    *lo = r->start;
    *hi = r->start + r->len;
    if (lent) {
        if (*lo < pl->whole_lo)
            *lo = pl->whole_lo;
        if (*hi > pl->whole_hi)
            *hi = pl->whole_hi;
    }
}

int cuh_page_plan_fit(const cuh_page_plan_t *pl, size_t pages, int lent, size_t *dest)
{
    size_t best = SIZE_MAX;
    if (!pages)
        return 0;
    /* A unit any stream may use covers a partly covered page first, where a
     * lent one may not go: the shortest run holding such a page. */
    for (size_t i = 0; !lent && i < pl->num_runs; i++) {
        const cuh_page_run_t *r = &pl->runs[i];
        if (r->len < pages || r->len >= best || (r->start >= pl->whole_lo && r->start + r->len <= pl->whole_hi))
            continue;
        best = r->len;
        *dest = r->start < pl->whole_lo ? r->start : r->start + r->len - pages;
    }
    if (best != SIZE_MAX)
        return 1;
    for (size_t i = 0; i < pl->num_runs; i++) {
        size_t lo, hi;
        usable(pl, &pl->runs[i], lent, &lo, &hi);
        if (hi > lo && hi - lo >= pages && hi - lo < best) {
            best = hi - lo;
            *dest = lo;
        }
    }
    return best != SIZE_MAX;
}

int cuh_page_plan_place(cuh_page_plan_t *pl, uint64_t handle, size_t dest, size_t pages, int lent)
{
    size_t i = 0;
    while (i < pl->num_runs && !(pl->runs[i].start <= dest && dest + pages <= pl->runs[i].start + pl->runs[i].len))
        i++;
    if (i == pl->num_runs || pl->num_placed == pl->cap_placed)
        return 0;
    cuh_page_run_t *r = &pl->runs[i];
    const size_t before = dest - r->start, after = r->start + r->len - (dest + pages);
    if (before && after) {
        if (pl->num_runs == pl->cap_runs)
            return 0;
        memmove(r + 2, r + 1, (pl->num_runs - i - 1) * sizeof *r);
        pl->num_runs++;
        r[1] = (cuh_page_run_t){dest + pages, after};
        r->len = before;
    } else if (before) {
        r->len = before;
    } else if (after) {
        r->start = dest + pages;
        r->len = after;
    } else {
        memmove(r, r + 1, (pl->num_runs - i - 1) * sizeof *r);
        pl->num_runs--;
    }
    pl->placed[pl->num_placed++] = (cuh_unit_place_t){handle, dest, pages, lent};
    pl->lacking -= pages;
    pl->lent += lent ? pages : 0;
    return 1;
}
