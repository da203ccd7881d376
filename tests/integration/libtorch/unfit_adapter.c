/* Stands in for a libtorch adapter built against another libtorch version under the same soname
 * (pip wheels and the zip from pytorch.org name every version libtorch_cpu.so): it needs a
 * function the libtorch in the process lacks, so loading it fails with an undefined symbol. */
void dps_test_function_of_another_libtorch(void);

void dps_test_unfit_adapter(void)
{
    dps_test_function_of_another_libtorch();
}
