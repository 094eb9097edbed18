/* The CUDA stand-in program run in containers: dlopen("libcuda.so.1") by soname, as the CUDA runtime does,
 * cuInit, then list the devices. Prints `libcuda <path the loader found>`, then `device <i> minor <m>` lines
 * and `mig-cap <minor>` lines; exit 0, or 2 when libcuda.so.1 cannot be loaded, 3 when cuInit fails. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>

typedef int (*fn_u)(unsigned);
typedef int (*fn_p)(int *);
typedef int (*fn_pi)(int *, int);
typedef int (*fn_caps)(int *, int, int *);

int main(void) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cuda) { printf("error dlopen libcuda.so.1: %s\n", dlerror()); return 2; }
    struct link_map *map = NULL;
    if (!dlinfo(cuda, RTLD_DI_LINKMAP, &map) && map) printf("libcuda %s\n", map->l_name);
    fn_u init = (fn_u)dlsym(cuda, "cuInit");
    fn_p count = (fn_p)dlsym(cuda, "cuDeviceGetCount");
    fn_pi get = (fn_pi)dlsym(cuda, "cuDeviceGet");
    fn_pi minor = (fn_pi)dlsym(cuda, "cuNodeboxDeviceMinor");
    fn_caps caps = (fn_caps)dlsym(cuda, "cuNodeboxDeviceCaps");
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
    return 0;
}
