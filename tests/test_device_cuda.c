/* test_device_cuda.c - the real driver path (src/device_cuda.c, loaded with
 * dlopen("libcuda.so.1")) against tests/fake/fake_cuda.c, a stand-in driver
 * whose device memory is host memory: blocks handed out by the public API
 * hold data; with vmm:1, pages moved behind a new block (unmapped from free
 * memory, mapped again) carry the new block's data while the live blocks
 * around them keep theirs; everything goes back to the driver on release.
 * The test binary finds the fake driver through its run path.
 */
#include "test_util.h"

#include "runtime.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#define FAKE_CAPACITY (72 * MiB)

static void fake_counters(unsigned long out[5])
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    assert_non_null(lib);
    void (*counters)(unsigned long *) = (void (*)(unsigned long *))dlsym(lib, "fake_cuda_counters");
    assert_non_null(counters);
    counters(out);
    dlclose(lib);
}

static void fill(void *p, size_t n, unsigned seed)
{
    uint32_t *w = p;
    for (size_t i = 0; i < n / 4; i++)
        w[i] = seed * 2654435761u + (uint32_t)i;
}

static int intact(const void *p, size_t n, unsigned seed)
{
    const uint32_t *w = p;
    for (size_t i = 0; i < n / 4; i++)
        if (w[i] != seed * 2654435761u + (uint32_t)i)
            return 0;
    return 1;
}

static int setup(void **state)
{
    (void)state;
    cuh_runtime_reset();
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    cuh_runtime_reset();
    return 0;
}

static void test_driver_path_serves_blocks_that_hold_data(void **state)
{
    (void)state;
    static const size_t sizes[] = {1000, 100 * 1000, 3 * MiB + 7, 40 * MiB};
    void *p[4];
    for (unsigned i = 0; i < 4; i++) {
        assert_int_equal(cuheap_malloc(&p[i], sizes[i], 0, NULL), CUHEAP_OK);
        assert_int_equal((uintptr_t)p[i] % 512, 0);
        fill(p[i], sizes[i], i + 1);
    }
    for (unsigned i = 0; i < 4; i++)
        assert_true(intact(p[i], sizes[i], i + 1));
    cuheap_stats_t s;
    cuheap_get_stats(0, &s);
    assert_int_equal(s.device_total, FAKE_CAPACITY);
    for (unsigned i = 0; i < 4; i++)
        assert_int_equal(cuheap_free(p[i], 0, NULL), CUHEAP_OK);
    void *big;
    assert_int_equal(cuheap_malloc(&big, 100 * MiB, 0, NULL), CUHEAP_ERR_OUT_OF_MEMORY);
    assert_non_null(strstr(cuheap_last_error(), "cause: capacity"));
    assert_int_equal(cuheap_release_cached(0), CUHEAP_OK);
    cuheap_get_stats(0, &s);
    assert_int_equal(s.reserved.current, 0);
}

/* 64 MiB of `hole`-byte blocks, every other one freed: 32 MiB free in
 * holes, 8 MiB of device left. Four 8 MiB blocks fit only if free pages move
 * behind them, and every block must keep its data through the moves. */
static void moves_pages_and_keeps_data(const char *conf, size_t hole)
{
    assert_int_equal(cuheap_configure(conf), CUHEAP_OK);
    unsigned long before[5], after[5];
    enum { MOST = 32 };
    unsigned n = (unsigned)(64 * MiB / hole);
    assert_true(n <= MOST);
    void *a[MOST];
    for (unsigned i = 0; i < n; i++) {
        assert_int_equal(cuheap_malloc(&a[i], hole, 0, NULL), CUHEAP_OK);
        fill(a[i], hole, 100 + i);
    }
    for (unsigned i = 0; i < n; i += 2)
        assert_int_equal(cuheap_free(a[i], 0, NULL), CUHEAP_OK);
    fake_counters(before);
    void *b[4];
    for (unsigned i = 0; i < 4; i++) {
        cuheap_status_t st = cuheap_malloc(&b[i], 8 * MiB, 0, NULL);
        if (st != CUHEAP_OK)
            fail_msg("%s: 8 MiB block %u: %s", conf, i, cuheap_last_error());
        fill(b[i], 8 * MiB, 200 + i);
    }
    fake_counters(after);
    assert_true(after[1] > before[1]);   /* pages were unmapped from free memory */
    assert_true(after[4] > before[4]);   /* and mapped again read-write */
    for (unsigned i = 0; i < 4; i++)
        assert_true(intact(b[i], 8 * MiB, 200 + i));
    for (unsigned i = 1; i < n; i += 2)
        assert_true(intact(a[i], hole, 100 + i));
    cuheap_stats_t s;
    cuheap_get_stats(0, &s);
    assert_true(s.reserved.peak <= FAKE_CAPACITY);
    for (unsigned i = 0; i < 4; i++)
        assert_int_equal(cuheap_free(b[i], 0, NULL), CUHEAP_OK);
    for (unsigned i = 1; i < n; i += 2)
        assert_int_equal(cuheap_free(a[i], 0, NULL), CUHEAP_OK);
    assert_int_equal(cuheap_release_cached(0), CUHEAP_OK);
    cuheap_get_stats(0, &s);
    assert_int_equal(s.reserved.current, 0);
    fake_counters(after);
    assert_int_equal(after[2], after[3]);   /* every physical page went back */
}

static void test_vmm_moves_pages_and_every_block_keeps_its_data(void **state)
{
    (void)state;
    moves_pages_and_keeps_data("vmm:1,vmm_margin:0,small_max:0", 2 * MiB);
}

/* The same with 4 MiB pages: each page is one physical allocation of two
 * granules, created, mapped and moved as one piece. */
static void test_vmm_pages_of_two_granules_move_whole_and_keep_data(void **state)
{
    (void)state;
    moves_pages_and_keeps_data("vmm:1,vmm_margin:0,small_max:0,vmm_page:4M", 4 * MiB);
}

int main(void)
{
    char capacity[32];
    snprintf(capacity, sizeof capacity, "%zu", FAKE_CAPACITY);
    setenv("FAKE_CUDA_CAPACITY", capacity, 1);
    unsetenv("CUHEAP_CONF");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_driver_path_serves_blocks_that_hold_data, setup, teardown),
        cmocka_unit_test_setup_teardown(test_vmm_moves_pages_and_every_block_keeps_its_data, setup, teardown),
        cmocka_unit_test_setup_teardown(test_vmm_pages_of_two_granules_move_whole_and_keep_data, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
