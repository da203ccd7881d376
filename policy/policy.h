/* dpshim policy: the key table, an INI parser with file:line errors, and DPSHIM_* overrides.
 * Pure C with no interposition, so the shim, dpshim-diag and the unit tests share it. */
#ifndef DPS_POLICY_H
#define DPS_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "hookdecl.h"

/* Marks code that every process preloading the shim runs once, at start-up: kept together in
 * .text.startup (beside the constructor, where the compiler puts it), so that a short-lived
 * process (a shell command, a compiler) touches a few pages of the library instead of one page
 * per function (docs/performance.md: what the preload costs other programs). */
#define DPS_STARTUP __attribute__((section(".text.startup")))
/* And the variables such code writes or reads in every process (the identity, the policy's
 * switches, the real functions' addresses, the flags every interposer tests): kept together in a
 * section of their own, which the linker puts between .data and .bss, on the page the loader
 * writes anyway (where the file's data ends and .bss begins). Scattered through .data and .bss,
 * each was a page fault of its own: a copy of a file page, or a zeroed page, 5-10 us each on a
 * virtual machine. Writable variables only; zero-initialized ones take room in the file. */
#define DPS_STARTUP_DATA __attribute__((section("dps_startup_data")))

typedef enum { DPS_KEY_ENUM, DPS_KEY_UINT, DPS_KEY_STR, DPS_KEY_GLOBS } dps_key_type_t;

typedef enum {
#define DPS_KEY(sec, key, type, scope, def, allowed, doc) DPS_P_##sec##_##key,
#include "policy_keys.def"
#undef DPS_KEY
    DPS_NKEYS
} dps_key_id_t;

/* The table's value lists, expanded. An ENUM key's list (a, b, c) gives the text "a|b|c" and the
 * typed values dps_<sec>_<key>_t { DPS_V_<sec>_<key>_a, ... }, numbered in list order, which is
 * what dps_policy_num returns. Lists hold up to 8 names. */
#define DPS_LIST_N_(_1, _2, _3, _4, _5, _6, _7, _8, n, ...) n
#define DPS_LIST_N(...) DPS_LIST_N_(__VA_ARGS__, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define DPS_CAT_(a, b) a##b
#define DPS_CAT(a, b) DPS_CAT_(a, b)
#define DPS_UNPAREN(...) __VA_ARGS__
#define DPS_TEXT_1(a) #a
#define DPS_TEXT_2(a, ...) #a "|" DPS_TEXT_1(__VA_ARGS__)
#define DPS_TEXT_3(a, ...) #a "|" DPS_TEXT_2(__VA_ARGS__)
#define DPS_TEXT_4(a, ...) #a "|" DPS_TEXT_3(__VA_ARGS__)
#define DPS_TEXT_5(a, ...) #a "|" DPS_TEXT_4(__VA_ARGS__)
#define DPS_TEXT_6(a, ...) #a "|" DPS_TEXT_5(__VA_ARGS__)
#define DPS_TEXT_7(a, ...) #a "|" DPS_TEXT_6(__VA_ARGS__)
#define DPS_TEXT_8(a, ...) #a "|" DPS_TEXT_7(__VA_ARGS__)
#define DPS_VALUES_TEXT_(...) DPS_CAT(DPS_TEXT_, DPS_LIST_N(__VA_ARGS__))(__VA_ARGS__)
#define DPS_CONST_1(p, a) p##a,
#define DPS_CONST_2(p, a, ...) p##a, DPS_CONST_1(p, __VA_ARGS__)
#define DPS_CONST_3(p, a, ...) p##a, DPS_CONST_2(p, __VA_ARGS__)
#define DPS_CONST_4(p, a, ...) p##a, DPS_CONST_3(p, __VA_ARGS__)
#define DPS_CONST_5(p, a, ...) p##a, DPS_CONST_4(p, __VA_ARGS__)
#define DPS_CONST_6(p, a, ...) p##a, DPS_CONST_5(p, __VA_ARGS__)
#define DPS_CONST_7(p, a, ...) p##a, DPS_CONST_6(p, __VA_ARGS__)
#define DPS_CONST_8(p, a, ...) p##a, DPS_CONST_7(p, __VA_ARGS__)
#define DPS_CONSTS_(p, ...) DPS_CAT(DPS_CONST_, DPS_LIST_N(__VA_ARGS__))(p, __VA_ARGS__)
/* allowed text per key type */
#define DPS_ALLOWED_ENUM(list) DPS_VALUES_TEXT_(DPS_UNPAREN list)
#define DPS_ALLOWED_UINT(range) range
#define DPS_ALLOWED_STR(none) none
#define DPS_ALLOWED_GLOBS(none) none
/* default text and number per key type: an ENUM default is one of its names */
#define DPS_DEFAULT_TEXT_ENUM(name) #name
#define DPS_DEFAULT_TEXT_UINT(text) text
#define DPS_DEFAULT_TEXT_STR(text) text
#define DPS_DEFAULT_TEXT_GLOBS(text) text
#define DPS_DEFAULT_NUM_ENUM(sec, key, name) DPS_V_##sec##_##key##_##name
#define DPS_DEFAULT_NUM_UINT(sec, key, text) 0 /* read from the text at start-up */
#define DPS_DEFAULT_NUM_STR(sec, key, text) 0
#define DPS_DEFAULT_NUM_GLOBS(sec, key, text) 0
/* typed values per key type: only ENUM keys have them */
#define DPS_TYPED_ENUM(sec, key, list)                                                                       \
    typedef enum {                                                                                           \
        DPS_CONSTS_(DPS_V_##sec##_##key##_, DPS_UNPAREN list) DPS_V_##sec##_##key##__N                       \
    } dps_##sec##_##key##_t;
#define DPS_TYPED_UINT(sec, key, range)
#define DPS_TYPED_STR(sec, key, none)
#define DPS_TYPED_GLOBS(sec, key, none)
#define DPS_KEY(sec, key, type, scope, def, allowed, doc) DPS_TYPED_##type(sec, key, allowed)
#include "policy_keys.def"
#undef DPS_KEY

typedef struct dps_key_info {
    const char *section;
    const char *key;
    dps_key_type_t type;
    const char *def;
    uint64_t def_num;    /* ENUM: the default's index */
    const char *allowed; /* ENUM: "a|b|c"; UINT: "min..max"; else "" */
    const char *doc;
    int job; /* scope JOB: must be the same on every rank of a job */
} dps_key_info_t;
#define DPS_SCOPE_JOB 1
#define DPS_SCOPE_RANK 0

extern const dps_key_info_t dps_keys[DPS_NKEYS];

typedef enum { DPS_SRC_DEFAULT, DPS_SRC_FILE, DPS_SRC_ENV } dps_source_t;

typedef struct dps_setting {
    char *text;   /* canonical value text: owned, or the table's default (DPS_SRC_DEFAULT) */
    uint64_t num; /* ENUM: index into allowed; UINT: the number */
    dps_source_t src;
    int line; /* DPS_SRC_FILE: line number */
} dps_setting_t;

typedef struct dps_policy {
    dps_setting_t set[DPS_NKEYS];
    char file[1024];       /* policy file in effect, "" when none */
    dps_hookdecl_t *hooks; /* [hook NAME] sections, in file order (owned) */
    int nhooks;
} dps_policy_t;

typedef struct dps_error {
    char msg[1024];
} dps_error_t;

/* Environment variables that are dpshim's own but not policy keys: name, who sets it, what it
 * does. Accepted where the policy refuses every other DPSHIM_ name; `dpshim-diag keys` lists
 * them after the keys, and docs/policy.md's table is that list. */
#define DPS_ENV_POLICY "DPSHIM_POLICY"
/* set by dpshim-run under the launcher's recovery mode: where each rank leaves its exit status */
#define DPS_ENV_STATUS_DIR "DPSHIM_STATUS_DIR"
#define DPS_OTHER_ENV(X)                                                                                     \
    X(DPS_ENV_POLICY, "you",                                                                                 \
      "the policy file (else ./dpshim.conf in the directory the program starts in, "                         \
      "else the built-in defaults)")                                                                         \
    X("DPSHIM_CUDART_LIB", "you",                                                                            \
      "the CUDA runtime the GPU plugin opens (else the program's own, else the "                             \
      "library path's)")                                                                                     \
    X("DPSHIM_NCCL_LIB", "you",                                                                              \
      "the NCCL the GPU plugin opens where the program has none loaded (a program's own "                    \
      "NCCL is kept, with a warning, as two copies in one process fail), else the "                          \
      "library path's")                                                                                      \
    X("DPSHIM_LIB", "you",                                                                                   \
      "the libdpshim.so that dpshim-diag env asks (else the one its install or build "                       \
      "tree has)")                                                                                           \
    X("DPSHIM_PLUGIN_DIR", "you",                                                                            \
      "where the plugins (libdpshim-mpi.so, libdpshim-nccl.so) and the Python "                              \
      "adapter are (else dpshim/ beside libdpshim.so)")                                                      \
    X("DPSHIM_RANK_PID", "dpshim",                                                                           \
      "the rank process and the descriptor of its claim on the rank's place (its children inherit it)")      \
    X("DPSHIM_PYTHONPATH", "dpshim", "the user's PYTHONPATH, which the Python adapter puts back")            \
    X("DPSHIM_HASHSEED", "dpshim",                                                                           \
      "PYTHONHASHSEED was dpshim's choice for the job (the adapter takes both "                              \
      "out of the script's environment)")                                                                    \
    X(DPS_ENV_STATUS_DIR, "dpshim-run",                                                                      \
      "the folder where each rank process leaves its exit status (rank.N), the lowest survivor the ranks "   \
      "lost (lost.N), and a rank the guard ended with the others a mark (end.N), which dpshim-run reads "    \
      "under the launcher's recovery mode")

typedef struct dps_env_var {
    const char *name, *set_by, *doc;
} dps_env_var_t;
extern const dps_env_var_t dps_other_env[];
extern const size_t dps_n_other_env;

/* All return 0 on success, -1 with e->msg filled on error. */
void dps_policy_init(dps_policy_t *p); /* built-in defaults */
void dps_policy_free(dps_policy_t *p);
int dps_policy_parse(dps_policy_t *p, const char *text, size_t len, const char *fname, dps_error_t *e);
int dps_policy_load_file(dps_policy_t *p, const char *path, dps_error_t *e);
/* Validate and store one value; e->msg has no location, callers prefix it. */
int dps_policy_set_value(dps_policy_t *p, dps_key_id_t id, const char *v, size_t vlen, dps_source_t src,
                         int line, dps_error_t *e);
int dps_policy_apply_env(dps_policy_t *p, char *const *envp, dps_error_t *e);
/* Locate (DPSHIM_POLICY, else ./dpshim.conf, else none), parse, apply env overrides. */
int dps_policy_load(dps_policy_t *p, char *const *envp, dps_error_t *e);

static inline uint64_t dps_policy_num(const dps_policy_t *p, dps_key_id_t id)
{
    return p->set[id].num;
}
static inline const char *dps_policy_text(const dps_policy_t *p, dps_key_id_t id)
{
    return p->set[id].text;
}
/* An ENUM key's value, typed: DPS_POLICY_ENUM(p, comm, backend) == DPS_V_comm_backend_nccl. */
#define DPS_POLICY_ENUM(p, sec, key) ((dps_##sec##_##key##_t)dps_policy_num((p), DPS_P_##sec##_##key))
/* "DPSHIM_COMM_BUCKET_MB" for a key, into buf. */
const char *dps_policy_env_name(dps_key_id_t id, char *buf, size_t len);
/* "file.conf:12", "env DPSHIM_X" or "default", into buf. */
const char *dps_policy_source(const dps_policy_t *p, dps_key_id_t id, char *buf, size_t len);
/* A value the key table names but this version does not do: 0, or -1 with why in err (the shim
 * refuses to start with it, and dpshim-diag check says so). */
int dps_policy_unavailable(const dps_policy_t *p, char *err, size_t errlen);
/* A [hook] on a function of the C library or the dynamic loader: 0, or -1 with why in err (a rank
 * refuses it before binding any hook, and dpshim-diag check says so). */
int dps_policy_hooks_refused(const dps_policy_t *p, char *err, size_t errlen);
/* The id of key `key` of section `sec` (lengths given), or -1. */
int dps_policy_find_key(const char *sec, size_t slen, const char *key, size_t klen);
/* Closest candidate within a small edit distance, or NULL. */
const char *dps_suggest(const char *word, size_t wlen, const char *const *cands, size_t n);

#endif
