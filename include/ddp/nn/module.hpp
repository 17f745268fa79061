// The Model concept and Module, the small base every layer uses: named parameters (registration order),
// buffers, train/eval mode.
#pragma once

#include <concepts>
#include <string>
#include <vector>

#include "ddp/autograd/ops/dropout.hpp"  // Mode
#include "ddp/autograd/variable.hpp"

namespace ddp::nn {

using ddp::Mode;

template <class T, MemorySpace S>
struct NamedParameter {
  std::string name;
  Variable<T, S> var;
};
template <class T, MemorySpace S>
struct NamedBuffer {
  std::string name;
  Tensor<T, S> tensor;
};

// What DDP, optimizers and trainers need from a model.
template <class M>
concept Model = requires(M& m, M const& cm, Variable<typename M::value_type, typename M::space> const& x) {
  typename M::value_type;
  typename M::space;
  { m.forward(x) } -> std::same_as<Variable<typename M::value_type, typename M::space>>;
  { cm.named_parameters() } -> std::same_as<std::vector<NamedParameter<typename M::value_type, typename M::space>>>;
  { cm.named_buffers() } -> std::same_as<std::vector<NamedBuffer<typename M::value_type, typename M::space>>>;
  m.set_mode(Mode::kTrain);
  { cm.mode() } -> std::same_as<Mode>;
};

// Base of ddp's layers. Layers are handles: copies share parameters and buffers (as torch modules
// shared by reference). Not thread-safe; one model per rank.
template <class T = float, MemorySpace S = HostSpace>
class Module {
 public:
  using value_type = T;
  using space = S;

  std::vector<NamedParameter<T, S>> named_parameters() const { return params_; }
  std::vector<NamedBuffer<T, S>> named_buffers() const { return buffers_; }
  void set_mode(Mode m) { mode_ = m; }
  Mode mode() const noexcept { return mode_; }

 protected:
  Variable<T, S> register_parameter(std::string name, Tensor<T, S> init) {
    Variable<T, S> v(std::move(init), RequiresGrad::kYes);
    params_.push_back({std::move(name), v});
    return v;
  }
  Tensor<T, S> register_buffer(std::string name, Tensor<T, S> t) {
    buffers_.push_back({std::move(name), t});
    return t;
  }

 private:
  std::vector<NamedParameter<T, S>> params_;
  std::vector<NamedBuffer<T, S>> buffers_;
  Mode mode_ = Mode::kTrain;
};

// Prefixes every name of a child's parameters/buffers ("0.weight", "fc1.bias").
template <class T, MemorySpace S, Model M>
void append_prefixed(std::string const& prefix, M const& m, std::vector<NamedParameter<T, S>>& ps,
                     std::vector<NamedBuffer<T, S>>& bs) {
  for (auto& p : m.named_parameters()) ps.push_back({prefix.empty() ? p.name : prefix + "." + p.name, p.var});
  for (auto& b : m.named_buffers()) bs.push_back({prefix.empty() ? b.name : prefix + "." + b.name, b.tensor});
}

}  // namespace ddp::nn
