// launch_env(): every launcher's variables, partial and inconsistent settings, Slurm's task-count syntax.
#include <doctest/doctest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "ddp/comm/env.hpp"

namespace {

ddp::EnvLookup fake(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](std::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::string error_of(std::map<std::string, std::string> vars) {
  try {
    ddp::launch_env(fake(std::move(vars)));
  } catch (ddp::ArgumentError const& e) {
    return e.what();
  }
  return "(no error)";
}

bool env_contains(std::string const& s, std::string const& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("nothing set: a single process") {
  auto const e = ddp::launch_env(fake({}));
  CHECK(e.rank == 0);
  CHECK(e.world_size == 1);
  CHECK(e.local_rank == 0);
  CHECK(e.local_size == 1);
  CHECK(e.source == "default");
}

TEST_CASE("torchrun-style variables") {
  auto const e =
      ddp::launch_env(fake({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"}}));
  CHECK(e.rank == 5);
  CHECK(e.world_size == 8);
  CHECK(e.local_rank == 1);
  CHECK(e.local_size == 4);
  CHECK(e.source == "torchrun");
}

TEST_CASE("MPICH/Hydra and Open MPI variables") {
  auto const m =
      ddp::launch_env(fake({{"PMI_RANK", "3"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "2"}}));
  CHECK(m.rank == 3);
  CHECK(m.local_rank == 1);
  CHECK(m.local_size == 2);
  CHECK(m.source == "mpich");
  auto const o = ddp::launch_env(fake({{"OMPI_COMM_WORLD_RANK", "2"},
                                       {"OMPI_COMM_WORLD_SIZE", "3"},
                                       {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}}));
  CHECK(o.rank == 2);
  CHECK(o.world_size == 3);
  CHECK(o.source == "openmpi");
}

TEST_CASE("Slurm variables, including the compressed SLURM_TASKS_PER_NODE form") {
  auto const a = ddp::launch_env(
      fake({{"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "2"}, {"SLURM_NTASKS_PER_NODE", "4"}}));
  CHECK(a.rank == 6);
  CHECK(a.local_rank == 2);
  CHECK(a.local_size == 4);
  CHECK(a.source == "slurm");
  auto const b = ddp::launch_env(fake({{"SLURM_PROCID", "6"},
                                       {"SLURM_NTASKS", "7"},
                                       {"SLURM_LOCALID", "0"},
                                       {"SLURM_NODEID", "3"},
                                       {"SLURM_TASKS_PER_NODE", "2(x3),1"}}));
  CHECK(b.local_size == 1);
  CHECK(ddp::detail::slurm_tasks_on_node("2(x3),1", 2) == 2);
  CHECK(ddp::detail::slurm_tasks_on_node("4", 0) == 4);
}

TEST_CASE("torchrun variables take precedence over Slurm's job-step view") {
  auto const e = ddp::launch_env(fake({{"RANK", "3"},
                                       {"WORLD_SIZE", "4"},
                                       {"LOCAL_RANK", "1"},
                                       {"LOCAL_WORLD_SIZE", "2"},
                                       {"SLURM_PROCID", "1"},
                                       {"SLURM_NTASKS", "2"},
                                       {"SLURM_LOCALID", "0"}}));
  CHECK(e.rank == 3);
  CHECK(e.source == "torchrun");
}

TEST_CASE("partial settings name what is missing") {
  auto const a = error_of({{"RANK", "1"}});
  CHECK(env_contains(a, "WORLD_SIZE not set but RANK=1 is"));
  auto const b = error_of({{"LOCAL_RANK", "0"}});
  CHECK(env_contains(b, "RANK and WORLD_SIZE not set"));
  auto const c = error_of({{"RANK", "1"}, {"WORLD_SIZE", "2"}});
  CHECK(env_contains(c, "LOCAL_RANK and LOCAL_WORLD_SIZE"));
  auto const d = error_of({{"SLURM_PROCID", "0"}});
  CHECK(env_contains(d, "SLURM_NTASKS not set"));
}

TEST_CASE("inconsistent settings are errors") {
  CHECK(env_contains(error_of({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "1"}}),
                     "rank 4 is not below world size 4"));
  CHECK(env_contains(error_of({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}}),
                     "local rank 2 is not below local size 2"));
  CHECK(env_contains(error_of({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "8"}}),
                     "local size 8 must be in [1, world size 4]"));
  CHECK(
      env_contains(error_of({{"RANK", "1"},
                             {"WORLD_SIZE", "2"},
                             {"LOCAL_RANK", "1"},
                             {"LOCAL_WORLD_SIZE", "2"},
                             {"PMI_RANK", "0"},
                             {"PMI_SIZE", "2"}}),
                   "inconsistent: RANK=1 WORLD_SIZE=2 (torchrun-style) but the MPI launcher (mpich) says rank 0 of 2"));
  CHECK(env_contains(error_of({{"RANK", "x1"}, {"WORLD_SIZE", "2"}}), "RANK=\"x1\" is not a non-negative integer"));
}

TEST_CASE("a partial Slurm environment (sbatch without --ntasks) does not hide complete MPICH variables") {
  auto const e = ddp::launch_env(fake({{"SLURM_PROCID", "0"},
                                       {"SLURM_JOB_ID", "77"},
                                       {"PMI_RANK", "1"},
                                       {"PMI_SIZE", "2"},
                                       {"MPI_LOCALRANKID", "1"},
                                       {"MPI_LOCALNRANKS", "2"}}));
  CHECK(e.source == "mpich");
  CHECK(e.rank == 1);
  CHECK(e.world_size == 2);
  CHECK(e.local_rank == 1);
  CHECK(e.local_size == 2);
}

TEST_CASE("only the chosen launcher's variables are validated") {
  std::map<std::string, std::string> const mpich = {
      {"PMI_RANK", "0"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "0"}, {"MPI_LOCALNRANKS", "2"}};
  // Slurm describes the job step (and here badly): MPICH wins and Slurm is not parsed.
  auto with = [&](std::map<std::string, std::string> extra) {
    extra.insert(mpich.begin(), mpich.end());
    return ddp::launch_env(fake(std::move(extra)));
  };
  CHECK(with({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_LOCALID", "x"}}).source == "mpich");
  CHECK(with({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_TASKS_PER_NODE", "2(x"}}).source == "mpich");
  CHECK(with({{"SLURM_NTASKS", "1"}}).rank == 0);
  // A lone stale torchrun variable does not hide the MPI launcher either.
  CHECK(with({{"LOCAL_RANK", "3"}}).source == "mpich");
  CHECK(with({{"OMPI_COMM_WORLD_RANK", "0"}}).world_size == 4);
}

TEST_CASE("the chosen launcher's errors name its variables") {
  CHECK(env_contains(error_of({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "1"}}),
                     "(RANK=4, WORLD_SIZE=4)"));
  CHECK(env_contains(
      error_of({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}, {"MPI_LOCALRANKID", "2"}, {"MPI_LOCALNRANKS", "2"}}),
      "launch environment (mpich): local rank 2 is not below local size 2 (MPI_LOCALRANKID=2, MPI_LOCALNRANKS=2)"));
  CHECK(env_contains(error_of({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}}), "set MPI_LOCALRANKID and MPI_LOCALNRANKS"));
  CHECK(env_contains(error_of({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "0"}}),
                     "world size is 0, must be >= 1 (OMPI_COMM_WORLD_SIZE=0)"));
  CHECK(env_contains(
      error_of({{"SLURM_PROCID", "3"},
                {"SLURM_NTASKS", "4"},
                {"SLURM_LOCALID", "1"},
                {"SLURM_NODEID", "1"},
                {"SLURM_TASKS_PER_NODE", "3,1"}}),
      "local rank 1 is not below local size 1 (SLURM_LOCALID=1, SLURM_TASKS_PER_NODE=3,1 at SLURM_NODEID=1)"));
  CHECK(env_contains(error_of({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}}),
                     "set SLURM_LOCALID and SLURM_NTASKS_PER_NODE"));
  // With nothing complete, a partial launcher is still an error naming what is missing.
  CHECK(env_contains(error_of({{"SLURM_PROCID", "0"}, {"PMI_RANK", "0"}}),
                     "(mpich) is partial: PMI_SIZE not set but PMI_RANK=0 is"));
}

TEST_CASE("launch_env() reads the real process environment (setenv)") {
  setenv("RANK", "1", 1);
  setenv("WORLD_SIZE", "2", 1);
  setenv("LOCAL_RANK", "1", 1);
  setenv("LOCAL_WORLD_SIZE", "2", 1);
  auto const e = ddp::launch_env();
  CHECK(e.rank == 1);
  CHECK(e.local_size == 2);
  unsetenv("WORLD_SIZE");
  CHECK_THROWS_AS(ddp::launch_env(), ddp::ArgumentError);
  unsetenv("RANK");
  unsetenv("LOCAL_RANK");
  unsetenv("LOCAL_WORLD_SIZE");
}
