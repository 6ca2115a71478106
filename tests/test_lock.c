/* test_lock.c - tests of the heap's lock (src/lock.h, src/lock.c).
 *
 * Mutual exclusion: threads that add to a plain (non-atomic) counter under
 * the lock lose no addition, and no two of them are ever inside at once (a
 * flag each sets on entry must be clear). Sleeping waiters: while the lock is
 * held far longer than any spin, waiters go to sleep on the futex (the lock
 * word reads 2), and every one of them gets the lock after the holder lets
 * go; none gets it before. trylock fails while the lock is held, succeeds
 * when it is free, and an unlock after it leaves the lock free.
 */
#include "test_util.h"

#include "lock.h"

#include <pthread.h>
#include <time.h>

#define THREADS 6
#define ROUNDS 200000

typedef struct shared_s {
    cuh_lock_t lock;
    long counter;         /* only ever touched under the lock */
    int inside;           /* 1 while a thread is between lock and unlock */
    int overlaps;         /* times a thread found another inside */
    int entered;          /* waiters that got the lock */
    _Atomic int waiting;  /* waiters started */
} shared_t;

static void *add_many(void *arg)
{
    shared_t *s = arg;
    for (int i = 0; i < ROUNDS; i++) {
        cuh_lock(&s->lock);
        if (s->inside)
            s->overlaps++;
        s->inside = 1;
        s->counter++;
        s->inside = 0;
        cuh_unlock(&s->lock);
    }
    return NULL;
}

static void test_threads_lose_no_update_and_never_overlap(void **state)
{
    (void)state;
    shared_t s = {0};
    cuh_lock_init(&s.lock);
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, add_many, &s), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(s.counter, (long)THREADS * ROUNDS);
    assert_int_equal(s.overlaps, 0);
    assert_true(cuh_trylock(&s.lock));
    cuh_unlock(&s.lock);
}

static void *enter_once(void *arg)
{
    shared_t *s = arg;
    atomic_fetch_add(&s->waiting, 1);
    cuh_lock(&s->lock);
    s->entered++;
    cuh_unlock(&s->lock);
    return NULL;
}

static void sleep_ms(long ms)
{
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

static void test_waiters_sleep_while_held_and_all_enter_after(void **state)
{
    (void)state;
    shared_t s = {0};
    cuh_lock_init(&s.lock);
    cuh_lock(&s.lock);
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, enter_once, &s), 0);
    /* Far longer than any spin: every waiter ends up asleep on the futex. */
    for (int i = 0; i < 400 && atomic_load(&s.waiting) < THREADS; i++)
        sleep_ms(1);
    sleep_ms(200);
    assert_int_equal(atomic_load(&s.waiting), THREADS);
    assert_int_equal(s.entered, 0);
#ifndef CUH_LOCK_PTHREAD
    assert_int_equal(atomic_load(&s.lock.state), 2);
#endif
    assert_false(cuh_trylock(&s.lock));
    cuh_unlock(&s.lock);
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(s.entered, THREADS);
    assert_true(cuh_trylock(&s.lock));
    cuh_unlock(&s.lock);
#ifndef CUH_LOCK_PTHREAD
    assert_int_equal(atomic_load(&s.lock.state), 0);
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_threads_lose_no_update_and_never_overlap),
        cmocka_unit_test(test_waiters_sleep_while_held_and_all_enter_after),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
