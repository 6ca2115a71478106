/* step_plan.h - the planned layout of a repeating step: how little memory a
 * training step's blocks need when the whole step is known before it runs.
 *
 * The heap places each block when it is asked for, knowing nothing of what
 * comes next, and under vmm:1 it moves pages where free memory lies in the
 * wrong place. Most training jobs ask for the same sizes in the same order
 * every step, so one step foretells the next. This module lays out one step
 * as if it were known in advance: every block of the step, with its life
 * measured in the step's events (a block freed in the next step lives on
 * into it, wrapping round to the step's start), placed largest first, each at
 * the lowest offset that no block whose life meets its own covers (greedy
 * by size, the usual heuristic for this NP-hard packing). Blocks live
 * through the whole step (weights, optimizer state) are left where they are.
 *
 * What comes out is a yardstick, not a policy: the memory a layout of the
 * step holds, beside its live peak and beside what the heap's replay held
 * (cuheap-replay's "plan", cuheap-corpus's column); the heap lays out the
 * steps it learns with the same function when step_plan is set
 * (heap_plan.c). The layout is library code; cutting a step out of a trace
 * (cuh_step_plan_trace) is tool-side (step_plan_trace.c).
 */
#ifndef CUH_STEP_PLAN_H
#define CUH_STEP_PLAN_H

#include "trace_read.h"

#include <stddef.h>
#include <stdint.h>

typedef struct cuh_step_block_s {
    uint64_t size;      /* bytes */
    size_t start, end;  /* live from the step's event `start` to event `end`
                         * (start < len); end <= start: freed in the next step
                         * at its event `end`, so the life wraps round */
    uint64_t offset;    /* where the plan puts it (cuh_step_plan_layout) */
} cuh_step_block_t;

/* Places blocks b[0..n) of a step of `len` events: largest first (ties: the
 * earlier start), each at the lowest offset clear of every block placed
 * before it whose life meets its own. Returns the footprint (the highest end
 * of a block; 0 for none), or UINT64_MAX when host memory runs out. */
uint64_t cuh_step_plan_layout(cuh_step_block_t *b, size_t n, size_t len);

/* The most bytes of b[0..n) live at once over the step: no layout of the
 * step holds less. */
uint64_t cuh_step_plan_live_peak(const cuh_step_block_t *b, size_t n, size_t len);

typedef struct cuh_step_plan_s {
    size_t step;            /* the step planned, from 1 (a trace's first step is 1) */
    int repeats;            /* the next step asks for the same sizes in the same order */
    size_t blocks;          /* the step's blocks planned */
    uint64_t persistent;    /* bytes live through the whole step, not planned */
    uint64_t window;        /* the planned layout's footprint, rounded up to `page` */
    uint64_t step_peak;     /* the planned blocks' live peak */
} cuh_step_plan_t;

/* Tool-side (step_plan_trace.c). Plans step `step` (from 1) of trace t, whose marks give its steps (a
 * corpus trace marks each step's start and the end): every block allocated
 * in the step, sizes rounded up to `align`, the window rounded up to `page`.
 * A block that outlives the next step counts as persistent. Returns 0, or -1
 * with a message in err: the trace marks no such step and the next one, or
 * host memory ran out. */
int cuh_step_plan_trace(const cuh_trace_t *t, size_t step, uint64_t align, uint64_t page, cuh_step_plan_t *out,
                        char *err, size_t errlen);

#endif
