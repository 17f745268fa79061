// backward(): one topological sort, then a reverse sweep; each leaf's grad-ready hook fires once, right
// after its last consumer ran.
#pragma once

#include <functional>
#include <vector>

#include "ddp/autograd/variable.hpp"
#include "ddp/tensor/kernels.hpp"

namespace ddp {

namespace detail {
struct PostBackward {
  void const* owner;
  std::function<void()> fn;
};
inline std::vector<PostBackward>& post_backward_queue() {
  thread_local std::vector<PostBackward> q;
  return q;
}
// Runs (and clears) the callbacks queued for the end of this thread's backward.
inline void run_post_backward() {
  auto& q = post_backward_queue();
  if (q.empty()) return;
  if (q.size() == 1) {  // the common case (one DDP wrapper): no vector copy
    auto cb = std::move(q.front().fn);
    q.clear();
    cb();
    return;
  }
  auto callbacks = std::move(q);
  q.clear();
  for (auto& c : callbacks) c.fn();
}
}  // namespace detail

// Queues f to run once, on this thread, at the end of the backward() in progress, or of the next one
// (after every gradient is final and every grad-ready hook has fired). DDP queues its "wait for all buckets"
// from its parameters' ready hooks, so only a backward that reaches the model's parameters finishes its
// gradient synchronisation (an unrelated backward on the same thread does not). If that backward throws, the
// queued callbacks are dropped.
// `owner` identifies the callback for cancel_post_backward (e.g. an object that dies before the backward).
inline void queue_post_backward(void const* owner, std::function<void()> f) {
  detail::post_backward_queue().push_back({owner, std::move(f)});
}
// Whether a callback of `owner` is queued for this thread's next backward.
inline bool post_backward_queued(void const* owner) noexcept {
  for (auto const& c : detail::post_backward_queue())
    if (c.owner == owner) return true;
  return false;
}
// Removes this thread's queued callbacks that belong to `owner`.
inline void cancel_post_backward(void const* owner) noexcept {
  auto& q = detail::post_backward_queue();
  std::erase_if(q, [owner](detail::PostBackward const& c) { return c.owner == owner; });
}

struct BackwardOptions {
  bool retain_graph = false;  // keep closures and saved tensors so backward can run again
};

namespace detail {
// A leaf's gradient is final: the user's hook first, then the library stage's (e.g. DDP launching a bucket).
template <class T, MemorySpace S>
inline void run_grad_hooks(Node<T, S>& n) {
  if (!n.hooks) return;
  auto const& h = *n.hooks;
  if (h.grad_hook) h.grad_hook(n);
  if (h.ready_hook) h.ready_hook(n);
}

// The sweep's work lists, kept per thread between backwards so that a step allocates them once, not on every
// backward (a toy model's backward spent ~8 allocations on them). A backward started from inside another
// (a hook that runs one) finds the lists taken and uses fresh ones.
template <class N>
struct SweepLists {
  std::vector<N*> order;
  std::vector<std::pair<N*, int>> stack;
};
template <class N>
class BorrowedSweepLists {
 public:
  BorrowedSweepLists() : lists_(std::move(home())) {
    lists_.order.clear();
    lists_.stack.clear();
  }
  ~BorrowedSweepLists() {
    if (lists_.order.capacity() >= home().order.capacity()) home() = std::move(lists_);
  }
  BorrowedSweepLists(BorrowedSweepLists const&) = delete;
  BorrowedSweepLists& operator=(BorrowedSweepLists const&) = delete;
  SweepLists<N>& operator*() noexcept { return lists_; }

 private:
  static SweepLists<N>& home() {
    thread_local SweepLists<N> h;
    return h;
  }
  SweepLists<N> lists_;
};

// One backward: topological sort, reverse sweep, hooks. See backward() below.
template <class T, MemorySpace S>
void backward_sweep(Variable<T, S> const& root, Tensor<T, S> const& grad_output, BackwardOptions opts) {
  using N = Node<T, S>;
  using K = Kernels<S>;
  N& r = root.node();
  if (!r.requires_grad)
    throw ArgumentError(detail::cat("backward() on a variable that does not require grad (op '", r.op,
                                    "'): no parameter contributed to it, or it was computed under NoGradGuard"));
  if (!r.is_leaf && r.released())
    throw ArgumentError(detail::cat("backward() through a graph that was already freed (op '", r.op,
                                    "'); pass BackwardOptions{.retain_graph = true} to the first backward"));
  if (grad_output.defined() && !(grad_output.shape() == r.value.shape()))
    throw ShapeError(detail::cat("backward(): grad_output has shape ", grad_output.shape(), " but the root has shape ",
                                 r.value.shape()));
  if (!grad_output.defined() && r.value.numel() != 1)
    throw ShapeError(
        detail::cat("backward() without grad_output needs a one-element root; got shape ", r.value.shape()));

  // Post-order DFS (iterative: deep nets must not overflow the stack). Leaves count their consumer edges.
  std::uint64_t const epoch = detail::next_backward_epoch();
  BorrowedSweepLists<N> lists;
  auto& order = (*lists).order;
  auto& stack = (*lists).stack;
  r.visit_epoch = epoch;
  r.pending = 0;
  if (!r.is_leaf) r.grad_defined = false;  // seed, do not add to the seed a previous backward left here
  stack.emplace_back(&r, 0);
  while (!stack.empty()) {
    auto& [n, i] = stack.back();
    if (i < n->n_parents) {
      N* p = n->parents[i++].get();
      if (p->visit_epoch != epoch) {
        p->visit_epoch = epoch;
        p->pending = 0;
        if (p->is_leaf) {
          order.push_back(p);
        } else {
          // Checked before any gradient is touched: running a freed closure is undefined behaviour.
          if (p->released())
            throw ArgumentError(detail::cat("backward() reaches op '", p->op,
                                            "', whose graph an earlier backward freed; "
                                            "pass BackwardOptions{.retain_graph = true} to that backward"));
          p->grad_defined = false;  // interior gradients are this sweep's scratch (an old root kept its seed)
          stack.emplace_back(p, 0);
        }
      }
      ++p->pending;
    } else {
      order.push_back(n);
      stack.pop_back();
    }
  }

  // Seed.
  {
    T const beta = detail::grad_beta(r);
    if (grad_output.defined())
      K::axpby(r.value.numel(), T(1), grad_output.data(), beta, r.grad.data());
    else
      K::add_scalar(std::int64_t{1}, T(1), beta, r.grad.data());  // 1, or grad + 1 when accumulating
  }
  if (r.is_leaf) {
    detail::run_grad_hooks(r);
    return;
  }

  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    N* n = *it;
    if (n->is_leaf) continue;
    if (n->grad_defined) n->backward();
    for (int i = 0; i < n->n_parents; ++i) {
      N* p = n->parents[i].get();
      if (p->is_leaf && --p->pending == 0) detail::run_grad_hooks(*p);
    }
    // Interior gradients are not kept (as in PyTorch); the root keeps its seed.
    if (n != &r) {
      n->grad = Tensor<T, S>{};
      n->grad_defined = false;
    }
  }
  // Free the graph in topological order: a node's parents come before it, so dropping its closure and
  // parent links can only destroy nodes already visited here.
  if (!opts.retain_graph)
    for (N* n : order) {
      if (n->is_leaf) continue;
      n->release();
      for (auto& p : n->parents) p.reset();
      n->n_parents = 0;
    }
}

}  // namespace detail

// Gradient of `root` with respect to every leaf that requires grad, accumulated (+=) into leaf grads.
// `grad_output` seeds the sweep (default: 1 for a one-element root). Complexity O(nodes + edges).
// Afterwards, runs the callbacks queued with queue_post_backward (e.g. DDP's bucket synchronisation).
template <class T, MemorySpace S>
void backward(Variable<T, S> const& root, Tensor<T, S> const& grad_output = {}, BackwardOptions opts = {}) {
  try {
    detail::backward_sweep(root, grad_output, opts);
  } catch (...) {
    detail::post_backward_queue().clear();
    throw;
  }
  detail::run_post_backward();
}

}  // namespace ddp
