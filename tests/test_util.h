/* test_util.h - shared helpers for cuheap's unit tests (cmocka).
 *
 * A test heap sits on a simulated device; heap_ok() asserts that every
 * invariant of the heap's books holds (cuh_heap_check), so a test can check
 * the whole structure after each step, not only the value it cares about.
 */
#ifndef CUH_TEST_UTIL_H
#define CUH_TEST_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "device.h"
#include "heap.h"
#include "runtime.h"

#define GiB ((size_t)1 << 30)
#define MiB ((size_t)1 << 20)
#define KiB ((size_t)1 << 10)

typedef struct test_heap_s {
    cuh_device_t *dev;
    cuh_heap_t *heap;
} test_heap_t;

/* The settings of a test heap: the defaults, then `conf` (NULL: nothing).
 * The heap's rules are tested on plain segments unless `conf` says vmm:1
 * (test_heap_vmm.c, the fuzz targets): the default, vmm:1, is test_config's
 * and test_api's, and the rules of plain segments still hold under vmm:0. */
static inline cuh_config_t test_config(const char *conf)
{
    char err[512] = "";
    cuh_config_t cfg;
    cuh_config_defaults(&cfg);
    cfg.vmm = 0;
    if (conf && cuh_config_parse(conf, &cfg, err, sizeof err))
        fail_msg("bad test settings '%s': %s", conf, err);
    return cfg;
}

/* A heap with settings `conf` (test_config) on a simulated device made with
 * `params`. */
static inline test_heap_t test_heap_on(const cuh_sim_params_t *params, const char *conf)
{
    test_heap_t t;
    char err[512] = "";
    cuh_config_t cfg = test_config(conf);
    t.dev = cuh_sim_create(params);
    assert_non_null(t.dev);
    t.heap = cuh_heap_create(t.dev, &cfg, err, sizeof err);
    if (!t.heap)
        fail_msg("heap creation failed: %s", err);
    return t;
}

/* A heap on a simulated device of `capacity` bytes with settings `conf`. */
static inline test_heap_t test_heap_new(size_t capacity, const char *conf)
{
    return test_heap_on(&(cuh_sim_params_t){.capacity = capacity, .ordinal = 0}, conf);
}

static inline void test_heap_free(test_heap_t *t)
{
    /* Every time the heap made the CPU wait for the (simulated) GPU, an
     * event wait or a device synchronize, is in its count, and no other. */
    cuheap_stats_t st;
    cuh_heap_stats(t->heap, &st);
    cuh_sim_counters_t c;
    cuh_sim_counters(t->dev, &c);
    assert_int_equal(st.num_cpu_waits, c.event_waits + c.synchronizes);
    cuh_heap_destroy(t->heap);
    cuh_sim_counters(t->dev, &c);
    /* Destroying the heap must return every segment and event. */
    assert_int_equal(c.used, 0);
    assert_int_equal(c.live_events, 0);
    t->dev->ops->destroy(t->dev);
}

#define heap_ok(h)                                      \
    do {                                                \
        char msg_[512];                                 \
        if (cuh_heap_check((h), msg_, sizeof msg_))     \
            fail_msg("heap books unsound: %s", msg_);   \
    } while (0)

/* Everything the test allocated is freed: nothing allocated, as many frees
 * as allocations, and sound books. */
#define all_freed(h)                                        \
    do {                                                    \
        cuheap_stats_t st_;                                 \
        cuh_heap_stats((h), &st_);                          \
        assert_int_equal(st_.allocated.current, 0);         \
        assert_int_equal(st_.num_allocs, st_.num_frees);    \
        heap_ok(h);                                         \
    } while (0)

static inline uintptr_t must_alloc(cuh_heap_t *h, size_t size, cuh_stream_t s)
{
    uintptr_t a = 0;
    cuheap_status_t rc = cuh_heap_malloc(h, size, s, &a);
    if (rc != CUHEAP_OK)
        fail_msg("malloc(%zu, stream %lu) failed: %s: %s", size, (unsigned long)s, cuheap_status_string(rc),
                 cuheap_last_error());
    assert_true(a != 0);
    return a;
}

static inline void must_free(cuh_heap_t *h, uintptr_t a, cuh_stream_t s)
{
    cuheap_status_t rc = cuh_heap_free(h, a, s);
    if (rc != CUHEAP_OK)
        fail_msg("free(0x%lx) failed: %s: %s", (unsigned long)a, cuheap_status_string(rc), cuheap_last_error());
}

/* Deterministic pseudo-random numbers (xorshift64*). */
static inline uint64_t test_rand(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 0x2545F4914F6CDD1Dull;
}

/* One seeded edit of text[0..*len) (room for cap bytes, kept NUL-terminated)
 * for tests that feed readers broken input: a byte changed to one of
 * `alphabet`, a byte deleted, one inserted, or the text cut there. */
static inline void test_mutate_once(char *text, size_t *len, size_t cap, const char *alphabet, uint64_t *seed)
{
    size_t n = strlen(alphabet);
    if (*len == 0)
        return;
    size_t at = (size_t)(test_rand(seed) % *len);
    switch (test_rand(seed) % 4) {
    case 0:
        text[at] = alphabet[test_rand(seed) % n];
        break;
    case 1:
        memmove(text + at, text + at + 1, *len - at - 1);
        (*len)--;
        break;
    case 2:
        if (*len + 2 <= cap) {
            memmove(text + at + 1, text + at, *len - at);
            text[at] = alphabet[test_rand(seed) % n];
            (*len)++;
        }
        break;
    default:
        *len = at;
        break;
    }
    text[*len] = '\0';
}

/* Setup and teardown for tests of the public API: the process-wide runtime,
 * reset, on a 4 GiB simulated device, with no CUHEAP_CONF from outside. */
static inline int runtime_on_sim_setup(void **state)
{
    (void)state;
    cuh_runtime_reset();
    unsetenv("CUHEAP_CONF");
    return cuh_runtime_use_sim(4 * GiB);
}

static inline int runtime_teardown(void **state)
{
    (void)state;
    cuh_runtime_reset();
    return 0;
}

#endif /* CUH_TEST_UTIL_H */
