/* A mock libcuda.so: cuInit and the device queries a CUDA program starts with. A device is what the driver
 * lets this process open: /dev/nvidiactl plus each /dev/nvidia<N> that opens (a node the kernel has no driver
 * behind answers ENXIO, which still means the cgroup and the node allow it; EPERM or ENOENT mean no device),
 * filtered by CUDA_VISIBLE_DEVICES given as indices. MIG: with /dev/nvidia-caps access nodes present, each one
 * that opens is reported by its minor through cuNodeboxDeviceCaps.
 *
 * MPS, as the real driver does it: cuInit connects to the control daemon at $CUDA_MPS_PIPE_DIRECTORY/control
 * (default /tmp/nvidia-mps) and asks for a server (`client <pid>`). No socket there, or no daemon behind it:
 * the program runs without MPS. A daemon that queues the client (another UID's server is busy) keeps cuInit
 * waiting until it is served, like the real one; one that refuses it fails cuInit with
 * CUDA_ERROR_MPS_CONNECTION_FAILED. The connection stays open for the process's lifetime: the daemon counts
 * the client until it exits. cuNodeboxMpsServerUid says which UID's server serves this process (-1: none). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
enum { CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_NOT_INITIALIZED = 3, CUDA_ERROR_NO_DEVICE = 100,
       CUDA_ERROR_INVALID_DEVICE = 101, CUDA_ERROR_MPS_CONNECTION_FAILED = 805 };

static int initialised;
static int minors[64];
static int ndevices;
static int mps_fd = -1;
static long mps_server_uid = -1;

/* 0: served or no MPS; otherwise the CUresult. */
static CUresult mps_connect(void) {
    const char *dir = getenv("CUDA_MPS_PIPE_DIRECTORY");
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s/control", dir && *dir ? dir : "/tmp/nvidia-mps");
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) return CUDA_SUCCESS;
    if (connect(s, (struct sockaddr *)&addr, sizeof addr)) {
        close(s);  /* no daemon (or none this process may reach): no MPS */
        return CUDA_SUCCESS;
    }
    dprintf(s, "client %d\n", (int)getpid());
    FILE *in = fdopen(dup(s), "r");
    char line[256];
    long uid = -1;
    while (in && fgets(line, sizeof line, in)) {
        if (!strncmp(line, "pending", 7)) continue;  /* queued behind another user's server: keep waiting */
        if (sscanf(line, "server %ld", &uid) == 1) break;
        uid = -2;  /* refused */
        break;
    }
    if (in) fclose(in);
    if (uid < 0) {
        close(s);
        return CUDA_ERROR_MPS_CONNECTION_FAILED;
    }
    mps_fd = s;
    mps_server_uid = uid;
    return CUDA_SUCCESS;
}

static int can_open(const char *path) {
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd >= 0) { close(fd); return 1; }
    return errno == ENXIO || errno == ENODEV;
}

CUresult cuInit(unsigned flags) {
    if (flags) return CUDA_ERROR_INVALID_VALUE;
    ndevices = 0;
    if (!can_open("/dev/nvidiactl")) return CUDA_ERROR_NO_DEVICE;
    if (mps_fd < 0) {
        CUresult rc = mps_connect();
        if (rc) return rc;
    }
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

/* Not part of CUDA: the UID of the MPS server serving this process, or -1 when it runs without MPS. */
CUresult cuNodeboxMpsServerUid(long *uid) {
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    if (!uid) return CUDA_ERROR_INVALID_VALUE;
    *uid = mps_server_uid;
    return CUDA_SUCCESS;
}
