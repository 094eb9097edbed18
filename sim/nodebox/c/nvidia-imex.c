/* nvidia-imex stand-in of the node in a box: linked against the driver's NVML by soname (libnvidia-ml.so.1), as
 * the real daemon is, so without that library where the loader looks glibc's loader refuses to start it (its own
 * message, exit 127). It then checks the device nodes a real one opens: /dev/nvidiactl, the GPUs' /dev/nvidia<N>
 * and the fabric-imex-mgmt capability node /dev/nvidia-caps/nvidia-cap<NODEBOX_FABRIC_IMEX_MINOR>, each a
 * character device with the driver's numbers. A container has no driver behind them, so it stats rather than
 * opens them. Past its checks it says so and exits 0: the box's containers have no network to serve peers on. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#ifndef NODEBOX_CAPS_MAJOR
#define NODEBOX_CAPS_MAJOR 238
#endif
#ifndef NODEBOX_FABRIC_IMEX_MINOR
#define NODEBOX_FABRIC_IMEX_MINOR 4094
#endif

typedef int nvmlReturn_t;
const char *nvmlErrorString(nvmlReturn_t result);

static int device(const char *path, unsigned want_major, unsigned want_minor) {
    struct stat st;
    const char *why = NULL;
    char numbers[64];
    if (stat(path, &st) != 0) {
        why = strerror(errno);
    } else if (!S_ISCHR(st.st_mode)) {
        why = "not a character device";
    } else if (major(st.st_rdev) != want_major || minor(st.st_rdev) != want_minor) {
        snprintf(numbers, sizeof numbers, "device %u:%u, the driver's is %u:%u", major(st.st_rdev),
                 minor(st.st_rdev), want_major, want_minor);
        why = numbers;
    }
    if (why) {
        fprintf(stderr, "nvidia-imex: failed to open %s: %s: the IMEX daemon needs the NVIDIA driver's GPU, control "
                        "and fabric-imex-mgmt device nodes in its container\n", path, why);
        return 0;
    }
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 3 || strcmp(argv[1], "-c") != 0) {
        fprintf(stderr, "usage: nvidia-imex -c CONFIG (node in a box)\n");
        return 2;
    }
    const char *nvml = nvmlErrorString(0); /* the driver's NVML is loaded: the loader found it */
    if (!device("/dev/nvidiactl", 195, 255)) return 1;
    unsigned gpus = 0;
    DIR *dev = opendir("/dev");
    for (struct dirent *e; dev && (e = readdir(dev));) {
        char *end;
        if (strncmp(e->d_name, "nvidia", 6) != 0 || !e->d_name[6]) continue;
        unsigned long n = strtoul(e->d_name + 6, &end, 10);
        if (*end) continue;
        char path[300];
        snprintf(path, sizeof path, "/dev/%s", e->d_name);
        if (!device(path, 195, (unsigned)n)) return 1;
        gpus++;
    }
    if (dev) closedir(dev);
    if (!gpus) {
        fprintf(stderr, "nvidia-imex: failed to open /dev/nvidia0: %s: the IMEX daemon needs the NVIDIA driver's "
                        "GPU, control and fabric-imex-mgmt device nodes in its container\n", strerror(ENOENT));
        return 1;
    }
    char cap[64];
    snprintf(cap, sizeof cap, "/dev/nvidia-caps/nvidia-cap%d", NODEBOX_FABRIC_IMEX_MINOR);
    if (!device(cap, NODEBOX_CAPS_MAJOR, NODEBOX_FABRIC_IMEX_MINOR)) return 1;
    printf("nvidia-imex (node in a box): %u GPUs, %s, NVML \"%s\"; config %s\n", gpus, cap, nvml, argv[2]);
    return 0;
}
