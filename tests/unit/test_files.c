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
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "diag/diag.h"
#include "files/files.h"

static char root[PATH_MAX]; /* the temporary working directory, as getcwd spells it */

static const char *action_name(dps_file_action_t a)
{
    static const char *const names[] = {"PASS", "SINK", "NOOP", "PUBLISH"};
    return (unsigned)a < 4 ? names[a] : "?";
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
    CHECK(dps_files_configure(&p, rank, err, sizeof err) == 0, "configure: %s", err);
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
    dps_files_lookup(&r, dirfd, path);
    CHECK(r.action == DPS_FILE_PASS, "lookup %s: %s", path, action_name(r.action));
    CHECK(strcmp(r.path, want) == 0, "lookup %s: '%s', want '%s'", path, r.path, want);
    CHECK(!r.gated, "lookup %s: a per-rank path is gated", path);
}

static void expect_gated(int dirfd, const char *path, int want)
{
    dps_redirect_t r;
    dps_files_lookup(&r, dirfd, path);
    CHECK(r.gated == want, "%s (dirfd %d): gated %d, want %d", path, dirfd, r.gated, want);
    CHECK(r.path == path, "%s: a lookup of a path that is not per-rank changed it to '%s'", path, r.path);
    CHECK(r.action == DPS_FILE_PASS, "lookup %s: %s", path, action_name(r.action));
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
    dps_files_modify(&r, AT_FDCWD, "ckpt/train.log");
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
    dps_files_lookup(&r, AT_FDCWD, "");
    CHECK(r.action == DPS_FILE_PASS && !r.gated && r.path && !*r.path, "empty path");
    dps_files_lookup(&r, AT_FDCWD, NULL);
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
        dps_files_modify(&r, AT_FDCWD, paths[i]);
        CHECK(r.action == DPS_FILE_PASS && !r.gated && r.path == paths[i], "modify %s: %s", paths[i],
              action_name(r.action));
        dps_files_lookup(&r, AT_FDCWD, paths[i]);
        CHECK(r.path == paths[i], "lookup %s: '%s'", paths[i], r.path);
    }
}

/* --- actions ------------------------------------------------------------------------------- */

static void expect_open(int dirfd, const char *path, int flags, dps_file_action_t action,
                        const char *want_path, int want_flags)
{
    dps_redirect_t r;
    dps_files_open(&r, dirfd, path, flags);
    CHECK(r.action == action, "open %s flags %#x: %s, want %s", path, flags, action_name(r.action),
          action_name(action));
    CHECK(r.path && strcmp(r.path, want_path ? want_path : path) == 0,
          "open %s flags %#x: path '%s', want '%s'", path, flags, r.path, want_path ? want_path : path);
    CHECK(r.flags == want_flags, "open %s flags %#x: flags %#x, want %#x", path, flags, r.flags, want_flags);
}

static void expect_modify(const char *path, dps_file_action_t action)
{
    dps_redirect_t r;
    dps_files_modify(&r, AT_FDCWD, path);
    CHECK(r.action == action, "modify %s: %s, want %s", path, action_name(r.action), action_name(action));
    CHECK(r.path == path, "modify %s: path '%s'", path, r.path);
}

/* Rank 0's truncating open of path: PUBLISH to ".NAME.dpshim-PID-SEQ" beside final. Returns SEQ. */
static long expect_publish(dps_redirect_t *r, int dirfd, const char *path, int flags, const char *final)
{
    dps_files_open(r, dirfd, path, flags);
    CHECK(r->action == DPS_FILE_PUBLISH, "open %s flags %#x: %s, want PUBLISH", path, flags,
          action_name(r->action));
    if (r->action != DPS_FILE_PUBLISH) return -1;
    CHECK(r->gated, "a published path is gated");
    CHECK(strcmp(r->final, final) == 0, "open %s: final '%s', want '%s'", path, r->final, final);
    CHECK(r->flags == (flags | O_CREAT), "open %s: flags %#x, want %#x", path, r->flags, flags | O_CREAT);
    CHECK(r->path == r->buf, "the temporary's name is in the redirect's buffer");
    const char *slash = strrchr(final, '/');
    char prefix[DPS_PATH_BUF + 64];
    snprintf(prefix, sizeof prefix, "%.*s/.%s.dpshim-%d-", (int)(slash - final), final, slash + 1,
             (int)getpid());
    size_t pl = strlen(prefix);
    CHECK(strncmp(r->path, prefix, pl) == 0, "temporary '%s' does not start with '%s'", r->path, prefix);
    char *end;
    long seq = strtol(r->path + pl, &end, 10);
    CHECK(end != r->path + pl && *end == '\0', "temporary '%s' does not end in a number", r->path);
    return seq;
}

static void test_actions_other_rank(void)
{
    uint_fast64_t sinks = atomic_load(&dps_diag_count.sinks), noops = atomic_load(&dps_diag_count.noops);
    /* reads are never redirected */
    expect_open(AT_FDCWD, "m.ckpt", O_RDONLY, DPS_FILE_PASS, NULL, O_RDONLY);
    expect_open(AT_FDCWD, "m.ckpt", O_RDONLY | O_CLOEXEC | O_NOFOLLOW, DPS_FILE_PASS, NULL,
                O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    /* writing, creating or truncating: the sink, keeping the access mode (reading becomes O_RDWR)
     * and only O_CLOEXEC, O_APPEND and O_NONBLOCK of the rest */
    expect_open(AT_FDCWD, "m.ckpt", O_WRONLY, DPS_FILE_SINK, "/dev/null", O_WRONLY);
    expect_open(AT_FDCWD, "m.ckpt", O_RDWR, DPS_FILE_SINK, "/dev/null", O_RDWR);
    expect_open(AT_FDCWD, "m.ckpt", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, DPS_FILE_SINK, "/dev/null",
                O_WRONLY | O_CLOEXEC);
    expect_open(AT_FDCWD, "m.ckpt", O_RDONLY | O_CREAT, DPS_FILE_SINK, "/dev/null", O_RDWR);
    expect_open(AT_FDCWD, "m.ckpt", O_RDONLY | O_TRUNC, DPS_FILE_SINK, "/dev/null", O_RDWR);
    expect_open(AT_FDCWD, "m.ckpt", O_WRONLY | O_APPEND | O_NONBLOCK | O_CREAT, DPS_FILE_SINK, "/dev/null",
                O_WRONLY | O_APPEND | O_NONBLOCK);
    expect_open(AT_FDCWD, "m.ckpt", O_WRONLY | O_CREAT | O_EXCL, DPS_FILE_SINK, "/dev/null", O_WRONLY);
    expect_open(AT_FDCWD, "m.ckpt", O_RDWR | O_TMPFILE, DPS_FILE_SINK, "/dev/null", O_RDWR);
    expect_open(AT_FDCWD, "ckpt/sub", O_WRONLY | O_TMPFILE | O_CLOEXEC, DPS_FILE_SINK, "/dev/null",
                O_WRONLY | O_CLOEXEC);
    expect_open(AT_FDCWD, "./ckpt//a", O_WRONLY | O_CREAT | O_TRUNC, DPS_FILE_SINK, "/dev/null", O_WRONLY);
    expect_open(AT_FDCWD, "abs/x.bin", O_WRONLY | O_CREAT | O_TRUNC, DPS_FILE_SINK, "/dev/null", O_WRONLY);
    CHECK(atomic_load(&dps_diag_count.sinks) - sinks == 11, "sinks counted %llu",
          (unsigned long long)(atomic_load(&dps_diag_count.sinks) - sinks));
    /* not gated: as the program asked */
    expect_open(AT_FDCWD, "m.txt", O_WRONLY | O_CREAT | O_TRUNC, DPS_FILE_PASS, NULL,
                O_WRONLY | O_CREAT | O_TRUNC);
    expect_open(AT_FDCWD, "other/a", O_RDWR, DPS_FILE_PASS, NULL, O_RDWR);
    /* modifications of gated paths succeed without effect */
    expect_modify("m.ckpt", DPS_FILE_NOOP);
    expect_modify("ckpt/a", DPS_FILE_NOOP);
    expect_modify("ckpt/sub/", DPS_FILE_NOOP);
    expect_modify(at("abs/x.bin"), DPS_FILE_NOOP);
    expect_modify("m.txt", DPS_FILE_PASS);
    CHECK(atomic_load(&dps_diag_count.noops) - noops == 4, "noops counted %llu",
          (unsigned long long)(atomic_load(&dps_diag_count.noops) - noops));
    CHECK(atomic_load(&dps_files_pending) == 0, "nothing is published on other ranks");
}

static void test_actions_rank0(void)
{
    uint_fast64_t sinks = atomic_load(&dps_diag_count.sinks), noops = atomic_load(&dps_diag_count.noops);
    const int W = O_WRONLY | O_CREAT | O_TRUNC;
    /* gated but not a whole-file write: straight to the file */
    expect_open(AT_FDCWD, "m.ckpt", O_RDONLY, DPS_FILE_PASS, NULL, O_RDONLY);
    expect_open(AT_FDCWD, "m.ckpt", O_WRONLY, DPS_FILE_PASS, NULL, O_WRONLY);
    expect_open(AT_FDCWD, "m.ckpt", O_RDWR | O_CREAT, DPS_FILE_PASS, NULL, O_RDWR | O_CREAT);
    expect_open(AT_FDCWD, "m.ckpt", O_RDONLY | O_TRUNC, DPS_FILE_PASS, NULL, O_RDONLY | O_TRUNC);
    expect_open(AT_FDCWD, "m.ckpt", W | O_APPEND, DPS_FILE_PASS, NULL, W | O_APPEND);
    expect_open(AT_FDCWD, "m.ckpt", W | O_EXCL, DPS_FILE_PASS, NULL, W | O_EXCL);
    expect_open(AT_FDCWD, "ckpt/sub", O_WRONLY | O_TMPFILE, DPS_FILE_PASS, NULL, O_WRONLY | O_TMPFILE);
    expect_open(AT_FDCWD, "ckpt/sub", O_RDWR | O_TMPFILE | O_TRUNC, DPS_FILE_PASS, NULL,
                O_RDWR | O_TMPFILE | O_TRUNC);
    expect_modify("m.ckpt", DPS_FILE_PASS);
    expect_modify("ckpt/a", DPS_FILE_PASS);
    CHECK(atomic_load(&dps_diag_count.sinks) == sinks && atomic_load(&dps_diag_count.noops) == noops,
          "rank 0 counted sinks or no-ops");
    /* a truncating write: a temporary beside the file, renamed over it at close */
    dps_redirect_t r;
    long s1 = expect_publish(&r, AT_FDCWD, "m.ckpt", W, at("m.ckpt"));
    long s2 = expect_publish(&r, AT_FDCWD, "m.ckpt", O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, at("m.ckpt"));
    CHECK(s2 == s1 + 1, "temporaries numbered %ld then %ld", s1, s2);
    expect_publish(&r, AT_FDCWD, "other/../d1/./m.ckpt", W, at("d1/m.ckpt"));
    expect_publish(&r, AT_FDCWD, at("/d1//m.ckpt"), W, at("d1/m.ckpt"));
    expect_publish(&r, AT_FDCWD, "ckpt/x/y", W, at("ckpt/x/y"));
    expect_publish(&r, AT_FDCWD, "abs/x.bin", W | O_CLOEXEC, at("abs/x.bin"));
    int dfd = opendir_fd("d1"), dother = opendir_fd("other");
    expect_publish(&r, dfd, "m.ckpt", W, at("d1/m.ckpt"));
    expect_publish(&r, dother, "../ckpt/a", W, at("ckpt/a"));
    expect_publish(&r, dother, at("d1/m.ckpt"), W, at("d1/m.ckpt"));
    close(dfd), close(dother);
    CHECK(atomic_load(&dps_files_pending) == 0, "publication registers only after the real open");
}

/* The whole publication on real files: the temporary, the old version until close, the rename. */
static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f && fputs(text, f) >= 0 && fclose(f) == 0, "writing %s", path);
}

static int file_is(const char *path, const char *text)
{
    char buf[64] = "";
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strcmp(buf, text) == 0;
}

static int publish_open(dps_redirect_t *r, const char *path, char *tmp, size_t tmplen)
{
    dps_files_open(r, AT_FDCWD, path, O_WRONLY | O_CREAT | O_TRUNC);
    CHECK(r->action == DPS_FILE_PUBLISH, "%s: %s", path, action_name(r->action));
    snprintf(tmp, tmplen, "%s", r->path);
    int fd = open(r->path, r->flags, 0644);
    CHECK(fd >= 0, "creating the temporary %s: %s", r->path, strerror(errno));
    errno = EAGAIN;
    CHECK(dps_files_opened(r, fd) == fd, "dps_files_opened changed the descriptor");
    CHECK(errno == EAGAIN, "dps_files_opened changed errno");
    return fd;
}

static void test_publish_flow(void)
{
    char tmp[DPS_PATH_BUF];
    dps_redirect_t r;
    dps_publish_t p;
    uint_fast64_t published = atomic_load(&dps_diag_count.published);
    write_file("m.ckpt", "old");
    int fd = publish_open(&r, "m.ckpt", tmp, sizeof tmp);
    CHECK(atomic_load(&dps_files_pending) == 1, "pending %d", atomic_load(&dps_files_pending));
    CHECK(write(fd, "new", 3) == 3, "write");
    CHECK(file_is("m.ckpt", "old"), "the path changed before close");
    CHECK(dps_files_take(fd + 100, &p) == 0, "took a descriptor that was never published");
    CHECK(dps_files_take(fd, &p) == 1, "fd %d not taken", fd);
    dps_publish_t again;
    CHECK(dps_files_take(fd, &again) == 0, "fd %d taken twice", fd);
    CHECK(atomic_load(&dps_files_pending) == 0, "pending after take");
    CHECK(strcmp(p.tmp, tmp) == 0 && strcmp(p.final, at("m.ckpt")) == 0, "took %s -> %s", p.tmp, p.final);
    close(fd);
    errno = EINTR;
    dps_files_finish(&p, 1);
    CHECK(errno == EINTR, "dps_files_finish changed errno");
    CHECK(file_is("m.ckpt", "new"), "the new version was not published");
    CHECK(access(tmp, F_OK) != 0 && errno == ENOENT, "the temporary %s is left", tmp);
    CHECK(atomic_load(&dps_diag_count.published) - published == 1, "published not counted");

    /* a failed close keeps the previous version and removes the temporary */
    printf("test_files: an ERROR line about m.ckpt is expected next\n");
    fflush(stdout);
    fd = publish_open(&r, "m.ckpt", tmp, sizeof tmp);
    CHECK(write(fd, "bad", 3) == 3, "write");
    CHECK(dps_files_take(fd, &p) == 1, "fd %d not taken", fd);
    close(fd);
    dps_files_finish(&p, 0);
    CHECK(file_is("m.ckpt", "new"), "a failed close replaced the file");
    CHECK(access(tmp, F_OK) != 0, "the temporary %s is left after a failed close", tmp);

    /* never closed: published at exit */
    fd = publish_open(&r, "d1/m.ckpt", tmp, sizeof tmp);
    CHECK(write(fd, "last", 4) == 4, "write");
    dps_files_shutdown();
    CHECK(file_is("d1/m.ckpt", "last"), "shutdown did not publish d1/m.ckpt");
    CHECK(atomic_load(&dps_files_pending) == 0, "pending after shutdown");
    CHECK(dps_files_take(fd, &p) == 0, "a file published at shutdown is still tracked");
    close(fd);

    /* nothing to track: a failed open, or an open that is not a publication */
    dps_files_open(&r, AT_FDCWD, "m.ckpt", O_WRONLY | O_CREAT | O_TRUNC);
    CHECK(dps_files_opened(&r, -1) == -1, "failed open");
    dps_files_open(&r, AT_FDCWD, "m.txt", O_WRONLY | O_CREAT | O_TRUNC);
    CHECK(r.action == DPS_FILE_PASS && dps_files_opened(&r, 7) == 7, "plain open");
    CHECK(atomic_load(&dps_files_pending) == 0, "pending after untracked opens");
}

/* --- the children -------------------------------------------------------------------------- */

static void child_rank(int rank)
{
    configure_main(rank);
    if (rank == 3) test_rank_path_3();
    test_naming(rank);
    test_classify();
    test_system_paths();
    if (rank)
        test_actions_other_rank();
    else
        test_actions_rank0(), test_publish_flow();
}

/* Basename globs only: no view needs the working directory, publication still does. */
static void child_basename_only(int rank)
{
    configure(rank, "*.ckpt", "*.log");
    expect_gated(AT_FDCWD, "d1/m.ckpt", 1);
    expect_gated(AT_FDCWD, "../x/m.ckpt", 1);
    expect_gated(AT_FDCWD, "ckpt/a", 0);
    char want[32];
    snprintf(want, sizeof want, "d1/out.rank%d.log", rank);
    expect_name(AT_FDCWD, "d1/out.log", want);
    dps_redirect_t r;
    if (rank == 0)
        expect_publish(&r, AT_FDCWD, "./d1/../d1/m.ckpt", O_WRONLY | O_CREAT | O_TRUNC, at("d1/m.ckpt"));
    else
        expect_open(AT_FDCWD, "d1/m.ckpt", O_WRONLY | O_CREAT | O_TRUNC, DPS_FILE_SINK, "/dev/null",
                    O_WRONLY);
}

/* Globs that name system paths themselves gate nothing there. */
static void child_system_globs(void)
{
    configure(3, "* /** /dev/** /proc/** /sys/**", "*.log /dev/** /proc/** /sys/**");
    test_system_paths();
    /* the same globs do gate other paths */
    expect_open(AT_FDCWD, "m.txt", O_WRONLY, DPS_FILE_SINK, "/dev/null", O_WRONLY);
    expect_open(AT_FDCWD, "/tmp/m.txt", O_WRONLY, DPS_FILE_SINK, "/dev/null", O_WRONLY);
    expect_open(AT_FDCWD, "/devx/m.txt", O_WRONLY, DPS_FILE_SINK, "/dev/null", O_WRONLY);
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

    CHECK(chdir("/") == 0, "chdir /");
    nftw(root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return check_report("test_files");
}
