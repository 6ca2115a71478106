/* step_plan.c - the planned layout of a repeating step (see step_plan.h).
 *
 * A block's life is one or two pieces of the step's events: [start, end), or
 * [start, len) and [0, end) when it wraps into the next step. Two blocks may
 * share bytes only if no piece of one meets a piece of the other. The layout
 * is greedy by size: each block, largest first, gathers the ranges of the
 * blocks already placed whose lives meet its own, sorted by offset, and takes
 * the first gap that holds it. That is O(n^2) in the step's blocks, a few
 * thousand in the corpus's steps: milliseconds. Library code: the heap's
 * step plans (heap_plan.c) lay their steps out with it; cutting a step out
 * of a trace is tool-side (step_plan_trace.c).
 */
#include "step_plan.h"

#include <stdlib.h>

typedef struct {
    size_t s, e;
} piece_t;

/* The pieces of b's life (one or two); how many. */
static int pieces_of(const cuh_step_block_t *b, size_t len, piece_t p[2])
{
    if (b->end > b->start) {
        p[0] = (piece_t){b->start, b->end};
        return 1;
    }
    p[0] = (piece_t){b->start, len};
    if (b->end == 0)
        return 1;
    p[1] = (piece_t){0, b->end};
    return 2;
}

static int lives_meet(const cuh_step_block_t *a, const cuh_step_block_t *b, size_t len)
{
    piece_t pa[2], pb[2];
    const int na = pieces_of(a, len, pa), nb = pieces_of(b, len, pb);
    for (int i = 0; i < na; i++)
        for (int j = 0; j < nb; j++)
            if (pa[i].s < pb[j].e && pb[j].s < pa[i].e)
                return 1;
    return 0;
}

/* For qsort of block pointers: the largest first, then the earlier start. */
static int larger_first(const void *x, const void *y)
{
    const cuh_step_block_t *a = *(cuh_step_block_t *const *)x, *b = *(cuh_step_block_t *const *)y;
    if (a->size != b->size)
        return a->size < b->size ? 1 : -1;
    return (a->start > b->start) - (a->start < b->start);
}

typedef struct {
    uint64_t lo, hi;
} range_t;

static int lower_first(const void *x, const void *y)
{
    const range_t *a = x, *b = y;
    return (a->lo > b->lo) - (a->lo < b->lo);
}

uint64_t cuh_step_plan_layout(cuh_step_block_t *b, size_t n, size_t len)
{
    if (!n)
        return 0;
    cuh_step_block_t **order = malloc(n * sizeof *order);
    range_t *taken = malloc(n * sizeof *taken);
    if (!order || !taken) {
        free(order);
        free(taken);
        return UINT64_MAX;
    }
    for (size_t i = 0; i < n; i++)
        order[i] = &b[i];
    qsort(order, n, sizeof *order, larger_first);
    uint64_t footprint = 0;
    for (size_t i = 0; i < n; i++) {
        cuh_step_block_t *x = order[i];
        size_t k = 0;
        for (size_t j = 0; j < i; j++)
            if (lives_meet(x, order[j], len))
                taken[k++] = (range_t){order[j]->offset, order[j]->offset + order[j]->size};
        qsort(taken, k, sizeof *taken, lower_first);
        uint64_t at = 0;
        for (size_t j = 0; j < k && at + x->size > taken[j].lo; j++)
            if (taken[j].hi > at)
                at = taken[j].hi;
        x->offset = at;
        if (at + x->size > footprint)
            footprint = at + x->size;
    }
    free(order);
    free(taken);
    return footprint;
}

uint64_t cuh_step_plan_live_peak(const cuh_step_block_t *b, size_t n, size_t len)
{
    /* Bytes that start (+) and stop (-) being live at each event. */
    int64_t *delta = calloc(len + 1, sizeof *delta);
    if (!delta)
        return UINT64_MAX;
    for (size_t i = 0; i < n; i++) {
        piece_t p[2];
        const int np = pieces_of(&b[i], len, p);
        for (int k = 0; k < np; k++) {
            delta[p[k].s] += (int64_t)b[i].size;
            delta[p[k].e] -= (int64_t)b[i].size;
        }
    }
    int64_t live = 0, peak = 0;
    for (size_t t = 0; t < len; t++) {
        live += delta[t];
        if (live > peak)
            peak = live;
    }
    free(delta);
    return (uint64_t)peak;
}
