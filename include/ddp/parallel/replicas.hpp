// Keeping a model's replicas alike across ranks: the signatures DDP compares at construction, and rank `root`'s
// parameters and buffers copied to every rank (one broadcast per tensor).
#pragma once

#include <cstdint>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/nn/parameter_arena.hpp"
#include "ddp/parallel/verify.hpp"

namespace ddp::detail {

// Every distinct parameter's name, shape and whether it is frozen, in registration order.
template <nn::Model M>
std::vector<ParamSignature> signatures(M const& model) {
  using T = typename M::value_type;
  using S = typename M::space;
  std::vector<ParamSignature> sigs;
  for (auto const& p : nn::ParameterArena<T, S>::unique_all(model.named_parameters()))
    sigs.push_back({p.name, p.var.shape(), !p.var.requires_grad()});
  return sigs;
}

template <Communicator C, nn::Model M>
void broadcast_buffers(C& comm, M& model, int root) {
  using T = typename M::value_type;
  using S = typename M::space;
  std::int64_t i = 0;
  for (auto& b : model.named_buffers())
    comm.broadcast(SpaceSpan<T, S>(b.tensor.data(), static_cast<std::size_t>(b.tensor.numel())), root,
                   CollectiveTag{"ddp.buffer", i++});
}

// Where the gradients live: the communicator's gradient_storage where it has one (MpiBackend on one node
// all-reduces there in place), else ordinary memory.
template <class T, MemorySpace S, Communicator C>
typename nn::ParameterArena<T, S>::GradStorage gradient_storage(C& comm) {
  if constexpr (requires(C & c, std::int64_t n) {
                  { c.template gradient_storage<T>(n) } -> std::same_as<Tensor<T, S>>;
                })
    return [&comm](std::int64_t n) { return comm.template gradient_storage<T>(n); };
  else
    return {};
}

// `root`'s parameters (frozen ones too) and buffers on every rank.
template <Communicator C, nn::Model M>
void broadcast_state(C& comm, M& model, int root) {
  using T = typename M::value_type;
  using S = typename M::space;
  std::int64_t i = 0;
  for (auto const& p : nn::ParameterArena<T, S>::unique_all(model.named_parameters())) {
    Tensor<T, S> const& v = p.var.node().value;
    comm.broadcast(SpaceSpan<T, S>(v.data(), static_cast<std::size_t>(v.numel())), root,
                   CollectiveTag{"ddp.param", i++});
  }
  broadcast_buffers(comm, model, root);
}

}  // namespace ddp::detail
