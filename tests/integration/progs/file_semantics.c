/* What a program sees of its rank0_only files: every call's outcome (success or errno) and what
 * it reads back, written to REPORT.rankN, for each case that ordinary programs meet (modes,
 * symbolic links, '..' through a link, exclusive creation, missing files and directories,
 * fsync/ftruncate/fallocate/mmap, O_TMPFILE + linkat, the save-to-temporary-then-rename idiom,
 * reading back what was just saved, a forked child that leaves with _exit, ...).
 *   file_semantics DIR REPORT [early | full]
 * (DIR holds an empty ckpts/; policy files/semantics.conf). early: the cases come before the
 * job's first collective, as in a program that prepares its folders before it trains. full:
 * only formatted and character writes through stdio, each result, on a disk too small for them.
 * Run alone without the shim, then under mpirun with it: every rank's report must equal the
 * run alone's, and DIR must end as the run alone leaves it (files.bats). Each rank writes its
 * rank into what it saves, so a file written by another rank than 0 shows. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define DPSHIM_HOOKS_WEAK
#include <dpshim/hooks.h>

static FILE *report;
static int rank;

/* A training step between two saves (a collective under the shim): rank 0 cannot save again
 * before every rank has read the last save back. */
static void train_step(void)
{
    double loss = 1;
    if (dp_metric) dp_metric(&loss, 1, DP_SUM);
}

/* "what: ok" or "what: <errno text>" */
static void note(const char *what, long rc)
{
    fprintf(report, "%s: %s\n", what, rc < 0 ? strerror(errno) : "ok");
}

/* The file's mode and content as this process reads them now. */
static void show(const char *path)
{
    char buf[256] = "";
    struct stat st;
    int fd = open(path, O_RDONLY);
    ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
    if (fd >= 0) close(fd);
    if (n < 0) {
        fprintf(report, "  %s: %s\n", path, strerror(errno));
        return;
    }
    buf[n] = '\0';
    for (ssize_t i = 0; i < n; i++)
        if (buf[i] == '\n' || buf[i] == '\0') buf[i] = '|';
    fprintf(report, "  %s: mode %o, \"%s\"\n", path,
            stat(path, &st) == 0 ? (unsigned)(st.st_mode & 07777) : 0u, buf);
}

/* Creates (or truncates) path with `text by rank R`. */
static long save(const char *path, int flags, mode_t mode, const char *text)
{
    int fd = open(path, flags, mode);
    if (fd < 0) return -1;
    char line[128];
    int n = snprintf(line, sizeof line, "%s by rank %d", text, rank);
    long rc = write(fd, line, (size_t)n) == n ? 0 : -1;
    return close(fd) == 0 ? rc : -1;
}

static void modes_and_links(void)
{
    note("create 0600", save("ckpts/m.ckpt", O_CREAT | O_WRONLY | O_TRUNC, 0600, "v1"));
    FILE *f = fopen("ckpts/m.ckpt", "w");
    note("fopen w over it", f ? 0 : -1);
    if (f) fprintf(f, "v2 by rank %d", rank), fclose(f);
    show("ckpts/m.ckpt");

    note("save run7", save("ckpts/run7.ckpt", O_CREAT | O_WRONLY | O_TRUNC, 0644, "old"));
    note("symlink latest -> run7", symlink("run7.ckpt", "ckpts/latest.ckpt"));
    note("symlink again", symlink("run7.ckpt", "ckpts/latest.ckpt"));
    note("save through the link", save("ckpts/latest.ckpt", O_WRONLY | O_TRUNC, 0, "new"));
    struct stat st;
    note("lstat latest", lstat("ckpts/latest.ckpt", &st));
    fprintf(report, "  latest is a link: %d\n", S_ISLNK(st.st_mode));
    show("ckpts/run7.ckpt");

    note("mkdir other", mkdir("ckpts/other", 0755));
    note("mkdir other/deep", mkdir("ckpts/other/deep", 0755));
    note("symlink lnk -> other/deep", symlink("other/deep", "ckpts/lnk"));
    note("save lnk/../m2", save("ckpts/lnk/../m2.ckpt", O_CREAT | O_WRONLY | O_TRUNC, 0644, "m2"));
    note("access other/m2", access("ckpts/other/m2.ckpt", F_OK));
    note("access m2 (not where the kernel put it)", access("ckpts/m2.ckpt", F_OK));
}

static void errors(void)
{
    note("O_TRUNC without O_CREAT, missing", open("ckpts/missing.bin", O_WRONLY | O_TRUNC));
    note("access missing", access("ckpts/missing.bin", F_OK));
    char name[300];
    snprintf(name, sizeof name, "ckpts/%0241d.bin", 7); /* a 245-character name */
    note("245-character name", save(name, O_CREAT | O_WRONLY | O_TRUNC, 0644, "long"));
    show(name);
    note("O_EXCL new", save("ckpts/x", O_CREAT | O_EXCL | O_WRONLY, 0644, "x"));
    note("O_EXCL existing", open("ckpts/x", O_CREAT | O_EXCL | O_WRONLY, 0644));
    note("O_CREAT in a missing directory", open("ckpts/nodir/f", O_CREAT | O_WRONLY, 0644));
    note("O_RDONLY, missing", open("ckpts/missing.bin", O_RDONLY));
    FILE *r = fopen("ckpts/missing.bin", "r");
    note("fopen r, missing", r ? 0 : -1);
    if (r) fclose(r);
    FILE *f = fopen("ckpts/x", "wx");
    note("fopen wx existing", f ? 0 : -1);
    if (f) fclose(f);
    f = fopen("ckpts/y", "wx");
    note("fopen wx new", f ? 0 : -1);
    if (f) fprintf(f, "y by rank %d", rank), fclose(f);
    note("open a directory for writing", open("ckpts/other", O_WRONLY));
}

static void like_a_file(void)
{
    int fd = open("ckpts/feat.bin", O_CREAT | O_RDWR | O_TRUNC, 0644);
    note("open O_RDWR", fd);
    note("write", write(fd, "abc", 3) == 3 ? 0 : -1);
    note("fsync", fsync(fd));
    note("fdatasync", fdatasync(fd));
    note("ftruncate 4096", ftruncate(fd, 4096));
    note("fallocate 8192", fallocate(fd, 0, 0, 8192));
    char *m = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    note("mmap shared", m == MAP_FAILED ? -1 : 0);
    if (m != MAP_FAILED) memcpy(m, "XYZ", 3), msync(m, 8192, MS_SYNC), munmap(m, 8192);
    char back[4] = "";
    note("pread", pread(fd, back, 3, 0) == 3 ? 0 : -1);
    struct stat st;
    note("fstat", fstat(fd, &st));
    fprintf(report, "  read back \"%s\", size %lld, end at %lld, mode %o\n", back, (long long)st.st_size,
            (long long)lseek(fd, 0, SEEK_END), (unsigned)(st.st_mode & 07777));
    note("close", close(fd));

    fd = open("ckpts/run7.ckpt", O_RDWR); /* an update in place reads what is there */
    memset(back, 0, sizeof back);
    note("open O_RDWR existing", fd);
    note("read it", read(fd, back, 3) == 3 ? 0 : -1);
    fprintf(report, "  read \"%s\"\n", back);
    if (fd >= 0) close(fd);
    note("chmod run7 0604", chmod("ckpts/run7.ckpt", 0604));
    fd = open("ckpts/run7.ckpt", O_WRONLY | O_APPEND);
    note("open O_APPEND existing", fd);
    st.st_mode = 0;
    fstat(fd, &st);
    fprintf(report, "  end at %lld, mode %o\n", (long long)lseek(fd, 0, SEEK_END),
            (unsigned)(st.st_mode & 07777));
    if (fd >= 0) close(fd);
    /* a new file with a mode of its own: rank 0's gets it less the umask, and so must every rank's view */
    fd = open("ckpts/private.bin", O_CREAT | O_WRONLY | O_TRUNC, 0640);
    note("open 0640 new", fd);
    st.st_mode = 0;
    fstat(fd, &st);
    fprintf(report, "  mode %o\n", (unsigned)(st.st_mode & 07777));
    if (fd >= 0) close(fd);
}

static void tree_calls(void)
{
    note("mkdir d", mkdir("ckpts/d", 0755));
    note("rmdir d", rmdir("ckpts/d"));
    note("rmdir d again", rmdir("ckpts/d"));
    note("mkdir full", mkdir("ckpts/full", 0755));
    note("save full/f", save("ckpts/full/f", O_CREAT | O_WRONLY | O_TRUNC, 0644, "f"));
    note("rmdir full", rmdir("ckpts/full"));
    note("link x x2", link("ckpts/x", "ckpts/x2"));
    note("link x x2 again", link("ckpts/x", "ckpts/x2"));
    note("unlink x2", unlink("ckpts/x2"));
    note("unlink x2 again", unlink("ckpts/x2"));
    note("access x2", access("ckpts/x2", F_OK));
    note("truncate x 10", truncate("ckpts/x", 10));
    note("chmod x 640", chmod("ckpts/x", 0640));
    struct stat st;
    note("stat x", stat("ckpts/x", &st));
    fprintf(report, "  size %lld mode %o\n", (long long)st.st_size, (unsigned)(st.st_mode & 07777));
    note("rename y z", rename("ckpts/y", "ckpts/z"));
    note("rename y z again", rename("ckpts/y", "ckpts/z"));
    show("ckpts/z");
}

static void save_idioms(void)
{
    /* O_TMPFILE, named by linkat once complete */
    int fd = open("ckpts", O_TMPFILE | O_WRONLY, 0644);
    note("O_TMPFILE", fd);
    char line[64], proc[64];
    int n = snprintf(line, sizeof line, "tmpfile by rank %d", rank);
    note("write it", write(fd, line, (size_t)n) == n ? 0 : -1);
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    note("linkat to tmpf.ckpt", linkat(AT_FDCWD, proc, AT_FDCWD, "ckpts/tmpf.ckpt", AT_SYMLINK_FOLLOW));
    if (fd >= 0) close(fd);
    show("ckpts/tmpf.ckpt");

    /* a fixed temporary name, renamed over the checkpoint, as most save functions do */
    for (int i = 0; i < 5; i++) {
        char text[32];
        snprintf(text, sizeof text, "weights %d", i);
        note("save ckpts/save.tmp", save("ckpts/save.tmp", O_CREAT | O_WRONLY | O_TRUNC, 0644, text));
        note("rename ckpts/save.tmp ckpt.pt", rename("ckpts/save.tmp", "ckpt.pt"));
        note("access ckpt.pt", access("ckpt.pt", F_OK));
        show("ckpt.pt");
        train_step();
    }
    show("ckpt.pt");
}

/* Save, then load, as "save best, reload best" does: the load sees this save. */
static void read_after_write(void)
{
    for (int i = 1; i <= 20; i++) {
        FILE *f = fopen("ckpts/rw.bin", "w");
        if (f) fprintf(f, "version %d by rank %d", i, rank), fclose(f);
        char buf[64] = "";
        f = fopen("ckpts/rw.bin", "r");
        if (f) {
            if (!fgets(buf, sizeof buf, f)) buf[0] = '\0';
            fclose(f);
        }
        fprintf(report, "read after write %d: \"%s\"\n", i, buf);
        train_step();
    }
}

static void children(void)
{
    note("mkdir logs", mkdir("ckpts/logs", 0755));
    FILE *f = fopen("ckpts/logs/train.log", "a"); /* per_rank, inside a rank0_only directory */
    note("per_rank log in it", f ? 0 : -1);
    if (f) fclose(f);
    fflush(report);
    pid_t pid = fork();
    if (pid == 0) { /* a checkpoint process that leaves without closing */
        int fd = open("ckpts/child.ckpt", O_CREAT | O_WRONLY | O_TRUNC, 0644);
        char line[64];
        int n = snprintf(line, sizeof line, "child by rank %d", rank);
        if (fd < 0 || write(fd, line, (size_t)n) != n) _exit(1);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    fprintf(report, "child exited %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    show("ckpts/child.ckpt");
}

static int paired_vfprintf(FILE *f, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int r = vfprintf(f, fmt, ap);
    va_end(ap);
    return r;
}

/* Formatted and character writes to a gated stream where the disk fills: each call's result,
 * errno and the stream's error indicator (the same on every rank as alone), then fclose's. */
static void stdio_on_full_disk(void)
{
    FILE *f = fopen("ckpts/stdio.bin", "w");
    note("fopen stdio.bin", f ? 0 : -1);
    if (!f) return;
    char line[3001];
    memset(line, 'x', 3000);
    line[3000] = '\0';
#ifdef __OPTIMIZE__
    enum { KINDS = 4 }; /* optimized, the _unlocked forms are inline stores into the buffer */
#else
    enum { KINDS = 6 };
#endif
    for (int i = 0; i < 48; i++) {
        int r = 0;
        errno = 0;
        switch (i % KINDS) {
        case 0:
            r = fprintf(f, "%d %s\n", i, line);
            break;
        case 1:
            r = paired_vfprintf(f, "%d %s\n", i, line);
            break;
        case 2:
            r = fputc('c', f);
            break;
        case 3:
            r = putc('p', f);
            break;
        case 4:
            r = fputc_unlocked('C', f);
            break;
        case 5:
            r = putc_unlocked('P', f);
            break;
        }
        fprintf(report, "call %d: %d %s, error indicator %d\n", i, r, r < 0 ? strerror(errno) : "ok",
                ferror(f) != 0);
    }
    note("fclose stdio.bin", fclose(f));
}

int main(int argc, char **argv)
{
    const char *mode = argc == 4 ? argv[3] : "";
    if ((argc != 3 && argc != 4) || (argc == 4 && strcmp(mode, "early") && strcmp(mode, "full"))) {
        fprintf(stderr, "usage: file_semantics DIR REPORT [early | full]\n");
        return 2;
    }
    rank = dp_rank ? dp_rank() : 0;
    char path[4096];
    snprintf(path, sizeof path, "%s.rank%d", argv[2], rank);
    if (!(report = fopen(path, "w")) || chdir(argv[1]) != 0) {
        perror(argv[1]);
        return 1;
    }
    if (!strcmp(mode, "full")) {
        mkdir("ckpts", 0755); /* on the small disk mounted at DIR: made by every rank, not noted */
        train_step();
        stdio_on_full_disk();
        fprintf(report, "done\n");
        return fclose(report) == 0 ? 0 : 1;
    }
    if (!strcmp(mode, "early"))
        children(); /* a folder prepared, and a log in it, before anything else */
    else
        train_step(); /* a trainer's first collective (its parameters from rank 0) comes before it saves */
    modes_and_links();
    errors();
    like_a_file();
    tree_calls();
    save_idioms();
    read_after_write();
    if (strcmp(mode, "early")) children();
    fprintf(report, "done\n");
    return fclose(report) == 0 ? 0 : 1;
}
