/* Which GPU a local rank takes (see bind.h): pure, so unit tests call it with any counts. */
#include <stdio.h>
#include <string.h>

#include "bind.h"

/* Entry k of a comma-separated list, spaces trimmed; its length, or -1 past the end. */
static int list_entry(const char *list, int k, const char **start)
{
    const char *p = list;
    for (int i = 0;; i++) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        while (len && (*p == ' ' || *p == '\t'))
            p++, len--;
        while (len && (p[len - 1] == ' ' || p[len - 1] == '\t'))
            len--;
        if (i == k) {
            *start = p;
            return (int)len;
        }
        if (!end) return -1;
        p = end + 1;
    }
}

static int list_count(const char *list)
{
    const char *s;
    int n = 0;
    while (list_entry(list, n, &s) >= 0)
        n++;
    return n;
}

int dps_gpu_pick(const char *user_list, int ngpus, int local_rank, int local_size, char *out, size_t outlen,
                 int *shared)
{
    *shared = 0;
    if (local_rank < 0 || local_size < 1) return 0;
    int n;
    if (user_list) {
        /* "" or a list whose first entry is empty hides every GPU: nothing to pick from */
        const char *first;
        if (list_entry(user_list, 0, &first) <= 0) return 0;
        n = list_count(user_list);
        const char *e;
        int len = list_entry(user_list, local_rank % n, &e);
        if (len <= 0) return 0; /* an empty entry: CUDA stops reading the list there */
        snprintf(out, outlen, "%.*s", len, e);
    } else {
        n = ngpus;
        if (n <= 0) return 0;
        snprintf(out, outlen, "%d", local_rank % n);
    }
    *shared = local_size > n;
    return n;
}
