/* The process-wide state (see dps.h): filled by start-up before main(), read everywhere. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>

#include "dps.h"

DPS_STARTUP_DATA dps_state_t dps_g = {
    .size = 1, .eff_size = 1, .launcher = "singleton", .compress_dtype = -1};

__thread int dps_in_shim __attribute__((tls_model("initial-exec")));

int dps_plugin_dir(char *out, size_t len)
{
    const char *given = getenv("DPSHIM_PLUGIN_DIR");
    int n;
    if (given && *given) {
        n = snprintf(out, len, "%s", given);
    } else {
        Dl_info info;
        if (!dladdr((void *)&dps_plugin_dir, &info) || !info.dli_fname) return -1;
        char lib[1024];
        snprintf(lib, sizeof lib, "%s", info.dli_fname);
        n = snprintf(out, len, "%s/dpshim", dirname(lib));
    }
    return n > 0 && (size_t)n < len ? 0 : -1;
}
