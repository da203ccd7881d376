/* dpshim-bench: the benchmark of libdpshim-bench.so (dpshim_bench.c) as a program of its own. */
int dpshim_bench_main(int argc, char **argv);

int main(int argc, char **argv)
{
    return dpshim_bench_main(argc, argv);
}
