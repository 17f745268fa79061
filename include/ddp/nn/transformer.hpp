// The transformer's building-block layers: Embedding (a table looked up by token ids), LayerNorm (with or without
// bias) and GELU. PyTorch's names and default initialisations, so fixtures map one to one.
#pragma once

#include "ddp/autograd/autograd.hpp"
#include "ddp/nn/init.hpp"
#include "ddp/nn/module.hpp"

namespace ddp::nn {

namespace detail {
// Token ids carried as exact float values (a Variable, as every Model's forward takes) -> int32 ids in the same
// memory space. Host values are checked: each must be a whole number in [0, bound); device values are converted
// as they are, and an id out of range is caught by the embedding kernel.
template <class T, MemorySpace S>
Tensor<std::int32_t, S> ids_from_values(char const* who, Tensor<T, S> const& x, std::int64_t bound) {
  Tensor<std::int32_t, S> ids(x.shape());
  if constexpr (std::same_as<S, HostSpace>) {
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      T const v = x[i];
      if (!(v >= T(0) && v < T(bound)) || v != T(static_cast<std::int64_t>(v)))
        throw ArgumentError(ddp::detail::cat(who, ": input ", i, " is ", v, ", not a token id in [0, ", bound, ")"));
      ids[i] = static_cast<std::int32_t>(v);
    }
  } else {
    Kernels<S>::cast(x.numel(), 1.0f, x.data(), ids.data());
  }
  return ids;
}
}  // namespace detail

// weight:(num_embeddings, dim), initialised normal(0, 1) as PyTorch. forward(ids) looks up int32 ids of any
// shape (…) -> (…, dim); forward(x) takes the ids as exact float values (the Model concept's input).
template <class T = float, MemorySpace S = HostSpace>
class basic_embedding : public Module<T, S> {
 public:
  basic_embedding(std::int64_t num_embeddings, std::int64_t dim, Generator& gen) {
    if (num_embeddings <= 0 || dim <= 0)
      throw ArgumentError(ddp::detail::cat("Embedding: num_embeddings and embedding_dim must be positive (got ",
                                           num_embeddings, ", ", dim, ")"));
    Tensor<T> w(Shape{num_embeddings, dim});
    init::normal(w, 0.0, 1.0, gen);
    weight = this->register_parameter("weight", to_space<S>(w));
  }
  Variable<T, S> forward(Tensor<std::int32_t, S> const& ids) { return embedding(weight, ids); }
  Variable<T, S> forward(Variable<T, S> const& x) {
    return embedding(weight, detail::ids_from_values("Embedding", x.value(), num_embeddings()));
  }
  Variable<T, S> operator()(Tensor<std::int32_t, S> const& ids) { return forward(ids); }
  Variable<T, S> operator()(Variable<T, S> const& x) { return forward(x); }
  std::int64_t num_embeddings() const { return weight.shape()[0]; }
  std::int64_t embedding_dim() const { return weight.shape()[1]; }

  Variable<T, S> weight;
};

struct LayerNormOptions {
  double eps = 1e-5;
  bool bias = true;  // false: weight only (nanoGPT's bias=False)
};

// Normalises the last dimension; weight = 1, bias = 0 (registered only with options.bias).
template <class T = float, MemorySpace S = HostSpace>
class basic_layer_norm : public Module<T, S> {
 public:
  explicit basic_layer_norm(std::int64_t dim, LayerNormOptions opt = {}) : eps_(opt.eps) {
    if (dim <= 0) throw ArgumentError(ddp::detail::cat("LayerNorm: normalized_shape must be positive (got ", dim, ")"));
    if (!(opt.eps > 0)) throw ArgumentError(ddp::detail::cat("LayerNorm: eps must be > 0 (got ", opt.eps, ")"));
    weight = this->register_parameter("weight", to_space<S>(full<T>(Shape{dim}, T(1))));
    if (opt.bias) bias = this->register_parameter("bias", to_space<S>(zeros<T>(Shape{dim})));
  }
  Variable<T, S> forward(Variable<T, S> const& x) { return layer_norm(x, weight, bias, {.eps = eps_}); }
  Variable<T, S> operator()(Variable<T, S> const& x) { return forward(x); }

  Variable<T, S> weight, bias;

 private:
  double eps_;
};

// GELU as a layer (parameter-free).
template <class T = float, MemorySpace S = HostSpace>
class basic_gelu : public Module<T, S> {
 public:
  explicit basic_gelu(GeluApprox approx = GeluApprox::kErf) : approx_(approx) {}
  Variable<T, S> forward(Variable<T, S> const& x) { return gelu(x, approx_); }
  Variable<T, S> operator()(Variable<T, S> const& x) { return forward(x); }

 private:
  GeluApprox approx_;
};

using Embedding = basic_embedding<>;
using LayerNorm = basic_layer_norm<>;
using GELU = basic_gelu<>;
static_assert(Model<Embedding> && Model<LayerNorm> && Model<GELU>);

}  // namespace ddp::nn
