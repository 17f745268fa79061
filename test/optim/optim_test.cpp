// optim: SGD/Adam/AdamW against PyTorch 1.13's update rules written out in double, state round trips (also
// between arenas of other layouts), skipped parameters, schedules.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "ddp/autograd/autograd.hpp"
#include "ddp/nn/parameter_arena.hpp"
#include "ddp/optim/optim.hpp"

using namespace ddp;

namespace {
// One parameter vector w with a fixed gradient function g(w, step) = w * 0.5 + c_i·(step+1).
struct Setup {
  Var w{from_values<float>({4}, {0.5f, -1.0f, 2.0f, 0.25f}), RequiresGrad::kYes};
  nn::ParameterArena<float> arena{std::vector<nn::NamedParameter<float, HostSpace>>{{"w", w}}};
  void set_grad(int step) {
    Tensor<float> g = w.node().grad;
    for (int i = 0; i < 4; ++i) g[i] = 0.5f * w.value()[i] + 0.1f * float(i + 1) * float(step + 1);
    w.node().grad_defined = true;
  }
};
double grad_ref(double w, int i, int step) { return 0.5 * w + 0.1 * (i + 1) * (step + 1); }
}  // namespace

TEST_CASE("SGD matches PyTorch's rule: weight decay, momentum (buffer starts as grad), dampening, nesterov") {
  for (bool nesterov : {false, true}) {
    for (double damp : {0.0, 0.3}) {
      if (nesterov && damp != 0) continue;
      CAPTURE(nesterov);
      CAPTURE(damp);
      Setup s;
      optim::SgdOptions o{.lr = 0.1, .momentum = 0.9, .dampening = damp, .weight_decay = 0.01, .nesterov = nesterov};
      optim::SGD opt(s.arena, o);
      double w[4] = {0.5, -1.0, 2.0, 0.25}, buf[4] = {};
      for (int step = 0; step < 5; ++step) {
        s.set_grad(step);
        opt.step();
        for (int i = 0; i < 4; ++i) {
          double d = grad_ref(w[i], i, step) + o.weight_decay * w[i];
          buf[i] = step == 0 ? d : o.momentum * buf[i] + (1 - o.dampening) * d;
          d = nesterov ? d + o.momentum * buf[i] : buf[i];
          w[i] -= o.lr * d;
          CHECK(s.w.value()[i] == doctest::Approx(w[i]).epsilon(1e-5));
        }
      }
    }
  }
}

TEST_CASE("Adam (L2) and AdamW (decoupled) match PyTorch's rules with bias correction") {
  for (bool decoupled : {false, true}) {
    CAPTURE(decoupled);
    Setup s;
    double const lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.05;
    optim::Adam adam(s.arena, {.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = wd});
    optim::AdamW adamw(s.arena, {.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = wd});
    double w[4] = {0.5, -1.0, 2.0, 0.25}, m[4] = {}, v[4] = {};
    for (int step = 0; step < 6; ++step) {
      s.set_grad(step);
      if (decoupled)
        adamw.step();
      else
        adam.step();
      int const t = step + 1;
      for (int i = 0; i < 4; ++i) {
        double g = grad_ref(w[i], i, step);
        if (decoupled)
          w[i] *= 1 - lr * wd;
        else
          g += wd * w[i];
        m[i] = b1 * m[i] + (1 - b1) * g;
        v[i] = b2 * v[i] + (1 - b2) * g * g;
        double const denom = std::sqrt(v[i]) / std::sqrt(1 - std::pow(b2, t)) + eps;
        w[i] -= lr / (1 - std::pow(b1, t)) * m[i] / denom;
        CHECK(s.w.value()[i] == doctest::Approx(w[i]).epsilon(1e-5));
      }
    }
  }
}

TEST_CASE("optimizer state round trip: resuming continues bitwise identically") {
  auto run = [](bool interrupt) {
    Setup s;
    optim::AdamW opt(s.arena, {.lr = 0.02});
    for (int step = 0; step < 3; ++step) s.set_grad(step), opt.step();
    if (interrupt) {
      auto st = opt.state();
      optim::AdamW fresh(s.arena, {.lr = 0.5});  // different lr: restored from the state
      fresh.load_state(st);
      for (int step = 3; step < 6; ++step) s.set_grad(step), fresh.step();
    } else {
      for (int step = 3; step < 6; ++step) s.set_grad(step), opt.step();
    }
    std::vector<float> out(4);
    for (int i = 0; i < 4; ++i) out[i] = s.w.value()[i];
    return out;
  };
  auto a = run(false), b = run(true);
  for (int i = 0; i < 4; ++i) CHECK(a[i] == b[i]);
}

TEST_CASE("the fused kernels give each element the same bits wherever its slice starts or ends (any arena layout)") {
  constexpr std::int64_t n = 203;
  Generator gen(3);
  std::vector<float> w0(n), g(n), m0(n), v0(n);
  for (std::int64_t i = 0; i < n; ++i) {
    w0[i] = gen.uniform(-1.0f, 1.0f) * (i % 2 ? 1e-6f : 1.0f);  // small weights show the update's last bits
    g[i] = gen.uniform(-1.0f, 1.0f) * (i % 7 == 0 ? 1e-6f : 1.0f);
    m0[i] = gen.uniform(-0.1f, 0.1f);
    v0[i] = gen.uniform(0.0f, 0.01f) * (i % 5 == 0 ? 1e-9f : 1.0f);
  }
  AdamStep<float> const adam{0.01f, 0.9f, 0.999f, 1e-8f, 0.01f, true, 0.01f / (1 - 0.9f), std::sqrt(1 - 0.999f)};
  SgdStep<float> const sgd{0.1f, 0.9f, 0.1f, 0.01f, false, false};
  // Reference: one call over the whole aligned slice.
  std::vector<float> w = w0, m = m0, v = v0;
  Kernels<HostSpace>::adam_update(n, w.data(), g.data(), m.data(), v.data(), adam);
  std::vector<float> ws = w0, bs = m0;
  Kernels<HostSpace>::sgd_update(n, ws.data(), g.data(), bs.data(), sgd);
  for (std::int64_t shift : {1, 2, 3, 5, 8, 13}) {  // the slice at another address, cut in two at `shift`
    CAPTURE(shift);
    std::vector<float> W(n + 16), G(n + 16), M(n + 16), Vv(n + 16);
    std::copy(w0.begin(), w0.end(), W.begin() + shift);
    std::copy(g.begin(), g.end(), G.begin() + shift);
    std::copy(m0.begin(), m0.end(), M.begin() + shift);
    std::copy(v0.begin(), v0.end(), Vv.begin() + shift);
    for (auto [from, to] : {std::pair<std::int64_t, std::int64_t>{0, shift}, {shift, n}})
      Kernels<HostSpace>::adam_update(to - from, W.data() + shift + from, G.data() + shift + from,
                                      M.data() + shift + from, Vv.data() + shift + from, adam);
    CHECK(std::memcmp(W.data() + shift, w.data(), sizeof(float) * n) == 0);
    CHECK(std::memcmp(M.data() + shift, m.data(), sizeof(float) * n) == 0);
    CHECK(std::memcmp(Vv.data() + shift, v.data(), sizeof(float) * n) == 0);
    std::copy(w0.begin(), w0.end(), W.begin() + shift);
    std::copy(m0.begin(), m0.end(), M.begin() + shift);
    for (auto [from, to] : {std::pair<std::int64_t, std::int64_t>{0, shift}, {shift, n}})
      Kernels<HostSpace>::sgd_update(to - from, W.data() + shift + from, G.data() + shift + from,
                                     M.data() + shift + from, sgd);
    CHECK(std::memcmp(W.data() + shift, ws.data(), sizeof(float) * n) == 0);
    CHECK(std::memcmp(M.data() + shift, bs.data(), sizeof(float) * n) == 0);
  }
}

// ---- state across arena layouts ----------------------------------------------------------------------

namespace {
// Four named parameters with fixed initial values, packed in `order` (registration order) with
// `reserve` free elements after each (as DDP's status slots): the same parameters in another layout.
struct Spec {
  char const* name;
  Shape shape;
};
Spec const kSpecs[] = {{"a", Shape{3}}, {"b", Shape{2, 2}}, {"c", Shape{5}}, {"d", Shape{1}}};

struct Net {
  std::map<std::string, Var> vars;
  nn::ParameterArena<float> arena;
};
Net make_net(std::vector<std::string> const& order, std::vector<std::int64_t> const& reserve = {}) {
  std::map<std::string, Var> vars;
  for (int k = 0; k < 4; ++k) {
    Tensor<float> t(kSpecs[k].shape);
    for (std::int64_t j = 0; j < t.numel(); ++j) t[j] = 0.1f * float((j + 1) * (k + 1)) - 0.3f;
    vars.emplace(kSpecs[k].name, Var(t, RequiresGrad::kYes));
  }
  std::vector<nn::NamedParameter<float, HostSpace>> list;
  for (auto const& n : order) list.push_back({n, vars.at(n)});
  return {vars, nn::ParameterArena<float>(list, reserve)};
}
// A gradient that depends on the parameter's name, element and value only (not on the layout). `skip` gets
// none this step (PyTorch's grad = None).
void set_grads(Net& net, int step, std::string const& skip = "") {
  int k = 0;
  for (auto& [name, v] : net.vars) {
    ++k;
    if (name == skip) continue;
    Tensor<float> g = v.node().grad;
    for (std::int64_t j = 0; j < g.numel(); ++j)
      g[j] = 0.5f * v.value()[j] + 0.1f * float(k * (j + 1) * (step + 1)) * (j % 2 ? -1.0f : 1.0f);
    v.node().grad_defined = true;
  }
}
template <class O>
void steps(Net& net, O& opt, int from, int to, std::string const& skip_at_second = "") {
  for (int step = from; step < to; ++step) {
    opt.zero_grad();
    set_grads(net, step, step == from + 1 ? skip_at_second : "");
    opt.step();
  }
}
bool same_values(Net const& x, Net const& y) {
  for (auto const& [name, v] : x.vars) {
    auto const& w = y.vars.at(name);
    if (std::memcmp(v.value().data(), w.value().data(), sizeof(float) * std::size_t(v.numel())) != 0) return false;
  }
  return true;
}
std::vector<std::string> const kAbcd{"a", "b", "c", "d"};

// Trains `from` (3 steps, 'b' without a gradient in one), moves its state into an optimizer over `to` (the
// same parameters in another layout, with `from`'s values), then 3 more steps on both: the same bits.
template <class O>
void check_moves(typename O::options_type opts, std::vector<std::string> const& order,
                 std::vector<std::int64_t> const& reserve) {
  Net src = make_net(kAbcd);
  O a(src.arena, opts);
  steps(src, a, 0, 3, "b");
  Net dst = make_net(order, reserve);
  for (auto& [name, v] : dst.vars)
    std::memcpy(v.value().data(), src.vars.at(name).value().data(), sizeof(float) * std::size_t(v.numel()));
  O b(dst.arena, opts);
  b.load_state(a.state());
  steps(src, a, 3, 6, "d");
  steps(dst, b, 3, 6, "d");
  CHECK(same_values(src, dst));
}
}  // namespace

TEST_CASE("optimizer state moves between arenas of different layout (gaps, registration order): same next steps") {
  struct Layout {
    std::vector<std::string> order;
    std::vector<std::int64_t> reserve;
  };
  for (auto const& l :
       {Layout{kAbcd, {2, 0, 3, 1}}, Layout{{"c", "a", "d", "b"}, {}}, Layout{{"d", "c", "b", "a"}, {0, 2, 0, 2}}}) {
    CAPTURE(l.order[0]);
    CAPTURE(l.reserve.size());
    check_moves<optim::SGD>({.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01}, l.order, l.reserve);
    check_moves<optim::SGD>({.lr = 0.1, .momentum = 0.9, .dampening = 0.0, .nesterov = true}, l.order, l.reserve);
    check_moves<optim::Adam>({.lr = 0.01, .weight_decay = 0.01}, l.order, l.reserve);
    check_moves<optim::AdamW>({.lr = 0.01}, l.order, l.reserve);
  }
}

TEST_CASE("two bucket layouts of equal total size but other boundaries: Adam's moments land on their parameters") {
  // Two status slots after 'a' or after 'c': numel() is the same, every offset but the first differs.
  Net x = make_net(kAbcd, {2, 0, 0, 0}), y = make_net(kAbcd, {0, 0, 2, 0});
  REQUIRE(x.arena.numel() == y.arena.numel());
  optim::AdamW ox(x.arena, {.lr = 0.05}), oy(y.arena, {.lr = 0.05});
  steps(x, ox, 0, 4);
  for (auto& [name, v] : y.vars)
    std::memcpy(v.value().data(), x.vars.at(name).value().data(), sizeof(float) * std::size_t(v.numel()));
  oy.load_state(ox.state());
  steps(x, ox, 4, 5);
  steps(y, oy, 4, 5);
  CHECK(same_values(x, y));
}

TEST_CASE("optimizer state is per parameter, keyed by name and shape") {
  Net n = make_net(kAbcd, {1, 1, 1, 1});
  optim::Adam adam(n.arena, {.lr = 0.01});
  steps(n, adam, 0, 2, "c");  // 'c' has no gradient in step 1: one step fewer
  auto const st = adam.state();
  CHECK(st.kind == "adam");
  CHECK(st.buffer_names == std::vector<std::string>{"exp_avg", "exp_avg_sq"});
  REQUIRE(st.parameters.size() == 4);
  for (std::size_t i = 0; i < 4; ++i) {
    auto const& p = st.parameters[i];
    CHECK(p.name == kAbcd[i]);
    CHECK(p.shape == optim::detail::dims_of(kSpecs[i].shape));
    CHECK(p.steps == (p.name == "c" ? 1 : 2));
    REQUIRE(p.buffers.size() == 2);
    CHECK(p.buffers[0].size() == std::size_t(kSpecs[i].shape.numel()));
  }
  optim::SGD plain(n.arena, {.lr = 0.1});
  CHECK(plain.state().buffer_names.empty());
  CHECK(plain.state().parameters.size() == 4);
}

TEST_CASE("load_state rejects a mismatched state naming the parameter, and changes nothing") {
  Net n = make_net(kAbcd);
  optim::SGD sgd(n.arena, {.lr = 0.1, .momentum = 0.9});
  optim::Adam adam(n.arena, {});
  steps(n, sgd, 0, 2);
  auto const before = sgd.state();
  CHECK_THROWS_WITH_AS(sgd.load_state(adam.state()), doctest::Contains("'adam', not 'sgd'"), ArgumentError);
  CHECK_THROWS_WITH_AS(sgd.load_state(optim::SGD(n.arena, {.lr = 0.1}).state()),
                       doctest::Contains("sgd state has buffers {}, this optimizer keeps {momentum_buffer}"),
                       ArgumentError);
  auto st = sgd.state();
  st.parameters[1].buffers[0].pop_back();
  CHECK_THROWS_WITH_AS(sgd.load_state(st), doctest::Contains("buffer 'momentum_buffer' of parameter 'b' has 3 values"),
                       ArgumentError);
  st = sgd.state();
  st.parameters[2].name = "e";  // 'c' missing, 'e' extra
  CHECK_THROWS_WITH_AS(sgd.load_state(st), doctest::Contains("no entry for parameter 'c' (5,)"), ArgumentError);
  st = sgd.state();
  st.parameters.push_back(st.parameters[0]);
  st.parameters.back().name = "extra.weight";
  CHECK_THROWS_WITH_AS(sgd.load_state(st),
                       doctest::Contains("holds parameter 'extra.weight' (3,), which this optimizer does not have"),
                       ArgumentError);
  st = sgd.state();
  st.parameters[1].shape = {4};
  CHECK_THROWS_WITH_AS(sgd.load_state(st),
                       doctest::Contains("state of parameter 'b' is for shape (4,), the parameter has shape (2, 2)"),
                       ArgumentError);
  st = sgd.state();
  st.parameters.push_back(st.parameters[0]);
  CHECK_THROWS_WITH_AS(sgd.load_state(st), doctest::Contains("holds parameter 'a' twice"), ArgumentError);
  CHECK(sgd.state() == before);  // every failed load left the optimizer as it was
  CHECK_THROWS_AS(optim::SGD(n.arena, {.lr = -1}), ArgumentError);
  CHECK_THROWS_AS(optim::SGD(n.arena, {.lr = 0.1, .nesterov = true}), ArgumentError);
}

TEST_CASE("parameters without a gradient are skipped, as PyTorch skips grad=None") {
  Var a(from_values<float>({2}, {1, 2}), RequiresGrad::kYes), b(from_values<float>({2}, {3, 4}), RequiresGrad::kYes);
  nn::ParameterArena<float> arena(std::vector<nn::NamedParameter<float, HostSpace>>{{"a", a}, {"b", b}});
  optim::SGD opt(arena, {.lr = 1.0, .momentum = 0.5, .weight_decay = 0.1});
  backward(sum(a));  // only a gets a gradient
  opt.step();
  CHECK(a.value()[0] == doctest::Approx(1 - (1 + 0.1 * 1)));
  CHECK(b.value()[0] == 3.0f);
  CHECK(b.value()[1] == 4.0f);
}

TEST_CASE("StepLR and cosine annealing schedules") {
  Setup s;
  optim::SGD opt(s.arena, {.lr = 1.0});
  optim::StepLR sched(opt, {.step_size = 2, .gamma = 0.5});
  double expect[] = {1.0, 0.5, 0.5, 0.25, 0.25};
  for (double e : expect) {
    sched.step();
    CHECK(opt.lr() == doctest::Approx(e));
  }
  optim::SGD opt2(s.arena, {.lr = 0.1});
  optim::CosineAnnealingLR cos(opt2, {.t_max = 4, .eta_min = 0.0});
  cos.set_epoch(2);
  CHECK(opt2.lr() == doctest::Approx(0.05));
  cos.set_epoch(4);
  CHECK(opt2.lr() == doctest::Approx(0.0));
}

// ---- per-parameter weight decay (DecayRule): PyTorch's parameter groups ----

namespace {
// Two named parameters (a matrix and a bias) with gradients, in an arena.
struct DecaySetup {
  Var w{from_values<float>({2, 2}, {0.5f, -1.0f, 2.0f, 0.25f}), RequiresGrad::kYes};
  Var b{from_values<float>({2}, {1.5f, -0.75f}), RequiresGrad::kYes};
  nn::ParameterArena<float> arena{std::vector<nn::NamedParameter<float, HostSpace>>{{"fc.weight", w}, {"fc.bias", b}}};
  void grads() {
    for (auto const& e : arena.entries()) e.var.node().grad_defined = true;
    for (std::int64_t i = 0; i < arena.numel(); ++i) arena.grads().data()[i] = 0.1f * float(i + 1);
  }
};
}  // namespace

TEST_CASE("a DecayRule gives each parameter its own weight decay, bitwise what separate optimizers give") {
  for (int kind = 0; kind < 2; ++kind) {  // AdamW, SGD with momentum
    DecaySetup grouped, decayed, plain;
    auto run = [&](DecaySetup& s, double wd, optim::DecayRule rule) {
      if (kind == 0) {
        optim::AdamW opt(s.arena, {.lr = 0.1, .weight_decay = wd, .weight_decay_rule = rule});
        for (int i = 0; i < 3; ++i) s.grads(), opt.step();
      } else {
        optim::SGD opt(s.arena, {.lr = 0.1, .momentum = 0.9, .weight_decay = wd, .weight_decay_rule = rule});
        for (int i = 0; i < 3; ++i) s.grads(), opt.step();
      }
    };
    run(grouped, 0.0, optim::decay_matrices_only(0.5));
    run(decayed, 0.5, {});
    run(plain, 0.0, {});
    for (int i = 0; i < 4; ++i) CHECK(grouped.w.value()[i] == decayed.w.value()[i]);  // the matrix decays
    for (int i = 0; i < 2; ++i) CHECK(grouped.b.value()[i] == plain.b.value()[i]);    // the bias does not
    for (int i = 0; i < 4; ++i) CHECK(grouped.w.value()[i] != plain.w.value()[i]);
  }
}

TEST_CASE("a DecayRule that gives a negative decay names the parameter") {
  DecaySetup s;
  auto bad = [](std::string const& name, Shape const&) { return name == "fc.bias" ? -1.0 : 0.0; };
  CHECK_THROWS_WITH_AS(optim::AdamW(s.arena, {.weight_decay_rule = bad}),
                       "adamw: the weight-decay rule gives parameter 'fc.bias' -1; it must be >= 0", ArgumentError);
}
