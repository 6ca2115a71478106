// vm_offset_probe.cu - can one mapping take part of a physical allocation?
//
// A physical unit of several pages (vmm_unit) strands its free pages while a
// block lies on the others: it can only be unmapped whole. If the driver
// mapped a run of an allocation's pages at an offset (cuMemMap's `offset`),
// those free pages could move on their own. This asks the driver: an
// allocation of 4 granules, mapped in part at offset 0, in part past it, and
// whole. On an H100 with driver 580.159 only the whole mapping is taken
// (CUDA_ERROR_NOT_SUPPORTED for the rest): bench/HISTORY.md, "Pieces of a
// unit". Build: nvcc -O2 bench/gpu/vm_offset_probe.cu -lcuda
#include <cuda.h>
#include <stdio.h>

static int failed;

static void show(const char *what, CUresult r)
{
    const char *name = 0;
    cuGetErrorName(r, &name);
    printf("%-44s %s\n", what, name ? name : "?");
    failed |= r != CUDA_SUCCESS;
}

int main(void)
{
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
        fprintf(stderr, "vm_offset_probe: no CUDA device\n");
        return 2;
    }
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t g = 0;
    cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    printf("granularity %zu bytes\n", g);
    CUmemGenericAllocationHandle h;
    CUdeviceptr va;
    if (cuMemCreate(&h, 4 * g, &prop, 0) != CUDA_SUCCESS || cuMemAddressReserve(&va, 16 * g, 0, 0, 0) != CUDA_SUCCESS) {
        fprintf(stderr, "vm_offset_probe: cannot create or reserve\n");
        return 2;
    }
    show("first granule, offset 0", cuMemMap(va, g, 0, h, 0));
    show("second granule, offset 1 granule", cuMemMap(va + 2 * g, g, g, h, 0));
    show("last two granules, offset 2 granules", cuMemMap(va + 4 * g, 2 * g, 2 * g, h, 0));
    show("the whole allocation", cuMemMap(va + 8 * g, 4 * g, 0, h, 0));
    return failed;   // 0 only if the driver takes parts of an allocation
}
