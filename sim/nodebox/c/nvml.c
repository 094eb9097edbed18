/* A mock libnvidia-ml.so for the node in a box: NVML's C ABI (as the official pynvml binding calls it),
 * answering from a config file written from a simulator profile (sim/nodebox/nvmlconfig.py).
 *
 * The config is `nodebox-nvml.conf` beside this library (found with dladdr, so the library answers for the
 * driver root it was loaded from). Without it nvmlInit fails with NVML_ERROR_DRIVER_NOT_LOADED, as the real
 * library does on a machine whose kernel module is not loaded.
 *
 * MIG state (each GPU's MIG mode and its GPU and compute instances) is the node's, as on real hardware: it lives
 * in `nodebox-mig.state` beside the config, written from the config's layout by the first process that loads
 * the library. Every call rereads it when another process changed it (a mig-parted run under the agent), and
 * every change (mode, create, destroy) is made under an exclusive flock of `nodebox-mig.lock`, rereading the
 * state first, then writing it whole (a new file renamed over the old one). Instance handles are slots that
 * stay put across processes; a slot whose instance another process destroyed answers INVALID_ARGUMENT.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nvmlReturn_t;
enum {
    OK = 0, E_UNINIT = 1, E_INVAL = 2, E_NOTSUP = 3, E_NOTFOUND = 6, E_SIZE = 7, E_DRIVER = 9, E_TIMEOUT = 10,
    E_INUSE = 19, E_RESOURCES = 23, E_STATE = 29, E_UNKNOWN = 999
};
enum { K_GPU = 0x47505530, K_MIG, K_GI, K_CI, K_EVENTS };

#define MAX_GPUS 16
#define MAX_PROFILES 24
#define MAX_PLACEMENTS 8
#define MAX_INSTANCES 16
#define MAX_LINKS 18

struct placement { unsigned start, size, gi_id; char uuid[96]; };
struct profile {
    unsigned enm, id, slices, count, mps, ce, dec, enc, jpeg, ofa;
    unsigned long long mem_mb;
    char name[96];
    unsigned nplacements;
    struct placement placements[MAX_PLACEMENTS];
};
struct gpu;
struct tag { int kind; struct gpu *gpu; int slot; };
struct instance {
    int used, has_ci;
    unsigned profile, start, gi_id;
    char uuid[96];
    struct tag mig, gi, ci;
};
struct link { unsigned active, is_switch; char remote[32]; };
struct gpu {
    struct tag self;
    unsigned index, minor, brand, arch, cc_major, cc_minor, device_id, subsystem_id;
    int numa, addressing, mig_capable, mig_current, compute_mode;
    unsigned long long memory;
    char uuid[96], name[96], bus_id[32];
    unsigned nprofiles, max_mig;
    struct profile profiles[MAX_PROFILES];
    struct instance instances[MAX_INSTANCES];
    unsigned nlinks;
    struct link links[MAX_LINKS];
    int fabric;
    unsigned char cluster[16];
    unsigned clique;
};

static struct gpu gpus[MAX_GPUS];
static unsigned ngpus;
static char driver_version[80];
static int cuda_version;
static int init_count;
static struct tag event_tag = {K_EVENTS, 0, 0};
static char state_path[4096], lock_path[4096];
static struct stat state_seen;  /* the state file as last read or written by this process */
static int state_locked;  /* this process holds the exclusive lock (a change is under way) */

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct {
    char busIdLegacy[16];
    unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef struct { unsigned start, size; } nvmlPlacement_t;
typedef struct {
    unsigned version, id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount, copyEngineCount,
        decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[96];
} nvmlGpuInstanceProfileInfo_v2_t;
typedef struct {
    unsigned id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount, copyEngineCount, decoderCount,
        encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;
typedef struct { void *device; unsigned id, profileId; nvmlPlacement_t placement; } nvmlGpuInstanceInfo_t;
typedef struct {
    unsigned version, id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount,
        sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
    char name[96];
} nvmlComputeInstanceProfileInfo_v2_t;
typedef struct { void *device; void *gpuInstance; unsigned id, profileId; nvmlPlacement_t placement; } nvmlComputeInstanceInfo_t;
typedef struct { void *device; unsigned long long eventType, eventData; unsigned gpuInstanceId, computeInstanceId; } nvmlEventData_t;
typedef struct { unsigned char clusterUuid[16]; nvmlReturn_t status; unsigned cliqueId; unsigned char state; } nvmlGpuFabricInfo_t;
typedef struct {
    unsigned version; unsigned char clusterUuid[16]; nvmlReturn_t status; unsigned cliqueId; unsigned char state;
    unsigned healthMask;
} nvmlGpuFabricInfoV_t;

/* The compute-instance profile (NVML_COMPUTE_INSTANCE_PROFILE_*) that spans a GPU instance of `slices`. */
static int full_ci_profile(unsigned slices) {
    switch (slices) {
    case 1: return 0; case 2: return 1; case 3: return 2; case 4: return 3;
    case 7: return 4; case 8: return 5; case 6: return 6; default: return -1;
    }
}

static int copy_text(char *dst, unsigned length, const char *src) {
    if (!dst) return E_INVAL;
    if (strlen(src) + 1 > length) return E_SIZE;
    strcpy(dst, src);
    return OK;
}

static void rest_of_line(char *dst, size_t size, const char *line, int fields) {
    const char *p = line;
    for (int i = 0; i < fields && p; i++) {
        p = strchr(p, '\t');
        if (p) p++;
    }
    snprintf(dst, size, "%s", p ? p : "");
    dst[strcspn(dst, "\n")] = 0;
}

static int load_config(void) {
    Dl_info info;
    if (!dladdr((void *)load_config, &info) || !info.dli_fname) return E_DRIVER;
    char path[4096];
    snprintf(path, sizeof path, "%s", info.dli_fname);
    char *slash = strrchr(path, '/');
    if (slash) strcpy(slash + 1, "nodebox-nvml.conf");
    else strcpy(path, "nodebox-nvml.conf");
    size_t dir = slash ? (size_t)(slash + 1 - path) : 0;
    snprintf(state_path, sizeof state_path, "%.*snodebox-mig.state", (int)dir, path);
    snprintf(lock_path, sizeof lock_path, "%.*snodebox-mig.lock", (int)dir, path);
    FILE *f = fopen(path, "r");
    if (!f) return E_DRIVER;
    memset(gpus, 0, sizeof gpus);
    ngpus = 0;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        unsigned g, a, b, c, d, e, h, i, j, k, l;
        unsigned long long mem;
        int numa, addr, capable, current;
        char word[96], word2[32];
        if (sscanf(line, "driver\t%79s", driver_version) == 1) continue;
        if (sscanf(line, "cuda\t%d", &cuda_version) == 1) continue;
        if (sscanf(line, "gpu\t%u\t%u\t%95s\t%31s\t%u\t%u\t%u\t%u\t%llu\t%x\t%x\t%d\t%d\t%d\t%d\t%u",
                   &g, &a, word, word2, &b, &c, &d, &e, &mem, &h, &i, &numa, &addr, &capable, &current, &j) == 16
            && g < MAX_GPUS) {
            struct gpu *x = &gpus[g];
            x->self = (struct tag){K_GPU, x, -1};
            x->index = g; x->minor = a; x->brand = b; x->arch = c; x->cc_major = d; x->cc_minor = e;
            x->memory = mem; x->device_id = h; x->subsystem_id = i; x->numa = numa; x->addressing = addr;
            x->mig_capable = capable; x->mig_current = current; x->max_mig = j;
            snprintf(x->uuid, sizeof x->uuid, "%s", word);
            snprintf(x->bus_id, sizeof x->bus_id, "%s", word2);
            rest_of_line(x->name, sizeof x->name, line, 17);
            if (g + 1 > ngpus) ngpus = g + 1;
            continue;
        }
        if (sscanf(line, "profile\t%u\t%u\t%u\t%u\t%u\t%u\t%u\t%u\t%u\t%u\t%u\t%llu",
                   &g, &a, &b, &c, &d, &e, &h, &i, &j, &k, &l, &mem) == 12 && g < MAX_GPUS) {
            struct gpu *x = &gpus[g];
            if (x->nprofiles >= MAX_PROFILES) continue;
            struct profile *p = &x->profiles[x->nprofiles++];
            p->enm = a; p->id = b; p->slices = c; p->count = d; p->mps = e; p->ce = h; p->dec = i; p->enc = j;
            p->jpeg = k; p->ofa = l; p->mem_mb = mem;
            rest_of_line(p->name, sizeof p->name, line, 13);
            continue;
        }
        if (sscanf(line, "placement\t%u\t%u\t%u\t%u\t%u\t%95s", &g, &a, &b, &c, &d, word) == 6 && g < MAX_GPUS) {
            for (unsigned q = 0; q < gpus[g].nprofiles; q++) {
                struct profile *p = &gpus[g].profiles[q];
                if (p->id != a || p->nplacements >= MAX_PLACEMENTS) continue;
                struct placement *pl = &p->placements[p->nplacements++];
                pl->start = b; pl->size = c; pl->gi_id = d;
                snprintf(pl->uuid, sizeof pl->uuid, "%s", word);
            }
            continue;
        }
        if (sscanf(line, "instance\t%u\t%u\t%u\t%95s", &g, &a, &b, word) == 4 && g < MAX_GPUS) {
            struct gpu *x = &gpus[g];
            for (unsigned q = 0; q < x->nprofiles; q++) {
                struct profile *p = &x->profiles[q];
                if (p->id != a) continue;
                for (unsigned r = 0; r < p->nplacements; r++) {
                    if (p->placements[r].start != b) continue;
                    for (int s = 0; s < MAX_INSTANCES; s++) {
                        struct instance *in = &x->instances[s];
                        if (in->used) continue;
                        in->used = 1; in->has_ci = 1; in->profile = q; in->start = b;
                        in->gi_id = p->placements[r].gi_id;
                        snprintf(in->uuid, sizeof in->uuid, "%s", word);
                        break;
                    }
                }
            }
            continue;
        }
        if (sscanf(line, "link\t%u\t%u\t%u\t%31s", &g, &a, &b, word2) == 4 && g < MAX_GPUS) {
            struct gpu *x = &gpus[g];
            if (x->nlinks >= MAX_LINKS) continue;
            struct link *lk = &x->links[x->nlinks++];
            lk->active = a; lk->is_switch = b;
            snprintf(lk->remote, sizeof lk->remote, "%s", strcmp(word2, "-") ? word2 : "");
            continue;
        }
        if (sscanf(line, "fabric\t%u\t%32s\t%u", &g, word, &a) == 3 && g < MAX_GPUS) {
            gpus[g].fabric = 1;
            gpus[g].clique = a;
            for (int q = 0; q < 16; q++) sscanf(word + 2 * q, "%2hhx", &gpus[g].cluster[q]);
            continue;
        }
    }
    fclose(f);
    for (unsigned q = 0; q < ngpus; q++) {
        for (int s = 0; s < MAX_INSTANCES; s++) {
            struct instance *in = &gpus[q].instances[s];
            in->mig = (struct tag){K_MIG, &gpus[q], s};
            in->gi = (struct tag){K_GI, &gpus[q], s};
            in->ci = (struct tag){K_CI, &gpus[q], s};
        }
    }
    return ngpus ? OK : E_DRIVER;
}

/* ---- the node's MIG state, shared by every process ----------------------------------------------------- */

static int same_file(const struct stat *a, const struct stat *b) {
    return a->st_ino == b->st_ino && a->st_size == b->st_size && a->st_mtim.tv_sec == b->st_mtim.tv_sec
        && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

static void state_read(void) {
    FILE *f = fopen(state_path, "r");
    if (!f) return;
    struct stat st;
    if (fstat(fileno(f), &st)) { fclose(f); return; }
    for (unsigned q = 0; q < ngpus; q++)
        for (int s = 0; s < MAX_INSTANCES; s++) gpus[q].instances[s].used = gpus[q].instances[s].has_ci = 0;
    char line[512], uuid[96];
    unsigned g, slot, prof, start, gi, ci;
    int mode;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "mig\t%u\t%d", &g, &mode) == 2 && g < ngpus) { gpus[g].mig_current = mode; continue; }
        if (sscanf(line, "instance\t%u\t%u\t%u\t%u\t%u\t%u\t%95s", &g, &slot, &prof, &start, &gi, &ci, uuid) == 7
            && g < ngpus && slot < MAX_INSTANCES && prof < gpus[g].nprofiles) {
            struct instance *in = &gpus[g].instances[slot];
            in->used = 1; in->has_ci = (int)ci; in->profile = prof; in->start = start; in->gi_id = gi;
            snprintf(in->uuid, sizeof in->uuid, "%s", uuid);
        }
    }
    state_seen = st;
    fclose(f);
}

static void state_write(void) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.%d", state_path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    for (unsigned q = 0; q < ngpus; q++) {
        fprintf(f, "mig\t%u\t%d\n", q, gpus[q].mig_current);
        for (int s = 0; s < MAX_INSTANCES; s++) {
            struct instance *in = &gpus[q].instances[s];
            if (in->used)
                fprintf(f, "instance\t%u\t%d\t%u\t%u\t%u\t%d\t%s\n", q, s, in->profile, in->start, in->gi_id, in->has_ci, in->uuid);
        }
    }
    fclose(f);
    rename(tmp, state_path);
    stat(state_path, &state_seen);
}

static int state_lock(int how) {
    int fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0 && flock(fd, how)) { close(fd); return -1; }
    return fd;
}

/* Reread the state if another process changed it since. */
static void mig_sync(void) {
    struct stat st;
    if (state_locked || stat(state_path, &st) || same_file(&st, &state_seen)) return;
    int fd = state_lock(LOCK_SH);
    state_read();
    if (fd >= 0) close(fd);
}

/* A change: the exclusive lock, the current state; mig_end writes it (when `changed`) and unlocks. */
static int mig_begin(void) {
    int fd = state_lock(LOCK_EX);
    state_read();
    state_locked = 1;
    return fd;
}
static void mig_end(int fd, int changed) {
    if (changed) state_write();
    state_locked = 0;
    if (fd >= 0) close(fd);
}

/* At init: the node's state, or the config's layout as the node's state when no process wrote one yet. */
static void state_init(void) {
    int fd = state_lock(LOCK_EX);
    if (access(state_path, F_OK)) state_write();
    else state_read();
    if (fd >= 0) close(fd);
}

/* A handle is a pointer to a tag; anything else is INVALID_ARGUMENT, as the real library answers. */
static struct tag *tag_of(void *handle, int kind) {
    struct tag *t = handle;
    if (!t) return NULL;
    for (unsigned g = 0; g < ngpus; g++) {
        struct gpu *x = &gpus[g];
        if (t == &x->self) return kind == K_GPU ? t : NULL;
        for (int s = 0; s < MAX_INSTANCES; s++) {
            struct instance *in = &x->instances[s];
            if (!in->used) continue;
            if (t == &in->mig && kind == K_MIG && in->has_ci) return t;
            if (t == &in->gi && kind == K_GI) return t;
            if (t == &in->ci && kind == K_CI && in->has_ci) return t;
        }
    }
    return NULL;
}
#define READY() do { if (!init_count) return E_UNINIT; mig_sync(); } while (0)
#define GPU(h, var) READY(); struct tag *var##_t = tag_of(h, K_GPU); if (!var##_t) return E_INVAL; struct gpu *var = var##_t->gpu
#define INST(h, kind, var) READY(); struct tag *var##_t = tag_of(h, kind); if (!var##_t) return E_INVAL; \
    struct gpu *var##_g = var##_t->gpu; struct instance *var = &var##_g->instances[var##_t->slot]

static struct profile *profile_by_id(struct gpu *x, unsigned id) {
    for (unsigned q = 0; q < x->nprofiles; q++) if (x->profiles[q].id == id) return &x->profiles[q];
    return NULL;
}

/* A device handle: the GPU, or a MIG device (which answers for itself where NVML lets it). */
static struct instance *mig_of(void *h, struct gpu **gpu) {
    struct tag *t = tag_of(h, K_MIG);
    if (!t) return NULL;
    *gpu = t->gpu;
    return &t->gpu->instances[t->slot];
}

/* ---- init ---------------------------------------------------------------------------------------- */

nvmlReturn_t nvmlInitWithFlags(unsigned flags) {
    (void)flags;
    if (init_count) { init_count++; return OK; }
    int rc = load_config();
    if (rc != OK) return rc;
    memset(&state_seen, 0, sizeof state_seen);
    state_init();
    init_count = 1;
    return OK;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlShutdown(void) { READY(); init_count--; return OK; }

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case OK: return "Success";
    case E_UNINIT: return "Uninitialized";
    case E_INVAL: return "Invalid Argument";
    case E_NOTSUP: return "Not Supported";
    case E_NOTFOUND: return "Not Found";
    case E_SIZE: return "Insufficient Size";
    case E_DRIVER: return "Driver Not Loaded";
    case E_TIMEOUT: return "Timeout";
    case E_INUSE: return "In use by another client";
    case E_RESOURCES: return "Insufficient resources";
    case E_STATE: return "Invalid state";
    default: return "Unknown Error";
    }
}

/* ---- system -------------------------------------------------------------------------------------- */

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned length) { READY(); return copy_text(version, length, driver_version); }
nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned length) {
    READY();
    char text[96];
    snprintf(text, sizeof text, "%d.%s", cuda_version / 1000 + 0, driver_version);
    return copy_text(version, length, text);
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { READY(); if (!v) return E_INVAL; *v = cuda_version; return OK; }
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }

/* ---- devices ------------------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *count) { READY(); if (!count) return E_INVAL; *count = ngpus; return OK; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, void **h) {
    READY();
    if (!h || index >= ngpus) return E_INVAL;
    *h = &gpus[index].self;
    return OK;
}
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, void **h) {
    READY();
    if (!uuid || !h) return E_INVAL;
    for (unsigned g = 0; g < ngpus; g++) {
        if (!strcmp(gpus[g].uuid, uuid)) { *h = &gpus[g].self; return OK; }
        for (int s = 0; s < MAX_INSTANCES; s++) {
            struct instance *in = &gpus[g].instances[s];
            if (in->used && in->has_ci && !strcmp(in->uuid, uuid)) { *h = &in->mig; return OK; }
        }
    }
    return E_NOTFOUND;
}
nvmlReturn_t nvmlDeviceGetUUID(void *h, char *uuid, unsigned length) {
    READY();
    struct gpu *x;
    struct instance *in = mig_of(h, &x);
    if (in) return copy_text(uuid, length, in->uuid);
    GPU(h, g);
    return copy_text(uuid, length, g->uuid);
}
nvmlReturn_t nvmlDeviceGetName(void *h, char *name, unsigned length) {
    READY();
    struct gpu *x;
    struct instance *in = mig_of(h, &x);
    if (in) {
        char text[200];
        snprintf(text, sizeof text, "%s MIG %s", x->name, x->profiles[in->profile].name);
        return copy_text(name, length, text);
    }
    GPU(h, g);
    return copy_text(name, length, g->name);
}
nvmlReturn_t nvmlDeviceGetIndex(void *h, unsigned *index) { GPU(h, g); if (!index) return E_INVAL; *index = g->index; return OK; }
nvmlReturn_t nvmlDeviceGetBrand(void *h, int *brand) { GPU(h, g); if (!brand) return E_INVAL; *brand = (int)g->brand; return OK; }
nvmlReturn_t nvmlDeviceGetArchitecture(void *h, unsigned *arch) { GPU(h, g); if (!arch) return E_INVAL; *arch = g->arch; return OK; }
nvmlReturn_t nvmlDeviceGetCudaComputeCapability(void *h, int *major, int *minor) {
    GPU(h, g);
    if (!major || !minor) return E_INVAL;
    *major = (int)g->cc_major; *minor = (int)g->cc_minor;
    return OK;
}
static unsigned long long total_of(void *h, int *ok) {
    struct gpu *x;
    struct instance *in = mig_of(h, &x);
    *ok = 1;
    if (in) return x->profiles[in->profile].mem_mb << 20;
    struct tag *t = tag_of(h, K_GPU);
    if (!t) { *ok = 0; return 0; }
    return t->gpu->memory;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(void *h, nvmlMemory_t *m) {
    READY();
    int ok;
    unsigned long long total = total_of(h, &ok);
    if (!ok || !m) return E_INVAL;
    m->total = total;
    m->used = total / 100;  /* the driver's own reservation shows as used on an idle GPU */
    m->free = total - m->used;
    return OK;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(void *h, nvmlMemory_v2_t *m) {
    READY();
    int ok;
    unsigned long long total = total_of(h, &ok);
    if (!ok || !m) return E_INVAL;
    if (m->version != 0x02000028) return 25; /* NVML_ERROR_ARGUMENT_VERSION_MISMATCH */
    m->total = total; m->reserved = total / 100; m->used = 0; m->free = total - m->reserved;
    return OK;
}
static void fill_pci(nvmlPciInfo_t *p, const char *bus_id, unsigned device_id, unsigned subsystem_id) {
    memset(p, 0, sizeof *p);
    unsigned domain = 0, bus = 0, dev = 0, fn = 0;
    sscanf(bus_id, "%x:%x:%x.%x", &domain, &bus, &dev, &fn);
    snprintf(p->busId, sizeof p->busId, "%08X:%02X:%02X.%X", domain, bus, dev, fn);
    snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "%04X:%02X:%02X.%X", domain, bus, dev, fn);
    p->domain = domain; p->bus = bus; p->device = dev; p->pciDeviceId = device_id; p->pciSubSystemId = subsystem_id;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v3(void *h, nvmlPciInfo_t *p) {
    GPU(h, g);
    if (!p) return E_INVAL;
    fill_pci(p, g->bus_id, g->device_id, g->subsystem_id);
    return OK;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v2(void *h, nvmlPciInfo_t *p) { return nvmlDeviceGetPciInfo_v3(h, p); }
nvmlReturn_t nvmlDeviceGetMinorNumber(void *h, unsigned *minor) { GPU(h, g); if (!minor) return E_INVAL; *minor = g->minor; return OK; }
nvmlReturn_t nvmlDeviceGetNumaNodeId(void *h, unsigned *node) {
    GPU(h, g);
    if (!node) return E_INVAL;
    if (g->numa < 0) return E_NOTSUP;
    *node = (unsigned)g->numa;
    return OK;
}
typedef struct { unsigned version, value; } nvmlDeviceAddressingMode_t;  /* versioned: nvmlDeviceAddressingMode_v1 */
nvmlReturn_t nvmlDeviceGetAddressingMode(void *h, nvmlDeviceAddressingMode_t *mode) {
    GPU(h, g);
    if (!mode) return E_INVAL;
    if (mode->version != 0x1000008) return 25; /* NVML_ERROR_ARGUMENT_VERSION_MISMATCH */
    if (g->addressing < 0) return E_NOTSUP;
    mode->value = (unsigned)g->addressing;
    return OK;
}
nvmlReturn_t nvmlDeviceGetComputeMode(void *h, int *mode) { GPU(h, g); if (!mode) return E_INVAL; *mode = g->compute_mode; return OK; }
nvmlReturn_t nvmlDeviceSetComputeMode(void *h, int mode) {
    GPU(h, g);
    if (mode != 0 && mode != 2 && mode != 3) return E_INVAL; /* DEFAULT, PROHIBITED, EXCLUSIVE_PROCESS */
    g->compute_mode = mode;
    return OK;
}

/* ---- NVLink and fabric --------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetNvLinkState(void *h, unsigned link, unsigned *active) {
    GPU(h, g);
    if (!active) return E_INVAL;
    if (!g->nlinks) return E_NOTSUP;
    if (link >= g->nlinks) return E_INVAL;
    *active = g->links[link].active;
    return OK;
}
nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(void *h, unsigned link, nvmlPciInfo_t *p) {
    GPU(h, g);
    if (!p || link >= g->nlinks) return E_INVAL;
    if (!g->nlinks) return E_NOTSUP;
    fill_pci(p, g->links[link].remote[0] ? g->links[link].remote : "0:0:0.0", 0, 0);
    return OK;
}
nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(void *h, unsigned link, int *type) {
    GPU(h, g);
    if (!type || link >= g->nlinks) return E_INVAL;
    *type = g->links[link].is_switch ? 2 : 0; /* NVML_NVLINK_DEVICE_TYPE_SWITCH : _GPU */
    return OK;
}
nvmlReturn_t nvmlDeviceGetGpuFabricInfo(void *h, nvmlGpuFabricInfo_t *f) {
    GPU(h, g);
    if (!f) return E_INVAL;
    if (!g->fabric) return E_NOTSUP;
    memcpy(f->clusterUuid, g->cluster, 16);
    f->status = OK; f->cliqueId = g->clique; f->state = 3; /* NVML_GPU_FABRIC_STATE_COMPLETED */
    return OK;
}
nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(void *h, nvmlGpuFabricInfoV_t *f) {
    GPU(h, g);
    if (!f) return E_INVAL;
    if (!g->fabric) return E_NOTSUP;
    memcpy(f->clusterUuid, g->cluster, 16);
    f->status = OK; f->cliqueId = g->clique; f->state = 3; f->healthMask = 0;
    return OK;
}

/* ---- MIG ----------------------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetMigMode(void *h, unsigned *current, unsigned *pending) {
    GPU(h, g);
    if (!current || !pending) return E_INVAL;
    if (!g->mig_capable) return E_NOTSUP;
    *current = *pending = (unsigned)g->mig_current;
    return OK;
}
static int instances_in_use(struct gpu *g) {
    for (int s = 0; s < MAX_INSTANCES; s++) if (g->instances[s].used) return 1;
    return 0;
}
static nvmlReturn_t nvmlDeviceSetMigMode_locked(void *h, unsigned mode, nvmlReturn_t *activation) {
    GPU(h, g);
    if (!g->mig_capable) return E_NOTSUP;
    if (mode > 1) return E_INVAL;
    if (instances_in_use(g)) return E_INUSE;
    g->mig_current = (int)mode;
    if (activation) *activation = OK;
    return OK;
}
static nvmlReturn_t fill_profile(struct gpu *g, unsigned enm, struct profile **out) {
    if (!g->mig_capable) return E_NOTSUP;
    if (enm >= 15) return E_INVAL; /* NVML_GPU_INSTANCE_PROFILE_COUNT */
    for (unsigned q = 0; q < g->nprofiles; q++) if (g->profiles[q].enm == enm) { *out = &g->profiles[q]; return OK; }
    return E_NOTSUP;
}
nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(void *h, unsigned enm, nvmlGpuInstanceProfileInfo_v2_t *info) {
    GPU(h, g);
    if (!info) return E_INVAL;
    struct profile *p;
    nvmlReturn_t rc = fill_profile(g, enm, &p);
    if (rc) return rc;
    info->id = p->id; info->isP2pSupported = 0; info->sliceCount = p->slices; info->instanceCount = p->count;
    info->multiprocessorCount = p->mps; info->copyEngineCount = p->ce; info->decoderCount = p->dec;
    info->encoderCount = p->enc; info->jpegCount = p->jpeg; info->ofaCount = p->ofa; info->memorySizeMB = p->mem_mb;
    snprintf(info->name, sizeof info->name, "MIG %s", p->name);
    return OK;
}
nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(void *h, unsigned enm, nvmlGpuInstanceProfileInfo_t *info) {
    GPU(h, g);
    if (!info) return E_INVAL;
    struct profile *p;
    nvmlReturn_t rc = fill_profile(g, enm, &p);
    if (rc) return rc;
    info->id = p->id; info->isP2pSupported = 0; info->sliceCount = p->slices; info->instanceCount = p->count;
    info->multiprocessorCount = p->mps; info->copyEngineCount = p->ce; info->decoderCount = p->dec;
    info->encoderCount = p->enc; info->jpegCount = p->jpeg; info->ofaCount = p->ofa; info->memorySizeMB = p->mem_mb;
    return OK;
}
nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(void *h, unsigned id, nvmlPlacement_t *out, unsigned *count) {
    GPU(h, g);
    if (!g->mig_capable) return E_NOTSUP;
    struct profile *p = profile_by_id(g, id);
    if (!p || !count) return E_INVAL;
    if (!out) { *count = p->nplacements; return OK; }
    if (*count < p->nplacements) { *count = p->nplacements; return E_SIZE; }
    for (unsigned i = 0; i < p->nplacements; i++) { out[i].start = p->placements[i].start; out[i].size = p->placements[i].size; }
    *count = p->nplacements;
    return OK;
}
static unsigned max_slices(struct gpu *g) {
    unsigned m = 0;
    for (unsigned q = 0; q < g->nprofiles; q++) if (g->profiles[q].slices > m) m = g->profiles[q].slices;
    return m;
}
static int placement_free(struct gpu *g, struct profile *p, unsigned start, unsigned size) {
    unsigned used = 0, same = 0;
    for (int s = 0; s < MAX_INSTANCES; s++) {
        struct instance *in = &g->instances[s];
        if (!in->used) continue;
        struct profile *q = &g->profiles[in->profile];
        unsigned qsize = q->placements[0].size;
        if (start < in->start + qsize && in->start < start + size) return 0;
        used += q->slices;
        if (q == p) same++;
    }
    return used + p->slices <= max_slices(g) && same < p->count;
}
static nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement_locked(void *h, unsigned id, const nvmlPlacement_t *pl, void **gi) {
    GPU(h, g);
    if (!g->mig_capable) return E_NOTSUP;
    struct profile *p = profile_by_id(g, id);
    if (!p || !pl || !gi) return E_INVAL;
    if (!g->mig_current) return E_STATE;
    struct placement *found = NULL;
    for (unsigned i = 0; i < p->nplacements; i++)
        if (p->placements[i].start == pl->start && p->placements[i].size == pl->size) found = &p->placements[i];
    if (!found) return E_INVAL;
    if (!placement_free(g, p, pl->start, pl->size)) return E_RESOURCES;
    for (int s = 0; s < MAX_INSTANCES; s++) {
        struct instance *in = &g->instances[s];
        if (in->used) continue;
        in->used = 1; in->has_ci = 0; in->profile = (unsigned)(p - g->profiles); in->start = pl->start;
        in->gi_id = found->gi_id;
        snprintf(in->uuid, sizeof in->uuid, "%s", found->uuid);
        *gi = &in->gi;
        return OK;
    }
    return E_RESOURCES;
}
nvmlReturn_t nvmlDeviceGetGpuInstances(void *h, unsigned id, void **out, unsigned *count) {
    GPU(h, g);
    if (!g->mig_capable) return E_NOTSUP;
    struct profile *p = profile_by_id(g, id);
    if (!p || !count) return E_INVAL;
    unsigned n = 0;
    for (int s = 0; s < MAX_INSTANCES; s++) {
        struct instance *in = &g->instances[s];
        if (!in->used || &g->profiles[in->profile] != p) continue;
        if (out) {
            if (n >= *count) return E_SIZE;
            out[n] = &in->gi;
        }
        n++;
    }
    *count = n;
    return OK;
}
nvmlReturn_t nvmlDeviceGetGpuInstanceById(void *h, unsigned gi_id, void **gi) {
    GPU(h, g);
    if (!g->mig_capable) return E_NOTSUP;
    if (!gi) return E_INVAL;
    if (!g->mig_current) return E_STATE;
    for (int s = 0; s < MAX_INSTANCES; s++) {
        struct instance *in = &g->instances[s];
        if (in->used && in->gi_id == gi_id) { *gi = &in->gi; return OK; }
    }
    return E_NOTFOUND;
}
nvmlReturn_t nvmlGpuInstanceGetInfo(void *h, nvmlGpuInstanceInfo_t *info) {
    INST(h, K_GI, in);
    if (!info) return E_INVAL;
    struct profile *p = &in_g->profiles[in->profile];
    info->device = &in_g->self; info->id = in->gi_id; info->profileId = p->id;
    info->placement.start = in->start; info->placement.size = p->placements[0].size;
    return OK;
}
static nvmlReturn_t nvmlGpuInstanceDestroy_locked(void *h) {
    INST(h, K_GI, in);
    if (in->has_ci) return E_INUSE;
    in->used = 0;
    return OK;
}
nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(void *h, unsigned profile, unsigned eng, nvmlComputeInstanceProfileInfo_v2_t *info) {
    INST(h, K_GI, in);
    if (!info) return E_INVAL;
    struct profile *p = &in_g->profiles[in->profile];
    if ((int)profile != full_ci_profile(p->slices) || eng != 0) return E_NOTSUP;
    info->id = profile; info->sliceCount = p->slices; info->instanceCount = 1; info->multiprocessorCount = p->mps;
    info->sharedCopyEngineCount = p->ce; info->sharedDecoderCount = p->dec; info->sharedEncoderCount = p->enc;
    info->sharedJpegCount = p->jpeg; info->sharedOfaCount = p->ofa;
    snprintf(info->name, sizeof info->name, "MIG %s", p->name);
    return OK;
}
static nvmlReturn_t nvmlGpuInstanceCreateComputeInstance_locked(void *h, unsigned profile, void **ci) {
    INST(h, K_GI, in);
    if (!ci) return E_INVAL;
    if ((int)profile != full_ci_profile(in_g->profiles[in->profile].slices)) return E_NOTSUP;
    if (in->has_ci) return E_RESOURCES;
    in->has_ci = 1;
    *ci = &in->ci;
    return OK;
}
nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(void *h, unsigned id, void **ci) {
    INST(h, K_GI, in);
    if (!ci) return E_INVAL;
    if (id != 0 || !in->has_ci) return E_NOTFOUND;
    *ci = &in->ci;
    return OK;
}
nvmlReturn_t nvmlComputeInstanceGetInfo_v2(void *h, nvmlComputeInstanceInfo_t *info) {
    INST(h, K_CI, in);
    if (!info) return E_INVAL;
    struct profile *p = &in_g->profiles[in->profile];
    info->device = &in_g->self; info->gpuInstance = &in->gi; info->id = 0;
    info->profileId = (unsigned)full_ci_profile(p->slices);
    info->placement.start = 0; info->placement.size = p->slices;
    return OK;
}
static nvmlReturn_t nvmlComputeInstanceDestroy_locked(void *h) {
    INST(h, K_CI, in);
    in->has_ci = 0;
    return OK;
}
/* The MIG changes, each under the node's MIG lock. */
nvmlReturn_t nvmlDeviceSetMigMode(void *h, unsigned mode, nvmlReturn_t *activation) {
    READY();
    int fd = mig_begin();
    nvmlReturn_t rc = nvmlDeviceSetMigMode_locked(h, mode, activation);
    mig_end(fd, rc == OK);
    return rc;
}
nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(void *h, unsigned id, const nvmlPlacement_t *pl, void **gi) {
    READY();
    int fd = mig_begin();
    nvmlReturn_t rc = nvmlDeviceCreateGpuInstanceWithPlacement_locked(h, id, pl, gi);
    mig_end(fd, rc == OK);
    return rc;
}
nvmlReturn_t nvmlGpuInstanceDestroy(void *h) {
    READY();
    int fd = mig_begin();
    nvmlReturn_t rc = nvmlGpuInstanceDestroy_locked(h);
    mig_end(fd, rc == OK);
    return rc;
}
nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(void *h, unsigned profile, void **ci) {
    READY();
    int fd = mig_begin();
    nvmlReturn_t rc = nvmlGpuInstanceCreateComputeInstance_locked(h, profile, ci);
    mig_end(fd, rc == OK);
    return rc;
}
nvmlReturn_t nvmlComputeInstanceDestroy(void *h) {
    READY();
    int fd = mig_begin();
    nvmlReturn_t rc = nvmlComputeInstanceDestroy_locked(h);
    mig_end(fd, rc == OK);
    return rc;
}
nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(void *h, unsigned *count) {
    GPU(h, g);
    if (!count) return E_INVAL;
    if (!g->mig_capable) return E_NOTSUP;
    *count = g->max_mig;
    return OK;
}
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(void *h, unsigned index, void **mig) {
    GPU(h, g);
    if (!mig) return E_INVAL;
    if (!g->mig_capable) return E_NOTSUP;
    if (!g->mig_current) return E_STATE;
    if (index >= g->max_mig) return E_INVAL;
    /* MIG devices in placement order, as nvidia-smi lists them */
    struct instance *order[MAX_INSTANCES];
    unsigned n = 0;
    for (int s = 0; s < MAX_INSTANCES; s++) if (g->instances[s].used && g->instances[s].has_ci) order[n++] = &g->instances[s];
    for (unsigned i = 1; i < n; i++)
        for (unsigned j = i; j > 0 && order[j - 1]->start > order[j]->start; j--) {
            struct instance *t = order[j]; order[j] = order[j - 1]; order[j - 1] = t;
        }
    if (index >= n) return E_NOTFOUND;
    *mig = &order[index]->mig;
    return OK;
}
nvmlReturn_t nvmlDeviceIsMigDeviceHandle(void *h, unsigned *is_mig) {
    READY();
    if (!is_mig) return E_INVAL;
    struct gpu *x;
    if (mig_of(h, &x)) { *is_mig = 1; return OK; }
    if (tag_of(h, K_GPU)) { *is_mig = 0; return OK; }
    return E_INVAL;
}
nvmlReturn_t nvmlDeviceGetGpuInstanceId(void *h, unsigned *id) {
    READY();
    struct gpu *x;
    struct instance *in = mig_of(h, &x);
    if (!id) return E_INVAL;
    if (!in) return tag_of(h, K_GPU) ? E_NOTSUP : E_INVAL;
    *id = in->gi_id;
    return OK;
}
nvmlReturn_t nvmlDeviceGetComputeInstanceId(void *h, unsigned *id) {
    READY();
    struct gpu *x;
    struct instance *in = mig_of(h, &x);
    if (!id) return E_INVAL;
    if (!in) return tag_of(h, K_GPU) ? E_NOTSUP : E_INVAL;
    *id = 0;
    return OK;
}
nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(void *h, void **gpu) {
    READY();
    struct gpu *x;
    if (!gpu || !mig_of(h, &x)) return E_INVAL;
    *gpu = &x->self;
    return OK;
}

/* ---- events: none ever arrive on a healthy mock; waits time out as the real ones do ------------ */

nvmlReturn_t nvmlEventSetCreate(void **set) { READY(); if (!set) return E_INVAL; *set = &event_tag; return OK; }
nvmlReturn_t nvmlDeviceGetSupportedEventTypes(void *h, unsigned long long *types) {
    GPU(h, g);
    (void)g;
    if (!types) return E_INVAL;
    *types = 0x8 | 0x4 | 0x2; /* Xid critical error, double-bit ECC, single-bit ECC */
    return OK;
}
nvmlReturn_t nvmlDeviceRegisterEvents(void *h, unsigned long long types, void *set) {
    GPU(h, g);
    (void)g; (void)types;
    return set == &event_tag ? OK : E_INVAL;
}
nvmlReturn_t nvmlEventSetWait_v2(void *set, nvmlEventData_t *data, unsigned timeout_ms) {
    READY();
    if (set != &event_tag || !data) return E_INVAL;
    struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    return E_TIMEOUT;
}
nvmlReturn_t nvmlEventSetFree(void *set) { READY(); return set == &event_tag ? OK : E_INVAL; }
