/* step_plan_trace.c - a trace's step, cut from its marks and laid out in
 * advance (cuh_step_plan_trace, step_plan.h): the yardstick cuheap-replay
 * reports as "plan". Tool-side code, never in the library.
 */
#include "step_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t round_up(uint64_t x, uint64_t to)
{
    return to > 1 ? (x + to - 1) / to * to : x;
}

int cuh_step_plan_trace(const cuh_trace_t *t, size_t step, uint64_t align, uint64_t page, cuh_step_plan_t *out,
                        char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    out->step = step;
    /* Step k (from 1) runs from mark k - 1 to mark k; the next one must end too. */
    if (step < 1 || step + 1 >= t->num_marks) {
        snprintf(err, errlen, "%s: no step %zu and step after it to plan (the trace marks %zu step start%s)", t->path,
                 step, t->num_marks, t->num_marks == 1 ? "" : "s");
        return -1;
    }
    const size_t a0 = t->mark_events[step - 1], a1 = t->mark_events[step], a2 = t->mark_events[step + 1];
    const size_t len = a1 - a0;
    out->repeats = a2 - a1 == len;
    for (size_t j = 0; out->repeats && j < len; j++) {
        const cuh_trace_event_t *x = &t->events[a0 + j], *y = &t->events[a1 + j];
        out->repeats = x->kind == y->kind && x->size == y->size;
    }
    cuh_step_block_t *blocks = malloc((len ? len : 1) * sizeof *blocks);
    if (!blocks) {
        snprintf(err, errlen, "out of host memory planning %s", t->path);
        return -1;
    }
    size_t n = 0;
    for (size_t i = 0; i < a1; i++) {
        const cuh_trace_event_t *x = &t->events[i];
        if (x->kind != CUH_TRACE_ALLOC)
            continue;
        const size_t f = x->match;   /* CUH_TRACE_NO_MATCH (never freed) is above every index */
        const uint64_t size = round_up(x->size, align);
        if (i < a0) {
            if (f >= a1)
                out->persistent += size;   /* live through the step; what is freed in it is the step before's */
            continue;
        }
        if (f < a1)
            blocks[n++] = (cuh_step_block_t){.size = size, .start = i - a0, .end = f - a0};
        else if (f < a2 && f - a1 <= i - a0)
            blocks[n++] = (cuh_step_block_t){.size = size, .start = i - a0, .end = f - a1};   /* wraps */
        else
            out->persistent += size;   /* outlives the next step's own copy of it */
    }
    out->blocks = n;
    const uint64_t footprint = cuh_step_plan_layout(blocks, n, len);
    out->step_peak = cuh_step_plan_live_peak(blocks, n, len);
    free(blocks);
    if (footprint == UINT64_MAX || out->step_peak == UINT64_MAX) {
        snprintf(err, errlen, "out of host memory planning %s", t->path);
        return -1;
    }
    out->window = round_up(footprint, page);
    return 0;
}
