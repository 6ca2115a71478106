/* no_cuda.c - a program that uses no CUDA, run under
 * LD_PRELOAD=libcuheap.so: it looks a symbol up with dlsym, as many programs
 * and every Python extension import do, and then checks /proc/self/maps that
 * libcuda.so.1 was not loaded into it (cuheap must load nothing the program
 * did not). Exit status 0 when it was not.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

int main(void)
{
    void *sym = dlsym(RTLD_DEFAULT, "printf");
    void *next = dlsym(RTLD_NEXT, "malloc");
    FILE *maps = fopen("/proc/self/maps", "r");
    if (!sym || !next || !maps) {
        printf("FAIL: dlsym or /proc/self/maps failed\n");
        return 1;
    }
    char line[4096];
    int loaded = 0;
    while (fgets(line, sizeof line, maps))
        loaded |= strstr(line, "libcuda.so") != NULL;
    fclose(maps);
    if (loaded) {
        printf("FAIL: libcuda.so.1 was loaded into a program that uses no CUDA\n");
        return 1;
    }
    printf("ok no-cuda\n");
    return 0;
}
