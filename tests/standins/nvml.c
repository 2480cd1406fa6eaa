/*
 * STAND-IN for libnvidia-ml.so.1, for tests on machines without an NVIDIA GPU.
 *
 * It exports the NVML entry points buildmatrix's probe calls through the real
 * nvidia-ml-py bindings, with the C signatures of nvml.h, and answers from a JSON
 * scenario named by $NVML_STANDIN_SCENARIO (tests/standins/README.md). Any field's
 * value may be an error name such as "NVML_ERROR_GPU_IS_LOST": the call that reads
 * it then returns that error, as the real library does.
 *
 * MIG (nvml.h, "Multi Instance GPU Management"): a GPU whose "mig_mode" is current
 * on answers nvmlDeviceGetMemoryInfo with NVML_ERROR_NO_PERMISSION unless the
 * scenario's "mig_monitor" is true (nvml.h: in MIG mode the parent handle gives
 * aggregate information "only if the caller has appropriate privileges"; the NVIDIA
 * container toolkit grants them with NVIDIA_MIG_MONITOR_DEVICES). Its MIG devices
 * ("mig_devices", null for an unused index) are reached through
 * nvmlDeviceGetMigDeviceHandleByIndex below "max_mig_devices": NOT_FOUND for an
 * index without a device, INVALID_ARGUMENT past the maximum, as nvml.h documents.
 *
 * A scenario whose "init" is "hang" never returns from nvmlInit: NVML on a node whose
 * GPU or driver is wedged, where nvidia-smi hangs too.
 *
 * Handles: a GPU is index + 1; a MIG device (GPU + 1) << 16 | (index + 1); a GPU
 * instance (GPU + 1) << 16 | 0x8000 | id.
 *
 * Build: gcc -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 -o libnvidia-ml.so.1 nvml.c
 */
#include <stdint.h>
#include <unistd.h>

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

#define MIG_SHIFT 16
#define GI_FLAG 0x8000

static jval *gpu(nvmlDevice_t device) {
    uintptr_t h = (uintptr_t)device;
    if (h >> MIG_SHIFT) return NULL; /* a MIG device or GPU instance, not a GPU */
    return jat(jget(scn, "gpus"), (int)h - 1);
}

static jval *parent_of(uintptr_t h) { return jat(jget(scn, "gpus"), (int)(h >> MIG_SHIFT) - 1); }

/* The MIG device a handle names, or NULL. */
static jval *mig(nvmlDevice_t device) {
    uintptr_t h = (uintptr_t)device;
    if (!(h >> MIG_SHIFT) || (h & GI_FLAG)) return NULL;
    jval *m = jat(jget(parent_of(h), "mig_devices"), (int)(h & 0xffff) - 1);
    return m && m->type == J_OBJ ? m : NULL;
}

static int mig_enabled(const jval *g) {
    jval *mode = jget(g, "mig_mode");
    return mode && mode->type == J_ARR && jat(mode, 0)->num == 1;
}

/* Field `key` of the GPU or MIG device; returns the error to answer with, or 0 and
 * sets *out. */
static int field(nvmlDevice_t device, const char *key, jval **out) {
    jval *g = gpu(device);
    if (!g) g = mig(device);
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
    jval *init = jget(scn, "init");
    if (init && init->type == J_STR && !strcmp(init->str, "hang"))
        for (;;) pause();
    return error_of(init);
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
    jval *v, *monitor = jget(scn, "mig_monitor");
    jval *g = gpu(device);
    if (g && mig_enabled(g) && !(monitor && monitor->num)) return 4; /* NO_PERMISSION */
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

/* ---- MIG (nvml.h, "Multi Instance GPU Management") ---- */

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    jval *g = gpu(device);
    if (!g) return 2;
    jval *max = jget(g, "max_mig_devices");
    *count = mig_enabled(g) && max ? (unsigned int)max->num : 0; /* zero when MIG is off */
    return 0;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                 nvmlDevice_t *migDevice) {
    jval *g = gpu(device);
    if (!g) return 2;
    if (!mig_enabled(g)) return 3;
    jval *max = jget(g, "max_mig_devices");
    if (!max || index >= (unsigned int)max->num) return 2; /* INVALID_ARGUMENT */
    jval *m = jat(jget(g, "mig_devices"), (int)index);
    if (!m || m->type != J_OBJ) return 6; /* NOT_FOUND: no MIG device at index */
    *migDevice = (nvmlDevice_t)(((uintptr_t)device << MIG_SHIFT) | (index + 1));
    return 0;
}

static int mig_number(nvmlDevice_t device, const char *key, unsigned int *out) {
    jval *v;
    if (!mig(device)) return 2;
    int err = field(device, key, &v);
    if (!err) *out = (unsigned int)v->num;
    return err;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    return mig_number(device, "gpu_instance_id", id);
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    return mig_number(device, "compute_instance_id", id);
}

/* nvmlDeviceAttributes_t (nvml.h) */
typedef struct {
    unsigned int multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount,
        sharedEncoderCount, sharedJpegCount, sharedOfaCount, gpuInstanceSliceCount,
        computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *a) {
    jval *v;
    if (!mig(device)) return 3; /* "currently only supports MIG device handles" */
    int err = field(device, "attributes", &v);
    if (err) return err;
    unsigned int *u = &a->multiprocessorCount;
    for (int i = 0; i < 8; i++) u[i] = (unsigned int)jat(v, i)->num;
    a->memorySizeMB = (unsigned long long)jat(v, 8)->num;
    return 0;
}

/* nvmlGpuInstanceProfileInfo_t (nvml.h, v1 layout) */
typedef struct {
    unsigned int id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount,
        copyEngineCount, decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                 nvmlGpuInstanceProfileInfo_t *info) {
    jval *g = gpu(device), *profiles;
    if (!g || profile >= 0x12) return 2; /* past NVML_GPU_INSTANCE_PROFILE_COUNT */
    if (!(profiles = jget(g, "gi_profiles"))) return 3; /* no MIG on this GPU */
    for (int i = 0; i < profiles->len; i++) {
        jval *p = jat(profiles, i);
        if (jget(p, "profile")->num != profile) continue;
        memset(info, 0, sizeof *info);
        info->id = (unsigned int)jget(p, "id")->num;
        return 0;
    }
    return 3; /* profile not supported on this GPU */
}

typedef void *nvmlGpuInstance_t;
typedef struct {
    nvmlDevice_t device;
    unsigned int id, profileId;
    struct { unsigned int start, size; } placement;
} nvmlGpuInstanceInfo_t;

/* The first MIG device of the GPU in GPU instance `id`, or NULL. */
static jval *in_instance(const jval *g, unsigned int id) {
    jval *migs = jget(g, "mig_devices");
    for (int i = 0; migs && i < migs->len; i++) {
        jval *m = jat(migs, i);
        if (m->type == J_OBJ && jget(m, "gpu_instance_id")->num == id) return m;
    }
    return NULL;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id,
                                          nvmlGpuInstance_t *gpuInstance) {
    jval *g = gpu(device);
    if (!g || id >= GI_FLAG) return 2;
    if (!mig_enabled(g)) return 3;
    if (!in_instance(g, id)) return 6;
    *gpuInstance = (nvmlGpuInstance_t)(((uintptr_t)device << MIG_SHIFT) | GI_FLAG | id);
    return 0;
}

nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t *info) {
    uintptr_t h = (uintptr_t)gpuInstance;
    if (!(h & GI_FLAG)) return 2;
    unsigned int id = (unsigned int)(h & (GI_FLAG - 1));
    jval *m = in_instance(parent_of(h), id);
    if (!m) return 2;
    memset(info, 0, sizeof *info);
    info->device = (nvmlDevice_t)(h >> MIG_SHIFT);
    info->id = id;
    info->profileId = (unsigned int)jget(m, "gi_profile_id")->num;
    return 0;
}

/* ---- who else computes on the GPU (nvml.h, "Device Queries") ---- */

/* nvmlComputeMode_t: 0 DEFAULT, 1 EXCLUSIVE_THREAD, 2 PROHIBITED, 3 EXCLUSIVE_PROCESS */
nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, int *mode) {
    jval *v;
    int err = field(device, "compute_mode", &v);
    if (!err) *mode = (int)v->num;
    return err;
}

/* nvmlProcessInfo_t (nvml.h, v2/v3 layout) */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

/* As nvml.h documents it: with *infoCount too small (0 and a NULL array to ask the
 * size) NVML_ERROR_INSUFFICIENT_SIZE and the count needed; NVML_SUCCESS and 0 when
 * no process runs. The scenario's "processes": [{"pid", "used_bytes"}]. */
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos) {
    jval *v;
    int err = field(device, "processes", &v);
    if (err) return err;
    if ((unsigned int)v->len > *infoCount || (!infos && v->len)) {
        *infoCount = (unsigned int)v->len;
        return 7; /* NVML_ERROR_INSUFFICIENT_SIZE */
    }
    for (int i = 0; i < v->len; i++) {
        memset(&infos[i], 0, sizeof infos[i]);
        infos[i].pid = (unsigned int)jget(jat(v, i), "pid")->num;
        infos[i].usedGpuMemory = (unsigned long long)jget(jat(v, i), "used_bytes")->num;
        infos[i].gpuInstanceId = infos[i].computeInstanceId = 0xFFFFFFFF;
    }
    *infoCount = (unsigned int)v->len;
    return 0;
}
