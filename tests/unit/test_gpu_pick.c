/* [gpu] bind at the logic level: which CUDA_VISIBLE_DEVICES each local rank gets, for several
 * GPU counts and user lists (no GPU needed). */
#include <string.h>

#include "bind.h"
#include "check.h"

/* Every local rank of a node with `ngpus` devices (or the user's list), joined with '|'. */
static const char *node(const char *user, int ngpus, int local_size, int *n_out, int *shared_out)
{
    static char all[1024];
    all[0] = '\0';
    for (int r = 0; r < local_size; r++) {
        char pick[64] = "-";
        int shared;
        *n_out = dps_gpu_pick(user, ngpus, r, local_size, pick, sizeof pick, &shared);
        if (r == 0) *shared_out = shared;
        CHECK(shared == *shared_out, "ranks disagree on sharing");
        if (r) strcat(all, "|");
        strcat(all, pick);
    }
    return all;
}

static void expect(const char *user, int ngpus, int local_size, const char *want, int want_n, int want_shared)
{
    int n = -1, shared = -1;
    const char *got = node(user, ngpus, local_size, &n, &shared);
    CHECK(!strcmp(got, want) && n == want_n && shared == want_shared,
          "user '%s', %d GPUs, %d local ranks: got %s (n=%d shared=%d), want %s (n=%d shared=%d)",
          user ? user : "(unset)", ngpus, local_size, got, n, shared, want, want_n, want_shared);
}

int main(void)
{
    /* no list: local rank r takes device r, round robin when ranks outnumber devices */
    expect(NULL, 8, 8, "0|1|2|3|4|5|6|7", 8, 0);
    expect(NULL, 8, 4, "0|1|2|3", 8, 0);
    expect(NULL, 4, 2, "0|1", 4, 0);
    expect(NULL, 2, 4, "0|1|0|1", 2, 1);
    expect(NULL, 1, 4, "0|0|0|0", 1, 1);
    expect(NULL, 1, 1, "0", 1, 0);
    /* no GPU at all: nothing is bound, the variable stays as it was */
    expect(NULL, 0, 4, "-|-|-|-", 0, 0);
    /* the user's list is the node's device set, in the user's order */
    expect("2,3", 8, 2, "2|3", 2, 0);
    expect("3,1", 0, 4, "3|1|3|1", 2, 1);
    expect(" 5 , 4 ,6", 8, 3, "5|4|6", 3, 0);
    expect("GPU-8a1e0c2f,GPU-77b2", 2, 2, "GPU-8a1e0c2f|GPU-77b2", 2, 0);
    expect("MIG-1a2b", 1, 2, "MIG-1a2b|MIG-1a2b", 1, 1);
    expect("7", 8, 1, "7", 1, 0);
    /* an empty list hides every GPU: nothing to bind */
    expect("", 8, 4, "-|-|-|-", 0, 0);
    expect(" ,1", 8, 2, "-|-", 0, 0);
    /* bad arguments pick nothing */
    int shared;
    char out[8] = "x";
    CHECK(dps_gpu_pick(NULL, 4, -1, 2, out, sizeof out, &shared) == 0 && !strcmp(out, "x"), "negative rank");
    CHECK(dps_gpu_pick(NULL, 4, 0, 0, out, sizeof out, &shared) == 0, "no local ranks");
    return check_report("test_gpu_pick");
}
