/* Path globs: segments, classes, '**' spanning directories, escapes, malformed patterns. */
#include <string.h>

#include "check.h"
#include "glob.h"

static void yes(const char *g, const char *p)
{
    CHECK(dps_glob_match(g, p, strlen(p)), "'%s' should match '%s'", g, p);
}
static void no(const char *g, const char *p)
{
    CHECK(!dps_glob_match(g, p, strlen(p)), "'%s' should not match '%s'", g, p);
}

int main(void)
{
    yes("*.ckpt", "model.ckpt");
    yes("*.ckpt", ".ckpt");
    no("*.ckpt", "model.ckpt.tmp");
    no("*.ckpt", "dir/model.ckpt"); /* '*' stays in its segment */
    yes("ckpt-?.bin", "ckpt-3.bin");
    no("ckpt-?.bin", "ckpt-10.bin");
    yes("ckpt-[0-9].bin", "ckpt-7.bin");
    no("ckpt-[!0-9].bin", "ckpt-7.bin");
    yes("ckpt-[^0-9].bin", "ckpt-x.bin");
    yes("a[]]b", "a]b");
    yes("checkpoints/**", "checkpoints/a.ckpt");
    yes("checkpoints/**", "checkpoints/x/y/z");
    no("checkpoints/**", "other/checkpoints/a");
    yes("**/*.log", "train.log");
    yes("**/*.log", "a/b/train.log");
    yes("a/**/b", "a/b");
    yes("a/**/b", "a/x/y/b");
    no("a/**/b", "a/xb");
    yes("/tmp/**/out", "/tmp/run/out");
    yes("\\*.txt", "*.txt");
    no("\\*.txt", "a.txt");
    yes("*", "anything");
    no("?", "");
    yes("", "");
    /* patterns that make a backtracking matcher take exponential time finish at once */
    char path[201];
    memset(path, 'a', 200), path[200] = '\0';
    no("*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*b", path);
    no("**/**/**/**/**/**/**/**/**/b", "a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/c");
    yes("**/**/x", "x");
    yes("a/**", "a/");
    no("a/**", "a");
    CHECK(dps_glob_check("*.ckpt", 6) == NULL, "valid glob rejected");
    CHECK(dps_glob_check("ckpt[0-9", 8) != NULL, "unclosed class accepted");
    CHECK(dps_glob_check("a\\", 2) != NULL, "lone backslash accepted");
    CHECK(dps_glob_check("***", 3) != NULL, "*** accepted");
    CHECK(dps_glob_check("", 0) != NULL, "empty glob accepted");
    CHECK(dps_glob_check("[]]", 3) == NULL, "']' first in a class rejected");
    return check_report("test_glob");
}
