/* For ThreadSanitizer's build only: tests/integration/threads.sh preloads it after TSan's runtime
 * and before the shim, in every rank.
 * - TSan's in-process symbolizer (GCC's libbacktrace) calls open, close and lstat, which bind to
 *   the shim's interposers; a first call of one of them there would resolve the real function
 *   with dlsym inside the symbolizer, and glibc would free its pending dlerror() string with
 *   TSan's internal allocator (a CHECK failure that ends the process). These make the first calls
 *   before main.
 * - Reports go to the file DPS_TSAN_REPORT.PID: set here, once TSan is running, because TSan's
 *   log_path option makes it create the file's folders with mkdir, the shim's interposer, before
 *   TSan can run instrumented code. */
#define _DEFAULT_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

void __sanitizer_set_report_path(const char *path);

__attribute__((constructor)) static void tsan_warmup(void)
{
    struct stat st;
    int fd = open("/", O_RDONLY);
    if (fd >= 0) close(fd);
    (void)lstat("/", &st);
    (void)stat("/", &st);
    const char *report = getenv("DPS_TSAN_REPORT");
    if (report && *report) __sanitizer_set_report_path(report);
}
