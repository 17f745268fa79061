// Progress output (plain and interactive), the epoch summary line, and the metrics CSV and SVG files.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <ddp/train/metrics_log.hpp>
#include <ddp/train/progress.hpp>
#include <ddp/train/svg_plot.hpp>

using namespace ddp;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> lines_of(std::string const& s) {
  std::vector<std::string> out;
  std::istringstream is(s);
  for (std::string l; std::getline(is, l);) out.push_back(l);
  return out;
}

std::size_t count(std::string const& s, std::string const& what) {
  std::size_t n = 0;
  for (auto p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

MetricsLog two_epochs() {
  MetricsLog log;
  log.add({.epoch = 1,
           .train_loss = 0.5123,
           .test_loss = 0.4012,
           .test_accuracy = 0.8571,
           .test_correct = 8571,
           .test_total = 10000,
           .seconds = 20.5,
           .steps = 938,
           .samples = 60000,
           .lr = 1e-3});
  log.add({.epoch = 2,
           .train_loss = 0.3311,
           .test_loss = 0.3456,
           .test_accuracy = 0.8802,
           .test_correct = 8802,
           .test_total = 10000,
           .seconds = 19.5,
           .steps = 938,
           .samples = 60000,
           .lr = 7e-4});
  return log;
}

}  // namespace

TEST_CASE("format_progress: step/total, loss, samples/s, ETA; the bar in interactive mode") {
  ProgressStatus const s{.epoch = 1,
                         .epochs = 2,
                         .step = 10,
                         .total = 938,
                         .loss = 0.5,
                         .samples_per_second = 2950.4,
                         .eta_seconds = 65.4};
  CHECK(format_progress(s) == "epoch 1/2  step  10/938  loss 0.5000  2950 samples/s  ETA 1:05");
  ProgressStatus half = s;
  half.step = 469;
  CHECK(format_progress(half, 10) == "epoch 1/2  [=====>    ]  step 469/938  loss 0.5000  2950 samples/s  ETA 1:05");
  half.step = 938;
  half.eta_seconds = 0;
  CHECK(format_progress(half, 4) == "epoch 1/2  [====]  step 938/938  loss 0.5000  2950 samples/s  ETA 0:00");
  CHECK(detail::format_clock(0) == "0:00");
  CHECK(detail::format_clock(59.6) == "1:00");
  CHECK(detail::format_clock(3723) == "1:02:03");
  CHECK(detail::format_clock(-1) == "?");
  CHECK(detail::format_clock(std::nan("")) == "?");
}

TEST_CASE("ProgressBar without a terminal prints plain periodic lines, one per tenth and the last step") {
  std::ostringstream os;
  {
    ProgressBar bar(2, 3, 25, 64, {.out = &os, .interactive = false, .lines_per_epoch = 5});
    for (int step = 1; step <= 25; ++step) bar.update(step, step <= 5 ? 1.0 : 0.0);
    bar.finish();
    CHECK(bar.mean_loss() == doctest::Approx(0.2));
  }
  auto const text = os.str();
  CHECK(text.find('\r') == std::string::npos);
  CHECK(text.find('\x1b') == std::string::npos);
  auto const lines = lines_of(text);
  REQUIRE(lines.size() == 5);  // steps 5, 10, 15, 20, 25
  std::regex const re(R"(epoch 2/3  step (..)/25  loss (\d\.\d{4})  \d+ samples/s  ETA (\d+:\d\d|\?))");
  std::vector<std::string> steps, losses;
  for (auto const& l : lines) {
    std::smatch m;
    REQUIRE_MESSAGE(std::regex_match(l, m, re), l);
    steps.push_back(m[1]);
    losses.push_back(m[2]);
  }
  CHECK(steps == std::vector<std::string>{" 5", "10", "15", "20", "25"});
  CHECK(losses == std::vector<std::string>{"1.0000", "0.5000", "0.3333", "0.2500", "0.2000"});
  CHECK(lines.back().ends_with("ETA 0:00"));
}

TEST_CASE("ProgressBar resumed part-way counts from the resume step") {
  std::ostringstream os;
  ProgressBar bar(1, 1, 10, 8, {.out = &os, .lines_per_epoch = 10}, 6);
  for (int step = 7; step <= 10; ++step) bar.update(step, 1.0);
  auto const lines = lines_of(os.str());
  REQUIRE(lines.size() == 4);
  CHECK(lines.front().starts_with("epoch 1/1  step  7/10  loss 1.0000"));
  CHECK_THROWS_AS(ProgressBar(1, 1, 10, 8, {.out = &os}, 11), ArgumentError);
}

TEST_CASE("ProgressBar on a terminal redraws one line in place and ends it at finish()") {
  std::ostringstream os;
  ProgressBar bar(1, 2, 4, 64, {.out = &os, .interactive = true, .redraw_seconds = 0.0, .bar_width = 8});
  for (int step = 1; step <= 4; ++step) bar.update(step, 0.25);
  bar.finish();
  bar.finish();  // idempotent
  auto const text = os.str();
  CHECK(count(text, "\n") == 1);
  CHECK(text.ends_with("\n"));
  CHECK(count(text, "\r") == 5);  // four updates and the final redraw
  CHECK(count(text, "\x1b[K") == 5);
  CHECK(text.find("\repoch 1/2  [========]  step 4/4  loss 0.2500") != std::string::npos);
}

TEST_CASE("format_epoch_summary: train loss, test loss and accuracy with counts, time, ms/step, samples/s") {
  auto const log = two_epochs();
  CHECK(format_epoch_summary(log.epochs()[0], 2) ==
        "epoch 1/2: train loss 0.5123  test loss 0.4012  test accuracy 85.71% (8571/10000)  time 20.50 s "
        "(21.9 ms/step, 2927 samples/s)");
}

TEST_CASE("MetricsLog writes a CSV with a header and one row per epoch") {
  auto const log = two_epochs();
  CHECK(log.csv() ==
        "epoch,train_loss,test_loss,test_accuracy,test_correct,test_total,seconds,steps,samples,samples_per_second,lr\n"
        "1,0.512300,0.401200,0.857100,8571,10000,20.500,938,60000,2926.8,0.001\n"
        "2,0.331100,0.345600,0.880200,8802,10000,19.500,938,60000,3076.9,0.0007\n");
  char const* t = std::getenv("TEST_TMPDIR");
  fs::path const dir = fs::path(t ? t : "/tmp") / "metrics_log_test";
  fs::create_directories(dir);
  log.write_csv(dir / "m.csv");
  std::ifstream f(dir / "m.csv");
  std::stringstream ss;
  ss << f.rdbuf();
  CHECK(ss.str() == log.csv());
  CHECK_THROWS_WITH_AS(log.write_csv(dir / "absent" / "m.csv"), doctest::Contains("absent/m.csv"), IoError);

  // Read back (as a resumed run does from its checkpoint): the same rows.
  auto const back = MetricsLog::from_csv(log.csv(), "ckpt.bin");
  REQUIRE(back.epochs().size() == 2);
  CHECK(back.csv() == log.csv());
  CHECK(back.epochs()[1].test_correct == 8802);
  CHECK(MetricsLog::from_csv(std::string(MetricsLog::kCsvHeader) + "\n").empty());
  CHECK_THROWS_WITH_AS(MetricsLog::from_csv("epoch,loss\n1,2\n", "ckpt.bin"),
                       doctest::Contains("ckpt.bin: the first line is not the metrics CSV header"), IoError);
  auto broken = log.csv();
  auto const row2 = broken.find("\n2,");
  REQUIRE(row2 != std::string::npos);
  // Not insert(): GCC 12 at -O3 warns a false -Wrestrict inside basic_string::_M_replace (GCC bug 105329).
  broken = broken.substr(0, row2 + 3) + "x" + broken.substr(row2 + 3);
  CHECK_THROWS_WITH_AS(MetricsLog::from_csv(broken, "ckpt.bin"),
                       doctest::Contains("ckpt.bin: line 3 is not a metrics row"), IoError);
}

TEST_CASE("MetricsLog's SVG is well-formed with axes, labels, both curves and a legend") {
  auto const log = two_epochs();
  auto const svg = SvgPlot::metrics_svg(log, "run <a&b>");
  CHECK(svg.starts_with("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\""));
  CHECK(svg.ends_with("</svg>\n"));
  CHECK(svg.find("run &lt;a&amp;b&gt;") != std::string::npos);  // title escaped
  CHECK(count(svg, "<g>") == 2);
  CHECK(count(svg, "</g>") == 2);
  CHECK(count(svg, "<text") == count(svg, "</text>"));
  CHECK(count(svg, "<polyline") == 3);  // train loss, test loss, accuracy
  CHECK(count(svg, "<circle") == 6);    // two points each
  for (char const* label : {">epoch</text>", ">loss</text>", ">test accuracy (%)</text>", ">train loss</text>",
                            ">test loss</text>", ">test accuracy</text>"})
    CHECK_MESSAGE(svg.find(label) != std::string::npos, label);
  // Every coordinate is a finite number inside the canvas.
  std::regex const coord(R"#( (?:x|y|x1|x2|y1|y2|cx|cy)="([^"]*)")#");
  int n = 0;
  for (std::sregex_iterator it(svg.begin(), svg.end(), coord), end; it != end; ++it, ++n) {
    double const v = std::stod((*it)[1]);
    CHECK(std::isfinite(v));
    CHECK(v >= 0);
    CHECK(v <= 900);
  }
  CHECK(n > 40);
  // Ticks cover the data: the accuracy axis shows values between 85 and 89.
  CHECK(svg.find(">86</text>") != std::string::npos);
  CHECK(svg.find(">88</text>") != std::string::npos);

  // One epoch (zero-width x range) and an empty log still render finite coordinates.
  MetricsLog one, empty;
  one.add(log.epochs()[0]);
  for (MetricsLog const* l : {&one, &empty}) {
    auto const s = SvgPlot::metrics_svg(*l);
    CHECK(s.find("nan") == std::string::npos);
    CHECK(s.find("inf") == std::string::npos);
    CHECK(s.ends_with("</svg>\n"));
  }
}

TEST_CASE("nice_ticks cover the range with 1/2/5 steps") {
  auto const a = detail::nice_ticks(0.3, 1.1);
  std::vector<double> const want{0.2, 0.4, 0.6, 0.8, 1.0, 1.2};
  REQUIRE(a.size() == want.size());
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i] == doctest::Approx(want[i]));
  auto const t = detail::nice_ticks(85, 89);
  CHECK(t.front() <= 85);
  CHECK(t.back() >= 89);
}

TEST_CASE("curves_svg: one panel of named curves against x, and a curve of the wrong length names itself") {
  std::string const s = SvgPlot::curves_svg(
      "GPT <tiny>", "iteration", "loss", {250, 500, 750},
      {{"train loss", "#1f77b4", {2.6, 2.2, 2.0}}, {"validation loss", "#ff7f0e", {2.3, 2.1, 2.0}}});
  CHECK(s.rfind("<?xml", 0) == 0);
  CHECK(s.find("GPT &lt;tiny&gt;") != std::string::npos);
  CHECK(s.find(">iteration</text>") != std::string::npos);
  CHECK(s.find("train loss") != std::string::npos);
  CHECK(s.find("validation loss") != std::string::npos);
  CHECK(s.find("</svg>") != std::string::npos);
  CHECK_THROWS_WITH_AS(SvgPlot::curves_svg("t", "x", "y", {1, 2}, {{"val", "#000", {1.0}}}),
                       "curves_svg: curve 'val' has 1 points for 2 x values", ArgumentError);
}
