// The Model concept and Module, the small base every layer uses: named parameters (registration order),
// buffers, train/eval mode.
#pragma once

#include <concepts>
#include <memory>
#include <string>
#include <vector>

#include "ddp/autograd/mode.hpp"
#include "ddp/autograd/variable.hpp"
#include "ddp/tensor/random.hpp"

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

// A random generator a layer draws from while training (Dropout's masks). Shared with the layer: a
// checkpoint saves and restores it through this handle.
struct NamedGenerator {
  std::string name;
  std::shared_ptr<Generator> generator;
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

// A model whose training draws random numbers says from which generators (named like its parameters), so
// checkpoints can continue their sequences. Optional: a model without it is taken to have none.
template <class M>
concept HasGenerators = requires(M const& m) {
  { m.named_generators() } -> std::same_as<std::vector<NamedGenerator>>;
};

// The generators of any model: named_generators() where it has one, else none.
template <Model M>
std::vector<NamedGenerator> generators_of(M const& m) {
  if constexpr (HasGenerators<M>)
    return m.named_generators();
  else
    return {};
}

// Base of ddp's layers. Layers are handles: copies share parameters and buffers (as torch modules
// shared by reference). Not thread-safe; one model per rank.
template <class T = float, MemorySpace S = HostSpace>
class Module {
 public:
  using value_type = T;
  using space = S;

  std::vector<NamedParameter<T, S>> named_parameters() const { return params_; }
  std::vector<NamedBuffer<T, S>> named_buffers() const { return buffers_; }
  std::vector<NamedGenerator> named_generators() const { return generators_; }
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
  std::shared_ptr<Generator> register_generator(std::string name, std::shared_ptr<Generator> g) {
    generators_.push_back({std::move(name), g});
    return g;
  }

 private:
  std::vector<NamedParameter<T, S>> params_;
  std::vector<NamedBuffer<T, S>> buffers_;
  std::vector<NamedGenerator> generators_;
  Mode mode_ = Mode::kTrain;
};

// Prefixes every name of a child's parameters/buffers ("0.weight", "fc1.bias").
template <class T, MemorySpace S, Model M>
void append_prefixed(std::string const& prefix, M const& m, std::vector<NamedParameter<T, S>>& ps,
                     std::vector<NamedBuffer<T, S>>& bs) {
  for (auto& p : m.named_parameters()) ps.push_back({prefix.empty() ? p.name : prefix + "." + p.name, p.var});
  for (auto& b : m.named_buffers()) bs.push_back({prefix.empty() ? b.name : prefix + "." + b.name, b.tensor});
}
// The same for a child's generators.
template <Model M>
void append_prefixed(std::string const& prefix, M const& m, std::vector<NamedGenerator>& gs) {
  for (auto& g : generators_of(m)) gs.push_back({prefix.empty() ? g.name : prefix + "." + g.name, g.generator});
}

}  // namespace ddp::nn
