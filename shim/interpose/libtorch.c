/* libtorch's C++ entry points (plugin_abi/libtorch.h), defined here under their mangled names:
 * libtorch is linked without -Bsymbolic, so these definitions win for the program's calls,
 * libtorch's own and its vtables' alike. Each forwards to the adapter plugin where it runs in this
 * process, and otherwise to libtorch's definition, unchanged: a process without libtorch never
 * calls them, and one with a libtorch the plugin was not built for is told so once and runs as it
 * would. */
#define _GNU_SOURCE
#include "libtorch.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "core/dps.h"
#include "core/real.h"

/* The forwarding relies on x86-64's calling convention (plugin_abi/libtorch.h); elsewhere
 * libtorch's C++ calls run without the adapter. */
#if defined(__x86_64__)

static const char *const entry_names[] = {
#define DPS_TORCH_NAME(id, name, fn) name,
    DPS_TORCH_ENTRIES(DPS_TORCH_NAME)
#undef DPS_TORCH_NAME
};

static void *_Atomic reals[DPS_TORCH_COUNT];
static dps_torch_handler_t handlers[DPS_TORCH_COUNT];     /* set once, under `once` */
static dps_torch_batch_norm_handler_t batch_norm_handler; /* the same */
static pthread_once_t once = PTHREAD_ONCE_INIT;
static char state[512]; /* what became of the adapter, for the end-of-job summary */
static int running;

typedef uintptr_t (*raw_fn)(uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t);

/* The file name of the libtorch_cpu this process has loaded. */
static int find_libtorch(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    const char *slash = info->dlpi_name ? strrchr(info->dlpi_name, '/') : NULL;
    const char *base = slash ? slash + 1 : info->dlpi_name;
    if (!base || strncmp(base, "libtorch_cpu.so", 15)) return 0;
    snprintf(data, 256, "%s", info->dlpi_name);
    return 1;
}

/* [optim] shard as dps_torch_config_t says it (0 off, 1 on, 2 auto) */
static int shard_setting(void)
{
    int v = (int)DPS_POLICY_ENUM(&dps_g.policy, optim, shard);
    return v == DPS_V_optim_shard_on ? 1 : v == DPS_V_optim_shard_auto ? 2 : 0;
}

/* libdpshim-libtorch.needs in the plugin directory: libtorch_cpu's soname and the libtorch version
 * the plugin is built for, one per line. 0; 1 where there is no such file (no adapter
 * installed); a malformed file ends the job. */
static int read_needs(const char *dir, char *soname, char *version, size_t len)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/libdpshim-libtorch.needs", dir);
    FILE *f = fopen(path, "r");
    if (!f) return 1;
    soname[0] = version[0] = '\0';
    int ok = fgets(soname, (int)len, f) && fgets(version, (int)len, f);
    fclose(f);
    soname[strcspn(soname, "\n")] = version[strcspn(version, "\n")] = '\0';
    if (!ok || strncmp(soname, "libtorch_cpu.so", 15) || !version[0])
        dps_fatal(
            "%s is not what a build of the libtorch adapter writes (libtorch_cpu's soname, then libtorch's "
            "version, one per line): reinstall dpshim's libtorch adapter",
            path);
    return 0;
}

/* The adapter does not fit this process's libtorch: rank 0 says so, and libtorch's calls run
 * unchanged (the job's end then says nothing was distributed). */
static void run_without_adapter(const char *why)
{
    snprintf(state, sizeof state,
             "%s: its C++ calls run without the adapter; build dpshim against this libtorch", why);
    if (dps_g.rank == 0) DPS_WARN("%s", state);
    memset(handlers, 0, sizeof handlers);
    batch_norm_handler = NULL;
}

static void start_adapter(void)
{
    char dir[1024] = "the plugin directory", soname[256], version[256], why[512];
    if (dps_plugin_dir(dir, sizeof dir) != 0 || read_needs(dir, soname, version, sizeof soname) != 0) {
        snprintf(state, sizeof state,
                 "no libtorch adapter is installed in %.300s (it is built where libtorch-dev is "
                 "installed, and packaged as dpshim-libtorch)",
                 dir);
        return;
    }
    void *same = dlopen(soname, RTLD_NOLOAD | RTLD_LAZY);
    if (!same) {
        char loaded[256] = "another libtorch";
        dl_iterate_phdr(find_libtorch, loaded);
        snprintf(why, sizeof why,
                 "the libtorch adapter is built for %.64s (libtorch %.32s), but this process runs "
                 "%.256s",
                 soname, version, loaded);
        run_without_adapter(why);
        return;
    }
    dlclose(same);
    char path[1200], err[512] = "";
    snprintf(path, sizeof path, "%s/libdpshim-libtorch.so", dir);
    void *plugin = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    char open_err[512] = "";
    if (!plugin) snprintf(open_err, sizeof open_err, "%s", dlerror());
    if (strstr(open_err, "undefined symbol")) { /* the same soname, another version's symbols */
        snprintf(why, sizeof why,
                 "the libtorch adapter (built for libtorch %.32s) needs functions this process's "
                 "%.64s lacks (another version under the same soname)",
                 version, soname);
        run_without_adapter(why);
        return;
    }
    dps_torch_init_t init = NULL;
    if (plugin) *(void **)&init = dlsym(plugin, DPS_TORCH_INIT_SYMBOL);
    dps_torch_config_t c = {.abi = DPS_TORCH_ABI,
                            .rank = dps_g.eff_rank,
                            .size = dps_g.eff_size,
                            .split_mode = dps_g.split_mode,
                            .uneven = dps_g.uneven,
                            .eval_whole = DPS_POLICY_ENUM(&dps_g.policy, data, eval) == DPS_V_data_eval_whole,
                            .shard = shard_setting(),
                            .bn_sync = dps_g.bn_sync};
    int started = init ? init(&c, handlers, err, sizeof err) : -1;
    if (started == 1) { /* the same soname, another version */
        run_without_adapter(err);
        return;
    }
    if (started != 0)
        dps_fatal("the libtorch adapter (%s, built for libtorch %s) could not start: %s; without it every "
                  "rank would "
                  "train alone",
                  path, version,
                  err[0]   ? err
                  : plugin ? "no " DPS_TORCH_INIT_SYMBOL
                           : open_err);
    *(void **)&batch_norm_handler = dlsym(plugin, DPS_TORCH_BATCH_NORM_SYMBOL);
    snprintf(state, sizeof state, "the libtorch adapter (libtorch %s) in this process", version);
    DPS_INFO("%s, from %s", state, path);
    running = 1;
}

static void load_adapter(void)
{
    if (dps_g.role != DPS_ROLE_RANK || dps_g.eff_size < 2) return; /* alone: libtorch's own calls */
    if (dps_g.python_adapter) return; /* a Python script: the PyTorch adapter distributes it */
    dps_in_shim++;
    start_adapter();
    dps_in_shim--;
}

const char *dps_torch_adapter_state(void)
{
    return state;
}
int dps_torch_adapter_running(void)
{
    return running;
}

static uintptr_t enter(dps_torch_entry_t id, const uintptr_t a[6])
{
    void *real = atomic_load_explicit(&reals[id], memory_order_relaxed);
    if (!real) atomic_store_explicit(&reals[id], real = dps_real_find(entry_names[id]), memory_order_relaxed);
    pthread_once(&once, load_adapter);
    dps_torch_handler_t h = handlers[id];
    if (h && !dps_in_shim && !atomic_load_explicit(&dps_g.forked, memory_order_relaxed)) return h(a, real);
    return ((raw_fn)real)(a[0], a[1], a[2], a[3], a[4], a[5]);
}

#define DPS_TORCH_STUB(id, name, fn)                                                                         \
    DPS_EXPORT uintptr_t dps_torch_##id(uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t,               \
                                        uintptr_t) __asm__(name);                                            \
    DPS_EXPORT uintptr_t dps_torch_##id(uintptr_t a0, uintptr_t a1, uintptr_t a2, uintptr_t a3,              \
                                        uintptr_t a4, uintptr_t a5)                                          \
    {                                                                                                        \
        const uintptr_t a[6] = {a0, a1, a2, a3, a4, a5};                                                     \
        return enter(DPS_TORCH_##id, a);                                                                     \
    }
DPS_TORCH_ENTRIES(DPS_TORCH_STUB)
#undef DPS_TORCH_STUB

/* --- batch_norm: a signature of its own (plugin_abi/libtorch.h) --- */

static const char *const batch_norm_names[] = {
#define DPS_TORCH_BN_NAME(id, name) name,
    DPS_TORCH_BATCH_NORMS(DPS_TORCH_BN_NAME)
#undef DPS_TORCH_BN_NAME
};
static void *_Atomic batch_norm_reals[sizeof batch_norm_names / sizeof *batch_norm_names];
/* The executable segment of the library that defines batch_norm (libtorch_cpu): a call from
 * there is libtorch's own (InstanceNorm normalizes each sample through batch_norm), not a
 * BatchNorm of the program's. Found once; racing threads find the same. */
static _Atomic uintptr_t torch_code_lo, torch_code_hi;

static int find_code(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    uintptr_t at = (uintptr_t)data;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X) || at < lo || at >= lo + ph->p_memsz) continue;
        atomic_store_explicit(&torch_code_lo, lo, memory_order_relaxed);
        atomic_store_explicit(&torch_code_hi, lo + ph->p_memsz, memory_order_release);
        return 1;
    }
    return 0;
}

/* The real batch_norm: in the global scope where the program links libtorch, which dlsym's
 * RTLD_NEXT searches; else in the calling library's own scope, for a libtorch loaded with
 * RTLD_LOCAL (Python imports torch's libraries so, and its BatchNorm calls land here too). */
static void *find_batch_norm(const char *name, const void *caller)
{
    void *f = dlsym(RTLD_NEXT, name);
    Dl_info info;
    if (!f && dladdr(caller, &info) && info.dli_fname && info.dli_fname[0]) {
        void *h = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
        if (h) f = dlsym(h, name), dlclose(h);
    }
    return f ? f : dps_real_find(name); /* nowhere: ends the process naming it */
}

static void *batch_norm(int which, const void *caller, void *out, const void *input, const void *weight,
                        const void *bias, const void *running_mean, const void *running_var, bool training,
                        double momentum, double eps, bool cudnn_enabled)
{
    void *real = atomic_load_explicit(&batch_norm_reals[which], memory_order_relaxed);
    if (!real) {
        atomic_store_explicit(&batch_norm_reals[which],
                              real = find_batch_norm(batch_norm_names[which], caller), memory_order_relaxed);
        if (!atomic_load_explicit(&torch_code_hi, memory_order_acquire)) dl_iterate_phdr(find_code, real);
    }
    pthread_once(&once, load_adapter);
    uintptr_t from = (uintptr_t)caller, hi = atomic_load_explicit(&torch_code_hi, memory_order_acquire);
    int libtorch_own = from < hi && from >= atomic_load_explicit(&torch_code_lo, memory_order_relaxed);
    dps_torch_batch_norm_t fn = (dps_torch_batch_norm_t)real;
    if (batch_norm_handler && training && !libtorch_own && !dps_in_shim &&
        !atomic_load_explicit(&dps_g.forked, memory_order_relaxed))
        return batch_norm_handler(fn, out, input, weight, bias, running_mean, running_var, training, momentum,
                                  eps, cudnn_enabled);
    return fn(out, input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled);
}

enum {
#define DPS_TORCH_BN_ENUM(id, name) DPS_TORCH_BN_##id,
    DPS_TORCH_BATCH_NORMS(DPS_TORCH_BN_ENUM)
#undef DPS_TORCH_BN_ENUM
};

#define DPS_TORCH_BN_STUB(id, name)                                                                          \
    DPS_EXPORT void *dps_torch_##id(void *, const void *, const void *, const void *, const void *,          \
                                    const void *, bool, double, double, bool) __asm__(name);                 \
    DPS_EXPORT void *dps_torch_##id(void *out, const void *input, const void *weight, const void *bias,      \
                                    const void *running_mean, const void *running_var, bool training,        \
                                    double momentum, double eps, bool cudnn_enabled)                         \
    {                                                                                                        \
        return batch_norm(DPS_TORCH_BN_##id, __builtin_return_address(0), out, input, weight, bias,          \
                          running_mean, running_var, training, momentum, eps, cudnn_enabled);                \
    }
DPS_TORCH_BATCH_NORMS(DPS_TORCH_BN_STUB)
#undef DPS_TORCH_BN_STUB

#else
const char *dps_torch_adapter_state(void)
{
    return "the libtorch adapter runs on x86-64 only";
}
int dps_torch_adapter_running(void)
{
    return 0;
}
#endif
