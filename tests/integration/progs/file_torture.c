/* Every file entry point the shim wraps, on paths the policy gates and on paths it does not.
 *   file_torture gated DIR   (under mpirun, policy from files_torture.conf): each rank runs
 *       every call on the same shared DIR; the bats test then checks what is on disk.
 *   file_torture threads DIR 8 threads writing gated and per-rank files at the same time.
 *   file_torture errno DIR   every call on unmatched paths, printing "call rc errno" lines, so
 *       a run with the shim can be compared with one without.
 * Built twice: plainly, and with -O2 -D_FORTIFY_SOURCE=2 -D_FILE_OFFSET_BITS=64, where the
 * headers route the same source to __open_2, open64, fopen64, truncate64 and friends. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DPSHIM_HOOKS_WEAK
#include <dpshim/hooks.h>

static int rank, failures;
/* not a constant: a fortified open(path, flags) without a mode then calls __open_2 */
static volatile int read_only = O_RDONLY;

static void fail(const char *what)
{
    fprintf(stderr, "file_torture rank %d: %s: %s\n", rank, what, strerror(errno));
    failures++;
}

/* Writes "<tag> by rank R\n" to fd and closes it; a sink must accept the write. */
static void put(int fd, const char *tag)
{
    char line[128];
    int n = snprintf(line, sizeof line, "%s by rank %d\n", tag, rank);
    if (fd < 0) return fail(tag);
    if (write(fd, line, (size_t)n) != n) fail(tag);
    if (close(fd) != 0) fail(tag);
}

static void fput(FILE *f, const char *tag)
{
    if (!f) return fail(tag);
    if (fprintf(f, "%s by rank %d\n", tag, rank) < 0) fail(tag);
    if (fclose(f) != 0) fail(tag);
}

static void gated(const char *dir)
{
    if (chdir(dir) != 0) return fail("chdir");
    int dfd = open(".", O_RDONLY | O_DIRECTORY);
    /* rank0_only = *.ckpt, ckpts and everything below it: one copy, rank 0's */
    put(open("open.ckpt", O_WRONLY | O_CREAT | O_TRUNC, 0644), "open");
    put(open64("open64.ckpt", O_WRONLY | O_CREAT | O_TRUNC, 0644), "open64");
    put(openat(dfd, "openat.ckpt", O_WRONLY | O_CREAT | O_TRUNC, 0644), "openat");
    put(openat64(dfd, "openat64.ckpt", O_RDWR | O_CREAT | O_TRUNC, 0644), "openat64");
    put(creat("creat.ckpt", 0644), "creat");
    put(creat64("creat64.ckpt", 0644), "creat64");
    put(open("excl.ckpt", O_WRONLY | O_CREAT | O_EXCL, 0644), "excl");
    fput(fopen("fopen.ckpt", "w"), "fopen");
    fput(fopen64("fopen64.ckpt", "wb"), "fopen64");
    fput(freopen("freopen.ckpt", "w", fopen("/dev/null", "w")), "freopen");
    fput(freopen64("freopen64.ckpt", "w", fopen("/dev/null", "w")), "freopen64");
    FILE *ap = fopen("append.ckpt", "a");
    fput(ap, "append");
    if (mkdir("ckpts", 0755) != 0 && errno != EEXIST) fail("mkdir");
    if (mkdirat(dfd, "ckpts/sub", 0755) != 0 && errno != EEXIST) fail("mkdirat");
    put(open("ckpts/sub/x.bin", O_WRONLY | O_CREAT | O_TRUNC, 0644), "ckpts/sub/x.bin");
    put(open("ckpts", O_TMPFILE | O_WRONLY, 0600), "tmpfile");
    /* a rank's own temporary renamed over a gated name: rank 0's lands, the others vanish */
    char tmp[64];
    snprintf(tmp, sizeof tmp, "rename.%d.tmp", rank);
    put(open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644), "rename");
    if (rename(tmp, "rename.ckpt") != 0) fail("rename");
    snprintf(tmp, sizeof tmp, "renameat.%d.tmp", rank);
    put(open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644), "renameat");
    if (renameat(dfd, tmp, dfd, "renameat.ckpt") != 0) fail("renameat");
    snprintf(tmp, sizeof tmp, "renameat2.%d.tmp", rank);
    put(open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644), "renameat2");
    if (renameat2(dfd, tmp, dfd, "renameat2.ckpt", 0) != 0) fail("renameat2");
    /* removals of gated paths: rank 0 removes, the others succeed without effect */
    put(open("gone.ckpt", O_WRONLY | O_CREAT | O_TRUNC, 0644), "gone");
    put(open("gone2.ckpt", O_WRONLY | O_CREAT | O_TRUNC, 0644), "gone2");
    put(open("gone3.ckpt", O_WRONLY | O_CREAT | O_TRUNC, 0644), "gone3");
    if (dp_metric) {
        double x = 0;
        dp_metric(&x, 1, DP_SUM);
    } /* all created before removal */
    if (unlink("gone.ckpt") != 0) fail("unlink");
    if (unlinkat(dfd, "gone2.ckpt", 0) != 0) fail("unlinkat");
    if (remove("gone3.ckpt") != 0) fail("remove");
    put(open("trunc.ckpt", O_WRONLY | O_CREAT | O_TRUNC, 0644), "trunc-me");
    if (dp_metric) {
        double x = 0;
        dp_metric(&x, 1, DP_SUM);
    }
    if (truncate("trunc.ckpt", 5) != 0) fail("truncate");
    if (chmod("trunc.ckpt", 0600) != 0) fail("chmod");
    /* per_rank = *.log: every rank its own file, reads included */
    put(open("train.log", O_WRONLY | O_CREAT | O_APPEND, 0644), "log");
    char want[64], got[64] = {0};
    snprintf(want, sizeof want, "log by rank %d\n", rank);
    int rfd = open("train.log", read_only); /* two arguments: __open_2 under fortify */
    if (rfd < 0 || read(rfd, got, sizeof got - 1) < 0 || strcmp(got, want) != 0) fail("per_rank read-back");
    if (rfd >= 0) close(rfd);
    rfd = openat(dfd, "train.log", read_only); /* __openat_2 under fortify */
    if (rfd < 0)
        fail("per_rank openat read");
    else
        close(rfd);
    /* unmatched paths are untouched: every rank writes its own */
    snprintf(tmp, sizeof tmp, "plain.%d.txt", rank);
    fput(fopen(tmp, "w"), "plain");
    close(dfd);
}

/* Threads writing gated and per-rank files at once: the publication table and the path
 * decisions must hold up; every file ends complete, no temporary is left behind. */
static void *thread_writer(void *arg)
{
    long t = (long)arg;
    for (int i = 0; i < 50; i++) {
        char path[64], line[64];
        snprintf(path, sizeof path, "t%ld.ckpt", t);
        FILE *f = fopen(path, "w");
        if (!f) return (void *)1;
        int n = snprintf(line, sizeof line, "thread %ld round %d by rank %d\n", t, i, rank);
        for (int k = 0; k < 100; k++)
            fwrite(line, 1, (size_t)n, f);
        if (fclose(f) != 0) return (void *)1;
        snprintf(path, sizeof path, "t%ld.log", t);
        int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd < 0 || write(fd, line, (size_t)n) != n || close(fd) != 0) return (void *)1;
    }
    return NULL;
}

static void threads(const char *dir)
{
    if (chdir(dir) != 0) return fail("chdir");
    pthread_t th[8];
    for (long t = 0; t < 8; t++)
        pthread_create(&th[t], NULL, thread_writer, (void *)t);
    for (int t = 0; t < 8; t++) {
        void *rc;
        pthread_join(th[t], &rc);
        if (rc) fail("thread");
    }
}

#define SHOW(call) report(#call, (long)(call))
static void report(const char *what, long rc)
{
    printf("%s rc=%d errno=%d\n", what, rc < 0 ? -1 : rc > 0 ? 1 : 0, rc < 0 ? errno : 0);
}

static void errno_mode(const char *dir)
{
    if (chdir(dir) != 0) return fail("chdir");
    errno = 4242; /* a successful call must leave errno alone */
    int fd = open("ok.txt", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    printf("open-ok errno_kept=%d\n", errno == 4242);
    close(fd);
    FILE *f = fopen("ok.txt", "r");
    printf("fopen-ok errno_kept=%d\n", errno == 4242);
    if (f) fclose(f);
    SHOW(open("missing/x.txt", O_WRONLY | O_CREAT, 0644));
    SHOW(open("missing.txt", read_only));
    SHOW(open64("missing.txt", O_RDONLY));
    SHOW(openat(-5, "missing.txt", O_RDONLY));
    SHOW(openat(AT_FDCWD, "missing.txt", read_only));
    SHOW(openat64(AT_FDCWD, "missing.txt", O_RDONLY));
    SHOW(creat("missing/x.txt", 0644));
    SHOW(creat64("missing/x.txt", 0644));
    SHOW(open("ok.txt", O_WRONLY | O_CREAT | O_EXCL, 0644));
    SHOW(fopen("missing/x.txt", "w") != NULL ? 1 : -1);
    SHOW(fopen64("missing.txt", "r") != NULL ? 1 : -1);
    SHOW(fopen(".", "w") != NULL ? 1 : -1);
    SHOW(rename("missing.txt", "other.txt"));
    SHOW(renameat(AT_FDCWD, "missing.txt", -5, "other.txt"));
    SHOW(renameat2(AT_FDCWD, "ok.txt", AT_FDCWD, "ok.txt", 1u << 5));
    SHOW(unlink("missing.txt"));
    SHOW(unlinkat(AT_FDCWD, "missing.txt", 0));
    SHOW(remove("missing.txt"));
    SHOW(mkdir(".", 0755));
    SHOW(mkdirat(-5, "d", 0755));
    SHOW(truncate("missing.txt", 0));
    SHOW(chmod("missing.txt", 0644));
    SHOW(mkdir("d", 0755));
    SHOW(rename("ok.txt", "d/ok.txt"));
    SHOW(unlink("d/ok.txt"));
    SHOW(unlinkat(AT_FDCWD, "d", AT_REMOVEDIR));
    SHOW(close(-1));
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: file_torture gated|errno DIR\n");
        return 2;
    }
    rank = dp_rank ? dp_rank() : 0;
    double one = 1; /* a job's first collective (a trainer's parameters from rank 0) comes before its files */
    if (dp_metric && strcmp(argv[1], "errno")) dp_metric(&one, 1, DP_SUM);
    if (!strcmp(argv[1], "gated"))
        gated(argv[2]);
    else if (!strcmp(argv[1], "threads"))
        threads(argv[2]);
    else
        errno_mode(argv[2]);
    if (failures) fprintf(stderr, "file_torture rank %d: %d failures\n", rank, failures);
    return failures ? 1 : 0;
}
