/* lock.c - the slow paths of the locks of lock.h: the heap's lock spins for
 * a bounded time, looking at the lock less and less often, then sleeps on a
 * futex until the holder wakes a waiter; a
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
 * than glibc's adaptive mutex and 4000 faster (bench/HISTORY.md). */
#ifndef CUH_LOCK_SPINS
#define CUH_LOCK_SPINS 4000
#endif

/* The longest pause run between two looks at the lock word. A waiter that
 * finds the lock held waits 1, 2, 4, ... pauses before it looks again, up to
 * this many: with every waiter reading the word at each pause, each release
 * had to take the word's cache line back from all of them, and each failed
 * compare-and-swap took it away from the new holder again, so hand-overs
 * grew slower with every waiter. Against looking at every pause, on the
 * H200's 16-core host: 4 KiB pairs without thread caches 2.1-4.9x the
 * throughput at 2-16 threads, random large sizes 1.3-3.4x at 2-8 threads
 * and 1.0-1.2x at 16; on the 2-core machine 0.8-3.3x, better in 22 of 24
 * cells. 1024 and 4096 measured the same as 256, 16 and 64 less
 * (bench/HISTORY-speed.md, "The heap's lock backs off"). */
#ifndef CUH_LOCK_BACKOFF_MAX
#define CUH_LOCK_BACKOFF_MAX 256
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
    unsigned backoff = 1;
    for (unsigned spun = 0; spun < CUH_LOCK_SPINS; spun += backoff) {
        uint32_t s = atomic_load_explicit(&l->state, memory_order_relaxed);
        if (s == 0 && cuh_trylock(l))
            return;
        for (unsigned k = 0; k < backoff; k++)
            cpu_relax();
        if (backoff < CUH_LOCK_BACKOFF_MAX)
            backoff *= 2;
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
