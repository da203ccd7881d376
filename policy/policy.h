/* dpshim policy: the key table, an INI parser with file:line errors, and DPSHIM_* overrides.
 * Pure C with no interposition, so the shim, dpshim-diag and the unit tests share it. */
#ifndef DPS_POLICY_H
#define DPS_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "hookdecl.h"

typedef enum { DPS_KEY_ENUM, DPS_KEY_UINT, DPS_KEY_STR, DPS_KEY_GLOBS } dps_key_type_t;

typedef enum {
#define DPS_KEY(sec, key, type, def, allowed, doc) DPS_P_##sec##_##key,
#include "policy_keys.def"
#undef DPS_KEY
    DPS_NKEYS
} dps_key_id_t;

typedef struct dps_key_info {
    const char *section;
    const char *key;
    dps_key_type_t type;
    const char *def;
    const char *allowed; /* ENUM: "a|b|c"; UINT: "min..max"; else "" */
    const char *doc;
} dps_key_info_t;

extern const dps_key_info_t dps_keys[DPS_NKEYS];

typedef enum { DPS_SRC_DEFAULT, DPS_SRC_FILE, DPS_SRC_ENV } dps_source_t;

typedef struct dps_setting {
    char *text;   /* canonical value text (owned) */
    uint64_t num; /* ENUM: index into allowed; UINT: the number */
    dps_source_t src;
    int line; /* DPS_SRC_FILE: line number */
} dps_setting_t;

typedef struct dps_policy {
    dps_setting_t set[DPS_NKEYS];
    char file[1024]; /* policy file in effect, "" when none */
    dps_hookdecl_t *hooks; /* [hook NAME] sections, in file order (owned) */
    int nhooks;
} dps_policy_t;

typedef struct dps_error {
    char msg[1024];
} dps_error_t;

/* Environment variables that are dpshim's own but not policy keys. */
#define DPS_ENV_POLICY "DPSHIM_POLICY"

/* All return 0 on success, -1 with e->msg filled on error. */
void dps_policy_init(dps_policy_t *p); /* built-in defaults */
void dps_policy_free(dps_policy_t *p);
int dps_policy_parse(dps_policy_t *p, const char *text, size_t len, const char *fname,
                     dps_error_t *e);
int dps_policy_load_file(dps_policy_t *p, const char *path, dps_error_t *e);
/* Validate and store one value; e->msg has no location, callers prefix it. */
int dps_policy_set_value(dps_policy_t *p, dps_key_id_t id, const char *v, size_t vlen,
                         dps_source_t src, int line, dps_error_t *e);
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
/* ENUM keys: is the value `v`? */
int dps_policy_is(const dps_policy_t *p, dps_key_id_t id, const char *v);
/* "DPSHIM_COMM_BUCKET_MB" for a key, into buf. */
const char *dps_policy_env_name(dps_key_id_t id, char *buf, size_t len);
/* "file.conf:12", "env DPSHIM_X" or "default", into buf. */
const char *dps_policy_source(const dps_policy_t *p, dps_key_id_t id, char *buf, size_t len);
/* Closest candidate within a small edit distance, or NULL. */
const char *dps_suggest(const char *word, size_t wlen, const char *const *cands, size_t n);

#endif
