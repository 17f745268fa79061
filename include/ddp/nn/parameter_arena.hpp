// ParameterArena: packs a model's parameters and gradients into two flat buffers, laid out in reverse
// registration order (bucket order), and points every parameter at its slice.
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "ddp/nn/module.hpp"
#include "ddp/tensor/kernels.hpp"

namespace ddp::nn {

// After construction, each parameter's value and grad are views into values() / grads(); layers keep
// working unchanged because they hold the same nodes. Layout: the last-registered parameter first, so the
// gradients that backward produces first are contiguous at the front (a DDP bucket is a slice).
// One arena per model: packing a model twice re-points its parameters at the newer arena.
template <class T = float, MemorySpace S = HostSpace>
class ParameterArena {
 public:
  using value_type = T;
  using space = S;

  struct Entry {
    std::string name;
    Shape shape;
    std::int64_t offset = 0;  // in elements, into values()/grads()
    std::int64_t numel = 0;
    Variable<T, S> var;
  };

  ParameterArena() = default;
  template <Model M>
  requires std::same_as<typename M::value_type, T> && std::same_as<typename M::space, S>
  explicit ParameterArena(M const& model) : ParameterArena(model.named_parameters()) {}

  // The distinct parameters, validated: shared weights appear once, under their first name. Frozen ones
  // (requires_grad false) are left out of trainable(): nothing computes their gradients, so an arena, an
  // optimizer and DDP's reduction skip them, as PyTorch does.
  static std::vector<NamedParameter<T, S>> unique_all(std::vector<NamedParameter<T, S>> const& params) {
    std::vector<NamedParameter<T, S>> out;
    std::unordered_set<Node<T, S> const*> seen;
    for (auto const& p : params) {
      if (!p.var.defined()) throw ArgumentError(ddp::detail::cat("parameter '", p.name, "' is undefined"));
      if (!p.var.is_leaf())
        throw ArgumentError(
            ddp::detail::cat("parameter '", p.name, "' must be a leaf; it comes from op '", p.var.op(), "'"));
      if (seen.insert(&p.var.node()).second) out.push_back(p);
    }
    return out;
  }
  static std::vector<NamedParameter<T, S>> trainable(std::vector<NamedParameter<T, S>> const& params) {
    auto all = unique_all(params);
    std::erase_if(all, [](NamedParameter<T, S> const& p) { return !p.var.requires_grad(); });
    return all;
  }

  // The first of `params` (trainable ones) that lives in a ParameterArena that is still alive, or null. An
  // optimizer holds a copy of the arena it updates; re-packing those parameters would leave it updating
  // storage nobody reads.
  static NamedParameter<T, S> const* find_packed(std::vector<NamedParameter<T, S>> const& params) noexcept {
    for (auto const& p : params)
      if (auto const& h = p.var.node().hooks; h && !h->packed_by.expired()) return &p;
    return nullptr;
  }

  // Makes the gradient buffer of a given number of elements (DDP: the communicator's gradient_storage, which
  // an all-reduce may reduce in place); unset: ordinary memory.
  using GradStorage = std::function<Tensor<T, S>(std::int64_t numel)>;

  // `reserve_after[i]` extra elements are left free right after unique parameter i (registration order) in
  // both buffers; DDP keeps a bucket's status words there, inside the bucket's all-reduce slice. Each reserve
  // is rounded up to whole 64-byte lines, so where a parameter starts within a line does not depend on the
  // reserves (DDP's bucket plan): the vectorised kernels split a tensor by its alignment, and a parameter
  // moved by a few elements can round differently (with another plan, a resumed run drifted 1e-3 from the
  // uninterrupted one in 3 AdamW steps on an AVX2 host; test/train/resume_test).
  explicit ParameterArena(std::vector<NamedParameter<T, S>> const& params,
                          std::vector<std::int64_t> const& reserve_after = {}, GradStorage const& grad_storage = {}) {
    using K = Kernels<S>;
    for (auto const& p : trainable(params)) entries_.push_back({p.name, p.var.shape(), 0, p.var.numel(), p.var});
    if (!reserve_after.empty() && reserve_after.size() != entries_.size())
      throw ArgumentError(ddp::detail::cat("ParameterArena: reserve_after has ", reserve_after.size(), " entries for ",
                                           entries_.size(), " parameters"));
    constexpr std::int64_t kLine = 64 / sizeof(T) > 0 ? 64 / sizeof(T) : 1;  // elements per 64-byte line
    std::int64_t off = 0;
    for (std::size_t k = entries_.size(); k-- > 0;) {
      entries_[k].offset = off;
      std::int64_t const reserve = reserve_after.empty() ? 0 : reserve_after[k];
      off += entries_[k].numel + (reserve + kLine - 1) / kLine * kLine;
    }
    values_ = Tensor<T, S>(Shape{off});
    grads_ = grad_storage ? grad_storage(off) : Tensor<T, S>(Shape{off});
    if (grads_.numel() != off)
      throw ArgumentError(ddp::detail::cat("ParameterArena: the gradient storage holds ", grads_.numel(),
                                           " elements, the parameters need ", off));
    lease_ = std::make_shared<char const>('\0');
    for (auto& e : entries_) {
      auto& n = e.var.node();
      n.leaf_hooks().packed_by = lease_;
      K::copy(e.numel, n.value.data(), values_.data() + e.offset);
      bool const had_grad = n.grad_defined;
      if (had_grad) K::copy(e.numel, n.grad.data(), grads_.data() + e.offset);
      n.value = Tensor<T, S>::view(values_.owner(), values_.data() + e.offset, e.shape);
      n.grad = Tensor<T, S>::view(grads_.owner(), grads_.data() + e.offset, e.shape);
      n.grad_defined = had_grad;
    }
  }

  // Parameters in registration order (names and shapes as the model reports them).
  std::vector<Entry> const& entries() const noexcept { return entries_; }
  std::size_t count() const noexcept { return entries_.size(); }
  // Elements in each buffer (parameters plus any reserved slots).
  std::int64_t numel() const noexcept { return values_.numel(); }
  // Elements that belong to parameters.
  std::int64_t parameter_numel() const noexcept {
    std::int64_t n = 0;
    for (auto const& e : entries_) n += e.numel;
    return n;
  }
  Tensor<T, S> const& values() const noexcept { return values_; }
  Tensor<T, S> const& grads() const noexcept { return grads_; }
  Entry const& find(std::string const& name) const {
    for (auto const& e : entries_)
      if (e.name == name) return e;
    throw ArgumentError(ddp::detail::cat("no parameter named '", name, "'"));
  }

  // Whether every parameter still lives in this arena (no later arena re-packed it). O(#parameters).
  bool current() const noexcept {
    return std::all_of(entries_.begin(), entries_.end(),
                       [this](Entry const& e) { return e.var.node().value.data() == values_.data() + e.offset; });
  }
  // Throws ArgumentError naming the first parameter that another arena has re-packed since this one was made.
  void check_current(std::string_view who) const {
    for (auto const& e : entries_)
      if (e.var.node().value.data() != values_.data() + e.offset)
        throw ArgumentError(
            ddp::detail::cat(who, ": parameter '", e.name,
                             "' was re-packed into another ParameterArena "
                             "(e.g. by DistributedDataParallel) after this one was made, so updates here "
                             "would reach nothing. Build the optimizer from the newest arena, e.g. "
                             "ddp.parameters() after wrapping the model."));
  }

  // Forget all gradients in O(#parameters), touching no memory: the next backward overwrites them.
  void zero_grad() noexcept {
    for (auto& e : entries_) e.var.node().grad_defined = false;
  }
  bool all_grads_defined() const noexcept {
    return std::all_of(entries_.begin(), entries_.end(), [](Entry const& e) { return e.var.node().grad_defined; });
  }
  // Whether parameter i (registration order) holds a gradient.
  bool has_grad(std::size_t i) const noexcept { return entries_[i].var.node().grad_defined; }
  // Parameter i's gradient, zeros if no backward produced one (so its slice of grads() is valid), marked
  // defined. Returns whether it held a gradient before.
  bool fill_missing_grad(std::size_t i) {
    auto& n = entries_[i].var.node();
    if (n.grad_defined) return true;
    Kernels<S>::fill(entries_[i].numel, T(0), grads_.data() + entries_[i].offset);
    n.grad_defined = true;
    return false;
  }
  // Whether parameter i's slice of grads() counts as its gradient (false: optimizers skip it); the slice is left
  // as it is.
  void set_has_grad(std::size_t i, bool defined) noexcept { entries_[i].var.node().grad_defined = defined; }

  // Writes zeros into the gradients no backward produced, so the whole grads() buffer is valid.
  void materialize_grads() {
    lease_ = std::make_shared<char const>('\0');
    for (auto& e : entries_) {
      auto& n = e.var.node();
      n.leaf_hooks().packed_by = lease_;
      if (!n.grad_defined) {
        Kernels<S>::fill(e.numel, T(0), grads_.data() + e.offset);
        n.grad_defined = true;
      }
    }
  }

 private:
  std::vector<Entry> entries_;
  Tensor<T, S> values_, grads_;
  std::shared_ptr<char const> lease_;  // shared by copies; parameters point back at it (find_packed)
};

}  // namespace ddp::nn
