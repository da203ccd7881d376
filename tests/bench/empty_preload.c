/* Nothing at all: preloaded beside libdpshim.so by bench_exec (./dev.sh bench), it measures the
 * floor, what the dynamic loader's mapping of any one more library costs a process. */
typedef int dps_bench_nothing_t;
