/* The guard against a stub backend, without MPI: the watchdog works at any job size (5000 ranks
 * here: the exit barrier and the stuck-job table), a collective stuck after the shim's own wait
 * inside it is still watched, without a side channel it still ends a stuck job with this rank's
 * position, and a crash is reported as strsignal names it. Each case runs in
 * a child process: the guard ends a job with _exit or a signal, and its state is per process. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "core/dps.h"
#include "guard/guard.h"

/* The stub's side channel: every message sent to rank r comes back as r's own message (the
 * other ranks are where this one is, and leave when it leaves). */
enum { STUB_MSG_MAX = DPS_GUARD_MSG_MAX };
typedef struct stub_msg {
    int src;
    size_t len;
    unsigned char bytes[STUB_MSG_MAX];
} stub_msg_t;

static struct {
    pthread_mutex_t lock;
    stub_msg_t *queue;
    size_t head, tail, cap;
    atomic_int sends, polls;
} stub = {.lock = PTHREAD_MUTEX_INITIALIZER};

static int stub_send(const void *msg, size_t len, int dest)
{
    if (len > STUB_MSG_MAX) abort(); /* the guard's messages are small; a big one is a bug here */
    pthread_mutex_lock(&stub.lock);
    if (stub.tail == stub.cap) {
        stub.cap = stub.cap ? 2 * stub.cap : 1024;
        stub.queue = realloc(stub.queue, stub.cap * sizeof *stub.queue);
        if (!stub.queue) abort();
    }
    stub_msg_t *m = &stub.queue[stub.tail++];
    m->src = dest, m->len = len;
    memcpy(m->bytes, msg, len);
    pthread_mutex_unlock(&stub.lock);
    atomic_fetch_add(&stub.sends, 1);
    return 0;
}

static int stub_poll(void *msg, size_t len, int *src)
{
    atomic_fetch_add(&stub.polls, 1);
    pthread_mutex_lock(&stub.lock);
    int got = stub.head < stub.tail;
    if (got) {
        stub_msg_t *m = &stub.queue[stub.head++];
        memcpy(msg, m->bytes, m->len < len ? m->len : len);
        *src = m->src;
    }
    pthread_mutex_unlock(&stub.lock);
    return got;
}

static const char *stub_error(void)
{
    return "stub";
}

/* With a side channel (an MPI with MPI_THREAD_MULTIPLE), and without one. */
static const dps_backend_t with_channel = {
    .name = "stub", .last_error = stub_error, .guard_send = stub_send, .guard_poll = stub_poll};
static const dps_backend_t without_channel = {.name = "stub", .last_error = stub_error};

/* This process as rank 0 of SIZE, with [guard] timeout = TIMEOUT s. */
static void configure(int size, const char *timeout)
{
    dps_g.rank = dps_g.eff_rank = 0;
    dps_g.size = dps_g.eff_size = size;
    dps_policy_init(&dps_g.policy);
    dps_error_t e;
    if (dps_policy_set_value(&dps_g.policy, DPS_P_guard_timeout, timeout, strlen(timeout), DPS_SRC_ENV, 0,
                             &e))
        abort();
    dps_guard_configure(&dps_g);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Exit status of a child that found no report after this long: the guard never ended the job. */
enum { NO_REPORT = 3 };

/* Runs fn in a child with its stderr in a file; the child's exit status (or 128 + signal) and
 * its stderr come back. fn returns the child's exit status, unless the guard ends it first. */
static int in_child(int (*fn)(void), char **err_p)
{
    FILE *err = tmpfile();
    if (!err) abort();
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fileno(err), STDERR_FILENO);
        check_failures = check_count = 0; /* the child's own checks */
        alarm(20);                        /* a hang fails the test instead of stalling it */
        int rc = fn();
        fflush(NULL);
        _exit(rc);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    long len = ftell(err); /* the child's writes moved the shared offset */
    char *text = calloc((size_t)(len > 0 ? len : 0) + 1, 1);
    rewind(err);
    if (text && len > 0 && fread(text, 1, (size_t)len, err) != (size_t)len) text[0] = 0;
    fclose(err);
    *err_p = text;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The child waits this long for the guard to end it, and says it did not. */
static int no_report_within(double seconds)
{
    for (double t0 = now_s(); now_s() - t0 < seconds;)
        usleep(10000);
    return NO_REPORT;
}

/* A collective that never completes on rank 0 of 5000; the other 4999 wait in it too. */
static int stuck_at_5000(void)
{
    configure(5000, "1");
    dps_guard_start(&with_channel);
    dps_guard_enter("dp_grads", DPS_COLL_ALLREDUCE, DP_F32, 1000);
    return no_report_within(8);
}

static void test_stuck_at_5000(void)
{
    char *err = NULL;
    int status = in_child(stuck_at_5000, &err);
    CHECK(status == DPS_EXIT_GUARD, "5000 ranks stuck: exit status %d, not %d (%d: never ended)", status,
          DPS_EXIT_GUARD, NO_REPORT);
    CHECK(strstr(err, "guard: dp_grads collective #1 (after step 0) has waited") != NULL,
          "no headline in:\n%.2000s", err);
    CHECK(strstr(err, ": in dp_grads (all-reduce f32 x 1000), collective #1 after step 0") != NULL &&
              strstr(err, "rank 0 (") != NULL,
          "rank 0 missing from the table");
    CHECK(strstr(err, "rank 4999: in dp_grads (all-reduce f32 x 1000), collective #1 after step 0") != NULL,
          "rank 4999 missing from the table");
    CHECK(strstr(err, "no answer") == NULL, "a rank that answered is listed as silent");
    CHECK(strstr(err, "culprit") == NULL, "a rank where all others are is marked as the culprit");
    free(err);
}

/* The shim's own wait inside a collective (the survivors' agreement after a loss), then the
 * collective runs again and never completes: the guard still ends the job at its timeout. */
static int stuck_after_own_wait(void)
{
    configure(2, "1");
    dps_guard_start(&with_channel);
    dps_guard_enter("dp_grads", DPS_COLL_ALLREDUCE, DP_F32, 1000);
    dps_guard_own_end(dps_guard_own_begin("the survivors' agreement"));
    return no_report_within(6);
}

/* The job stuck in rank 0's dp_grads after what `stuck` did inside it: the guard still ends
 * the job at its timeout, and its report names dp_grads (collective #`seq`) and its call. */
static void check_stuck_after(int (*stuck)(void), const char *what, int seq)
{
    char *err = NULL, headline[96];
    int status = in_child(stuck, &err);
    CHECK(status == DPS_EXIT_GUARD, "stuck after %s: exit status %d, not %d (%d: never ended)", what, status,
          DPS_EXIT_GUARD, NO_REPORT);
    snprintf(headline, sizeof headline, "guard: dp_grads collective #%d (after step 0) has waited", seq);
    CHECK(strstr(err, headline) != NULL, "after %s, no headline \"%s\" in:\n%.2000s", what, headline, err);
    CHECK(strstr(err, "in dp_grads (all-reduce f32 x 1000)") != NULL,
          "after %s, the table does not describe dp_grads' call", what);
    free(err);
}

/* A collective of the shim's inside the program's (the NCCL path's set-up after a loss), then
 * the program's goes on and never completes: the guard still ends the job at its timeout. */
static int stuck_after_nested(void)
{
    configure(2, "1");
    dps_guard_start(&with_channel);
    dps_guard_enter("dp_grads", DPS_COLL_ALLREDUCE, DP_F32, 1000);
    dps_guard_enter("GPU set-up", DPS_COLL_ALLREDUCE, DP_I32, 4);
    dps_guard_leave();
    return no_report_within(6);
}

/* A healthy rank 0 of 5000 leaves the program: the watchdog runs, and the exit barrier hears
 * every other rank leave. */
static int exit_at_5000(void)
{
    configure(5000, "5");
    dps_guard_start(&with_channel);
    for (double t0 = now_s(); atomic_load(&stub.polls) == 0 && now_s() - t0 < 2;)
        usleep(1000);
    CHECK(atomic_load(&stub.polls) > 0, "the watchdog thread never polled the side channel at 5000 ranks");
    dps_guard_enter("dp_grads", DPS_COLL_ALLREDUCE, DP_F32, 1000);
    dps_guard_leave();
    double t0 = now_s();
    dps_guard_exit();
    double waited = now_s() - t0;
    CHECK(atomic_load(&stub.sends) == 4999, "the exit barrier told %d ranks, not 4999",
          atomic_load(&stub.sends));
    CHECK(waited < 4, "the exit barrier waited %.1f s for ranks that had all left", waited);
    return check_report("test_guard (child: exit at 5000 ranks)");
}

static void test_exit_at_5000(void)
{
    char *err = NULL;
    int status = in_child(exit_at_5000, &err);
    CHECK(status == 0, "exit status %d:\n%s", status, err);
    CHECK(strstr(err, "still running") == NULL, "the exit barrier gave up:\n%s", err);
    free(err);
}

/* No side channel (MPI_Init without MPI_THREAD_MULTIPLE): rank 0 of 2 waits for ever. */
static int stuck_alone(void)
{
    configure(2, "1");
    dps_guard_start(&without_channel);
    dps_guard_enter("dp_grads", DPS_COLL_ALLREDUCE, DP_F32, 1000);
    return no_report_within(6);
}

static void test_stuck_without_channel(void)
{
    char *err = NULL;
    double t0 = now_s();
    int status = in_child(stuck_alone, &err);
    double took = now_s() - t0;
    CHECK(status == DPS_EXIT_GUARD,
          "no side channel, a stuck collective: exit status %d, not %d (%d: never ended)", status,
          DPS_EXIT_GUARD, NO_REPORT);
    CHECK(took < 4, "ended after %.1f s with [guard] timeout = 1 s", took);
    CHECK(strstr(err, "WARN guard:") && strstr(err, "MPI_Init_thread with MPI_THREAD_MULTIPLE"),
          "no warning that the guard is limited:\n%s", err);
    CHECK(strstr(err, "ERROR guard: dp_grads collective #1 (after step 0) has waited") != NULL,
          "no headline:\n%s", err);
    CHECK(strstr(err, "rank 0 (") != NULL &&
              strstr(err, "): in dp_grads (all-reduce f32 x 1000), collective #1 after step 0, waiting") !=
                  NULL,
          "no position of this rank:\n%s", err);
    CHECK(strstr(err, "without MPI_THREAD_MULTIPLE") != NULL,
          "does not say why the others are not listed:\n%s", err);
    free(err);
}

/* A rank that crashes inside a collective says where, then dies by the signal. */
static int crash_sig;

static int crash_inside_collective(void)
{
    struct rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    signal(crash_sig, SIG_DFL); /* a program that leaves it alone (ASan's runtime handles some) */
    configure(4, "0");
    dps_guard_install_crash_handlers();
    dps_guard_step(7, 0);
    dps_guard_enter("dp_grads", DPS_COLL_ALLREDUCE, DP_F32, 1000);
    raise(crash_sig);
    return NO_REPORT;
}

static void test_crash_messages(void)
{
    const int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) {
        crash_sig = sigs[i];
        char *err = NULL, want[256];
        int status = in_child(crash_inside_collective, &err);
        snprintf(
            want, sizeof want,
            "[dpshim r0/4] ERROR guard: rank 0 crashed with signal %d (%s) after step 7, inside dp_grads "
            "collective #1; the launcher ends the job\n",
            crash_sig, strsignal(crash_sig));
        CHECK(status == 128 + crash_sig, "signal %d: the child ended with %d, not by the signal", crash_sig,
              status);
        CHECK(strcmp(err, want) == 0, "signal %d: said\n%s\nnot\n%s", crash_sig, err, want);
        free(err);
    }
}

int main(void)
{
    test_crash_messages();
    test_stuck_at_5000();
    check_stuck_after(stuck_after_own_wait, "the shim's own wait", 1);
    check_stuck_after(stuck_after_nested, "a nested collective", 2);
    test_exit_at_5000();
    test_stuck_without_channel();
    return check_report("test_guard");
}
