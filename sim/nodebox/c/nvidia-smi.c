/* nvidia-smi stand-in: dynamically linked against glibc (so a foreign libc.so.6 on its loader path stops it
 * before main, as it stops the real one), talks to the NVML it finds by soname (the preloaded one, or the
 * loader's search) and records every call. Supports `-L` and `compute-policy -i UUID --set-timeslice N`. */
#include <dlfcn.h>
#include <stdlib.h>
#include "record.h"

typedef int (*init_t)(void);
typedef int (*count_t)(unsigned *);
typedef int (*by_index_t)(unsigned, void **);
typedef int (*by_uuid_t)(const char *, void **);
typedef int (*text_t)(void *, char *, unsigned);

int main(int argc, char **argv) {
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!nvml) {
        record(argc, argv, "result=no-nvml");
        printf("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
               "Make sure that the latest NVIDIA driver is installed and running.\n");
        return 9;
    }
    init_t init = (init_t)dlsym(nvml, "nvmlInit_v2");
    if (!init || init() != 0) {
        record(argc, argv, "result=init-failed");
        printf("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
               "Make sure that the latest NVIDIA driver is installed and running.\n");
        return 9;
    }
    by_uuid_t by_uuid = (by_uuid_t)dlsym(nvml, "nvmlDeviceGetHandleByUUID");
    if (argc >= 2 && (!strcmp(argv[1], "-L") || !strcmp(argv[1], "--list-gpus"))) {
        count_t count = (count_t)dlsym(nvml, "nvmlDeviceGetCount_v2");
        by_index_t by_index = (by_index_t)dlsym(nvml, "nvmlDeviceGetHandleByIndex_v2");
        text_t name = (text_t)dlsym(nvml, "nvmlDeviceGetName"), uuid = (text_t)dlsym(nvml, "nvmlDeviceGetUUID");
        unsigned n = 0;
        count(&n);
        for (unsigned i = 0; i < n; i++) {
            void *h;
            char nm[96], id[96];
            if (by_index(i, &h) || name(h, nm, sizeof nm) || uuid(h, id, sizeof id)) continue;
            printf("GPU %u: %s (UUID: %s)\n", i, nm, id);
        }
        record(argc, argv, "result=ok");
        return n ? 0 : 6;
    }
    if (argc == 6 && !strcmp(argv[1], "compute-policy") && !strcmp(argv[2], "-i") && !strcmp(argv[4], "--set-timeslice")) {
        void *h;
        char *end;
        long level = strtol(argv[5], &end, 10);
        if (*end || level < 0 || level > 3) {
            record(argc, argv, "result=bad-level");
            fprintf(stderr, "Invalid timeslice value %s: accepted 0 (default), 1 (short), 2 (medium), 3 (long)\n", argv[5]);
            return 2;
        }
        if (by_uuid(argv[3], &h)) {
            record(argc, argv, "result=no-such-gpu");
            fprintf(stderr, "No devices were found matching %s\n", argv[3]);
            return 6;
        }
        record(argc, argv, "result=ok");
        printf("Successfully set timeslice to %ld for GPU %s.\n", level, argv[3]);
        return 0;
    }
    record(argc, argv, "result=unsupported");
    fprintf(stderr, "nvidia-smi (node in a box): only -L and compute-policy -i UUID --set-timeslice N are simulated\n");
    return 2;
}
