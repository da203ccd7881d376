/* Path globs for the file policy: '*' and '?' stay within one path segment, '[...]' is a
 * character class ('!' or '^' negates, ranges allowed), '\' escapes, and a segment that is
 * exactly '**' spans zero or more segments. Pure functions, unit-tested alone. */
#ifndef DPS_GLOB_H
#define DPS_GLOB_H

#include <stddef.h>

/* 1 when the whole of path[0..len) matches the whole pattern. */
int dps_glob_match(const char *pattern, const char *path, size_t len);

/* NULL when pattern (len bytes) is well formed, else what is wrong with it. */
const char *dps_glob_check(const char *pattern, size_t len);

#endif
