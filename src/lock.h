/* lock.h - the heap's lock: a mutex that spins before it sleeps.
 *
 * Every heap operation takes its device's lock for a few hundred
 * nanoseconds. When threads contend, a lock that puts waiters to sleep at
 * once (or after a short spin, as glibc's adaptive mutex does) hands over
 * through the kernel: each hand-over waits for a woken thread to be
 * scheduled, several microseconds in which nobody holds the lock, and the
 * threads queue behind it (a lock convoy). This one spins on the lock word
 * for a bounded time first (a waiter usually gets it within one holder's
 * critical section), looking at it after longer and longer pauses so that
 * waiters do not keep its cache line from the holder, and only then sleeps
 * on a futex, so a machine with more threads than cores still makes
 * progress. The protocol is the classic
 * three-state futex mutex: 0 free, 1 held, 2 held with sleepers.
 *
 * A thread cache's lock is another kind (cuh_spinlock_t): its own thread
 * takes it on every fast-path allocation and free, and others only now and
 * then (a flush, statistics), for a few microseconds at most. Nobody sleeps
 * on it, so letting go is a plain store where the mutex needs an atomic
 * exchange to learn whether to wake a sleeper: one atomic instruction a
 * take-and-release instead of two (each costs 5-15 ns on the hosts
 * measured: the 2-core machine and the H200's 16-core host). A waiter spins
 * and, after a while, yields its core (the holder may have been preempted).
 */
#ifndef CUH_LOCK_H
#define CUH_LOCK_H

#ifdef CUH_LOCK_PTHREAD
/* The lock this one replaced, glibc's adaptive mutex, kept for measuring the
 * two side by side: `make BUILD=build/pt OPT="-O2 -g -DCUH_LOCK_PTHREAD"
 * JEMALLOC=build/jemalloc-5.3.0 build/pt/bench_heap`. */
#include <pthread.h>

typedef pthread_mutex_t cuh_lock_t;

static inline void cuh_lock_init(cuh_lock_t *l)
{
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ADAPTIVE_NP);
    pthread_mutex_init(l, &attr);
    pthread_mutexattr_destroy(&attr);
}
static inline int cuh_trylock(cuh_lock_t *l) { return pthread_mutex_trylock(l) == 0; }
static inline void cuh_lock(cuh_lock_t *l) { pthread_mutex_lock(l); }
static inline void cuh_unlock(cuh_lock_t *l) { pthread_mutex_unlock(l); }

typedef pthread_mutex_t cuh_spinlock_t;
static inline void cuh_spin_init(cuh_spinlock_t *l) { cuh_lock_init(l); }
static inline int cuh_spin_trylock(cuh_spinlock_t *l) { return cuh_trylock(l); }
static inline void cuh_spin_lock(cuh_spinlock_t *l) { cuh_lock(l); }
static inline void cuh_spin_unlock(cuh_spinlock_t *l) { cuh_unlock(l); }

#else

#include <stdatomic.h>
#include <stdint.h>

typedef struct cuh_lock_s {
    _Atomic uint32_t state;
} cuh_lock_t;

void cuh_lock_slow(cuh_lock_t *l);
void cuh_unlock_wake(cuh_lock_t *l);

static inline void cuh_lock_init(cuh_lock_t *l) { atomic_init(&l->state, 0); }

static inline int cuh_trylock(cuh_lock_t *l)
{
    uint32_t free_state = 0;
    return atomic_compare_exchange_strong_explicit(&l->state, &free_state, 1, memory_order_acquire,
                                                   memory_order_relaxed);
}

static inline void cuh_lock(cuh_lock_t *l)
{
    if (__builtin_expect(!cuh_trylock(l), 0))
        cuh_lock_slow(l);
}

static inline void cuh_unlock(cuh_lock_t *l)
{
    if (__builtin_expect(atomic_exchange_explicit(&l->state, 0, memory_order_release) == 2, 0))
        cuh_unlock_wake(l);
}

typedef struct cuh_spinlock_s {
    _Atomic uint32_t held;
} cuh_spinlock_t;

void cuh_spin_lock_slow(cuh_spinlock_t *l);

static inline void cuh_spin_init(cuh_spinlock_t *l) { atomic_init(&l->held, 0); }

static inline int cuh_spin_trylock(cuh_spinlock_t *l)
{
    return atomic_exchange_explicit(&l->held, 1, memory_order_acquire) == 0;
}

static inline void cuh_spin_lock(cuh_spinlock_t *l)
{
    if (__builtin_expect(!cuh_spin_trylock(l), 0))
        cuh_spin_lock_slow(l);
}

static inline void cuh_spin_unlock(cuh_spinlock_t *l) { atomic_store_explicit(&l->held, 0, memory_order_release); }

#endif /* CUH_LOCK_PTHREAD */
#endif
