/* step_detect.c - a program's steps, found in its allocations when it marks
 * none (step_detect.h says what a step is and why).
 */
#include "step_detect.h"

#include <stdlib.h>
#include <string.h>

/* Keys in a row that name a place to compare with: long enough that a hash
 * of them seldom meets another place of the step by chance. */
#define WINDOW 8
/* Earlier places with the same window looked at per allocation: most recent
 * first, stopping at the first period already a candidate (the ones before
 * it came in at earlier allocations). */
#define CHAIN 16
/* The fewest allocations a step may have. Loops of a few allocations inside
 * a step (an optimizer over equal layers) are the commonest false step, and
 * a step with fewer blocks gains little from a plan. */
#define MIN_PERIOD (2 * WINDOW)

static uint64_t pow2_at_least(uint64_t x)
{
    uint64_t p = 1;
    while (p < x)
        p <<= 1;
    return p;
}

int cuh_step_detect_init(cuh_step_detect_t *d, size_t history)
{
    memset(d, 0, sizeof *d);
    const uint64_t cap = pow2_at_least(history < 2 * WINDOW ? 2 * WINDOW : history);
    d->keys = malloc(cap * sizeof *d->keys);
    d->live = malloc(cap * sizeof *d->live);
    d->chain = calloc(cap, sizeof *d->chain);
    d->heads = calloc(cap, sizeof *d->heads);
    if (!d->keys || !d->live || !d->chain || !d->heads) {
        cuh_step_detect_free(d);
        return -1;
    }
    d->mask = cap - 1;
    return 0;
}

void cuh_step_detect_free(cuh_step_detect_t *d)
{
    free(d->keys);
    free(d->live);
    free(d->chain);
    free(d->heads);
    memset(d, 0, sizeof *d);
}

static uint64_t window_hash(const cuh_step_detect_t *d, uint64_t i)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint64_t t = 0; t < WINDOW; t++) {
        h ^= d->keys[(i - t) & d->mask];
        h *= 0x100000001b3ull;
        h ^= h >> 29;
    }
    return h;
}

static int windows_equal(const cuh_step_detect_t *d, uint64_t i, uint64_t j)
{
    for (uint64_t t = 0; t < WINDOW; t++)
        if (d->keys[(i - t) & d->mask] != d->keys[(j - t) & d->mask])
            return 0;
    return 1;
}

static int is_candidate(const cuh_step_detect_t *d, uint64_t period)
{
    for (size_t k = 0; k < d->num_cand; k++)
        if (d->cand[k].period == period)
            return 1;
    return 0;
}

/* Adds a period with its window's run; when the candidates are full, it
 * takes the place of the one with the shortest run (not the step in force):
 * a period that has just come into view may be the step, which a long run
 * of a part of it would otherwise keep out. */
static void add_candidate(cuh_step_detect_t *d, uint64_t period)
{
    if (d->num_cand < CUH_DETECT_CANDIDATES) {
        d->cand[d->num_cand++] = (cuh_detect_candidate_t){.period = period, .run = WINDOW};
        return;
    }
    size_t shortest = SIZE_MAX;
    for (size_t k = 0; k < d->num_cand; k++)
        if (d->cand[k].period != d->period && (shortest == SIZE_MAX || d->cand[k].run < d->cand[shortest].run))
            shortest = k;
    if (shortest != SIZE_MAX)
        d->cand[shortest] = (cuh_detect_candidate_t){.period = period, .run = WINDOW};
}

/* Allocation i's window: it joins its hash's chain, and the places before it
 * with the same keys become candidates. */
static void find_candidates(cuh_step_detect_t *d, uint64_t i)
{
    const uint64_t slot = window_hash(d, i) & d->mask;
    uint64_t j1 = d->heads[slot];
    d->chain[i & d->mask] = j1;
    d->heads[slot] = i + 1;
    for (int steps = 0; j1 && steps < CHAIN; steps++) {
        const uint64_t j = j1 - 1, period = i - j;
        if (period > d->mask)
            break;   /* out of the history: what the chain says there is overwritten */
        if (windows_equal(d, i, j)) {
            if (is_candidate(d, period))
                break;
            add_candidate(d, period);
        }
        j1 = d->chain[j & d->mask];
    }
}

int cuh_step_detect_push(cuh_step_detect_t *d, uint64_t key, uint64_t live)
{
    if (!d->keys)
        return 0;
    const uint64_t i = d->n++;
    d->keys[i & d->mask] = key;
    d->live[i & d->mask] = live;
    /* Runs go on or end. */
    size_t kept = 0;
    int broke = 0;
    for (size_t k = 0; k < d->num_cand; k++) {
        cuh_detect_candidate_t c = d->cand[k];
        if (c.period <= i && d->keys[(i - c.period) & d->mask] == key) {
            c.run++;
            d->cand[kept++] = c;
        } else if (c.period == d->period) {
            broke = 1;
        }
    }
    d->num_cand = kept;
    if (broke)
        d->period = 0;   /* the step changed */
    if (i + 1 >= WINDOW)
        find_candidates(d, i);
    if (!d->period) {
        /* The longest run of a period that repeated in full and leaves the
         * live bytes as it found them. */
        const cuh_detect_candidate_t *best = NULL;
        for (size_t k = 0; k < d->num_cand; k++) {
            const cuh_detect_candidate_t *c = &d->cand[k];
            if (c->run < c->period || c->period < MIN_PERIOD ||
                d->live[i & d->mask] != d->live[(i - c->period) & d->mask])
                continue;
            if (!best || c->run > best->run || (c->run == best->run && c->period < best->period))
                best = c;
        }
        if (best) {
            d->period = best->period;
            d->next = i + 1;
        }
        return 0;
    }
    if (i == d->next) {
        d->next += d->period;
        d->steps++;
        return 1;
    }
    return 0;
}
