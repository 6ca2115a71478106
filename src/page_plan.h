/* page_plan.h - where the physical units behind a block's missing pages go.
 *
 * Under vmm:1 a block is mapped page by page of the reservation, but what is
 * mapped is a unit: one physical allocation over consecutive pages, created,
 * mapped, granted, moved and unmapped as one piece. The driver charges per
 * call, not per byte (a 2 MiB page moved costs about 35 us, a 512 MiB
 * allocation 63 us: docs/benchmarks.md), so a block served by a few large
 * units costs a few calls where pages of their own cost hundreds. A unit can
 * only be mapped whole, at a range where nothing is mapped, and cannot be
 * split: it serves a block only where the block lacks a run of pages at
 * least as long.
 *
 * A plan holds the runs of pages a block lacks and the units placed in them
 * so far. Moved units go to the shortest run they fit (best fit, so long
 * runs stay for long units); a unit still safe only for the block's own
 * stream (a lent one, heap_pages.c) goes only over pages the block covers
 * whole. What no unit covers is created last, a unit per run. This file
 * holds the data structure only; heap_pages.c decides which units move.
 */
#ifndef CUH_PAGE_PLAN_H
#define CUH_PAGE_PLAN_H

#include <stddef.h>
#include <stdint.h>

typedef struct cuh_page_run_s {
    size_t start, len;        /* pages [start, start + len) of the reservation */
} cuh_page_run_t;

typedef struct cuh_unit_place_s {
    uint64_t handle;          /* the physical allocation */
    size_t dest, pages;       /* mapped at pages [dest, dest + pages) */
    int lent;                 /* safe for the block's own stream only */
} cuh_unit_place_t;

typedef struct cuh_page_plan_s {
    cuh_page_run_t *runs;     /* the pages still lacking, in address order */
    size_t num_runs, cap_runs;
    size_t whole_lo, whole_hi;   /* the pages [whole_lo, whole_hi) the block covers whole */
    cuh_unit_place_t *placed;
    size_t num_placed, cap_placed;
    size_t lacking;           /* pages in runs */
    size_t lent;              /* pages placed from lent units */
} cuh_page_plan_t;

/* A plan for pages [first, end) of which those whose bit is clear in
 * `mapped` (bit p of word p / 64) are lacking; [whole_lo, whole_hi) are the
 * pages the block covers whole. 0 if out of host memory. */
int cuh_page_plan_init(cuh_page_plan_t *pl, const uint64_t *mapped, size_t first, size_t end, size_t whole_lo,
                       size_t whole_hi);
void cuh_page_plan_free(cuh_page_plan_t *pl);

/* Where a unit of `pages` pages would go: the first page of the shortest
 * lacking run that holds it (for a `lent` unit, the part of the run the
 * block covers whole); a unit not lent goes first to the shortest run that
 * holds a page the block covers in part, over that page, leaving whole
 * pages to lent units. 1 and *dest if there is one. */
int cuh_page_plan_fit(const cuh_page_plan_t *pl, size_t pages, int lent, size_t *dest);

/* Places the unit at [dest, dest + pages), which cuh_page_plan_fit gave;
 * those pages are no longer lacking. 0 if out of host memory (nothing
 * changed). */
int cuh_page_plan_place(cuh_page_plan_t *pl, uint64_t handle, size_t dest, size_t pages, int lent);

#endif
