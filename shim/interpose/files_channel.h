/* The file channel before the job's first collective (posix_files.c): the interposers call it at
 * each gated call, before the call is followed or led. */
#ifndef DPS_INTERPOSE_FILES_CHANNEL_H
#define DPS_INTERPOSE_FILES_CHANNEL_H

/* Opens the backend, and with it the channel rank 0's outcomes go over, where this process is
 * the one that talks for its rank and the backend is not open yet; else nothing. errno is kept. */
void dps_files_start_channel(void);

#endif
