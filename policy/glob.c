/* Path glob matching (see glob.h). Backtracking is bounded by the pattern's '*' and '**'
 * count; patterns come from the policy and are short. */
#include "glob.h"

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

static int match(const char *p, const char *s, const char *end)
{
    while (*p) {
        if (p[0] == '*' && p[1] == '*' && (p[2] == '/' || p[2] == '\0')) {
            /* '**' segment: zero or more whole segments */
            const char *rest = p[2] ? p + 3 : p + 2;
            if (!*rest) return 1;
            for (const char *q = s;; q++) {
                if ((q == s || q[-1] == '/') && match(rest, q, end)) return 1;
                if (q == end) return 0;
            }
        }
        if (*p == '*') {
            while (*p == '*') p++;
            for (const char *q = s;; q++) {
                if (match(p, q, end)) return 1;
                if (q == end || *q == '/') return 0;
            }
        }
        if (s == end) return 0;
        if (*p == '?') {
            if (*s == '/') return 0;
        } else if (*p == '[') {
            const char *after;
            if (*s == '/' || !class_match(p + 1, *s, &after)) return 0;
            p = after, s++;
            continue;
        } else {
            if (*p == '\\' && p[1]) p++;
            if (*p != *s) return 0;
        }
        p++, s++;
    }
    return s == end;
}

int dps_glob_match(const char *pattern, const char *path, size_t len)
{
    return match(pattern, path, path + len);
}

const char *dps_glob_check(const char *g, size_t len)
{
    if (len == 0) return "empty glob";
    for (size_t i = 0; i < len; i++) {
        if (g[i] == '\\') {
            if (++i == len) return "glob ends with a lone '\\'";
        } else if (g[i] == '[') {
            size_t j = i + 1;
            if (j < len && (g[j] == '!' || g[j] == '^')) j++;
            size_t first = j;
            while (j < len && (g[j] != ']' || j == first)) j += g[j] == '\\' ? 2 : 1;
            if (j >= len) return "glob with an unclosed '['";
            i = j;
        } else if (g[i] == '*' && i + 2 < len && g[i + 1] == '*' && g[i + 2] == '*') {
            return "glob with '***': use '*' within a segment or '**' for whole segments";
        }
    }
    return NULL;
}
