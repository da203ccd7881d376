/* dpnn-ckpt: compares two dpnn checkpoints, the way the tests judge "same weights".
 *   dpnn-ckpt diff A B [TOL]  prints max|a-b| / max|a| over all tensors; with TOL, exit 1 above it
 *   dpnn-ckpt same A B        exit 0 only when every value is bitwise identical */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/dpnn.h"

int main(int argc, char **argv)
{
    if (argc < 4 || (strcmp(argv[1], "diff") && strcmp(argv[1], "same"))) {
        fprintf(stderr, "usage: dpnn-ckpt diff A B [TOL] | dpnn-ckpt same A B\n");
        return 2;
    }
    char err[8192];
    dpnn_ckpt_tensor_t *a, *b;
    size_t na, nb;
    if (dpnn_ckpt_read(argv[2], &a, &na, err, sizeof err) ||
        dpnn_ckpt_read(argv[3], &b, &nb, err, sizeof err)) {
        fprintf(stderr, "dpnn-ckpt: %s\n", err);
        return 2;
    }
    if (na != nb) {
        fprintf(stderr, "dpnn-ckpt: %zu tensors vs %zu\n", na, nb);
        return 2;
    }
    double max_diff = 0, max_abs = 0;
    const char *worst = "";
    size_t differing = 0;
    for (size_t i = 0; i < na; i++) {
        if (strcmp(a[i].name, b[i].name) || a[i].count != b[i].count) {
            fprintf(stderr, "dpnn-ckpt: tensor %zu differs in name or size (%s vs %s)\n", i, a[i].name,
                    b[i].name);
            return 2;
        }
        for (uint64_t j = 0; j < a[i].count; j++) {
            double d = fabs((double)a[i].data[j] - (double)b[i].data[j]);
            if (memcmp(&a[i].data[j], &b[i].data[j], sizeof(float))) differing++;
            if (d > max_diff || isnan(d)) max_diff = isnan(d) ? INFINITY : d, worst = a[i].name;
            if (fabs(a[i].data[j]) > max_abs) max_abs = fabs(a[i].data[j]);
        }
    }
    double rel = max_abs > 0 ? max_diff / max_abs : max_diff;
    printf("max_abs_diff %.3e max_abs %.3e rel %.3e differing_values %zu%s%s\n", max_diff, max_abs, rel,
           differing, differing ? " worst " : "", differing ? worst : "");
    if (!strcmp(argv[1], "same")) return differing ? 1 : 0;
    return argc > 4 && rel > strtod(argv[4], NULL) ? 1 : 0;
}
