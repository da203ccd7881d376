/* [output] stdout: what other ranks' standard output becomes (output.c). */
#ifndef DPS_OUTPUT_H
#define DPS_OUTPUT_H

#include "core/dps.h"

/* In the rank process's constructor; -1 with errno when the redirection cannot be set up. */
int dps_output_setup(const dps_state_t *s);

/* Before a stdio write to stderr (the interposers): in a wrapper, whose trainer (a child) took
 * the rank's place, stderr becomes line buffered (output.c says why). */
void dps_output_wrapper_stderr(void);

/* [output] stdout = rank0, elastic mode: this rank became rank 0 after rank 0 was lost, and
 * prints from now on (stdout as the launcher gave it). 0, or -1 where it cannot (the rank process
 * replaced itself with exec after the shim silenced it). */
int dps_output_take_over(void);

#endif
