/* A mock libcuda.so: cuInit and the device queries a CUDA program starts with. A device is what the driver
 * lets this process open: /dev/nvidiactl plus each /dev/nvidia<N> that opens (a node the kernel has no driver
 * behind answers ENXIO, which still means the cgroup and the node allow it; EPERM or ENOENT mean no device),
 * filtered by CUDA_VISIBLE_DEVICES given as indices. MIG: with /dev/nvidia-caps access nodes present, each one
 * that opens is reported by its minor through cuNodeboxDeviceCaps. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
enum { CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_NOT_INITIALIZED = 3, CUDA_ERROR_NO_DEVICE = 100,
       CUDA_ERROR_INVALID_DEVICE = 101 };

static int initialised;
static int minors[64];
static int ndevices;

static int can_open(const char *path) {
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd >= 0) { close(fd); return 1; }
    return errno == ENXIO || errno == ENODEV;
}

CUresult cuInit(unsigned flags) {
    if (flags) return CUDA_ERROR_INVALID_VALUE;
    ndevices = 0;
    if (!can_open("/dev/nvidiactl")) return CUDA_ERROR_NO_DEVICE;
    for (int m = 0; m < 64; m++) {
        char path[32];
        snprintf(path, sizeof path, "/dev/nvidia%d", m);
        if (can_open(path)) minors[ndevices++] = m;
    }
    initialised = 1;
    return ndevices ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

CUresult cuDriverGetVersion(int *version) {
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    *version = NODEBOX_CUDA_VERSION;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    *count = ndevices;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(int *device, int ordinal) {
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= ndevices) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

/* Not part of CUDA: the /dev/nvidia<minor> behind a device, so a test can tell which GPUs a container got. */
CUresult cuNodeboxDeviceMinor(int *minor, int device) {
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    if (device < 0 || device >= ndevices || !minor) return CUDA_ERROR_INVALID_DEVICE;
    *minor = minors[device];
    return CUDA_SUCCESS;
}

/* Not part of CUDA: the nvidia-caps access nodes this process may open (MIG devices), as minors. */
CUresult cuNodeboxDeviceCaps(int *caps, int size, int *count) {
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    if (!caps || !count) return CUDA_ERROR_INVALID_VALUE;
    *count = 0;
    DIR *d = opendir("/dev/nvidia-caps");
    if (!d) return CUDA_SUCCESS;
    struct dirent *e;
    while ((e = readdir(d))) {
        int m;
        char path[300];
        if (sscanf(e->d_name, "nvidia-cap%d", &m) != 1) continue;
        snprintf(path, sizeof path, "/dev/nvidia-caps/%s", e->d_name);
        if (can_open(path) && *count < size) caps[(*count)++] = m;
    }
    closedir(d);
    return CUDA_SUCCESS;
}
