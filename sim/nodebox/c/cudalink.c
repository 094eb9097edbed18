/* A program linked with `-lcuda` against the stand-in libcuda.so (DT_NEEDED libcuda.so.1, as a JIT-compiled
 * kernel launcher links): the loader must find libcuda.so.1 before main. Prints `cuInit 0` and `devices <n>`. */
#include <stdio.h>

int cuInit(unsigned flags);
int cuDeviceGetCount(int *count);

int main(void) {
    int rc = cuInit(0), n = -1;
    printf("cuInit %d\n", rc);
    if (rc) return 3;
    cuDeviceGetCount(&n);
    printf("devices %d\n", n);
    return 0;
}
