/* The libtorch adapter's ABI: libdpshim.so defines libtorch's C++ entry points under their
 * mangled names (shim/interpose/libtorch.c) and forwards each call to the adapter plugin,
 * libdpshim-libtorch.so (hooks/adapters/libtorch/), loaded only in a process that has the
 * libtorch it was built for. Plain C, nothing of the shim: both sides include it.
 *
 * Each entry point takes at most six integer-class arguments on x86-64 (pointers, a this, a
 * hidden result pointer, small trivially copyable structs such as an optional<size_t> in two
 * registers), so one C signature forwards them all unchanged and returns what the callee
 * leaves in rax (the result pointer, for a function that returns a class by value). */
#ifndef DPS_PLUGIN_ABI_LIBTORCH_H
#define DPS_PLUGIN_ABI_LIBTORCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DPS_TORCH_ABI 4

/* ID, mangled name (x86-64), the adapter's handler. The names are those of libtorch 1.13 to 2.x:
 * no entry's signature names std::string, so both string ABIs share them. Where a signature has an
 * optional, libtorch before 2.2 mangles c10::optional, later ones std::optional (c10::optional
 * became an alias of it): both are defined, with the same handler. */
#define DPS_TORCH_ENTRIES(X)                                                                                 \
    X(SGD_STEP, "_ZN5torch5optim3SGD4stepESt8functionIFN2at6TensorEvEE", step)                               \
    X(ADAM_STEP, "_ZN5torch5optim4Adam4stepESt8functionIFN2at6TensorEvEE", step)                             \
    X(ADAMW_STEP, "_ZN5torch5optim5AdamW4stepESt8functionIFN2at6TensorEvEE", step)                           \
    X(ADAGRAD_STEP, "_ZN5torch5optim7Adagrad4stepESt8functionIFN2at6TensorEvEE", step)                       \
    X(RMSPROP_STEP, "_ZN5torch5optim7RMSprop4stepESt8functionIFN2at6TensorEvEE", step)                       \
    X(LBFGS_STEP, "_ZN5torch5optim5LBFGS4stepESt8functionIFN2at6TensorEvEE", step)                           \
    X(ADD_PARAM_GROUP, "_ZN5torch5optim9Optimizer15add_param_groupERKNS0_19OptimizerParamGroupE",            \
      add_param_group)                                                                                       \
    X(BACKWARD, "_ZN5torch8autograd8backwardERKSt6vectorIN2at6TensorESaIS3_EES7_N3c108optionalIbEEbS7_",     \
      backward)                                                                                              \
    X(BACKWARD_STD, "_ZN5torch8autograd8backwardERKSt6vectorIN2at6TensorESaIS3_EES7_St8optionalIbEbS7_",     \
      backward)                                                                                              \
    X(SEQUENTIAL_NEXT, "_ZN5torch4data8samplers17SequentialSampler4nextEm", sampler_next)                    \
    X(RANDOM_NEXT, "_ZN5torch4data8samplers13RandomSampler4nextEm", sampler_next)                            \
    X(SEQUENTIAL_RESET, "_ZN5torch4data8samplers17SequentialSampler5resetEN3c108optionalImEE",               \
      sequential_reset)                                                                                      \
    X(RANDOM_RESET, "_ZN5torch4data8samplers13RandomSampler5resetEN3c108optionalImEE", random_reset)         \
    X(SEQUENTIAL_RESET_STD, "_ZN5torch4data8samplers17SequentialSampler5resetESt8optionalImE",               \
      sequential_reset)                                                                                      \
    X(RANDOM_RESET_STD, "_ZN5torch4data8samplers13RandomSampler5resetESt8optionalImE", random_reset)         \
    X(SGD_SAVE, "_ZNK5torch5optim3SGD4saveERNS_9serialize13OutputArchiveE", save_optimizer)                  \
    X(ADAM_SAVE, "_ZNK5torch5optim4Adam4saveERNS_9serialize13OutputArchiveE", save_optimizer)                \
    X(ADAMW_SAVE, "_ZNK5torch5optim5AdamW4saveERNS_9serialize13OutputArchiveE", save_optimizer)              \
    X(ADAGRAD_SAVE, "_ZNK5torch5optim7Adagrad4saveERNS_9serialize13OutputArchiveE", save_optimizer)          \
    X(RMSPROP_SAVE, "_ZNK5torch5optim7RMSprop4saveERNS_9serialize13OutputArchiveE", save_optimizer)          \
    X(SGD_LOAD, "_ZN5torch5optim3SGD4loadERNS_9serialize12InputArchiveE", load_optimizer)                    \
    X(ADAM_LOAD, "_ZN5torch5optim4Adam4loadERNS_9serialize12InputArchiveE", load_optimizer)                  \
    X(ADAMW_LOAD, "_ZN5torch5optim5AdamW4loadERNS_9serialize12InputArchiveE", load_optimizer)                \
    X(ADAGRAD_LOAD, "_ZN5torch5optim7Adagrad4loadERNS_9serialize12InputArchiveE", load_optimizer)            \
    X(RMSPROP_LOAD, "_ZN5torch5optim7RMSprop4loadERNS_9serialize12InputArchiveE", load_optimizer)

/* at::_ops::batch_norm::call, which torch::nn::BatchNorm*d's forward reaches through the inline
 * torch::nn::functional::batch_norm and at::batch_norm: a Tensor returned through a hidden
 * pointer, five tensors by reference (input, then optional weight, bias, running mean and
 * variance), bool training, double momentum, double eps, bool cudnn_enabled. Its bools go past
 * the six integer registers and its doubles in SSE registers, so it has a C signature and stubs of
 * its own. Mangled as the optimizers' entries, c10::optional before 2.2, std::optional after. */
#define DPS_TORCH_BATCH_NORMS(X)                                                                             \
    X(BATCH_NORM, "_ZN2at4_ops10batch_norm4callERKNS_6TensorERKN3c108optionalIS2_EES9_S9_S9_bddb")           \
    X(BATCH_NORM_STD, "_ZN2at4_ops10batch_norm4callERKNS_6TensorERKSt8optionalIS2_ES8_S8_S8_bddb")

typedef void *(*dps_torch_batch_norm_t)(void *out, const void *input, const void *weight, const void *bias,
                                        const void *running_mean, const void *running_var, bool training,
                                        double momentum, double eps, bool cudnn_enabled);

/* The adapter's handler of a training-mode batch_norm the program called (libtorch's own calls,
 * such as InstanceNorm's, go straight to libtorch): the real function first, then its arguments;
 * returns out. */
typedef void *(*dps_torch_batch_norm_handler_t)(dps_torch_batch_norm_t real, void *out, const void *input,
                                                const void *weight, const void *bias,
                                                const void *running_mean, const void *running_var,
                                                bool training, double momentum, double eps,
                                                bool cudnn_enabled);
#define DPS_TORCH_BATCH_NORM_SYMBOL "dpshim_libtorch_batch_norm"

typedef enum {
#define DPS_TORCH_ENUM(id, name, fn) DPS_TORCH_##id,
    DPS_TORCH_ENTRIES(DPS_TORCH_ENUM)
#undef DPS_TORCH_ENUM
        DPS_TORCH_COUNT
} dps_torch_entry_t;

/* A handler: the call's six argument registers and the real function; returns rax. */
typedef uintptr_t (*dps_torch_handler_t)(const uintptr_t arg[6], void *real);

typedef struct dps_torch_config {
    int abi; /* DPS_TORCH_ABI */
    int rank, size;
    int split_mode; /* [data] mode = split, else scale */
    int uneven;     /* [data] uneven: 0 pad, 1 drop, 2 join */
    int eval_whole; /* [data] eval = whole */
    int shard;      /* [optim] shard: 0 off, 1 on, 2 auto */
    int bn_sync;    /* [bn] sync = on */
} dps_torch_config_t;

/* The plugin's exports: DPS_TORCH_BATCH_NORM_SYMBOL (a dps_torch_batch_norm_handler_t), and this,
 * which fills handler[DPS_TORCH_COUNT] (NULL: the real call, unchanged).
 * 0; 1 with err set where the process runs a libtorch version other than the plugin's (its
 * calls then run unchanged); -1 with err set where the plugin cannot start. */
typedef int (*dps_torch_init_t)(const dps_torch_config_t *c, dps_torch_handler_t *handler, char *err,
                                size_t errlen);
#define DPS_TORCH_INIT_SYMBOL "dpshim_libtorch_init"

#endif
