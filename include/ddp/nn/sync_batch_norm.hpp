// SyncBatchNorm2d<Comm>: BatchNorm2d whose training statistics span every rank's batch, and
// convert_sync_batchnorm(model, comm), which swaps a model's BatchNorm2d layers for it.
//
// Layering: the one nn header that names the communicator interface (ddp/comm/communicator.hpp and
// host_collectives.hpp, which depend on tensor/ only; no backend). The op below it stays communicator-free
// behind the BatchStatsExchange hook; the layer binds a Communicator to that hook.
#pragma once

#include <bit>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/autograd/ops/sync_batch_norm.hpp"
#include "ddp/comm/communicator.hpp"
#include "ddp/comm/host_collectives.hpp"
#include "ddp/error.hpp"
#include "ddp/nn/layers.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/nn/sequential.hpp"

namespace ddp::nn {

namespace detail {

// Binds a Communicator to sync_batch_norm2d's BatchStatsExchange (host doubles; staged through the backend's
// own memory where it takes device memory only, e.g. NCCL).
template <Communicator C>
class CommStatsExchange {
 public:
  explicit CommStatsExchange(C& comm) noexcept : comm_(&comm) {}
  int world_size() const { return comm_->world_size(); }
  void all_gather(std::span<double const> in, std::span<double> out) const {
    host_all_gather(*comm_, in, out, CollectiveTag{"sync_batch_norm.stats"});
  }
  void all_reduce_sum(std::span<double> buf) const {
    host_all_reduce(*comm_, buf, ReduceOp::kSum, CollectiveTag{"sync_batch_norm.grad"});
  }

 private:
  C* comm_;
};

// Every rank states its channel count, eps and momentum; a difference is the same DdpError on every rank (run
// once, before the first synchronised forward, so a mismatched model never reaches the size-dependent
// collectives, where it would hang or read garbage).
template <Communicator C>
void verify_sync_batch_norm(C& comm, std::int64_t channels, BatchNormOptions const& opt) {
  int const n = comm.world_size();
  std::vector<std::int64_t> mine{channels, std::bit_cast<std::int64_t>(opt.eps),
                                 std::bit_cast<std::int64_t>(opt.momentum)};
  std::vector<std::int64_t> all(mine.size() * static_cast<std::size_t>(n));
  host_all_gather(comm, std::span<std::int64_t const>(mine), std::span<std::int64_t>(all),
                  CollectiveTag{"sync_batch_norm.verify"});
  for (int r = 1; r < n; ++r) {
    std::int64_t const* o = all.data() + 3 * static_cast<std::size_t>(r);
    if (o[0] != all[0])
      throw DdpError(ddp::detail::cat("SyncBatchNorm2d: ranks disagree on the number of channels: rank 0 has ", all[0],
                                      ", rank ", r, " has ", o[0],
                                      "; every rank must build the same model (the statistics are per channel)"));
    if (o[1] != all[1] || o[2] != all[2])
      throw DdpError(ddp::detail::cat(
          "SyncBatchNorm2d (", all[0], " channels): ranks disagree on eps/momentum: rank 0 has ",
          std::bit_cast<double>(all[1]), "/", std::bit_cast<double>(all[2]), ", rank ", r, " has ",
          std::bit_cast<double>(o[1]), "/", std::bit_cast<double>(o[2]), "; every rank must build the same model"));
  }
}

}  // namespace detail

// Batch norm over the channels of NCHW input whose batch is split across the ranks of `comm` (PyTorch's
// torch.nn.SyncBatchNorm for 4-D input). Parameters weight (=1), bias (=0) and buffers running_mean (=0),
// running_var (=1), named as BatchNorm2d's, so checkpoints and DDP see the same names.
// Guarantees:
//  - training, world size > 1: sync_batch_norm2d. Outputs and input gradients equal single-process BatchNorm2d
//    over the concatenation of all ranks' batches (in rank order), whatever each rank's batch size (0 too, as
//    long as the total is at least 2 values per channel). Cost per forward: one all-gather of 2C+1 doubles per
//    rank; per backward: one all-reduce of 2C doubles. Running statistics come out bitwise identical on every
//    rank (they are computed from the same gathered words in the same order).
//  - weight/bias gradients are this rank's own contribution (Σ over its values), as in PyTorch: their sum over
//    ranks is the gradient of Σ_r loss_r. Under DistributedDataParallel (which averages), scale rank r's mean
//    loss by world_size·n_r/N (N = global batch) and the result equals single-process training on the global
//    batch with a mean loss; with equal batch sizes that factor is 1.
//  - evaluation: the running statistics, no communication; world size 1: plain batch_norm2d (bitwise the same
//    as BatchNorm2d).
//  - the first training forward (world size > 1) checks that every rank has the same channel count, eps and
//    momentum (one small all-gather), raising a DdpError on every rank otherwise.
// Every rank must run the same sequence of forwards and backwards through it (its collectives must match).
// A handle, like every ddp layer: copies share parameters, buffers and the verified flag; `comm` must outlive
// it. DDP's buffer broadcast before each forward (DdpOptions::broadcast_buffers) is harmless here but
// redundant once all ranks start equal (the running statistics stay equal); it may be turned off.
template <Communicator Comm, class T = float, MemorySpace S = HostSpace>
class basic_sync_batch_norm2d {
 public:
  using value_type = T;
  using space = S;
  using communicator_type = Comm;

  basic_sync_batch_norm2d(std::int64_t channels, Comm& comm, BatchNormOptions opt = {})
      : comm_(&comm), opt_(opt), verified_(std::make_shared<bool>(false)) {
    if (channels <= 0)
      throw ArgumentError(ddp::detail::cat("SyncBatchNorm2d: channels must be positive (got ", channels, ")"));
    weight = Variable<T, S>(to_space<S>(full<T>(Shape{channels}, T(1))), RequiresGrad::kYes);
    bias = Variable<T, S>(to_space<S>(zeros<T>(Shape{channels})), RequiresGrad::kYes);
    running_mean = to_space<S>(zeros<T>(Shape{channels}));
    running_var = to_space<S>(full<T>(Shape{channels}, T(1)));
  }
  // Takes over a BatchNorm2d: shares its parameters and buffers (as PyTorch's convert_sync_batchnorm does, and as
  // copies of ddp layers do), and copies its options and mode.
  basic_sync_batch_norm2d(basic_batch_norm2d<T, S> const& bn, Comm& comm)
      : weight(bn.weight),
        bias(bn.bias),
        running_mean(bn.running_mean),
        running_var(bn.running_var),
        comm_(&comm),
        opt_(bn.options()),
        verified_(std::make_shared<bool>(false)),
        mode_(bn.mode()) {}

  Variable<T, S> forward(Variable<T, S> const& x) {
    BatchNormArgs const args{opt_.momentum, opt_.eps};
    if (mode_ != Mode::kTrain || comm_->world_size() == 1)
      return batch_norm2d(x, weight, bias, running_mean, running_var, mode_, args);
    if (!*verified_) {
      detail::verify_sync_batch_norm(*comm_, channels(), opt_);
      *verified_ = true;
    }
    return sync_batch_norm2d(x, weight, bias, running_mean, running_var, mode_, detail::CommStatsExchange<Comm>(*comm_),
                             args);
  }
  Variable<T, S> operator()(Variable<T, S> const& x) { return forward(x); }

  std::vector<NamedParameter<T, S>> named_parameters() const { return {{"weight", weight}, {"bias", bias}}; }
  std::vector<NamedBuffer<T, S>> named_buffers() const {
    return {{"running_mean", running_mean}, {"running_var", running_var}};
  }
  void set_mode(Mode m) noexcept { mode_ = m; }
  Mode mode() const noexcept { return mode_; }

  std::int64_t channels() const { return weight.shape()[0]; }
  BatchNormOptions options() const noexcept { return opt_; }
  Comm& comm() const noexcept { return *comm_; }

  Variable<T, S> weight, bias;
  Tensor<T, S> running_mean, running_var;

 private:
  Comm* comm_;
  BatchNormOptions opt_;
  std::shared_ptr<bool> verified_;
  Mode mode_ = Mode::kTrain;
};

template <Communicator Comm>
using SyncBatchNorm2d = basic_sync_batch_norm2d<Comm>;

// ---- convert_sync_batchnorm ----

namespace detail {

// The type a model (or a Sequential entry) becomes: BatchNorm2d → SyncBatchNorm2d, containers element-wise,
// everything else itself.
template <class M, class Comm>
struct with_sync_batchnorm {
  using type = M;
};
template <class T, MemorySpace S, class Comm>
struct with_sync_batchnorm<basic_batch_norm2d<T, S>, Comm> {
  using type = basic_sync_batch_norm2d<Comm, T, S>;
};
template <class M, class Comm>
struct with_sync_batchnorm<Named<M>, Comm> {
  using type = Named<typename with_sync_batchnorm<M, Comm>::type>;
};
template <class... Ls, class Comm>
struct with_sync_batchnorm<Sequential<Ls...>, Comm> {
  using type = Sequential<typename with_sync_batchnorm<Ls, Comm>::type...>;
};

template <class L>
struct is_sequential : std::false_type {};
template <class... Ls>
struct is_sequential<Sequential<Ls...>> : std::true_type {};
template <class L>
struct is_any_sequential : std::false_type {};
template <class T, MemorySpace S>
struct is_any_sequential<AnySequential<T, S>> : std::true_type {};
template <class L>
struct is_any_model : std::false_type {};
template <class T, MemorySpace S>
struct is_any_model<AnyModel<T, S>> : std::true_type {};
template <class L>
struct is_batch_norm : std::false_type {};
template <class T, MemorySpace S>
struct is_batch_norm<basic_batch_norm2d<T, S>> : std::true_type {};
template <class L>
struct is_named : std::false_type {};
template <class M>
struct is_named<Named<M>> : std::true_type {};

}  // namespace detail

// The type convert_sync_batchnorm(M, Comm&) returns.
template <class M, Communicator Comm>
using with_sync_batchnorm_t = typename detail::with_sync_batchnorm<M, Comm>::type;

// A model like `model` with every BatchNorm2d replaced by a SyncBatchNorm2d over `comm` (PyTorch's
// SyncBatchNorm.convert_sync_batchnorm). Looks into Sequential (a type transformation: the result is a
// Sequential of the converted layer types, names kept), AnySequential and AnyModel (type-erased layers that are
// a BatchNorm2d or an AnySequential), recursively; any other model is returned as is (convert the BatchNorm2d
// members of your own model types yourself, with the SyncBatchNorm2d(bn, comm) constructor).
// The result shares every parameter and buffer with `model` (layers are handles; the new SyncBatchNorm2d layers
// take over the BatchNorm2d layers' weight, bias and running statistics), keeps parameter names and modes, and
// fuses what `model` fused (BatchNorm2d has no fused form). Use the result from then on: wrap it in
// DistributedDataParallel and build the optimizer on that.
template <class M, Communicator Comm>
requires(Model<M> || detail::is_named<M>::value) with_sync_batchnorm_t<M, Comm> convert_sync_batchnorm(M const& model,
                                                                                                       Comm& comm) {
  using R = with_sync_batchnorm_t<M, Comm>;
  if constexpr (detail::is_batch_norm<M>::value) {
    return R(model, comm);
  } else if constexpr (detail::is_named<M>::value) {
    return R{model.name, convert_sync_batchnorm(model.layer, comm)};
  } else if constexpr (detail::is_sequential<M>::value) {
    R out = std::apply([&](auto const&... l) { return R(convert_sync_batchnorm(l, comm)...); }, model.layers());
    if (model.mode() != out.mode()) out.set_mode(model.mode());  // the layers came over in their own modes
    return out;
  } else if constexpr (detail::is_any_sequential<M>::value) {
    R out;
    for (std::size_t i = 0; i < model.size(); ++i)
      out.push_back(model.name_at(i), convert_sync_batchnorm(model.layer_at(i), comm));
    if (model.mode() != out.mode()) out.set_mode(model.mode());
    return out;
  } else if constexpr (detail::is_any_model<M>::value) {
    using T = typename M::value_type;
    using S = typename M::space;
    if (auto const* bn = model.template target<basic_batch_norm2d<T, S>>())
      return R(basic_sync_batch_norm2d<Comm, T, S>(*bn, comm));
    if (auto const* seq = model.template target<AnySequential<T, S>>()) return R(convert_sync_batchnorm(*seq, comm));
    return model;
  } else {
    return model;
  }
}

}  // namespace ddp::nn
