/* [adapters] python = auto: when the preloaded rank process is a Python interpreter, its
 * PYTHONPATH gains the adapter directory (python/ in the plugin directory, dpshim/ beside libdpshim.so), whose sitecustomize.py
 * restores the user's PYTHONPATH at once, chains to any other sitecustomize, and loads the
 * PyTorch adapter when the script imports torch. Set here, in the constructor, because the
 * interpreter reads PYTHONPATH only after it starts. */
#define _GNU_SOURCE
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "start.h"
#include "core/sys.h"

/* The user's PYTHONPATH, for the adapter to put back: "set:VALUE" or "unset". */
#define DPS_ENV_PYTHONPATH "DPSHIM_PYTHONPATH"
/* Set with PYTHONHASHSEED when the shim chose it: the variable it was derived from. */
#define DPS_ENV_HASHSEED "DPSHIM_HASHSEED"

static int is_python(void)
{
    /* CPython's main program exports these for extension modules; nothing else does */
    return dps_elf_defines("Py_BytesMain") && dps_elf_defines("PyImport_ImportModule");
}

/* Python's string hashes, and with them the order of a set or dict of strings (a vocabulary
 * built with list(set(text))), follow PYTHONHASHSEED, random per interpreter when unset: ranks
 * would build different vocabularies and train one model on both. Unless the user chose a seed,
 * every rank's interpreter gets the same one, derived from the job's identity: the same on every
 * rank, another with every job, so as random from run to run as alone. Set here, since the
 * interpreter reads it before any Python code runs; the adapter checks that the ranks agree.
 * Without a job identity in the environment nothing is set, and the adapter's check says so. */
DPS_STARTUP static void agree_hash_seed(const dps_state_t *s)
{
    static const char *const job_ids[][2] = {{"PMIX_NAMESPACE", NULL},
                                             {"SLURM_JOB_ID", "SLURM_STEP_ID"},
                                             {"OMPI_MCA_orte_hnp_uri", NULL},
                                             {"PMI_KVSNAME", NULL}};
    if (s->size < 2 || getenv("PYTHONHASHSEED")) return;
    for (size_t i = 0; i < sizeof job_ids / sizeof *job_ids; i++) {
        if (!getenv(job_ids[i][0])) continue;
        uint64_t h = DPS_FNV_SEED; /* over the identity's values, each with its terminating NUL */
        for (int k = 0; k < 2 && job_ids[i][k]; k++) {
            const char *v = getenv(job_ids[i][k]) ? getenv(job_ids[i][k]) : "";
            h = dps_fnv1a(h, v, strlen(v) + 1);
        }
        char seed[24];
        snprintf(seed, sizeof seed, "%llu",
                 (unsigned long long)(1 + h % 4294967295ull)); /* 1..2^32-1: 0 turns hashing off */
        setenv("PYTHONHASHSEED", seed, 1);
        setenv(DPS_ENV_HASHSEED, job_ids[i][0], 1);
        return;
    }
}

DPS_STARTUP void dps_python_inject(const dps_state_t *s)
{
    /* a child Python gets the adapter too while the rank's place is free: the trainer a wrapper
     * starts (the adapter takes the place at its start) */
    if (DPS_POLICY_ENUM(&s->policy, adapters, python) != DPS_V_adapters_python_auto || !is_python() ||
        (s->role != DPS_ROLE_RANK && !dps_rank_place_free()))
        return;
    char plugins[1024], dir[1100];
    if (dps_plugin_dir(plugins, sizeof plugins) != 0) return;
    snprintf(dir, sizeof dir, "%s/python", plugins);
    char probe[1200];
    snprintf(probe, sizeof probe, "%s/sitecustomize.py", dir);
    if (dps_sys_access(probe, R_OK) != 0) {
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
    agree_hash_seed(s);
    DPS_DEBUG("[adapters] python: adapter directory %s put first on PYTHONPATH", dir);
}
