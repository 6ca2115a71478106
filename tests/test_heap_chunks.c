/* test_heap_chunks.c - a thread's chunks (src/chunk.c, src/heap_chunks.c):
 * the pieces tile a chunk; a thread that contends gets one and serves its
 * stream's large blocks from it without the heap; every rule holds through
 * it: stream order, a double free caught, exact books, and the chunk given
 * back when contention ends, before out-of-memory, at a capture, when the
 * stream is retired and when its thread exits; and under many threads.
 */
#include "heap_test.h"

#include "chunk.h"

/* ---- the pieces --------------------------------------------------------------- */

static void chunk_ok(const cuh_chunk_t *c)
{
    char msg[256];
    if (cuh_chunk_check(c, msg, sizeof msg))
        fail_msg("%s", msg);
}

/* Best fit cuts the smallest free piece that holds the request; a release
 * merges with free neighbours on both sides; lookups find starts only. */
static void test_pieces_best_fit_and_merge(void **state)
{
    (void)state;
    cuh_chunk_t c;
    assert_int_equal(cuh_chunk_init(&c, 0x100000, 64 * MiB), 0);
    uintptr_t a = cuh_chunk_carve(&c, 0, 8 * MiB, 8 * MiB - 5);
    uintptr_t b = cuh_chunk_carve(&c, (size_t)cuh_chunk_fit(&c, 4 * MiB), 4 * MiB, 4 * MiB);
    uintptr_t d = cuh_chunk_carve(&c, (size_t)cuh_chunk_fit(&c, 16 * MiB), 16 * MiB, 1);
    assert_int_equal(a, 0x100000);
    assert_int_equal(b, a + 8 * MiB);
    assert_int_equal(d, b + 4 * MiB);
    chunk_ok(&c);
    assert_int_equal(c.live_bytes, 28 * MiB);
    assert_int_equal(c.live_requested, 12 * MiB - 4);
    /* A 4 MiB hole before the 36 MiB tail: a 2 MiB request takes the hole. */
    cuh_chunk_release(&c, (size_t)cuh_chunk_find(&c, b));
    chunk_ok(&c);
    assert_int_equal(cuh_chunk_fit(&c, 2 * MiB), cuh_chunk_find(&c, b));
    assert_int_equal(cuh_chunk_find(&c, b + 512), -1);
    assert_int_equal(cuh_chunk_find(&c, 0x100000 + 64 * MiB), -1);
    assert_int_equal(cuh_chunk_fit(&c, 40 * MiB), -1);
    /* Freeing d merges the hole, d and the tail into one piece. */
    cuh_chunk_release(&c, (size_t)cuh_chunk_find(&c, d));
    chunk_ok(&c);
    assert_int_equal(c.num_pieces, 2);
    assert_int_equal(c.pieces[1].size, 56 * MiB);
    cuh_chunk_release(&c, (size_t)cuh_chunk_find(&c, a));
    chunk_ok(&c);
    assert_int_equal(c.num_pieces, 1);
    assert_int_equal(c.live_bytes, 0);
    /* Many pieces: the array grows. */
    for (int i = 0; i < 100; i++)
        assert_true(cuh_chunk_carve(&c, (size_t)cuh_chunk_fit(&c, MiB / 2), MiB / 2, 100) != 0);
    chunk_ok(&c);
    assert_int_equal(c.num_pieces, 101);
    cuh_chunk_fini(&c);
}

/* The check finds a broken tiling and wrong books. */
static void test_pieces_check_catches_damage(void **state)
{
    (void)state;
    cuh_chunk_t c;
    char msg[256];
    assert_int_equal(cuh_chunk_init(&c, 0x100000, 8 * MiB), 0);
    cuh_chunk_carve(&c, 0, MiB, MiB);
    c.pieces[1].off += 512;
    assert_int_equal(cuh_chunk_check(&c, msg, sizeof msg), -1);
    c.pieces[1].off -= 512;
    c.live_requested++;
    assert_int_equal(cuh_chunk_check(&c, msg, sizeof msg), -1);
    c.live_requested--;
    chunk_ok(&c);
    cuh_chunk_fini(&c);
}

/* ---- the heap's side ------------------------------------------------------------ *
 * Each test runs under vmm:1 and on plain segments; there with a workspace,
 * since a chunk only takes memory at hand (it never grows the heap). */

/* Threads contend, and every large allocation through the lock finds it
 * held: the 8th gets a chunk. */
static void contend(cuh_heap_t *heap)
{
    cuh_heap_assume_contention(heap, 100000);
    cuh_heap_assume_waits(heap, 1);
}

/* Allocates n blocks of `size`. */
static void alloc_n(cuh_heap_t *heap, uintptr_t *out, int n, size_t size, cuh_stream_t s)
{
    for (int i = 0; i < n; i++)
        out[i] = must_alloc(heap, size, s);
}

static size_t chunks_of(cuh_heap_t *heap)
{
    return cuh_heap_chunks(heap, NULL, NULL);
}

/* A heap with settings `conf` whose threads contend, and n >= 8 blocks of
 * 4 MiB on S1 in a, the 8th and later cut from one chunk. */
static test_heap_t heap_with_a_chunk(const char *conf, uintptr_t *a, int n)
{
    test_heap_t t = test_heap_new(4 * GiB, conf);
    contend(t.heap);
    alloc_n(t.heap, a, n, 4 * MiB, S1);
    assert_int_equal(chunks_of(t.heap), 1);
    return t;
}

/* Frees the blocks of a (but 0s) on s, checks that nothing is left, and
 * ends the heap. */
static void free_all_and_end(test_heap_t *t, const uintptr_t *a, int n, cuh_stream_t s)
{
    for (int i = 0; i < n; i++)
        if (a[i])
            must_free(t->heap, a[i], s);
    cuh_sim_complete_all(t->dev);
    all_freed(t->heap);
    test_heap_free(t);
}

/* A thread that contends gets a chunk and cuts its stream's next large
 * blocks from it without the heap: no device call, adjacent blocks, and the
 * books exact throughout. Without contention nobody gets one. */
static void test_a_contending_thread_cuts_blocks_from_its_chunk(void **state)
{
    const char *conf = *state;
    for (int contended = 0; contended < 2; contended++) {
        test_heap_t t = test_heap_new(4 * GiB, conf);
        if (contended)
            contend(t.heap);
        uintptr_t a[12];
        alloc_n(t.heap, a, 7, 3 * MiB, S1);
        assert_int_equal(chunks_of(t.heap), 0);
        cuh_sim_counters_t c0, c1;
        cuh_sim_counters(t.dev, &c0);
        a[7] = must_alloc(t.heap, 3 * MiB, S1);
        cuh_sim_counters(t.dev, &c1);
        size_t bytes = 0;
        assert_int_equal(cuh_heap_chunks(t.heap, &bytes, NULL), (size_t)contended);
        if (contended)
            assert_int_equal(bytes, 24 * MiB);   /* 8 blocks of the request */
        heap_ok(t.heap);
        cuh_sim_counters(t.dev, &c0);
        for (int i = 8; i < 12; i++)
            a[i] = must_alloc(t.heap, 3 * MiB - 1000, S1);
        cuh_sim_counters(t.dev, &c1);
        if (contended) {
            assert_int_equal(a[8], a[7] + 3 * MiB);
            for (int i = 9; i < 12; i++)
                assert_int_equal(a[i], a[i - 1] + 3 * MiB - 512);   /* 512-byte rounding */
            assert_int_equal(c1.vm_maps + c1.events_recorded, c0.vm_maps + c0.events_recorded);
            assert_int_equal(cuh_heap_block_size(t.heap, a[9]), 3 * MiB - 1000);
            assert_int_equal(cuh_heap_block_size(t.heap, a[9] + 512), 0);
        }
        heap_ok(t.heap);
        for (int i = 11; i >= 0; i--) {
            must_free(t.heap, a[i], S1);
            heap_ok(t.heap);
        }
        assert_int_equal(chunks_of(t.heap), (size_t)contended);
        all_freed(t.heap);
        assert_int_equal(chunks_of(t.heap), 0);   /* statistics give chunks back */
        test_heap_free(&t);
    }
}

/* The chunk keeps the books exact while it lives, and when it goes back:
 * what the program reads is its requests, and the blocks stay live. */
static void test_chunk_books_are_exact(void **state)
{
    const char *conf = *state;
    test_heap_t t = test_heap_new(4 * GiB, conf);
    contend(t.heap);
    uintptr_t a[10];
    alloc_n(t.heap, a, 10, 2 * MiB + 100, S1);
    assert_int_equal(chunks_of(t.heap), 1);
    must_free(t.heap, a[8], S1);   /* from the chunk, without the heap */
    heap_ok(t.heap);
    cuheap_stats_t s;
    cuh_heap_stats(t.heap, &s);   /* the chunk goes back first */
    assert_int_equal(chunks_of(t.heap), 0);
    assert_int_equal(s.requested.current, 9 * (2 * MiB + 100));
    assert_int_equal(s.allocated.current, 9 * (2 * MiB + 512));
    assert_int_equal(cuh_heap_block_size(t.heap, a[9]), 2 * MiB + 100);
    for (int i = 0; i < 10; i++)
        if (i != 8)
            must_free(t.heap, a[i], S1);
    all_freed(t.heap);
    test_heap_free(&t);
}

/* A chunk serves its stream only; its freed blocks are that stream's at
 * once and reach another stream only through the heap's rules. */
static void test_a_chunk_serves_only_its_stream(void **state)
{
    uintptr_t a[9];
    test_heap_t t = heap_with_a_chunk(*state, a, 9);
    must_free(t.heap, a[8], S1);
    /* S2's request does not get S1's freed block... */
    uintptr_t other = must_alloc(t.heap, 4 * MiB, S2);
    assert_true(other != a[8]);
    /* ...and S1's does, at once. */
    assert_int_equal(must_alloc(t.heap, 4 * MiB, S1), a[8]);
    heap_ok(t.heap);
    must_free(t.heap, other, S2);
    free_all_and_end(&t, a, 9, S1);
}

/* A chunk's block freed on another stream goes through the heap: the chunks
 * go back and the block is the freeing stream's private memory, which the
 * first stream does not get before a fence has passed the free. */
static void test_a_chunk_block_freed_on_another_stream_waits_for_it(void **state)
{
    uintptr_t a[10];
    test_heap_t t = heap_with_a_chunk(*state, a, 10);
    cuh_sim_hold_events(t.dev, 1);   /* the GPU passes no fence unless told */
    must_free(t.heap, a[9], S2);
    assert_int_equal(chunks_of(t.heap), 0);
    heap_ok(t.heap);
    uintptr_t b[10];
    for (int i = 0; i < 10; i++) {
        b[i] = must_alloc(t.heap, 4 * MiB, S1);
        assert_true(b[i] != a[9]);
    }
    /* A thread whose chunk met another stream's free gets none for a while. */
    assert_int_equal(chunks_of(t.heap), 0);
    heap_ok(t.heap);
    cuh_sim_hold_events(t.dev, 0);
    cuh_sim_complete_all(t.dev);
    for (int i = 0; i < 10; i++)
        must_free(t.heap, b[i], S1);
    a[9] = 0;
    free_all_and_end(&t, a, 10, S1);
}

/* Such a free gives back only the chunk that holds the block. */
static void test_a_foreign_free_gives_back_only_its_chunk(void **state)
{
    uintptr_t a[9], b[2];
    test_heap_t t = heap_with_a_chunk(*state, a, 9);   /* a chunk for S1 */
    alloc_n(t.heap, b, 2, 4 * MiB, S2);                  /* and one for S2 */
    assert_int_equal(chunks_of(t.heap), 2);
    must_free(t.heap, b[1], S3);
    assert_int_equal(chunks_of(t.heap), 1);
    heap_ok(t.heap);
    must_free(t.heap, a[8], S1);           /* still from S1's chunk, without the heap */
    assert_int_equal(chunks_of(t.heap), 1);
    must_free(t.heap, b[0], S2);
    a[8] = 0;
    free_all_and_end(&t, a, 9, S1);
}

/* A double free of a chunk's block is caught, at the chunk's start and
 * inside it, and changes nothing. */
static void test_a_chunk_block_double_free_is_caught(void **state)
{
    uintptr_t a[10];
    test_heap_t t = heap_with_a_chunk(*state, a, 10);
    must_free(t.heap, a[7], S1);   /* the chunk's start */
    must_free(t.heap, a[9], S1);   /* inside it */
    assert_int_equal(cuh_heap_free(t.heap, a[7], S1), CUHEAP_ERR_DOUBLE_FREE);
    heap_ok(t.heap);
    assert_int_equal(cuh_heap_free(t.heap, a[9], S1), CUHEAP_ERR_DOUBLE_FREE);
    assert_int_equal(cuh_heap_free(t.heap, a[8] + 512, S1), CUHEAP_ERR_INVALID_ARGUMENT);
    heap_ok(t.heap);
    a[7] = a[9] = 0;
    free_all_and_end(&t, a, 10, S1);
}

/* When nobody contends any more, the next operation through the heap's
 * lock gives every chunk back. */
static void test_chunks_go_back_when_contention_ends(void **state)
{
    uintptr_t a[9];
    test_heap_t t = heap_with_a_chunk(*state, a, 9);
    cuh_heap_assume_contention(t.heap, 0);
    uintptr_t x = must_alloc(t.heap, 100, S3);
    assert_int_equal(chunks_of(t.heap), 0);
    heap_ok(t.heap);
    must_free(t.heap, x, S3);
    free_all_and_end(&t, a, 9, S1);
}

/* Memory free in a chunk serves a request that needs it: the chunks go back
 * before the heap reports out of memory. */
static void test_chunks_go_back_before_out_of_memory(void **state)
{
    const char *conf = *state;
    /* Plain segments: the workspace is all the limit allows. */
    int plain = strstr(conf, "vmm:0") != NULL;
    test_heap_t t = test_heap_new(512 * MiB, plain ? "vmm:0,workspace:256M,limit:256M" : conf);
    contend(t.heap);
    uintptr_t a[8];
    alloc_n(t.heap, a, 8, 16 * MiB, S1);   /* the 8th in a chunk of 128 MiB */
    assert_int_equal(chunks_of(t.heap), 1);
    for (int i = 0; i < 8; i++)
        must_free(t.heap, a[i], S1);
    uintptr_t big = must_alloc(t.heap, plain ? 240 * MiB : 448 * MiB, S2);
    assert_int_equal(chunks_of(t.heap), 0);
    heap_ok(t.heap);
    must_free(t.heap, big, S2);
    all_freed(t.heap);
    test_heap_free(&t);
}

/* A chunk never makes the CPU wait: under vmm:1 near the limit, with the
 * memory that would serve it still in use on the GPU, it is not made, and
 * the request is served as always. */
static void test_a_chunk_never_waits(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(256 * MiB, "vmm:1,limit:120M");
    cuh_sim_hold_events(t.dev, 1);
    must_free(t.heap, must_alloc(t.heap, 96 * MiB, S2), S2);   /* pending on S2 */
    contend(t.heap);
    uintptr_t a[8];
    alloc_n(t.heap, a, 7, 2 * MiB, S1);
    cuheap_stats_t s0, s1;
    cuh_heap_stats(t.heap, &s0);
    a[7] = must_alloc(t.heap, 2 * MiB, S1);   /* a chunk would need S2's pages */
    assert_int_equal(chunks_of(t.heap), 0);
    cuh_heap_stats(t.heap, &s1);
    assert_int_equal(s1.num_cpu_waits, s0.num_cpu_waits);
    cuh_sim_hold_events(t.dev, 0);
    free_all_and_end(&t, a, 8, S1);
}

/* A capture gives the chunks back, and its allocations are the heap's. */
static void test_chunks_stay_out_of_a_capture(void **state)
{
    uintptr_t a[9];
    test_heap_t t = heap_with_a_chunk(*state, a, 9);
    cuh_heap_capture_begin(t.heap, 7);
    assert_int_equal(chunks_of(t.heap), 0);
    uintptr_t c[9];
    alloc_n(t.heap, c, 9, 4 * MiB, S1);
    assert_int_equal(chunks_of(t.heap), 0);
    cuh_heap_capture_end(t.heap);
    heap_ok(t.heap);
    for (int i = 0; i < 9; i++)
        must_free(t.heap, c[i], S1);
    cuh_heap_release_pool(t.heap, 7);
    free_all_and_end(&t, a, 9, S1);
}

/* Retiring a stream gives its chunks back; the blocks stay live. */
static void test_a_retired_stream_takes_its_chunks_back(void **state)
{
    uintptr_t a[9];
    test_heap_t t = heap_with_a_chunk(*state, a, 9);
    cuh_heap_retire_stream(t.heap, S1);
    assert_int_equal(chunks_of(t.heap), 0);
    heap_ok(t.heap);
    for (int i = 0; i < 9; i++)
        assert_int_equal(cuh_heap_free_device_wide(t.heap, a[i]), CUHEAP_OK);
    cuh_sim_complete_all(t.dev);
    all_freed(t.heap);
    test_heap_free(&t);
}

typedef struct chunk_job_s {
    cuh_heap_t *heap;
    cuh_stream_t stream;
    uint64_t seed;
    int ops;
    uintptr_t kept[10];
    int failures;
} chunk_job_t;

/* Allocates ten blocks on its stream and exits with them live. */
static void *alloc_and_exit_job(void *arg)
{
    chunk_job_t *j = arg;
    for (int i = 0; i < 10; i++)
        j->failures += cuh_heap_malloc(j->heap, 2 * MiB, j->stream, &j->kept[i]) != CUHEAP_OK;
    return NULL;
}

/* A thread that exits gives its chunks back; its blocks stay live and any
 * thread frees them. */
static void test_a_threads_exit_gives_its_chunks_back(void **state)
{
    const char *conf = *state;
    test_heap_t t = test_heap_new(4 * GiB, conf);
    contend(t.heap);
    chunk_job_t j = {.heap = t.heap, .stream = S2};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, alloc_and_exit_job, &j), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(j.failures, 0);
    assert_int_equal(chunks_of(t.heap), 0);
    heap_ok(t.heap);
    for (int i = 0; i < 10; i++)
        must_free(t.heap, j.kept[i], S2);
    all_freed(t.heap);
    test_heap_free(&t);
}

/* Random large sizes on its own stream, a working set of 16 blocks, and
 * now and then a free of another thread's kind: on another stream. */
static void *random_large_job(void *arg)
{
    chunk_job_t *j = arg;
    uintptr_t live[16] = {0};
    for (int op = 0; op < j->ops; op++) {
        int i = (int)(test_rand(&j->seed) % 16);
        if (live[i]) {
            cuh_stream_t s = test_rand(&j->seed) % 64 ? j->stream : S3;
            j->failures += cuh_heap_free(j->heap, live[i], s) != CUHEAP_OK;
        }
        size_t size = MiB + (size_t)(test_rand(&j->seed) % (15 * MiB));
        j->failures += cuh_heap_malloc(j->heap, size, j->stream, &live[i]) != CUHEAP_OK;
    }
    for (int i = 0; i < 16; i++)
        j->failures += cuh_heap_free(j->heap, live[i], j->stream) != CUHEAP_OK;
    return NULL;
}

/* Four threads on four streams under contention: every operation succeeds
 * and the books are sound afterwards (ThreadSanitizer runs this too). */
static void test_threads_with_chunks_keep_the_books(void **state)
{
    const char *conf = *state;
    test_heap_t t = test_heap_new(16 * GiB, conf);
    cuh_heap_assume_contention(t.heap, 1u << 30);
    cuh_heap_assume_waits(t.heap, 1);
    chunk_job_t jobs[4];
    pthread_t th[4];
    for (int k = 0; k < 4; k++) {
        jobs[k] = (chunk_job_t){.heap = t.heap, .stream = (cuh_stream_t)(uintptr_t)(0x10000 * ((uintptr_t)k + 1)),
                                .seed = 0x9e3779b97f4a7c15ull * ((uint64_t)k + 1), .ops = 3000};
        assert_int_equal(pthread_create(&th[k], NULL, random_large_job, &jobs[k]), 0);
    }
    for (int k = 0; k < 4; k++) {
        assert_int_equal(pthread_join(th[k], NULL), 0);
        assert_int_equal(jobs[k].failures, 0);
    }
    cuh_sim_complete_all(t.dev);
    all_freed(t.heap);
    test_heap_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pieces_best_fit_and_merge),
        cmocka_unit_test(test_pieces_check_catches_damage),
        cmocka_unit_test_prestate(test_a_contending_thread_cuts_blocks_from_its_chunk, "vmm:1"),
        cmocka_unit_test_prestate(test_a_contending_thread_cuts_blocks_from_its_chunk, "vmm:0,workspace:256M"),
        cmocka_unit_test_prestate(test_chunk_books_are_exact, "vmm:1"),
        cmocka_unit_test_prestate(test_chunk_books_are_exact, "vmm:0,workspace:256M"),
        cmocka_unit_test_prestate(test_a_chunk_serves_only_its_stream, "vmm:1"),
        cmocka_unit_test_prestate(test_a_chunk_serves_only_its_stream, "vmm:0,workspace:256M"),
        cmocka_unit_test_prestate(test_a_chunk_block_freed_on_another_stream_waits_for_it, "vmm:1"),
        cmocka_unit_test_prestate(test_a_chunk_block_freed_on_another_stream_waits_for_it, "vmm:0,workspace:256M"),
        cmocka_unit_test_prestate(test_a_foreign_free_gives_back_only_its_chunk, "vmm:1"),
        cmocka_unit_test_prestate(test_a_foreign_free_gives_back_only_its_chunk, "vmm:0,workspace:256M"),
        cmocka_unit_test_prestate(test_a_chunk_block_double_free_is_caught, "vmm:1"),
        cmocka_unit_test_prestate(test_a_chunk_block_double_free_is_caught, "vmm:0,workspace:256M"),
        cmocka_unit_test_prestate(test_chunks_go_back_when_contention_ends, "vmm:1"),
        cmocka_unit_test_prestate(test_chunks_go_back_when_contention_ends, "vmm:0,workspace:256M"),
        cmocka_unit_test_prestate(test_chunks_go_back_before_out_of_memory, "vmm:1"),
        cmocka_unit_test_prestate(test_chunks_go_back_before_out_of_memory, "vmm:0,workspace:256M"),
        cmocka_unit_test(test_a_chunk_never_waits),
        cmocka_unit_test_prestate(test_chunks_stay_out_of_a_capture, "vmm:1"),
        cmocka_unit_test_prestate(test_chunks_stay_out_of_a_capture, "vmm:0,workspace:256M"),
        cmocka_unit_test_prestate(test_a_retired_stream_takes_its_chunks_back, "vmm:1"),
        cmocka_unit_test_prestate(test_a_retired_stream_takes_its_chunks_back, "vmm:0,workspace:256M"),
        cmocka_unit_test_prestate(test_a_threads_exit_gives_its_chunks_back, "vmm:1"),
        cmocka_unit_test_prestate(test_a_threads_exit_gives_its_chunks_back, "vmm:0,workspace:256M"),
        cmocka_unit_test_prestate(test_threads_with_chunks_keep_the_books, "vmm:1"),
        cmocka_unit_test_prestate(test_threads_with_chunks_keep_the_books, "vmm:0,workspace:256M"),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
