// The standard layers: Linear, Conv2d, BatchNorm2d (parameters), and the parameter-free ReLU, Tanh,
// Sigmoid, Flatten, MaxPool2d, Dropout.
#pragma once

#include "ddp/autograd/autograd.hpp"
#include "ddp/nn/init.hpp"
#include "ddp/nn/module.hpp"

namespace ddp::nn {

struct LinearOptions {
  bool bias = true;
};

// y = x Wᵀ + b; W:(out, in), b:(out). Init as PyTorch (kaiming-uniform a=√5, bias ±1/√in), weight first.
template <class T = float, MemorySpace S = HostSpace>
class basic_linear : public Module<T, S> {
 public:
  basic_linear(std::int64_t in, std::int64_t out, Generator& gen, LinearOptions opt = {}) : in_(in), out_(out) {
    if (in <= 0 || out <= 0)
      throw ArgumentError(
          ddp::detail::cat("Linear: in_features and out_features must be positive (got ", in, ", ", out, ")"));
    Tensor<T> w(Shape{out, in});
    init::kaiming_uniform_default(w, in, gen);
    weight = this->register_parameter("weight", to_space<S>(w));
    if (opt.bias) {
      Tensor<T> b(Shape{out});
      init::bias_default(b, in, gen);
      bias = this->register_parameter("bias", to_space<S>(b));
    }
  }
  Variable<T, S> forward(Variable<T, S> const& x) { return linear(x, weight, bias); }
  Variable<T, S> operator()(Variable<T, S> const& x) { return forward(x); }
  std::int64_t in_features() const noexcept { return in_; }
  std::int64_t out_features() const noexcept { return out_; }

  Variable<T, S> weight, bias;

 private:
  std::int64_t in_, out_;
};

struct Conv2dOptions {
  std::int64_t stride = 1;
  std::int64_t padding = 0;
  bool bias = true;
  ConvAlgorithm algorithm = ConvAlgorithm::kAuto;
};

// Cross-correlation over NCHW; W:(out, in, k, k), b:(out). Init as PyTorch (fan_in = in·k·k).
template <class T = float, MemorySpace S = HostSpace>
class basic_conv2d : public Module<T, S> {
 public:
  basic_conv2d(std::int64_t in, std::int64_t out, std::int64_t kernel, Generator& gen, Conv2dOptions opt = {})
      : args_{.stride = opt.stride, .padding = opt.padding, .algorithm = opt.algorithm} {
    if (in <= 0 || out <= 0 || kernel <= 0)
      throw ArgumentError(ddp::detail::cat("Conv2d: channels and kernel_size must be positive (got ", in, ", ", out,
                                           ", ", kernel, ")"));
    Tensor<T> w(Shape{out, in, kernel, kernel});
    init::kaiming_uniform_default(w, in * kernel * kernel, gen);
    weight = this->register_parameter("weight", to_space<S>(w));
    if (opt.bias) {
      Tensor<T> b(Shape{out});
      init::bias_default(b, in * kernel * kernel, gen);
      bias = this->register_parameter("bias", to_space<S>(b));
    }
  }
  Variable<T, S> forward(Variable<T, S> const& x) { return conv2d(x, weight, bias, args_); }
  Variable<T, S> operator()(Variable<T, S> const& x) { return forward(x); }
  // forward(x) followed by `e` in one op (Epilogue::kRelu: a ReLU; kReluMaxPool2: a ReLU and a 2×2 max-pool).
  // Sequential and AnySequential call it where nn::detail::fusion_rule says the following layers fold in.
  Variable<T, S> forward_fused(Variable<T, S> const& x, Epilogue e) {
    Conv2dArgs a = args_;
    a.epilogue = e;
    return conv2d(x, weight, bias, a);
  }

  Variable<T, S> weight, bias;

 private:
  Conv2dArgs args_;
};

struct BatchNormOptions {
  double momentum = 0.1;
  double eps = 1e-5;
};

// Batch norm over channels of NCHW; weight=1, bias=0; buffers running_mean=0, running_var=1.
template <class T = float, MemorySpace S = HostSpace>
class basic_batch_norm2d : public Module<T, S> {
 public:
  explicit basic_batch_norm2d(std::int64_t channels, BatchNormOptions opt = {}) : args_{opt.momentum, opt.eps} {
    if (channels <= 0)
      throw ArgumentError(ddp::detail::cat("BatchNorm2d: channels must be positive (got ", channels, ")"));
    weight = this->register_parameter("weight", to_space<S>(full<T>(Shape{channels}, T(1))));
    bias = this->register_parameter("bias", to_space<S>(zeros<T>(Shape{channels})));
    running_mean = this->register_buffer("running_mean", to_space<S>(zeros<T>(Shape{channels})));
    running_var = this->register_buffer("running_var", to_space<S>(full<T>(Shape{channels}, T(1))));
  }
  Variable<T, S> forward(Variable<T, S> const& x) {
    return batch_norm2d(x, weight, bias, running_mean, running_var, this->mode(), args_);
  }
  Variable<T, S> operator()(Variable<T, S> const& x) { return forward(x); }
  // The options it was built with (nn::convert_sync_batchnorm carries them over).
  BatchNormOptions options() const noexcept { return {.momentum = args_.momentum, .eps = args_.eps}; }

  Variable<T, S> weight, bias;
  Tensor<T, S> running_mean, running_var;

 private:
  BatchNormArgs args_;
};

// Parameter-free layers: a Module whose forward is one op.
namespace detail {
template <class T, MemorySpace S, class Op>
class stateless_layer : public Module<T, S> {
 public:
  Variable<T, S> forward(Variable<T, S> const& x) { return Op{}(x); }
  Variable<T, S> operator()(Variable<T, S> const& x) { return forward(x); }
};
struct relu_op {
  template <class V>
  V operator()(V const& x) const {
    return ddp::relu(x);
  }
};
struct tanh_op {
  template <class V>
  V operator()(V const& x) const {
    return ddp::tanh(x);
  }
};
struct sigmoid_op {
  template <class V>
  V operator()(V const& x) const {
    return ddp::sigmoid(x);
  }
};
struct flatten_op {
  template <class V>
  V operator()(V const& x) const {
    return ddp::flatten(x);
  }
};
}  // namespace detail

template <class T = float, MemorySpace S = HostSpace>
using basic_relu = detail::stateless_layer<T, S, detail::relu_op>;
template <class T = float, MemorySpace S = HostSpace>
using basic_tanh = detail::stateless_layer<T, S, detail::tanh_op>;
template <class T = float, MemorySpace S = HostSpace>
using basic_sigmoid = detail::stateless_layer<T, S, detail::sigmoid_op>;
template <class T = float, MemorySpace S = HostSpace>
using basic_flatten = detail::stateless_layer<T, S, detail::flatten_op>;

template <class T = float, MemorySpace S = HostSpace>
class basic_max_pool2d : public Module<T, S> {
 public:
  explicit basic_max_pool2d(std::int64_t kernel, std::int64_t stride = 0) : kernel_(kernel), stride_(stride) {
    if (kernel <= 0 || stride < 0)
      throw ArgumentError(ddp::detail::cat("MaxPool2d: bad kernel_size ", kernel, " / stride ", stride));
  }
  Variable<T, S> forward(Variable<T, S> const& x) { return max_pool2d(x, kernel_, stride_); }
  Variable<T, S> operator()(Variable<T, S> const& x) { return forward(x); }
  // 2×2 windows with stride 2 (the pooling a preceding Conv2d + ReLU can fuse).
  bool is_2x2() const noexcept { return kernel_ == 2 && (stride_ == 0 || stride_ == 2); }

 private:
  std::int64_t kernel_, stride_;
};

// Dropout with its own seeded generator: the same seed gives the same masks on every platform. The generator
// is named "generator" (named_generators), so a checkpoint continues its sequence.
// In DDP with the default batching (OnePass), each rank drops out its own samples: seed each rank differently
// (e.g. seed + rank) so the ranks' masks differ, as one process over the whole batch would draw them. In
// deterministic mode (ExactSum) do not: there the masks are keyed by each sample's place in the global batch,
// and the constructor makes every rank's generator rank 0's (a generator reseeded per rank afterwards is refused
// at the next step), so the masks are the same for every world size.
template <class T = float, MemorySpace S = HostSpace>
class basic_dropout : public Module<T, S> {
 public:
  explicit basic_dropout(double p, std::uint64_t seed = 0)
      : p_(p), gen_(this->register_generator("generator", std::make_shared<Generator>(seed))) {
    if (!(p >= 0.0 && p < 1.0)) throw ArgumentError(ddp::detail::cat("Dropout: p must be in [0, 1), got ", p));
  }
  // Draws from the generator's stream; inside a SampleKeyScope (deterministic training), from the
  // counter-based key instead, seeded by the generator's state (so re-seeding the layer, or restoring it
  // from a checkpoint, selects its masks), which is then not advanced.
  Variable<T, S> forward(Variable<T, S> const& x) {
    if (auto key = current_sample_key()) {
      GeneratorState const st = gen_->state();
      return dropout(x, p_, this->mode(), ddp::detail::mix64(st.state ^ ddp::detail::mix64(st.inc)), *key);
    }
    return dropout(x, p_, this->mode(), *gen_);
  }
  Variable<T, S> operator()(Variable<T, S> const& x) { return forward(x); }
  Generator& generator() noexcept { return *gen_; }

 private:
  double p_;
  std::shared_ptr<Generator> gen_;
};

using Linear = basic_linear<>;
using Conv2d = basic_conv2d<>;
using BatchNorm2d = basic_batch_norm2d<>;
using ReLU = basic_relu<>;
using Tanh = basic_tanh<>;
using Sigmoid = basic_sigmoid<>;
using Flatten = basic_flatten<>;
using MaxPool2d = basic_max_pool2d<>;
using Dropout = basic_dropout<>;

static_assert(Model<Linear> && Model<Conv2d> && Model<BatchNorm2d> && Model<ReLU> && Model<Flatten> &&
              Model<MaxPool2d> && Model<Dropout>);

}  // namespace ddp::nn
