/* dpshim_describe: what this process's start-up found, for `dpshim-diag env`. Not a hook: the
 * tool loads libdpshim.so and calls it. Libraries are only opened to read their versions. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <dpshim/hooks.h>

#include "backends/backend.h"
#include "core/dps.h"
#include "engine/engine.h"
#include "gpu/bind.h"
#include "core/sys.h"

static void add(char *buf, size_t len, size_t *o, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void add(char *buf, size_t len, size_t *o, const char *fmt, ...)
{
    if (*o >= len) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *o, len - *o, fmt, ap);
    va_end(ap);
    if (n > 0) *o += (size_t)n;
}

/* The version string a library reports through fn, or NULL when it is not there. */
static const char *mpi_version(char *out, size_t len)
{
    void *h = dlopen("libmpi.so.40", RTLD_NOW | RTLD_LOCAL);
    int (*get)(char *, int *) = h ? (int (*)(char *, int *))dlsym(h, "MPI_Get_library_version") : NULL;
    static char v[8192]; /* MPI_MAX_LIBRARY_VERSION_STRING is at most a few KiB */
    int n = 0;
    if (!get || get(v, &n) != 0) return NULL;
    v[strcspn(v, ",\n")] = '\0';
    snprintf(out, len, "%.200s", v);
    return out;
}

static const char *pmix_version(void)
{
    void *h = dlopen("libpmix.so.2", RTLD_NOW | RTLD_LOCAL);
    const char *(*get)(void) = h ? (const char *(*)(void))dlsym(h, "PMIx_Get_version") : NULL;
    return get ? get() : NULL;
}

/* The GPU plugin's view: versions, and which path GPU tensors would take. */
static void gpu_lines(char *buf, size_t len, size_t *o)
{
    char err[1536];
    const dps_device_t *gpu = dps_device_open(err, sizeof err);
    if (!gpu) {
        add(buf, len, o, "cuda       %s\ngpu path   none: GPU tensors cannot be reduced here\n", err);
        return;
    }
    add(buf, len, o, "cuda       %s\n", gpu->versions());
    if (gpu->notice()) add(buf, len, o, "           warning: %s\n", gpu->notice());
    const char *path = !gpu->count() ? "none: no usable GPU"
                       : DPS_POLICY_ENUM(&dps_g.policy, comm, backend) == DPS_V_comm_backend_mpi
                           ? "staged through host memory and MPI ([comm] backend = mpi)"
                       : !gpu->has_nccl() ? "staged through host memory and MPI (no NCCL)"
                                          : "nccl; staged through host memory where ranks share a GPU (all "
                                            "ranks agree at the first GPU collective)";
    add(buf, len, o, "gpu path   %s\n", path);
}

/* A policy value as text ("whole" for section "data", key "eval"), for the Python adapter; NULL
 * for a key that does not exist. */
DPS_EXPORT const char *dpshim_policy_value(const char *section, const char *key)
{
    int id = section && key ? dps_policy_find_key(section, strlen(section), key, strlen(key)) : -1;
    return id < 0 ? NULL : dps_policy_text(&dps_g.policy, (dps_key_id_t)id);
}

/* 1 when gradients announced by dp_grad_ready are reduced in the background ([comm] overlap, as
 * the ranks agreed it when the backend opened), for the Python adapter. */
DPS_EXPORT int dpshim_overlap(void)
{
    return dps_g.overlap;
}

/* The Python adapter found that the script distributes itself (torch.distributed, DDP, FSDP, a
 * DistributedSampler) and stopped acting in this process: said once by rank 0, and the exit's
 * "nothing was distributed" warning would be wrong. */
/* The PyTorch adapter at the interpreter's start: 1 where this process holds the rank's place
 * or takes it now (claim.c), so the adapter acts here; 0 in a child of the process that does. */
DPS_EXPORT int dpshim_claim_rank(void)
{
    return dps_claim_rank();
}

DPS_EXPORT void dpshim_step_aside(const char *why)
{
    if (dps_e.aside) return;
    dps_e.aside = 1;
    snprintf(dps_e.aside_why, sizeof dps_e.aside_why, "%s", why ? why : "?");
    /* said at the default level: a user who launched a DDP script under dpshim learns at once that
     * dpshim adds nothing to its data path, rather than at exit or never */
    if (dps_g.rank == 0)
        DPS_NOTE(
            "NOTE",
            "the script distributes itself (%s): dpshim steps aside for it (no sharding, gradient "
            "averaging, parameter broadcast, BatchNorm synchronization or seed agreement from dpshim); the "
            "file and output policy and the guard still apply",
            dps_e.aside_why);
}

DPS_EXPORT int dpshim_describe(char *buf, size_t len)
{
    size_t o = 0;
    char v[512];
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    Dl_info info;
    char where[PATH_MAX], plugins[1024];
    const char *lib = dladdr((void *)&dpshim_describe, &info) && info.dli_fname ? info.dli_fname : "?";
    add(buf, len, &o, "library    %s (version %s, hook ABI version %d)\n", realpath(lib, where) ? where : lib,
        DPS_VERSION, DPSHIM_HOOK_ABI_VERSION);
    if (dps_plugin_dir(plugins, sizeof plugins) == 0) {
        /* each part the directory should hold, or why it is not there */
        static const char *const parts[][2] = {{"mpi plugin", "libdpshim-mpi.so"},
                                               {"GPU plugin", "libdpshim-nccl.so"},
                                               {"Python adapter", "python/dpshim_pytorch"}};
        add(buf, len, &o, "plugins    %s%s\n", realpath(plugins, where) ? where : plugins,
            getenv("DPSHIM_PLUGIN_DIR") ? " (DPSHIM_PLUGIN_DIR)" : "");
        for (size_t i = 0; i < sizeof parts / sizeof *parts; i++) {
            char path[1100];
            snprintf(path, sizeof path, "%s/%s", plugins, parts[i][1]);
            add(buf, len, &o, "           %s: %s%s\n", parts[i][0], parts[i][1],
                dps_sys_access(path, R_OK) == 0 ? ""
                : errno == ENOENT               ? " missing"
                                                : " unreadable");
        }
    }
    add(buf, len, &o, "launcher   %s\n", dps_g.launcher);
    add(buf, len, &o, "rank       %d of %d (local %d of %d), %s process\n", dps_g.rank, dps_g.size,
        dps_g.local_rank, dps_g.local_size, dps_g.role == DPS_ROLE_RANK ? "rank" : "child");
    add(buf, len, &o, "local      rank from %s, size from %s\n",
        dps_g.local_rank_source ? dps_g.local_rank_source : "?",
        dps_g.local_source ? dps_g.local_source : "?");
    add(buf, len, &o, "policy     %s\n", dps_g.policy.file[0] ? dps_g.policy.file : "built-in defaults");
    add(buf, len, &o, "backend    %s (world size %d for collectives)\n", dps_g.eff_size == 1 ? "self" : "mpi",
        dps_g.eff_size);
    add(buf, len, &o, "mpi        %s\n", mpi_version(v, sizeof v) ? v : "not found (libmpi.so.40)");
    const char *pv = pmix_version();
    add(buf, len, &o, "pmix       %s\n", pv ? pv : "not found (libpmix.so.2)");
    add(buf, len, &o, "gpus       %d device(s) in /dev, CUDA_VISIBLE_DEVICES %s\n", dps_gpu_count(),
        cvd ? cvd : "unset");
    gpu_lines(buf, len, &o);
    return (int)o;
}
