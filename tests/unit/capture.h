/* Standard error of what runs between dps_test_capture_begin and dps_test_capture_end, for unit
 * tests that check the shim's messages (its logging writes to fd 2 with write(2)). */
#ifndef DPS_TEST_CAPTURE_H
#define DPS_TEST_CAPTURE_H
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int dps_test_saved_stderr = -1;
static FILE *dps_test_captured;

static inline void dps_test_capture_begin(void)
{
    fflush(stderr);
    dps_test_captured = tmpfile();
    dps_test_saved_stderr = dup(2);
    if (!dps_test_captured || dps_test_saved_stderr < 0 || dup2(fileno(dps_test_captured), 2) < 0) abort();
}

/* The text captured (at most 4 KiB), valid until the next capture. */
static inline const char *dps_test_capture_end(void)
{
    static char text[4096];
    fflush(stderr);
    dup2(dps_test_saved_stderr, 2);
    close(dps_test_saved_stderr);
    rewind(dps_test_captured);
    size_t n = fread(text, 1, sizeof text - 1, dps_test_captured);
    text[n] = '\0';
    fclose(dps_test_captured);
    return text;
}
#endif
