/* [adapters] python = auto: when the preloaded rank process is a Python interpreter, its
 * PYTHONPATH gains the adapter directory (python/ beside libdpshim.so), whose sitecustomize.py
 * restores the user's PYTHONPATH at once, chains to any other sitecustomize, and loads the
 * PyTorch adapter when the script imports torch. Set here, in the constructor, because the
 * interpreter reads PYTHONPATH only after it starts. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "start.h"

/* The user's PYTHONPATH, for the adapter to put back: "set:VALUE" or "unset". */
#define DPS_ENV_PYTHONPATH "DPSHIM_PYTHONPATH"

static int is_python(void)
{
    /* CPython's main program exports these for extension modules; nothing else does */
    return dlsym(RTLD_DEFAULT, "Py_BytesMain") != NULL &&
           dlsym(RTLD_DEFAULT, "PyImport_ImportModule") != NULL;
}

DPS_STARTUP void dps_python_inject(const dps_state_t *s)
{
    if (s->role != DPS_ROLE_RANK || DPS_POLICY_ENUM(&s->policy, adapters, python) != DPS_V_adapters_python_auto || !is_python())
        return;
    Dl_info info;
    char lib[1024], dir[1100];
    if (!dladdr((void *)&dps_python_inject, &info) || !info.dli_fname) return;
    snprintf(lib, sizeof lib, "%s", info.dli_fname);
    snprintf(dir, sizeof dir, "%s/python", dirname(lib));
    char probe[1200];
    snprintf(probe, sizeof probe, "%s/sitecustomize.py", dir);
    if (access(probe, R_OK) != 0) {
        DPS_WARN("[adapters] python: %s is missing; the PyTorch adapter is not loaded (reinstall dpshim)",
                 probe);
        return;
    }
    const char *old = getenv("PYTHONPATH");
    size_t len = strlen(dir) + (old ? strlen(old) : 0) + 8;
    char *saved = malloc(len), *path = malloc(len);
    if (!saved || !path) {
        free(saved), free(path);
        return;
    }
    snprintf(saved, len, "%s%s", old ? "set:" : "unset", old ? old : "");
    snprintf(path, len, "%s%s%s", dir, old && *old ? ":" : "", old && *old ? old : "");
    setenv(DPS_ENV_PYTHONPATH, saved, 1);
    setenv("PYTHONPATH", path, 1);
    free(saved), free(path);
    dps_g.python_adapter = 1;
    DPS_DEBUG("[adapters] python: adapter directory %s put first on PYTHONPATH", dir);
}
