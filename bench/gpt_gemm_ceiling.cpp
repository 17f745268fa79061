// The GEMM-only ceiling of one GPT training step: the step's matrix products alone, made through the same kernel
// calls the model makes (Kernels<HostSpace>::gemm for every Linear's forward, input gradient and weight gradient;
// attention's per-head products on detail::AttentionTiles where the head fits, as attention_fwd/bwd make them, else
// detail::host_gemm), timed back to back. Nothing else of the step runs: no
// layer norm, GELU, softmax, loss, embedding, optimizer or autograd. tokens/s at this time per step is what the
// job could reach if everything but its GEMMs were free; bench/gpt_vs_torch.sh prints it beside both jobs' tokens/s.
//   bazel run -c opt //bench:gpt_gemm_ceiling -- [--reps N]     (nanoGPT's shakespeare_char model, 12 sequences)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ddp/ddp.hpp"

namespace {
using i64 = std::int64_t;
using ddp::Trans;
using K = ddp::Kernels<ddp::HostSpace>;

struct Shape {
  i64 layers = 4, heads = 4, width = 128, block = 64, vocab = 65, batch = 12;
};

// One step's products. Buffers are sized for the largest operand and reused: the products' own cache behaviour,
// not the model's, which is the part a faster step could not avoid either.
struct Step {
  Shape s;
  std::vector<float> x, w, y, g, gx, gw, qkv, gqkv, p, ds;  // inputs x, w, g, qkv, p; the rest written
  explicit Step(Shape sh) : s(sh) {
    i64 const R = s.batch * s.block, C = s.width, F = 4 * C;
    x.assign(R * F, 0.01f);
    w.assign(F * F, 0.01f);
    y.assign(R * F, 0.0f);
    g.assign(R * F, 0.01f);
    gx.assign(R * F, 0.0f);
    gw.assign(F * F, 0.0f);
    qkv.assign(R * 3 * C, 0.01f);
    gqkv.assign(R * 3 * C, 0.0f);
    p.assign(s.block * s.block, 0.01f);
    ds.assign(s.block * s.block, 0.0f);
  }
  // A Linear (in -> out) over R rows: forward y = b + x·Wᵀ (beta 1, as ddp::linear with a bias), gx = gy·W,
  // gW = gyᵀ·x.
  void linear(i64 R, i64 in, i64 out) {
    K::gemm(Trans::kNo, Trans::kYes, R, out, in, 1.0f, x.data(), w.data(), 1.0f, y.data());
    K::gemm(Trans::kNo, Trans::kNo, R, in, out, 1.0f, g.data(), w.data(), 0.0f, gx.data());
    K::gemm(Trans::kYes, Trans::kNo, out, in, R, 1.0f, g.data(), x.data(), 0.0f, gw.data());
  }
  // Attention's products per (sequence, head), as Kernels<HostSpace>::attention_fwd/bwd make them: S = q·kᵀ,
  // y = P·v; dv = Pᵀ·dy, dP = dy·vᵀ, dq = dS·k, dk = dSᵀ·q. On the register tiles where the head fits (kᵀ and vᵀ
  // packed, the causal part only), else by the host GEMM, each product split at s = T/2 where the causal mask allows
  // (the first s queries see only the first s keys).
  void attention() {
    using ddp::detail::host_gemm;
    using Tiles = ddp::detail::AttentionTiles<float>;
    i64 const T = s.block, C = s.width, D = C / s.heads, ld = 3 * C, h2 = T / 2, r = T - h2;
    float *P = p.data(), *dS = ds.data(), *dy = g.data(), *out = y.data();
    if (Tiles::fits(T, D)) {
      std::vector<float> kt(D * T), vt(D * T);
      for (i64 b = 0; b < s.batch; ++b)
        for (i64 h = 0; h < s.heads; ++h) {
          float const* q = qkv.data() + b * T * ld + h * D;
          float* dq = gqkv.data() + b * T * ld + h * D;
          Tiles::pack_t(T, D, q + C, ld, kt.data());
          Tiles::scores(T, D, q, ld, kt.data(), P);
          Tiles::lower_times(T, D, P, q + 2 * C, ld, 0.0f, out, C);
          Tiles::lower_t_times(T, D, P, dy, C, 0.0f, dq + 2 * C, ld);
          Tiles::pack_t(T, D, q + 2 * C, ld, vt.data());
          Tiles::scores(T, D, dy, C, vt.data(), dS);
          Tiles::lower_times(T, D, dS, q + C, ld, 0.0f, dq, ld);
          Tiles::lower_t_times(T, D, dS, q, ld, 0.0f, dq + C, ld);
        }
      return;
    }
    for (i64 b = 0; b < s.batch; ++b)
      for (i64 h = 0; h < s.heads; ++h) {
        float const* q = qkv.data() + b * T * ld + h * D;
        float const *k = q + C, *v = q + 2 * C;
        float* dq = gqkv.data() + b * T * ld + h * D;
        float *dk = dq + C, *dv = dq + 2 * C;
        host_gemm(Trans::kNo, Trans::kYes, h2, h2, D, 1.0f, q, ld, k, ld, 0.0f, P, T);
        host_gemm(Trans::kNo, Trans::kYes, r, T, D, 1.0f, q + h2 * ld, ld, k, ld, 0.0f, P + h2 * T, T);
        host_gemm(Trans::kNo, Trans::kNo, h2, D, h2, 1.0f, P, T, v, ld, 0.0f, out, C);
        host_gemm(Trans::kNo, Trans::kNo, r, D, T, 1.0f, P + h2 * T, T, v, ld, 0.0f, out + h2 * C, C);
        host_gemm(Trans::kYes, Trans::kNo, h2, D, T, 1.0f, P, T, dy, C, 0.0f, dv, ld);
        host_gemm(Trans::kYes, Trans::kNo, r, D, r, 1.0f, P + h2 * T + h2, T, dy + h2 * C, C, 0.0f, dv + h2 * ld, ld);
        host_gemm(Trans::kNo, Trans::kYes, h2, h2, D, 1.0f, dy, C, v, ld, 0.0f, dS, T);
        host_gemm(Trans::kNo, Trans::kYes, r, T, D, 1.0f, dy + h2 * C, C, v, ld, 0.0f, dS + h2 * T, T);
        host_gemm(Trans::kNo, Trans::kNo, h2, D, h2, 1.0f, dS, T, k, ld, 0.0f, dq, ld);
        host_gemm(Trans::kNo, Trans::kNo, r, D, T, 1.0f, dS + h2 * T, T, k, ld, 0.0f, dq + h2 * ld, ld);
        host_gemm(Trans::kYes, Trans::kNo, h2, D, T, 1.0f, dS, T, q, ld, 0.0f, dk, ld);
        host_gemm(Trans::kYes, Trans::kNo, r, D, r, 1.0f, dS + h2 * T + h2, T, q + h2 * ld, ld, 0.0f, dk + h2 * ld, ld);
      }
  }
  void run() {
    i64 const R = s.batch * s.block, C = s.width;
    for (i64 l = 0; l < s.layers; ++l) {
      linear(R, C, 3 * C);  // c_attn
      attention();
      linear(R, C, C);      // attention's c_proj
      linear(R, C, 4 * C);  // c_fc
      linear(R, 4 * C, C);  // mlp's c_proj
    }
    // The tied head: logits = x·Wteᵀ (no bias), gx = gy·Wte, gWte += gyᵀ·x.
    K::gemm(Trans::kNo, Trans::kYes, R, s.vocab, C, 1.0f, x.data(), w.data(), 0.0f, y.data());
    K::gemm(Trans::kNo, Trans::kNo, R, C, s.vocab, 1.0f, g.data(), w.data(), 0.0f, gx.data());
    K::gemm(Trans::kYes, Trans::kNo, s.vocab, C, R, 1.0f, g.data(), x.data(), 1.0f, gw.data());
  }
  double flops() const {  // GptConfig::flops_per_token's count, for the whole step
    i64 const C = s.width, T = s.block;
    return 6.0 * double(s.layers * 12 * C * C + C * s.vocab + s.layers * 2 * T * C) * double(s.batch * T);
  }
};
}  // namespace

int main(int argc, char** argv) {
  int reps = 200;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
      if (reps < 1) {
        std::fprintf(stderr, "gpt_gemm_ceiling: --reps must be a positive count, got '%s'\n", argv[i]);
        return 2;
      }
    } else {
      std::fprintf(stderr, "gpt_gemm_ceiling: unknown argument '%s' (usage: gpt_gemm_ceiling [--reps N])\n", a.c_str());
      return 2;
    }
  }
  Step step{Shape{}};
  for (int i = 0; i < 10; ++i) step.run();  // warm-up
  std::vector<double> t(static_cast<std::size_t>(reps));
  for (auto& v : t) {
    auto const t0 = std::chrono::steady_clock::now();
    step.run();
    v = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  std::sort(t.begin(), t.end());
  double const med = t[t.size() / 2];
  double const tokens = double(step.s.batch * step.s.block);
  std::printf("GEMM-only step: %.3f ms (median of %d), %.1f GFLOP/s, ceiling %.0f tokens/s\n", med * 1e3, reps,
              step.flops() / med / 1e9, tokens / med);
  return 0;
}
