/* The CUDA stand-in program run in containers: dlopen("libcuda.so.1") by soname, as the CUDA runtime does,
 * cuInit, then list the devices. Prints `libcuda <path the loader found>`, then `device <i> minor <m>` lines
 * and `mig-cap <minor>` lines, then `mps server uid <uid>` when an MPS server serves it; exit 0, or 2 when
 * libcuda.so.1 cannot be loaded, 3 when cuInit fails. With `--hold-while PATH` it then stays (a live MPS
 * client) for as long as PATH exists. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

typedef int (*fn_u)(unsigned);
typedef int (*fn_p)(int *);
typedef int (*fn_pi)(int *, int);
typedef int (*fn_caps)(int *, int, int *);
typedef int (*fn_l)(long *);

int main(int argc, char **argv) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cuda) { printf("error dlopen libcuda.so.1: %s\n", dlerror()); return 2; }
    struct link_map *map = NULL;
    if (!dlinfo(cuda, RTLD_DI_LINKMAP, &map) && map) printf("libcuda %s\n", map->l_name);
    fn_u init = (fn_u)dlsym(cuda, "cuInit");
    fn_p count = (fn_p)dlsym(cuda, "cuDeviceGetCount");
    fn_pi get = (fn_pi)dlsym(cuda, "cuDeviceGet");
    fn_pi minor = (fn_pi)dlsym(cuda, "cuNodeboxDeviceMinor");
    fn_caps caps = (fn_caps)dlsym(cuda, "cuNodeboxDeviceCaps");
    fn_l mps = (fn_l)dlsym(cuda, "cuNodeboxMpsServerUid");
    if (!init || !count || !get) { printf("error libcuda.so.1 lacks the driver API\n"); return 2; }
    int rc = init(0);
    if (rc) { printf("error cuInit %d\n", rc); return 3; }
    int n = 0;
    count(&n);
    for (int i = 0; i < n; i++) {
        int dev, m = -1;
        if (get(&dev, i)) continue;
        if (minor) minor(&m, dev);
        printf("device %d minor %d\n", i, m);
    }
    if (caps) {
        int list[256], k = 0;
        caps(list, 256, &k);
        for (int i = 0; i < k; i++) printf("mig-cap %d\n", list[i]);
    }
    long uid = -1;
    if (mps && !mps(&uid) && uid >= 0) printf("mps server uid %ld\n", uid);
    fflush(stdout);
    if (argc > 2 && !strcmp(argv[1], "--hold-while"))
        while (!access(argv[2], F_OK)) usleep(20000);
    return 0;
}
