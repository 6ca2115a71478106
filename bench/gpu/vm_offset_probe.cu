// vm_offset_probe.cu - can one mapping take part of a physical allocation?
//
// A physical unit of several pages (vmm_unit) strands its free pages while a
// block lies on the others: it can only be unmapped whole. If the driver
// mapped a run of an allocation's pages at an offset (cuMemMap's `offset`),
// those free pages could move on their own. This asks the driver: an
// allocation of 4 granules, mapped in part at offset 0, in part past it, and
// whole. On an H100 with driver 580.159 only the whole mapping is taken
// (CUDA_ERROR_NOT_SUPPORTED for the rest): bench/HISTORY.md, "Pieces of a
// unit". `make gpu-check` runs it; the last line says which. Exit 0 either
// way, 2 if there is no device to ask.
// Build: nvcc -O2 bench/gpu/vm_offset_probe.cu -lcuda
#include <cuda.h>
#include <stdio.h>

static int parts_taken, whole_taken;

static int show(const char *what, CUresult r)
{
    const char *name = 0;
    cuGetErrorName(r, &name);
    printf("%-44s %s\n", what, name ? name : "?");
    return r == CUDA_SUCCESS;
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
    parts_taken += show("first granule, offset 0", cuMemMap(va, g, 0, h, 0));
    parts_taken += show("second granule, offset 1 granule", cuMemMap(va + 2 * g, g, g, h, 0));
    parts_taken += show("last two granules, offset 2 granules", cuMemMap(va + 4 * g, 2 * g, 2 * g, h, 0));
    whole_taken = show("the whole allocation", cuMemMap(va + 8 * g, 4 * g, 0, h, 0));
    if (!whole_taken)
        printf("the driver refused even a whole allocation\n");
    else if (!parts_taken)
        printf("whole allocations only: no part of one maps (as cuheap assumes)\n");
    else
        printf("%d of 3 parts of an allocation mapped: units could move in pieces (bench/HISTORY.md)\n",
               parts_taken);
    return 0;
}
