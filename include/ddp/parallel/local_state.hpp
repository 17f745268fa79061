// LocalRoundsState: what a checkpoint keeps of LocalSgd or DiLoCo (local_sgd.hpp) besides the model and the first
// replica's optimizer state: every replica's parameters and inner optimizer state, the step and sync counts (so the
// step within the period), and DiLoCo's kept copy of the synced parameters and its outer momentum. Replicas are
// numbered globally: rank r of w holds replicas [r R / w, (r + 1) R / w). Written by save_checkpoint in the LOCL
// section (train/checkpoint_format.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ddp/optim/optimizer.hpp"

namespace ddp {

template <class T>
struct LocalRoundsState {
  std::string kind{};                  // the policy's name: "LocalSgd" or "DiLoCo"
  std::int64_t replicas = 0;           // the virtual replicas declared; 0: one replica per rank (the file's world size)
  std::int64_t steps = 0;              // steps taken (synchronous and local)
  std::int64_t syncs = 0;              // averages (LocalSgd) or outer steps (DiLoCo) taken
  std::int64_t bytes = 0;              // the bytes rank 0 sent in them
  std::vector<std::string> names{};    // the parameters, in the order of each replica's values
  std::vector<std::int64_t> numels{};  // their sizes
  std::vector<std::vector<std::vector<T>>> values{};  // [replica][parameter]: each replica's parameters
  std::vector<optim::OptimizerState<T>> states{};     // [replica]: its inner optimizer's state
  std::vector<std::vector<T>> kept{};                 // DiLoCo: [parameter] the synced copy; empty otherwise
  std::vector<std::vector<T>> momentum{};             // DiLoCo: [parameter] the outer momentum; empty if none yet
  friend bool operator==(LocalRoundsState const&, LocalRoundsState const&) = default;
};

}  // namespace ddp
