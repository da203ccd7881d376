/* POSIX file entry points under the file policy (shim/files/): the open family with its
 * _FORTIFY_SOURCE and 64-bit variants, rename, link, symlink, unlink, mkdir, rmdir, truncate,
 * chmod, remove, the stat family, and chdir for the policy's own bookkeeping. Each wrapper calls
 * its own real symbol. With no [files] globs, or inside the shim, a wrapper is one atomic load
 * and the real call. On a rank that follows rank 0 (files.h), a gated call first takes rank 0's
 * outcome: a call that changes the tree then returns it without being made; an open that writes
 * opens its sink through the same entry point. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/dps.h"
#include "core/real.h"
#include "engine/engine.h"
#include "files/files.h"
#include "files_channel.h"

#define BYPASS() (DPS_LIKELY(!atomic_load_explicit(&dps_files_on, memory_order_relaxed)) || dps_in_shim)

/* The variadic mode exists only with O_CREAT or O_TMPFILE. */
#define OPEN_MODE(flags)                                                                                     \
    mode_t mode = 0;                                                                                         \
    if (((flags)&O_CREAT) || ((flags)&O_TMPFILE) == O_TMPFILE) {                                             \
        va_list ap;                                                                                          \
        va_start(ap, flags);                                                                                 \
        mode = (mode_t)va_arg(ap, int);                                                                      \
        va_end(ap);                                                                                          \
    }

DPS_REAL_DECLARE(int, close, (int));

/* --- the channel from the first gated call on ------------------------------------------------
 * Rank 0's outcomes go over the backend, which opens at the job's first collective. A gated call
 * before it would leave the other ranks to decide alone (an O_EXCL open of a file rank 0 has,
 * an open in a folder rank 0 has not made yet, a temporary whose rename rank 0 has not made),
 * so the first gated call opens the backend itself, where the process is one that would open it
 * at its first hook anyway:
 *   - the process that talks for its rank (the rank process, or a child that took its place,
 *     such as Python's once it imported torch), never a fork or another child: children never
 *     talk to other ranks, and a wrapper's child (cp, a compiler) taking the place would leave
 *     the trainer started after it outside the job;
 *   - a program that calls hooks: one of its objects refers to the hook ABI (dp_*) or it runs on
 *     libtorch (whose steps reach the hooks), or it holds the rank's place already. A shell, an
 *     interpreter before its framework or /usr/bin/time never opens it: such a wrapper would
 *     otherwise hold the rank's place (and MPI across an exec) that its trainer needs;
 *   - outside rank-0 scopes and before the program's MPI_Finalize, as the channel itself.
 * Opening is collective: it ends when every rank has opened the backend, at its own first
 * gated call, first hook, or exit (the exit barrier opens it for a rank that never called a
 * hook), so ranks that make a gated call on some ranks only still meet. Until then a rank waits
 * under the guard, whose watchdog covers the opening: a rank that waits outside the shim for
 * one that opens (a file it polls that no glob matches) ends the job after [guard] timeout,
 * naming the opening, instead of hanging it. */
static int refers_to_hooks; /* 0: not looked yet, 1: yes, -1: no */

/* The address of an object's dynamic entry: glibc relocates most of them in place, the vDSO's
 * are offsets. */
static const void *dyn_ptr(const struct dl_phdr_info *info, ElfW(Addr) p)
{
    return (const void *)(p < info->dlpi_addr ? p + info->dlpi_addr : p);
}

/* The number of dynamic symbols, from the ELF or the GNU hash table. */
static size_t dyn_symbols(const uint32_t *hash, const uint32_t *gnu)
{
    if (hash) return hash[1];
    if (!gnu) return 0;
    uint32_t nbuckets = gnu[0], offset = gnu[1], bloom = gnu[2];
    const uint32_t *buckets = gnu + 4 + bloom * (sizeof(ElfW(Addr)) / 4), *chain = buckets + nbuckets;
    uint32_t last = 0;
    for (uint32_t b = 0; b < nbuckets; b++)
        if (buckets[b] > last) last = buckets[b];
    if (last < offset) return offset;
    while (!(chain[last - offset] & 1))
        last++;
    return last + 1;
}

static int look_for_hooks(struct dl_phdr_info *info, size_t size, void *found)
{
    (void)size;
    const char *slash = info->dlpi_name ? strrchr(info->dlpi_name, '/') : NULL;
    const char *base = slash ? slash + 1 : info->dlpi_name ? info->dlpi_name : "";
    if (!strncmp(base, "libtorch_cpu.so", 15)) return *(int *)found = 1;
    Dl_info self;
    if (dladdr((void *)dps_files_start_channel, &self) && (ElfW(Addr))self.dli_fbase == info->dlpi_addr)
        return 0; /* this library defines them */
    for (int i = 0; i < info->dlpi_phnum; i++) {
        if (info->dlpi_phdr[i].p_type != PT_DYNAMIC) continue;
        const ElfW(Sym) *sym = NULL;
        const char *str = NULL;
        const uint32_t *hash = NULL, *gnu = NULL;
        for (const ElfW(Dyn) *d = (const void *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
             d->d_tag != DT_NULL; d++) {
            if (d->d_tag == DT_SYMTAB)
                sym = dyn_ptr(info, d->d_un.d_ptr);
            else if (d->d_tag == DT_STRTAB)
                str = dyn_ptr(info, d->d_un.d_ptr);
            else if (d->d_tag == DT_HASH)
                hash = dyn_ptr(info, d->d_un.d_ptr);
            else if (d->d_tag == DT_GNU_HASH)
                gnu = dyn_ptr(info, d->d_un.d_ptr);
        }
        size_t n = sym && str ? dyn_symbols(hash, gnu) : 0;
        for (size_t k = 1; k < n; k++)
            if (sym[k].st_shndx == SHN_UNDEF && !strncmp(str + sym[k].st_name, "dp_", 3))
                return *(int *)found = 1;
    }
    return 0;
}

void dps_files_start_channel(void)
{
    if (DPS_LIKELY(__atomic_load_n(&dps_e.be, __ATOMIC_ACQUIRE) != NULL) || dps_g.role != DPS_ROLE_RANK ||
        dps_g.eff_size < 2 || atomic_load_explicit(&dps_g.forked, memory_order_relaxed) ||
        dps_e.scope_depth || dps_e.released)
        return;
    int saved = errno;
    dps_in_shim++;
    int owner = dps_rank_owner();
    if (owner != (int)getpid()) {
        if (owner) goto out; /* a child of ours holds it: it talks for the rank */
        if (!__atomic_load_n(&refers_to_hooks, __ATOMIC_RELAXED)) {
            int found = 0;
            dl_iterate_phdr(look_for_hooks, &found);
            __atomic_store_n(&refers_to_hooks, found ? 1 : -1, __ATOMIC_RELAXED);
        }
        if (__atomic_load_n(&refers_to_hooks, __ATOMIC_RELAXED) < 0) goto out;
    }
    DPS_DEBUG(
        "[files] a gated file call before the first collective: opening the backend for rank 0's outcomes");
    dps_comm("the first gated file call"); /* claims the place where it is free; fatal where it cannot open */
out:
    dps_in_shim--;
    errno = saved;
}

/* Rank 0's failure, as the follower's own. */
#define LEADERS_RESULT(r) ((r).rc0 ? (errno = (r).err0, -1) : 0)

/* An open-family body: CALL(path, flags) is the real call. errno as the real call leaves it. */
#define OPEN_BODY(dirfd_, path_, flags_, CALL)                                                               \
    do {                                                                                                     \
        if (BYPASS()) return CALL(path_, flags_);                                                            \
        int saved_ = errno;                                                                                  \
        dps_redirect_t r_;                                                                                   \
        dps_in_shim++;                                                                                       \
        dps_files_open(&r_, dirfd_, path_, flags_);                                                          \
        dps_in_shim--;                                                                                       \
        errno = saved_;                                                                                      \
        if (r_.action != DPS_FILE_PASS) dps_files_start_channel();                                           \
        if (r_.action == DPS_FILE_FOLLOW && !dps_files_follow(&r_)) return LEADERS_RESULT(r_);               \
        int fd_ = CALL(r_.path, r_.flags);                                                                   \
        if (dps_files_done(&r_, fd_ >= 0)) {                                                                 \
            dps_files_opened(&r_, fd_);                                                                      \
            return fd_;                                                                                      \
        }                                                                                                    \
        DPS_REAL(close)(fd_);                                                                                \
        return LEADERS_RESULT(r_);                                                                           \
    } while (0)

/* A body for calls that change or look up one path (op): a follower's change returns rank 0's
 * result without being made; its lookup is made after rank 0's. */
#define PATH_BODY(op_, dirfd_, path_, CALL)                                                                  \
    do {                                                                                                     \
        if (BYPASS()) return CALL(path_);                                                                    \
        int saved_ = errno;                                                                                  \
        dps_redirect_t r_;                                                                                   \
        dps_in_shim++;                                                                                       \
        dps_files_path(&r_, op_, dirfd_, path_);                                                             \
        dps_in_shim--;                                                                                       \
        errno = saved_;                                                                                      \
        if (r_.action != DPS_FILE_PASS) dps_files_start_channel();                                           \
        if (r_.action == DPS_FILE_FOLLOW && !dps_files_follow(&r_)) return LEADERS_RESULT(r_);               \
        int rc_ = CALL(r_.path);                                                                             \
        return dps_files_done(&r_, rc_ == 0) ? rc_ : LEADERS_RESULT(r_);                                     \
    } while (0)
#define MODIFY_BODY(op_, dirfd_, path_, CALL) PATH_BODY(DPS_FOP_##op_, dirfd_, path_, CALL)

/* rename and link: rank 0's alone when either path is gated. */
#define PAIR_BODY(op_, fda, a, fdb, b, CALL)                                                                 \
    do {                                                                                                     \
        if (BYPASS()) return CALL(a, b);                                                                     \
        int saved_ = errno;                                                                                  \
        dps_redirect_t ra_, rb_;                                                                             \
        dps_in_shim++;                                                                                       \
        dps_files_pair(&ra_, &rb_, DPS_FOP_##op_, fda, a, fdb, b);                                           \
        dps_in_shim--;                                                                                       \
        errno = saved_;                                                                                      \
        if (rb_.action != DPS_FILE_PASS) dps_files_start_channel();                                          \
        if (rb_.action == DPS_FILE_FOLLOW && !dps_files_follow_pair(&ra_, &rb_)) return LEADERS_RESULT(rb_); \
        int rc_ = CALL(ra_.path, rb_.path);                                                                  \
        dps_files_done(&rb_, rc_ == 0);                                                                      \
        return rc_;                                                                                          \
    } while (0)

DPS_REAL_DECLARE(int, open, (const char *, int, ...));
DPS_REAL_DECLARE(int, open64, (const char *, int, ...));
DPS_REAL_DECLARE(int, openat, (int, const char *, int, ...));
DPS_REAL_DECLARE(int, openat64, (int, const char *, int, ...));
DPS_REAL_DECLARE(int, creat, (const char *, mode_t));
DPS_REAL_DECLARE(int, creat64, (const char *, mode_t));
DPS_REAL_DECLARE(int, __open_2, (const char *, int));
DPS_REAL_DECLARE(int, __open64_2, (const char *, int));
DPS_REAL_DECLARE(int, __openat_2, (int, const char *, int));
DPS_REAL_DECLARE(int, __openat64_2, (int, const char *, int));

DPS_EXPORT int open(const char *path, int flags, ...)
{
    OPEN_MODE(flags);
#define CALL(p, f) DPS_REAL(open)(p, f, mode)
    OPEN_BODY(AT_FDCWD, path, flags, CALL);
#undef CALL
}

DPS_EXPORT int open64(const char *path, int flags, ...)
{
    OPEN_MODE(flags);
#define CALL(p, f) DPS_REAL(open64)(p, f, mode)
    OPEN_BODY(AT_FDCWD, path, flags, CALL);
#undef CALL
}

DPS_EXPORT int openat(int dirfd, const char *path, int flags, ...)
{
    OPEN_MODE(flags);
#define CALL(p, f) DPS_REAL(openat)(dirfd, p, f, mode)
    OPEN_BODY(dirfd, path, flags, CALL);
#undef CALL
}

DPS_EXPORT int openat64(int dirfd, const char *path, int flags, ...)
{
    OPEN_MODE(flags);
#define CALL(p, f) DPS_REAL(openat64)(dirfd, p, f, mode)
    OPEN_BODY(dirfd, path, flags, CALL);
#undef CALL
}

/* creat(p, m) is open(p, O_CREAT|O_WRONLY|O_TRUNC, m); a sink needs the open form. */
DPS_EXPORT int creat(const char *path, mode_t mode)
{
#define CALL(p, f)                                                                                           \
    ((f) == (O_CREAT | O_WRONLY | O_TRUNC) ? DPS_REAL(creat)(p, mode) : DPS_REAL(open)(p, f, mode))
    OPEN_BODY(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, CALL);
#undef CALL
}

DPS_EXPORT int creat64(const char *path, mode_t mode)
{
#define CALL(p, f)                                                                                           \
    ((f) == (O_CREAT | O_WRONLY | O_TRUNC) ? DPS_REAL(creat64)(p, mode) : DPS_REAL(open64)(p, f, mode))
    OPEN_BODY(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, CALL);
#undef CALL
}

/* _FORTIFY_SOURCE variants: called for open(path, flags) without a mode. */
DPS_EXPORT int __open_2(const char *path, int flags)
{
#define CALL(p, f) DPS_REAL(__open_2)(p, f)
    OPEN_BODY(AT_FDCWD, path, flags, CALL);
#undef CALL
}

DPS_EXPORT int __open64_2(const char *path, int flags)
{
#define CALL(p, f) DPS_REAL(__open64_2)(p, f)
    OPEN_BODY(AT_FDCWD, path, flags, CALL);
#undef CALL
}

DPS_EXPORT int __openat_2(int dirfd, const char *path, int flags)
{
#define CALL(p, f) DPS_REAL(__openat_2)(dirfd, p, f)
    OPEN_BODY(dirfd, path, flags, CALL);
#undef CALL
}

DPS_EXPORT int __openat64_2(int dirfd, const char *path, int flags)
{
#define CALL(p, f) DPS_REAL(__openat64_2)(dirfd, p, f)
    OPEN_BODY(dirfd, path, flags, CALL);
#undef CALL
}

/* --- two paths --- */

DPS_REAL_DECLARE(int, rename, (const char *, const char *));
DPS_REAL_DECLARE(int, renameat, (int, const char *, int, const char *));
DPS_REAL_DECLARE(int, renameat2, (int, const char *, int, const char *, unsigned));
DPS_REAL_DECLARE(int, link, (const char *, const char *));
DPS_REAL_DECLARE(int, linkat, (int, const char *, int, const char *, int));

DPS_EXPORT int rename(const char *a, const char *b)
{
#define CALL(x, y) DPS_REAL(rename)(x, y)
    PAIR_BODY(RENAME, AT_FDCWD, a, AT_FDCWD, b, CALL);
#undef CALL
}

DPS_EXPORT int renameat(int fda, const char *a, int fdb, const char *b)
{
#define CALL(x, y) DPS_REAL(renameat)(fda, x, fdb, y)
    PAIR_BODY(RENAME, fda, a, fdb, b, CALL);
#undef CALL
}

DPS_EXPORT int renameat2(int fda, const char *a, int fdb, const char *b, unsigned flags)
{
#define CALL(x, y) DPS_REAL(renameat2)(fda, x, fdb, y, flags)
    PAIR_BODY(RENAME, fda, a, fdb, b, CALL);
#undef CALL
}

/* link, and linkat: also how a file made with O_TMPFILE gets its name */
DPS_EXPORT int link(const char *a, const char *b)
{
#define CALL(x, y) DPS_REAL(link)(x, y)
    PAIR_BODY(LINK, AT_FDCWD, a, AT_FDCWD, b, CALL);
#undef CALL
}

DPS_EXPORT int linkat(int fda, const char *a, int fdb, const char *b, int flags)
{
#define CALL(x, y) DPS_REAL(linkat)(fda, x, fdb, y, flags)
    PAIR_BODY(LINK, fda, a, fdb, b, CALL);
#undef CALL
}

/* --- calls that change one path --- */

DPS_REAL_DECLARE(int, unlink, (const char *));
DPS_REAL_DECLARE(int, unlinkat, (int, const char *, int));
DPS_REAL_DECLARE(int, rmdir, (const char *));
DPS_REAL_DECLARE(int, symlink, (const char *, const char *));
DPS_REAL_DECLARE(int, symlinkat, (const char *, int, const char *));
DPS_REAL_DECLARE(int, remove, (const char *));
DPS_REAL_DECLARE(int, mkdir, (const char *, mode_t));
DPS_REAL_DECLARE(int, mkdirat, (int, const char *, mode_t));
DPS_REAL_DECLARE(int, truncate, (const char *, off_t));
DPS_REAL_DECLARE(int, truncate64, (const char *, off64_t));
DPS_REAL_DECLARE(int, chmod, (const char *, mode_t));

DPS_EXPORT int unlink(const char *path)
{
#define CALL(p) DPS_REAL(unlink)(p)
    MODIFY_BODY(UNLINK, AT_FDCWD, path, CALL);
#undef CALL
}

DPS_EXPORT int unlinkat(int dirfd, const char *path, int flags)
{
#define CALL(p) DPS_REAL(unlinkat)(dirfd, p, flags)
    PATH_BODY(flags & AT_REMOVEDIR ? DPS_FOP_RMDIR : DPS_FOP_UNLINK, dirfd, path, CALL);
#undef CALL
}

DPS_EXPORT int remove(const char *path)
{
#define CALL(p) DPS_REAL(remove)(p)
    MODIFY_BODY(UNLINK, AT_FDCWD, path, CALL);
#undef CALL
}

DPS_EXPORT int rmdir(const char *path)
{
#define CALL(p) DPS_REAL(rmdir)(p)
    MODIFY_BODY(RMDIR, AT_FDCWD, path, CALL);
#undef CALL
}

DPS_EXPORT int symlink(const char *target, const char *path)
{
#define CALL(p) DPS_REAL(symlink)(target, p)
    MODIFY_BODY(SYMLINK, AT_FDCWD, path, CALL);
#undef CALL
}

DPS_EXPORT int symlinkat(const char *target, int dirfd, const char *path)
{
#define CALL(p) DPS_REAL(symlinkat)(target, dirfd, p)
    MODIFY_BODY(SYMLINK, dirfd, path, CALL);
#undef CALL
}

DPS_EXPORT int mkdir(const char *path, mode_t mode)
{
#define CALL(p) DPS_REAL(mkdir)(p, mode)
    MODIFY_BODY(MKDIR, AT_FDCWD, path, CALL);
#undef CALL
}

DPS_EXPORT int mkdirat(int dirfd, const char *path, mode_t mode)
{
#define CALL(p) DPS_REAL(mkdirat)(dirfd, p, mode)
    MODIFY_BODY(MKDIR, dirfd, path, CALL);
#undef CALL
}

DPS_EXPORT int truncate(const char *path, off_t len)
{
#define CALL(p) DPS_REAL(truncate)(p, len)
    MODIFY_BODY(TRUNCATE, AT_FDCWD, path, CALL);
#undef CALL
}

DPS_EXPORT int truncate64(const char *path, off64_t len)
{
#define CALL(p) DPS_REAL(truncate64)(p, len)
    MODIFY_BODY(TRUNCATE, AT_FDCWD, path, CALL);
#undef CALL
}

/* Not in the minimal list, but copying tools (cp, Python's shutil.copy) set the mode of the
 * file they just wrote; on a rank that wrote a sink there is nothing to change. */
DPS_EXPORT int chmod(const char *path, mode_t mode)
{
#define CALL(p) DPS_REAL(chmod)(p, mode)
    MODIFY_BODY(CHMOD, AT_FDCWD, path, CALL);
#undef CALL
}

/* --- lookups: a per_rank file is found under its rank's name (stat before open, as cp and
 * Python's shutil do, must agree with open); a gated one after rank 0 looked it up --- */

#define LOOKUP_BODY(dirfd_, path_, CALL) PATH_BODY(DPS_FOP_LOOKUP, dirfd_, path_, CALL)

struct statx;
DPS_REAL_DECLARE(int, stat, (const char *, struct stat *));
DPS_REAL_DECLARE(int, stat64, (const char *, struct stat64 *));
DPS_REAL_DECLARE(int, lstat, (const char *, struct stat *));
DPS_REAL_DECLARE(int, lstat64, (const char *, struct stat64 *));
DPS_REAL_DECLARE(int, fstatat, (int, const char *, struct stat *, int));
DPS_REAL_DECLARE(int, fstatat64, (int, const char *, struct stat64 *, int));
DPS_REAL_DECLARE(int, statx, (int, const char *, int, unsigned, struct statx *));
DPS_REAL_DECLARE(int, __xstat, (int, const char *, struct stat *));
DPS_REAL_DECLARE(int, __xstat64, (int, const char *, struct stat64 *));
DPS_REAL_DECLARE(int, __lxstat, (int, const char *, struct stat *));
DPS_REAL_DECLARE(int, __lxstat64, (int, const char *, struct stat64 *));
DPS_REAL_DECLARE(int, __fxstatat, (int, int, const char *, struct stat *, int));
DPS_REAL_DECLARE(int, __fxstatat64, (int, int, const char *, struct stat64 *, int));
DPS_REAL_DECLARE(int, access, (const char *, int));
DPS_REAL_DECLARE(int, faccessat, (int, const char *, int, int));

/* each lookup: its own wrapper and its own real symbol */
DPS_EXPORT int stat(const char *path, struct stat *st)
{
#define CALL(p) DPS_REAL(stat)(p, st)
    LOOKUP_BODY(AT_FDCWD, path, CALL);
#undef CALL
}
DPS_EXPORT int stat64(const char *path, struct stat64 *st)
{
#define CALL(p) DPS_REAL(stat64)(p, st)
    LOOKUP_BODY(AT_FDCWD, path, CALL);
#undef CALL
}
DPS_EXPORT int lstat(const char *path, struct stat *st)
{
#define CALL(p) DPS_REAL(lstat)(p, st)
    LOOKUP_BODY(AT_FDCWD, path, CALL);
#undef CALL
}
DPS_EXPORT int lstat64(const char *path, struct stat64 *st)
{
#define CALL(p) DPS_REAL(lstat64)(p, st)
    LOOKUP_BODY(AT_FDCWD, path, CALL);
#undef CALL
}
DPS_EXPORT int fstatat(int dirfd, const char *path, struct stat *st, int flags)
{
#define CALL(p) DPS_REAL(fstatat)(dirfd, p, st, flags)
    LOOKUP_BODY(dirfd, path, CALL);
#undef CALL
}
DPS_EXPORT int fstatat64(int dirfd, const char *path, struct stat64 *st, int flags)
{
#define CALL(p) DPS_REAL(fstatat64)(dirfd, p, st, flags)
    LOOKUP_BODY(dirfd, path, CALL);
#undef CALL
}
DPS_EXPORT int statx(int dirfd, const char *path, int flags, unsigned mask, struct statx *st)
{
#define CALL(p) DPS_REAL(statx)(dirfd, p, flags, mask, st)
    LOOKUP_BODY(dirfd, path, CALL);
#undef CALL
}
/* binaries built against glibc before 2.33 call the stat family through these */
DPS_EXPORT int __xstat(int ver, const char *path, struct stat *st)
{
#define CALL(p) DPS_REAL(__xstat)(ver, p, st)
    LOOKUP_BODY(AT_FDCWD, path, CALL);
#undef CALL
}
DPS_EXPORT int __xstat64(int ver, const char *path, struct stat64 *st)
{
#define CALL(p) DPS_REAL(__xstat64)(ver, p, st)
    LOOKUP_BODY(AT_FDCWD, path, CALL);
#undef CALL
}
DPS_EXPORT int __lxstat(int ver, const char *path, struct stat *st)
{
#define CALL(p) DPS_REAL(__lxstat)(ver, p, st)
    LOOKUP_BODY(AT_FDCWD, path, CALL);
#undef CALL
}
DPS_EXPORT int __lxstat64(int ver, const char *path, struct stat64 *st)
{
#define CALL(p) DPS_REAL(__lxstat64)(ver, p, st)
    LOOKUP_BODY(AT_FDCWD, path, CALL);
#undef CALL
}
DPS_EXPORT int __fxstatat(int ver, int dirfd, const char *path, struct stat *st, int flags)
{
#define CALL(p) DPS_REAL(__fxstatat)(ver, dirfd, p, st, flags)
    LOOKUP_BODY(dirfd, path, CALL);
#undef CALL
}
DPS_EXPORT int __fxstatat64(int ver, int dirfd, const char *path, struct stat64 *st, int flags)
{
#define CALL(p) DPS_REAL(__fxstatat64)(ver, dirfd, p, st, flags)
    LOOKUP_BODY(dirfd, path, CALL);
#undef CALL
}
DPS_EXPORT int access(const char *path, int mode)
{
#define CALL(p) DPS_REAL(access)(p, mode)
    LOOKUP_BODY(AT_FDCWD, path, CALL);
#undef CALL
}
DPS_EXPORT int faccessat(int dirfd, const char *path, int mode, int flags)
{
#define CALL(p) DPS_REAL(faccessat)(dirfd, p, mode, flags)
    LOOKUP_BODY(dirfd, path, CALL);
#undef CALL
}

/* --- bookkeeping --- */

DPS_REAL_DECLARE(int, chdir, (const char *));
DPS_REAL_DECLARE(int, fchdir, (int));

DPS_EXPORT int chdir(const char *path)
{
    int rc = DPS_REAL(chdir)(path);
    if (rc == 0) dps_files_cwd_changed();
    return rc;
}

DPS_EXPORT int fchdir(int fd)
{
    int rc = DPS_REAL(fchdir)(fd);
    if (rc == 0) dps_files_cwd_changed();
    return rc;
}
