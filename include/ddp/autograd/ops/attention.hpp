// causal_self_attention: multi-head causal self-attention of packed q, k, v, as one op where the memory space has a
// fused kernel (Kernels::attention_fwd/bwd: no transposed or sliced tensors), composed from bmm, softmax, transpose and
// split_last elsewhere (the same function, to rounding).
#pragma once

#include <cmath>

#include "ddp/autograd/ops/linear.hpp"
#include "ddp/autograd/ops/shape_ops.hpp"
#include "ddp/autograd/ops/softmax.hpp"
#include "ddp/autograd/variable.hpp"
#include "ddp/tensor/kernels.hpp"

namespace ddp {

namespace detail {
template <class K, class T>
concept FusedAttention = requires(T const* c, T* m, T s, std::int64_t n) {
  K::attention_fwd(n, n, n, n, s, c, m, m);
  K::attention_bwd(n, n, n, n, s, c, c, c, s, m);
};

// The composed form: split into q, k, v, heads to (B, H, T, D), softmax(scale·q·kᵀ) masked, ·v, heads back.
template <class T, MemorySpace S>
Variable<T, S> composed_attention(Variable<T, S> const& qkv, std::int64_t heads) {
  Shape const& s = qkv.shape();
  std::int64_t const B = s[0], Tn = s[1], C = s[2] / 3, D = C / heads;
  auto parts = split_last(qkv, 3);
  auto split_heads = [&](Variable<T, S> const& t) { return transpose(reshape(t, Shape{B, Tn, heads, D}), 1, 2); };
  Variable<T, S> att = softmax(bmm(split_heads(parts[0]), split_heads(parts[1]), Trans::kNo, Trans::kYes),
                               {.scale = 1.0 / std::sqrt(double(D)), .mask = SoftmaxMask::kCausal});
  return reshape(transpose(bmm(att, split_heads(parts[2])), 1, 2), Shape{B, Tn, C});
}
}  // namespace detail

// qkv:(B, T, 3C) holding q, k and v side by side -> (B, T, C): `heads` heads of size D = C/heads, each
// softmax(q·kᵀ/√D) with every query's later keys masked, times v (PyTorch's scaled dot-product attention with
// is_causal, heads merged back). Attention weights are not exposed: for dropout on them, compose the ops.
template <class T, MemorySpace S>
Variable<T, S> causal_self_attention(Variable<T, S> const& qkv, std::int64_t heads) {
  using K = Kernels<S>;
  Shape const& s = qkv.shape();
  if (s.rank() != 3 || s[2] % 3 != 0 || heads <= 0 || (s[2] / 3) % heads != 0)
    throw ShapeError(detail::cat("causal_self_attention: qkv of shape ", s, " with ", heads,
                                 " heads; expected (B, T, 3C) with C a multiple of the head count"));
  if constexpr (!detail::FusedAttention<K, T>) {
    return detail::composed_attention(qkv, heads);
  } else {
    std::int64_t const B = s[0], Tn = s[1], C = s[2] / 3, D = C / heads;
    T const scale = T(1.0 / std::sqrt(double(D)));
    Tensor<T, S> p(Shape{B, heads, Tn, Tn}), y(Shape{B, Tn, C});
    K::attention_fwd(B, Tn, heads, D, scale, qkv.value().data(), p.data(), y.data());
    return detail::record(
        "causal_self_attention", std::move(y),
        [qkv, p, B, Tn, heads, D, scale](Node<T, S>& self) {
          auto& qn = qkv.node();
          T const beta = detail::grad_beta(qn);
          K::attention_bwd(B, Tn, heads, D, scale, qkv.value().data(), p.data(), self.grad.data(), beta,
                           qn.grad.data());
        },
        qkv);
  }
}

}  // namespace ddp
