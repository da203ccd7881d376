/* The process-wide state (see dps.h): filled by start-up before main(), read everywhere. */
#include "dps.h"

dps_state_t dps_g = {.size = 1, .eff_size = 1, .launcher = "singleton", .compress_dtype = -1};

__thread int dps_in_shim __attribute__((tls_model("initial-exec")));
