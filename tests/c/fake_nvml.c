/*
 * A stand-in for NVIDIA's NVML (libnvidia-ml.so.1) for the tests of
 * `cudaleak top`'s header, which reads each device's free and total memory
 * through it: two devices of 80 GiB, the first with 70 GiB free, the
 * second (also named by its UUID, GPU-fake-1) with 60 GiB free. Only the
 * functions the viewer calls, with NVML's signatures.
 */
#include <string.h>

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct fake_device *nvmlDevice_t;

static struct fake_device { unsigned long long free; } devices[2] = {
    {70ULL << 30},
    {60ULL << 30},
};

int nvmlInit_v2(void) { return 0; }

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (index >= 2) return 2; /* NVML_ERROR_INVALID_ARGUMENT */
    *device = &devices[index];
    return 0;
}

int nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    if (strcmp(uuid, "GPU-fake-1") != 0) return 6; /* NVML_ERROR_NOT_FOUND */
    *device = &devices[1];
    return 0;
}

int nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    memory->total = 80ULL << 30;
    memory->free = device->free;
    memory->used = memory->total - memory->free;
    return 0;
}
