/* The file policy's decisions (shim/files/): lexical normalization, per-rank names, the glob
 * views of a path (basename, relative, absolute, from a dirfd), system paths, and the action
 * each open or modification gets on rank 0 and on another rank, down to atomic publication.
 * They pin today's behaviour for the file-policy redesign. The policy's globs and rank are
 * process-wide and only ever added to, so each configuration runs in a child process. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "diag/diag.h"
#include "files/files.h"

static char root[PATH_MAX]; /* the temporary working directory, as getcwd spells it */

static const char *action_name(dps_file_action_t a)
{
    static const char *const names[] = {"PASS", "LEAD", "FOLLOW"};
    return (unsigned)a < 3 ? names[a] : "?";
}

static int cur_rank; /* the rank configured last */

/* What a gated call does on the configured rank (of 4). */
static dps_file_action_t gated_action(void)
{
    return cur_rank == 0 ? DPS_FILE_LEAD : DPS_FILE_FOLLOW;
}

/* "<root>/rest" into a static ring of buffers, so several can be used in one call. */
static const char *at(const char *rest)
{
    static char ring[8][2 * PATH_MAX];
    static int next;
    char *b = ring[next++ % 8];
    snprintf(b, sizeof ring[0], "%s/%s", root, rest);
    return b;
}

static void configure(int rank, const char *rank0_only, const char *per_rank)
{
    dps_policy_t p;
    dps_error_t e = {{0}};
    char err[256] = "";
    dps_policy_init(&p);
    CHECK(dps_policy_set_value(&p, DPS_P_files_rank0_only, rank0_only, strlen(rank0_only), DPS_SRC_FILE, 1,
                               &e) == 0,
          "rank0_only '%s': %s", rank0_only, e.msg);
    CHECK(dps_policy_set_value(&p, DPS_P_files_per_rank, per_rank, strlen(per_rank), DPS_SRC_FILE, 2, &e) ==
              0,
          "per_rank '%s': %s", per_rank, e.msg);
    CHECK(dps_files_configure(&p, rank, 4, err, sizeof err) == 0, "configure: %s", err);
    cur_rank = rank;
    CHECK(atomic_load(&dps_files_on) == (*rank0_only || *per_rank), "dps_files_on");
    dps_policy_free(&p);
}

/* --- pure helpers -------------------------------------------------------------------------- */

static void norm(const char *src, const char *want)
{
    char out[DPS_PATH_BUF];
    dps_files_normalize(src, out, sizeof out);
    CHECK(strcmp(out, want) == 0, "normalize('%s') = '%s', want '%s'", src, out, want);
}

static void test_normalize(void)
{
    norm("./a//b/../c", "a/c"); /* the README's example */
    norm("/a/b/../c", "/a/c");
    norm("/a/./b/./", "/a/b");
    norm("a//b////c", "a/b/c");
    norm("a/b/", "a/b");
    norm("/", "/");
    norm("//", "/");
    norm("/..", "/");
    norm("/../a", "/a");
    norm("/a/b/../../..", "/");
    norm("", ".");
    norm(".", ".");
    norm("./", ".");
    norm("a/..", ".");
    norm("../a", "../a");
    norm("a/../../b", "../b");
    norm("../../a/..", "../..");
    norm("../a/../..", "../..");
    norm("a/.../b", "a/.../b"); /* only '.' and '..' are special */
    norm("..a/b../.b", "..a/b../.b");
    /* a small buffer: cut, terminated, nothing written past it */
    char out[16];
    memset(out, 'X', sizeof out);
    dps_files_normalize("/abc/def/ghi", out, 6);
    CHECK(memchr(out, '\0', 6) != NULL, "normalize overflowed a 6-byte buffer");
    CHECK(out[6] == 'X', "normalize wrote past its 6-byte buffer");
}

static void rank_name(const char *path, const char *want)
{
    char out[DPS_PATH_BUF];
    dps_files_rank_path(path, out, sizeof out);
    CHECK(strcmp(out, want) == 0, "rank_path('%s') = '%s', want '%s'", path, out, want);
}

/* With the configured rank (3 in the child that calls it). */
static void test_rank_path_3(void)
{
    rank_name("train.log", "train.rank3.log");
    rank_name("logs/out", "logs/out.rank3");
    rank_name(".bashrc", ".bashrc.rank3");
    rank_name("a.tar.gz", "a.tar.rank3.gz"); /* before the last extension */
    rank_name("run.v2/out", "run.v2/out.rank3");
    rank_name("run.v2/train.log", "run.v2/train.rank3.log");
    rank_name("/x.y/z.w/.hidden", "/x.y/z.w/.hidden.rank3");
    rank_name("./a.b/c", "./a.b/c.rank3");
    char out[16];
    memset(out, 'X', sizeof out);
    dps_files_rank_path("abcdef.log", out, 8);
    CHECK(memchr(out, '\0', 8) != NULL && out[8] == 'X', "rank_path overflowed an 8-byte buffer");
}

/* --- classification and naming ------------------------------------------------------------- */

static void expect_name(int dirfd, const char *path, const char *want)
{
    dps_redirect_t r;
    dps_files_path(&r, DPS_FOP_LOOKUP, dirfd, path);
    CHECK(r.action == DPS_FILE_PASS, "lookup %s: %s", path, action_name(r.action));
    CHECK(strcmp(r.path, want) == 0, "lookup %s: '%s', want '%s'", path, r.path, want);
    CHECK(!r.gated, "lookup %s: a per-rank path is gated", path);
}

static void expect_gated(int dirfd, const char *path, int want)
{
    dps_redirect_t r;
    dps_files_path(&r, DPS_FOP_LOOKUP, dirfd, path);
    CHECK(r.gated == want, "%s (dirfd %d): gated %d, want %d", path, dirfd, r.gated, want);
    CHECK(r.path == path, "%s: a lookup of a path that is not per-rank changed it to '%s'", path, r.path);
    dps_file_action_t a = want ? gated_action() : DPS_FILE_PASS;
    CHECK(r.action == a, "lookup %s: %s, want %s", path, action_name(r.action), action_name(a));
}

static int opendir_fd(const char *rest)
{
    return open(at(rest), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

/* Policy of the rank children: rank 0 only, a basename, a relative and an absolute glob; per
 * rank, basename globs (one with an extension, two without) and a relative one. */
static void configure_main(int rank)
{
    char globs[2 * PATH_MAX];
    snprintf(globs, sizeof globs, "*.ckpt ckpt/** %s/abs/*.bin", root);
    configure(rank, globs, "*.log out .bashrc logs.d/**");
}

static void test_naming(int rank)
{
    char want[64];
    uint_fast64_t before = atomic_load(&dps_diag_count.rank_paths);
#define NAMED(path, fmt)                                                                                     \
    do {                                                                                                     \
        snprintf(want, sizeof want, fmt, rank);                                                              \
        expect_name(AT_FDCWD, path, want);                                                                   \
    } while (0)
    NAMED("train.log", "train.rank%d.log");
    NAMED("logs/out", "logs/out.rank%d");
    NAMED(".bashrc", ".bashrc.rank%d");
    NAMED("run.v2/train.log", "run.v2/train.rank%d.log");
    NAMED("a.b.c/out", "a.b.c/out.rank%d");
    NAMED("/far/x.y/train.log", "/far/x.y/train.rank%d.log");
    NAMED("archive.tar.log", "archive.tar.rank%d.log");
    NAMED("./train.log", "./train.rank%d.log"); /* the program's spelling is kept */
    NAMED("logs.d/x", "logs.d/x.rank%d");       /* relative per_rank glob, dotted directory */
    NAMED("logs.d/sub.v1/data", "logs.d/sub.v1/data.rank%d");
    NAMED("./logs.d//run/../data", "./logs.d//run/../data.rank%d");
    /* per_rank wins over rank0_only: the file is no longer shared */
    NAMED("ckpt/train.log", "ckpt/train.rank%d.log");
    NAMED("m.ckpt/train.log", "m.ckpt/train.rank%d.log");
#undef NAMED
    CHECK(atomic_load(&dps_diag_count.rank_paths) - before == 13, "rank_paths counted %llu",
          (unsigned long long)(atomic_load(&dps_diag_count.rank_paths) - before));
    int dfd = opendir_fd("other");
    snprintf(want, sizeof want, "train.rank%d.log", rank);
    expect_name(dfd, "train.log", want); /* the dirfd stays the caller's */
    close(dfd);
    /* not per-rank */
    expect_gated(AT_FDCWD, "train.log.bak", 0);
    expect_gated(AT_FDCWD, "outx", 0);
    expect_gated(AT_FDCWD, "logs.d", 0);
    expect_gated(AT_FDCWD, "other/logs.d/x", 0);
    /* opens and modifications of per-rank paths: the mapped path, on every rank */
    dps_redirect_t r;
    dps_files_open(&r, AT_FDCWD, "ckpt/train.log", O_WRONLY | O_CREAT | O_TRUNC);
    snprintf(want, sizeof want, "ckpt/train.rank%d.log", rank);
    CHECK(r.action == DPS_FILE_PASS && strcmp(r.path, want) == 0 && r.flags == (O_WRONLY | O_CREAT | O_TRUNC),
          "open of a per-rank path: %s %s %#x", action_name(r.action), r.path, r.flags);
    dps_files_path(&r, DPS_FOP_UNLINK, AT_FDCWD, "ckpt/train.log");
    CHECK(r.action == DPS_FILE_PASS && strcmp(r.path, want) == 0, "modify of a per-rank path: %s %s",
          action_name(r.action), r.path);
}

static void test_classify(void)
{
    /* basename glob *.ckpt: any directory */
    expect_gated(AT_FDCWD, "m.ckpt", 1);
    expect_gated(AT_FDCWD, "./m.ckpt", 1);
    expect_gated(AT_FDCWD, "a/b/m.ckpt", 1);
    expect_gated(AT_FDCWD, "../m.ckpt", 1);
    expect_gated(AT_FDCWD, "/far/away/m.ckpt", 1);
    expect_gated(AT_FDCWD, "m.ckpt.tmp", 0);
    expect_gated(AT_FDCWD, "m.ckptx", 0);
    expect_gated(AT_FDCWD, "dir.ckpt/file", 0);
    /* relative glob "ckpt/" "**": the path relative to the working directory, normalized */
    expect_gated(AT_FDCWD, "ckpt/a", 1);
    expect_gated(AT_FDCWD, "ckpt/x/y", 1);
    expect_gated(AT_FDCWD, "./ckpt/a", 1);
    expect_gated(AT_FDCWD, "ckpt/./a", 1);
    expect_gated(AT_FDCWD, "ckpt//a", 1);
    expect_gated(AT_FDCWD, ".//ckpt///a", 1);
    expect_gated(AT_FDCWD, "other/../ckpt/a", 1);
    expect_gated(AT_FDCWD, "other/x/../../ckpt/a", 1);
    expect_gated(AT_FDCWD, "ckpt/sub/", 1);
    expect_gated(AT_FDCWD, at("ckpt/a"), 1); /* absolute, under the working directory */
    expect_gated(AT_FDCWD, at("other/../ckpt/a"), 1);
    expect_gated(AT_FDCWD, "other/ckpt/a", 0);
    expect_gated(AT_FDCWD, "../ckpt/a", 0); /* outside the working directory */
    expect_gated(AT_FDCWD, at("../ckpt/a"), 0);
    expect_gated(AT_FDCWD, "ckptx/a", 0);
    char sibling[2 * PATH_MAX]; /* "<root>-ckpt/a": the working directory's name is only its prefix */
    snprintf(sibling, sizeof sibling, "%s-ckpt/a", root);
    expect_gated(AT_FDCWD, sibling, 0);
    expect_gated(AT_FDCWD, "ckpt", 0); /* the glob needs something below ckpt */
    expect_gated(AT_FDCWD, "ckpt/a/..", 0);
    /* absolute glob "<root>/abs/" "*.bin" */
    expect_gated(AT_FDCWD, at("abs/x.bin"), 1);
    expect_gated(AT_FDCWD, "abs/x.bin", 1);
    expect_gated(AT_FDCWD, "./abs//x.bin", 1);
    expect_gated(AT_FDCWD, "abs/sub/../x.bin", 1);
    expect_gated(AT_FDCWD, at("/abs/./x.bin"), 1); /* "<root>//abs/./x.bin" */
    expect_gated(AT_FDCWD, at("other/../abs/x.bin"), 1);
    expect_gated(AT_FDCWD, at("abs/sub/x.bin"), 0);
    expect_gated(AT_FDCWD, "abs/x.bin.bak", 0);
    expect_gated(AT_FDCWD, at("abs"), 0);
    expect_gated(AT_FDCWD, "other/abs/x.bin", 0);
    expect_gated(AT_FDCWD, "/abs/x.bin", 0);
    /* openat-style: relative to a directory descriptor */
    int droot = opendir_fd("."), dckpt = opendir_fd("ckpt"), dother = opendir_fd("other"),
        dabs = opendir_fd("abs");
    CHECK(droot >= 0 && dckpt >= 0 && dother >= 0 && dabs >= 0, "opening the test directories");
    expect_gated(dckpt, "a", 1);
    expect_gated(dckpt, "./sub//b", 1);
    expect_gated(droot, "ckpt/a", 1);
    expect_gated(dother, "../ckpt/a", 1);
    expect_gated(dother, "ckpt/a", 0);
    expect_gated(dabs, "x.bin", 1);
    expect_gated(dabs, "sub/../x.bin", 1);
    expect_gated(dother, "x.bin", 0);
    expect_gated(dother, "m.ckpt", 1);
    expect_gated(dother, at("abs/x.bin"), 1); /* an absolute path ignores the dirfd */
    expect_gated(dckpt, at("other/a"), 0);
    close(droot), close(dckpt), close(dother), close(dabs);
    /* nothing to decide */
    dps_redirect_t r;
    dps_files_path(&r, DPS_FOP_LOOKUP, AT_FDCWD, "");
    CHECK(r.action == DPS_FILE_PASS && !r.gated && r.path && !*r.path, "empty path");
    dps_files_path(&r, DPS_FOP_LOOKUP, AT_FDCWD, NULL);
    CHECK(r.action == DPS_FILE_PASS && !r.gated && r.path == NULL, "NULL path");
    dps_files_open(&r, AT_FDCWD, NULL, O_WRONLY | O_CREAT);
    CHECK(r.action == DPS_FILE_PASS && r.path == NULL, "open of a NULL path");
}

/* Paths under /dev, /proc and /sys: never gated, never per-rank, whatever the globs say. */
static void test_system_paths(void)
{
    static const char *const paths[] = {"/dev/null",          "/dev/stdout",     "/dev/shm/m.ckpt",
                                        "/dev/shm/train.log", "/proc/self/fd/1", "/proc/m.ckpt",
                                        "/sys/kernel/x.log",  "/sys/m.ckpt"};
    for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
        dps_redirect_t r;
        dps_files_open(&r, AT_FDCWD, paths[i], O_WRONLY | O_CREAT | O_TRUNC);
        CHECK(r.action == DPS_FILE_PASS && !r.gated && r.path == paths[i] &&
                  r.flags == (O_WRONLY | O_CREAT | O_TRUNC),
              "open %s: %s %s gated %d", paths[i], action_name(r.action), r.path, r.gated);
        dps_files_path(&r, DPS_FOP_UNLINK, AT_FDCWD, paths[i]);
        CHECK(r.action == DPS_FILE_PASS && !r.gated && r.path == paths[i], "modify %s: %s", paths[i],
              action_name(r.action));
        dps_files_path(&r, DPS_FOP_LOOKUP, AT_FDCWD, paths[i]);
        CHECK(r.path == paths[i], "lookup %s: '%s'", paths[i], r.path);
    }
}

/* --- actions ------------------------------------------------------------------------------- */

/* Classification leaves the path and flags as the program gave them (write-through on rank 0;
 * a follower's sink comes from dps_files_follow). */
static void expect_open(int dirfd, const char *path, int flags, dps_file_action_t action, dps_file_op_t op)
{
    dps_redirect_t r;
    dps_files_open(&r, dirfd, path, flags);
    CHECK(r.action == action, "open %s flags %#x: %s, want %s", path, flags, action_name(r.action),
          action_name(action));
    CHECK(r.op == op, "open %s flags %#x: op %d, want %d", path, flags, (int)r.op, (int)op);
    CHECK(r.path == path && r.flags == flags, "open %s flags %#x: became '%s' %#x", path, flags, r.path,
          r.flags);
}

static void expect_modify(const char *path, dps_file_action_t action)
{
    dps_redirect_t r;
    dps_files_path(&r, DPS_FOP_UNLINK, AT_FDCWD, path);
    CHECK(r.action == action, "modify %s: %s, want %s", path, action_name(r.action), action_name(action));
    CHECK(r.path == path, "modify %s: path '%s'", path, r.path);
}

static void test_classify_actions(void)
{
    dps_file_action_t g = gated_action();
    const int W = O_WRONLY | O_CREAT | O_TRUNC;
    expect_open(AT_FDCWD, "m.ckpt", O_RDONLY, g, DPS_FOP_OPEN_READ);
    expect_open(AT_FDCWD, "m.ckpt", O_RDONLY | O_CLOEXEC | O_NOFOLLOW, g, DPS_FOP_OPEN_READ);
    expect_open(AT_FDCWD, "m.ckpt", O_WRONLY, g, DPS_FOP_OPEN_WRITE);
    expect_open(AT_FDCWD, "m.ckpt", O_RDWR, g, DPS_FOP_OPEN_WRITE);
    expect_open(AT_FDCWD, "m.ckpt", W | O_CLOEXEC, g, DPS_FOP_OPEN_WRITE);
    expect_open(AT_FDCWD, "m.ckpt", O_RDONLY | O_CREAT, g, DPS_FOP_OPEN_WRITE);
    expect_open(AT_FDCWD, "m.ckpt", O_RDONLY | O_TRUNC, g, DPS_FOP_OPEN_WRITE);
    expect_open(AT_FDCWD, "ckpt/sub", O_WRONLY | O_TMPFILE, g, DPS_FOP_OPEN_WRITE);
    expect_open(AT_FDCWD, "./ckpt//a", W, g, DPS_FOP_OPEN_WRITE);
    expect_open(AT_FDCWD, "abs/x.bin", W, g, DPS_FOP_OPEN_WRITE);
    expect_open(AT_FDCWD, "m.txt", W, DPS_FILE_PASS, DPS_FOP_OPEN_WRITE);
    expect_open(AT_FDCWD, "other/a", O_RDWR, DPS_FILE_PASS, DPS_FOP_OPEN_WRITE);
    expect_modify("m.ckpt", g);
    expect_modify("ckpt/a", g);
    expect_modify("ckpt/sub/", g);
    expect_modify(at("abs/x.bin"), g);
    expect_modify("m.txt", DPS_FILE_PASS);
    /* rename and link: rank 0's when either path is gated */
    dps_redirect_t ra, rb;
    dps_files_pair(&ra, &rb, DPS_FOP_LINK, AT_FDCWD, "m.ckpt", AT_FDCWD, "m.txt");
    CHECK(rb.action == g, "link gated -> plain: %s", action_name(rb.action));
    dps_files_pair(&ra, &rb, DPS_FOP_LINK, AT_FDCWD, "m.txt", AT_FDCWD, "n.txt");
    CHECK(rb.action == DPS_FILE_PASS, "link plain -> plain: %s", action_name(rb.action));
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f && fputs(text, f) >= 0 && fclose(f) == 0, "writing %s", path);
}

static int file_is_text(const char *path, const char *text)
{
    char buf[64] = "";
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strcmp(buf, text) == 0;
}

/* A follower without a channel (a child process) takes rank 0's call to succeed: an open that
 * writes gets its sink, whatever the tree it sees (rank 0 may be about to make the directory). */
static void expect_sink(const char *path, int flags)
{
    dps_redirect_t r;
    dps_files_open(&r, AT_FDCWD, path, flags);
    CHECK(r.action == DPS_FILE_FOLLOW, "open %s: %s", path, action_name(r.action));
    errno = EAGAIN;
    int real = dps_files_follow(&r);
    CHECK(errno == EAGAIN, "dps_files_follow changed errno");
    CHECK(real && r.sink >= 0 && strncmp(r.path, "/proc/self/fd/", 14) == 0, "open %s: no sink (%s)", path,
          r.path);
    int fd = open(r.path, r.flags, 0600);
    CHECK(fd >= 0, "reopening the sink of %s: %s", path, strerror(errno));
    CHECK(dps_files_done(&r, fd >= 0) == 1 && r.sink == -1, "done with the sink of %s", path);
    CHECK(write(fd, "sink", 4) == 4 && fsync(fd) == 0 && ftruncate(fd, 100) == 0, "the sink of %s: %s", path,
          strerror(errno));
    close(fd);
}

static void test_follower_alone(void)
{
    uint_fast64_t sinks = atomic_load(&dps_diag_count.sinks), noops = atomic_load(&dps_diag_count.noops);
    const int W = O_WRONLY | O_CREAT | O_TRUNC;
    unlink("m.ckpt");
    expect_sink("m.ckpt", W);
    CHECK(access("m.ckpt", F_OK) != 0, "a follower's write created m.ckpt");
    expect_sink("m.ckpt", O_WRONLY | O_TRUNC);
    expect_sink("ckpt/nodir/a", W);
    expect_sink("ckpt/sub", O_WRONLY | O_TMPFILE);
    CHECK(atomic_load(&dps_diag_count.sinks) - sinks == 4, "sinks counted %llu",
          (unsigned long long)(atomic_load(&dps_diag_count.sinks) - sinks));

    /* not truncated: the sink starts as the file is, which stays as it was */
    write_file("m.ckpt", "old");
    dps_redirect_t r;
    dps_files_open(&r, AT_FDCWD, "m.ckpt", O_RDWR);
    CHECK(dps_files_follow(&r) == 1, "O_RDWR on an existing file");
    int fd = open(r.path, r.flags);
    dps_files_done(&r, fd >= 0);
    char buf[8] = "";
    CHECK(fd >= 0 && read(fd, buf, 3) == 3 && strcmp(buf, "old") == 0, "the sink reads '%s', want 'old'",
          buf);
    CHECK(pwrite(fd, "new", 3, 0) == 3, "write to the sink");
    close(fd);
    CHECK(file_is_text("m.ckpt", "old"), "a follower's write reached m.ckpt");
    dps_files_open(&r, AT_FDCWD, "m.ckpt", O_WRONLY | O_APPEND);
    CHECK(dps_files_follow(&r) == 1, "O_APPEND on an existing file");
    fd = open(r.path, r.flags);
    dps_files_done(&r, fd >= 0);
    struct stat st;
    CHECK(fd >= 0 && fstat(fd, &st) == 0 && st.st_size == 3, "the appending sink's size %lld, want 3",
          (long long)st.st_size);
    close(fd);

    /* changes: success, no effect */
    dps_files_path(&r, DPS_FOP_UNLINK, AT_FDCWD, "m.ckpt");
    CHECK(dps_files_follow(&r) == 0 && r.rc0 == 0, "unlink of an existing file");
    CHECK(access("m.ckpt", F_OK) == 0, "a follower's unlink removed m.ckpt");
    dps_files_path(&r, DPS_FOP_MKDIR, AT_FDCWD, "ckpt/new");
    CHECK(dps_files_follow(&r) == 0 && r.rc0 == 0, "mkdir");
    CHECK(access("ckpt/new", F_OK) != 0, "a follower's mkdir made ckpt/new");
    CHECK(atomic_load(&dps_diag_count.noops) - noops == 2, "noops counted %llu",
          (unsigned long long)(atomic_load(&dps_diag_count.noops) - noops));
    /* lookups and reads are made: the follower's own result unless rank 0 failed */
    dps_files_path(&r, DPS_FOP_LOOKUP, AT_FDCWD, "m.ckpt");
    CHECK(dps_files_follow(&r) == 1 && dps_files_done(&r, 1) == 1, "lookup of an existing file");
    r.rc0 = -1, r.err0 = ENOENT;
    CHECK(dps_files_done(&r, 1) == 0, "rank 0's failure is the follower's too");
}

/* A channel in this process: the leader's outcomes queue up, and the follower takes them. */
static struct {
    unsigned char msg[64][64];
    size_t len[64];
    int head, tail;
} queue;

static int queue_post(const void *msg, size_t len)
{
    memcpy(queue.msg[queue.tail % 64], msg, len);
    queue.len[queue.tail++ % 64] = len;
    return 0;
}

static int queue_wait(void *msg, size_t len, const char *what)
{
    (void)what;
    if (queue.head == queue.tail) return -1;
    memcpy(msg, queue.msg[queue.head % 64],
           len < queue.len[queue.head % 64] ? len : queue.len[queue.head % 64]);
    queue.head++;
    return 0;
}

static int queue_poll(void *msg, size_t len)
{
    return queue_wait(msg, len, "poll") == 0;
}

/* The followers' acknowledgements, and rank 0 taking them (none waits here: one process). */
static int acks_sent, acks_taken;
static int queue_ack(const void *msg, size_t len)
{
    (void)msg, (void)len;
    acks_sent++;
    return 0;
}

static int queue_next_ack(void *msg, size_t len, int *src, const char *what)
{
    (void)what;
    if (acks_taken == acks_sent) return -1;
    acks_taken++;
    memset(msg, 0, len); /* call #0 of path 0: never what rank 0 waits for, so it stops */
    *src = 1;
    return 0;
}

static const dps_files_channel_t queue_channel = {queue_post, queue_wait, queue_poll, queue_ack,
                                                  queue_next_ack};

/* Rank 0's writes of a gated file: a follower's write of the same bytes returns what rank 0's
 * returned (all, a short count, the errno), at the same call. */
static void test_channel_writes(void)
{
    configure_main(0);
    dps_redirect_t r;
    dps_files_open(&r, AT_FDCWD, "ckpt/w", O_WRONLY | O_CREAT | O_TRUNC);
    dps_files_done(&r, 1);
    uint64_t id = r.seq;
    CHECK(id != UINT64_MAX, "the open that writes has a number");
    dps_files_post_write(id, 0, 4096, 4096, 0);
    dps_files_post_write(id, 4096, 4096, 1000, 0);   /* short: the disk filled */
    dps_files_post_write(id, 5096, 3096, -1, EINTR); /* retried: no failure */
    dps_files_post_write(id, 5096, 3096, -1, ENOSPC);
    dps_files_path(&r, DPS_FOP_UNLINK, AT_FDCWD, "ckpt/w"); /* rank 0's next call */
    dps_files_done(&r, 1);

    configure_main(1);
    dps_files_open(&r, AT_FDCWD, "ckpt/w", O_WRONLY | O_CREAT | O_TRUNC);
    CHECK(dps_files_follow(&r) == 1 && r.seq == id, "the follower's open has rank 0's number");
    dps_files_done(&r, 1);
    int err = 0;
    CHECK(dps_files_rank0_write(id, "ckpt/w", 0, 4096, &err) == 4096, "rank 0's first write was whole");
    CHECK(dps_files_rank0_write(id, "ckpt/w", 4096, 8192, &err) == 1000, "rank 0's second write was short");
    ssize_t n = dps_files_rank0_write(id, "ckpt/w", 5096, 8192, &err);
    CHECK(n == -1 && err == ENOSPC, "rank 0's retry failed with ENOSPC: %zd, %s", n, strerror(err));
    /* bytes rank 0 never wrote before its next call (content that differs by rank): all */
    CHECK(dps_files_rank0_write(id + 1, "ckpt/v", 0, 100, &err) == 100, "rank 0 is past: all bytes");
    dps_files_path(&r, DPS_FOP_UNLINK, AT_FDCWD, "ckpt/w");
    CHECK(dps_files_follow(&r) == 0 && r.rc0 == 0, "the call after the writes pairs");
    dps_files_forget_writes(id);
    CHECK(queue.head == queue.tail, "every message taken");
}

/* Rank 0 (rank 0) or a follower (1) opens path for writing with flags: the leader's descriptor,
 * or the follower's on its stand-in (kept as a handle); *id: the open's number. */
static int open_gated(int rank, const char *path, int flags, uint64_t *id)
{
    configure_main(rank);
    dps_redirect_t r;
    dps_files_open(&r, AT_FDCWD, path, flags);
    CHECK(rank == 0 || (dps_files_follow(&r) == 1 && r.sink >= 0), "the follower's stand-in of %s", path);
    int fd = open(r.path, r.flags, 0640);
    dps_files_done(&r, fd >= 0);
    if (rank) dps_files_opened(&r, fd);
    *id = r.seq;
    return fd;
}

/* Rank 0 lost: rank 1 leads from then on. It tells the others again what rank 0 told it (a
 * survivor that missed some takes them), makes its gated calls as the leader, and its stand-in
 * of a file open at the loss becomes the file, whole, at the same offset. */
static void test_new_leader(void)
{
    uint64_t id;
    int fd0 = open_gated(0, "ckpt/open.txt", O_WRONLY | O_CREAT | O_TRUNC, &id);
    CHECK(write(fd0, "step 1\n", 7) == 7, "rank 0's write");
    dps_files_post_write(id, 0, 7, 7, 0);
    close(fd0); /* rank 0 is lost with the file open: it holds its first line only */

    dps_redirect_t r;
    int fd = open_gated(1, "ckpt/open.txt", O_WRONLY | O_CREAT | O_TRUNC, &id);
    CHECK(dps_files_handle_kind(fd) == DPS_HANDLE_STANDIN, "a stand-in");
    struct iovec line = {"step 1\n", 7};
    CHECK(dps_files_standin_write(fd, &line, 1, -1) == 7, "the follower's write pairs with rank 0's");
    /* rank 0's line the buffer of a stream held, written past the shim: only the stand-in has it */
    CHECK(write(fd, "step 2\n", 7) == 7, "a write past the shim");
    int posted = queue.tail;
    static const int survivors[] = {1, 2};
    CHECK(dps_files_new_leader(survivors, 2) == 1, "this rank leads now");
    dps_files_lead_handles();
    CHECK(queue.tail - posted >= 1, "the new leader told again the outcomes it took");
    queue.head = queue.tail;
    CHECK(dps_files_handle_kind(fd) == DPS_HANDLE_RANK0, "the stand-in is the leader's file now");
    struct stat a, b;
    CHECK(fstat(fd, &a) == 0 && stat("ckpt/open.txt", &b) == 0 && a.st_ino == b.st_ino, "fd is the file");
    CHECK(lseek(fd, 0, SEEK_CUR) == 14, "at the stand-in's offset");
    line.iov_base = "step 3\n";
    CHECK(writev(fd, &line, 1) == 7 && close(fd) == 0, "written on as the file");
    char got[64] = "";
    int in = open("ckpt/open.txt", O_RDONLY);
    CHECK(in >= 0 && read(in, got, sizeof got - 1) == 21 && !strcmp(got, "step 1\nstep 2\nstep 3\n"),
          "the file is whole: '%s'", got);
    if (in >= 0) close(in);
    dps_files_path(&r, DPS_FOP_UNLINK, AT_FDCWD, "ckpt/open.txt");
    CHECK(r.action == DPS_FILE_LEAD, "the new leader's gated calls are the leader's");
    dps_files_done(&r, unlink("ckpt/open.txt") == 0);
    CHECK(queue.tail - queue.head == 1, "and their outcomes go to the others");
    queue.head = queue.tail;
}

/* The same for a file open for appending, where rank 0 had written further than the stand-in: the
 * file is cut to the stand-in's length, so the new leader's next write does not come twice. */
static void test_new_leader_append(void)
{
    uint64_t id, id1;
    int fd0 = open_gated(0, "ckpt/append.txt", O_WRONLY | O_CREAT | O_APPEND, &id);
    /* the follower opens as rank 0 did, before rank 0 writes */
    int fd = open_gated(1, "ckpt/append.txt", O_WRONLY | O_CREAT | O_APPEND, &id1);

    configure_main(0);
    CHECK(write(fd0, "a\nb\n", 4) == 4, "rank 0's writes");
    dps_files_post_write(id, 0, 2, 2, 0);
    dps_files_post_write(id, 2, 2, 2, 0);
    close(fd0); /* lost after its second line, the follower's stand-in holds the first */

    configure_main(1);
    struct iovec line = {"a\n", 2};
    CHECK(dps_files_standin_write(fd, &line, 1, -1) == 2, "the follower's first line");
    static const int survivors[] = {1, 2};
    CHECK(dps_files_new_leader(survivors, 2) == 1, "this rank leads now");
    dps_files_lead_handles();
    queue.head = queue.tail;
    CHECK(write(fd, "b\n", 2) == 2 && close(fd) == 0, "its second line, as the file's writer");
    char got[16] = "";
    int in = open("ckpt/append.txt", O_RDONLY);
    CHECK(in >= 0 && read(in, got, sizeof got - 1) == 4 && !strcmp(got, "a\nb\n"), "each line once: '%s'",
          got);
    if (in >= 0) close(in);
}

static void test_channel(void)
{
    dps_files_set_channel(&queue_channel);
    configure_main(0); /* rank 0 makes the calls and posts what they gave */
    dps_redirect_t r;
    write_file("ckpt/here", "x");
    dps_files_open(&r, AT_FDCWD, "ckpt/here", O_WRONLY | O_CREAT | O_EXCL);
    errno = EEXIST;
    CHECK(dps_files_done(&r, 0) == 1 && errno == EEXIST, "the leader keeps its result and errno");
    dps_files_open(&r, AT_FDCWD, "ckpt/new", O_WRONLY | O_CREAT | O_EXCL);
    dps_files_done(&r, 1);
    dps_files_path(&r, DPS_FOP_MKDIR, AT_FDCWD, "ckpt/sub");
    errno = EACCES; /* not what the follower's tree would say */
    dps_files_done(&r, 0);
    CHECK(queue.tail == 3, "%d outcomes posted, want 3", queue.tail);

    configure_main(1); /* a follower takes them in order */
    dps_files_open(&r, AT_FDCWD, "ckpt/here", O_WRONLY | O_CREAT | O_EXCL);
    CHECK(dps_files_follow(&r) == 0 && r.rc0 == -1 && r.err0 == EEXIST, "rank 0's EEXIST");
    unlink("ckpt/here"); /* the follower's tree differs: rank 0's outcome still wins */
    dps_files_open(&r, AT_FDCWD, "ckpt/new", O_WRONLY | O_CREAT | O_EXCL);
    CHECK(dps_files_follow(&r) == 1 && r.sink >= 0, "rank 0's success: a sink");
    dps_files_done(&r, 1);
    CHECK(access("ckpt/new", F_OK) != 0, "the follower created ckpt/new");
    dps_files_path(&r, DPS_FOP_MKDIR, AT_FDCWD, "ckpt/sub");
    CHECK(dps_files_follow(&r) == 0 && r.rc0 == -1 && r.err0 == EACCES, "rank 0's EACCES, err %d", r.err0);
    /* another kind of call than rank 0's: a warning, and the follower decides alone */
    configure_main(0);
    dps_files_path(&r, DPS_FOP_RMDIR, AT_FDCWD, "ckpt/sub");
    dps_files_done(&r, 1);
    configure_main(1);
    printf("test_files: a WARN line about the order of gated operations is expected next\n");
    fflush(stdout);
    dps_files_path(&r, DPS_FOP_UNLINK, AT_FDCWD, "ckpt/none");
    CHECK(dps_files_follow(&r) == 0 && r.rc0 == 0, "decided alone after a mismatch");
    CHECK(queue.head == queue.tail, "every outcome taken");
    /* a read: the follower reads after rank 0 and says so */
    configure_main(0);
    dps_files_path(&r, DPS_FOP_LOOKUP, AT_FDCWD, "ckpt/sub");
    dps_files_done(&r, 1);
    configure_main(1);
    dps_files_path(&r, DPS_FOP_LOOKUP, AT_FDCWD, "ckpt/sub");
    CHECK(dps_files_follow(&r) == 1 && dps_files_done(&r, 1) == 1 && acks_sent == 1, "lookup: %d acks",
          acks_sent);
    test_channel_writes();
    test_new_leader();
    test_new_leader_append();
    dps_files_set_channel(NULL);
}

/* --- the children -------------------------------------------------------------------------- */

static void child_rank(int rank)
{
    configure_main(rank);
    if (rank == 3) test_rank_path_3();
    test_naming(rank);
    test_classify();
    test_system_paths();
    test_classify_actions();
    if (rank) test_follower_alone();
}

/* Basename globs only: no view needs the working directory. */
static void child_basename_only(int rank)
{
    configure(rank, "*.ckpt", "*.log");
    expect_gated(AT_FDCWD, "d1/m.ckpt", 1);
    expect_gated(AT_FDCWD, "../x/m.ckpt", 1);
    expect_gated(AT_FDCWD, "ckpt/a", 0);
    char want[32];
    snprintf(want, sizeof want, "d1/out.rank%d.log", rank);
    expect_name(AT_FDCWD, "d1/out.log", want);
    expect_open(AT_FDCWD, "./d1/../d1/m.ckpt", O_WRONLY | O_CREAT | O_TRUNC, gated_action(),
                DPS_FOP_OPEN_WRITE);
}

/* Globs that name system paths themselves gate nothing there. */
static void child_system_globs(void)
{
    configure(3, "* /** /dev/** /proc/** /sys/**", "*.log /dev/** /proc/** /sys/**");
    test_system_paths();
    /* the same globs do gate other paths */
    expect_open(AT_FDCWD, "m.txt", O_WRONLY, DPS_FILE_FOLLOW, DPS_FOP_OPEN_WRITE);
    expect_open(AT_FDCWD, "/tmp/m.txt", O_WRONLY, DPS_FILE_FOLLOW, DPS_FOP_OPEN_WRITE);
    expect_open(AT_FDCWD, "/devx/m.txt", O_WRONLY, DPS_FILE_FOLLOW, DPS_FOP_OPEN_WRITE);
    expect_name(AT_FDCWD, "/tmp/train.log", "/tmp/train.rank3.log");
}

/* The working directory moves: relative views follow it once told (chdir's interposer does). */
static void child_cwd(void)
{
    configure(3, "ckpt/**", "");
    expect_gated(AT_FDCWD, "ckpt/a", 1);
    expect_gated(AT_FDCWD, "../ckpt/a", 0);
    expect_gated(AT_FDCWD, at("ckpt/a"), 1);
    expect_gated(AT_FDCWD, at("other/ckpt/a"), 0);
    CHECK(chdir("other") == 0, "chdir other");
    dps_files_cwd_changed();
    /* the glob is now relative to <root>/other */
    expect_gated(AT_FDCWD, "ckpt/a", 1);
    expect_gated(AT_FDCWD, "../ckpt/a", 0);
    expect_gated(AT_FDCWD, at("ckpt/a"), 0);
    expect_gated(AT_FDCWD, at("other/ckpt/a"), 1);
    CHECK(chdir(root) == 0, "chdir back");
    dps_files_cwd_changed();
    expect_gated(AT_FDCWD, at("ckpt/a"), 1);
    expect_gated(AT_FDCWD, at("other/ckpt/a"), 0);
}

static int child_failures;

static void in_child(const char *name, void (*fn)(int), int arg, void (*fn0)(void), int quick_exit)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        check_failures = check_count = 0; /* the child reports its own */
        if (fn)
            fn(arg);
        else
            fn0();
        int rc = check_report(name);
        fflush(NULL);
        /* the working-directory cache is never freed (readers may hold it), by design: leaving
         * with _exit spares LeakSanitizer the old one after a chdir */
        if (quick_exit) _exit(rc);
        exit(rc);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid, "fork/wait for %s", name);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: child status %#x", name, status);
    if (!WIFEXITED(status) || WEXITSTATUS(status)) child_failures++;
}

static int rm_entry(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)st, (void)type, (void)ftw;
    return remove(path);
}

int main(void)
{
    char tmpl[] = "/tmp/dpshim-test-files-XXXXXX";
    CHECK(mkdtemp(tmpl) != NULL, "mkdtemp: %s", strerror(errno));
    CHECK(chdir(tmpl) == 0 && getcwd(root, sizeof root) != NULL, "chdir %s", tmpl);
    static const char *const dirs[] = {"ckpt", "ckpt/sub", "abs", "other", "d1", "logs.d"};
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++)
        CHECK(mkdir(dirs[i], 0755) == 0, "mkdir %s", dirs[i]);

    test_normalize();
    rank_name("train.log", "train.rank0.log"); /* before any configuration: rank 0 */

    in_child("test_files rank 3", child_rank, 3, NULL, 0);
    in_child("test_files rank 0", child_rank, 0, NULL, 0);
    in_child("test_files basename globs rank 3", child_basename_only, 3, NULL, 0);
    in_child("test_files basename globs rank 0", child_basename_only, 0, NULL, 0);
    in_child("test_files system globs", NULL, 0, child_system_globs, 0);
    in_child("test_files cwd", NULL, 0, child_cwd, 1);
    in_child("test_files channel", NULL, 0, test_channel, 0);

    CHECK(chdir("/") == 0, "chdir /");
    nftw(root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return check_report("test_files");
}
