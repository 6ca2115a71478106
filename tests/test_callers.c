/* test_callers.c - tests of device memory by caller (src/callers.c).
 *
 * Names: a library gets one number whatever directory its path carries,
 * NULL and empty names get none, and after 31 libraries the rest share the
 * last number, "other libraries". Counting: live bytes, the peak of each
 * library and its allocations follow allocs and frees; a free of an address
 * never recorded changes nothing; an address recorded again without a free
 * between (a free that was missed) counts once; a device's reset takes its
 * blocks out of the live bytes, even from long probe runs of the maps, and
 * leaves other devices' alone. The snapshot lists the most bytes live
 * first and leaves out libraries that never allocated. The out-of-memory
 * summary names the three with the most bytes live, counts the rest, says
 * nothing when none holds any, and is cut to its buffer. Eight threads that
 * allocate and free their own blocks leave every count exact (and
 * ThreadSanitizer sees no race).
 */
#include "test_util.h"

#include "callers.h"

#include <pthread.h>
#include <string.h>

static int reset(void **state)
{
    (void)state;
    cuh_callers_reset();
    return 0;
}

/* The entry for `library` in a snapshot, or NULL. */
static const cuh_caller_stat_t *find(const cuh_caller_stat_t *c, size_t n, const char *library)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(c[i].library, library) == 0)
            return &c[i];
    return NULL;
}

static void test_names_get_one_number_each(void **state)
{
    (void)state;
    int a = cuh_callers_id("/usr/lib/libcublasLt.so.13");
    assert_true(a >= 0);
    assert_int_equal(cuh_callers_id("libcublasLt.so.13"), a);
    assert_int_equal(cuh_callers_id("/other/dir/libcublasLt.so.13"), a);
    int b = cuh_callers_id("libc10_cuda.so");
    assert_true(b >= 0 && b != a);
    assert_int_equal(cuh_callers_id(NULL), -1);
    assert_int_equal(cuh_callers_id(""), -1);
    assert_int_equal(cuh_callers_id("/usr/lib/"), -1);
}

static void test_after_31_libraries_the_rest_are_other_libraries(void **state)
{
    (void)state;
    char name[32];
    for (int i = 0; i < CUH_CALLERS_MAX - 1; i++) {
        snprintf(name, sizeof name, "lib%d.so", i);
        assert_int_equal(cuh_callers_id(name), i);
    }
    assert_int_equal(cuh_callers_id("libextra.so"), CUH_CALLERS_MAX - 1);
    assert_int_equal(cuh_callers_id("libmore.so"), CUH_CALLERS_MAX - 1);
    assert_int_equal(cuh_callers_id("lib3.so"), 3);   /* the named ones keep theirs */
    cuh_callers_alloc(0x1000, 512, 0, CUH_CALLERS_MAX - 1);
    cuh_caller_stat_t c[CUH_CALLERS_MAX];
    size_t n = cuh_callers_snapshot(c, CUH_CALLERS_MAX);
    assert_int_equal(n, 1);
    assert_string_equal(c[0].library, "other libraries");
}

static void test_live_peak_and_allocations_follow_allocs_and_frees(void **state)
{
    (void)state;
    int torch = cuh_callers_id("libc10_cuda.so"), blas = cuh_callers_id("libcublasLt.so.13");
    cuh_callers_alloc(0x10000, 1000, 0, torch);
    cuh_callers_alloc(0x20000, 3000, 0, torch);
    cuh_callers_alloc(0x30000, 32 << 20, 0, blas);
    cuh_callers_free(0x10000);
    cuh_callers_free(0x10000);     /* again: nothing recorded there now */
    cuh_callers_free(0x990000);    /* never recorded */
    cuh_callers_alloc(0x40000, 500, 0, torch);
    cuh_caller_stat_t c[CUH_CALLERS_MAX];
    size_t n = cuh_callers_snapshot(c, CUH_CALLERS_MAX);
    assert_int_equal(n, 2);
    assert_string_equal(c[0].library, "libcublasLt.so.13");   /* most live first */
    const cuh_caller_stat_t *t = find(c, n, "libc10_cuda.so");
    assert_non_null(t);
    assert_int_equal(t->live, 3500);
    assert_int_equal(t->peak, 4000);
    assert_int_equal(t->allocs, 3);
    assert_int_equal(c[0].live, 32 << 20);
    assert_int_equal(cuh_callers_snapshot(c, 1), 1);   /* at most what fits */
    /* An address recorded again without a free: counted once, as the new block. */
    cuh_callers_alloc(0x20000, 7000, 0, torch);
    n = cuh_callers_snapshot(c, CUH_CALLERS_MAX);
    t = find(c, n, "libc10_cuda.so");
    assert_int_equal(t->live, 7500);
    cuh_callers_free(0x20000);
    cuh_callers_free(0x40000);
    cuh_callers_free(0x30000);
    n = cuh_callers_snapshot(c, CUH_CALLERS_MAX);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(c[i].live, 0);
    assert_int_equal(find(c, n, "libc10_cuda.so")->peak, 7500);
}

static void test_the_live_summary_names_the_three_holding_most(void **state)
{
    (void)state;
    char text[CUH_CALLERS_SUMMARY_MAX];
    assert_int_equal(cuh_callers_live_summary(text, sizeof text), 0);   /* nobody allocated */
    assert_string_equal(text, "");
    int freed = cuh_callers_id("libfreed.so");
    cuh_callers_alloc(0x90000, 1 << 20, 0, freed);
    cuh_callers_free(0x90000);
    assert_int_equal(cuh_callers_live_summary(text, sizeof text), 0);   /* nothing live */
    cuh_callers_alloc(0x10000, 1024, 0, cuh_callers_id("libc.so"));
    cuh_callers_alloc(0x20000, (size_t)3 << 30, 1, cuh_callers_id("libc10_cuda.so"));
    cuh_callers_alloc(0x30000, 512, 0, cuh_callers_id("libd.so"));
    cuh_callers_alloc(0x40000, 64 << 20, 0, cuh_callers_id("libcublas.so.13"));
    cuh_callers_alloc(0x50000, 100, 0, cuh_callers_id("libe.so"));
    const char *want = "device memory live by calling library (every device): libc10_cuda.so 3.00 GiB, "
                       "libcublas.so.13 64.00 MiB, libc.so 1.00 KiB and 2 more (a report:PATH names each)";
    assert_int_equal(cuh_callers_live_summary(text, sizeof text), strlen(want));
    assert_string_equal(text, want);
    /* Cut to what fits, the length what was written. */
    char small[40];
    assert_int_equal(cuh_callers_live_summary(small, sizeof small), sizeof small - 1);
    assert_memory_equal(small, want, sizeof small - 1);
    assert_int_equal(small[sizeof small - 1], '\0');
    cuh_callers_free(0x30000);
    cuh_callers_free(0x50000);
    cuh_callers_free(0x10000);
    want = "device memory live by calling library (every device): libc10_cuda.so 3.00 GiB, libcublas.so.13 64.00 MiB";
    assert_int_equal(cuh_callers_live_summary(text, sizeof text), strlen(want));
    assert_string_equal(text, want);
}

static void test_a_reset_device_takes_its_blocks_out(void **state)
{
    (void)state;
    int id = cuh_callers_id("libprogram.so");
    /* Many blocks per device, interleaved, so that the maps hold long runs
     * with both devices' entries in them. */
    for (uintptr_t i = 0; i < 4000; i++)
        cuh_callers_alloc(0x100000 + i * 512, 100, (int)(i % 2), id);
    cuh_callers_forget_device(1);
    cuh_caller_stat_t c[CUH_CALLERS_MAX];
    size_t n = cuh_callers_snapshot(c, CUH_CALLERS_MAX);
    assert_int_equal(n, 1);
    assert_int_equal(c[0].live, 2000 * 100);
    assert_int_equal(c[0].peak, 4000 * 100);
    for (uintptr_t i = 0; i < 4000; i++)
        cuh_callers_free(0x100000 + i * 512);   /* device 1's are no longer there */
    n = cuh_callers_snapshot(c, CUH_CALLERS_MAX);
    assert_int_equal(c[0].live, 0);
}

#define THREADS 8
#define PER_THREAD 5000

static void *churn(void *arg)
{
    uintptr_t base = (uintptr_t)arg;
    int id = cuh_callers_id(base & 0x100000000ull ? "libodd.so" : "libeven.so");
    for (uintptr_t i = 0; i < PER_THREAD; i++) {
        cuh_callers_alloc(base + i * 512, 512, 0, id);
        if (i % 3 == 0)
            cuh_callers_free(base + (i / 2) * 512);
    }
    for (uintptr_t i = 0; i < PER_THREAD; i++)
        cuh_callers_free(base + i * 512);
    return NULL;
}

static void test_threads_leave_every_count_exact(void **state)
{
    (void)state;
    pthread_t t[THREADS];
    for (uintptr_t i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, churn, (void *)(((i + 1) << 33) | (i % 2) << 32)), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    cuh_caller_stat_t c[CUH_CALLERS_MAX];
    size_t n = cuh_callers_snapshot(c, CUH_CALLERS_MAX);
    assert_true(n >= 1);
    uint64_t allocs = 0;
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(c[i].live, 0);
        allocs += c[i].allocs;
    }
    assert_int_equal(allocs, THREADS * PER_THREAD);
}

/* Labelled blocks (cudaMalloc's, whose label the heap keeps) count with the
 * blocks recorded by address: live, peak and allocations add up per library;
 * a device that is gone takes its labelled bytes out (as the heap's
 * cuh_heap_live_by_label gives them). */
static void test_labelled_blocks_count_beside_recorded_ones(void **state)
{
    (void)state;
    int torch = cuh_callers_id("libc10_cuda.so");
    assert_int_equal(cuh_callers_label(torch), (unsigned)torch + 1);
    cuh_callers_count_alloc(torch, 1000);
    cuh_callers_count_alloc(torch, 3000);
    cuh_callers_alloc(0x10000, 500, 0, torch);   /* a stream-ordered one, by address */
    cuh_callers_count_free(torch, 1000);
    cuh_callers_count_alloc(-1, 77);             /* no library: nothing */
    cuh_callers_count_alloc(CUH_CALLERS_MAX, 77);
    cuh_caller_stat_t c[CUH_CALLERS_MAX];
    size_t n = cuh_callers_snapshot(c, CUH_CALLERS_MAX);
    assert_int_equal(n, 1);
    assert_int_equal(c[0].live, 3500);
    assert_int_equal(c[0].peak, 4500);
    assert_int_equal(c[0].allocs, 3);
    uint64_t by_label[256] = {0};
    by_label[cuh_callers_label(torch)] = 3000;
    cuh_callers_forget_labelled(by_label);
    n = cuh_callers_snapshot(c, CUH_CALLERS_MAX);
    assert_int_equal(c[0].live, 500);
    cuh_callers_free(0x10000);
    n = cuh_callers_snapshot(c, CUH_CALLERS_MAX);
    assert_int_equal(c[0].live, 0);
    assert_int_equal(c[0].peak, 4500);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_names_get_one_number_each, reset),
        cmocka_unit_test_setup(test_after_31_libraries_the_rest_are_other_libraries, reset),
        cmocka_unit_test_setup(test_live_peak_and_allocations_follow_allocs_and_frees, reset),
        cmocka_unit_test_setup(test_labelled_blocks_count_beside_recorded_ones, reset),
        cmocka_unit_test_setup(test_the_live_summary_names_the_three_holding_most, reset),
        cmocka_unit_test_setup(test_a_reset_device_takes_its_blocks_out, reset),
        cmocka_unit_test_setup(test_threads_leave_every_count_exact, reset),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
