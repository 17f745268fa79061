// The main job's spelling of training with less communication (parallel/local_sgd.hpp): --local-sgd H with
// --local-sgd-warmup W and --average-optimizer-state (LocalSgd: post-local SGD), or --diloco H with --outer-lr,
// --outer-momentum and --comm-hook bf16|fp16 for its pseudo-gradient (DiLoCo), --replicas R with --deterministic
// (virtual replicas: the same weights at every world size dividing R); their checks against the other flags, and the
// line that compares the bytes sent with DDP's.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include <ddp/ddp.hpp>

#include "examples/common/flags.hpp"
#include "examples/common/launch.hpp"
#include "examples/common/reduction.hpp"

namespace ddp::examples {

struct LocalChoice {
  std::int64_t local_sgd = 0;                    // --local-sgd H: LocalSgd's period (0: off)
  std::int64_t warmup = 0;                       // --local-sgd-warmup W: synchronous steps first
  bool average_state = false;                    // --average-optimizer-state
  std::int64_t diloco = 0;                       // --diloco H: DiLoCo's period (0: off)
  double outer_lr = 0.7;                         // --outer-lr
  double outer_momentum = 0.9;                   // --outer-momentum
  PseudoGradient wire = PseudoGradient::kFloat;  // --comm-hook bf16|fp16 with --diloco
  std::int64_t replicas = 0;                     // --replicas R: virtual replicas (with --deterministic)
  std::int64_t node_period = 0;                  // --node-average K: hierarchical local SGD
  bool on() const noexcept { return local_sgd > 0 || diloco > 0; }
};

inline Flags& add_local_flags(Flags& f) {
  return f
      .add("local-sgd", "0",
           "local SGD: each rank steps its own replica and the parameters are averaged every H steps (0: off; "
           "LocalSgd)")
      .add("local-sgd-warmup", "0", "with --local-sgd: ordinary DDP steps first (post-local SGD)")
      .add("average-optimizer-state", "false", "with --local-sgd: also average the optimizer's buffers")
      .add("node-average", "0",
           "with --local-sgd H: also average within each node every K steps, K < H (hierarchical; a node: MPI's "
           "ranks that share memory, or the threads backend's process)")
      .add("diloco", "0",
           "DiLoCo: H local steps of the optimizer, then an outer Nesterov step on the averaged parameter change "
           "(0: off)")
      .add("outer-lr", "0.7", "with --diloco: the outer SGD's learning rate")
      .add("outer-momentum", "0.9", "with --diloco: the outer SGD's Nesterov momentum, in [0, 1)")
      .add("replicas", "0",
           "with --local-sgd or --diloco and --deterministic: R virtual replicas, R / world size on each rank, "
           "averaged exactly (the same weights at every world size dividing R)");
}

// Reads the flags; ArgumentError for a combination that cannot work (the composition rules refuse the same at run
// time: this names the flags).
inline LocalChoice local_choice(Flags const& f, ReductionChoice const& r, Backend backend) {
  LocalChoice c{.local_sgd = f.at_least("local-sgd", 0),
                .warmup = f.at_least("local-sgd-warmup", 0),
                .average_state = f.boolean("average-optimizer-state"),
                .diloco = f.at_least("diloco", 0),
                .outer_lr = f.real("outer-lr"),
                .outer_momentum = f.real("outer-momentum"),
                .replicas = f.at_least("replicas", 0),
                .node_period = f.at_least("node-average", 0)};
  std::string const p = f.program();
  if (c.local_sgd > 0 && c.diloco > 0) throw ArgumentError(p + ": --local-sgd and --diloco: choose one");
  if (c.local_sgd == 0 && (f.is_set("local-sgd-warmup") || f.is_set("average-optimizer-state")))
    throw ArgumentError(p + ": --local-sgd-warmup and --average-optimizer-state are for --local-sgd H");
  if (c.node_period > 0 && (c.local_sgd == 0 || c.node_period >= c.local_sgd))
    throw ArgumentError(detail::cat(p, ": --node-average K is for --local-sgd H with K < H (got K = ", c.node_period,
                                    c.local_sgd > 0 ? detail::cat(", H = ", c.local_sgd) : std::string(), ")"));
  if (c.node_period > 0 && backend == Backend::kGloo)
    throw ArgumentError(p +
                        ": --node-average averages within each node, and the Gloo backend has no node groups: "
                        "use --backend threads or mpi");
  if (c.diloco == 0 && (f.is_set("outer-lr") || f.is_set("outer-momentum")))
    throw ArgumentError(p + ": --outer-lr and --outer-momentum are for --diloco H");
  if (!(c.outer_lr > 0)) throw ArgumentError(detail::cat(p, ": --outer-lr must be positive, got ", f.str("outer-lr")));
  if (!(c.outer_momentum >= 0 && c.outer_momentum < 1))
    throw ArgumentError(detail::cat(p, ": --outer-momentum must be in [0, 1), got ", f.str("outer-momentum")));
  if (c.replicas > 0 && !(c.on() && r.deterministic))
    throw ArgumentError(p + ": --replicas is for --local-sgd or --diloco with --deterministic");
  if (!c.on()) return c;
  std::string const what = c.local_sgd > 0 ? "--local-sgd" : "--diloco";
  if (r.deterministic && c.replicas == 0)
    throw ArgumentError(p + ": " + what +
                        " with --deterministic: local steps depend on each rank's share, so an exact run trains a "
                        "fixed number of virtual replicas: add --replicas R (a multiple of the world size)");
  if (c.replicas > 0 && r.micro_batches % c.replicas != 0)
    throw ArgumentError(detail::cat(p, ": --replicas ", c.replicas, " needs --micro-batches (", r.micro_batches,
                                    ") to be a multiple of it: each replica takes whole micro-batches"));
  bool const half_hook = r.comm_hook == "bf16" || r.comm_hook == "fp16";
  if (r.zero != 0 || r.update != UpdateAt::kStep || (r.comm_hook != "none" && !(c.diloco > 0 && half_hook)))
    throw ArgumentError(p + ": " + what +
                        " steps each rank's own replica with a plain optimizer and averages float parameters: drop "
                        "--zero, --overlap-update and --comm-hook (--diloco takes --comm-hook bf16 or fp16: its "
                        "pseudo-gradient travels as 16-bit floats)");
  if (c.diloco > 0 && half_hook) c.wire = r.comm_hook == "bf16" ? PseudoGradient::kBf16 : PseudoGradient::kFp16;
  return c;
}

// Rank 0's line on what the local phase sent a step against what DDP's rounds send (`ddp_bytes` a step), and the
// average over every step, synchronous ones (DDP's) included.
template <class Opt>
void print_local_bytes(Opt const& opt, std::int64_t ddp_bytes) {
  std::int64_t const steps = opt.steps(), sync_steps = opt.sync_steps(), local = steps - sync_steps;
  if (local == 0 || ddp_bytes == 0) return;
  double const per_local = double(opt.bytes_sent()) / double(local);
  double const overall = double(opt.bytes_sent() + sync_steps * ddp_bytes) / double(steps);
  std::printf(
      "communication: %.0f bytes a local step (%lld %s in %lld local steps), 1/%.1f of DDP's %lld; over all %lld "
      "steps (%lld synchronous) %.0f, 1/%.1f\n",
      per_local, static_cast<long long>(opt.syncs()), Opt::kSyncName, static_cast<long long>(local),
      per_local > 0 ? double(ddp_bytes) / per_local : 0.0, static_cast<long long>(ddp_bytes),
      static_cast<long long>(steps), static_cast<long long>(sync_steps), overall,
      overall > 0 ? double(ddp_bytes) / overall : 0.0);
  if constexpr (requires { opt.node_syncs(); })
    if (opt.node_syncs() > 0)
      std::printf("within nodes: %lld averages, %.0f bytes a local step (over each node's own links)\n",
                  static_cast<long long>(opt.node_syncs()), double(opt.node_bytes_sent()) / double(local));
}

}  // namespace ddp::examples
