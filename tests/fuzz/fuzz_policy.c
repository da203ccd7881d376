/* libFuzzer target: any bytes as a policy file must give 0 or one clean error, never a crash,
 * a leak or undefined behaviour; the glob matcher gets the same bytes as pattern and path. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "glob.h"
#include "policy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dps_policy_t p;
    dps_error_t e;
    dps_policy_init(&p);
    if (dps_policy_parse(&p, (const char *)data, size, "fuzz.conf", &e) != 0 &&
        !memchr(e.msg, '\0', sizeof e.msg))
        __builtin_trap(); /* an error message must be a terminated string */
    dps_policy_free(&p);

    /* pattern = bytes up to the first newline (when it is a valid glob), path = the rest */
    const uint8_t *nl = memchr(data, '\n', size);
    if (nl && (size_t)(nl - data) < 256) {
        char pat[256];
        size_t plen = (size_t)(nl - data);
        memcpy(pat, data, plen);
        pat[plen] = '\0';
        if (!memchr(pat, '\0', plen) && dps_glob_check(pat, plen) == NULL)
            dps_glob_match(pat, (const char *)nl + 1, size - plen - 1);
    }
    return 0;
}
