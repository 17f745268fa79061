// Sequential containers: a compile-time one (layers in a tuple, no virtual calls) and AnySequential,
// built at run time from type-erased layers (for models read from a file).
#pragma once

#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/autograd/ops/activation.hpp"
#include "ddp/nn/module.hpp"

namespace ddp::nn {

// A layer with an explicit name in its container ("fc1" gives "fc1.weight"); unnamed layers get their index.
template <Model M>
struct Named {
  std::string name;
  M layer;
};
template <Model M>
Named<M> named(std::string name, M layer) {
  return {std::move(name), std::move(layer)};
}

template <class T, MemorySpace S>
class basic_max_pool2d;  // layers.hpp

namespace detail {
template <class L>
struct unwrap_named {
  using type = L;
};
template <class M>
struct unwrap_named<Named<M>> {
  using type = M;
};
template <class T, MemorySpace S, class Op>
class stateless_layer;  // layers.hpp
struct relu_op;
template <class L>
struct is_max_pool_layer : std::false_type {};
template <class T, MemorySpace S>
struct is_max_pool_layer<basic_max_pool2d<T, S>> : std::true_type {};
template <class L>
struct is_relu_layer : std::false_type {};
template <class T, MemorySpace S>
struct is_relu_layer<stateless_layer<T, S, relu_op>> : std::true_type {};
// (A named concept rather than a requires-expression inside Sequential's members: nvcc's front end loses the
// layer pack there.)
template <class L, class V>
concept HasForwardFused = requires(L& l, V const& h) {
  l.forward_fused(h, Epilogue::kRelu);
};

// How the fusion rule sees a layer that follows a fusable one.
enum class Follower : std::uint8_t { kOther, kRelu, kMaxPool2x2 };
template <class L>
Follower follower_of(L const& l) noexcept {
  if constexpr (is_relu_layer<L>::value)
    return Follower::kRelu;
  else if constexpr (is_max_pool_layer<L>::value)
    return l.is_2x2() ? Follower::kMaxPool2x2 : Follower::kOther;
  else
    return Follower::kOther;
}

// The one fusion rule of Sequential and AnySequential: a layer with forward_fused(x, Epilogue) (Conv2d) directly
// followed by a ReLU absorbs it (Epilogue::kRelu), and a 2×2, stride-2 MaxPool2d right after that ReLU too
// (kReluMaxPool2). `absorbed`: how many following layers the fused op replaces. Values and gradients are
// bitwise those of the separate layers.
struct Fusion {
  Epilogue epilogue = Epilogue::kNone;
  std::size_t absorbed = 0;
};
constexpr Fusion fusion_rule(bool fusable, Follower next, Follower after_next) noexcept {
  if (!fusable || next != Follower::kRelu) return {};
  if (after_next == Follower::kMaxPool2x2) return {Epilogue::kReluMaxPool2, 2};
  return {Epilogue::kRelu, 1};
}
template <std::size_t I, class... Ls>
using layer_at = typename unwrap_named<std::tuple_element_t<I, std::tuple<Ls...>>>::type;
}  // namespace detail

// Applies its layers in order. Parameters are named "<index or name>.<param>", in layer order.
template <class... Ls>
class Sequential {
  using First = typename detail::unwrap_named<std::tuple_element_t<0, std::tuple<Ls...>>>::type;

 public:
  using value_type = typename First::value_type;
  using space = typename First::space;
  using V = Variable<value_type, space>;

  explicit Sequential(Ls... layers) : layers_(std::move(layers)...) {}

  // Layers in order. A layer with forward_fused() directly followed by a ReLU (Conv2d, ReLU) runs as one
  // fused op, and with a 2×2 MaxPool2d after them as one op too: the same values and gradients, fewer passes
  // over the activation and its gradient.
  V forward(V const& x) { return run<0>(x); }
  V operator()(V const& x) { return forward(x); }

  std::vector<NamedParameter<value_type, space>> named_parameters() const {
    auto [ps, bs] = collect();
    return ps;
  }
  std::vector<NamedBuffer<value_type, space>> named_buffers() const {
    auto [ps, bs] = collect();
    return bs;
  }
  std::vector<NamedGenerator> named_generators() const {
    std::vector<NamedGenerator> gs;
    std::size_t i = 0;
    std::apply([&](auto const&... l) { ((append_prefixed(name_of(l, i), layer_of(l), gs), ++i), ...); }, layers_);
    return gs;
  }
  void set_mode(Mode m) {
    mode_ = m;
    std::apply([&](auto&... l) { (layer_of(l).set_mode(m), ...); }, layers_);
  }
  Mode mode() const noexcept { return mode_; }

  // The i-th layer (unwrapped from Named).
  template <std::size_t I>
  auto& get() {
    return layer_of(std::get<I>(layers_));
  }
  // The layers as stored (Named<M> or M), for type transformations such as nn::convert_sync_batchnorm.
  std::tuple<Ls...> const& layers() const noexcept { return layers_; }

  // Whether layer I and the ReLU after it run fused (detail::fusion_rule, with the layer types known here).
  template <std::size_t I>
  static constexpr bool fuses_relu() {
    if constexpr (I + 1 >= sizeof...(Ls)) {
      return false;
    } else {
      return detail::is_relu_layer<detail::layer_at<I + 1, Ls...>>::value &&
             detail::HasForwardFused<detail::layer_at<I, Ls...>, V>;
    }
  }
  // Whether layers I, I+1, I+2 are (a fusable layer, ReLU, MaxPool2d); they run as one op when the pool is 2×2
  // with stride 2 (checked at run time: the kernel size is a constructor argument).
  template <std::size_t I>
  static constexpr bool fuses_relu_pool() {
    if constexpr (!fuses_relu<I>() || I + 2 >= sizeof...(Ls)) {
      return false;
    } else {
      return detail::is_max_pool_layer<detail::layer_at<I + 2, Ls...>>::value;
    }
  }

 private:
  template <std::size_t I>
  V run(V const& h) {
    if constexpr (I == sizeof...(Ls)) {
      return h;
    } else if constexpr (fuses_relu<I>()) {
      detail::Follower after = detail::Follower::kOther;
      if constexpr (I + 2 < sizeof...(Ls)) after = detail::follower_of(layer_of(std::get<I + 2>(layers_)));
      detail::Fusion const f = detail::fusion_rule(true, detail::Follower::kRelu, after);
      auto& l = layer_of(std::get<I>(layers_));
      if constexpr (fuses_relu_pool<I>())
        if (f.absorbed == 2) return run<I + 3>(l.forward_fused(h, f.epilogue));
      return run<I + 2>(l.forward_fused(h, f.epilogue));
    } else {
      return run<I + 1>(layer_of(std::get<I>(layers_)).forward(h));
    }
  }
  template <class L>
  static auto& layer_of(L& l) {
    if constexpr (requires { l.layer; })
      return l.layer;
    else
      return l;
  }
  template <class L>
  static auto const& layer_of(L const& l) {
    if constexpr (requires { l.layer; })
      return l.layer;
    else
      return l;
  }
  template <class L>
  static std::string name_of(L const& l, std::size_t i) {
    if constexpr (requires { l.name; })
      return l.name;
    else
      return std::to_string(i);
  }
  auto collect() const {
    std::vector<NamedParameter<value_type, space>> ps;
    std::vector<NamedBuffer<value_type, space>> bs;
    std::size_t i = 0;
    std::apply([&](auto const&... l) { ((append_prefixed(name_of(l, i), layer_of(l), ps, bs), ++i), ...); }, layers_);
    return std::pair{std::move(ps), std::move(bs)};
  }

  std::tuple<Ls...> layers_;
  Mode mode_ = Mode::kTrain;
};

// Type-erased model handle (shares the wrapped model).
template <class T = float, MemorySpace S = HostSpace>
class AnyModel {
 public:
  using value_type = T;
  using space = S;

  template <Model M>
  requires(!std::same_as<std::decay_t<M>, AnyModel>) AnyModel(M m) : p_(std::make_shared<Impl<M>>(std::move(m))) {}

  Variable<T, S> forward(Variable<T, S> const& x) { return p_->forward(x); }
  Variable<T, S> operator()(Variable<T, S> const& x) { return forward(x); }
  std::vector<NamedParameter<T, S>> named_parameters() const { return p_->named_parameters(); }
  std::vector<NamedBuffer<T, S>> named_buffers() const { return p_->named_buffers(); }
  std::vector<NamedGenerator> named_generators() const { return p_->named_generators(); }
  void set_mode(Mode m) { p_->set_mode(m); }
  Mode mode() const { return p_->mode(); }
  // The wrapped model if it is an M (as std::function::target), else nullptr.
  template <Model M>
  M const* target() const noexcept {
    auto const* impl = dynamic_cast<Impl<M> const*>(p_.get());
    return impl ? &impl->m : nullptr;
  }
  // For AnySequential's fusion (detail::fusion_rule): how this layer looks as a follower, whether it has a
  // fused forward, and that forward.
  detail::Follower follower() const noexcept { return p_->follower(); }
  bool fusable() const noexcept { return p_->fusable(); }
  Variable<T, S> forward_fused(Variable<T, S> const& x, Epilogue e) { return p_->forward_fused(x, e); }

 private:
  struct Base {
    virtual ~Base() = default;
    virtual Variable<T, S> forward(Variable<T, S> const&) = 0;
    virtual std::vector<NamedParameter<T, S>> named_parameters() const = 0;
    virtual std::vector<NamedBuffer<T, S>> named_buffers() const = 0;
    virtual std::vector<NamedGenerator> named_generators() const = 0;
    virtual void set_mode(Mode) = 0;
    virtual Mode mode() const = 0;
    virtual detail::Follower follower() const noexcept = 0;
    virtual bool fusable() const noexcept = 0;
    virtual Variable<T, S> forward_fused(Variable<T, S> const&, Epilogue) = 0;
  };
  template <class M>
  struct Impl final : Base {
    M m;
    explicit Impl(M x) : m(std::move(x)) {}
    Variable<T, S> forward(Variable<T, S> const& x) override { return m.forward(x); }
    std::vector<NamedParameter<T, S>> named_parameters() const override { return m.named_parameters(); }
    std::vector<NamedBuffer<T, S>> named_buffers() const override { return m.named_buffers(); }
    std::vector<NamedGenerator> named_generators() const override { return generators_of(m); }
    void set_mode(Mode md) override { m.set_mode(md); }
    Mode mode() const override { return m.mode(); }
    detail::Follower follower() const noexcept override { return detail::follower_of(m); }
    bool fusable() const noexcept override { return detail::HasForwardFused<M, Variable<T, S>>; }
    Variable<T, S> forward_fused(Variable<T, S> const& x, Epilogue e) override {
      if constexpr (detail::HasForwardFused<M, Variable<T, S>>) {
        return m.forward_fused(x, e);
      } else {  // the separate ops (not reached by AnySequential, which fuses only fusable layers)
        if (e == Epilogue::kNone) return m.forward(x);
        Variable<T, S> y = ddp::relu(m.forward(x));
        return e == Epilogue::kReluMaxPool2 ? ddp::max_pool2d(y, 2) : y;
      }
    }
  };
  std::shared_ptr<Base> p_;
};

// Sequential built at run time: push_back(name, layer).
template <class T = float, MemorySpace S = HostSpace>
class AnySequential {
 public:
  using value_type = T;
  using space = S;

  template <Model M>
  AnySequential& push_back(std::string name, M layer) {
    layers_.push_back({std::move(name), AnyModel<T, S>(std::move(layer))});
    return *this;
  }
  template <Model M>
  AnySequential& push_back(M layer) {
    return push_back(std::to_string(layers_.size()), std::move(layer));
  }
  std::size_t size() const noexcept { return layers_.size(); }
  // The i-th layer's name and (type-erased) layer.
  std::string const& name_at(std::size_t i) const { return layers_.at(i).name; }
  AnyModel<T, S> const& layer_at(std::size_t i) const { return layers_.at(i).layer; }

  // Layers in order; a Conv2d directly followed by a ReLU (and a 2×2 MaxPool2d) runs as one fused op, by the
  // same rule as Sequential (detail::fusion_rule).
  Variable<T, S> forward(Variable<T, S> const& x) {
    Variable<T, S> h = x;
    auto follower = [&](std::size_t j) {
      return j < layers_.size() ? layers_[j].layer.follower() : detail::Follower::kOther;
    };
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      auto& l = layers_[i].layer;
      detail::Fusion const f = detail::fusion_rule(l.fusable(), follower(i + 1), follower(i + 2));
      h = f.absorbed != 0 ? l.forward_fused(h, f.epilogue) : l.forward(h);
      i += f.absorbed;
    }
    return h;
  }
  Variable<T, S> operator()(Variable<T, S> const& x) { return forward(x); }
  std::vector<NamedParameter<T, S>> named_parameters() const {
    std::vector<NamedParameter<T, S>> ps;
    std::vector<NamedBuffer<T, S>> bs;
    for (auto& l : layers_) append_prefixed(l.name, l.layer, ps, bs);
    return ps;
  }
  std::vector<NamedBuffer<T, S>> named_buffers() const {
    std::vector<NamedParameter<T, S>> ps;
    std::vector<NamedBuffer<T, S>> bs;
    for (auto& l : layers_) append_prefixed(l.name, l.layer, ps, bs);
    return bs;
  }
  std::vector<NamedGenerator> named_generators() const {
    std::vector<NamedGenerator> gs;
    for (auto& l : layers_) append_prefixed(l.name, l.layer, gs);
    return gs;
  }
  void set_mode(Mode m) {
    mode_ = m;
    for (auto& l : layers_) l.layer.set_mode(m);
  }
  Mode mode() const noexcept { return mode_; }

 private:
  struct Entry {
    std::string name;
    AnyModel<T, S> layer;
  };
  std::vector<Entry> layers_;
  Mode mode_ = Mode::kTrain;
};

static_assert(Model<AnySequential<>> && HasGenerators<AnySequential<>>);
static_assert(Model<AnyModel<>> && HasGenerators<AnyModel<>>);

}  // namespace ddp::nn
