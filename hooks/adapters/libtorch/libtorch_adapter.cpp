// The libtorch adapter: what the PyTorch adapter does for Python scripts, for C++ programs on
// libtorch, at the entry points libdpshim.so forwards here (shim/plugin_abi/libtorch.h). All
// collectives go through the hook ABI, so the guard, the diagnostics and the policy apply.
//
//   Optimizer::add_param_group   the new group's parameters from rank 0 (dp_params)
//   torch::autograd::backward    at its end, the gradients of every optimizer's parameters and
//                                the loss's value averaged (dp_grads), weighted by each rank's
//                                share of the batch being trained on
//   <optimizer>::step            gradients no backward averaged since this optimizer's last
//                                step averaged first; dp_step_end after; after a lost rank, in
//                                scale mode, the batches it had not trained, to hand out next
//   <sampler>::next              split mode: this rank's share of each batch (dp_batch); scale
//                                mode: every Nth batch; under NoGradGuard ([data] eval =
//                                whole): the whole batch, so an evaluation pass prints as alone
//   RandomSampler::reset         rank 0's CPU generator state first: one order on every rank,
//                                the generator advanced as alone
//   <optimizer>::step, with      [optim] shard: each rank steps its 1/N of the parameters'
//   ::save and ::load            elements, keeping state for those only; then every parameter
//                                from its owner (dp_from_owners). save writes the whole state
//                                (gathered from the owners); load keeps this rank's share
//   at::_ops::batch_norm::call   BatchNorm in training mode, called by the program (its
//                                torch::nn::BatchNorm*d): statistics of the global batch
//                                (dp_bn_stats) in forward and backward, running ones as alone
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Version.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <atomic>
#include <cstdio>
#include <dlfcn.h>
#include <deque>
#include <memory>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <mutex>
#include <sstream>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "dpshim/hooks.h"
#include "plugin_abi/batchnorm.h"
#include "plugin_abi/libtorch.h"

// built_for.cpp: the libtorch version this build of the adapter is for
extern "C" __attribute__((visibility("hidden"))) const char dps_torch_built_for[];

// a library before the one pass lacks it: the adapter then keeps libtorch's ops
#pragma weak dpshim_bn_backward

namespace
{

using Batch = c10::optional<std::vector<size_t>>;
using NextFn = Batch (*)(void *self, size_t batch_size);
using RawFn = uintptr_t (*)(uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t);

dps_torch_config_t conf;
std::atomic<bool> batch_norms{false}; // the program's BatchNorm has run in training mode

struct State {
    std::vector<at::Tensor> params;                     // every optimizer's, in the order given
    std::unordered_set<const void *> known;             // their TensorImpls
    std::unordered_map<const void *, uint64_t> stepped; // optimizer -> backward passes at its last step
    uint64_t backwards = 0, steps = 0;
    // per sampler, the training batches it handed out that no step has used yet, oldest first:
    // their global size, and how many ranks took each sample (1: shared out; N: taken whole);
    // the sampler that handed out the last training batch is the one being trained on
    struct Handed {
        uint64_t n, replicas;
        // scale mode: the group of batches this one was taken from (a place past its end took
        // padding), and this rank's place in it among the ranks there were then: the batches of
        // a rank lost before their step are trained again (hand_out_lost_batches)
        std::vector<std::vector<size_t>> group = {};
        int place = 0, ranks = 0;
    };
    std::unordered_map<const void *, std::deque<Handed>> handed;
    // per sampler, the batches of lost ranks not yet trained, handed out before its next ones
    std::unordered_map<const void *, std::deque<std::vector<size_t>>> make_up;
    const void *training = nullptr;
    bool batch_used = false;        // a step was made on the front batch: the next backward moves on
    uint64_t backwards_at_step = 0; // backward passes as the last step ended
    // a step of the training sampler's pass came after more than one backward pass outside a
    // closure (gradient accumulation): its queue then holds batches already trained
    bool accumulating = false;
    std::vector<at::Tensor> copies; // contiguous copies of parameters given to dp_params
} st;

std::deque<State::Handed> *training_batches()
{
    auto it = st.handed.find(st.training);
    return it == st.handed.end() ? nullptr : &it->second;
}

// The job cannot go on once a rank has left a sequence of collectives half made: an exception
// thrown between two of them (out of memory) would leave the others waiting.
[[noreturn]] void fail(const char *where, const std::exception &e)
{
    std::fprintf(stderr,
                 "[dpshim] ERROR the libtorch adapter failed in %s, between collectives the other ranks "
                 "make too: %s\n",
                 where, e.what());
    std::fflush(stderr);
    std::abort(); // the guard reports the crash and the launcher ends the job
}

uintptr_t call_real(void *real, const uintptr_t a[6])
{
    return reinterpret_cast<RawFn>(real)(a[0], a[1], a[2], a[3], a[4], a[5]);
}

// The real call, then `undo`, whether it returns or throws.
template <class Undo> uintptr_t call_then(void *real, const uintptr_t a[6], Undo &undo)
{
    uintptr_t r;
    try {
        r = call_real(real, a);
    } catch (...) {
        undo();
        throw;
    }
    undo();
    return r;
}

int32_t dtype_of(const at::Tensor &t)
{
    switch (t.scalar_type()) {
    case at::kFloat:
        return DP_F32;
    case at::kDouble:
        return DP_F64;
    case at::kHalf:
        return DP_F16;
    case at::kBFloat16:
        return DP_BF16;
    default:
        return -1;
    }
}

// PyTorch's current CUDA stream on a device: c10::cuda::getCurrentCUDAStream(device) and
// CUDAStream::stream(), looked up at run time in the libc10_cuda.so that a CUDA build of libtorch
// loads, so that the adapter builds and runs without CUDA. A CUDAStream is a c10::Stream (a
// Device of two int8 and an int64 id), trivially copyable: returned in two registers.
struct CudaStream {
    uint64_t device, id;
};
static_assert(sizeof(CudaStream) == sizeof(c10::Stream), "c10::cuda::CUDAStream is a c10::Stream");

void *current_stream(int32_t device)
{
    using Current = CudaStream (*)(int8_t device_index);
    using Raw = void *(*)(const CudaStream *self);
    static const auto current =
        reinterpret_cast<Current>(dlsym(RTLD_DEFAULT, "_ZN3c104cuda20getCurrentCUDAStreamEa"));
    static const auto raw = reinterpret_cast<Raw>(dlsym(RTLD_DEFAULT, "_ZNK3c104cuda10CUDAStream6streamEv"));
    if (!current || !raw) return nullptr;
    CudaStream s = current(static_cast<int8_t>(device));
    return raw(&s);
}

// A tensor as the hooks take it. For a CUDA tensor the hooks are told PyTorch's current stream
// on its device: the collective then starts after the work queued there (the backward's last
// kernels) and the stream's later work (the optimizer's kernels) waits for its result, with no
// synchronization of the host, as the PyTorch adapter does.
dp_tensor view_of(const at::Tensor &t, const char *name)
{
    int32_t device = t.is_cuda() ? static_cast<int32_t>(t.get_device()) : DP_HOST;
    if (device != DP_HOST) dp_set_stream(device, current_stream(device));
    return dp_tensor{t.data_ptr(), static_cast<uint64_t>(t.numel()), dtype_of(t), device, name};
}

// The share of the batch the loop trains on now weighs the gradients: with DataLoader workers
// the samplers run ahead, so the oldest batch handed out and not yet stepped on is that batch.
// A batch taken whole by every rank weighs each 1/N: its samples counted once per rank. True
// when the batch was shared out; false for batches every rank computes whole (made by hand, or
// fewer samples than ranks).
bool weigh_current_batch()
{
    auto *q = training_batches();
    if (q && st.batch_used && !q->empty()) q->pop_front(); // the batch the last step used
    st.batch_used = false;
    if (!q || q->empty()) return false;
    const auto &b = q->front();
    if (conf.split_mode) {
        std::vector<uint64_t> idx(b.n * b.replicas);
        dp_batch(idx.data(), idx.size());
    }
    return b.replicas == 1;
}

// Gradients of ps averaged over the ranks; a parameter with a gradient on some ranks only gets
// zeros on the others first, one with none anywhere is left alone. The loss's value too. Where
// every rank computed the same batch, float32 and half gradients are averaged as float64 copies:
// N equal values sum exactly there and their mean rounds back to each of them, where a float32
// sum of three already rounds (the PyTorch adapter does the same).
void average(const std::vector<at::Tensor> &ps, const at::Tensor *loss, bool shared)
{
    try {
        at::NoGradGuard no_grad;
        std::vector<double> has(ps.size());
        for (size_t i = 0; i < ps.size(); i++)
            has[i] = ps[i].grad().defined();
        if (!ps.empty()) dp_metric(has.data(), has.size(), DP_MAX);
        std::vector<at::Tensor> tensors;
        for (size_t i = 0; i < ps.size(); i++) {
            if (!has[i]) continue;
            const at::Tensor &p = ps[i];
            if (!p.grad().defined())
                p.mutable_grad() = at::zeros_like(p, at::MemoryFormat::Contiguous);
            else if (!p.grad().is_contiguous())
                p.mutable_grad() = p.grad().contiguous();
            if (dtype_of(p.grad()) >= 0) tensors.push_back(p.grad());
        }
        if (loss && loss->defined() && loss->numel() == 1 && loss->is_contiguous() && dtype_of(*loss) >= 0)
            tensors.push_back(*loss);
        // one call per dtype, each in the order given; widened copies written back after
        std::vector<std::pair<at::Tensor, at::Tensor>> widened;
        std::vector<std::vector<dp_tensor>> by_dtype(4);
        for (const auto &t : tensors) {
            if (!shared && dtype_of(t) != DP_F64) {
                widened.emplace_back(t, t.to(at::kDouble));
                by_dtype[DP_F64].push_back(view_of(widened.back().second, nullptr));
            } else {
                by_dtype[static_cast<size_t>(dtype_of(t))].push_back(view_of(t, nullptr));
            }
        }
        for (auto &ts : by_dtype)
            if (!ts.empty()) dp_grads(ts.data(), ts.size());
        for (auto &w : widened)
            w.first.copy_(w.second);
    } catch (const std::exception &e) {
        fail("averaging the gradients", e);
    }
}

std::vector<at::Tensor> params_of(const torch::optim::Optimizer &opt)
{
    std::vector<at::Tensor> ps;
    for (const auto &g : opt.param_groups())
        for (const auto &p : g.params())
            ps.push_back(p);
    return ps;
}

uintptr_t add_param_group(const uintptr_t a[6], void *real)
{
    uintptr_t r = call_real(real, a);
    auto *opt = reinterpret_cast<torch::optim::Optimizer *>(a[0]);
    st.stepped.emplace(opt, st.backwards); // its first step: averaged if a backward came since
    std::vector<dp_tensor> ts;
    std::vector<std::pair<at::Tensor, at::Tensor>> back; // a parameter and its contiguous copy
    at::NoGradGuard no_grad;
    for (const auto &p : opt->param_groups().back().params()) {
        if (st.known.insert(p.unsafeGetTensorImpl()).second) st.params.push_back(p);
        if (dtype_of(p) < 0) {
            std::fprintf(stderr,
                         "[dpshim] WARN the libtorch adapter: a parameter of dtype %s is not broadcast "
                         "from rank 0 or averaged (the hook ABI has no such dtype)\n",
                         c10::toString(p.scalar_type()));
            continue;
        }
        if (p.is_contiguous()) {
            ts.push_back(view_of(p, nullptr));
        } else { // kept: the drift check may read it again
            back.emplace_back(p, p.contiguous());
            st.copies.push_back(back.back().second);
            ts.push_back(view_of(back.back().second, nullptr));
        }
    }
    if (!ts.empty()) dp_params(ts.data(), ts.size());
    for (auto &b : back)
        b.first.copy_(b.second);
    return r;
}

uintptr_t backward(const uintptr_t a[6], void *real)
{
    const auto &roots = *reinterpret_cast<const std::vector<at::Tensor> *>(a[0]);
    const auto &gradients = *reinterpret_cast<const std::vector<at::Tensor> *>(a[1]);
    const auto &inputs = *reinterpret_cast<const std::vector<at::Tensor> *>(a[4]);
    uintptr_t r = call_real(real, a);
    // a backward for the gradients of chosen inputs (a gradient penalty) is no training step's
    if (!inputs.empty() || st.params.empty()) return r;
    bool shared = weigh_current_batch();
    // the loss's value goes along where it is one: a scalar, or one element backpropagated
    // without a gradient (added up in torch::zeros({1})); per-sample losses, one element on a
    // rank whose share is one sample, come with a gradient of their own
    bool given = !gradients.empty() && gradients[0].defined();
    bool one_loss = roots.size() == 1 && (roots[0].dim() == 0 || (roots[0].numel() == 1 && !given));
    average(st.params, one_loss ? &roots[0] : nullptr, shared);
    st.backwards++;
    return r;
}

// --- optimizer sharding ([optim] shard) -----------------------------------------------------------
//
// As the PyTorch adapter does: the parameters laid end to end, rank r owns the r-th 1/N of the
// elements; a tensor across a boundary is cut, each piece stepped as a tensor of its own that
// aliases those elements (its state is the optimizer's state for them). libtorch's optimizers
// update each element from its own gradient and state alone, so the parameters stay bitwise
// those of the unsharded step. Parameters added later are shared out among themselves.

namespace o = torch::optim;

// Pieces hold no reference to their parameter (a plan must not keep a model alive): the
// functions below get the parameter from the optimizer's groups.
struct Piece {
    int64_t numel, start, end; // the parameter's elements, and the piece's [start, end)
    int owner;
    at::Tensor stepped; // a cut piece's own tensor, once made: it keys the piece's state
    bool whole() const { return start == 0 && end == numel; }
};

struct Plan {
    const std::type_info *type = nullptr;                     // the optimizer's class
    std::vector<Piece> pieces;                                // parameter order, element order
    std::unordered_map<const void *, std::vector<size_t>> of; // TensorImpl -> its pieces
    std::vector<const void *> key;                            // the parameters planned for
};

std::unordered_map<const void *, std::unique_ptr<Plan>> plans; // optimizer -> plan; null: whole

// The optimizer's state is keyed by the parameter's TensorImpl: its address printed as a string
// in older libtorch (1.13), the address itself in newer ones (2.6).
using StateKey = std::decay_t<decltype(std::declval<o::Optimizer &>().state())>::key_type;

template <typename Key> Key state_key(at::TensorImpl *impl)
{
    if constexpr (std::is_same_v<Key, std::string>) {
        std::ostringstream s;
        s << impl;
        return s.str();
    } else {
        return impl;
    }
}

StateKey key_of(const at::Tensor &t)
{
    return state_key<StateKey>(t.unsafeGetTensorImpl());
}

// auto: the optimizers whose update costs more than sending the parameters out again (not SGD,
// measured for the PyTorch adapter); on: SGD too; never LBFGS, whose line search reads every
// parameter at once.
bool shards(const o::Optimizer &opt)
{
    if (conf.shard == 0) return false;
    if (dynamic_cast<const o::LBFGS *>(&opt)) {
        static bool said;
        if (conf.shard == 1 && conf.rank == 0 && !said)
            std::fprintf(
                stderr, "[dpshim] WARN [optim] shard = on: LBFGS keeps every parameter on every rank, as its "
                        "line search evaluates every parameter together\n");
        said = true;
        return false;
    }
    bool costly = dynamic_cast<const o::Adam *>(&opt) || dynamic_cast<const o::AdamW *>(&opt) ||
                  dynamic_cast<const o::RMSprop *>(&opt) || dynamic_cast<const o::Adagrad *>(&opt);
    return costly || (conf.shard == 1 && dynamic_cast<const o::SGD *>(&opt));
}

// The per-element tensors of a parameter's state (undefined where the options leave one out)
// and its step count (null where the state has none), for each optimizer libtorch has.
struct Fields {
    std::vector<at::Tensor *> tensors;
    int64_t *step;
};

Fields fields_of(o::OptimizerParamState &s)
{
    if (auto *a = dynamic_cast<o::AdamParamState *>(&s))
        return {{&a->exp_avg(), &a->exp_avg_sq(), &a->max_exp_avg_sq()}, &a->step()};
    if (auto *a = dynamic_cast<o::AdamWParamState *>(&s))
        return {{&a->exp_avg(), &a->exp_avg_sq(), &a->max_exp_avg_sq()}, &a->step()};
    if (auto *a = dynamic_cast<o::RMSpropParamState *>(&s))
        return {{&a->square_avg(), &a->momentum_buffer(), &a->grad_avg()}, &a->step()};
    if (auto *a = dynamic_cast<o::AdagradParamState *>(&s)) return {{&a->sum()}, &a->step()};
    if (auto *a = dynamic_cast<o::SGDParamState *>(&s)) return {{&a->momentum_buffer()}, nullptr};
    return {{}, nullptr};
}

std::unique_ptr<o::OptimizerParamState> new_state(const o::Optimizer &opt)
{
    if (dynamic_cast<const o::Adam *>(&opt)) return std::make_unique<o::AdamParamState>();
    if (dynamic_cast<const o::AdamW *>(&opt)) return std::make_unique<o::AdamWParamState>();
    if (dynamic_cast<const o::RMSprop *>(&opt)) return std::make_unique<o::RMSpropParamState>();
    if (dynamic_cast<const o::Adagrad *>(&opt)) return std::make_unique<o::AdagradParamState>();
    return std::make_unique<o::SGDParamState>();
}

// Every parameter of the optimizer once, in order.
std::vector<at::Tensor> unique_params(const o::Optimizer &opt)
{
    std::vector<at::Tensor> ps;
    std::unordered_set<const void *> seen;
    for (const auto &p : params_of(opt))
        if (seen.insert(p.unsafeGetTensorImpl()).second) ps.push_back(p);
    return ps;
}

void cut(Plan &plan, const std::vector<at::Tensor> &fresh)
{
    int64_t total = 0;
    for (const auto &p : fresh)
        total += p.numel();
    std::vector<int64_t> bound(static_cast<size_t>(conf.size) + 1);
    for (int r = 0; r <= conf.size; r++)
        bound[static_cast<size_t>(r)] = total * r / conf.size;
    int64_t at = 0;
    for (const auto &p : fresh) {
        int64_t n = p.numel(), s = at;
        auto &mine = plan.of[p.unsafeGetTensorImpl()];
        do {
            int r = 0;
            while (r + 1 < conf.size && bound[static_cast<size_t>(r) + 1] <= s)
                r++;
            int64_t e = p.is_contiguous() ? std::min(at + n, bound[static_cast<size_t>(r) + 1]) : at + n;
            mine.push_back(plan.pieces.size());
            plan.pieces.push_back({n, s - at, e - at, r, at::Tensor()});
            s = e;
        } while (s < at + n);
        at += n;
    }
}

Plan *plan_of(const o::Optimizer &opt)
{
    std::vector<at::Tensor> ps = unique_params(opt);
    std::vector<const void *> key;
    for (const auto &p : ps)
        key.push_back(p.unsafeGetTensorImpl());
    // a plan is the optimizer's at this address while its class is the same and the parameters
    // it planned for still lead its list (add_param_group appends); else the optimizer there is
    // another one, made where a freed one was
    auto it = plans.find(&opt);
    if (it != plans.end() && it->second &&
        (*it->second->type != typeid(opt) || key.size() < it->second->key.size() ||
         !std::equal(it->second->key.begin(), it->second->key.end(), key.begin())))
        plans.erase(it), it = plans.end();
    if (it == plans.end()) {
        auto fresh = shards(opt) ? std::make_unique<Plan>() : nullptr;
        if (fresh) fresh->type = &typeid(opt);
        it = plans.emplace(&opt, std::move(fresh)).first;
    }
    Plan *plan = it->second.get();
    if (!plan) return nullptr;
    if (key != plan->key) {
        std::vector<at::Tensor> fresh;
        for (const auto &p : ps)
            if (!plan->of.count(p.unsafeGetTensorImpl())) fresh.push_back(p);
        cut(*plan, fresh);
        plan->key = std::move(key);
    }
    return plan;
}

// A cut piece's own tensor, aliasing the parameter p's elements as they are now (loading a
// model may have given p new storage); the same tensor every time, which keys its state. A
// parameter whose size or layout changed since it was cut stops the program, on every rank
// alike (they all hold the same parameters).
const at::Tensor &alias(Piece &pc, const at::Tensor &p)
{
    if (p.numel() != pc.numel || !p.is_contiguous())
        throw std::runtime_error(
            "dpshim: a parameter changed its size or memory layout after the optimizer's first "
            "sharded step; [optim] shard shares out parameters as they are at that step: "
            "change them before it, or set [optim] shard = off");
    at::NoGradGuard no_grad;
    if (!pc.stepped.defined()) pc.stepped = at::empty({0}, p.options());
    pc.stepped.set_(p.storage(), p.storage_offset() + pc.start, {pc.end - pc.start}, {1});
    return pc.stepped;
}

// The pieces' tensors let go of the parameters' storage until they are used again.
void unalias(Plan &plan)
{
    at::NoGradGuard no_grad;
    for (auto &pc : plan.pieces)
        if (pc.stepped.defined()) pc.stepped.mutable_grad() = at::Tensor(), pc.stepped.set_();
}

// The optimizer's state holds this rank's share only: a cut parameter's whole state (made by
// Adagrad's constructor, or loaded) goes to this rank's pieces, per-element tensors sliced; what
// other ranks own is dropped.
void settle(o::Optimizer &opt, Plan &plan)
{
    auto &state = opt.state();
    for (const auto &p : unique_params(opt)) {
        const auto &idx = plan.of[p.unsafeGetTensorImpl()];
        auto it = state.find(key_of(p));
        if (it == state.end()) continue;
        if (idx.size() == 1 && plan.pieces[idx[0]].whole()) {
            if (plan.pieces[idx[0]].owner != conf.rank) state.erase(it);
            continue;
        }
        std::unique_ptr<o::OptimizerParamState> whole = std::move(it->second);
        state.erase(it);
        for (size_t i : idx) {
            Piece &pc = plan.pieces[i];
            if (pc.owner != conf.rank) continue;
            auto mine = whole->clone();
            for (at::Tensor *t : fields_of(*mine).tensors)
                if (t->defined()) *t = t->reshape(-1).slice(0, pc.start, pc.end).clone();
            state[key_of(alias(pc, p))] = std::move(mine);
        }
    }
}

// Each tensor from its owner rank to every rank (dp_from_owners); a failure throws.
void send_from_owners(std::vector<dp_tensor> &ts, const std::vector<int32_t> &owner)
{
    if (!ts.empty() && dp_from_owners(ts.data(), ts.size(), owner.data()) != 0)
        throw std::runtime_error("dp_from_owners failed (see the message above)");
}

// Each updated parameter from its owner to every rank.
void from_owners(const o::Optimizer &opt, Plan &plan)
{
    std::vector<dp_tensor> ts;
    std::vector<int32_t> owner;
    std::vector<std::pair<at::Tensor, at::Tensor>> back; // a non-contiguous parameter, its copy
    at::NoGradGuard no_grad;
    for (const auto &p : unique_params(opt)) {
        if (!p.grad().defined() || dtype_of(p) < 0) continue; // alike on every rank (averaged)
        at::Tensor flat = p;
        if (!p.is_contiguous()) back.emplace_back(p, p.contiguous()), flat = back.back().second;
        for (size_t i : plan.of[p.unsafeGetTensorImpl()]) {
            const Piece &pc = plan.pieces[i];
            if (pc.end == pc.start) continue;
            ts.push_back(view_of(flat.view(-1).slice(0, pc.start, pc.end), nullptr));
            owner.push_back(pc.owner);
        }
    }
    send_from_owners(ts, owner);
    for (auto &b : back)
        b.first.copy_(b.second);
}

uintptr_t sharded_step(o::Optimizer &opt, Plan &plan, const uintptr_t a[6], void *real)
{
    // a closure runs first, while the groups hold every parameter (its zero_grad and backward
    // see the whole model); the step then gets the loss it returned
    const auto &closure = *reinterpret_cast<const std::function<at::Tensor()> *>(a[2]);
    std::function<at::Tensor()> returns_loss;
    uintptr_t args[6] = {a[0], a[1], a[2], a[3], a[4], a[5]};
    if (closure) {
        at::Tensor loss;
        {
            at::AutoGradMode grad(true);
            loss = closure();
        }
        returns_loss = [loss] { return loss; };
        args[2] = reinterpret_cast<uintptr_t>(&returns_loss);
    }
    settle(opt, plan);
    std::vector<std::vector<at::Tensor>> full;
    for (auto &g : opt.param_groups()) {
        full.push_back(g.params());
        std::vector<at::Tensor> mine;
        for (const auto &p : full.back())
            for (size_t i : plan.of[p.unsafeGetTensorImpl()]) {
                Piece &pc = plan.pieces[i];
                if (pc.owner != conf.rank) continue;
                if (pc.whole()) {
                    mine.push_back(p);
                    continue;
                }
                const at::Tensor &q = alias(pc, p);
                q.mutable_grad() =
                    p.grad().defined() ? p.grad().reshape(-1).slice(0, pc.start, pc.end) : at::Tensor();
                mine.push_back(q);
            }
        g.params() = std::move(mine);
    }
    auto restore = [&] {
        for (size_t k = 0; k < full.size(); k++)
            opt.param_groups()[k].params() = std::move(full[k]);
        unalias(plan); // no stale gradient view or storage kept
    };
    uintptr_t r = call_then(real, args, restore);
    try {
        from_owners(opt, plan);
    } catch (const std::exception &e) {
        fail("sending the updated parameters", e);
    }
    return r;
}

// Optimizer::save of a sharded optimizer: the whole state, as the unsharded one holds it, put
// together from every rank's share for the real save and taken apart again after it. Which
// parameters have state, their step counts and which of their tensors exist travel first
// (dp_metric, the maximum over ranks), then the tensors from their owners (dp_from_owners).
uintptr_t save_optimizer(const uintptr_t a[6], void *real)
{
    auto &opt = *reinterpret_cast<o::Optimizer *>(a[0]);
    Plan *sharded = plan_of(opt);
    if (!sharded) return call_real(real, a);
    Plan &plan = *sharded;
    auto &state = opt.state();
    std::vector<at::Tensor> ps = unique_params(opt);
    const size_t nfields = fields_of(*new_state(opt)).tensors.size(), width = 2 + nfields;
    std::unordered_map<StateKey, std::unique_ptr<o::OptimizerParamState>> aside; // the pieces' states
    std::vector<StateKey> added;                                                 // whole states put in
    try {
        settle(opt, plan);
        // per parameter: has state, its step count, which per-element tensors it has
        std::vector<double> info(ps.size() * width, 0.0);
        for (size_t k = 0; k < ps.size(); k++)
            for (size_t i : plan.of[ps[k].unsafeGetTensorImpl()]) {
                Piece &pc = plan.pieces[i];
                if (pc.owner != conf.rank) continue;
                auto found = state.find(key_of(pc.whole() ? ps[k] : alias(pc, ps[k])));
                if (found == state.end()) continue;
                Fields f = fields_of(*found->second);
                info[k * width] = 1;
                if (f.step) info[k * width + 1] = static_cast<double>(*f.step);
                for (size_t j = 0; j < nfields; j++)
                    info[k * width + 2 + j] = f.tensors[j]->defined();
            }
        if (!info.empty()) dp_metric(info.data(), info.size(), DP_MAX);
        std::vector<dp_tensor> ts;
        std::vector<int32_t> owner;
        std::vector<std::pair<StateKey, std::unique_ptr<o::OptimizerParamState>>> wholes;
        at::NoGradGuard no_grad;
        for (size_t k = 0; k < ps.size(); k++) {
            const at::Tensor &p = ps[k];
            if (!info[k * width] || dtype_of(p) < 0) continue; // no state anywhere: none saved, as alone
            auto whole = new_state(opt);
            Fields f = fields_of(*whole);
            if (f.step) *f.step = static_cast<int64_t>(info[k * width + 1]);
            for (size_t j = 0; j < nfields; j++) {
                if (!info[k * width + 2 + j]) continue;
                *f.tensors[j] = at::zeros_like(p, at::MemoryFormat::Contiguous);
                for (size_t i : plan.of[p.unsafeGetTensorImpl()]) {
                    Piece &pc = plan.pieces[i];
                    at::Tensor part = f.tensors[j]->view(-1).slice(0, pc.start, pc.end);
                    if (pc.owner == conf.rank)
                        part.copy_(fields_of(*state.at(key_of(pc.whole() ? p : alias(pc, p))))
                                       .tensors[j]
                                       ->reshape(-1));
                    if (pc.end > pc.start) ts.push_back(view_of(part, nullptr)), owner.push_back(pc.owner);
                }
            }
            wholes.emplace_back(key_of(p), std::move(whole)); // alive until the tensors have gone
        }
        send_from_owners(ts, owner);
        for (auto &pc : plan.pieces)
            if (!pc.whole() && pc.stepped.defined()) {
                auto found = state.find(key_of(pc.stepped));
                if (found != state.end())
                    aside.emplace(found->first, std::move(found->second)), state.erase(found);
            }
        for (auto &w : wholes)
            if (!state.count(w.first))
                added.push_back(w.first), state[w.first] = std::move(w.second); // else: owned whole here
    } catch (const std::exception &e) {
        fail("gathering the optimizer's state to save it", e);
    }
    auto take_apart = [&] {
        for (const auto &k : added)
            state.erase(k);
        for (auto &s : aside)
            state[s.first] = std::move(s.second);
        unalias(plan);
    };
    return call_then(real, a, take_apart);
}

// Optimizer::load of a whole state: this rank keeps its share.
uintptr_t load_optimizer(const uintptr_t a[6], void *real)
{
    uintptr_t r = call_real(real, a);
    auto &opt = *reinterpret_cast<o::Optimizer *>(a[0]);
    if (Plan *plan = plan_of(opt)) settle(opt, *plan), unalias(*plan);
    return r;
}

// The ranks that share the data out now: the job's, or after a lost rank the survivors',
// renumbered (dp_world_size and dp_rank answer for them then).
struct Ranks {
    int rank, size;
};
Ranks ranks_now()
{
    int n = dp_world_size();
    return n < conf.size ? Ranks{dp_rank(), n} : Ranks{conf.rank, conf.size};
}

// Scale mode, after a rank was lost: the batches of the groups it had taken and not trained (the
// step's under way at the loss, and those fetched ahead for DataLoader workers) are handed out
// first from the next group on, so every sample of the epoch is trained. Each survivor knows the
// groups; which places were lost it learns from the others' places, and the list it takes from
// the new rank 0, so that all hand out the same. Every survivor is told of the smaller job at the
// same collective, so all enter here at the same step. With gradient accumulation the queue holds
// batches already trained, and which it cannot tell: then nothing is handed out, and rank 0 says so.
void hand_out_lost_batches(const Ranks &now)
{
    auto *q = training_batches();
    if (conf.split_mode || !q || q->empty() || q->front().ranks <= now.size) return;
    const int before = q->front().ranks;
    std::vector<double> alive(static_cast<size_t>(before) + 1, 0.0); // and, last, any rank accumulating
    alive[static_cast<size_t>(q->front().place)] = 1;
    alive.back() = st.accumulating ? 1 : 0;
    dp_metric(alive.data(), alive.size(), DP_SUM);
    const bool accumulating = alive.back() > 0;
    // another rank lost inside these sums (every survivor is told at the same one): a place would
    // read as lost whose batch was trained, so nothing is handed out
    auto lost_again = [&] { return ranks_now().size != now.size; };
    auto give_up = [&] {
        const Ranks later = ranks_now();
        for (auto &h : *q)
            h.group.clear(), h.place = later.rank, h.ranks = later.size;
        if (later.rank == 0)
            std::fprintf(stderr, "[dpshim] WARN elastic: another rank was lost as the survivors listed the "
                                 "batches the lost rank(s) had not trained: those are not trained\n");
    };
    if (lost_again()) return give_up();
    std::vector<double> list; // the batches' lengths, then their indices
    std::vector<double> idx;
    for (auto &h : *q) {
        for (size_t p = 0; !accumulating && h.ranks == before && p < h.group.size(); p++)
            if (alive[p] == 0) {
                list.push_back(static_cast<double>(h.group[p].size()));
                idx.insert(idx.end(), h.group[p].begin(), h.group[p].end());
            }
        h.group.clear(), h.place = now.rank, h.ranks = now.size;
    }
    if (accumulating) {
        if (now.rank == 0)
            std::fprintf(stderr,
                         "[dpshim] WARN elastic: the batches of this epoch the lost rank(s) had not trained "
                         "are not trained: the program steps once for several batches (gradient "
                         "accumulation), and which of them were trained is not known\n");
        return;
    }
    list.insert(list.end(), idx.begin(), idx.end());
    double count[2] = {now.rank == 0 ? static_cast<double>(list.size()) : 0,
                       now.rank == 0 ? static_cast<double>(idx.size()) : 0};
    dp_metric(count, 2, DP_SUM);
    if (lost_again()) return give_up();
    const size_t batches = static_cast<size_t>(count[0] - count[1]);
    if (!batches) return;
    list.resize(static_cast<size_t>(count[0]));
    if (now.rank != 0) std::fill(list.begin(), list.end(), 0.0);
    dp_metric(list.data(), list.size(), DP_SUM);
    if (lost_again()) return give_up();
    size_t at = batches;
    for (size_t b = 0; b < batches; b++) {
        std::vector<size_t> batch(static_cast<size_t>(list[b]));
        for (auto &i : batch)
            i = static_cast<size_t>(list[at++]);
        st.make_up[st.training].push_back(std::move(batch));
    }
    if (now.rank == 0)
        std::fprintf(stderr,
                     "[dpshim] WARN elastic: the %zu samples of this epoch the lost rank(s) had not trained "
                     "(%zu batch(es)) are trained now, handed out before the sampler's next batches\n",
                     static_cast<size_t>(count[1]), batches);
}

uintptr_t step(const uintptr_t a[6], void *real)
{
    auto *opt = reinterpret_cast<torch::optim::Optimizer *>(a[1]);
    const auto &closure = *reinterpret_cast<const std::function<at::Tensor()> *>(a[2]);
    auto last = st.stepped.find(opt);
    bool averaged = last != st.stepped.end() && last->second != st.backwards;
    if (!closure && !averaged) { // gradients set by hand, or no backward since this optimizer's step
        bool shared = weigh_current_batch();
        average(params_of(*opt), nullptr, shared);
    }
    if (!st.batch_used && st.backwards - st.backwards_at_step > 1) st.accumulating = true;
    Plan *plan = plan_of(*opt);
    // a closure's backward passes are averaged as they end
    uintptr_t r = plan ? sharded_step(*opt, *plan, a, real) : call_real(real, a);
    if (!st.batch_used) hand_out_lost_batches(ranks_now()); // its sums are done: a loss is known
    st.backwards_at_step = st.backwards;
    st.stepped[opt] = st.backwards;
    st.batch_used = true; // once per batch, however many optimizers step on it
    dp_step_end(++st.steps);
    return r;
}

uintptr_t sampler_next(const uintptr_t a[6], void *real)
{
    auto *out = reinterpret_cast<Batch *>(a[0]);
    void *self = reinterpret_cast<void *>(a[1]);
    size_t batch_size = a[2];
    auto next = reinterpret_cast<NextFn>(real);
    Batch got = next(self, batch_size);
    bool evaluating = conf.eval_whole && !c10::GradMode::is_enabled();
    if (got && !evaluating && self != st.training) {
        // another sampler trains now (another loader's pass): the batch the last step used was
        // the previous one's, and no later backward will move past it there
        auto *q = training_batches();
        if (st.batch_used && q && !q->empty()) q->pop_front();
        st.batch_used = false;
        st.training = self;
    }
    // a share of one sample would stop a BatchNorm in training (libtorch's inline check refuses a
    // single value per channel, though the statistics are the global batch's): once the program's
    // BatchNorm has run, a batch of fewer than 2N samples is taken whole too
    const Ranks now = ranks_now();
    size_t whole_below =
        static_cast<size_t>(now.size) * (batch_norms.load(std::memory_order_relaxed) ? 2 : 1);
    if (got && !evaluating && conf.split_mode && got->size() < whole_below) {
        st.handed[self].push_back({got->size(), static_cast<uint64_t>(now.size)}); // none may be empty
    } else if (got && !evaluating && conf.split_mode) {
        std::vector<uint64_t> idx(got->begin(), got->end());
        size_t keep = dp_batch(idx.data(), idx.size());
        st.handed[self].push_back({idx.size(), 1});
        got->assign(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(keep));
    } else if ((got || st.make_up.count(self)) && !evaluating) {
        // scale mode: N batches, this rank's the rank-th: first those a lost rank had taken and
        // not trained, then the sampler's; a short last group is padded with its first batches
        // ([data] uneven = pad) or ends the epoch (drop)
        std::vector<std::vector<size_t>> group;
        const size_t ranks = static_cast<size_t>(now.size);
        auto lost = st.make_up.find(self);
        while (lost != st.make_up.end() && group.size() < ranks && !lost->second.empty())
            group.push_back(std::move(lost->second.front())), lost->second.pop_front();
        if (got && group.size() < ranks)
            group.push_back(std::move(*got));
        else if (got)
            lost->second.push_back(std::move(*got)); // every place taken: it waits its turn
        if (lost != st.make_up.end() && lost->second.empty()) st.make_up.erase(lost);
        while (got && group.size() < ranks) {
            Batch b = next(self, batch_size);
            if (!b) break;
            group.push_back(std::move(*b));
        }
        if (group.empty() || (group.size() < ranks && conf.uneven == 1)) {
            got = c10::nullopt;
        } else {
            got = group[static_cast<size_t>(now.rank) % group.size()];
            st.handed[self].push_back({got->size(), 1, std::move(group), now.rank, now.size});
        }
    }
    new (out) Batch(std::move(got));
    return a[0];
}

// A sampler starts a new pass: the batches it fetched ahead of a loop that broke off are gone.
void forget_batches(const void *sampler)
{
    st.handed.erase(sampler);
    st.make_up.erase(sampler);
    if (sampler == st.training) st.batch_used = st.accumulating = false;
}

uintptr_t sequential_reset(const uintptr_t a[6], void *real)
{
    forget_batches(reinterpret_cast<void *>(a[0]));
    return call_real(real, a);
}

// The permutation is drawn from rank 0's CPU generator state on every rank (summed with zeros:
// a broadcast through dp_metric), which is what the run alone draws; each other rank then goes
// back to its own state, so its dropout and augmentation stay its own, as under DDP.
uintptr_t random_reset(const uintptr_t a[6], void *real)
{
    forget_batches(reinterpret_cast<void *>(a[0]));
    bool root = false;
    auto gen = at::detail::getDefaultCPUGenerator();
    at::Tensor own;
    {
        std::lock_guard<std::mutex> lock(gen.mutex());
        at::Tensor state = gen.get_state();
        own = state.clone();
        auto *bytes = state.data_ptr<uint8_t>();
        std::vector<double> v(static_cast<size_t>(state.numel()));
        for (int size = 0; size != ranks_now().size;) { // a loss inside: rank 0 may be another now
            size = ranks_now().size, root = ranks_now().rank == 0;
            for (size_t i = 0; i < v.size(); i++)
                v[i] = root ? bytes[i] : 0;
            dp_metric(v.data(), v.size(), DP_SUM);
        }
        for (size_t i = 0; i < v.size(); i++)
            bytes[i] = static_cast<uint8_t>(v[i]);
        gen.set_state(state);
    }
    uintptr_t r = call_real(real, a);
    if (!root) {
        std::lock_guard<std::mutex> lock(gen.mutex());
        gen.set_state(own);
    }
    return r;
}

// --- BatchNorm: statistics of the global batch ([bn] sync) ----------------------------------------
//
// As the PyTorch adapter does, on libtorch's own kernels: per-channel sums of x and x*x in x's
// dtype, widened to float64 and summed over ranks with the sample count (dp_bn_stats); the native
// kernel normalizes with the global mean and (biased) variance; backward is the native kernel's
// direct term plus the statistics' terms from two per-channel sums over ranks. The running
// statistics get the global batch's mean and unbiased variance, with the momentum the module
// computed (1/num_batches_tracked where its momentum is none). Batches every rank computes whole
// (made by hand, too few samples to share, or under NoGradGuard with [data] eval = whole) run
// the native kernel: each rank is then alone, bitwise. Every rank decides alike: the decisions
// depend on what the ranks agree on (the batch's global size, the policy, the module's mode).

uint64_t bn_sums(at::Tensor &a, at::Tensor &b, uint64_t n)
{
    dp_tensor t[2] = {view_of(a, "bn_sum"), view_of(b, "bn_sumsq")};
    if (dp_bn_stats(&t[0], &t[1], &n) != 0)
        throw std::runtime_error("dp_bn_stats failed (see the message above)");
    return n;
}

// x's shape for a per-channel tensor: [1, C, 1, ...]
std::vector<int64_t> channel_shape(const at::Tensor &x)
{
    std::vector<int64_t> shape(static_cast<size_t>(x.dim()), 1);
    shape[1] = x.size(1);
    return shape;
}

// the dimensions BatchNorm's statistics sum over: all but the channels (1)
std::vector<int64_t> batch_dims(const at::Tensor &x)
{
    std::vector<int64_t> dims{0};
    for (int64_t d = 2; d < x.dim(); d++)
        dims.push_back(d);
    return dims;
}

// BatchNorm's backward as libtorch's ops: the native kernel's direct term and affine gradients,
// then the statistics' terms from per-channel sums (over the ranks where over_ranks). The local
// gradients are of this rank's loss over its n samples: scaled by n they are per sample and add
// up across ranks with unequal n; dividing by n again returns to this rank's convention.
std::tuple<at::Tensor, at::Tensor, at::Tensor> ops_backward(const at::Tensor &dy, const at::Tensor &x,
                                                            const at::Tensor &weight, const at::Tensor &m,
                                                            const at::Tensor &v, double eps, int64_t total,
                                                            bool over_ranks)
{
    int64_t n = x.size(1) ? x.numel() / x.size(1) : 0;
    auto g = at::native_batch_norm_backward(dy, x, weight, m, v, at::Tensor(), at::Tensor(), false, eps,
                                            {true, true, true});
    at::Tensor gx = std::get<0>(g), gw = std::get<1>(g), gb = std::get<2>(g);
    // gb = sum(dy), gw = sum(dy * xhat) = invstd * sum(dy * (x - mean)), per channel
    at::Tensor invstd = at::rsqrt(v.to(at::kDouble) + eps);
    at::Tensor a = (gb.to(at::kDouble) * static_cast<double>(n)).contiguous();
    at::Tensor b = (gw.to(at::kDouble) / invstd * static_cast<double>(n)).contiguous();
    if (over_ranks) {
        try {
            bn_sums(a, b, static_cast<uint64_t>(n));
        } catch (const std::exception &e) {
            fail("summing BatchNorm's gradient terms", e);
        }
    }
    if (n && total) {
        at::Tensor k =
            weight.to(at::kDouble) * invstd / (static_cast<double>(n) * static_cast<double>(total));
        // gx -= k * (a + (x - mean) * invstd^2 * b), as gx += x * slope + offset
        at::Tensor slope = -k * invstd * invstd * b;
        at::Tensor offset = -k * a - slope * m.to(at::kDouble);
        auto shape = channel_shape(x);
        gx.addcmul_(x, slope.to(x.scalar_type()).view(shape)).add_(offset.to(x.scalar_type()).view(shape));
    }
    return {gx, gw, gb};
}

// The input's gradient in one pass (plugin_abi/batchnorm.h) into gx, from the native kernel's
// affine gradients gw and gb; false where it cannot.
bool one_pass(const at::Tensor &dy, const at::Tensor &x, const at::Tensor &weight, const at::Tensor &m,
              const at::Tensor &v, const at::Tensor &gw, const at::Tensor &gb, at::Tensor &gx, double eps,
              int64_t total, bool over_ranks)
{
    uint64_t outer = static_cast<uint64_t>(x.size(0)), channels = static_cast<uint64_t>(x.size(1));
    uint64_t inner = outer && channels ? static_cast<uint64_t>(x.numel()) / (outer * channels) : 0;
    return dpshim_bn_backward(dtype_of(x), outer, channels, inner, x.data_ptr(), dy.data_ptr(), gx.data_ptr(),
                              m.data_ptr(), v.data_ptr(), weight.data_ptr(), gw.contiguous().data_ptr(),
                              gb.contiguous().data_ptr(), eps, static_cast<uint64_t>(total),
                              over_ranks ? 1 : 0) == 0;
}

// Whether the one pass rounds as libtorch's ops in this build, bit for bit, for dtype: both on
// random layers, this rank's sums only, as the PyTorch adapter probes. The layers have planes of
// 19, 16 and 1 and 5 or 8 channels, so vector code and scalar tails count, for the pass and for
// the per-channel vectors alike; and a NaN plane and an infinity, so which NaN an operation gives
// counts too.
bool probe_one_pass(at::ScalarType dtype)
{
    at::NoGradGuard no_grad;
    auto g = at::make_generator<at::CPUGeneratorImpl>(7);
    auto opts = at::TensorOptions().dtype(dtype);
    const at::ScalarType bits = dtype == at::kFloat ? at::kInt : at::kLong;
    for (std::vector<int64_t> shape : {std::vector<int64_t>{3, 5, 19}, {4, 8, 16}, {23, 6}, {2, 8, 3, 3}}) {
        at::Tensor x = at::randn(shape, g, opts), dy = at::randn(shape, g, opts);
        x[0][1].fill_(NAN);
        x[-1][2].fill_(INFINITY);
        at::Tensor weight = at::randn({shape[1]}, g, opts);
        at::Tensor m = x.mean(batch_dims(x)), v = x.var(batch_dims(x), false);
        int64_t total = x.numel() / shape[1];
        auto want = ops_backward(dy, x, weight, m, v, 1e-5, total, false);
        at::Tensor got = at::empty_like(x);
        if (!one_pass(dy, x, weight, m, v, std::get<1>(want), std::get<2>(want), got, 1e-5, total, false) ||
            !at::equal(got.view(bits), std::get<0>(want).view(bits)))
            return false;
    }
    return true;
}

// One pass for a contiguous float32 or float64 layer (its weight of its dtype) on the CPU where
// libtorch runs one thread (with more, its three passes run in parallel) and the pass rounds as
// its ops.
bool passes_once(const at::Tensor &x, const at::Tensor &weight)
{
    if (!dpshim_bn_backward || !x.device().is_cpu() ||
        (x.scalar_type() != at::kFloat && x.scalar_type() != at::kDouble) || !x.is_contiguous() ||
        at::get_num_threads() != 1 || weight.scalar_type() != x.scalar_type() || !weight.is_contiguous())
        return false;
    static std::mutex mutex;
    static std::unordered_map<int, bool> matches; // dtype -> the probe's answer
    std::lock_guard<std::mutex> lock(mutex);
    auto it = matches.find(static_cast<int>(x.scalar_type()));
    if (it == matches.end())
        it = matches.emplace(static_cast<int>(x.scalar_type()), probe_one_pass(x.scalar_type())).first;
    return it->second;
}

// As PyTorch's SyncBatchNorm (once_differentiable): the input's gradient that backward returns
// sums terms over the ranks, which no graph records, so it cannot be differentiated again. Where
// a graph of it was asked for (create_graph: a gradient penalty), it is given a node that fails
// when a second derivative reaches it, instead of a second derivative without the other ranks'
// terms.
// graph: the caller's grad mode (create_graph), from: what the gradients were computed from.
torch::autograd::variable_list once_differentiable(torch::autograd::variable_list out, bool graph,
                                                   const torch::autograd::variable_list &from)
{
    bool wanted = false;
    for (const auto &t : from)
        wanted = wanted || (t.defined() && t.requires_grad());
    if (!graph || !wanted) return out;
    auto fails = std::make_shared<torch::autograd::Error>(
        "dpshim: a second derivative through a BatchNorm layer synchronized across the ranks (a gradient "
        "computed with create_graph, as a gradient penalty does) is not supported, as with PyTorch's "
        "SyncBatchNorm: set [bn] sync = off to keep each rank's own statistics, or leave BatchNorm out "
        "of the part that is differentiated twice",
        torch::autograd::collect_next_edges(from));
    for (auto &t : out)
        if (t.defined()) {
            t = t.detach();
            torch::autograd::set_history(t, fails);
        }
    return out;
}

struct SyncedBatchNorm : torch::autograd::Function<SyncedBatchNorm> {
    // y, and the global batch's mean and biased variance in float64; *total_p: its samples
    static torch::autograd::variable_list forward(torch::autograd::AutogradContext *ctx, const at::Tensor &x,
                                                  const at::Tensor &weight, const at::Tensor &bias,
                                                  double eps, uint64_t *total_p)
    {
        const std::vector<int64_t> dims = batch_dims(x);
        uint64_t n = static_cast<uint64_t>(x.numel() / x.size(1));
        // summed in x's dtype (libtorch's cascade sums), as the PyTorch adapter does
        at::Tensor s = x.sum(dims).to(at::kDouble).contiguous(),
                   ss = (x * x).sum(dims).to(at::kDouble).contiguous();
        uint64_t total = 0;
        try {
            total = bn_sums(s, ss, n);
        } catch (const std::exception &e) {
            fail("summing BatchNorm's statistics", e);
        }
        at::Tensor mean = total ? s / static_cast<double>(total) : s;
        at::Tensor var = total ? (ss / static_cast<double>(total) - mean * mean).clamp_min(0) : ss;
        at::Tensor m = mean.to(x.scalar_type()), v = var.to(x.scalar_type());
        // training false: normalized with m and v (this call goes straight to libtorch)
        at::Tensor y = at::batch_norm(x, weight, bias, m, v, false, 0.0, eps, false);
        ctx->save_for_backward({x, weight, m, v});
        ctx->saved_data["eps"] = eps;
        ctx->saved_data["total"] = static_cast<int64_t>(total);
        ctx->mark_non_differentiable({mean, var});
        *total_p = total;
        return {y, mean, var};
    }

    static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                   torch::autograd::variable_list grads)
    {
        auto saved = ctx->get_saved_variables();
        const at::Tensor &x = saved[0], &weight = saved[1], &m = saved[2], &v = saved[3];
        double eps = ctx->saved_data["eps"].toDouble();
        int64_t total = ctx->saved_data["total"].toInt();
        torch::autograd::variable_list from{grads[0], x, weight};
        bool graph = c10::GradMode::is_enabled();
        at::NoGradGuard no_graph; // computed as once_differentiable does: no graph of it
        at::Tensor dy = grads[0].contiguous();
        if (passes_once(x, weight)) {
            // the native kernel for the affine gradients only, the rest in one pass
            auto g = at::native_batch_norm_backward(dy, x, weight, m, v, at::Tensor(), at::Tensor(), false,
                                                    eps, {false, true, true});
            at::Tensor gw = std::get<1>(g), gb = std::get<2>(g), gx = at::empty_like(x);
            if (!one_pass(dy, x, weight, m, v, gw, gb, gx, eps, total, true))
                fail("summing BatchNorm's gradient terms",
                     std::runtime_error("dp_bn_stats failed (see the message above)"));
            return once_differentiable({gx, gw, gb, at::Tensor(), at::Tensor()}, graph, from);
        }
        auto g = ops_backward(dy, x, weight, m, v, eps, total, true);
        return once_differentiable(
            {std::get<0>(g), std::get<1>(g), std::get<2>(g), at::Tensor(), at::Tensor()}, graph, from);
    }
};

// How many ranks compute the batch being trained on: 1 where it was shared out, N where every
// rank took it whole; the one a step has used is behind it (weigh_current_batch).
uint64_t batch_replicas()
{
    auto *q = training_batches();
    size_t at = st.batch_used ? 1 : 0;
    if (!q || q->size() <= at) return static_cast<uint64_t>(ranks_now().size); // batches made by hand
    return (*q)[at].replicas;
}

using OptTensor = c10::optional<at::Tensor>;

at::Tensor synced_batch_norm(const at::Tensor &x, const OptTensor &weight_o, const OptTensor &bias_o,
                             const OptTensor &running_mean_o, const OptTensor &running_var_o, double momentum,
                             double eps)
{
    // a BatchNorm without affine parameters gets ones and zeros that need no gradient (libtorch
    // 1.13's custom functions take no undefined tensor)
    at::Tensor weight = weight_o && weight_o->defined() ? *weight_o : at::ones({x.size(1)}, x.options());
    at::Tensor bias = bias_o && bias_o->defined() ? *bias_o : at::zeros({x.size(1)}, x.options());
    uint64_t total = 0;
    auto out = SyncedBatchNorm::apply(x, weight, bias, eps, &total);
    at::Tensor rm = running_mean_o ? *running_mean_o : at::Tensor(),
               rv = running_var_o ? *running_var_o : at::Tensor();
    if (rm.defined() || rv.defined()) {
        at::NoGradGuard no_grad;
        double t = static_cast<double>(total);
        if (rm.defined()) rm.mul_(1 - momentum).add_(out[1].to(rm.scalar_type()), momentum);
        if (rv.defined()) {
            at::Tensor unbiased = t > 1 ? out[2] * (t / (t - 1)) : out[2];
            rv.mul_(1 - momentum).add_(unbiased.to(rv.scalar_type()), momentum);
        }
    }
    return out[0];
}

void *batch_norm(dps_torch_batch_norm_t real, void *out, const void *input, const void *weight,
                 const void *bias, const void *running_mean, const void *running_var, bool training,
                 double momentum, double eps, bool cudnn_enabled)
{
    const auto &x = *static_cast<const at::Tensor *>(input);
    if (training) batch_norms.store(true, std::memory_order_relaxed);
    bool whole = (conf.eval_whole && !c10::GradMode::is_enabled()) || batch_replicas() != 1;
    if (!conf.bn_sync || !training || whole || x.dim() < 2 || x.size(1) == 0 || dtype_of(x) < 0)
        return real(out, input, weight, bias, running_mean, running_var, training, momentum, eps,
                    cudnn_enabled);
    at::Tensor y =
        synced_batch_norm(x, *static_cast<const OptTensor *>(weight), *static_cast<const OptTensor *>(bias),
                          *static_cast<const OptTensor *>(running_mean),
                          *static_cast<const OptTensor *>(running_var), momentum, eps);
    return new (out) at::Tensor(std::move(y));
}

// "2.6" of "2.6.0+cpu"
std::string major_minor(const std::string &version)
{
    size_t dot = version.find('.');
    return dot == std::string::npos ? version
                                    : version.substr(0, version.find_first_not_of("0123456789", dot + 1));
}

// The major.minor of the libtorch this process runs, from its build settings (at::show_config()
// ends with "TORCH_VERSION=2.6.0, ..."); "" where they do not say. A libtorch whose soname has no
// version (the zip from pytorch.org, a pip wheel's) is told apart by this alone.
std::string running_version()
{
    std::string config = at::show_config();
    size_t at = config.find("TORCH_VERSION=");
    if (at == std::string::npos) return "";
    at += 14;
    return major_minor(config.substr(at, config.find_first_of(", \n", at) - at));
}

} // namespace

extern "C" __attribute__((visibility("default"))) int
dpshim_libtorch_init(const dps_torch_config_t *c, dps_torch_handler_t *handler, char *err, size_t errlen)
{
    if (c->abi != DPS_TORCH_ABI) {
        std::snprintf(err, errlen,
                      "libdpshim-libtorch.so speaks interface %d, libdpshim.so %d: install them together",
                      DPS_TORCH_ABI, c->abi);
        return -1;
    }
    std::string running, built = major_minor(dps_torch_built_for);
    try {
        running = running_version();
    } catch (const std::exception &e) { // nothing may unwind into libdpshim.so's C
        std::snprintf(err, errlen, "libtorch's build settings could not be read: %s", e.what());
        return -1;
    }
    if (!running.empty() && running != built) {
        std::snprintf(err, errlen,
                      "libdpshim-libtorch.so is built for libtorch %s, but this process runs libtorch %s",
                      built.c_str(), running.c_str());
        return 1;
    }
    conf = *c;
    dps_torch_handler_t all[] = {
#define DPS_TORCH_HANDLER(id, name, fn) fn,
        DPS_TORCH_ENTRIES(DPS_TORCH_HANDLER)
#undef DPS_TORCH_HANDLER
    };
    for (int i = 0; i < DPS_TORCH_COUNT; i++)
        handler[i] = all[i];
    return 0;
}

extern "C" __attribute__((visibility("default"))) void *
dpshim_libtorch_batch_norm(dps_torch_batch_norm_t real, void *out, const void *input, const void *weight,
                           const void *bias, const void *running_mean, const void *running_var, bool training,
                           double momentum, double eps, bool cudnn_enabled)
{
    static_assert(std::is_same_v<decltype(&dpshim_libtorch_batch_norm), dps_torch_batch_norm_handler_t>,
                  "the handler plugin_abi/libtorch.h declares");
    return batch_norm(real, out, input, weight, bias, running_mean, running_var, training, momentum, eps,
                      cudnn_enabled);
}
