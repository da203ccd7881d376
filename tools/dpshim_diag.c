/* dpshim-diag: explains what dpshim would do here.
 *   config          effective policy, every value with its source (default, file:line, env)
 *   check FILE      validate a policy file; exit 0 when valid, 1 with the error otherwise
 *   keys            the policy reference as Markdown tables, the keys and the other DPSHIM_
 *                   variables (the README's come from it)
 *   env             what the shim detects here (host, launcher, ranks, backends, GPUs, versions)
 *   bench [--init WORLD] [SET]
 *                   (under mpirun, with the shim preloaded) all-reduce through the shim
 *                   against plain MPI: the helper dpshim-bench does the work, in a
 *                   program that initialized MPI itself or not, or in a Python process
 *   report DIR [--trace OUT.json] [--svg OUT.svg]
 *                   merge the per-rank files of a [diag] dir
 *   --help, --version */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "diag_model.h"
#include "diag_report.h"
#include "policy.h"
#include <dpshim/hooks.h>

extern char **environ;

static void print_hooks(const dps_policy_t *p)
{
    for (int i = 0; i < p->nhooks; i++) {
        char d[1600];
        printf("[hook %s] %s # line %d\n", p->hooks[i].name, dps_hookdecl_describe(&p->hooks[i], d, sizeof d),
               p->hooks[i].line);
    }
}

static int cmd_config(void)
{
    dps_policy_t p;
    dps_error_t e;
    dps_policy_init(&p);
    if (dps_policy_load(&p, environ, &e) != 0) {
        fprintf(stderr, "dpshim-diag: %s\n", e.msg);
        return 1;
    }
    printf("# policy file: %s\n", p.file[0] ? p.file : "(none: built-in defaults)");
    const char *sec = "";
    for (int i = 0; i < DPS_NKEYS; i++) {
        char src[1200];
        if (strcmp(sec, dps_keys[i].section)) printf("[%s]\n", sec = dps_keys[i].section);
        printf("%-13s = %-20s # %s\n", dps_keys[i].key, dps_policy_text(&p, (dps_key_id_t)i),
               dps_policy_source(&p, (dps_key_id_t)i, src, sizeof src));
    }
    print_hooks(&p);
    dps_policy_free(&p);
    return 0;
}

static int cmd_check(const char *path)
{
    dps_policy_t p;
    dps_error_t e;
    dps_policy_init(&p);
    int rc = dps_policy_load_file(&p, path, &e);
    if (rc != 0) fprintf(stderr, "dpshim-diag: %s\n", e.msg);
    else {
        printf("%s: valid\n", path);
        print_hooks(&p);
    }
    dps_policy_free(&p);
    return rc ? 1 : 0;
}

/* Markdown cell text: '|' would end the cell. */
static void md(const char *s)
{
    for (; *s; s++) *s == '|' ? fputs(" \\| ", stdout) : putchar(*s);
}

static int cmd_keys(void)
{
    printf("| key | default | allowed | environment | meaning |\n|---|---|---|---|---|\n");
    for (int i = 0; i < DPS_NKEYS; i++) {
        char env[64];
        const dps_key_info_t *k = &dps_keys[i];
        printf("| `[%s] %s` | %s%s%s | ", k->section, k->key, *k->def ? "`" : "", *k->def ? k->def : "(empty)",
               *k->def ? "`" : "");
        md(k->type == DPS_KEY_GLOBS ? "globs" : k->type == DPS_KEY_STR ? "text" : k->allowed);
        printf(" | `%s` | ", dps_policy_env_name((dps_key_id_t)i, env, sizeof env));
        if (k->job) printf("(job-wide) ");
        md(k->doc);
        printf(" |\n");
    }
    printf("\n| variable | set by | meaning |\n|---|---|---|\n");
    for (size_t i = 0; i < dps_n_other_env; i++)
        printf("| `%s` | %s | %s |\n", dps_other_env[i].name, dps_other_env[i].set_by, dps_other_env[i].doc);
    return 0;
}

/* The shim answers for itself: dpshim-diag loads libdpshim.so (its own build or install tree's,
 * where the install layout puts it relative to this program, or DPSHIM_LIB) and asks it what its
 * start-up found, after the host it runs on, which tells the ranks of a job across machines
 * apart. */
static int cmd_env(void)
{
    char self[4096], lib[4300];
    const char *given = getenv("DPSHIM_LIB");
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (given) snprintf(lib, sizeof lib, "%s", given);
    else if (n > 0) self[n] = '\0', snprintf(lib, sizeof lib, "%s/%s/libdpshim.so", dirname(self), DPS_BIN_TO_LIB);
    else snprintf(lib, sizeof lib, "libdpshim.so");
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    int (*describe)(char *, size_t) = h ? (int (*)(char *, size_t))dlsym(h, "dpshim_describe") : NULL;
    if (!describe) {
        fprintf(stderr, "dpshim-diag: cannot load %s (%s); set DPSHIM_LIB to libdpshim.so\n", lib, dlerror());
        return 1;
    }
    static char buf[8192];
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "? (%s)", strerror(errno));
    printf("host       %s\n", host);
    describe(buf, sizeof buf);
    fputs(buf, stdout);
    return 0;
}

/* Runs the helper dpshim-bench (libexec/dpshim/, where the build and install trees keep it
 * relative to this program), or with --init python the same benchmark inside a Python process
 * with torch loaded (bench_torch.py, run by Debian's system interpreter, which has torch). */
static int cmd_bench(char **argv)
{
    char self[4096], helpers[4200], bench[4300];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return 1;
    self[n] = '\0';
    snprintf(helpers, sizeof helpers, "%s/%s", dirname(self), DPS_BIN_TO_HELPERS);
    int python = argv[2] && argv[3] && !strcmp(argv[2], "--init") && !strcmp(argv[3], "python");
    const char *set = argv[2] && !strcmp(argv[2], "--init") ? (argv[3] ? argv[4] : NULL) : argv[2];
    /* the overlap set measures the progress thread: on unless the user says otherwise */
    if (set && !strcmp(set, "overlap")) setenv("DPSHIM_COMM_OVERLAP", "on", 0);
    /* the gpu set compares NCCL's and hand-made sums with the shim's: plain sums, unless the user
     * says otherwise */
    if (set && !strncmp(set, "gpu", 3)) setenv("DPSHIM_COMM_REDUCE", "sum", 0);
    if (python) {
        snprintf(bench, sizeof bench, "%s/bench_torch.py", helpers);
        char *args[] = {"/usr/bin/python3", bench, set ? (char *)set : "sweep", NULL};
        execv(args[0], args);
        fprintf(stderr, "dpshim-diag: cannot run %s %s: %s\n", args[0], bench, strerror(errno));
        return 1;
    }
    snprintf(bench, sizeof bench, "%s/dpshim-bench", helpers);
    argv[1] = bench;
    execv(bench, argv + 1);
    fprintf(stderr, "dpshim-diag: cannot run %s\n", bench);
    return 1;
}

static int cmd_report(int argc, char **argv)
{
    const char *trace = NULL, *svg = NULL;
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "--trace") && i + 1 < argc) trace = argv[++i];
        else if (!strcmp(argv[i], "--svg") && i + 1 < argc) svg = argv[++i];
        else {
            fprintf(stderr, "dpshim-diag: report DIR [--trace OUT.json] [--svg OUT.svg]: bad argument %s\n", argv[i]);
            return 2;
        }
    }
    return dps_diag_report(argv[2], trace, svg);
}

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "env")) return cmd_env();
    if (argc >= 2 && !strcmp(argv[1], "bench")) return cmd_bench(argv);
    if (argc >= 3 && !strcmp(argv[1], "report")) return cmd_report(argc, argv);
    if (argc >= 2 && !strcmp(argv[1], "config")) return cmd_config();
    if (argc == 3 && !strcmp(argv[1], "check")) return cmd_check(argv[2]);
    if (argc >= 2 && !strcmp(argv[1], "keys")) return cmd_keys();
    if (argc >= 2 && !strcmp(argv[1], "model")) return dps_diag_model(argc - 2, argv + 2);
    int help = argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help"));
    if (argc == 2 && !strcmp(argv[1], "--version")) {
        printf("dpshim-diag %s (dpshim %s, hook ABI version %d)\n", DPS_VERSION, DPS_VERSION, DPSHIM_HOOK_ABI_VERSION);
        return 0;
    }
    /* asked for: on stdout, success; after a wrong command line: on stderr, exit 2 */
    fprintf(help ? stdout : stderr,
            "usage: dpshim-diag config | check FILE | keys | env | bench [--init program|program-mt|shim|python] [SET] | report DIR [--trace OUT.json] [--svg OUT.svg]\n"
            "       | model DIR (--bench BENCH.txt | --alpha-us A --bw-gbs B) [options] | --help | --version\n");
    return help ? 0 : 2;
}
