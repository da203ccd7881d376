/* The ground floor of libdpshim: the process-wide state (identity, policy, engine settings),
 * logging, the re-entry guard and small helpers. Every other part may use core; core uses
 * nothing of the shim above it (CONTRIBUTING.md: How it works, layers). Everything here has hidden
 * visibility; only the hook ABI and the interposers are exported. */
#ifndef DPS_CORE_H
#define DPS_CORE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "policy.h"

#define DPS_EXPORT __attribute__((visibility("default")))
#define DPS_LIKELY(x) __builtin_expect(!!(x), 1)
#define DPS_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* Exit status for bad configuration, before main() runs (sysexits' EX_CONFIG). */
#define DPS_EXIT_CONFIG 78
/* Exit status when the shim ends a job it cannot run correctly. */
#define DPS_EXIT_FATAL 70
#define DPS_EXIT_IO 74 /* sysexits' EX_IOERR: rank 0 left a gated file short */

/* The log levels are [diag] log's values; DPS_LOG compares them with <=, quietest first. */
typedef dps_diag_log_t dps_log_level_t;
#define DPS_LOG_ERROR DPS_V_diag_log_error
#define DPS_LOG_WARN DPS_V_diag_log_warn
#define DPS_LOG_INFO DPS_V_diag_log_info
#define DPS_LOG_DEBUG DPS_V_diag_log_debug
_Static_assert(DPS_LOG_ERROR < DPS_LOG_WARN && DPS_LOG_WARN < DPS_LOG_INFO && DPS_LOG_INFO < DPS_LOG_DEBUG,
               "[diag] log must list its levels from the quietest");

typedef enum {
    DPS_ROLE_RANK,  /* the process that owns this rank's collectives */
    DPS_ROLE_CHILD, /* exec'd or forked from it: file policy applies, collectives never */
} dps_role_t;

typedef struct dps_state {
    /* identity, from bootstrap */
    int rank, size, local_rank, local_size;
    const char *launcher;          /* "pmix", "openmpi", "pmi", "slurm", "torchrun", "singleton" */
    const char *local_source;      /* where the local size came from: a variable's name, "PMIx", ... */
    int local_size_guessed;        /* no launcher said it: 1 taken */
    const char *local_rank_source; /* and the local rank */
    dps_role_t role;
    int exec_in_place; /* this rank process replaced an earlier image of itself with exec */
    atomic_int forked; /* set in a fork child before it runs any user code */

    dps_policy_t policy;

    /* engine configuration, read once from the policy */
    int eff_rank, eff_size; /* what collectives and sharding use; 0/1 for backend = self */
    int split_mode, reduce_sum, bn_sync;
    int uneven; /* index into [data] uneven: pad, drop, join */
    size_t bucket_bytes;
    int overlap;            /* [comm] overlap = on */
    int32_t compress_dtype; /* DP_F16 or DP_BF16 for [comm] compress, else -1 */
    int python_adapter;     /* a Python rank process, the PyTorch adapter put on its path */
} dps_state_t;

extern dps_state_t dps_g;
extern atomic_int dps_log_level;

void dps_log(dps_log_level_t lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Logs and exits the whole process now; used when going on would give wrong results silently. */
_Noreturn void dps_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* What must happen before a rank ends the job with _exit (dps_fatal, the guard): the GPU
 * plugin aborts its communicators there, within a time limit. Set once; NULL: nothing. */
extern void (*volatile dps_before_fatal_exit)(void);
void dps_run_before_fatal_exit(void);
/* exit_status.c: the rank's exit status, left as $DPSHIM_STATUS_DIR/rank.N where dpshim-run set
 * that folder (its recovery mode); a no-op elsewhere. dps_exit_now also flushes the program's
 * streams and ends the process with _exit: the shim's own non-zero exits go through it. */
void dps_exit_status_note(int status);
/* Rank r was lost and the job went on without it (elastic mode): lost.N beside the statuses. */
void dps_exit_status_lost(int rank);
/* This rank ends with the others as their reports decided (the guard): end.N beside the statuses,
 * so that dpshim-run ends a launcher that still waits for a rank that cannot end itself (stopped,
 * or on a node cut off), which recovery mode would otherwise wait for. */
void dps_exit_status_ends_job(void);
_Noreturn void dps_exit_now(int status);
/* Whether the launcher keeps the other ranks running after one is lost: Open MPI's mpirun
 * --enable-recovery (4.x) tells every rank so. */
int dps_launcher_keeps_survivors(void);
/* Where the job may go on after a loss: size, policy and launcher, alike on every rank. */
int dps_job_may_go_on(const dps_state_t *s);

#define DPS_LOG(lvl, ...)                                                                                    \
    do {                                                                                                     \
        if (DPS_UNLIKELY((lvl) <= atomic_load_explicit(&dps_log_level, memory_order_relaxed)))               \
            dps_log((lvl), __VA_ARGS__);                                                                     \
    } while (0)
#define DPS_ERROR(...) DPS_LOG(DPS_LOG_ERROR, __VA_ARGS__)
#define DPS_WARN(...) DPS_LOG(DPS_LOG_WARN, __VA_ARGS__)
#define DPS_INFO(...) DPS_LOG(DPS_LOG_INFO, __VA_ARGS__)
#define DPS_DEBUG(...) DPS_LOG(DPS_LOG_DEBUG, __VA_ARGS__)
/* What the user should know of the job although nothing is wrong (the exit summary, dpshim
 * stepping aside): shown from [diag] log = warn on, under its own label instead of a level's. */
void dps_note(const char *label, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define DPS_NOTE(label, ...)                                                                                 \
    do {                                                                                                     \
        if (DPS_LOG_WARN <= atomic_load_explicit(&dps_log_level, memory_order_relaxed))                      \
            dps_note((label), __VA_ARGS__);                                                                  \
    } while (0)
/* A warning printed at most once per call site: repeated warnings are noise, not news. */
#define DPS_WARN_ONCE(...)                                                                                   \
    do {                                                                                                     \
        static atomic_int dps_once_;                                                                         \
        if (!atomic_exchange_explicit(&dps_once_, 1, memory_order_relaxed)) DPS_WARN(__VA_ARGS__);           \
    } while (0)

/* Per thread: inside the shim's own work. The interposers pass such calls straight to the real
 * function, so the shim never applies its own file policy to itself (state.c). */
extern __thread int dps_in_shim __attribute__((tls_model("initial-exec")));

/* Where the plugins and the adapters are: $DPSHIM_PLUGIN_DIR, else dpshim/ beside libdpshim.so
 * (an install's ${libdir}/dpshim; the build tree has the same layout). 0, or -1 when unknown. */
int dps_plugin_dir(char *out, size_t len);

/* elf.c: symbols of the loaded objects, read from their own hash tables, as dlsym finds them
 * (global or weak definitions, default versions). Not with dlsym, which every process under the
 * preload would pay for: one that fails allocates its message (in a program that never calls
 * malloc, malloc's first use: system calls and page faults) and leaves it for the program's
 * first dlerror(), which then prints the shim's miss as the program's own; one that succeeds
 * frees the message of the program's last failed dl call. And one walk of the objects answers
 * many names, where dlsym takes ld.so's lock and searches every object for each.
 * dps_elf_defines: 1 when an object defines name (dlsym(RTLD_DEFAULT) would find it).
 * dps_elf_next: each syms[i].addr, the definition in the objects after libdpshim.so
 * (dlsym(RTLD_NEXT) from the shim), NULL where none has it; an indirect function (IFUNC) is
 * asked of dlsym, which finds it. */
typedef struct dps_elf_sym {
    const char *name;
    void *addr;
} dps_elf_sym_t;
int dps_elf_defines(const char *name);
void dps_elf_next(dps_elf_sym_t *syms, size_t n); /* n <= 64 */

/* claim.c: which process of a rank's tree talks to the other ranks (the rank's place).
 * dps_claim_setup: the rank process (fd -1, or its claim file's descriptor after an exec in
 * place) makes the claim file, a child notes the one named by fd (mapped when first asked);
 * returns the descriptor to export, or -1. dps_claim_rank: 1 where this process holds the place or now takes it (a child
 * then becomes the rank process and runs dps_on_rank_claimed, which exports its marker), 0 where another process holds it.
 * dps_rank_owner: the holder's pid, 0 while nobody holds it or without a claim file. */
int dps_claim_setup(int role, int fd);
int dps_claim_rank(void);
int dps_rank_owner(void);
int dps_rank_place_free(void);
extern void (*volatile dps_on_rank_claimed)(void);

/* bootstrap.c: who this process is in the job. The rank process exports it to its children in
 * DPS_ENV_RANK_PID, the marker (bootstrap.c). */
#define DPS_ENV_RANK_PID "DPSHIM_RANK_PID"
void dps_bootstrap_export_marker(void);
int dps_bootstrap(dps_state_t *s, char *err, size_t errlen);
void dps_bootstrap_finalize(void);
int dps_bootstrap_pmix_up(void); /* this process initialized PMIx (and finalizes it at exit) */

/* FNV-1a over n bytes, continuing from h (DPS_FNV_SEED to start): checksums every rank computes
 * alike (collective fingerprints, the start-up agreement's items). */
#define DPS_FNV_SEED 0xcbf29ce484222325ull
static inline uint64_t dps_fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* Makes the array *p (capacity *cap items of elem bytes) hold at least need items, doubling
 * from 64. 0, or -1 with the array untouched when memory runs out. */
static inline int dps_grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap * 2 : 64;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return -1;
    *p = q, *cap = c;
    return 0;
}

#endif
