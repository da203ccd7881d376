/* Unit tests of the diagnostics recorder (shim/diag), through its own API and the files it
 * writes, read back as text the way an outside tool would. The race test is the guard's failure
 * path: its watchdog writes the files while the progress thread may still record. */
#define _GNU_SOURCE
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "check.h"
#include "diag/diag.h"

static dps_state_t state;
static char root[] = "/tmp/dps_test_diag.XXXXXX";

/* A rank process whose policy is TEXT plus [diag] dir = root/SUB; the recorder starts afresh. */
static void configure(const char *sub, const char *text)
{
    char policy[1400];
    dps_error_t e;
    snprintf(policy, sizeof policy, "[diag]\ndir = %s/%s\n%s", root, sub, text);
    dps_policy_free(&state.policy);
    dps_policy_init(&state.policy);
    CHECK(dps_policy_parse(&state.policy, policy, strlen(policy), "test_diag", &e) == 0, "policy: %s", e.msg);
    state.rank = 0, state.size = 1, state.launcher = "unit", state.role = DPS_ROLE_RANK;
    dps_diag_configure(&state);
    CHECK(dps_diag_on, "[diag] dir = %s/%s does not turn diagnostics on", root, sub);
}

/* The value of KEY in SUB's stats file, or -1 without it. */
static long long stat_of(const char *sub, const char *key)
{
    char path[1200], line[512];
    snprintf(path, sizeof path, "%s/%s/stats.rank0.txt", root, sub);
    FILE *f = fopen(path, "r");
    long long v = -1;
    size_t n = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, n) && line[n] == ' ') v = atoll(line + n + 1);
    if (f) fclose(f);
    return v;
}

/* SUB's trace events, one line each without the header lines; *n_p of them. Owned by the caller. */
static char **trace_of(const char *sub, size_t *n_p)
{
    char path[1200], *line = NULL;
    size_t len = 0, n = 0, cap = 0;
    char **lines = NULL;
    snprintf(path, sizeof path, "%s/%s/trace.rank0.txt", root, sub);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL, "no %s", path);
    for (int i = 0; f && getline(&line, &len, f) > 0; i++) {
        if (i == 0) CHECK(!strncmp(line, "dpshim-trace ", 13), "%s starts with %s", path, line);
        if (i == 0 || line[0] == '#') continue;
        line[strcspn(line, "\n")] = '\0';
        if (n == cap) lines = realloc(lines, (cap = cap ? 2 * cap : 1024) * sizeof *lines);
        lines[n++] = strdup(line);
    }
    if (f) fclose(f);
    free(line);
    *n_p = n;
    return lines;
}

static void free_lines(char **lines, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(lines[i]);
    free(lines);
}

/* --- writing while another thread records --- */

#define RACE_EVENTS (1u << 20)
#define RACE_WRITES 20
static atomic_int recording;

static void *recorder(void *arg)
{
    (void)arg;
    for (uint64_t i = 1; i <= RACE_EVENTS; i++) {
        if (i % 8 == 0)
            dps_diag_step(i / 8);
        else
            dps_diag_collective("dp_grads", 4000, i, i + 1, i, i / 8);
    }
    atomic_store(&recording, 0);
    return NULL;
}

/* The progress thread records (and grows the event buffer) while the watchdog writes: writing
 * must not read the buffer from under the recorder. AddressSanitizer reports a
 * heap-use-after-free when it does. */
static void test_write_while_recording(void)
{
    configure("race", "");
    pthread_t t;
    atomic_store(&recording, 1);
    CHECK(pthread_create(&t, NULL, recorder, NULL) == 0, "pthread_create");
    /* a pause between writes lets the recorder on: a write holds it up for its whole length */
    int writes = 0;
    for (; writes < RACE_WRITES && atomic_load(&recording); writes++)
        dps_diag_write(), usleep(200);
    pthread_join(t, NULL);
    dps_diag_write();
    size_t n;
    char **lines = trace_of("race", &n);
    long long dropped = stat_of("race", "dropped_events");
    CHECK((long long)n + (dropped > 0 ? dropped : 0) == RACE_EVENTS,
          "%zu events kept, %lld dropped, %u recorded", n, dropped, RACE_EVENTS);
    CHECK(stat_of("race", "steps") == RACE_EVENTS / 8, "steps %lld", stat_of("race", "steps"));
    CHECK(stat_of("race", "collectives") == RACE_EVENTS - RACE_EVENTS / 8, "collectives %lld",
          stat_of("race", "collectives"));
    for (size_t i = 0; i < n; i++) {
        char kind = 0;
        unsigned long long v[5];
        int pos = 0;
        int got = sscanf(lines[i], "%c %llu %llu %llu %llu %llu %n", &kind, &v[0], &v[1], &v[2], &v[3], &v[4],
                         &pos);
        if (got != 6 || (kind != 'c' && kind != 's')) {
            CHECK(0, "trace line %zu is malformed: %s", i, lines[i]);
            break;
        }
    }
    printf("write while recording: %d writes during the recording\n", writes);
    free_lines(lines, n);
}

/* --- the cap on the memory events take --- */

#define CAP_EVENTS 100000

/* [diag] trace_mb = 1 holds fewer events than recorded: the first are kept, the rest counted; the
 * failure's in-flight collective is kept even with the buffer full. */
static void test_cap(void)
{
    configure("cap", "trace_mb = 1\n");
    for (uint64_t i = 1; i <= CAP_EVENTS; i++)
        dps_diag_collective("dp_grads", 8, i, i + 1, i, 0);
    dps_diag_fail("unit: stuck", "dp_metric", 777777, 1000, 3);
    size_t n;
    char **lines = trace_of("cap", &n);
    long long dropped = stat_of("cap", "dropped_events");
    CHECK(dropped > 0 && dropped < CAP_EVENTS, "dropped_events %lld", dropped);
    CHECK((long long)n == CAP_EVENTS - dropped + 1, "%zu lines for %d events, %lld dropped, 1 failure", n,
          CAP_EVENTS, dropped);
    /* kept in order from the first; 1 MiB holds at least 16 000 events of 64 bytes */
    CHECK(n > 16000, "only %zu events in 1 MiB", n);
    for (size_t i = 0; i + 1 < n; i++) {
        unsigned long long seq = 0;
        if (sscanf(lines[i], "c %*u %*u %llu", &seq) != 1 || seq != i + 1) {
            CHECK(0, "event %zu is not collective #%zu: %s", i, i + 1, lines[i]);
            break;
        }
    }
    unsigned long long seq = 0, step = 0;
    CHECK(n > 0 && sscanf(lines[n - 1], "c %*u %*u %llu %llu", &seq, &step) == 2 && seq == 777777 &&
              step == 3,
          "the in-flight collective is not last: %s", n ? lines[n - 1] : "");
    CHECK(n > 0 && strstr(lines[n - 1], " dp_metric") != NULL, "in-flight hook: %s", n ? lines[n - 1] : "");
    CHECK(stat_of("cap", "collectives") == CAP_EVENTS + 1, "collectives %lld (a new configure starts afresh)",
          stat_of("cap", "collectives"));
    free_lines(lines, n);
}

/* --- a file that cannot be written --- */

static int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    while (d && readdir(d))
        n++;
    if (d) closedir(d);
    return n;
}

/* A stats file that cannot be written must not cost the trace: both files are closed, so flushed,
 * whatever the other's fate, before dps_diag_write returns. A 200-byte file size limit fails the
 * stats file (SIGXFSZ ignored: the write fails with EFBIG); the trace of one event fits. */
static void test_close_both(void)
{
    configure("close", "");
    dps_diag_collective("dp_grads", 8, 1, 2, 1, 0);
    struct rlimit old, small;
    CHECK(getrlimit(RLIMIT_FSIZE, &old) == 0, "getrlimit");
    small = old, small.rlim_cur = 200;
    void (*was)(int) = signal(SIGXFSZ, SIG_IGN);
    int fds = open_fds();
    CHECK(setrlimit(RLIMIT_FSIZE, &small) == 0, "setrlimit");
    dps_diag_write();
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, was);
    CHECK(open_fds() == fds, "%d descriptors open after writing, %d before", open_fds(), fds);
    size_t n;
    char **lines = trace_of("close", &n);
    CHECK(n == 1 && !strcmp(lines[0], "c 1 2 1 0 8 dp_grads"), "the trace holds %zu events: %s", n,
          n ? lines[0] : "");
    free_lines(lines, n);
}

/* --- hook names --- */

/* Declarative hooks are named "[hook NAME] symbol" in a buffer of the caller's: the name is the
 * rest of the trace line, spaces and all, and outlives the buffer. */
static void test_hook_names(void)
{
    configure("names", "");
    char where[64];
    snprintf(where, sizeof where, "[hook avg] avg_grads");
    dps_diag_collective(where, 16, 10, 20, 1, 1);
    snprintf(where, sizeof where, "[hook sum] loss");
    dps_diag_collective(where, 8, 30, 40, 2, 1);
    memset(where, 'x', sizeof where - 1), where[sizeof where - 1] = '\0';
    dps_diag_step(1);
    dps_diag_write();
    size_t n;
    char **lines = trace_of("names", &n);
    CHECK(n == 3, "%zu events", n);
    const char *want[] = {" [hook avg] avg_grads", " [hook sum] loss", " dp_step_end"};
    for (size_t i = 0; i < n && i < 3; i++) {
        size_t l = strlen(lines[i]), w = strlen(want[i]);
        CHECK(l > w && !strcmp(lines[i] + l - w, want[i]), "event %zu ends in '%s': %s", i, want[i],
              lines[i]);
    }
    free_lines(lines, n);
}

/* --- the clock offset to rank 0 --- */

/* The offset is signed and written as such; a rank that never measured says so; a fresh record
 * keeps the clocks (start-up measures once). Run first or alone: nothing before it sets a clock. */
static void test_clock(void)
{
    configure("unmeasured", "");
    dps_diag_write();
    CHECK(stat_of("unmeasured", "clock_measured") == 0, "clock_measured %lld without a measurement",
          stat_of("unmeasured", "clock_measured"));
    CHECK(stat_of("unmeasured", "clock_offset_ns") == 0, "clock_offset_ns %lld",
          stat_of("unmeasured", "clock_offset_ns"));
    dps_diag_set_clock(-1234567890123, 4567);
    dps_diag_write();
    configure("kept", "");
    dps_diag_write();
    const char *subs[] = {"unmeasured", "kept"};
    for (int i = 0; i < 2; i++) {
        CHECK(stat_of(subs[i], "clock_measured") == 1, "%s: clock_measured %lld", subs[i],
              stat_of(subs[i], "clock_measured"));
        CHECK(stat_of(subs[i], "clock_offset_ns") == -1234567890123, "%s: clock_offset_ns %lld", subs[i],
              stat_of(subs[i], "clock_offset_ns"));
        CHECK(stat_of(subs[i], "clock_error_ns") == 4567, "%s: clock_error_ns %lld", subs[i],
              stat_of(subs[i], "clock_error_ns"));
    }
}

static const struct {
    const char *name;
    void (*run)(void);
} tests[] = {
    {"clock", test_clock},      {"race", test_write_while_recording}, {"cap", test_cap},
    {"close", test_close_both}, {"names", test_hook_names},
};

/* test_diag [NAME...]: the tests named, or all of them. */
int main(int argc, char **argv)
{
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    for (size_t i = 0; i < sizeof tests / sizeof *tests; i++) {
        int chosen = argc < 2;
        for (int a = 1; a < argc; a++)
            chosen |= !strcmp(argv[a], tests[i].name);
        if (chosen) tests[i].run();
    }
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) fprintf(stderr, "test_diag: could not remove %s\n", root);
    dps_policy_free(&state.policy);
    return check_report("test_diag");
}
