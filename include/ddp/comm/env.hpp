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
  int local_rank = 0;   // index among the ranks on this node: picks the GPU
  int local_size = 1;   // ranks on this node
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

inline int parse_env_int(std::string_view var, std::string const& value) {
  int out = 0;
  auto const* first = value.data();
  auto const* last = value.data() + value.size();
  auto [p, ec] = std::from_chars(first, last, out);
  if (ec != std::errc() || p != last || out < 0) {
    throw ArgumentError(cat("launch environment: ", var, "=\"", value, "\" is not a non-negative integer"));
  }
  return out;
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
      if (item.back() != ')') throw ArgumentError(cat("launch environment: cannot parse SLURM_TASKS_PER_NODE=\"", spec, "\""));
      repeat = parse_env_int("SLURM_TASKS_PER_NODE", item.substr(paren + 2, item.size() - paren - 3));
    }
    if (node < index + repeat) return tasks;
    index += repeat;
    pos = comma + 1;
  }
  throw ArgumentError(cat("launch environment: SLURM_NODEID=", node, " is beyond SLURM_TASKS_PER_NODE=\"", spec, "\""));
}

struct VarSet {
  char const* source;
  char const* rank;
  char const* world;
  char const* local_rank;
  char const* local_size;
};

// One launcher's variables: nullopt when none is set; an error when only some of the required ones are.
inline std::optional<LaunchEnv> read_source(EnvLookup const& env, VarSet const& v) {
  auto const rank = env(v.rank);
  auto const world = env(v.world);
  auto const lrank = env(v.local_rank);
  auto const lsize = v.local_size ? env(v.local_size) : std::nullopt;
  if (!rank && !world && !lrank && !lsize) return std::nullopt;
  if (!rank || !world) {
    std::string set;
    auto note = [&](char const* var, std::optional<std::string> const& val) {
      if (val) set += cat(set.empty() ? "" : ", ", var, "=", *val);
    };
    note(v.rank, rank);
    note(v.world, world);
    note(v.local_rank, lrank);
    if (v.local_size) note(v.local_size, lsize);
    std::string const missing = !rank && !world ? cat(v.rank, " and ", v.world) : std::string(rank ? v.world : v.rank);
    throw ArgumentError(cat("launch environment (", v.source, ") is partial: ", missing, " not set but ", set,
                            " is; set both ", v.rank, " and ", v.world, " (or none of the ", v.source, " variables)"));
  }
  LaunchEnv e;
  e.source = v.source;
  e.rank = parse_env_int(v.rank, *rank);
  e.world_size = parse_env_int(v.world, *world);
  e.local_rank = lrank ? parse_env_int(v.local_rank, *lrank) : -1;
  e.local_size = lsize ? parse_env_int(v.local_size, *lsize) : -1;
  return e;
}

inline void validate(LaunchEnv const& e) {
  if (e.world_size < 1) throw ArgumentError(cat("launch environment (", e.source, "): world size is ", e.world_size, ", must be >= 1"));
  if (e.rank >= e.world_size) {
    throw ArgumentError(cat("launch environment (", e.source, "): rank ", e.rank, " is not below world size ", e.world_size));
  }
  if (e.local_size < 1 || e.local_size > e.world_size) {
    throw ArgumentError(cat("launch environment (", e.source, "): local size ", e.local_size, " must be in [1, world size ",
                            e.world_size, "]"));
  }
  if (e.local_rank >= e.local_size) {
    throw ArgumentError(cat("launch environment (", e.source, "): local rank ", e.local_rank, " is not below local size ",
                            e.local_size));
  }
}

}  // namespace detail

// Precedence: torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), then the MPI
// launcher's (MPICH/Hydra: PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS; Open MPI:
// OMPI_COMM_WORLD_*), then Slurm's (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE or
// SLURM_TASKS_PER_NODE + SLURM_NODEID). Nothing set: a single process {0, 1, 0, 1}. Errors (ArgumentError):
// a launcher's rank without its world size (or the reverse), non-numbers, rank >= world size, local rank >=
// local size, and torchrun variables that disagree with the MPI launcher's. Slurm is not cross-checked:
// under sbatch + mpirun its variables describe the job step, not each rank. A missing local rank/size
// falls back to local rank = rank and local size = world size only for a single node (world size 1);
// otherwise it is an error, because the local rank picks the GPU.
inline LaunchEnv launch_env(EnvLookup const& env = detail::getenv_lookup) {
  using detail::VarSet;
  auto torch = detail::read_source(env, VarSet{"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"});
  auto mpich = detail::read_source(env, VarSet{"mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"});
  auto ompi = detail::read_source(env, VarSet{"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                               "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"});
  auto slurm = detail::read_source(env, VarSet{"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr});
  if (slurm && slurm->local_size < 0) {
    if (auto per = env("SLURM_NTASKS_PER_NODE"); per && per->find_first_not_of("0123456789") == std::string::npos) {
      slurm->local_size = detail::parse_env_int("SLURM_NTASKS_PER_NODE", *per);
    } else if (auto tpn = env("SLURM_TASKS_PER_NODE")) {
      auto node = env("SLURM_NODEID");
      slurm->local_size = detail::slurm_tasks_on_node(*tpn, node ? detail::parse_env_int("SLURM_NODEID", *node) : 0);
    }
  }
  auto const& mpi = mpich ? mpich : ompi;
  if (torch && mpi && (torch->rank != mpi->rank || torch->world_size != mpi->world_size)) {
    throw ArgumentError(detail::cat("launch environment is inconsistent: RANK=", torch->rank, " WORLD_SIZE=", torch->world_size,
                                    " (torchrun-style) but the MPI launcher (", mpi->source, ") says rank ", mpi->rank,
                                    " of ", mpi->world_size, "; unset one of them"));
  }
  LaunchEnv e;
  if (torch) {
    e = *torch;
  } else if (mpi) {
    e = *mpi;
  } else if (slurm) {
    e = *slurm;
  }
  if (e.local_rank < 0 || e.local_size < 0) {
    if (e.world_size != 1) {
      throw ArgumentError(detail::cat("launch environment (", e.source, "): rank ", e.rank, " of ", e.world_size,
                                      " but the local rank or local size is not set; set ",
                                      e.source == "torchrun" ? "LOCAL_RANK and LOCAL_WORLD_SIZE"
                                      : e.source == "slurm"  ? "SLURM_LOCALID and SLURM_NTASKS_PER_NODE"
                                                             : "the launcher's local rank variables",
                                      " (the local rank picks the GPU)"));
    }
    e.local_rank = 0;
    e.local_size = 1;
  }
  detail::validate(e);
  return e;
}

}  // namespace ddp
