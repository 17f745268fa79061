// Crash safety of checkpoint writes: a child process writes checkpoints in a loop (write_checkpoint_file: temp
// file, write, fsync, rename, fsync of the directory) and is SIGKILLed after a delay that sweeps over a few write
// cycles, 80 times. After every kill the checkpoint path holds a complete checkpoint, the last one the child
// finished or the one it was renaming into place, bit for bit, and every leftover temporary file is either a
// complete checkpoint or an IoError when read: never a torn file under the checkpoint's name.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <ddp/train/checkpoint.hpp>

using namespace ddp;
namespace fs = std::filesystem;

namespace {

constexpr std::int64_t kValues = 1 << 18;  // 1 MiB of parameters: a write takes long enough to be interrupted

// Checkpoint number k: its values and position are a function of k, so a torn or mixed file cannot pass.
CheckpointData<float> checkpoint_number(std::int64_t k) {
  CheckpointData<float> c;
  c.position = {.epoch = k / 10, .step = k % 10, .global_step = k, .world_size = 1, .global_batch = 4};
  std::vector<float> w(static_cast<std::size_t>(kValues));
  for (std::int64_t i = 0; i < kValues; ++i) w[static_cast<std::size_t>(i)] = static_cast<float>(k) + 1e-3f * i;
  c.parameters = {{"w", {kValues}, std::move(w)}, {"b", {2}, {static_cast<float>(-k), 1.0f}}};
  c.optimizer = {"sgd", 0.1, {}, {{"w", {kValues}, k, {}}, {"b", {2}, k, {}}}};
  c.extra = "checkpoint " + std::to_string(k);
  return c;
}

bool is_checkpoint_number(CheckpointData<float> const& c, std::int64_t k) {
  auto const want = checkpoint_number(k);
  return c.position == want.position && c.parameters == want.parameters && c.optimizer == want.optimizer &&
         c.extra == want.extra;
}

// Writes checkpoints first, first + 1, ... to `path` until killed; after each completed write, sends its number.
[[noreturn]] void writer_child(fs::path const& path, std::int64_t first, int notify_fd) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
  ::alarm(30);
  for (std::int64_t k = first;; ++k) {
    try {
      write_checkpoint_file(path, checkpoint_number(k));
    } catch (...) {
      ::_exit(3);
    }
    if (::write(notify_fd, &k, sizeof k) != sizeof k) ::_exit(4);
  }
}

}  // namespace

TEST_CASE("SIGKILL at any point of a checkpoint write leaves the previous checkpoint intact and loadable") {
  char const* t = std::getenv("TEST_TMPDIR");
  fs::path const dir = fs::path(t ? t : "/tmp") / "checkpoint_crash_test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::path const path = dir / "ckpt.bin";

  // One write cycle's duration on this machine and file system; the kill delays sweep over three of them.
  auto const t0 = std::chrono::steady_clock::now();
  for (std::int64_t k = 0; k < 3; ++k) write_checkpoint_file(path, checkpoint_number(k));
  auto const cycle = (std::chrono::steady_clock::now() - t0) / 3;
  std::int64_t on_disk = 2;
  MESSAGE("one checkpoint write (", fs::file_size(path),
          " bytes): ", std::chrono::duration_cast<std::chrono::microseconds>(cycle).count(), " us");

  constexpr int kTrials = 80;
  int advanced = 0, left_temp = 0, temp_complete = 0, temp_refused = 0;
  for (int trial = 0; trial < kTrials; ++trial) {
    CAPTURE(trial);
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    pid_t const pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(fds[0]);
      writer_child(path, on_disk + 1, fds[1]);
    }
    ::close(fds[1]);
    std::this_thread::sleep_for(cycle * 3 * trial / kTrials);
    REQUIRE(::kill(pid, SIGKILL) == 0);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFSIGNALED(status));  // killed, not exited with an error
    std::int64_t done = on_disk, k = 0;
    while (::read(fds[0], &k, sizeof k) == sizeof k) done = k;
    ::close(fds[0]);

    // The checkpoint is the last one completed, or the next if the kill came between its rename and the notice.
    auto const c = read_checkpoint_file<float>(path);
    std::int64_t const found = c.position.global_step;
    CHECK((found == done || found == done + 1));
    CHECK(is_checkpoint_number(c, found));
    advanced += found > on_disk;
    on_disk = found;

    // Leftovers of an interrupted write: only temporary files, never under the checkpoint's name; read as a
    // checkpoint, each is complete (killed after its fsync) or refused with an IoError (truncated).
    bool temp_here = false;
    for (auto const& e : fs::directory_iterator(dir)) {
      auto const name = e.path().filename().string();
      if (name == "ckpt.bin") continue;
      CHECK(name.starts_with(".ckpt.bin.tmp."));
      temp_here = true;
      try {
        auto const tc = read_checkpoint_file<float>(e.path());
        CHECK(is_checkpoint_number(tc, tc.position.global_step));
        ++temp_complete;
      } catch (IoError const&) {
        ++temp_refused;
      }
    }
    left_temp += temp_here;
  }
  // The killed writers' temporary files are left for the next write, which removes them (their pids are gone).
  write_checkpoint_file(path, checkpoint_number(on_disk + 1));
  for (auto const& e : fs::directory_iterator(dir)) CHECK(e.path().filename() == "ckpt.bin");
  MESSAGE(kTrials, " kills: the checkpoint advanced in ", advanced, ", a write was cut short in ", left_temp,
          " (temporary files: ", temp_complete, " complete, ", temp_refused, " refused as truncated)");
  CHECK(advanced > 0);   // some kills came after whole writes
  CHECK(left_temp > 0);  // and some in the middle of one
}

TEST_CASE("a write removes the temporary files of this host's dead writers, and only those") {
  char const* t = std::getenv("TEST_TMPDIR");
  fs::path const dir = fs::path(t ? t : "/tmp") / "checkpoint_stale_temporaries_test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::path const path = dir / "ckpt.bin";
  std::string const prefix = ddp::detail::temporary_prefix(path);
  pid_t const dead = ::fork();  // a pid that no longer exists once reaped
  REQUIRE(dead >= 0);
  if (dead == 0) ::_exit(0);
  REQUIRE(::waitpid(dead, nullptr, 0) == dead);
  auto touch = [&](std::string const& name) { std::ofstream(dir / name) << "partial"; };
  std::string const stale = prefix + std::to_string(dead) + ".AbC123";
  std::string const live = prefix + std::to_string(::getpid()) + ".XyZ789";  // a writer still running
  std::string const elsewhere = ".ckpt.bin.tmp.another-host." + std::to_string(dead) + ".Qq1234";
  std::string const other_file = prefix.substr(0, prefix.size() - 1) + "x." + std::to_string(dead) + ".a";
  for (auto const& n : {stale, live, elsewhere, other_file}) touch(n);
  write_checkpoint_file(path, checkpoint_number(1));
  CHECK_FALSE(fs::exists(dir / stale));
  CHECK(fs::exists(dir / live));
  CHECK(fs::exists(dir / elsewhere));
  CHECK(fs::exists(dir / other_file));
  CHECK(is_checkpoint_number(read_checkpoint_file<float>(path), 1));
  fs::remove_all(dir);
}
