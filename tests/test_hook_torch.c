/* test_hook_torch.c - PyTorch's pluggable-allocator entry points
 * (src/hook_torch.c) on simulated devices, called as PyTorch calls them:
 * allocation and free with device and stream; for an out-of-memory a
 * rate-limited explanation on stderr, then std::runtime_error thrown where a C++
 * runtime is loaded (as in PyTorch), NULL where none is; empty_cache; the memory
 * fraction; record_stream; the base allocation; graph pools.
 */
#include "test_util.h"

#include "hook_torch.h"
#include "runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#define STREAM ((cuheap_stream_t)0x51)
#define SIDE ((cuheap_stream_t)0x52)

/* As PyTorch does: the allocator's init before its first allocation. */
static int setup(void **state)
{
    (void)state;
    cuh_runtime_reset();
    unsetenv("CUHEAP_CONF");
    int rc = cuh_runtime_use_sim(GiB);
    cuheap_torch_init(1);
    return rc;
}

/* Pages the simulated device 0 has mapped so far. */
static uint64_t pages_mapped(void)
{
    cuh_sim_counters_t c;
    cuh_sim_counters(cuh_runtime_device(0), &c);
    return c.vm_maps;
}

static int teardown(void **state)
{
    (void)state;
    cuh_runtime_reset();
    return 0;
}

/* Runs fn with stderr captured into buf. */
static void capture_stderr(void (*fn)(void), char *buf, size_t len)
{
    char path[] = "/tmp/cuheap-stderr-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    fn();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    lseek(fd, 0, SEEK_SET);
    ssize_t n = read(fd, buf, len - 1);
    buf[n > 0 ? n : 0] = '\0';
    close(fd);
    unlink(path);
}

/* Did an allocation of `size` fail the way it must in this process: thrown
 * as std::runtime_error where a C++ runtime is loaded (checked in a child, where
 * nothing catches it), NULL where none is? */
static int alloc_fails(ssize_t size, int device)
{
    if (!dlsym(RTLD_DEFAULT, "__cxa_throw"))
        return cuheap_torch_alloc(size, device, STREAM) == NULL;
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 2);
        cuheap_torch_alloc(size, device, STREAM);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
}

static void test_pytorch_gets_virtual_memory_unless_told_otherwise(void **state)
{
    (void)state;
    void *p = cuheap_torch_alloc(4 * MiB, 0, STREAM);
    assert_non_null(p);
    assert_true(pages_mapped() > 0);
    cuheap_torch_free(p, 4 * MiB, 0, STREAM);

    /* CUHEAP_CONF=vmm:0 keeps plain segments under PyTorch. */
    cuh_runtime_reset();
    setenv("CUHEAP_CONF", "vmm:0", 1);
    assert_int_equal(cuh_runtime_use_sim(GiB), 0);
    cuheap_torch_init(1);
    p = cuheap_torch_alloc(4 * MiB, 0, STREAM);
    assert_non_null(p);
    assert_int_equal(pages_mapped(), 0);
    cuheap_torch_free(p, 4 * MiB, 0, STREAM);

    /* Without PyTorch (the C API alone) the default is vmm:1 as well. */
    cuh_runtime_reset();
    unsetenv("CUHEAP_CONF");
    assert_int_equal(cuh_runtime_use_sim(GiB), 0);
    assert_int_equal(cuheap_malloc(&p, 4 * MiB, 0, (cuheap_stream_t)STREAM), CUHEAP_OK);
    assert_true(pages_mapped() > 0);
    assert_int_equal(cuheap_free(p, 0, (cuheap_stream_t)STREAM), CUHEAP_OK);
}

static void test_alloc_and_free_serve_devices_and_streams(void **state)
{
    (void)state;
    void *a = cuheap_torch_alloc(3 * MiB, 0, STREAM);
    void *b = cuheap_torch_alloc(100, 1, STREAM);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal((uintptr_t)a % 512, 0);
    cuheap_torch_free(a, 3 * MiB, 0, STREAM);
    cuheap_torch_free(b, 100, 1, STREAM);
    cuheap_stats_t s;
    cuheap_get_stats(1, &s);
    assert_int_equal(s.num_allocs, 1);
    assert_int_equal(s.num_frees, 1);
    assert_null(cuheap_torch_alloc(0, 0, STREAM));
}

static void oom_twice(void)
{
    assert_null(cuheap_torch_alloc((ssize_t)(2 * GiB), 0, STREAM));
    assert_null(cuheap_torch_alloc((ssize_t)(2 * GiB), 0, STREAM));
}

static void test_out_of_memory_explains_once_then_throws_or_returns_null(void **state)
{
    (void)state;
    char out[4096];
    if (dlsym(RTLD_DEFAULT, "__cxa_throw")) {
        /* A C++ runtime is in this process (the sanitizers bring one): the
         * failure must be thrown as std::runtime_error saying what PyTorch's
         * own says, uncaught here (the runtime prints it as it aborts). */
        int pipefd[2];
        assert_int_equal(pipe(pipefd), 0);
        pid_t pid = fork();
        if (pid == 0) {
            dup2(pipefd[1], 2);
            cuheap_torch_alloc((ssize_t)(2 * GiB), 0, STREAM);
            _exit(0);   /* returned: nothing was thrown */
        }
        close(pipefd[1]);
        size_t got = 0;
        ssize_t n;
        while (got < sizeof out - 1 && (n = read(pipefd[0], out + got, sizeof out - 1 - got)) > 0)
            got += (size_t)n;
        out[got] = '\0';
        close(pipefd[0]);
        int status = 0;
        waitpid(pid, &status, 0);
        assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
        assert_non_null(strstr(out, "cuheap: CUDA out of memory"));
        assert_non_null(strstr(out, "std::runtime_error"));
        assert_non_null(strstr(out, "CUDA out of memory. Tried to allocate 2.00 GiB"));
        return;
    }
    capture_stderr(oom_twice, out, sizeof out);
    assert_non_null(strstr(out, "cuheap: CUDA out of memory"));
    assert_non_null(strstr(out, "cause: capacity"));
    /* Rate-limited: the second failure within the second is held back. */
    assert_null(strstr(strstr(out, "cause: capacity") + 1, "cause: capacity"));
    cuheap_stats_t s;
    cuheap_get_stats(0, &s);
    assert_int_equal(s.num_ooms, 2);
}

static void test_empty_cache_and_memory_fraction(void **state)
{
    (void)state;
    void *a = cuheap_torch_alloc(100 * MiB, 0, STREAM);
    cuheap_torch_free(a, 100 * MiB, 0, STREAM);
    cuheap_stats_t s;
    cuheap_get_stats(0, &s);
    assert_true(s.reserved.current >= 100 * MiB);
    cuheap_torch_reset();
    cuheap_get_stats(0, &s);
    assert_int_equal(s.reserved.current, 0);
    cuheap_torch_memory_fraction(0.25, 0);
    cuheap_get_stats(0, &s);
    assert_int_equal(s.limit, 256 * MiB);
    assert_true(alloc_fails(300 * MiB, 0));
    assert_non_null(a = cuheap_torch_alloc(200 * MiB, 0, STREAM));
    cuheap_torch_free(a, 200 * MiB, 0, STREAM);
}

static void test_record_stream_and_base_allocation(void **state)
{
    (void)state;
    cuh_runtime_heap(0, &(cuh_heap_t *){NULL});
    cuh_sim_hold_events(cuh_runtime_device(0), 1);
    void *a = cuheap_torch_alloc(8 * MiB, 0, STREAM);
    size_t seg = 0;
    void *base = cuheap_torch_base_alloc((char *)a + 4096, &seg);
    assert_true((uintptr_t)base <= (uintptr_t)a && (uintptr_t)a + 8 * MiB <= (uintptr_t)base + seg);
    cuheap_torch_record_stream(a, SIDE);
    cuheap_torch_free(a, 8 * MiB, 0, STREAM);
    void *b = cuheap_torch_alloc(8 * MiB, 0, STREAM);
    assert_true(b != a);   /* SIDE's work may still read a */
    cuh_sim_complete_all(cuh_runtime_device(0));
    cuheap_torch_free(b, 8 * MiB, 0, STREAM);
    void *c = cuheap_torch_alloc(8 * MiB, 0, STREAM);
    assert_true(c == a || c == b);
    cuheap_torch_free(c, 8 * MiB, 0, STREAM);
}

static void test_graph_pool_blocks_wait_for_the_pool_release(void **state)
{
    (void)state;
    cuheap_torch_begin_pool(0, 3, 4, NULL);
    void *g = cuheap_torch_alloc(4 * MiB, 0, STREAM);
    cuheap_torch_end_pool(0, 3, 4);
    cuheap_torch_free(g, 4 * MiB, 0, STREAM);
    void *x = cuheap_torch_alloc(4 * MiB, 0, STREAM);
    assert_true(x != g);
    cuheap_torch_free(x, 4 * MiB, 0, STREAM);
    cuheap_torch_release_pool(0, 3, 4);
    void *y = cuheap_torch_alloc(4 * MiB, 0, STREAM);
    void *z = cuheap_torch_alloc(4 * MiB, 0, STREAM);
    assert_true(y == g || z == g);
    cuheap_torch_free(y, 4 * MiB, 0, STREAM);
    cuheap_torch_free(z, 4 * MiB, 0, STREAM);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_pytorch_gets_virtual_memory_unless_told_otherwise, setup, teardown),
        cmocka_unit_test_setup_teardown(test_alloc_and_free_serve_devices_and_streams, setup, teardown),
        cmocka_unit_test_setup_teardown(test_out_of_memory_explains_once_then_throws_or_returns_null, setup, teardown),
        cmocka_unit_test_setup_teardown(test_empty_cache_and_memory_fraction, setup, teardown),
        cmocka_unit_test_setup_teardown(test_record_stream_and_base_allocation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_graph_pool_blocks_wait_for_the_pool_release, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
