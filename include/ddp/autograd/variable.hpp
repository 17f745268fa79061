// Variable<T, Space>: a handle to an autograd node (value, grad, parents, backward closure, grad-ready hook).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "ddp/error.hpp"
#include "ddp/tensor/kernels.hpp"
#include "ddp/tensor/tensor.hpp"

namespace ddp {

enum class RequiresGrad { kNo, kYes };

namespace detail {
// Per-thread autograd switch (each rank of the threads backend is a thread with its own mode).
inline bool& grad_mode() noexcept {
  thread_local bool enabled = true;
  return enabled;
}
inline std::uint64_t next_backward_epoch() noexcept {
  static std::atomic<std::uint64_t> epoch{0};
  return ++epoch;
}
}  // namespace detail

// RAII: no graph is recorded inside its scope (evaluation, optimizer updates). Per thread.
class NoGradGuard {
 public:
  NoGradGuard() noexcept : prev_(detail::grad_mode()) { detail::grad_mode() = false; }
  ~NoGradGuard() { detail::grad_mode() = prev_; }
  NoGradGuard(NoGradGuard const&) = delete;
  NoGradGuard& operator=(NoGradGuard const&) = delete;

 private:
  bool prev_;
};
inline bool grad_enabled() noexcept { return detail::grad_mode(); }

// One vertex of the eager graph. Leaves are inputs and parameters; interior nodes carry a backward
// closure that adds their gradient's contribution into their parents' gradients.
template <class T, MemorySpace S>
struct Node {
  using GradHook = std::function<void(Node&)>;
  static constexpr int kMaxParents = 4;

  Tensor<T, S> value;
  Tensor<T, S> grad;  // storage (for parameters: a view into the gradient arena)
  bool requires_grad = false;
  bool grad_defined = false;  // grad holds a value; when false, the first contribution overwrites it
  bool is_leaf = true;
  int n_parents = 0;
  int pending = 0;  // consumer edges still to run in the current backward (leaves)
  std::uint64_t visit_epoch = 0;
  char const* op = "leaf";
  std::array<std::shared_ptr<Node>, kMaxParents> parents{};
  // A library stage's hook (DDP's reducer): a plain function pointer with its context, not a std::function,
  // as it runs for every parameter in every backward, also at world size 1.
  struct ReadyHook {
    void (*fn)(void* ctx, std::size_t index, Node& n) = nullptr;
    void* ctx = nullptr;
    std::size_t index = 0;
    explicit operator bool() const noexcept { return fn != nullptr; }
    void operator()(Node& n) const { fn(ctx, index, n); }
  };
  // What only parameters use, out of line so that the interior nodes each forward allocates stay small.
  struct LeafHooks {
    GradHook grad_hook;                   // the user's: once per backward, when this gradient is final
    ReadyHook ready_hook;                 // then a library stage's, which sees the gradient as the user's hook left it
    std::weak_ptr<void const> packed_by;  // the ParameterArena whose storage this leaf lives in (stale-arena checks)
  };
  std::unique_ptr<LeafHooks> hooks;  // null until a hook or an arena needs it
  LeafHooks& leaf_hooks() {
    if (!hooks) hooks = std::make_unique<LeafHooks>();
    return *hooks;
  }

  Node() = default;
  Node(Node const&) = delete;
  Node& operator=(Node const&) = delete;
  // Each node's last owner is usually its consumer, so dropping a graph by plain member destruction would
  // recurse once per node and overflow the stack on long chains (~3·10⁵ nodes at 8 MiB). Instead, parents
  // this node solely owns are unlinked here with an explicit stack: O(nodes) time, O(1) recursion depth.
  virtual ~Node() {
    std::vector<std::shared_ptr<Node>> doomed;
    for (auto& p : parents)
      if (p) doomed.push_back(std::move(p));
    while (!doomed.empty()) {
      std::shared_ptr<Node> n = std::move(doomed.back());
      doomed.pop_back();
      if (n.use_count() != 1) continue;  // someone else keeps it: dropping our reference destroys nothing
      n->release();                      // its closure's captured handles co-own its parents
      for (auto& p : n->parents)
        if (p) doomed.push_back(std::move(p));
    }  // n is destroyed with no parents left to cascade into
  }
  virtual void backward() {}
  virtual void release() noexcept {}
  virtual bool released() const noexcept { return false; }
};

namespace detail {
[[noreturn]] [[gnu::noinline, gnu::cold]] inline void throw_undefined_variable() {
  throw ArgumentError("use of an undefined (default-constructed) ddp::Variable");
}

template <class T, MemorySpace S, class F>
struct FnNode final : Node<T, S> {
  std::optional<F> fn;
  explicit FnNode(F&& f) : fn(std::move(f)) {}
  void backward() override { (*fn)(static_cast<Node<T, S>&>(*this)); }
  void release() noexcept override { fn.reset(); }
  bool released() const noexcept override { return !fn.has_value(); }
};

// Prepares n.grad for a contribution: allocates it if needed and returns the beta to write with
// (0: overwrite, the old contents are garbage; 1: accumulate).
template <class T, MemorySpace S>
T grad_beta(Node<T, S>& n) {
  if (!n.grad.defined() || !(n.grad.shape() == n.value.shape())) n.grad = Tensor<T, S>(n.value.shape());
  T const b = n.grad_defined ? T(1) : T(0);
  n.grad_defined = true;
  return b;
}

// parent.grad += self.grad, for an op whose input's gradient is its own gradient unchanged (a residual sum). Where it
// can, self's gradient is lent instead of copied: to an interior node with no gradient yet in this backward, of the
// same shape, from a node that is not the sweep's root (backward() keeps the root's seed; every other interior
// gradient is dropped right after its node's backward, so from here on only `parent` reads or writes that storage).
// Call it after the op's last read of self.grad: a later contribution to `parent`, say from the op's other input,
// adds into the shared storage. Leaves never borrow (their gradients live in the parameter arena). `pending` counts
// a node's consumer edges in this sweep: 0 only for the root.
template <class T, MemorySpace S>
void pass_grad(Node<T, S>& self, Node<T, S>& parent) {
  if (!parent.is_leaf && !parent.grad_defined && self.pending != 0 && parent.value.shape() == self.grad.shape()) {
    parent.grad = self.grad;
    parent.grad_defined = true;
    return;
  }
  T const beta = grad_beta(parent);
  Kernels<S>::axpby(self.grad.numel(), T(1), self.grad.data(), beta, parent.grad.data());
}
}  // namespace detail

// A cheap handle (copies share the node). Thread safety: a graph belongs to the thread that built it.
template <class T, MemorySpace S = HostSpace>
class Variable {
 public:
  using value_type = T;
  using space = S;
  using node_type = Node<T, S>;

  Variable() = default;
  // A leaf: a constant input (RequiresGrad::kNo, the default) or a trainable tensor (kYes).
  explicit Variable(Tensor<T, S> value, RequiresGrad rg = RequiresGrad::kNo) : node_(std::make_shared<node_type>()) {
    node_->value = std::move(value);
    node_->requires_grad = rg == RequiresGrad::kYes;
  }
  explicit Variable(std::shared_ptr<node_type> n) noexcept : node_(std::move(n)) {}

  bool defined() const noexcept { return node_ != nullptr; }
  Tensor<T, S> const& value() const { return checked().value; }
  // The gradient, or an undefined tensor when none has been accumulated since the last zero_grad.
  Tensor<T, S> grad() const { return checked().grad_defined ? node_->grad : Tensor<T, S>{}; }
  bool has_grad() const { return checked().grad_defined; }
  bool requires_grad() const { return checked().requires_grad; }
  bool is_leaf() const { return checked().is_leaf; }
  Shape const& shape() const { return checked().value.shape(); }
  std::int64_t numel() const { return checked().value.numel(); }
  char const* op() const { return checked().op; }
  T item() const { return checked().value.item(); }
  // Forget the gradient without touching memory: the next backward overwrites instead of adding.
  void zero_grad() const noexcept {
    if (node_) node_->grad_defined = false;
  }
  // Leaves only: `hook(node)` runs once per backward, as soon as this leaf's gradient is final.
  void set_grad_hook(typename node_type::GradHook hook) const {
    if (!checked().is_leaf)
      throw ArgumentError(detail::cat("grad hooks go on leaves; this variable comes from op '", node_->op, "'"));
    node_->leaf_hooks().grad_hook = std::move(hook);
  }
  node_type& node() const { return checked(); }
  std::shared_ptr<node_type> const& node_ptr() const noexcept { return node_; }

 private:
  // Inlined everywhere (it guards every accessor); the throw lives out of line.
  node_type& checked() const {
    if (!node_) [[unlikely]]
      detail::throw_undefined_variable();
    return *node_;
  }
  std::shared_ptr<node_type> node_;
};

using Var = Variable<float>;

namespace detail {
// Records an op: `out` is its value, `bwd(self)` its backward. Records nothing (returns a constant) in
// no_grad mode or when no parent requires grad.
template <class T, MemorySpace S, class F, class... P>
Variable<T, S> record(char const* op, Tensor<T, S> out, F&& bwd, P const&... parents) {
  static_assert(sizeof...(P) <= Node<T, S>::kMaxParents, "an op has at most 4 differentiable inputs");
  if (!grad_mode() || !(parents.requires_grad() || ...)) return Variable<T, S>(std::move(out));
  auto n = std::make_shared<FnNode<T, S, std::decay_t<F>>>(std::forward<F>(bwd));
  n->value = std::move(out);
  n->requires_grad = true;
  n->is_leaf = false;
  n->op = op;
  ((parents.requires_grad() ? (void)(n->parents[n->n_parents++] = parents.node_ptr()) : (void)0), ...);
  return Variable<T, S>(std::shared_ptr<Node<T, S>>(std::move(n)));
}
}  // namespace detail

}  // namespace ddp
