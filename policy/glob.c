/* Path glob matching (see glob.h). The pattern becomes a small automaton that is run over the
 * path with a set of active states, so matching takes time proportional to path length times
 * pattern length, whatever the stars: no backtracking for a hostile pattern to exploit. */
#include "glob.h"

#include <stdint.h>
#include <string.h>

/* Matches a character class at p (just past '['); sets *end past its ']'. */
static int class_match(const char *p, char c, const char **end)
{
    int neg = *p == '!' || *p == '^', hit = 0;
    if (neg) p++;
    const char *start = p;
    while (*p && (*p != ']' || p == start)) {
        char lo = *p == '\\' && p[1] ? *++p : *p;
        if (p[1] == '-' && p[2] && p[2] != ']') {
            char hi = p[2] == '\\' && p[3] ? p[3] : p[2];
            hit |= c >= lo && c <= hi;
            p += p[2] == '\\' ? 4 : 3;
        } else {
            hit |= c == lo;
            p++;
        }
    }
    *end = *p ? p + 1 : p;
    return hit != neg;
}

#define GLOB_MAX_TOKENS 256

typedef enum { T_LIT, T_ANY, T_CLASS, T_STAR, T_SEGS, T_REST } tok_kind_t;
/* T_STAR: '*' within a segment; T_SEGS: a '**' segment followed by '/' (zero or more whole
 * segments); T_REST: a final '**' segment (anything, '/' included). */
typedef struct tok {
    tok_kind_t kind;
    char lit;
    const char *cls; /* T_CLASS: just past '[' */
} tok_t;

static int tokenize(const char *p, tok_t *t)
{
    int n = 0;
    for (size_t i = 0; p[i];) {
        if (n == GLOB_MAX_TOKENS) return -1;
        int seg_start = i == 0 || p[i - 1] == '/';
        if (p[i] == '*' && p[i + 1] == '*' && seg_start && (p[i + 2] == '/' || !p[i + 2])) {
            t[n++].kind = p[i + 2] ? T_SEGS : T_REST;
            i += p[i + 2] ? 3 : 2;
        } else if (p[i] == '*') {
            t[n++].kind = T_STAR;
            while (p[i] == '*')
                i++;
        } else if (p[i] == '?') {
            t[n++].kind = T_ANY, i++;
        } else if (p[i] == '[') {
            const char *after;
            class_match(p + i + 1, 0, &after);
            t[n].kind = T_CLASS, t[n++].cls = p + i + 1;
            i = (size_t)(after - p);
        } else {
            if (p[i] == '\\' && p[i + 1]) i++;
            t[n].kind = T_LIT, t[n++].lit = p[i++];
        }
    }
    return n;
}

/* State 2k: before token k; state 2k+1: inside a segment eaten by T_SEGS token k. */
#define WORDS ((2 * GLOB_MAX_TOKENS + 2 + 63) / 64)
#define HAS(set, s) ((set)[(s) / 64] >> ((s) % 64) & 1)
#define ADD(set, s) ((set)[(s) / 64] |= (uint64_t)1 << ((s) % 64))

static void closure(uint64_t *set, const tok_t *t, int n)
{
    for (int k = 0; k < n; k++)
        if (HAS(set, 2 * k) && (t[k].kind == T_STAR || t[k].kind == T_SEGS || t[k].kind == T_REST))
            ADD(set, 2 * (k + 1));
}

int dps_glob_match(const char *pattern, const char *path, size_t len)
{
    tok_t t[GLOB_MAX_TOKENS];
    int n = tokenize(pattern, t);
    if (n < 0) return 0;
    uint64_t cur[WORDS] = {0}, next[WORDS];
    ADD(cur, 0);
    closure(cur, t, n);
    for (size_t i = 0; i < len; i++) {
        char c = path[i];
        int alive = 0;
        memset(next, 0, sizeof next);
        for (int k = 0; k < n; k++) {
            const char *after;
            if (HAS(cur, 2 * k)) switch (t[k].kind) {
                case T_LIT:
                    if (c == t[k].lit) ADD(next, 2 * (k + 1));
                    break;
                case T_ANY:
                    if (c != '/') ADD(next, 2 * (k + 1));
                    break;
                case T_CLASS:
                    if (c != '/' && class_match(t[k].cls, c, &after)) ADD(next, 2 * (k + 1));
                    break;
                case T_STAR:
                    if (c != '/') ADD(next, 2 * k);
                    break;
                case T_SEGS:
                    ADD(next, c == '/' ? 2 * k : 2 * k + 1);
                    break;
                case T_REST:
                    ADD(next, 2 * k);
                    break;
                }
            if (HAS(cur, 2 * k + 1)) ADD(next, c == '/' ? 2 * k : 2 * k + 1);
        }
        closure(next, t, n);
        for (int w = 0; w < WORDS; w++)
            alive |= (cur[w] = next[w]) != 0;
        if (!alive) return 0;
    }
    return HAS(cur, 2 * n);
}

const char *dps_glob_check(const char *g, size_t len)
{
    if (len == 0) return "empty glob";
    if (len > GLOB_MAX_TOKENS) return "glob longer than 256 characters";
    for (size_t i = 0; i < len; i++) {
        if (g[i] == '\\') {
            if (++i == len) return "glob ends with a lone '\\'";
        } else if (g[i] == '[') {
            size_t j = i + 1;
            if (j < len && (g[j] == '!' || g[j] == '^')) j++;
            size_t first = j;
            while (j < len && (g[j] != ']' || j == first))
                j += g[j] == '\\' ? 2 : 1;
            if (j >= len) return "glob with an unclosed '['";
            i = j;
        } else if (g[i] == '*' && i + 2 < len && g[i + 1] == '*' && g[i + 2] == '*') {
            return "glob with '***': use '*' within a segment or '**' for whole segments";
        }
    }
    return NULL;
}
