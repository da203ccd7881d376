// The libtorch version the adapter is built for, apart from the adapter's code: the one compiled
// adapter links with it for its libtorch, and the tests link it with another version's number
// (an adapter that must decline to start) without compiling the adapter twice.
extern "C" __attribute__((visibility("hidden"))) const char dps_torch_built_for[] = DPS_TORCH_VERSION;
