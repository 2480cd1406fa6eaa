/*
 * STAND-IN for libcuda.so.1, for tests on machines without an NVIDIA GPU.
 *
 * It exports the CUDA driver API entry points `smoke --load-test` calls (with the C
 * signatures of cuda.h) and answers from a JSON scenario named by
 * $CUDA_STANDIN_SCENARIO:
 *
 *   {"init": "CUDA_SUCCESS",
 *    "devices": [{"name": "NVIDIA H100 80GB HBM3", "cc": [9, 0],
 *                 "load": "CUDA_SUCCESS" | "CUDA_ERROR_NO_BINARY_FOR_GPU" | ...,
 *                 "retain": "CUDA_ERROR_DEVICE_UNAVAILABLE" (optional)}]}
 *
 * It does not run code: cuModuleLoadData checks that it was handed a real module
 * image (a fatbinary container, an ELF cubin or NUL-terminated PTX text; anything
 * else is CUDA_ERROR_INVALID_IMAGE, as the driver answers) and then returns the
 * device's scenario answer. Each call is appended to $CUDA_STANDIN_LOG, so tests see
 * what was loaded and that every context retained was released.
 *
 * Build: gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o libcuda.so.1 cuda.c
 */
#include <stdint.h>

#include "scenario.h"

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUmodule;

static jval *scn;
static int current = -1; /* device of the current context, -1 for none */

static const struct { const char *name; int code; } errors[] = {
    {"CUDA_SUCCESS", 0},
    {"CUDA_ERROR_INVALID_VALUE", 1},
    {"CUDA_ERROR_OUT_OF_MEMORY", 2},
    {"CUDA_ERROR_NOT_INITIALIZED", 3},
    {"CUDA_ERROR_INSUFFICIENT_DRIVER", 35},
    {"CUDA_ERROR_DEVICE_UNAVAILABLE", 46},
    {"CUDA_ERROR_NO_DEVICE", 100},
    {"CUDA_ERROR_INVALID_DEVICE", 101},
    {"CUDA_ERROR_INVALID_IMAGE", 200},
    {"CUDA_ERROR_INVALID_CONTEXT", 201},
    {"CUDA_ERROR_NO_BINARY_FOR_GPU", 209},
    {"CUDA_ERROR_INVALID_PTX", 218},
    {"CUDA_ERROR_JIT_COMPILER_NOT_FOUND", 221},
    {"CUDA_ERROR_UNSUPPORTED_PTX_VERSION", 222},
    {"CUDA_ERROR_UNKNOWN", 999},
};

static int code_of(const jval *v) {
    if (!v || v->type != J_STR) return 0;
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (!strcmp(errors[i].name, v->str)) return errors[i].code;
    return 999;
}

static void logf_(const char *fmt, long a, long b) {
    const char *path = getenv("CUDA_STANDIN_LOG");
    if (!path) return;
    FILE *f = fopen(path, "a");
    if (!f) return;
    fprintf(f, fmt, a, b);
    fclose(f);
}

static jval *device(int ordinal) { return jat(jget(scn, "devices"), ordinal); }

CUresult cuInit(unsigned int flags) {
    (void)flags;
    if (!scn) scn = scenario_load("CUDA_STANDIN_SCENARIO");
    if (!scn) return 100; /* CUDA_ERROR_NO_DEVICE */
    return code_of(jget(scn, "init"));
}

CUresult cuGetErrorName(CUresult error, const char **name) {
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].code == error) { *name = errors[i].name; return 0; }
    return 1;
}

CUresult cuDeviceGetCount(int *count) {
    if (!scn) return 3;
    jval *d = jget(scn, "devices");
    *count = d ? d->len : 0;
    return 0;
}

CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
    if (!device(ordinal)) return 101;
    *dev = ordinal;
    return 0;
}

CUresult cuDeviceGetAttribute(int *value, int attrib, CUdevice dev) {
    jval *cc = jget(device(dev), "cc");
    if (!cc) return 101;
    if (attrib == 75) { *value = (int)jat(cc, 0)->num; return 0; }
    if (attrib == 76) { *value = (int)jat(cc, 1)->num; return 0; }
    return 1;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    jval *n = jget(device(dev), "name");
    if (!n || len <= 0) return 101;
    strncpy(name, n->str, (size_t)len - 1);
    name[len - 1] = 0;
    return 0;
}

/* A device's "retain" answer: CUDA_ERROR_DEVICE_UNAVAILABLE where another process
 * holds an exclusive-process GPU (cuda.h: "Devices are often unavailable due to use of
 * CU_COMPUTEMODE_EXCLUSIVE_PROCESS or CU_COMPUTEMODE_PROHIBITED"), OUT_OF_MEMORY where
 * others' work fills its memory. */
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
    if (!device(dev)) return 101;
    int refused = code_of(jget(device(dev), "retain"));
    if (refused) {
        logf_("refused %ld %ld\n", dev, refused);
        return refused;
    }
    *ctx = (CUcontext)(uintptr_t)(dev + 1);
    logf_("retain %ld\n", dev, 0);
    return 0;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    logf_("release %ld\n", dev, 0);
    return 0;
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
    current = (int)(uintptr_t)ctx - 1;
    return 0;
}

CUresult cuCtxPopCurrent_v2(CUcontext *ctx) {
    if (ctx) *ctx = (CUcontext)(uintptr_t)(current + 1);
    current = -1;
    return 0;
}

CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    const unsigned char *p = image;
    if (current < 0) return 201; /* CUDA_ERROR_INVALID_CONTEXT */
    int kind; /* 1 fatbin, 2 cubin, 3 ptx */
    if (p[0] == 0x50 && p[1] == 0xED && p[2] == 0x55 && p[3] == 0xBA) kind = 1;
    else if (p[0] == 0x7F && p[1] == 'E' && p[2] == 'L' && p[3] == 'F') kind = 2;
    else if (strstr((const char *)p, ".version") && strstr((const char *)p, ".target")) kind = 3;
    else return 200; /* CUDA_ERROR_INVALID_IMAGE */
    int result = code_of(jget(device(current), "load"));
    logf_("load %ld %ld\n", current, kind);
    if (!result) *module = (CUmodule)(uintptr_t)0x1000;
    return result;
}

CUresult cuModuleUnload(CUmodule module) {
    (void)module;
    logf_("unload %ld\n", current, 0);
    return 0;
}
