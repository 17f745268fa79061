// tune_bucket_cap_cases.hpp under mpirun (MpiBackend; on one node the gradients are reduced in place in a
// shared window): run by mpi_test with -n 2 and -n 4. Exits 0 when every check holds on every rank; a failing
// rank aborts the job with its message.
#include <algorithm>
#include <cstdio>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddp/comm/mpi.hpp"
#include "test/tune/tune_bucket_cap_cases.hpp"

namespace {
void expect(bool ok, std::string const& what) {
  if (!ok) throw std::runtime_error("tune_bucket_cap: " + what);
}
}  // namespace

int main(int argc, char** argv) {
  ddp::MpiSession session(argc, argv);
  try {
    ddp::MpiBackend comm(session);
    auto const o = ddp::test::tune_case(comm);
    auto const caps = ddp::default_candidate_caps();
    expect(std::find(caps.begin(), caps.end(), o.cap) != caps.end(), "the cap is not a candidate");
    std::vector<std::int64_t> mine{static_cast<std::int64_t>(o.cap)}, all(static_cast<std::size_t>(comm.world_size()));
    comm.all_gather(mine, all);
    for (auto c : all) expect(c == all[0], "ranks chose different caps");
    expect(o.ready == 6, "the profile has " + std::to_string(o.ready) + " parameters, not 6");
    expect(o.model_unchanged, "tuning changed the model's parameters, buffers or generators");
    expect(o.buffers_moved_in_training, "training left the model as it was (the check above means nothing)");
    expect(o.user_hook_calls_during == 9 && o.user_hook_calls_after == 3,
           "the user's gradient hook ran " + std::to_string(o.user_hook_calls_during) + " and " +
               std::to_string(o.user_hook_calls_after) + " times, not 9 and 3");
    expect(o.probe_bytes == std::vector<std::size_t>{1024, 16384}, "the probe between the steps has other sizes");
    std::vector<double> times = o.probe_seconds, slowest = times;
    ddp::host_all_reduce(comm, std::span<double>(slowest), ddp::ReduceOp::kMax);
    expect(times == slowest && std::all_of(times.begin(), times.end(), [](double t) { return t > 0; }),
           "the probe between the steps differs between ranks, or has a time <= 0");
    expect(o.model_holds_probe, "the model the cap was chosen with does not hold the probe between the steps");
    expect(o.start_up_as_calibrated, "CalibrationTiming::kStartUp changed the calibration's model");
    // kAuto against MPI's ranks on this node (mpi_test runs every rank on this machine).
    bool const shared = comm.ranks_on_node() > 1;
    expect(comm.ranks_on_node() == comm.world_size(), "ranks_on_node() is not the world size on one machine");
    expect(o.auto_one_cpu == (shared ? ddp::CalibrationTiming::kStartUp : ddp::CalibrationTiming::kBetweenSteps),
           "kAuto with one CPU per node did not resolve to kStartUp");
    expect(o.auto_many_cpus == ddp::CalibrationTiming::kBetweenSteps,
           "kAuto with plenty of CPUs did not resolve to kBetweenSteps");
    expect(o.auto_probes_as_resolved, "whether a probe ran between the steps disagrees with the resolved timing");
    expect(o.same_as_untuned, "the tuned model trained differently from one that never tuned");
    if (comm.rank() == 0)
      std::printf("tune_bucket_cap mpi tests passed on %d ranks (chose %zu KiB)\n", comm.world_size(), o.cap >> 10);
  } catch (std::exception const& e) {
    session.abort(e.what());
  }
  return 0;
}
