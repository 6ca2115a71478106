/* test_lock.c - tests of the locks of src/lock.h (slow paths in src/lock.c).
 *
 * Mutual exclusion: threads that add to a plain (non-atomic) counter under
 * the lock lose no addition, and no two of them are ever inside at once (a
 * flag each sets on entry must be clear). Sleeping waiters: while the lock is
 * held far longer than any spin, waiters go to sleep on the futex (the lock
 * word reads 2), and every one of them gets the lock after the holder lets
 * go; none gets it before. trylock fails while the lock is held, succeeds
 * when it is free, and an unlock after it leaves the lock free.
 *
 * The thread caches' spin lock: the same mutual exclusion with more threads
 * than cores, and waiters held off by a holder that sleeps far longer than
 * any spin (so they must yield) all get it once it is let go, none before.
 */
#include "test_util.h"

#include "lock.h"

#include <pthread.h>
#include <string.h>
#include <time.h>

#define THREADS 6
#define ROUNDS 200000

typedef struct shared_s {
    int spin;             /* which lock the threads take: 0 the heap's, 1 a thread cache's */
    cuh_lock_t lock;
    cuh_spinlock_t spin_lock;
    long counter;         /* only ever touched under the lock */
    int inside;           /* 1 while a thread is between lock and unlock */
    int overlaps;         /* times a thread found another inside */
    int entered;          /* waiters that got the lock */
    _Atomic int waiting;  /* waiters started */
} shared_t;

static void shared_init(shared_t *s, int spin)
{
    memset(s, 0, sizeof *s);
    s->spin = spin;
    cuh_lock_init(&s->lock);
    cuh_spin_init(&s->spin_lock);
}

static void take(shared_t *s)
{
    if (s->spin)
        cuh_spin_lock(&s->spin_lock);
    else
        cuh_lock(&s->lock);
}

static int try_take(shared_t *s) { return s->spin ? cuh_spin_trylock(&s->spin_lock) : cuh_trylock(&s->lock); }

static void give_back(shared_t *s)
{
    if (s->spin)
        cuh_spin_unlock(&s->spin_lock);
    else
        cuh_unlock(&s->lock);
}

static void *add_many(void *arg)
{
    shared_t *s = arg;
    for (int i = 0; i < ROUNDS; i++) {
        take(s);
        if (s->inside)
            s->overlaps++;
        s->inside = 1;
        s->counter++;
        s->inside = 0;
        give_back(s);
    }
    return NULL;
}

/* THREADS threads add ROUNDS each under the lock; then trylock takes the free
 * lock, fails on the held one and takes it again once let go. */
static void lose_no_update_and_never_overlap(int spin)
{
    shared_t s;
    shared_init(&s, spin);
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, add_many, &s), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(s.counter, (long)THREADS * ROUNDS);
    assert_int_equal(s.overlaps, 0);
    assert_true(try_take(&s));
    assert_false(try_take(&s));
    give_back(&s);
    assert_true(try_take(&s));
    give_back(&s);
}

static void test_threads_lose_no_update_and_never_overlap(void **state)
{
    (void)state;
    lose_no_update_and_never_overlap(0);
}

static void test_spin_lock_threads_lose_no_update_and_never_overlap(void **state)
{
    (void)state;
    lose_no_update_and_never_overlap(1);
}

static void *enter_once(void *arg)
{
    shared_t *s = arg;
    atomic_fetch_add(&s->waiting, 1);
    take(s);
    s->entered++;
    give_back(s);
    return NULL;
}

static void sleep_ms(long ms)
{
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

/* The lock held far longer than any spin while THREADS waiters start: none
 * gets it before it is let go, every one after. Returns with the waiters
 * still waiting and the lock held, for the caller's checks, then lets go. */
static void hold_long_then_let_go(shared_t *s, void (*while_held)(shared_t *))
{
    take(s);
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, enter_once, s), 0);
    for (int i = 0; i < 400 && atomic_load(&s->waiting) < THREADS; i++)
        sleep_ms(1);
    sleep_ms(200);
    assert_int_equal(atomic_load(&s->waiting), THREADS);
    assert_int_equal(s->entered, 0);
    assert_false(try_take(s));
    if (while_held)
        while_held(s);
    give_back(s);
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(s->entered, THREADS);
    assert_true(try_take(s));
    give_back(s);
}

static void waiters_are_asleep(shared_t *s)
{
#ifndef CUH_LOCK_PTHREAD
    /* Far longer than any spin: every waiter ends up asleep on the futex. */
    assert_int_equal(atomic_load(&s->lock.state), 2);
#else
    (void)s;
#endif
}

static void test_waiters_sleep_while_held_and_all_enter_after(void **state)
{
    (void)state;
    shared_t s;
    shared_init(&s, 0);
    hold_long_then_let_go(&s, waiters_are_asleep);
#ifndef CUH_LOCK_PTHREAD
    assert_int_equal(atomic_load(&s.lock.state), 0);
#endif
}

/* A thread cache's lock: its waiters spin and yield (the holder may have
 * lost its core), and still get it once it is let go. */
static void test_spin_lock_waiters_get_it_after_a_long_hold_and_not_before(void **state)
{
    (void)state;
    shared_t s;
    shared_init(&s, 1);
    hold_long_then_let_go(&s, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_threads_lose_no_update_and_never_overlap),
        cmocka_unit_test(test_waiters_sleep_while_held_and_all_enter_after),
        cmocka_unit_test(test_spin_lock_threads_lose_no_update_and_never_overlap),
        cmocka_unit_test(test_spin_lock_waiters_get_it_after_a_long_hold_and_not_before),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
