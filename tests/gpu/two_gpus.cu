/* two_gpus.cu - one process driving two GPUs under LD_PRELOAD=libcuheap.so
 * (what `make gpu-check` runs on a machine with two GPUs, with vmm:0 and
 * vmm:1). The program knows nothing of cuheap; it reads cuheap's statistics
 * through dlsym. Checks, each printing PASS or FAIL:
 *   a. heaps     cudaMalloc after cudaSetDevice(d) lands in device d's heap,
 *                and a kernel on d fills it
 *   b. cross     a block of device 1 freed while device 0 is current goes
 *                back to device 1's heap
 *   c. peer      after cudaDeviceEnablePeerAccess(1) on device 0, a kernel on
 *                device 0 reads and writes device 1's blocks, allocated
 *                before and after the call (under vmm:1 cuheap's pages must
 *                be granted to the peer, or the kernel faults)
 *   d. copy      cudaMemcpyPeer between the devices' blocks
 *   e. pinned    a pinned buffer from device 0's thread copied to both
 *                devices, freed, and its memory not handed out before both
 *                copies ran
 * Prints "two_gpus: all checks passed" or "two_gpus: FAILED"; "two_gpus:
 * skipped" with fewer than two GPUs. Exit status 0 unless a check failed.
 */
#include <cuda_runtime.h>
#include <dlfcn.h>

#include "cuheap.h"   /* types only: the program reaches cuheap through dlsym */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB ((size_t)1 << 20)
#define N (64 * MiB)

static int failures;

static void report(const char *name, int ok, const char *detail)
{
    printf("%s %-8s %s\n", ok ? "PASS" : "FAIL", name, detail);
    if (!ok)
        failures++;
}

static cuheap_stats_t stats(int device)
{
    cuheap_stats_t st;
    memset(&st, 0, sizeof st);
    cuheap_status_t (*get)(int, cuheap_stats_t *);
    void *sym = dlsym(RTLD_DEFAULT, "cuheap_get_stats");
    memcpy(&get, &sym, sizeof get);
    if (get)
        get(device, &st);
    return st;
}

__global__ void fill(unsigned char *p, size_t n, unsigned char v)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = v;
}

/* dst[i] = src[i] + 1, counting bytes of src that are not `expect`. */
__global__ void bump(const unsigned char *src, unsigned char *dst, size_t n, unsigned char expect,
                     unsigned long long *bad)
{
    unsigned long long b = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        b += src[i] != expect;
        dst[i] = (unsigned char)(src[i] + 1);
    }
    if (b)
        atomicAdd(bad, b);
}

__global__ void spin(long long cycles)
{
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}

static unsigned long long count_not(const unsigned char *dev, size_t n, unsigned char v)
{
    unsigned char *host = (unsigned char *)malloc(n);
    cudaMemcpy(host, dev, n, cudaMemcpyDeviceToHost);
    unsigned long long bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += host[i] != v;
    free(host);
    return bad;
}

int main(void)
{
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 2) {
        printf("two_gpus: skipped (%d GPU)\n", ndev);
        return 0;
    }
    char detail[256];
    unsigned char *a[2], *late[2];
    cuheap_stats_t before[2];
    for (int d = 0; d < 2; d++)
        before[d] = stats(d);

    /* a. a heap per device */
    int ok = 1;
    for (int d = 0; d < 2; d++) {
        cudaSetDevice(d);
        ok &= cudaMalloc((void **)&a[d], N) == cudaSuccess;
        fill<<<1024, 256>>>(a[d], N, (unsigned char)(d + 1));
        ok &= cudaDeviceSynchronize() == cudaSuccess;
    }
    cuheap_stats_t s0 = stats(0), s1 = stats(1);
    snprintf(detail, sizeof detail, "device 0's heap +%llu allocations, device 1's +%llu",
             (unsigned long long)(s0.num_allocs - before[0].num_allocs),
             (unsigned long long)(s1.num_allocs - before[1].num_allocs));
    report("heaps", ok && s0.num_allocs > before[0].num_allocs && s1.num_allocs > before[1].num_allocs, detail);

    /* b. a block of device 1 freed from device 0 */
    cudaSetDevice(1);
    unsigned char *tmp = NULL;
    ok = cudaMalloc((void **)&tmp, MiB) == cudaSuccess;
    cudaSetDevice(0);
    unsigned long long frees1 = stats(1).num_frees, frees0 = stats(0).num_frees;
    ok &= cudaFree(tmp) == cudaSuccess;
    snprintf(detail, sizeof detail, "device 1's heap +%llu frees, device 0's +%llu",
             (unsigned long long)(stats(1).num_frees - frees1), (unsigned long long)(stats(0).num_frees - frees0));
    report("cross", ok && stats(1).num_frees == frees1 + 1 && stats(0).num_frees == frees0, detail);

    /* c. peer access, blocks from before and after enabling it */
    int can = 0;
    cudaDeviceCanAccessPeer(&can, 0, 1);
    cudaSetDevice(0);
    cudaError_t pe = cudaDeviceEnablePeerAccess(1, 0);
    cudaSetDevice(1);
    ok = cudaMalloc((void **)&late[1], N) == cudaSuccess;
    fill<<<1024, 256>>>(late[1], N, 7);
    cudaDeviceSynchronize();
    cudaSetDevice(0);
    ok &= cudaMalloc((void **)&late[0], N) == cudaSuccess;
    unsigned long long *bad;
    cudaMalloc((void **)&bad, sizeof *bad);
    cudaMemset(bad, 0, sizeof *bad);
    bump<<<1024, 256>>>(a[1], late[0], N, 2, bad);      /* device 0 reads device 1's early block */
    bump<<<1024, 256>>>(late[0], a[1], N, 3, bad);      /* and writes it back, plus one */
    bump<<<1024, 256>>>(late[1], a[0], N, 7, bad);      /* reads device 1's late block */
    cudaError_t ke = cudaDeviceSynchronize();
    unsigned long long read_bad = 0;
    cudaMemcpy(&read_bad, bad, sizeof read_bad, cudaMemcpyDeviceToHost);
    cudaSetDevice(1);
    unsigned long long wrote_bad = count_not(a[1], N, 4);
    snprintf(detail, sizeof detail, "can access %d, enable: %s, kernels: %s, bytes read wrong %llu, written wrong %llu",
             can, cudaGetErrorString(pe), cudaGetErrorString(ke), read_bad, wrote_bad);
    report("peer", ok && can && pe == cudaSuccess && ke == cudaSuccess && read_bad == 0 && wrote_bad == 0, detail);

    /* d. cudaMemcpyPeer */
    cudaSetDevice(0);
    cudaError_t ce = cudaMemcpyPeer(a[0], 0, late[1], 1, N);
    unsigned long long copy_bad = count_not(a[0], N, 7);
    snprintf(detail, sizeof detail, "%s, bytes wrong %llu", cudaGetErrorString(ce), copy_bad);
    report("copy", ce == cudaSuccess && copy_bad == 0, detail);

    /* e. a pinned buffer copied to both devices behind slow kernels, freed */
    int khz = 0;
    cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
    cudaStream_t s[2];
    for (int d = 0; d < 2; d++) {
        cudaSetDevice(d);
        cudaStreamCreateWithFlags(&s[d], cudaStreamNonBlocking);
    }
    cudaSetDevice(0);
    unsigned char *pinned = NULL;
    ok = cudaHostAlloc((void **)&pinned, N, 0) == cudaSuccess;
    memset(pinned, 0x3C, N);
    for (int d = 0; d < 2; d++) {
        cudaSetDevice(d);
        spin<<<1, 1, 0, s[d]>>>((long long)khz * 200);
        cudaMemcpyAsync(a[d], pinned, N, cudaMemcpyHostToDevice, s[d]);
    }
    cudaSetDevice(0);
    ok &= cudaFreeHost(pinned) == cudaSuccess;
    int reused = 0;
    unsigned char *next[4];
    for (int i = 0; i < 4; i++) {
        ok &= cudaHostAlloc((void **)&next[i], N, 0) == cudaSuccess;
        reused += next[i] == pinned;
        memset(next[i], 0, N);
    }
    unsigned long long pin_bad = 0;
    for (int d = 0; d < 2; d++) {
        cudaSetDevice(d);
        ok &= cudaStreamSynchronize(s[d]) == cudaSuccess;
        pin_bad += count_not(a[d], N, 0x3C);
        cudaStreamDestroy(s[d]);
    }
    for (int i = 0; i < 4; i++)
        cudaFreeHost(next[i]);
    snprintf(detail, sizeof detail, "handed out again %d times, bytes the copies read wrong %llu", reused, pin_bad);
    report("pinned", ok && pin_bad == 0, detail);

    for (int d = 0; d < 2; d++) {
        cudaSetDevice(d);
        cudaFree(a[d]);
        cudaFree(late[d]);
    }
    cudaSetDevice(0);
    cudaFree(bad);
    printf("two_gpus: %s\n", failures ? "FAILED" : "all checks passed");
    return failures ? 1 : 0;
}
