/* A job of two or more ranks in which no hook shared out any work ran N copies of the program
 * side by side: said at exit with what was looked for and what was found, so it is never a silent
 * no-op, or ([guard] nothing_shared = error) an error on every rank for jobs that must distribute. */
#define _GNU_SOURCE
#include <link.h>
#include <stdio.h>
#include <string.h>

#include "core/dps.h"
#include "diag/diag.h"
#include "engine/engine.h"
#include "ffi/ffihooks.h"
#include "interpose/libtorch.h"
#include "start.h"

/* Libraries that say which framework the program runs on, by the start of their file name. */
static const struct framework {
    const char *prefix, *what;
} frameworks[] = {
    {"libtorch_python.so", "PyTorch in Python"},
    {"libtorch_cpu.so", "libtorch, PyTorch's C++ library"},
    {"libtensorflow", "TensorFlow"},
    {"libonnxruntime.so", "ONNX Runtime"},
    {"libmxnet.so", "MXNet"},
    {"libpaddle", "PaddlePaddle"},
    {"libmegengine", "MegEngine"},
};
enum { N_FRAMEWORKS = sizeof frameworks / sizeof *frameworks };

typedef struct found {
    int has[N_FRAMEWORKS];
    char names[N_FRAMEWORKS][128];
} found_t;

static int look_at_object(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    found_t *f = data;
    const char *slash = info->dlpi_name ? strrchr(info->dlpi_name, '/') : NULL;
    const char *base = slash ? slash + 1 : info->dlpi_name;
    for (int i = 0; base && i < N_FRAMEWORKS; i++)
        if (!f->has[i] && !strncmp(base, frameworks[i].prefix, strlen(frameworks[i].prefix))) {
            f->has[i] = 1;
            snprintf(f->names[i], sizeof f->names[i], "%s", base);
        }
    return 0;
}

static int found_lib(const found_t *f, const char *prefix)
{
    for (int i = 0; i < N_FRAMEWORKS; i++)
        if (f->has[i] && !strcmp(frameworks[i].prefix, prefix)) return 1;
    return 0;
}

/* What was looked for and found, then what to do, into out. */
static void explain(char *out, size_t cap)
{
    found_t f = {0};
    dl_iterate_phdr(look_at_object, &f);
    size_t n = (size_t)snprintf(out, cap, "Found: ");
#define ADD(...) (n += n < cap ? (size_t)snprintf(out + n, cap - n, __VA_ARGS__) : 0)
    int any = 0;
    for (int i = 0; i < N_FRAMEWORKS; i++)
        if (f.has[i]) ADD("%s%s (%s)", any++ ? ", " : "", f.names[i], frameworks[i].what);
    if (!any) ADD("no framework library");
    int declared = 0, sites = 0;
    dps_ffi_hooks_summary(&declared, &sites);
    const char *torch = dps_torch_adapter_state();
    ADD("; %s; no call of the hook ABI (dp_grads, dp_batch, dp_epoch) shared out work",
        dps_g.python_adapter          ? "the PyTorch adapter in this Python process"
        : dps_torch_adapter_running() ? torch
                                      : "no adapter");
    if (declared) ADD("; %d [hook] declaration(s) of the policy, bound at %d call site(s)", declared, sites);
    ADD(". ");
    if (dps_g.python_adapter && dps_e.whole_batches)
        ADD("The script only evaluated or ran inference (%llu DataLoader batches under torch.no_grad() or "
            "with its "
            "models in eval mode): evaluation runs whole on every rank, so that each prints what it prints "
            "alone; "
            "[data] eval = sharded shares it out for scripts that reduce their own metrics.",
            (unsigned long long)dps_e.whole_batches);
    else if (dps_g.python_adapter)
        ADD("The PyTorch adapter shares out work once the script imports torch and trains (a backward pass, "
            "a "
            "DataLoader's batches); evaluation and inference run whole on every rank.");
    else if (found_lib(&f, "libtorch_python.so"))
        ADD("PyTorch runs in this process without the adapter: set [adapters] python = auto.");
    else if (found_lib(&f, "libtorch_cpu.so") && dps_torch_adapter_running())
        ADD("The libtorch adapter shares out work at a backward pass, an optimizer's step and the batches of "
            "libtorch's samplers; evaluation under NoGradGuard runs whole on every rank.");
    else if (found_lib(&f, "libtorch_cpu.so") && torch[0])
        ADD("The libtorch adapter did not run: %s.", torch);
    else if (found_lib(&f, "libtorch_cpu.so"))
        ADD("No libtorch optimizer's step, backward pass or sampler was called, where the libtorch adapter "
            "acts; "
            "a program with an update of its own calls the hook ABI (dpshim/hooks.h).");
    else if (declared && !sites)
        ADD("No [hook] declaration was bound: check their symbol = against the program's (nm -D).");
    else
        ADD("No framework called the hook ABI and no [hook] declaration of the policy did; a Python script "
            "needs [adapters] python = auto.");
    if (!dps_e.whole_batches)
        ADD(" If the launched command only starts the trainer (a shell line, a wrapper such as "
            "/usr/bin/time), "
            "launch the trainer itself.");
#undef ADD
}

int dps_check_something_shared(void)
{
    int mode = DPS_POLICY_ENUM(&dps_g.policy, guard, nothing_shared);
    if (dps_g.size < 2 || mode == DPS_V_guard_nothing_shared_off || dps_e.shared_work || dps_e.aside)
        return 0;
    char why[1024], head[128];
    explain(why, sizeof why);
    snprintf(head, sizeof head, "nothing was distributed in this job of %d ranks", dps_g.size);
    dps_diag_nothing_shared(head, why);
    int error = mode == DPS_V_guard_nothing_shared_error;
    if (dps_g.rank != 0) return error; /* once for the job */
    if (error)
        DPS_ERROR(
            "%s: no gradient was averaged and no batch or epoch was shared out. %s [guard] nothing_shared = "
            "error: every rank exits %d",
            head, why, DPS_EXIT_CONFIG);
    else
        DPS_WARN(
            "%s: no gradient was averaged and no batch or epoch was shared out, so every rank ran the whole "
            "program by itself. %s",
            head, why);
    return error;
}
