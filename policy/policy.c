/* Policy parsing and validation. Runs once per process, before main(), so it may allocate;
 * it never prints: errors go back in dps_error_t for the caller to report. */
#define _GNU_SOURCE
#include "policy.h"

#include "glob.h"
#include "sys.h" /* shim/core/sys.h */

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const dps_key_info_t dps_keys[DPS_NKEYS] = {
#define DPS_KEY(sec, key, type, scope, def, allowed, doc)                                                    \
    {#sec,                                                                                                   \
     #key,                                                                                                   \
     DPS_KEY_##type,                                                                                         \
     DPS_DEFAULT_TEXT_##type(def),                                                                           \
     DPS_DEFAULT_NUM_##type(sec, key, def),                                                                  \
     DPS_ALLOWED_##type(allowed),                                                                            \
     doc,                                                                                                    \
     DPS_SCOPE_##scope},
#include "policy_keys.def"
#undef DPS_KEY
};

#define DPS_MAX_FILE_BYTES (1u << 20)

static int fail(dps_error_t *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(dps_error_t *e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

/* User text echoed in a message: printable ASCII as is, anything else as \xNN, long text cut,
 * so a binary or hostile file gives a readable one-line error. */
typedef struct shown {
    char s[112];
} shown_t;

static const char *show(shown_t *out, const char *s, size_t n)
{
    size_t o = 0;
    for (size_t i = 0; i < n && o + 8 < sizeof out->s; i++) {
        unsigned char c = (unsigned char)s[i];
        if (i == 48) {
            memcpy(out->s + o, "...", 3), o += 3;
            break;
        }
        if (c >= 0x20 && c < 0x7f)
            out->s[o++] = (char)c;
        else
            o += (size_t)snprintf(out->s + o, sizeof out->s - o, "\\x%02x", c);
    }
    out->s[o] = '\0';
    return out->s;
}

/* Levenshtein distance, bounded to short words (names are short; longer input is no near-miss). */
static size_t edit_distance(const char *a, size_t la, const char *b)
{
    size_t lb = strlen(b), row[64];
    if (la >= 63 || lb >= 63) return (size_t)-1;
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t sub = diag + (tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]));
            size_t best = sub < up + 1 ? sub : up + 1;
            row[j] = best < row[j - 1] + 1 ? best : row[j - 1] + 1;
            diag = up;
        }
    }
    return row[lb];
}

const char *dps_suggest(const char *word, size_t wlen, const char *const *cands, size_t n)
{
    const char *best = NULL;
    size_t best_d = (size_t)-1;
    size_t limit = wlen <= 4 ? 1 : (wlen <= 8 ? 2 : 3);
    for (size_t i = 0; i < n; i++) {
        size_t d = edit_distance(word, wlen, cands[i]);
        if (d < best_d) best_d = d, best = cands[i];
    }
    return best_d <= limit ? best : NULL;
}

/* " (did you mean 'x'?)" or "" */
static const char *hint(char *buf, size_t len, const char *s)
{
    if (!s) return "";
    snprintf(buf, len, "; did you mean '%s'?", s);
    return buf;
}

/* A UINT key's default: digits only, valid by construction (the unit tests check it). Read
 * here rather than with strtoull, whose code and locale tables are pages of libc that a short
 * process under the preload would otherwise touch for this alone. */
DPS_STARTUP static uint64_t default_number(const char *s)
{
    uint64_t x = 0;
    for (; *s >= '0' && *s <= '9'; s++)
        x = x * 10 + (uint64_t)(*s - '0');
    return x;
}

/* Every process that preloads the shim starts here: the defaults come from the table as they
 * are, without allocating (ENUM indexes from the table, UINT numbers read from their digits). */
DPS_STARTUP void dps_policy_init(dps_policy_t *p)
{
    memset(p, 0, sizeof *p);
    for (int i = 0; i < DPS_NKEYS; i++) {
        const dps_key_info_t *k = &dps_keys[i];
        uint64_t num = k->type == DPS_KEY_UINT ? default_number(k->def) : k->def_num;
        p->set[i] = (dps_setting_t){(char *)k->def, num, DPS_SRC_DEFAULT, 0};
    }
}

/* A setting's text, unless it is the table's default, which nobody owns. */
static void free_text(dps_policy_t *p, int id)
{
    if (p->set[id].text != dps_keys[id].def) free(p->set[id].text);
    p->set[id].text = NULL;
}

void dps_policy_free(dps_policy_t *p)
{
    for (int i = 0; i < DPS_NKEYS; i++)
        free_text(p, i);
    free(p->hooks);
    p->hooks = NULL, p->nhooks = 0;
}

/* Validates v for key id; on success stores it. Error text has no location: callers prefix it. */
int dps_policy_set_value(dps_policy_t *p, dps_key_id_t id, const char *v, size_t vlen, dps_source_t src,
                         int line, dps_error_t *e)
{
    const dps_key_info_t *k = &dps_keys[id];
    uint64_t num = 0;
    char h[96];
    if (memchr(v, '\0', vlen)) return fail(e, "value contains a NUL byte");
    switch (k->type) {
    case DPS_KEY_ENUM: {
        const char *cands[16];
        size_t nc = 0, found = (size_t)-1;
        char allowed[256];
        snprintf(allowed, sizeof allowed, "%s", k->allowed);
        for (char *save = NULL, *tok = strtok_r(allowed, "|", &save); tok && nc < 16;
             tok = strtok_r(NULL, "|", &save)) {
            if (strlen(tok) == vlen && memcmp(tok, v, vlen) == 0) found = nc;
            cands[nc++] = k->allowed + (tok - allowed);
        }
        if (found == (size_t)-1) {
            /* cands point into k->allowed, '|'-terminated: copy out the suggestion */
            char names[16][32];
            const char *namep[16];
            for (size_t i = 0; i < nc; i++) {
                size_t l = strcspn(cands[i], "|");
                snprintf(names[i], sizeof names[i], "%.*s", (int)l, cands[i]);
                namep[i] = names[i];
            }
            if (vlen == 0) return fail(e, "empty value; expected one of %s", k->allowed);
            shown_t sv;
            return fail(e, "bad value '%s'; expected one of %s%s", show(&sv, v, vlen), k->allowed,
                        hint(h, sizeof h, dps_suggest(v, vlen, namep, nc)));
        }
        num = found;
        break;
    }
    case DPS_KEY_UINT: {
        unsigned long long lo = 0, hi = 0;
        char buf[32];
        sscanf(k->allowed, "%llu..%llu", &lo, &hi);
        if (vlen == 0) return fail(e, "empty value; expected an integer in %s", k->allowed);
        if (vlen >= sizeof buf) return fail(e, "value too long; expected an integer in %s", k->allowed);
        memcpy(buf, v, vlen);
        buf[vlen] = '\0';
        for (size_t i = 0; i < vlen; i++)
            if (!isdigit((unsigned char)buf[i])) {
                shown_t sv;
                return fail(e, "bad value '%s'; expected an integer in %s", show(&sv, v, vlen), k->allowed);
            }
        errno = 0;
        unsigned long long x = strtoull(buf, NULL, 10);
        if (errno == ERANGE || x < lo || x > hi)
            return fail(e, "value %s out of range; expected an integer in %s", buf, k->allowed);
        num = x;
        break;
    }
    case DPS_KEY_GLOBS:
        for (size_t i = 0; i < vlen;) {
            while (i < vlen && isspace((unsigned char)v[i]))
                i++;
            size_t j = i;
            while (j < vlen && !isspace((unsigned char)v[j]))
                j++;
            const char *why = j > i ? dps_glob_check(v + i, j - i) : NULL;
            if (j - i == 2 && (v[i] == '"' || v[i] == '\'') && v[i + 1] == v[i])
                why = "empty glob; leave the value empty for none";
            else if (j > i && (memchr(v + i, '"', j - i) || memchr(v + i, '\'', j - i)))
                why = "quotes are taken literally; write globs without them";
            shown_t sv;
            if (why) return fail(e, "%s: '%s'", why, show(&sv, v + i, j - i));
            i = j;
        }
        break;
    case DPS_KEY_STR:
        break;
    }
    char *text = strndup(v, vlen);
    if (!text) return fail(e, "out of memory");
    free_text(p, id);
    p->set[id] = (dps_setting_t){text, num, src, line};
    return 0;
}

int dps_policy_find_key(const char *sec, size_t slen, const char *key, size_t klen)
{
    for (int i = 0; i < DPS_NKEYS; i++)
        if (strlen(dps_keys[i].section) == slen && memcmp(dps_keys[i].section, sec, slen) == 0 &&
            strlen(dps_keys[i].key) == klen && memcmp(dps_keys[i].key, key, klen) == 0)
            return i;
    return -1;
}

static int section_known(const char *sec, size_t slen)
{
    for (int i = 0; i < DPS_NKEYS; i++)
        if (strlen(dps_keys[i].section) == slen && memcmp(dps_keys[i].section, sec, slen) == 0) return 1;
    return 0;
}

static const char *suggest_section(const char *sec, size_t slen)
{
    const char *names[DPS_NKEYS];
    size_t n = 0;
    for (int i = 0; i < DPS_NKEYS; i++)
        if (n == 0 || strcmp(names[n - 1], dps_keys[i].section) != 0) names[n++] = dps_keys[i].section;
    return dps_suggest(sec, slen, names, n);
}

static const char *suggest_key(const char *sec, size_t slen, const char *key, size_t klen)
{
    const char *names[DPS_NKEYS];
    size_t n = 0;
    for (int i = 0; i < DPS_NKEYS; i++)
        if (strlen(dps_keys[i].section) == slen && memcmp(dps_keys[i].section, sec, slen) == 0)
            names[n++] = dps_keys[i].key;
    return dps_suggest(key, klen, names, n);
}

static void trim(const char **s, const char **end)
{
    while (*s < *end && isspace((unsigned char)**s))
        (*s)++;
    while (*end > *s && isspace((unsigned char)(*end)[-1]))
        (*end)--;
}

struct hook_section;
static int policy_parse(dps_policy_t *p, struct hook_section *hs, const char *text, size_t len,
                        const char *fname, dps_error_t *e);

/* --- [hook NAME] sections: keys collected as text, checked when the section ends --- */

static const char *const hook_keys[] = {"symbol", "library", "signature", "before", "after", "missing"};
enum { HOOK_NKEYS = sizeof hook_keys / sizeof *hook_keys };

typedef struct hook_section {
    int open, line;
    char name[64];
    char *val[HOOK_NKEYS];
    int key_line[HOOK_NKEYS];
} hook_section_t;

static void hook_section_clear(hook_section_t *hs)
{
    for (int i = 0; i < HOOK_NKEYS; i++)
        free(hs->val[i]);
    memset(hs, 0, sizeof *hs);
}

static int hook_section_end(dps_policy_t *p, hook_section_t *hs, const char *fname, dps_error_t *e)
{
    if (!hs->open) return 0;
    dps_hookdecl_t h;
    memset(&h, 0, sizeof h);
    snprintf(h.name, sizeof h.name, "%s", hs->name);
    h.line = hs->line;
    char why[768];
    if (dps_hookdecl_build(&h, hs->val[0], hs->val[1], hs->val[2], hs->val[3], hs->val[4], hs->val[5], why,
                           sizeof why) != 0) {
        int line = hs->line; /* the message starts with the key at fault: point at its line */
        for (int i = 0; i < HOOK_NKEYS; i++)
            if (!strncmp(why, hook_keys[i], strlen(hook_keys[i])) && why[strlen(hook_keys[i])] == ':' &&
                hs->key_line[i])
                line = hs->key_line[i];
        int rc = fail(e, "%s:%d: [hook %s] %s", fname, line, hs->name, why);
        hook_section_clear(hs);
        return rc;
    }
    for (int i = 0; i < p->nhooks; i++)
        if (!strcmp(p->hooks[i].symbol, h.symbol)) {
            int rc = fail(e,
                          "%s:%d: [hook %s] duplicates [hook %s] (line %d): both declare %s; one section per "
                          "function",
                          fname, hs->line, hs->name, p->hooks[i].name, p->hooks[i].line, h.symbol);
            hook_section_clear(hs);
            return rc;
        }
    dps_hookdecl_t *grown = realloc(p->hooks, (size_t)(p->nhooks + 1) * sizeof *grown);
    if (!grown) {
        hook_section_clear(hs);
        return fail(e, "%s: out of memory", fname);
    }
    p->hooks = grown;
    p->hooks[p->nhooks++] = h;
    hook_section_clear(hs);
    return 0;
}

static int hook_section_begin(dps_policy_t *p, hook_section_t *hs, const char *name, size_t n,
                              const char *fname, int lineno, dps_error_t *e)
{
    shown_t sv;
    while (n && isspace((unsigned char)*name))
        name++, n--;
    if (!n) return fail(e, "%s:%d: [hook] needs a name: [hook NAME]", fname, lineno);
    if (n >= sizeof hs->name)
        return fail(e, "%s:%d: [hook %s]: name longer than %zu characters", fname, lineno, show(&sv, name, n),
                    sizeof hs->name - 1);
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)name[i]) && name[i] != '_' && name[i] != '-' && name[i] != '.')
            return fail(e, "%s:%d: [hook %s]: a name is letters, digits, '_', '-' and '.'", fname, lineno,
                        show(&sv, name, n));
    for (int i = 0; i < p->nhooks; i++)
        if (strlen(p->hooks[i].name) == n && !memcmp(p->hooks[i].name, name, n))
            return fail(e, "%s:%d: duplicate section [hook %s] (first on line %d)", fname, lineno,
                        p->hooks[i].name, p->hooks[i].line);
    hs->open = 1, hs->line = lineno;
    memcpy(hs->name, name, n);
    hs->name[n] = '\0';
    return 0;
}

static int hook_section_key(hook_section_t *hs, const char *k, size_t kn, const char *v, size_t vn,
                            const char *fname, int lineno, dps_error_t *e)
{
    shown_t sv;
    char h[96];
    for (int i = 0; i < HOOK_NKEYS; i++)
        if (strlen(hook_keys[i]) == kn && !memcmp(hook_keys[i], k, kn)) {
            if (hs->key_line[i])
                return fail(e, "%s:%d: duplicate key '%s' in [hook %s] (first set on line %d)", fname, lineno,
                            hook_keys[i], hs->name, hs->key_line[i]);
            if (!(hs->val[i] = strndup(v, vn))) return fail(e, "%s: out of memory", fname);
            hs->key_line[i] = lineno;
            return 0;
        }
    return fail(
        e,
        "%s:%d: unknown key '%s' in [hook %s]%s (keys: symbol, library, signature, before, after, missing)",
        fname, lineno, show(&sv, k, kn), hs->name,
        hint(h, sizeof h, dps_suggest(k, kn, hook_keys, HOOK_NKEYS)));
}

int dps_policy_parse(dps_policy_t *p, const char *text, size_t len, const char *fname, dps_error_t *e)
{
    hook_section_t hs;
    memset(&hs, 0, sizeof hs);
    int rc = policy_parse(p, &hs, text, len, fname, e);
    if (rc == 0) rc = hook_section_end(p, &hs, fname, e);
    hook_section_clear(&hs);
    return rc;
}

static int policy_parse(dps_policy_t *p, hook_section_t *hs, const char *text, size_t len, const char *fname,
                        dps_error_t *e)
{
    const char *sec = NULL;
    size_t slen = 0;
    int seen_line[DPS_NKEYS] = {0};
    char h[96];
    shown_t sv;
    int lineno = 0;
    if (len >= 3 && memcmp(text, "\xef\xbb\xbf", 3) == 0) text += 3, len -= 3; /* editors' BOM */
    for (const char *line = text, *stop = text + len; line < stop;) {
        const char *nl = memchr(line, '\n', (size_t)(stop - line));
        const char *end = nl ? nl : stop, *s = line;
        line = nl ? nl + 1 : stop;
        lineno++;
        /* a comment starts a line or follows whitespace, so '#' inside a value stays */
        for (const char *c = s; c < end; c++)
            if ((*c == '#' || *c == ';') && (c == s || isspace((unsigned char)c[-1]))) {
                end = c;
                break;
            }
        trim(&s, &end);
        if (s == end) continue;
        if (*s == '[') {
            if (end[-1] != ']') return fail(e, "%s:%d: section header without a closing ']'", fname, lineno);
            const char *ns = s + 1, *ne = end - 1;
            trim(&ns, &ne);
            if (hook_section_end(p, hs, fname, e)) return -1;
            if ((size_t)(ne - ns) >= 4 && !memcmp(ns, "hook", 4) &&
                ((size_t)(ne - ns) == 4 || isspace((unsigned char)ns[4]))) {
                if (hook_section_begin(p, hs, ns + 4, (size_t)(ne - ns) - 4, fname, lineno, e)) return -1;
                sec = NULL, slen = 0;
                continue;
            }
            if (!section_known(ns, (size_t)(ne - ns)))
                return fail(e, "%s:%d: unknown section [%s]%s", fname, lineno,
                            show(&sv, ns, (size_t)(ne - ns)),
                            hint(h, sizeof h, suggest_section(ns, (size_t)(ne - ns))));
            sec = ns, slen = (size_t)(ne - ns);
            continue;
        }
        const char *eq = memchr(s, '=', (size_t)(end - s));
        if (!eq)
            return fail(e, "%s:%d: expected 'key = value', got '%s'", fname, lineno,
                        show(&sv, s, (size_t)(end - s)));
        const char *ks = s, *ke = eq, *vs = eq + 1, *ve = end;
        trim(&ks, &ke);
        trim(&vs, &ve);
        if (hs->open) {
            if (hook_section_key(hs, ks, (size_t)(ke - ks), vs, (size_t)(ve - vs), fname, lineno, e))
                return -1;
            continue;
        }
        if (!sec)
            return fail(e, "%s:%d: key '%s' before any [section]", fname, lineno,
                        show(&sv, ks, (size_t)(ke - ks)));
        int id = dps_policy_find_key(sec, slen, ks, (size_t)(ke - ks));
        if (id < 0)
            return fail(e, "%s:%d: unknown key '%s' in [%.*s]%s", fname, lineno,
                        show(&sv, ks, (size_t)(ke - ks)), (int)slen, sec,
                        hint(h, sizeof h, suggest_key(sec, slen, ks, (size_t)(ke - ks))));
        if (seen_line[id])
            return fail(e, "%s:%d: duplicate key '%s' in [%s] (first set on line %d)", fname, lineno,
                        dps_keys[id].key, dps_keys[id].section, seen_line[id]);
        seen_line[id] = lineno;
        dps_error_t ve_err;
        if (dps_policy_set_value(p, (dps_key_id_t)id, vs, (size_t)(ve - vs), DPS_SRC_FILE, lineno, &ve_err) !=
            0)
            return fail(e, "%s:%d: [%s] %s: %s", fname, lineno, dps_keys[id].section, dps_keys[id].key,
                        ve_err.msg);
    }
    return 0;
}

/* What a path that is not a regular file is, for the message that refuses it. */
static const char *file_kind(mode_t m)
{
    return S_ISDIR(m)    ? "a directory"
           : S_ISFIFO(m) ? "a FIFO"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
           : S_ISSOCK(m) ? "a socket"
                         : "something else";
}

static int not_regular(dps_error_t *e, const char *path, mode_t m)
{
    return fail(e, "policy file %s is not a regular file but %s; a policy is read from a regular file only",
                path, file_kind(m));
}

int dps_policy_load_file(dps_policy_t *p, const char *path, dps_error_t *e)
{
    /* Every rank reads this before main(): opening a FIFO would block them all forever, and
     * opening a device may act on it. So only a regular file is opened, and without blocking in
     * case the path became something else since stat(); fstat() then says what was opened. */
    struct stat st;
    if (dps_sys_stat(path, &st) != 0) return fail(e, "cannot read policy file %s: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) return not_regular(e, path, st.st_mode);
    int fd = dps_sys_open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY, 0);
    if (fd < 0) return fail(e, "cannot read policy file %s: %s", path, strerror(errno));
    int bad = fstat(fd, &st) != 0    ? fail(e, "cannot read policy file %s: %s", path, strerror(errno))
              : !S_ISREG(st.st_mode) ? not_regular(e, path, st.st_mode)
              : st.st_size > DPS_MAX_FILE_BYTES
                  ? fail(e, "policy file %s is larger than %u bytes", path, DPS_MAX_FILE_BYTES)
                  : 0;
    if (bad) {
        dps_sys_close(fd);
        return -1;
    }
    /* a regular file's reads may still say EAGAIN under a mandatory lock: block as usual */
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    char *buf = malloc((size_t)st.st_size + 1);
    size_t got = 0;
    while (buf && got < (size_t)st.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    dps_sys_close(fd);
    if (!buf || got != (size_t)st.st_size) {
        free(buf);
        return fail(e, "cannot read policy file %s", path);
    }
    int rc = dps_policy_parse(p, buf, got, path, e);
    free(buf);
    if (rc == 0) snprintf(p->file, sizeof p->file, "%s", path);
    return rc;
}

const char *dps_policy_env_name(dps_key_id_t id, char *buf, size_t len)
{
    snprintf(buf, len, "DPSHIM_%s_%s", dps_keys[id].section, dps_keys[id].key);
    for (char *c = buf; *c; c++)
        *c = (char)toupper((unsigned char)*c);
    return buf;
}

#define DPS_OTHER_ENV_ROW(name, by, doc) {name, by, doc},
const dps_env_var_t dps_other_env[] = {DPS_OTHER_ENV(DPS_OTHER_ENV_ROW)};
#undef DPS_OTHER_ENV_ROW
const size_t dps_n_other_env = sizeof dps_other_env / sizeof *dps_other_env;

/* 1 when name[0..n) is "DPSHIM_<SECTION>_<KEY>" of key id: compared in place, since every
 * process that preloads the shim reads its environment and most have no such variable. */
DPS_STARTUP static int is_env_name(const char *name, size_t n, int id)
{
    const char *parts[2] = {dps_keys[id].section, dps_keys[id].key};
    size_t at = 7; /* after "DPSHIM_" */
    for (int k = 0; k < 2; k++) {
        if (k && (at >= n || name[at++] != '_')) return 0;
        for (const char *c = parts[k]; *c; c++, at++)
            if (at >= n || name[at] != (*c >= 'a' && *c <= 'z' ? *c - 'a' + 'A' : *c))
                return 0; /* ASCII names: no locale table */
    }
    return at == n;
}

static int unknown_env(const char *name, size_t n, dps_error_t *e)
{
    char names[DPS_NKEYS][64], h[96];
    const char *cands[DPS_NKEYS + sizeof dps_other_env / sizeof *dps_other_env];
    size_t nc = 0;
    for (int i = 0; i < DPS_NKEYS; i++)
        cands[nc++] = dps_policy_env_name((dps_key_id_t)i, names[i], 64);
    for (size_t i = 0; i < dps_n_other_env; i++)
        cands[nc++] = dps_other_env[i].name;
    shown_t sv;
    return fail(e, "unknown environment variable %s%s", show(&sv, name, n),
                hint(h, sizeof h, dps_suggest(name, n, cands, nc)));
}

DPS_STARTUP int dps_policy_apply_env(dps_policy_t *p, char *const *envp, dps_error_t *e)
{
    for (char *const *ep = envp; ep && *ep; ep++) {
        if (strncmp(*ep, "DPSHIM_", 7) != 0) continue;
        const char *eq = strchr(*ep, '=');
        size_t nlen = eq ? (size_t)(eq - *ep) : strlen(*ep);
        const char *val = eq ? eq + 1 : "";
        int id = -1, ours = 0;
        /* ours first: every process of a job has DPSHIM_RANK_PID (no key's name is one of them) */
        for (size_t i = 0; !ours && i < dps_n_other_env; i++)
            ours = strlen(dps_other_env[i].name) == nlen && memcmp(dps_other_env[i].name, *ep, nlen) == 0;
        if (ours) continue; /* not a policy key, but ours */
        for (int i = 0; i < DPS_NKEYS && id < 0; i++)
            if (is_env_name(*ep, nlen, i)) id = i;
        if (id < 0) return unknown_env(*ep, nlen, e);
        dps_error_t ve;
        /* env values may carry the surrounding blanks of a shell quote; keep what the user meant */
        const char *vs = val, *vend = val + strlen(val);
        trim(&vs, &vend);
        if (dps_policy_set_value(p, (dps_key_id_t)id, vs, (size_t)(vend - vs), DPS_SRC_ENV, 0, &ve) != 0) {
            char env[64];
            return fail(e, "environment %s ([%s] %s): %s",
                        dps_policy_env_name((dps_key_id_t)id, env, sizeof env), dps_keys[id].section,
                        dps_keys[id].key, ve.msg);
        }
    }
    return 0;
}

DPS_STARTUP int dps_policy_load(dps_policy_t *p, char *const *envp, dps_error_t *e)
{
    const char *path = NULL;
    for (char *const *ep = envp; ep && *ep; ep++)
        if (strncmp(*ep, DPS_ENV_POLICY "=", sizeof DPS_ENV_POLICY) == 0) path = *ep + sizeof DPS_ENV_POLICY;
    if (path && *path) {
        if (dps_policy_load_file(p, path, e) != 0) return -1;
    } else if (dps_sys_access("dpshim.conf", F_OK) == 0) {
        if (dps_policy_load_file(p, "dpshim.conf", e) != 0) return -1;
    }
    return dps_policy_apply_env(p, envp, e);
}

DPS_STARTUP int dps_policy_unavailable(const dps_policy_t *p, char *err, size_t errlen)
{
    char src[1100];
    if (DPS_POLICY_ENUM(p, data, uneven) == DPS_V_data_uneven_join) {
        snprintf(err, errlen, "%s: [data] uneven = join is not available in this version; use pad or drop",
                 dps_policy_source(p, DPS_P_data_uneven, src, sizeof src));
        return -1;
    }
    return 0;
}

int dps_policy_hooks_refused(const dps_policy_t *p, char *err, size_t errlen)
{
    for (int i = 0; i < p->nhooks; i++) {
        const dps_hookdecl_t *h = &p->hooks[i];
        char lib[256];
        if (dps_hookdecl_system_function(h, lib, sizeof lib))
            return snprintf(
                       err, errlen,
                       "%s:%d: [hook %s]: %s is a function of %s, which dpshim and MPI call themselves: a "
                       "hook there would run inside their own work; hook a function of the program or "
                       "its framework",
                       p->file[0] ? p->file : "policy", h->line, h->name, h->symbol, lib),
                   -1;
    }
    return 0;
}

const char *dps_policy_source(const dps_policy_t *p, dps_key_id_t id, char *buf, size_t len)
{
    const dps_setting_t *s = &p->set[id];
    char env[64];
    switch (s->src) {
    case DPS_SRC_FILE:
        snprintf(buf, len, "%s:%d", p->file[0] ? p->file : "(file)", s->line);
        break;
    case DPS_SRC_ENV:
        snprintf(buf, len, "env %s", dps_policy_env_name(id, env, sizeof env));
        break;
    default:
        snprintf(buf, len, "default");
        break;
    }
    return buf;
}
