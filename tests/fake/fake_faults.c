/* fake_faults.c - the fake driver's fault plan: driver calls that fail on
 * purpose, so that tests see what cuheap (and through it, the program) does
 * when a real driver call fails.
 *
 * The plan comes from FAKE_CUDA_FAULTS when the driver is first called, or
 * from fake_cuda_faults() at any time; rules separated by commas:
 *   NAME@N=CODE    the N-th call of driver function NAME (counted from the
 *                  process's start) returns CODE
 *   NAME%P=CODE    each call of NAME returns CODE with probability P (0 to 1;
 *                  draws seeded by FAKE_CUDA_FAULT_SEED, default 1)
 *   sticky@N=CODE  from the N-th call of any driver function on, every call
 *                  returns CODE: a lost context (an illegal address), as
 *                  CUDA's sticky errors do; the calls that only read or set
 *                  the calling thread's current context still answer, as
 *                  they do after a real sticky error
 * A call that fails does nothing, as a failed driver call does nothing.
 * cuGetErrorName, cuGetErrorString and cuGetProcAddress never fail: a real
 * driver answers them after a sticky error too. A malformed plan stops the
 * process with a message naming the rule (a test's mistake, not a result).
 */
#define _GNU_SOURCE
#include "fake_cuda.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RULES 32

typedef struct rule_s {
    char name[48];
    unsigned long nth;        /* 0: the random rule */
    double probability;
    int code;
} rule_t;

static pthread_mutex_t plan_lock = PTHREAD_MUTEX_INITIALIZER;
static rule_t rules[MAX_RULES];
static int num_rules;
static unsigned long sticky_from;   /* 0: none */
static int sticky_code;
static unsigned long calls_seen;     /* calls that could fail, for the sticky rule */
static unsigned long long rng = 1;
static unsigned long injected;
static int loaded;
/* The plan is loaded and empty: nothing to count, nothing to fail. Read
 * without the lock at every driver call, so that the fake driver's own cost
 * per call (which bench/bench_per_tensor.c counts in) stays what a driver's
 * is, not a lock and a dozen string compares. */
static _Atomic int quiet;

static double draw(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) * 0x1.0p-53;
}

/* Parses `spec` into the plan; -1 with a message on stderr if malformed. */
static int parse_locked(const char *spec)
{
    num_rules = 0;
    sticky_from = 0;
    char buf[1024];
    if (strlen(spec) >= sizeof buf) {
        fprintf(stderr, "fake libcuda: FAKE_CUDA_FAULTS is too long\n");
        return -1;
    }
    strcpy(buf, spec);
    char *save = NULL;
    for (char *r = strtok_r(buf, ",", &save); r; r = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(r, '='), *at = strchr(r, '@'), *pct = strchr(r, '%');
        char *sep = at ? at : pct;
        char *end = NULL;
        if (!eq || !sep || sep > eq || sep == r || (size_t)(sep - r) >= sizeof rules[0].name || num_rules == MAX_RULES)
            goto bad;
        long code = strtol(eq + 1, &end, 10);
        if (end == eq + 1 || *end || code <= 0)
            goto bad;
        *eq = '\0';
        if (at && strncmp(r, "sticky", (size_t)(sep - r)) == 0 && sep - r == 6) {
            sticky_from = strtoul(sep + 1, &end, 10);
            if (end == sep + 1 || *end || !sticky_from)
                goto bad;
            sticky_code = (int)code;
            continue;
        }
        rule_t *x = &rules[num_rules];
        memset(x, 0, sizeof *x);
        memcpy(x->name, r, (size_t)(sep - r));
        x->code = (int)code;
        if (at) {
            x->nth = strtoul(sep + 1, &end, 10);
            if (end == sep + 1 || *end || !x->nth)
                goto bad;
        } else {
            x->probability = strtod(sep + 1, &end);
            if (end == sep + 1 || *end || !(x->probability >= 0 && x->probability <= 1))
                goto bad;
        }
        num_rules++;
        continue;
    bad:
        fprintf(stderr, "fake libcuda: bad fault rule '%s' (expected NAME@N=CODE, NAME%%P=CODE or sticky@N=CODE)\n",
                r);
        num_rules = 0;   /* a malformed plan is no plan */
        sticky_from = 0;
        return -1;
    }
    return 0;
}

static void set_quiet_locked(void)
{
    atomic_store_explicit(&quiet, loaded && !num_rules && !sticky_from, memory_order_release);
}

static void load_locked(void)
{
    if (loaded)
        return;
    loaded = 1;
    const char *seed = getenv("FAKE_CUDA_FAULT_SEED");
    if (seed && *seed)
        rng = strtoull(seed, NULL, 10) * 0x9e3779b97f4a7c15ull + 1;
    const char *spec = getenv("FAKE_CUDA_FAULTS");
    if (spec && *spec && parse_locked(spec) != 0)
        abort();
    set_quiet_locked();
}

/* The calls that only read or set the calling thread's current context or
 * name a device: a real driver answers them after a sticky error too. */
static int thread_context_call(const char *name)
{
    static const char *const names[] = {"cuCtxGetCurrent", "cuCtxSetCurrent", "cuCtxGetDevice", "cuCtxPushCurrent_v2",
                                        "cuCtxPopCurrent_v2", "cuDeviceGet", "cuDeviceGetCount"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(name, names[i]) == 0)
            return 1;
    return 0;
}

int fake_fault_planned(const char *name, unsigned long nth)
{
    if (atomic_load_explicit(&quiet, memory_order_acquire))
        return 0;
    if (strcmp(name, "cuGetErrorName") == 0 || strcmp(name, "cuGetErrorString") == 0 ||
        strncmp(name, "cuGetProcAddress", 16) == 0 || strcmp(name, "lookup") == 0)
        return 0;
    pthread_mutex_lock(&plan_lock);
    load_locked();
    int code = 0;
    calls_seen++;
    if (sticky_from && calls_seen >= sticky_from && !thread_context_call(name))
        code = sticky_code;
    for (int i = 0; i < num_rules && !code; i++) {
        const rule_t *x = &rules[i];
        if (strcmp(x->name, name) != 0)
            continue;
        if (x->nth ? nth == x->nth : draw() < x->probability)
            code = x->code;
    }
    injected += code != 0;
    pthread_mutex_unlock(&plan_lock);
    if (code && getenv("FAKE_CUDA_FAULTS_VERBOSE"))
        fprintf(stderr, "fake libcuda: %s (call %lu) fails with %d on purpose\n", name, nth, code);
    return code;
}

__attribute__((visibility("default"))) int fake_cuda_faults(const char *spec)
{
    pthread_mutex_lock(&plan_lock);
    loaded = 1;
    int rc = parse_locked(spec ? spec : "");
    calls_seen = 0;
    set_quiet_locked();
    pthread_mutex_unlock(&plan_lock);
    return rc;
}

__attribute__((visibility("default"))) unsigned long fake_cuda_faults_injected(void)
{
    pthread_mutex_lock(&plan_lock);
    unsigned long n = injected;
    pthread_mutex_unlock(&plan_lock);
    return n;
}
