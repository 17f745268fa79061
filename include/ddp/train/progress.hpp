// ProgressBar: a per-epoch progress display (step/total, loss, samples/s, ETA) redrawn in place on a
// terminal, plain periodic lines otherwise; and the one-line per-epoch summary.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <ostream>
#include <string>

#include "ddp/error.hpp"
#include "ddp/train/metrics_log.hpp"

namespace ddp {

// True when standard output is a terminal (then the bar redraws in place).
inline bool stdout_is_terminal() noexcept { return ::isatty(STDOUT_FILENO) == 1; }

struct ProgressOptions {
  std::ostream* out = &std::cout;
  bool interactive = false;           // redraw one line in place ("\r"); use stdout_is_terminal()
  double redraw_seconds = 0.1;        // interactive: redraw at most this often (and at the last step)
  std::int64_t lines_per_epoch = 10;  // plain: about this many lines per epoch (and one at the last step)
  int bar_width = 28;                 // interactive: characters of the bar itself
};

// What one progress line shows.
struct ProgressStatus {
  std::int64_t epoch = 1, epochs = 1;  // 1-based
  std::int64_t step = 0, total = 0;    // steps done, steps in the epoch
  double loss = 0;                     // mean loss of the epoch's steps so far (this rank)
  double samples_per_second = 0;       // over all ranks
  double eta_seconds = 0;              // for the rest of the epoch
};

namespace detail {

// "0:07", "12:34", "1:02:03"; "?" when unknown (not finite or negative).
inline std::string format_clock(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  auto const s = static_cast<std::int64_t>(std::llround(seconds));
  char b[32];
  if (s >= 3600)
    std::snprintf(b, sizeof b, "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  else
    std::snprintf(b, sizeof b, "%lld:%02lld", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  return b;
}

}  // namespace detail

// "epoch 1/2  step  100/938  loss 0.5123  2950 samples/s  ETA 0:28" (plain form; the interactive form puts
// a bar "[=====>      ]" after the epoch). Widths are fixed per epoch so redraws do not jitter.
inline std::string format_progress(ProgressStatus const& s, int bar_width = 0) {
  std::string out = detail::cat("epoch ", s.epoch, "/", s.epochs, "  ");
  if (bar_width > 0) {
    double const frac = s.total > 0 ? std::clamp(double(s.step) / double(s.total), 0.0, 1.0) : 1.0;
    int const full = static_cast<int>(frac * bar_width);
    std::string bar(static_cast<std::size_t>(bar_width), ' ');
    for (int i = 0; i < full; ++i) bar[static_cast<std::size_t>(i)] = '=';
    if (full < bar_width) bar[static_cast<std::size_t>(full)] = '>';
    out += "[" + bar + "]  ";
  }
  int const w = static_cast<int>(std::to_string(s.total).size());
  char b[160];
  std::snprintf(b, sizeof b, "step %*lld/%lld  loss %.4f  %.0f samples/s  ETA %s", w, static_cast<long long>(s.step),
                static_cast<long long>(s.total), s.loss, s.samples_per_second,
                detail::format_clock(s.eta_seconds).c_str());
  return out + b;
}

// "epoch 1/2: train loss 0.4871  test loss 0.3702  test accuracy 86.71% (8671/10000)  time 20.4 s (21.8 ms/step,
// 2937 samples/s)".
inline std::string format_epoch_summary(EpochMetrics const& m, std::int64_t epochs) {
  char b[320];
  std::snprintf(b, sizeof b,
                "epoch %lld/%lld: train loss %.4f  test loss %.4f  test accuracy %.2f%% (%lld/%lld)  time %.2f s "
                "(%.1f ms/step, %.0f samples/s)",
                static_cast<long long>(m.epoch), static_cast<long long>(epochs), m.train_loss, m.test_loss,
                100.0 * m.test_accuracy, static_cast<long long>(m.test_correct), static_cast<long long>(m.test_total),
                m.seconds, m.steps > 0 ? 1e3 * m.seconds / double(m.steps) : 0.0,
                m.seconds > 0 ? double(m.samples) / m.seconds : 0.0);
  return b;
}

// One epoch's progress display. Construct at the start of the epoch (or of the resumed part of it, with
// first_step = steps already done), call update() after each step and finish() at the end. Only rank 0
// should own one. Rates and ETA are measured from construction. Not thread-safe.
class ProgressBar {
 public:
  using clock = std::chrono::steady_clock;

  ProgressBar(std::int64_t epoch, std::int64_t epochs, std::int64_t total_steps, std::int64_t samples_per_step,
              ProgressOptions opts = {}, std::int64_t first_step = 0)
      : status_{.epoch = epoch, .epochs = epochs, .step = first_step, .total = total_steps},
        samples_per_step_(samples_per_step),
        first_step_(first_step),
        opts_(opts),
        start_(clock::now()),
        last_draw_(start_) {
    if (total_steps < 0 || first_step < 0 || first_step > total_steps)
      throw ArgumentError(detail::cat("ProgressBar: step ", first_step, " is outside [0, ", total_steps, "]"));
    every_ = std::max<std::int64_t>(
        1, (total_steps + opts_.lines_per_epoch - 1) / std::max<std::int64_t>(1, opts_.lines_per_epoch));
  }

  // Records that `step` steps of the epoch are done and the last one's loss; redraws when due.
  void update(std::int64_t step, double loss) {
    loss_sum_ += loss;
    ++loss_count_;
    status_.step = step;
    auto const now = clock::now();
    bool const last = step >= status_.total;
    if (opts_.interactive) {
      if (last || std::chrono::duration<double>(now - last_draw_).count() >= opts_.redraw_seconds) draw(now);
    } else if (last || step % every_ == 0) {
      draw(now);
    }
  }

  // Ends the display: the interactive line is completed with a newline (plain lines already end in one).
  void finish() {
    if (finished_) return;
    finished_ = true;
    if (opts_.interactive) {
      draw(clock::now());
      *opts_.out << "\n" << std::flush;
    }
  }

  ProgressStatus const& status() const noexcept { return status_; }
  double mean_loss() const noexcept { return loss_count_ ? loss_sum_ / double(loss_count_) : 0.0; }

 private:
  void draw(clock::time_point now) {
    last_draw_ = now;
    double const elapsed = std::chrono::duration<double>(now - start_).count();
    std::int64_t const done = status_.step - first_step_;
    status_.loss = mean_loss();
    status_.samples_per_second = elapsed > 0 ? double(done * samples_per_step_) / elapsed : 0.0;
    status_.eta_seconds = done > 0 ? elapsed / double(done) * double(status_.total - status_.step) : -1.0;
    if (opts_.interactive)
      *opts_.out << "\r" << format_progress(status_, opts_.bar_width) << "\x1b[K" << std::flush;
    else
      *opts_.out << format_progress(status_) << "\n" << std::flush;
  }

  ProgressStatus status_;
  std::int64_t samples_per_step_;
  std::int64_t first_step_;
  ProgressOptions opts_;
  clock::time_point start_, last_draw_;
  std::int64_t every_ = 1;
  double loss_sum_ = 0;
  std::int64_t loss_count_ = 0;
  bool finished_ = false;
};

}  // namespace ddp
