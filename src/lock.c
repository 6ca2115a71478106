/* lock.c - the slow paths of the locks of lock.h: the heap's lock spins for
 * a bounded time, then sleeps on a futex until the holder wakes a waiter; a
 * thread cache's lock spins, yielding the core now and then. */
#include "lock.h"

#ifndef CUH_LOCK_PTHREAD

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

/* How many pauses a waiter spins before it sleeps: 15-190 us at 3 GHz (a
 * pause takes 10-140 cycles, by core), many critical sections of a heap
 * that 16 threads contend for. On the 16-core H200 host 500 was slower
 * than glibc's adaptive mutex and 4000 faster (README, "Benchmarks"). */
#ifndef CUH_LOCK_SPINS
#define CUH_LOCK_SPINS 4000
#endif

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void futex_wait(cuh_lock_t *l, uint32_t expected)
{
    syscall(SYS_futex, &l->state, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

void cuh_lock_slow(cuh_lock_t *l)
{
    for (int i = 0; i < CUH_LOCK_SPINS; i++) {
        uint32_t s = atomic_load_explicit(&l->state, memory_order_relaxed);
        if (s == 0 && cuh_trylock(l))
            return;
        cpu_relax();
    }
    /* Mark the lock as having sleepers, and sleep until it is free. */
    while (atomic_exchange_explicit(&l->state, 2, memory_order_acquire) != 0)
        futex_wait(l, 2);
}

void cuh_unlock_wake(cuh_lock_t *l)
{
    syscall(SYS_futex, &l->state, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

/* Pauses between yields of a waiter on a thread cache's lock: the holder
 * keeps it for microseconds at most, unless it lost its core. */
#define CUH_SPIN_YIELD_EVERY 1000

void cuh_spin_lock_slow(cuh_spinlock_t *l)
{
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(&l->held, memory_order_relaxed) == 0 && cuh_spin_trylock(l))
            return;
        if (i % CUH_SPIN_YIELD_EVERY == 0)
            sched_yield();
        else
            cpu_relax();
    }
}

#endif
