// examples/common/flags.hpp, the examples' command-line parser: unknown flags are reported as unknown wherever
// they appear (last included, where they used to be "needs a value"), listing the valid ones.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "examples/common/flags.hpp"

using ddp::ArgumentError;
using ddp::examples::Flags;

namespace {

Flags make() {
  Flags f("prog", "a test program");
  f.add("epochs", "2", "epochs").add("lr", "0.1", "learning rate").add("verbose", "false", "more output");
  return f;
}

// Parses `args` and returns the ArgumentError's message ("" if it parsed).
std::string parse_error(std::vector<std::string> args) {
  args.insert(args.begin(), "prog");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  auto f = make();
  try {
    f.parse(static_cast<int>(argv.size()), argv.data());
  } catch (ArgumentError const& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("an unknown flag is reported as unknown, first, last, alone or with =, listing the valid flags") {
  std::string const unknown = "prog: unknown flag --bogus (valid flags: --epochs, --lr, --verbose; see --help)";
  CHECK(parse_error({"--bogus"}) == unknown);
  CHECK(parse_error({"--epochs", "3", "--bogus"}) == unknown);
  CHECK(parse_error({"--bogus", "1", "--epochs", "3"}) == unknown);
  CHECK(parse_error({"--bogus=1"}) == unknown);
  CHECK(parse_error({"--verbose", "--bogus"}) == unknown);
}

TEST_CASE("a known flag without its value still needs a value; booleans stand alone") {
  CHECK(parse_error({"--epochs"}) == "prog: flag --epochs needs a value");
  CHECK(parse_error({"--lr", "0.5", "--epochs"}) == "prog: flag --epochs needs a value");
  CHECK(parse_error({"--verbose"}).empty());
  CHECK(parse_error({"--verbose", "--epochs", "4"}).empty());
  CHECK(parse_error({"stray"}) == "prog: unexpected argument 'stray' (flags start with --; see --help)");
}

TEST_CASE("integer flags reject overflow and junk, naming the flag") {
  auto f = make();
  std::string a0 = "prog", a1 = "--epochs", a2 = "99999999999999999999";
  char* argv[] = {a0.data(), a1.data(), a2.data()};
  REQUIRE(f.parse(3, argv));
  CHECK_THROWS_WITH_AS(f.integer("epochs"), "prog: --epochs is out of range: '99999999999999999999'", ArgumentError);
  a2 = "3x";
  auto g = make();
  REQUIRE(g.parse(3, argv));
  CHECK_THROWS_WITH_AS(g.integer("epochs"), "prog: --epochs must be an integer, got '3x'", ArgumentError);
}
