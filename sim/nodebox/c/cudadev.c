/* What a CUDA framework does to find the driver (Triton, torch.compile): dlopen the development name
 * `libcuda.so` (no version), as programs that assume it exists do, then cuInit. Prints `libcuda.so <path the
 * loader found>` and `cuInit 0`; exit 2 when libcuda.so cannot be loaded, 3 when cuInit fails. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>

typedef int (*fn_u)(unsigned);

int main(void) {
    void *cuda = dlopen("libcuda.so", RTLD_NOW);
    if (!cuda) { printf("error dlopen libcuda.so: %s\n", dlerror()); return 2; }
    struct link_map *map = NULL;
    if (!dlinfo(cuda, RTLD_DI_LINKMAP, &map) && map) printf("libcuda.so %s\n", map->l_name);
    fn_u init = (fn_u)dlsym(cuda, "cuInit");
    if (!init) { printf("error libcuda.so lacks cuInit\n"); return 2; }
    int rc = init(0);
    printf("cuInit %d\n", rc);
    return rc ? 3 : 0;
}
