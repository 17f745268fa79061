// The jobs' checkpoint flags, one spelling for both: --checkpoint FILE (a CheckpointSeries: FILE is the newest, the
// --keep-checkpoints - 1 before it are FILE.1, FILE.2, ...), --checkpoint-every K, --keep-checkpoints N, and
// --resume FILE | auto. "auto" is what a restarted job passes (torchrun --max_restarts, a Slurm requeue, an mpirun
// relaunch): continue from the newest usable checkpoint of --checkpoint at the world size the job now has, or start
// fresh when there is none. A file named "auto" is ./auto.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include <ddp/ddp.hpp>
#include <ddp/train/checkpoint_series.hpp>

#include "examples/common/flags.hpp"
#include "examples/common/report.hpp"

namespace ddp::examples {

enum class ResumeFrom {
  kNothing,  // no --resume: start fresh
  kFile,     // --resume FILE
  kNewest,   // --resume auto: the newest usable checkpoint of --checkpoint, or fresh
};

struct CheckpointFlags {
  std::filesystem::path file;  // --checkpoint ("" none)
  std::int64_t every = 0;      // --checkpoint-every (0: at epoch ends / the end only)
  int keep = 3;                // --keep-checkpoints
  ResumeFrom from = ResumeFrom::kNothing;
  std::filesystem::path resume;  // with kFile

  bool writes() const noexcept { return !file.empty(); }
  CheckpointSeries series() const { return CheckpointSeries(file, {.keep = keep}); }
};

// --keep-checkpoints and --resume; the jobs add --checkpoint and --checkpoint-every with their own wording.
inline Flags& add_resume_flags(Flags& f) {
  return f
      .add("keep-checkpoints", "3",
           "checkpoints kept: --checkpoint FILE is the newest, the ones before it FILE.1, FILE.2, ... (1: FILE only)")
      .add("resume", "",
           "resume from this checkpoint (the world size may differ from the run that wrote it), or 'auto': from the "
           "newest usable checkpoint of --checkpoint, starting fresh when there is none (for a restarted job: "
           "torchrun --max_restarts, a Slurm requeue, an mpirun relaunch)");
}

// Reads --checkpoint, --checkpoint-every, --keep-checkpoints and --resume. ArgumentError (a flag error) for --resume
// auto without --checkpoint, a --resume FILE that does not exist, or --keep-checkpoints below 1.
inline CheckpointFlags checkpoint_flags(Flags const& f) {
  CheckpointFlags c;
  c.file = user_path(f.str("checkpoint"));
  c.every = f.at_least("checkpoint-every", 0);
  std::int64_t const keep = f.at_least("keep-checkpoints", 1);
  if (keep > 1000) throw ArgumentError(detail::cat(f.program(), ": --keep-checkpoints ", keep, " is more than 1000"));
  c.keep = static_cast<int>(keep);
  std::string const resume = f.str("resume");
  if (resume == "auto") {
    if (c.file.empty())
      throw ArgumentError(detail::cat(f.program(),
                                      ": --resume auto resumes from the newest checkpoint of --checkpoint FILE, and "
                                      "there is no --checkpoint; add one (a file the restarted job can read)"));
    c.from = ResumeFrom::kNewest;
  } else if (!resume.empty()) {
    c.from = ResumeFrom::kFile;
    c.resume = user_path(resume);
    if (!std::filesystem::exists(c.resume))
      throw ArgumentError(detail::cat(f.program(), ": --resume ", c.resume.string(), " does not exist"));
  }
  if (!c.file.empty() && c.file.filename().empty())
    throw ArgumentError(
        detail::cat(f.program(), ": --checkpoint ", c.file.string(), " names a directory; give a file"));
  return c;
}

// The stored position a job resumes from and the file it came from.
struct Resumed {
  TrainPosition position;
  std::filesystem::path file;
};

// Collective: resumes `t` as the flags say (trainer's load_checkpoint, or resume_newest), `extra` and `epoch_loss`
// filled as they fill them. Nothing when the job starts fresh. On rank 0 it prints what a newer torn checkpoint was
// skipped for, and, with --resume auto and no checkpoint yet, that the job starts fresh.
template <class Trainer>
std::optional<Resumed> resume_job(Trainer& t, CheckpointFlags const& c, std::string* extra, EpochLoss* epoch_loss) {
  bool const leader = t.comm().rank() == 0;
  switch (c.from) {
    case ResumeFrom::kNothing:
      return std::nullopt;
    case ResumeFrom::kFile:
      return Resumed{t.load_checkpoint(c.resume, extra, epoch_loss), c.resume};
    case ResumeFrom::kNewest:
      break;
  }
  auto r = t.resume_newest(c.series(), extra, epoch_loss);
  if (leader) {
    if (r)
      for (auto const& s : r->skipped) std::printf("skipped an unusable checkpoint: %s\n", s.c_str());
    else
      std::printf("--resume auto: no checkpoint at %s yet; starting fresh\n", c.file.string().c_str());
    std::fflush(stdout);
  }
  if (!r) return std::nullopt;
  return Resumed{r->position, r->file};
}

// After a membership change under ZeRO stage 1 or 2, collective: every rank takes the whole state back from the
// newest checkpoint of the --checkpoint series (a lost rank's optimizer shard went with it, or the shards are cut
// anew for the new world size), and the steps since are redone. The session hears where the ranks resumed (which
// closes the change: its line comes first); then rank 0 says which of the two, and from which file and step.
template <class Trainer, class Session>
std::optional<Resumed> resume_after_change(Trainer& t, Session& session, CheckpointFlags const& c, int zero_stage,
                                           std::string* extra, EpochLoss* epoch_loss) {
  bool const lost = session.pending_change() && !session.pending_change()->lost.empty();
  CheckpointFlags newest = c;
  newest.from = ResumeFrom::kNewest;
  auto resumed = resume_job(t, newest, extra, epoch_loss);
  session.note_resumed(t.comm().rank(), resumed ? resumed->position.global_step : -1);
  if (t.comm().rank() == 0) {
    std::printf("ddp elastic: ZeRO-%d: %s; the state came back from checkpoint %s%s\n", zero_stage,
                lost ? "the lost rank's optimizer shard went with it"
                     : detail::cat("the shards are cut anew for ", t.comm().world_size(), " ranks").c_str(),
                resumed ? resumed->file.string().c_str() : c.file.string().c_str(),
                resumed
                    ? detail::cat(" (step ", resumed->position.global_step, "), and the steps since are redone").c_str()
                    : " (none written yet: the job starts over)");
    std::fflush(stdout);
  }
  return resumed;
}

}  // namespace ddp::examples
