// ddp::launch_env(): rank, world size, local rank and local size from the launcher's environment
// (torchrun-style RANK/WORLD_SIZE, MPICH/PMI, Open MPI, Slurm), with clear errors for partial or
// inconsistent settings.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/error.hpp"

namespace ddp {

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;              // index among the ranks on this node: picks the GPU
  int local_size = 1;              // ranks on this node
  std::string source = "default";  // "torchrun", "mpich", "openmpi", "slurm" or "default" (nothing set)
};

// Reads a variable; nullopt when unset. The default reads the process environment.
using EnvLookup = std::function<std::optional<std::string>(std::string_view)>;

namespace detail {

inline std::optional<std::string> getenv_lookup(std::string_view name) {
  char const* v = std::getenv(std::string(name).c_str());
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

// A non-negative decimal integer, or nullopt.
inline std::optional<int> try_parse_env_int(std::string_view value) noexcept {
  int out = 0;
  auto const* last = value.data() + value.size();
  auto [p, ec] = std::from_chars(value.data(), last, out);
  if (ec != std::errc() || p != last || out < 0) return std::nullopt;
  return out;
}

inline int parse_env_int(std::string_view var, std::string const& value) {
  if (auto v = try_parse_env_int(value)) return *v;
  throw ArgumentError(cat("launch environment: ", var, "=\"", value, "\" is not a non-negative integer"));
}

// Slurm's compressed per-node task counts, e.g. "2(x3),1": node 0..2 run 2 tasks, node 3 runs 1.
inline int slurm_tasks_on_node(std::string const& spec, int node) {
  std::size_t pos = 0;
  int index = 0;
  while (pos <= spec.size()) {
    std::size_t const comma = std::min(spec.find(',', pos), spec.size());
    std::string const item = spec.substr(pos, comma - pos);
    std::size_t const paren = item.find("(x");
    int const tasks = parse_env_int("SLURM_TASKS_PER_NODE", item.substr(0, paren));
    int repeat = 1;
    if (paren != std::string::npos) {
      if (item.back() != ')')
        throw ArgumentError(cat("launch environment: cannot parse SLURM_TASKS_PER_NODE=\"", spec, "\""));
      repeat = parse_env_int("SLURM_TASKS_PER_NODE", item.substr(paren + 2, item.size() - paren - 3));
    }
    if (node < index + repeat) return tasks;
    index += repeat;
    pos = comma + 1;
  }
  throw ArgumentError(cat("launch environment: SLURM_NODEID=", node, " is beyond SLURM_TASKS_PER_NODE=\"", spec, "\""));
}

// One launcher's variables. local_size == nullptr: Slurm, whose local size comes from SLURM_NTASKS_PER_NODE,
// or from SLURM_TASKS_PER_NODE at SLURM_NODEID.
struct Launcher {
  char const* source;
  char const* rank;
  char const* world;
  char const* local_rank;
  char const* local_size;
};

// The launchers launch_env() knows, in precedence order (see launch_env).
inline constexpr Launcher kLaunchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr},
};

// A launcher whose rank and world-size variables are both set describes a job; one with only some of its
// variables set is partial.
inline bool complete(EnvLookup const& env, Launcher const& l) { return env(l.rank) && env(l.world); }
inline bool partial(EnvLookup const& env, Launcher const& l) {
  return !complete(env, l) && (env(l.rank) || env(l.world) || env(l.local_rank) || (l.local_size && env(l.local_size)));
}

// "WORLD_SIZE not set but RANK=1 is; set both ...".
inline ArgumentError partial_error(EnvLookup const& env, Launcher const& l) {
  auto const rank = env(l.rank);
  std::string set;
  for (char const* var : {l.rank, l.world, l.local_rank, l.local_size}) {
    if (var == nullptr) continue;
    if (auto val = env(var)) set += cat(set.empty() ? "" : ", ", var, "=", *val);
  }
  std::string const missing =
      !rank && !env(l.world) ? cat(l.rank, " and ", l.world) : std::string(rank ? l.world : l.rank);
  return ArgumentError(cat("launch environment (", l.source, ") is partial: ", missing, " not set but ", set,
                           " is; set both ", l.rank, " and ", l.world, " (or none of the ", l.source, " variables)"));
}

// An integer variable and its "NAME=value" text, for messages.
struct EnvInt {
  int value = 0;
  std::string text;
};

inline std::optional<EnvInt> read_int(EnvLookup const& env, char const* var) {
  auto const v = env(var);
  if (!v) return std::nullopt;
  return EnvInt{parse_env_int(var, *v), cat(var, "=", *v)};
}

inline std::optional<EnvInt> slurm_local_size(EnvLookup const& env) {
  if (auto per = env("SLURM_NTASKS_PER_NODE"); per && per->find_first_not_of("0123456789") == std::string::npos) {
    return read_int(env, "SLURM_NTASKS_PER_NODE");
  }
  auto const tpn = env("SLURM_TASKS_PER_NODE");
  if (!tpn) return std::nullopt;
  auto const node = read_int(env, "SLURM_NODEID");
  return EnvInt{slurm_tasks_on_node(*tpn, node ? node->value : 0),
                cat("SLURM_TASKS_PER_NODE=", *tpn, node ? cat(" at ", node->text) : std::string())};
}

// The chosen launcher's variables, parsed and checked; errors name the variables.
inline LaunchEnv read_launcher(EnvLookup const& env, Launcher const& l) {
  EnvInt const rank = *read_int(env, l.rank);
  EnvInt const world = *read_int(env, l.world);
  auto const lrank = read_int(env, l.local_rank);
  auto const lsize = l.local_size ? read_int(env, l.local_size) : slurm_local_size(env);
  std::string const where = cat("launch environment (", l.source, "): ");
  if (world.value < 1)
    throw ArgumentError(cat(where, "world size is ", world.value, ", must be >= 1 (", world.text, ")"));
  if (rank.value >= world.value) {
    throw ArgumentError(cat(where, "rank ", rank.value, " is not below world size ", world.value, " (", rank.text, ", ",
                            world.text, ")"));
  }
  LaunchEnv e{.rank = rank.value, .world_size = world.value, .local_rank = 0, .local_size = 1, .source = l.source};
  if (!lrank || !lsize) {
    // A single process needs no local rank; otherwise it picks the GPU, so it must be given.
    if (world.value == 1) return e;
    std::string const vars = l.local_size ? cat(l.local_rank, " and ", l.local_size)
                                          : cat(l.local_rank, " and SLURM_NTASKS_PER_NODE (or SLURM_TASKS_PER_NODE)");
    throw ArgumentError(cat(where, "rank ", rank.value, " of ", world.value,
                            " but the local rank or local size is not set; set ", vars,
                            " (the local rank picks the GPU)"));
  }
  e.local_rank = lrank->value;
  e.local_size = lsize->value;
  if (e.local_size < 1 || e.local_size > e.world_size) {
    throw ArgumentError(cat(where, "local size ", e.local_size, " must be in [1, world size ", e.world_size, "] (",
                            lsize->text, ", ", world.text, ")"));
  }
  if (e.local_rank >= e.local_size) {
    throw ArgumentError(cat(where, "local rank ", e.local_rank, " is not below local size ", e.local_size, " (",
                            lrank->text, ", ", lsize->text, ")"));
  }
  return e;
}

}  // namespace detail

// The launcher is chosen first, then only its variables are read and checked. Precedence, among the
// launchers whose rank and world-size variables are both set (complete):
//   1. torchrun-style  RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE
//   2. MPICH/Hydra     PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS
//   3. Open MPI        OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
//   4. Slurm           SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE or
//                      SLURM_TASKS_PER_NODE + SLURM_NODEID
// Partial sets of other launchers are ignored (e.g. `sbatch` without --ntasks sets SLURM_PROCID but not
// SLURM_NTASKS; under mpirun the MPICH variables are used). Nothing complete: if some launcher is partial,
// an error naming the missing variable (the first partial one in precedence order); nothing set at all: a
// single process {0, 1, 0, 1}. Errors (ArgumentError, naming the variables): non-numbers, world size < 1,
// rank >= world size, local size outside [1, world size], local rank >= local size, a missing local rank or
// size when the world size is above 1 (the local rank picks the GPU; a single process defaults to {0, 1}),
// and torchrun variables that disagree with a complete MPI launcher's rank and world size. Slurm is not
// cross-checked: under sbatch + mpirun its variables describe the job step, not each rank.
inline LaunchEnv launch_env(EnvLookup const& env = detail::getenv_lookup) {
  using detail::kLaunchers;
  detail::Launcher const* chosen = nullptr;
  for (auto const& l : kLaunchers) {
    if (detail::complete(env, l)) {
      chosen = &l;
      break;
    }
  }
  if (chosen == nullptr) {
    for (auto const& l : kLaunchers) {
      if (detail::partial(env, l)) throw detail::partial_error(env, l);
    }
    return LaunchEnv{};
  }
  LaunchEnv const e = detail::read_launcher(env, *chosen);
  if (chosen == &kLaunchers[0]) {  // torchrun-style: must agree with the MPI launcher that started us, if any
    for (auto const* mpi : {&kLaunchers[1], &kLaunchers[2]}) {
      if (!detail::complete(env, *mpi)) continue;
      auto const rank = detail::try_parse_env_int(*env(mpi->rank));
      auto const world = detail::try_parse_env_int(*env(mpi->world));
      if (rank && world && (*rank != e.rank || *world != e.world_size)) {
        throw ArgumentError(detail::cat("launch environment is inconsistent: RANK=", e.rank,
                                        " WORLD_SIZE=", e.world_size, " (torchrun-style) but the MPI launcher (",
                                        mpi->source, ") says rank ", *rank, " of ", *world, " (", mpi->rank, ", ",
                                        mpi->world, "); unset one of them"));
      }
      break;
    }
  }
  return e;
}

}  // namespace ddp
