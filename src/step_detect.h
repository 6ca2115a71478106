/* step_detect.h - a program's steps, found in its allocations when it marks
 * none.
 *
 * Step plans (heap_plan.c) lay out a step the program has repeated, and a
 * step ends where the program says (cuheap_mark_step: cuheap's PyTorch
 * package marks every optimizer step). A program under LD_PRELOAD, or one
 * calling the C API, says nothing, yet a training loop asks for the same
 * blocks in the same order every step. This module finds that order: fed
 * each block allocation's key (its size and lane), it finds the period P
 * with which the keys repeat, and says where each step of P allocations
 * begins.
 *
 * A step is a period that
 *   - repeats in full: the last P keys equal the P before them (their run,
 *     the keys in a row that equal the key P before, has reached P);
 *   - leaves the heap as it found it: the live bytes of blocks before the
 *     allocation equal those one period before (a transformer's layers
 *     repeat within its forward pass, but each keeps its activations, so a
 *     layer is no step);
 *   - of those, has the longest run (the whole step outruns any part of it
 *     that repeats: micro-batches within an accumulation step, a loop over
 *     equal layers in the optimizer);
 *   - has at least 16 allocations (loops of a few allocations are the
 *     commonest false step).
 * Until the whole step has repeated, a part of it that repeats and leaves
 * the live bytes as it found them (micro-batches, a loop over equal layers)
 * may be taken for the step; it gives way when it breaks, to the whole
 * step once that has repeated.
 * Candidate periods come from earlier places where the last WINDOW keys
 * were the same (a chain per hash of the window); each keeps its run while
 * it holds and goes when a key differs. The period in force ends when its
 * run breaks, and the longest candidate that qualifies takes over at once.
 * The phase of the steps (which allocation begins one) is where the period
 * took force: a plan lays out any phase of a repeating sequence (a life
 * that crosses the boundary wraps round).
 *
 * Cost: a hash of WINDOW keys, a hash-table update and a comparison per
 * live candidate at each block allocation; memory: 32 bytes per
 * allocation of the longest step it can find (`history`).
 */
#ifndef CUH_STEP_DETECT_H
#define CUH_STEP_DETECT_H

#include <stddef.h>
#include <stdint.h>

#define CUH_DETECT_CANDIDATES 48

typedef struct cuh_detect_candidate_s {
    uint64_t period;   /* allocations */
    uint64_t run;      /* keys in a row equal to the key `period` before, up to the latest */
} cuh_detect_candidate_t;

typedef struct cuh_step_detect_s {
    uint64_t *keys;    /* ring: the key of allocation i at [i & mask] */
    uint64_t *live;    /* ring: live bytes of blocks before allocation i */
    uint64_t *chain;   /* ring: 1 + the allocation before i whose window hashed alike, 0 none */
    uint64_t *heads;   /* window hash (as many slots as the history) -> 1 + its latest allocation, 0 none */
    uint64_t mask;     /* the history's length less one (a power of two) */
    uint64_t n;        /* allocations seen */
    cuh_detect_candidate_t cand[CUH_DETECT_CANDIDATES];
    size_t num_cand;
    uint64_t period;   /* the step in force, in allocations; 0 none */
    uint64_t next;     /* the allocation that begins the next step */
    uint64_t steps;    /* step starts said */
} cuh_step_detect_t;

/* Sets d up to find steps of up to `history` allocations (rounded up to a
 * power of two). 0, or -1 when host memory runs out (d then finds none). */
int cuh_step_detect_init(cuh_step_detect_t *d, size_t history);
void cuh_step_detect_free(cuh_step_detect_t *d);

/* The next block allocation: its key (size and lane, hashed by the caller
 * or not) and the live bytes of blocks before it. 1 if a step begins with
 * it (the step before ends just before it). */
int cuh_step_detect_push(cuh_step_detect_t *d, uint64_t key, uint64_t live);

#endif
