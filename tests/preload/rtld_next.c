/* rtld_next.c - dlsym(RTLD_NEXT, ...) under the preload answers relative to
 * its caller, as glibc's does, though libcuheap.so defines dlsym.
 *
 * Built three times: as libprobe_first.so and libprobe_second.so (each
 * defines probe_value, returning 1 and 2; the first also probe_next, which
 * asks for the NEXT probe_value after itself), and as the program, linked
 * with both in that order. Load order under the preload: program,
 * libcuheap.so, libprobe_first.so, libprobe_second.so. The next probe_value
 * after libprobe_first.so is libprobe_second.so's (2); answered relative to
 * libcuheap.so it would be libprobe_first.so's own (1), the mistake that
 * sends an interposer back into itself.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

#if defined(PROBE_VALUE)
__attribute__((visibility("default"))) int probe_value(void);
int probe_value(void) { return PROBE_VALUE; }
#if PROBE_VALUE == 1
__attribute__((visibility("default"))) void *probe_next(void);
void *probe_next(void) { return dlsym(RTLD_NEXT, "probe_value"); }
#endif
#else
void *probe_next(void);
int main(void)
{
    int (*next)(void);
    void *sym = probe_next();
    *(void **)&next = sym;
    int got = next ? next() : 0;
    if (got != 2) {
        printf("FAIL: dlsym(RTLD_NEXT, \"probe_value\") from libprobe_first.so gave %s%d, not libprobe_second.so's (2)\n",
               next ? "the one returning " : "nothing: ", got);
        return 1;
    }
    printf("ok rtld-next\n");
    return 0;
}
#endif
