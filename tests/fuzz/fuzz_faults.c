/* fuzz_faults.c - the heap's fuzz target (fuzz_heap.c) under fault plans.
 *
 * The same random operations and the same rules checked after every step,
 * with the simulated GPU behind a fault plan (device_fault.c) that the input
 * changes as it goes: the Nth call of a kind fails, a kind fails at random,
 * or a sticky error fails every call from some point (a lost context). Beside
 * fuzz_heap's rules it checks that a public call that fails returns a device
 * error whose message names the device call that failed, or the
 * out-of-memory an allocation call was made to answer; that a refused free
 * leaves the block the program's; and that once the plan ends every block,
 * page and event goes back. Built like fuzz_heap (`make fuzz`,
 * FUZZ_TARGETS=faults; `make test` replays tests/fuzz/corpus/faults).
 */
#define FUZZ_FAULTS 1
#include "fuzz_heap.c"
