/* The backend table and plugin loading: libdpshim.so never links MPI or NCCL; their plugins
 * sit in its plugin directory (dpshim/ beside it) and are opened with dlopen the first time a collective needs them. */
#define _GNU_SOURCE
#include "backend.h"

#include <dlfcn.h>
#include <libgen.h>
#include <stdio.h>
#include <string.h>

#include "core/dps.h"
#include "core/dtype.h"

static int self_allreduce(void *buf, size_t count, int dtype, dps_redop_t op, double pre, double post,
                          int one_tensor)
{
    (void)one_tensor;
    if (op == DPS_RED_SUM)
        dps_scale_in_place(buf, count, dtype, pre), dps_scale_in_place(buf, count, dtype, post);
    return 0;
}
static int self_bcast(void *buf, size_t bytes, int root)
{
    (void)buf, (void)bytes, (void)root;
    return 0;
}
static int self_barrier(void)
{
    return 0;
}
static const char *self_last_error(void)
{
    return "";
}
static void self_release(void) {}
static int self_owns_mpi_init(void)
{
    return 0;
}

/* World size 1: a sum over one rank is the value itself. */
const dps_backend_t dps_backend_self = {.name = "self",
                                        .allreduce = self_allreduce,
                                        .bcast = self_bcast,
                                        .barrier = self_barrier,
                                        .last_error = self_last_error,
                                        .release = self_release,
                                        .finalize = self_release,
                                        .owns_mpi_init = self_owns_mpi_init,
                                        .tuning = self_last_error};

typedef struct backend_row {
    const char *name;
    const dps_backend_t *builtin; /* NULL: a plugin, libdpshim-<name>.so */
    dps_backend_t loaded;
} backend_row_t;

static backend_row_t backends[] = {
    {"self", &dps_backend_self, {0}},
    {"mpi", NULL, {0}},
};

/* A plugin in the plugin directory (dps_plugin_dir). */
static int plugin_path(const char *name, char *out, size_t len)
{
    char dir[1024];
    if (dps_plugin_dir(dir, sizeof dir) != 0) return -1;
    int n = snprintf(out, len, "%s/libdpshim-%s.so", dir, name);
    return n > 0 && (size_t)n < len ? 0 : -1;
}

const dps_backend_t *dps_backend_open(const char *name, int rank, int size, char *err, size_t errlen)
{
    for (size_t i = 0; i < sizeof backends / sizeof *backends; i++) {
        backend_row_t *b = &backends[i];
        if (strcmp(b->name, name) != 0) continue;
        if (b->builtin) return b->builtin;
        if (b->loaded.name) return &b->loaded;
        char path[1200];
        if (plugin_path(name, path, sizeof path) != 0) {
            snprintf(err, errlen,
                     "cannot locate the %s backend plugin (dpshim/ beside libdpshim.so, or "
                     "DPSHIM_PLUGIN_DIR)",
                     name);
            return NULL;
        }
        /* RTLD_GLOBAL: Open MPI's own components resolve libmpi's symbols globally */
        void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
        if (!h) {
            snprintf(err, errlen, "cannot load the %s backend: %s", name, dlerror());
            return NULL;
        }
        dps_plugin_open_fn open_fn;
        *(void **)&open_fn = dlsym(h, DPS_PLUGIN_OPEN_SYMBOL);
        if (!open_fn) {
            snprintf(err, errlen, "%s is not a dpshim plugin (no %s)", path, DPS_PLUGIN_OPEN_SYMBOL);
            return NULL;
        }
        if (open_fn(rank, size, &b->loaded, err, errlen) != 0) {
            memset(&b->loaded, 0, sizeof b->loaded);
            return NULL;
        }
        return &b->loaded;
    }
    snprintf(err, errlen, "no backend named '%s' in this build", name);
    return NULL;
}

/* The GPU plugin: opened once; a failure is remembered and repeated. */
const dps_device_t *dps_device_open(char *err, size_t errlen)
{
    static dps_device_t dev;
    static int state; /* 0: not tried, 1: open, -1: failed */
    static char why[1536];
    if (state == 0) {
        char path[1200];
        void *h = NULL;
        dps_device_open_fn open_fn = NULL;
        if (plugin_path("nccl", path, sizeof path) != 0)
            snprintf(why, sizeof why,
                     "cannot locate the GPU plugin (libdpshim-nccl.so in dpshim/ beside "
                     "libdpshim.so, or DPSHIM_PLUGIN_DIR)");
        else if (!(h = dlopen(path, RTLD_NOW | RTLD_LOCAL)))
            snprintf(why, sizeof why, "cannot load the GPU plugin: %s", dlerror());
        else if (!(*(void **)&open_fn = dlsym(h, DPS_DEVICE_OPEN_SYMBOL)))
            snprintf(why, sizeof why, "%s is not dpshim's GPU plugin (no %s)", path, DPS_DEVICE_OPEN_SYMBOL);
        else if (open_fn(&dev, why, sizeof why) == 0)
            state = 1;
        if (state == 0) state = -1;
    }
    if (state > 0) return &dev;
    snprintf(err, errlen, "%s", why);
    return NULL;
}
