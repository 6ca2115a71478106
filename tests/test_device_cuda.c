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
#include "fake/fake_cuda.h"

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

/* The fake driver's function `name`. */
static void *driver(const char *name)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    assert_non_null(lib);
    void *fn = dlsym(lib, name);
    assert_non_null(fn);
    dlclose(lib);
    return fn;
}

/* Calls of the driver function `name` so far (the fake's counter). */
static unsigned long driver_calls(const char *name)
{
    fake_cuda_count_fn count;
    void *fn = driver("fake_cuda_count");
    memcpy(&count, &fn, sizeof fn);
    return count(name);
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
    /* Pages moved from free memory (they stay mapped where they were too:
     * kept mappings), fewer new than mapped, and mapped read-write. */
    assert_true(after[0] - before[0] > after[2] - before[2]);
    assert_true(after[4] > before[4]);
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

/* The fake driver's context calls a test makes itself. */
typedef struct ctx_calls_s {
    int (*init)(unsigned);
    int (*retain)(void **, int);
    int (*set_current)(void *);
    int (*get_current)(void **);
    int (*release)(int);
} ctx_calls_t;

static ctx_calls_t ctx_calls(void)
{
    ctx_calls_t c;
    void *sym = driver("cuInit");
    memcpy(&c.init, &sym, sizeof sym);
    sym = driver("cuDevicePrimaryCtxRetain");
    memcpy(&c.retain, &sym, sizeof sym);
    sym = driver("cuCtxSetCurrent");
    memcpy(&c.set_current, &sym, sizeof sym);
    sym = driver("cuCtxGetCurrent");
    memcpy(&c.get_current, &sym, sizeof sym);
    sym = driver("cuDevicePrimaryCtxRelease_v2");
    memcpy(&c.release, &sym, sizeof sym);
    return c;
}

/* Device 0's primary context retained, and made current on this thread or
 * none left current (as a thread the CUDA runtime has not set up). */
static void retain_primary(const ctx_calls_t *c, int current)
{
    void *ctx = NULL;
    assert_int_equal(c->init(0), 0);
    assert_int_equal(c->retain(&ctx, 0), 0);
    assert_int_equal(c->set_current(current ? ctx : NULL), 0);
}

/* The C API with CUHEAP_CURRENT_DEVICE asks for the thread's current context
 * on every call; once its primary context is known, nothing more: the
 * context's device is not asked for again (issue 45: a driver call per
 * allocation is a cost per tensor). */
static void test_current_device_costs_one_driver_call_once_its_context_is_known(void **state)
{
    (void)state;
    const ctx_calls_t c = ctx_calls();
    retain_primary(&c, 1);   /* as the CUDA runtime leaves a thread */
    void *p;
    assert_int_equal(cuheap_malloc(&p, 4096, CUHEAP_CURRENT_DEVICE, NULL), CUHEAP_OK);
    assert_int_equal(cuheap_free(p, CUHEAP_CURRENT_DEVICE, NULL), CUHEAP_OK);
    unsigned long all = driver_calls(NULL), current = driver_calls("cuCtxGetCurrent");
    for (int i = 0; i < 100; i++) {
        assert_int_equal(cuheap_malloc(&p, 4096, CUHEAP_CURRENT_DEVICE, NULL), CUHEAP_OK);
        assert_int_equal(cuheap_free(p, CUHEAP_CURRENT_DEVICE, NULL), CUHEAP_OK);
    }
    assert_int_equal(driver_calls("cuCtxGetCurrent") - current, 200);
    assert_int_equal(driver_calls(NULL) - all, 200);   /* no cuCtxGetDevice, nothing else */
    assert_int_equal(c.set_current(NULL), 0);
    assert_int_equal(c.release(0), 0);
}

/* Block p, freed device-wide, asked for again by a thread with no current
 * context: its fence is queried in the device's context, pushed and popped. */
static void freed_block_again_without_a_context(const ctx_calls_t *c, void *p)
{
    assert_int_equal(c->set_current(NULL), 0);
    const unsigned long queries = driver_calls("cuEventQuery"), pushes = driver_calls("cuCtxPushCurrent_v2");
    void *q;
    assert_int_equal(cuheap_malloc_device_wide(&q, MiB, 0), CUHEAP_OK);
    assert_ptr_equal(q, p);   /* the freed block, its fence queried */
    assert_true(driver_calls("cuEventQuery") > queries);
    assert_true(driver_calls("cuCtxPushCurrent_v2") > pushes);
    void *now = (void *)1;
    assert_int_equal(c->get_current(&now), 0);
    assert_null(now);   /* popped: the thread's own (none) is current again */
    assert_int_equal(cuheap_free_device_wide(q, 0), CUHEAP_OK);
}

/* A thread with no current context (a hooked cudaMalloc from a thread the
 * CUDA runtime has not yet set up) frees a block and asks for its size
 * again: the query of the block's fence runs inside the device's context,
 * pushed for it and popped after. A real driver may crash in cuEventQuery
 * with no current context (the GPU check's shared-runtime stress did, when
 * the query ran without one); the fake driver stops the process there. */
static void test_a_fence_query_from_a_thread_without_a_context_runs_in_the_devices(void **state)
{
    (void)state;
    const ctx_calls_t c = ctx_calls();
    retain_primary(&c, 0);
    void *p;
    assert_int_equal(cuheap_malloc_device_wide(&p, MiB, 0), CUHEAP_OK);
    assert_int_equal(cuheap_free_device_wide(p, 0), CUHEAP_OK);
    freed_block_again_without_a_context(&c, p);
    assert_int_equal(c.release(0), 0);
}

/* A hooked cudaMalloc that found the device's primary context current has
 * the device's calls take it to be (cuh_cuda_assume_current): its fence's
 * query asks no cuCtxGetCurrent. Once the call ends that, a query asks
 * again, and from a thread with none current runs in the device's context
 * (the fake driver stops the process on a query with no context). */
static void test_an_assumed_current_context_is_not_asked_for_and_ends_with_the_call(void **state)
{
    (void)state;
    const ctx_calls_t c = ctx_calls();
    retain_primary(&c, 1);
    void *p, *q;
    assert_int_equal(cuheap_malloc_device_wide(&p, MiB, 0), CUHEAP_OK);
    assert_int_equal(cuheap_free_device_wide(p, 0), CUHEAP_OK);
    const unsigned long gets = driver_calls("cuCtxGetCurrent"), queries = driver_calls("cuEventQuery");
    cuh_cuda_assume_current(0);
    assert_int_equal(cuheap_malloc_device_wide(&q, MiB, 0), CUHEAP_OK);
    cuh_cuda_assume_current(-1);
    assert_ptr_equal(q, p);   /* the freed block, its fence queried */
    assert_true(driver_calls("cuEventQuery") > queries);
    assert_int_equal(driver_calls("cuCtxGetCurrent"), gets);
    assert_int_equal(cuheap_free_device_wide(q, 0), CUHEAP_OK);
    freed_block_again_without_a_context(&c, p);
    assert_int_equal(c.release(0), 0);
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

/* The driver maps only a whole physical allocation (bench/gpu/vm_offset_probe.cu
 * on an H100): part of one, at offset 0 or past it, is NOT_SUPPORTED; the
 * whole one maps, a second time elsewhere too. The fake driver must refuse
 * as the driver does, or a heap that leans on partial maps passes here and
 * fails on a GPU. */
static void test_fake_driver_maps_only_whole_allocations_as_the_driver_does(void **state)
{
    (void)state;
    typedef int (*init_fn)(unsigned);
    typedef int (*create_fn)(unsigned long long *, size_t, const void *, unsigned long long);
    typedef int (*reserve_fn)(unsigned long long *, size_t, size_t, unsigned long long, unsigned long long);
    typedef int (*map_fn)(unsigned long long, size_t, size_t, unsigned long long, unsigned long long);
    typedef int (*unmap_fn)(unsigned long long, size_t);
    typedef int (*release_fn)(unsigned long long);
    init_fn init;
    create_fn create;
    reserve_fn reserve;
    map_fn map;
    unmap_fn unmap;
    release_fn release;
    void *f;
    f = driver("cuInit"), memcpy(&init, &f, sizeof f);
    f = driver("cuMemCreate"), memcpy(&create, &f, sizeof f);
    f = driver("cuMemAddressReserve"), memcpy(&reserve, &f, sizeof f);
    f = driver("cuMemMap"), memcpy(&map, &f, sizeof f);
    f = driver("cuMemUnmap"), memcpy(&unmap, &f, sizeof f);
    f = driver("cuMemRelease"), memcpy(&release, &f, sizeof f);
    assert_int_equal(init(0), 0);
    const int prop[8] = {1, 0, 1, 0};   /* pinned, on device 0 */
    unsigned long long h = 0, va = 0;
    assert_int_equal(create(&h, 8 * MiB, prop, 0), 0);
    assert_int_equal(reserve(&va, 32 * MiB, 0, 0, 0), 0);
    assert_int_equal(map(va, 2 * MiB, 0, h, 0), 801);             /* part, offset 0 */
    assert_int_equal(map(va, 2 * MiB, 2 * MiB, h, 0), 801);       /* part, past it */
    assert_int_equal(map(va, 8 * MiB, 2 * MiB, h, 0), 801);       /* whole size, shifted */
    assert_int_equal(map(va, 8 * MiB, 0, h, 0), 0);               /* whole */
    assert_int_equal(map(va + 16 * MiB, 8 * MiB, 0, h, 0), 0);    /* whole, again elsewhere */
    /* A range still mapped takes no other mapping, and an unmap takes whole
     * mappings: cuheap keeps the mappings of pages that moved and must unmap
     * one before mapping anything over it. */
    unsigned long long h2 = 0;
    assert_int_equal(create(&h2, 8 * MiB, prop, 0), 0);
    assert_int_equal(map(va, 8 * MiB, 0, h2, 0), 1);              /* over h's mapping */
    assert_int_equal(map(va + 4 * MiB, 8 * MiB, 0, h2, 0), 1);    /* over part of it */
    assert_int_equal(unmap(va, 2 * MiB), 1);                      /* part of a mapping */
    assert_int_equal(unmap(va + 8 * MiB, 8 * MiB), 1);            /* nothing mapped there */
    assert_int_equal(unmap(va, 8 * MiB), 0);
    assert_int_equal(map(va, 8 * MiB, 0, h2, 0), 0);              /* the range is free again */
    assert_int_equal(unmap(va, 8 * MiB), 0);
    assert_int_equal(unmap(va + 16 * MiB, 8 * MiB), 0);
    assert_int_equal(release(h), 0);
    assert_int_equal(release(h2), 0);
}

static void *fake_symbol(const char *name)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    assert_non_null(lib);
    void *f = dlsym(lib, name);
    assert_non_null(f);
    dlclose(lib);   /* still loaded: cuheap holds it */
    return f;
}

/* A stream frees two pages while kernels that read them are still queued,
 * then needs a block of two pages under a limit of four. The pages move at
 * once (the CPU does not wait: no queued kernel runs), and the queued
 * kernels still read the old data through the old mappings, which stay
 * until they have run (unmapped, they would fault here as on a GPU). The
 * new block's kernels, queued after them on the same stream, see the new
 * block's data: one physical page, two mappings, the stream's order. */
static void test_vmm_lent_pages_keep_old_mappings_until_queued_work_ran(void **state)
{
    (void)state;
    fake_cuda_hold_fn hold = (fake_cuda_hold_fn)fake_symbol("fake_cuda_hold");
    fake_cuda_enqueue_check_fn check = (fake_cuda_enqueue_check_fn)fake_symbol("fake_cuda_enqueue_check");
    fake_cuda_enqueue_fill_fn enqueue_fill = (fake_cuda_enqueue_fill_fn)fake_symbol("fake_cuda_enqueue_fill");
    fake_cuda_complete_all_fn complete_all = (fake_cuda_complete_all_fn)fake_symbol("fake_cuda_complete_all");
    fake_cuda_corrupt_bytes_fn corrupt = (fake_cuda_corrupt_bytes_fn)fake_symbol("fake_cuda_corrupt_bytes");
    fake_cuda_calls_fn calls = (fake_cuda_calls_fn)fake_symbol("fake_cuda_calls");
    int (*stream_create)(void **, unsigned) = (int (*)(void **, unsigned))fake_symbol("cuStreamCreate");
    assert_int_equal(cuheap_configure("vmm:1,vmm_margin:0,small_max:0,limit:8M"), CUHEAP_OK);
    void *s = NULL;
    assert_int_equal(stream_create(&s, 1), 0);
    void *a[4];
    for (unsigned i = 0; i < 4; i++) {
        assert_int_equal(cuheap_malloc(&a[i], 2 * MiB, 0, s), CUHEAP_OK);
        memset(a[i], 0x10 + (int)i, 2 * MiB);
    }
    hold(1);
    for (unsigned i = 0; i < 4; i += 2)
        assert_int_equal(check(s, a[i], 2 * MiB, (unsigned char)(0x10 + i)), 0);
    for (unsigned i = 0; i < 4; i += 2)
        assert_int_equal(cuheap_free(a[i], 0, s), CUHEAP_OK);
    unsigned long before[5], after[5];
    fake_cuda_calls_t c0, c;
    calls(&c0);
    fake_counters(before);
    void *b = NULL;
    assert_int_equal(cuheap_malloc(&b, 4 * MiB, 0, s), CUHEAP_OK);
    fake_counters(after);
    calls(&c);
    assert_int_equal(c.kernels_run, c0.kernels_run);   /* nobody waited for the queued kernels */
    assert_int_equal(after[2], before[2]);       /* no new page: two moved */
    assert_int_equal(after[0] - before[0], 2);
    assert_int_equal(after[1], before[1]);       /* the old mappings stay */
    assert_int_equal(enqueue_fill(s, b, 4 * MiB, 0x55), 0);
    assert_int_equal(check(s, b, 4 * MiB, 0x55), 0);
    complete_all();
    calls(&c);
    assert_int_equal(c.kernels_run - c0.kernels_run, 3);
    assert_int_equal(corrupt(), 0);
    const unsigned char *live1 = a[1], *live3 = a[3];
    assert_true(live1[0] == 0x11 && live1[2 * MiB - 1] == 0x11 && live3[0] == 0x13 && live3[2 * MiB - 1] == 0x13);
    hold(0);
    /* The drained old mappings are kept ones now; the next block that needs
     * pages gets the freed ones moved, and writing it changes no other
     * block's data. */
    void *d = NULL;
    assert_int_equal(cuheap_free(a[1], 0, s), CUHEAP_OK);
    assert_int_equal(cuheap_free(a[3], 0, s), CUHEAP_OK);
    assert_int_equal(cuheap_malloc(&d, 4 * MiB, 0, s), CUHEAP_OK);
    fake_counters(after);
    assert_int_equal(after[2], before[2]);   /* still no new page */
    memset(d, 0x66, 4 * MiB);
    const unsigned char *bb = b;
    assert_true(bb[0] == 0x55 && bb[4 * MiB - 1] == 0x55);
    assert_int_equal(cuheap_free(d, 0, s), CUHEAP_OK);
    assert_int_equal(cuheap_free(b, 0, s), CUHEAP_OK);
    assert_int_equal(cuheap_stream_retire(0, s), CUHEAP_OK);
    assert_int_equal(cuheap_release_cached(0), CUHEAP_OK);
    fake_counters(after);
    assert_int_equal(after[2], after[3]);   /* every physical page went back */
}

/* A context that cannot synchronize is lost to cuheap, whatever the error
 * (device.h): the device's `lost` takes the driver's code, sticky or not,
 * and a failure of any other call that is not sticky leaves it alone. */
static void test_a_failed_synchronize_loses_the_device(void **state)
{
    (void)state;
    typedef int (*faults_fn)(const char *);
    faults_fn faults;
    void *sym = driver("fake_cuda_faults");
    memcpy(&faults, &sym, sizeof sym);
    char err[256];
    cuh_device_t *dev = cuh_cuda_open(0, err, sizeof err);
    assert_non_null(dev);
    cuh_event_t e = NULL;
    char plan[96];   /* a rule counts calls from the process's start */
    snprintf(plan, sizeof plan, "cuEventCreate@%lu=1", driver_calls("cuEventCreate") + 1);   /* invalid value */
    assert_int_equal(faults(plan), 0);
    assert_int_equal(dev->ops->event_create(dev, &e), CUH_DEV_ERROR);
    assert_int_equal(dev->lost, 0);
    snprintf(plan, sizeof plan, "cuCtxSynchronize@%lu=999", driver_calls("cuCtxSynchronize") + 1);   /* unknown */
    assert_int_equal(faults(plan), 0);
    assert_int_equal(dev->ops->synchronize(dev), CUH_DEV_ERROR);
    assert_non_null(strstr(cuh_dev_error_text(dev), "cuCtxSynchronize"));
    assert_int_equal(dev->lost, 999);
    assert_int_equal(faults(""), 0);
    dev->ops->destroy(dev);
}

int main(void)
{
    char capacity[32];
    snprintf(capacity, sizeof capacity, "%zu", FAKE_CAPACITY);
    setenv("FAKE_CUDA_CAPACITY", capacity, 1);
    unsetenv("CUHEAP_CONF");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_driver_path_serves_blocks_that_hold_data, setup, teardown),
        cmocka_unit_test_setup_teardown(test_current_device_costs_one_driver_call_once_its_context_is_known, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_a_fence_query_from_a_thread_without_a_context_runs_in_the_devices, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_an_assumed_current_context_is_not_asked_for_and_ends_with_the_call, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_fake_driver_maps_only_whole_allocations_as_the_driver_does, setup, teardown),
        cmocka_unit_test_setup_teardown(test_vmm_moves_pages_and_every_block_keeps_its_data, setup, teardown),
        cmocka_unit_test_setup_teardown(test_vmm_pages_of_two_granules_move_whole_and_keep_data, setup, teardown),
        cmocka_unit_test_setup_teardown(test_vmm_lent_pages_keep_old_mappings_until_queued_work_ran, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_failed_synchronize_loses_the_device, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
