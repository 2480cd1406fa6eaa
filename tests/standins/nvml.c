/*
 * STAND-IN for libnvidia-ml.so.1, for tests on machines without an NVIDIA GPU.
 *
 * It exports the NVML entry points buildmatrix's probe calls through the real
 * nvidia-ml-py bindings, with the C signatures of nvml.h, and answers from a JSON
 * scenario named by $NVML_STANDIN_SCENARIO (tests/standins/README.md). Any field's
 * value may be an error name such as "NVML_ERROR_GPU_IS_LOST": the call that reads
 * it then returns that error, as the real library does.
 *
 * Build: gcc -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 -o libnvidia-ml.so.1 nvml.c
 */
#include <stdint.h>

#include "scenario.h"

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;

static jval *scn;

static const struct { const char *name; int code; } errors[] = {
    {"NVML_SUCCESS", 0},
    {"NVML_ERROR_UNINITIALIZED", 1},
    {"NVML_ERROR_INVALID_ARGUMENT", 2},
    {"NVML_ERROR_NOT_SUPPORTED", 3},
    {"NVML_ERROR_NO_PERMISSION", 4},
    {"NVML_ERROR_NOT_FOUND", 6},
    {"NVML_ERROR_INSUFFICIENT_SIZE", 7},
    {"NVML_ERROR_DRIVER_NOT_LOADED", 9},
    {"NVML_ERROR_TIMEOUT", 10},
    {"NVML_ERROR_LIBRARY_NOT_FOUND", 12},
    {"NVML_ERROR_CORRUPTED_INFOROM", 14},
    {"NVML_ERROR_GPU_IS_LOST", 15},
    {"NVML_ERROR_RESET_REQUIRED", 16},
    {"NVML_ERROR_LIB_RM_VERSION_MISMATCH", 18},
    {"NVML_ERROR_UNKNOWN", 999},
};

/* The error a value names (0 when it is not an error name). */
static int error_of(const jval *v) {
    if (!v || v->type != J_STR || strncmp(v->str, "NVML_", 5)) return 0;
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (!strcmp(errors[i].name, v->str)) return errors[i].code;
    return 999;
}

static jval *gpu(nvmlDevice_t device) {
    return jat(jget(scn, "gpus"), (int)(uintptr_t)device - 1);
}

/* Field `key` of the GPU; returns the error to answer with, or 0 and sets *out. */
static int field(nvmlDevice_t device, const char *key, jval **out) {
    jval *g = gpu(device);
    if (!scn) return 1;              /* NVML_ERROR_UNINITIALIZED */
    if (!g) return 2;                /* NVML_ERROR_INVALID_ARGUMENT */
    jval *v = jget(g, key);
    if (!v) return 3;                /* not in the scenario: NOT_SUPPORTED */
    int err = error_of(v);
    if (err) return err;
    *out = v;
    return 0;
}

static void copy_str(char *dst, unsigned int size, const char *src) {
    if (!size) return;
    strncpy(dst, src, size - 1);
    dst[size - 1] = 0;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    if (!scn) scn = scenario_load("NVML_STANDIN_SCENARIO");
    if (!scn) return 9; /* no scenario: behave as a node without a loaded driver */
    return error_of(jget(scn, "init"));
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(nvmlReturn_t result) {
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].code == result) return errors[i].name;
    return "NVML_ERROR_UNKNOWN";
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    jval *v = jget(scn, "driver_version");
    if (!v) return 3;
    if (error_of(v)) return error_of(v);
    copy_str(version, length, v->str);
    return 0;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion) {
    jval *v = jget(scn, "cuda_driver_version");
    if (!v) return 3;
    if (error_of(v)) return error_of(v);
    *cudaDriverVersion = (int)v->num;
    return 0;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) {
    jval *gpus = jget(scn, "gpus");
    *deviceCount = gpus ? (unsigned int)gpus->len : 0;
    return 0;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    jval *g = jat(jget(scn, "gpus"), (int)index);
    if (!g) return 2;
    int err = error_of(jget(g, "handle"));
    if (err) return err;
    *device = (nvmlDevice_t)(uintptr_t)(index + 1);
    return 0;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    jval *v;
    int err = field(device, "name", &v);
    if (!err) copy_str(name, length, v->str);
    return err;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    jval *v;
    int err = field(device, "uuid", &v);
    if (!err) copy_str(uuid, length, v->str);
    return err;
}

/* nvmlPciInfo_t (nvml.h, v3 layout) */
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    jval *v;
    int err = field(device, "pci_bus_id", &v);
    if (err) return err;
    memset(pci, 0, sizeof *pci);
    copy_str(pci->busId, sizeof pci->busId, v->str);
    copy_str(pci->busIdLegacy, sizeof pci->busIdLegacy, v->str);
    return 0;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    jval *v;
    int err = field(device, "compute_capability", &v);
    if (err) return err;
    *major = (int)jat(v, 0)->num;
    *minor = (int)jat(v, 1)->num;
    return 0;
}

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    jval *v;
    int err = field(device, "memory_total_bytes", &v);
    if (err) return err;
    memory->total = (unsigned long long)v->num;
    memory->used = 0;
    memory->free = memory->total;
    return 0;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending) {
    jval *v;
    int err = field(device, "mig_mode", &v);
    if (err) return err;
    *current = (unsigned int)jat(v, 0)->num;
    *pending = (unsigned int)jat(v, 1)->num;
    return 0;
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int errorType, int counterType,
                                         unsigned long long *eccCounts) {
    jval *v;
    /* buildmatrix asks for uncorrected (1), volatile (0); the scenario holds that one. */
    if (errorType != 1 || counterType != 0) return 2;
    int err = field(device, "ecc_uncorrected_volatile", &v);
    if (!err) *eccCounts = (unsigned long long)v->num;
    return err;
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, int *isPending) {
    jval *v;
    int err = field(device, "retired_pages_pending", &v);
    if (!err) *isPending = (int)v->num;
    return err;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows,
                                       unsigned int *uncRows, unsigned int *isPending,
                                       unsigned int *failureOccurred) {
    jval *v;
    int err = field(device, "remapped_rows", &v);
    if (err) return err;
    *corrRows = (unsigned int)jat(v, 0)->num;
    *uncRows = (unsigned int)jat(v, 1)->num;
    *isPending = (unsigned int)jat(v, 2)->num;
    *failureOccurred = (unsigned int)jat(v, 3)->num;
    return 0;
}

nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, int *brand) {
    jval *v;
    int err = field(device, "brand", &v);
    if (!err) *brand = (int)v->num;
    return err;
}

nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, int *mode) {
    jval *v;
    int err = field(device, "persistence_mode", &v);
    if (!err) *mode = (int)v->num;
    return err;
}
