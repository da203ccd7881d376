/* dpshim-diag model: predicted step time and scaling efficiency at 8 .. 1024 GPUs. */
#ifndef DPS_DIAG_MODEL_H
#define DPS_DIAG_MODEL_H

/* argv: the arguments after "model". 0, 1 on a failure to read, 2 on bad usage. */
int dps_diag_model(int argc, char **argv);

#endif
