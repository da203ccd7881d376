/* [hook NAME] declarations: signature and action parsing (see hookdecl.h). */
#include "hookdecl.h"
#include "policy.h"

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <gnu/lib-names.h>

/* DP_* dtypes and reduction ops (hooks/include/dpshim/hooks.h), repeated here to keep the
 * policy library free of the hook header. */
enum { DT_F32 = 0, DT_F64 = 1, DT_F16 = 2, DT_BF16 = 3, DT_I32 = 4, DT_I64 = 5, DT_U8 = 6 };
enum { OP_SUM = 0, OP_MEAN = 1, OP_MIN = 2, OP_MAX = 3 };

static int fail(char *err, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
    return -1;
}

size_t dps_ctype_size(dps_ctype_t t)
{
    static const size_t sizes[] = {0, 1, 1, 2, 2, 4, 4, 8, 8, 4, 8, 8};
    return sizes[t];
}

static const char *const ctype_names[] = {"void",     "int8_t",  "uint8_t",  "int16_t",
                                          "uint16_t", "int32_t", "uint32_t", "int64_t",
                                          "uint64_t", "float",   "double",   "pointer"};

const char *dps_carg_text(const dps_carg_t *a, char *buf, size_t len)
{
    if (a->type == DPS_CT_PTR)
        snprintf(buf, len, "%s *", ctype_names[a->pointee]);
    else
        snprintf(buf, len, "%s", ctype_names[a->type]);
    return buf;
}

static int is_int(dps_ctype_t t)
{
    return t >= DPS_CT_I8 && t <= DPS_CT_U64;
}

/* --- signatures --- */

typedef struct lexer {
    const char *p;
    char word[160]; /* the current token: an identifier, or one of * ( ) , */
    int too_long;   /* an identifier did not fit */
} lexer_t;

static int next(lexer_t *lx)
{
    while (isspace((unsigned char)*lx->p))
        lx->p++;
    if (!*lx->p) return lx->word[0] = '\0', 0;
    if (isalpha((unsigned char)*lx->p) || *lx->p == '_') {
        size_t n = 0;
        while (isalnum((unsigned char)*lx->p) || *lx->p == '_') {
            if (n + 1 < sizeof lx->word)
                lx->word[n++] = *lx->p;
            else
                lx->too_long = 1;
            lx->p++;
        }
        lx->word[n] = '\0';
        return 1;
    }
    if (strncmp(lx->p, "...", 3) == 0) {
        lx->p += 3;
        snprintf(lx->word, sizeof lx->word, "...");
        return 1;
    }
    lx->word[0] = *lx->p++, lx->word[1] = '\0';
    return 1;
}

static const struct named_type {
    const char *name;
    dps_ctype_t type;
} named_types[] = {
    {"size_t", DPS_CT_U64},    {"ssize_t", DPS_CT_I64}, {"ptrdiff_t", DPS_CT_I64}, {"intptr_t", DPS_CT_I64},
    {"uintptr_t", DPS_CT_U64}, {"int8_t", DPS_CT_I8},   {"uint8_t", DPS_CT_U8},    {"int16_t", DPS_CT_I16},
    {"uint16_t", DPS_CT_U16},  {"int32_t", DPS_CT_I32}, {"uint32_t", DPS_CT_U32},  {"int64_t", DPS_CT_I64},
    {"uint64_t", DPS_CT_U64},  {"float", DPS_CT_F32},   {"double", DPS_CT_F64},    {"bool", DPS_CT_U8},
    {"_Bool", DPS_CT_U8},      {"void", DPS_CT_VOID},
};

static int is_qualifier(const char *w)
{
    return !strcmp(w, "const") || !strcmp(w, "volatile") || !strcmp(w, "restrict");
}

static int is_builtin_word(const char *w)
{
    static const char *const words[] = {"signed", "unsigned", "char", "short", "int", "long"};
    for (size_t i = 0; i < sizeof words / sizeof *words; i++)
        if (!strcmp(w, words[i])) return 1;
    for (size_t i = 0; i < sizeof named_types / sizeof *named_types; i++)
        if (!strcmp(w, named_types[i].name)) return 1;
    return 0;
}

/* The words of a type as they come: "unsigned long", "size_t", "struct model", "model_t". */
typedef struct type_words {
    int sign, longs, shorts, chars, ints, words; /* sign: 1 signed, 2 unsigned */
    dps_ctype_t named;                           /* size_t, float... when have_named */
    int have_named, opaque;                      /* opaque: struct/union/enum X, or a typedef */
    char opaque_name[64];
} type_words_t;

/* One word of a type; 0 when the word is not one (it may be the argument's name). */
static int add_type_word(type_words_t *tw, const char *w)
{
    if (!strcmp(w, "signed"))
        tw->sign = 1;
    else if (!strcmp(w, "unsigned"))
        tw->sign = 2;
    else if (!strcmp(w, "long"))
        tw->longs++;
    else if (!strcmp(w, "short"))
        tw->shorts++;
    else if (!strcmp(w, "char"))
        tw->chars++;
    else if (!strcmp(w, "int"))
        tw->ints++;
    else {
        int found = 0;
        for (size_t i = 0; i < sizeof named_types / sizeof *named_types; i++)
            if (!strcmp(w, named_types[i].name)) tw->named = named_types[i].type, tw->have_named = found = 1;
        if (!found) return 0;
    }
    tw->words++;
    return 1;
}

/* Reads type words up to the first token that is not one (a '*', the name, ',' or ')'). */
static void read_type_words(lexer_t *lx, type_words_t *tw)
{
    for (;; next(lx)) {
        const char *w = lx->word;
        if (is_qualifier(w)) continue;
        if (!strcmp(w, "struct") || !strcmp(w, "union") || !strcmp(w, "enum")) {
            next(lx);
            snprintf(tw->opaque_name, sizeof tw->opaque_name, "%s", lx->word);
            tw->opaque = 1, tw->words++;
            continue;
        }
        if (add_type_word(tw, w)) continue;
        /* an unknown identifier: a typedef'd type if nothing came before it, else the name */
        if (tw->words == 0 && (isalpha((unsigned char)w[0]) || w[0] == '_')) {
            snprintf(tw->opaque_name, sizeof tw->opaque_name, "%s", w);
            tw->opaque = 1, tw->words++;
            continue;
        }
        return;
    }
}

/* The C type the words make (VOID for an opaque one); -1 with err set when they mix. */
static int base_type(const type_words_t *tw, const char *next_word, dps_ctype_t *t, char *err, size_t len)
{
    if (tw->opaque)
        *t = DPS_CT_VOID;
    else if (tw->have_named) {
        if (tw->sign || tw->longs || tw->shorts || tw->chars || tw->ints)
            return fail(err, len, "mixed type words before '%s'", next_word);
        *t = tw->named;
    } else if (tw->chars)
        *t = tw->sign == 2 ? DPS_CT_U8 : DPS_CT_I8;
    else if (tw->shorts)
        *t = tw->sign == 2 ? DPS_CT_U16 : DPS_CT_I16;
    else if (tw->longs)
        *t = tw->sign == 2 ? DPS_CT_U64 : DPS_CT_I64;
    else
        *t = tw->sign == 2 ? DPS_CT_U32 : DPS_CT_I32;
    return 0;
}

/* Pointer stars (and qualifiers between them): how many. */
static int read_stars(lexer_t *lx)
{
    int stars = 0;
    while (!strcmp(lx->word, "*") || is_qualifier(lx->word)) {
        stars += lx->word[0] == '*';
        next(lx);
    }
    return stars;
}

/* A pointer to a type of the program's own (a typedef) is fine, but not a misspelt one, nor
 * such a type by value. */
static int check_opaque(const type_words_t *tw, int stars, char *err, size_t len)
{
    static const char *const spellable[] = {"float",    "double",   "int",     "long",    "short",
                                            "char",     "size_t",   "ssize_t", "int32_t", "int64_t",
                                            "uint32_t", "uint64_t", "uint8_t", "void",    "unsigned"};
    if (!tw->opaque) return 0;
    const char *close = dps_suggest(tw->opaque_name, strlen(tw->opaque_name), spellable,
                                    sizeof spellable / sizeof *spellable);
    if (stars && !close) return 0;
    return fail(err, len,
                "unknown type '%s'%s%s%s (known: void, char, short, int, long, long long, their unsigned "
                "forms, size_t, ssize_t, intN_t, uintN_t, float, double, bool, and pointers to anything)",
                tw->opaque_name, close ? "; did you mean '" : "", close ? close : "", close ? "'?" : "");
}

/* The argument's (or function's) optional name, into name. */
static int read_name(lexer_t *lx, char *name, size_t name_len, char *err, size_t len)
{
    if (!(isalpha((unsigned char)lx->word[0]) || lx->word[0] == '_') || is_builtin_word(lx->word)) return 0;
    if (strlen(lx->word) >= name_len || lx->too_long)
        return fail(err, len, "the name '%.40s...' is longer than %zu characters", lx->word, name_len - 1);
    snprintf(name, name_len, "%s", lx->word);
    next(lx);
    return 0;
}

/* One type and its optional name; the lexer stands on the token after them. */
static int parse_carg(lexer_t *lx, dps_carg_t *a, char *name, size_t name_len, char *err, size_t len)
{
    type_words_t tw = {.named = DPS_CT_VOID};
    dps_ctype_t t = DPS_CT_VOID;
    memset(a, 0, sizeof *a);
    read_type_words(lx, &tw);
    if (!tw.words) return fail(err, len, "expected a type, got '%s'", lx->word[0] ? lx->word : "end of text");
    if (base_type(&tw, lx->word, &t, err, len)) return -1;
    int stars = read_stars(lx);
    if (check_opaque(&tw, stars, err, len)) return -1;
    if (stars)
        a->type = DPS_CT_PTR, a->pointee = stars == 1 ? t : DPS_CT_VOID;
    else
        a->type = t;
    return read_name(lx, name, name_len, err, len);
}

static int parse_signature(dps_hookdecl_t *h, const char *text, char *fname, size_t fnlen, char *err,
                           size_t len)
{
    lexer_t lx = {text, "", 0};
    next(&lx);
    char why[256];
    /* "void f(...)": f is read as the return type's name */
    if (parse_carg(&lx, &h->ret, fname, fnlen, why, sizeof why)) return fail(err, len, "signature: %s", why);
    if (strcmp(lx.word, "("))
        return fail(err, len, "signature: expected '(' after the return type%s, got '%s'",
                    fname[0] ? " and name" : "", lx.word[0] ? lx.word : "end of text");
    next(&lx);
    if (!strcmp(lx.word, "void") && lx.p[strspn(lx.p, " \t")] == ')') next(&lx);
    while (strcmp(lx.word, ")")) {
        if (!lx.word[0]) return fail(err, len, "signature: missing ')'");
        if (!strcmp(lx.word, "..."))
            return fail(err, len, "signature: variadic functions (...) cannot be hooked");
        if (h->nargs == DPS_HOOK_MAX_ARGS)
            return fail(err, len, "signature: more than %d arguments", DPS_HOOK_MAX_ARGS);
        dps_carg_t *a = &h->args[h->nargs];
        if (parse_carg(&lx, a, a->name, sizeof a->name, why, sizeof why))
            return fail(err, len, "signature: argument %d: %s", h->nargs + 1, why);
        if (a->type == DPS_CT_VOID)
            return fail(err, len, "signature: argument %d has type void", h->nargs + 1);
        for (int i = 0; i < h->nargs; i++)
            if (a->name[0] && !strcmp(a->name, h->args[i].name))
                return fail(err, len, "signature: two arguments are named '%s'", a->name);
        h->nargs++;
        if (!strcmp(lx.word, ","))
            next(&lx);
        else if (strcmp(lx.word, ")"))
            return fail(err, len, "signature: expected ',' or ')' after argument %d, got '%s'", h->nargs,
                        lx.word[0] ? lx.word : "end of text");
    }
    next(&lx);
    if (lx.word[0]) return fail(err, len, "signature: unexpected '%s' after ')'", lx.word);
    return 0;
}

/* --- actions --- */

static const char *const dtype_names[] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8"};
static const char *const op_names[] = {"sum", "mean", "min", "max"};
static const struct action_name {
    const char *name;
    dps_action_kind_t kind;
} action_names[] = {
    {"grads", DPS_ACT_GRADS},           {"allreduce", DPS_ACT_ALLREDUCE}, {"broadcast", DPS_ACT_BROADCAST},
    {"batch", DPS_ACT_BATCH},           {"epoch", DPS_ACT_EPOCH},         {"seed", DPS_ACT_SEED},
    {"rank0_only", DPS_ACT_RANK0_ONLY}, {"barrier", DPS_ACT_BARRIER},     {"step_end", DPS_ACT_STEP_END},
};

/* The argument a name or $K names: its index, or -1 with err set. */
static int arg_index(const dps_hookdecl_t *h, const char *s, size_t n, const char *key, char *err, size_t len)
{
    if (n > 1 && s[0] == '$') {
        char *end;
        long k = strtol(s + 1, &end, 10);
        if (end != s + n || k < 1)
            return fail(err, len, "%s: '%.*s' is not an argument ($1, $2, ... or a name)", key, (int)n, s),
                   -1;
        if (k > h->nargs)
            return fail(err, len, "%s: argument $%ld out of range: the signature has %d", key, k, h->nargs),
                   -1;
        return (int)k - 1;
    }
    for (int i = 0; i < h->nargs; i++)
        if (strlen(h->args[i].name) == n && !memcmp(h->args[i].name, s, n)) return i;
    return fail(err, len, "%s: no argument named '%.*s' in the signature", key, (int)n, s), -1;
}

/* COUNT or VALUE: ARG, *ARG, a constant or "return". */
static int parse_ref(const dps_hookdecl_t *h, const char *s, size_t n, dps_ref_t *r, const char *key,
                     char *err, size_t len)
{
    char tb[64];
    if (n == 6 && !memcmp(s, "return", 6)) {
        if (!is_int(h->ret.type))
            return fail(err, len,
                        "%s: 'return' as a count needs an integer return type, the signature returns %s", key,
                        dps_carg_text(&h->ret, tb, sizeof tb));
        r->kind = DPS_REF_RETURN;
        return 0;
    }
    if (n && isdigit((unsigned char)s[0])) {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(s, &end, 10);
        if (end != s + n || errno) return fail(err, len, "%s: '%.*s' is not a count", key, (int)n, s);
        r->kind = DPS_REF_CONST, r->value = v;
        return 0;
    }
    int deref = n && s[0] == '*';
    int i = arg_index(h, s + deref, n - (size_t)deref, key, err, len);
    if (i < 0) return -1;
    const dps_carg_t *a = &h->args[i];
    if (deref ? !(a->type == DPS_CT_PTR && is_int(a->pointee)) : !is_int(a->type))
        return fail(err, len, "%s: '%.*s' must be %s, it is %s", key, (int)n, s,
                    deref ? "a pointer to an integer" : "an integer", dps_carg_text(a, tb, sizeof tb));
    r->kind = deref ? DPS_REF_DEREF : DPS_REF_ARG, r->arg = i;
    return 0;
}

static int dtype_of(dps_ctype_t t)
{
    switch (t) {
    case DPS_CT_F32:
        return DT_F32;
    case DPS_CT_F64:
        return DT_F64;
    case DPS_CT_I32:
        return DT_I32;
    case DPS_CT_I64:
        return DT_I64;
    case DPS_CT_U8:
        return DT_U8;
    default:
        return -1;
    }
}

static int word_index(const char *w, size_t n, const char *const *names, size_t count)
{
    for (size_t i = 0; i < count; i++)
        if (strlen(names[i]) == n && !memcmp(names[i], w, n)) return (int)i;
    return -1;
}

/* "BUF[COUNT] words..." of a buffer action. */
static int parse_buffer(const dps_hookdecl_t *h, dps_action_t *a, const char *s, const char *e,
                        const char *key, const char *verb, char *err, size_t len)
{
    const char *lb = memchr(s, '[', (size_t)(e - s)), *rb = lb ? memchr(lb, ']', (size_t)(e - lb)) : NULL;
    if (!lb || !rb) return fail(err, len, "%s: %s needs BUFFER[COUNT], e.g. %s g[n]", key, verb, verb);
    const char *bs = s, *be = lb;
    while (be > bs && isspace((unsigned char)be[-1]))
        be--;
    int i = arg_index(h, bs, (size_t)(be - bs), key, err, len);
    if (i < 0) return -1;
    a->buf = i;
    char tb[64];
    const dps_carg_t *arg = &h->args[i];
    if (arg->type != DPS_CT_PTR)
        return fail(err, len, "%s: %s on '%.*s', which is %s, not a pointer", key, verb, (int)(be - bs), bs,
                    dps_carg_text(arg, tb, sizeof tb));
    const char *cs = lb + 1, *ce = rb;
    while (cs < ce && isspace((unsigned char)*cs))
        cs++;
    while (ce > cs && isspace((unsigned char)ce[-1]))
        ce--;
    if (parse_ref(h, cs, (size_t)(ce - cs), &a->count, key, err, len)) return -1;
    /* what follows: [DTYPE] [OP] */
    a->dtype = -1, a->op = -1;
    for (const char *w = rb + 1; w < e;) {
        while (w < e && isspace((unsigned char)*w))
            w++;
        const char *we = w;
        while (we < e && !isspace((unsigned char)*we))
            we++;
        if (we == w) break;
        int d = word_index(w, (size_t)(we - w), dtype_names, 7),
            o = word_index(w, (size_t)(we - w), op_names, 4);
        if (d >= 0 && a->dtype < 0)
            a->dtype = d;
        else if (o >= 0 && a->op < 0)
            a->op = o;
        else
            return fail(
                err, len,
                "%s: %s: unexpected '%.*s' (dtypes: f32 f64 f16 bf16 i32 i64 u8; ops: sum mean min max)", key,
                verb, (int)(we - w), w);
        w = we;
    }
    return 0;
}

static int check_buffer_dtype(const dps_hookdecl_t *h, dps_action_t *a, const char *key, const char *verb,
                              char *err, size_t len)
{
    const dps_carg_t *arg = &h->args[a->buf];
    char tb[64];
    int natural = dtype_of(arg->pointee);
    if (a->dtype < 0) {
        if (natural < 0)
            return fail(err, len, "%s: %s on '%s', a %s, needs a dtype (f32, f64, f16, bf16, i32, i64, u8)",
                        key, verb, arg->name[0] ? arg->name : "argument", dps_carg_text(arg, tb, sizeof tb));
        a->dtype = natural;
    } else if (arg->pointee != DPS_CT_VOID && natural != a->dtype &&
               !(arg->pointee == DPS_CT_U16 && (a->dtype == DT_F16 || a->dtype == DT_BF16)))
        return fail(err, len, "%s: %s: dtype %s does not match '%s', a %s", key, verb, dtype_names[a->dtype],
                    arg->name[0] ? arg->name : "argument", dps_carg_text(arg, tb, sizeof tb));
    return 0;
}

/* The action's verb, from the start of its text: its index in action_names, or -1 with err set.
 * *verb_end: where the verb ends. */
static int find_action(const char *s, const char *e, const char *key, const char **verb_end, char *err,
                       size_t len)
{
    const char *ve = s;
    while (ve < e && !isspace((unsigned char)*ve) && *ve != '[')
        ve++;
    *verb_end = ve;
    int k = -1;
    for (size_t i = 0; i < sizeof action_names / sizeof *action_names; i++)
        if (strlen(action_names[i].name) == (size_t)(ve - s) &&
            !memcmp(action_names[i].name, s, (size_t)(ve - s)))
            k = (int)i;
    if (k < 0)
        return fail(err, len,
                    "%s: unknown action '%.*s' (grads, allreduce, broadcast, batch, epoch, seed, rank0_only, "
                    "barrier, step_end)",
                    key, (int)(ve - s), s);
    return k;
}

/* grads, allreduce, broadcast: BUF[COUNT] [DTYPE] [OP]. */
static int parse_reduction(const dps_hookdecl_t *h, dps_action_t *a, const char *rest, const char *e,
                           const char *key, const char *verb, char *err, size_t len)
{
    if (parse_buffer(h, a, rest, e, key, verb, err, len) || check_buffer_dtype(h, a, key, verb, err, len))
        return -1;
    if (a->kind == DPS_ACT_ALLREDUCE && a->op < 0)
        return fail(err, len, "%s: allreduce needs an op: sum, mean, min or max", key);
    if (a->kind != DPS_ACT_ALLREDUCE && a->op >= 0) return fail(err, len, "%s: %s takes no op", key, verb);
    if (a->op == OP_MEAN && (a->dtype == DT_I32 || a->dtype == DT_I64 || a->dtype == DT_U8))
        return fail(err, len, "%s: allreduce mean of integers is not exact; use sum", key);
    return 0;
}

/* batch, epoch: BUF[COUNT] of integer indices, the count written back where it came from. */
static int parse_sharding(const dps_hookdecl_t *h, dps_action_t *a, const char *rest, const char *e,
                          const char *key, const char *verb, char *err, size_t len)
{
    if (parse_buffer(h, a, rest, e, key, verb, err, len)) return -1;
    dps_ctype_t p = h->args[a->buf].pointee;
    char tb[64];
    if (!(p == DPS_CT_I32 || p == DPS_CT_U32 || p == DPS_CT_I64 || p == DPS_CT_U64))
        return fail(err, len, "%s: %s needs a pointer to 32- or 64-bit integer indices, '%s' is a %s", key,
                    verb, h->args[a->buf].name, dps_carg_text(&h->args[a->buf], tb, sizeof tb));
    if (a->dtype >= 0 || a->op >= 0) return fail(err, len, "%s: %s takes no dtype or op", key, verb);
    if (a->count.kind == DPS_REF_CONST)
        return fail(err, len, "%s: %s changes the count: give it as an argument, *argument or return", key,
                    verb);
    return 0;
}

static int parse_seed(const dps_hookdecl_t *h, dps_action_t *a, const char *rest, const char *e,
                      const char *key, char *err, size_t len)
{
    if (parse_ref(h, rest, (size_t)(e - rest), &a->value, key, err, len)) return -1;
    if (a->value.kind == DPS_REF_CONST)
        return fail(err, len, "%s: seed needs an argument, *argument or return", key);
    return 0;
}

/* VALUE of rank0_only's return=VALUE, read as the function's return type. */
static int parse_return_value(const dps_hookdecl_t *h, dps_action_t *a, const char *num, const char *key,
                              char *err, size_t len)
{
    dps_ctype_t rt = h->ret.type;
    char *end;
    if (rt == DPS_CT_VOID)
        return fail(err, len, "%s: rank0_only: the function returns void, drop return=", key);
    errno = 0;
    if (rt == DPS_CT_F32 || rt == DPS_CT_F64) {
        a->ret_f = strtod(num, &end);
    } else if (rt == DPS_CT_PTR) {
        if (strcmp(num, "NULL") && strcmp(num, "0"))
            return fail(err, len, "%s: rank0_only: a pointer result can only be return=NULL (or 0)", key);
        a->ret_i = 0, end = (char *)num + strlen(num);
    } else if (rt == DPS_CT_U64 || rt == DPS_CT_U32 || rt == DPS_CT_U16 || rt == DPS_CT_U8) {
        a->ret_i = (int64_t)strtoull(num, &end, 10);
        if (num[0] == '-') errno = ERANGE;
    } else {
        a->ret_i = (int64_t)strtoll(num, &end, 10);
    }
    if (!num[0] || *end || errno)
        return fail(err, len, "%s: rank0_only: return=%s is not a value of the return type", key, num);
    a->has_return = 1;
    return 0;
}

/* rank0_only [return=VALUE], before the call only. */
static int parse_rank0_only(const dps_hookdecl_t *h, dps_action_t *a, const char *rest, const char *e,
                            int after, const char *key, char *err, size_t len)
{
    if (after)
        return fail(err, len, "%s: rank0_only decides whether the call happens: put it in before", key);
    if (rest == e) return 0;
    if (strncmp(rest, "return", 6) != 0 || !memchr(rest, '=', (size_t)(e - rest)))
        return fail(err, len, "%s: rank0_only takes 'return=VALUE', got '%.*s'", key, (int)(e - rest), rest);
    const char *v = (const char *)memchr(rest, '=', (size_t)(e - rest)) + 1;
    while (v < e && isspace((unsigned char)*v))
        v++;
    char num[64];
    snprintf(num, sizeof num, "%.*s", (int)(e - v), v);
    return parse_return_value(h, a, num, key, err, len);
}

/* Where the action reads or writes must exist when it runs: the return value only after the
 * call, and a by-value argument cannot carry a result back after it. */
static int check_timing(const dps_hookdecl_t *h, const dps_action_t *a, int after, const char *key,
                        const char *verb, char *err, size_t len)
{
    int uses_return =
        a->count.kind == DPS_REF_RETURN || (a->kind == DPS_ACT_SEED && a->value.kind == DPS_REF_RETURN);
    if (uses_return && !after)
        return fail(err, len, "%s: %s uses the return value, which only exists after the call", key, verb);
    if (a->kind == DPS_ACT_BATCH || a->kind == DPS_ACT_EPOCH || a->kind == DPS_ACT_SEED) {
        const dps_ref_t *r = a->kind == DPS_ACT_SEED ? &a->value : &a->count;
        if (after && r->kind == DPS_REF_ARG)
            return fail(
                err, len,
                "%s: %s after the call cannot change the argument '%s' (passed by value); use *%s or return",
                key, verb, h->args[r->arg].name, h->args[r->arg].name);
    }
    return 0;
}

/* One action, the text [s, e) without surrounding spaces. */
static int parse_action(dps_hookdecl_t *h, dps_action_t *a, const char *s, const char *e, int after,
                        const char *key, char *err, size_t len)
{
    const char *rest;
    int k = find_action(s, e, key, &rest, err, len);
    if (k < 0) return -1;
    memset(a, 0, sizeof *a);
    a->kind = action_names[k].kind;
    const char *verb = action_names[k].name;
    while (rest < e && isspace((unsigned char)*rest))
        rest++;
    int rc = 0;
    switch (a->kind) {
    case DPS_ACT_GRADS:
    case DPS_ACT_ALLREDUCE:
    case DPS_ACT_BROADCAST:
        rc = parse_reduction(h, a, rest, e, key, verb, err, len);
        break;
    case DPS_ACT_BATCH:
    case DPS_ACT_EPOCH:
        rc = parse_sharding(h, a, rest, e, key, verb, err, len);
        break;
    case DPS_ACT_SEED:
        rc = parse_seed(h, a, rest, e, key, err, len);
        break;
    case DPS_ACT_RANK0_ONLY:
        rc = parse_rank0_only(h, a, rest, e, after, key, err, len);
        break;
    case DPS_ACT_BARRIER:
    case DPS_ACT_STEP_END:
        if (rest < e)
            rc = fail(err, len, "%s: %s takes nothing, got '%.*s'", key, verb, (int)(e - rest), rest);
        break;
    }
    return rc ? -1 : check_timing(h, a, after, key, verb, err, len);
}

static int parse_actions(dps_hookdecl_t *h, const char *text, int after, char *err, size_t len)
{
    const char *key = after ? "after" : "before";
    dps_action_t *list = after ? h->after : h->before;
    int *n = after ? &h->nafter : &h->nbefore;
    for (const char *s = text; *s;) {
        const char *e = strchr(s, ',');
        if (!e) e = s + strlen(s);
        const char *as = s, *ae = e;
        while (as < ae && isspace((unsigned char)*as))
            as++;
        while (ae > as && isspace((unsigned char)ae[-1]))
            ae--;
        if (as == ae) return fail(err, len, "%s: an empty action (two commas, or a trailing one)", key);
        if (*n == DPS_HOOK_MAX_ACTIONS)
            return fail(err, len, "%s: more than %d actions", key, DPS_HOOK_MAX_ACTIONS);
        if (parse_action(h, &list[*n], as, ae, after, key, err, len)) return -1;
        (*n)++;
        s = *e ? e + 1 : e;
    }
    return 0;
}

int dps_hookdecl_build(dps_hookdecl_t *h, const char *symbol, const char *library, const char *signature,
                       const char *before, const char *after, const char *missing, char *err, size_t errlen)
{
    if (!signature)
        return fail(err, errlen, "signature: missing; e.g. signature = void f(float *g, size_t n)");
    char fname[64] = "";
    if (parse_signature(h, signature, fname, sizeof fname, err, errlen)) return -1;
    if (symbol && fname[0] && strcmp(symbol, fname))
        return fail(err, errlen, "symbol: '%s', but the signature names '%s'", symbol, fname);
    if (!symbol && !fname[0])
        return fail(err, errlen, "symbol: missing (or name the function in the signature)");
    snprintf(h->symbol, sizeof h->symbol, "%s", symbol ? symbol : fname);
    snprintf(h->library, sizeof h->library, "%s", library ? library : "");
    h->missing = DPS_MISSING_WARN;
    if (missing) {
        if (!strcmp(missing, "warn"))
            h->missing = DPS_MISSING_WARN;
        else if (!strcmp(missing, "error"))
            h->missing = DPS_MISSING_ERROR;
        else if (!strcmp(missing, "ignore"))
            h->missing = DPS_MISSING_IGNORE;
        else
            return fail(err, errlen, "missing: '%s' is not one of warn, error, ignore", missing);
    }
    if (before && parse_actions(h, before, 0, err, errlen)) return -1;
    if (after && parse_actions(h, after, 1, err, errlen)) return -1;
    return 0;
}

static size_t describe_ref(const dps_hookdecl_t *h, const dps_ref_t *r, char *buf, size_t len)
{
    switch (r->kind) {
    case DPS_REF_ARG:
        return (size_t)snprintf(buf, len, "%s", h->args[r->arg].name[0] ? h->args[r->arg].name : "?");
    case DPS_REF_DEREF:
        return (size_t)snprintf(buf, len, "*%s", h->args[r->arg].name);
    case DPS_REF_CONST:
        return (size_t)snprintf(buf, len, "%llu", (unsigned long long)r->value);
    default:
        return (size_t)snprintf(buf, len, "return");
    }
}

static void describe_actions(const dps_hookdecl_t *h, const dps_action_t *list, int n, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && o < len; i++) {
        const dps_action_t *a = &list[i];
        const char *verb = "?";
        for (size_t k = 0; k < sizeof action_names / sizeof *action_names; k++)
            if (action_names[k].kind == a->kind) verb = action_names[k].name;
        o += (size_t)snprintf(buf + o, len - o, "%s%s", i ? ", " : "", verb);
        char ref[64];
        if (o >= len) break;
        switch (a->kind) {
        case DPS_ACT_GRADS:
        case DPS_ACT_ALLREDUCE:
        case DPS_ACT_BROADCAST:
        case DPS_ACT_BATCH:
        case DPS_ACT_EPOCH:
            describe_ref(h, &a->count, ref, sizeof ref);
            o += (size_t)snprintf(buf + o, len - o, " %s[%s]",
                                  h->args[a->buf].name[0] ? h->args[a->buf].name : "?", ref);
            if (o < len && a->dtype >= 0)
                o += (size_t)snprintf(buf + o, len - o, " %s", dtype_names[a->dtype]);
            if (o < len && a->op >= 0) o += (size_t)snprintf(buf + o, len - o, " %s", op_names[a->op]);
            break;
        case DPS_ACT_SEED:
            describe_ref(h, &a->value, ref, sizeof ref);
            o += (size_t)snprintf(buf + o, len - o, " %s", ref);
            break;
        case DPS_ACT_RANK0_ONLY:
            if (a->has_return && (h->ret.type == DPS_CT_F32 || h->ret.type == DPS_CT_F64))
                o += (size_t)snprintf(buf + o, len - o, " return=%g", a->ret_f);
            else if (a->has_return)
                o += (size_t)snprintf(buf + o, len - o, " return=%lld", (long long)a->ret_i);
            break;
        default:
            break;
        }
    }
}

const char *dps_hookdecl_describe(const dps_hookdecl_t *h, char *buf, size_t len)
{
    char sig[512] = "", before[512], after[512], tb[64];
    size_t o = 0;
    for (int i = 0; i < h->nargs && o < sizeof sig; i++)
        o += (size_t)snprintf(
            sig + o, sizeof sig - o, "%s%s%s%s", i ? ", " : "", dps_carg_text(&h->args[i], tb, sizeof tb),
            h->args[i].type == DPS_CT_PTR || !h->args[i].name[0] ? "" : " ", h->args[i].name);
    describe_actions(h, h->before, h->nbefore, before, sizeof before);
    describe_actions(h, h->after, h->nafter, after, sizeof after);
    snprintf(buf, len, "%s %s(%s)%s%s%s%s%s%s", dps_carg_text(&h->ret, tb, sizeof tb), h->symbol, sig,
             h->library[0] ? " in " : "", h->library, before[0] ? "; before: " : "", before,
             after[0] ? "; after: " : "", after);
    return buf;
}

/* Whether the hook's function is one of the C library's or the dynamic loader's (free, write):
 * the shim and MPI call those themselves, so a hook there would run its collectives inside their
 * own work (and wait there for ever). Each such library is asked itself, as libdpshim.so (write)
 * or a preloaded allocator (free) may come first in the global scope. Its name into lib. */
int dps_hookdecl_system_function(const dps_hookdecl_t *d, char *lib, size_t len)
{
    static const char *const system[] = {LIBC_SO,   LIBM_SO, LIBPTHREAD_SO, LIBDL_SO, LIBRT_SO, LD_SO,
#ifdef LIBMVEC_SO
                                         LIBMVEC_SO
#endif
    };
    const char *named = strrchr(d->library, '/');
    named = named ? named + 1 : d->library;
    for (size_t i = 0; i < sizeof system / sizeof *system; i++) {
        if (named[0] && strcmp(named, system[i])) continue; /* library = names another one */
        void *h = dlopen(system[i], RTLD_LAZY | RTLD_NOLOAD);
        int defines = h && dlsym(h, d->symbol);
        if (h) dlclose(h); /* NOLOAD took a reference: given back */
        if (defines) return snprintf(lib, len, "%s", system[i]), 1;
    }
    return 0;
}
