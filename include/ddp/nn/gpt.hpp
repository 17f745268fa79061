// A GPT (decoder-only transformer with a tied output head), written as nanoGPT's model.py and PyTorch names its
// parameters: token and position embeddings, n_layer pre-LN blocks of causal multi-head self-attention and a
// GELU MLP, a final LayerNorm and logits through the token embedding's transpose. Plus greedy-or-sampled
// generation for the text job.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/autograd/autograd.hpp"
#include "ddp/nn/layers.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/nn/transformer.hpp"

namespace ddp::nn {

struct GptConfig {
  std::int64_t vocab_size = 65;
  std::int64_t block_size = 64;  // rows of the position table: the longest sequence the model takes
  std::int64_t n_layer = 4;
  std::int64_t n_head = 4;
  std::int64_t n_embd = 128;
  bool bias = true;    // biases in every Linear and LayerNorm
  double dropout = 0;  // on the embeddings' sum, the attention weights and each residual branch
  GeluApprox gelu = GeluApprox::kErf;
  double layer_norm_eps = 1e-5;
  std::uint64_t dropout_seed = 0;  // each Dropout's generator starts from this plus its index

  // Throws ArgumentError naming the first field that is out of range.
  void validate() const {
    auto positive = [](char const* name, std::int64_t v) {
      if (v <= 0) throw ArgumentError(ddp::detail::cat("GptConfig: ", name, " must be positive, got ", v));
    };
    positive("vocab_size", vocab_size);
    positive("block_size", block_size);
    positive("n_layer", n_layer);
    positive("n_head", n_head);
    positive("n_embd", n_embd);
    if (n_embd % n_head != 0)
      throw ArgumentError(ddp::detail::cat("GptConfig: n_embd ", n_embd, " is not a multiple of n_head ", n_head));
    if (vocab_size > (std::int64_t{1} << 24))
      throw ArgumentError(ddp::detail::cat("GptConfig: vocab_size ", vocab_size,
                                           " is past 2^24, the largest id a float input carries exactly"));
    if (!(dropout >= 0 && dropout < 1))
      throw ArgumentError(ddp::detail::cat("GptConfig: dropout must be in [0, 1), got ", dropout));
  }
  // Parameters, the tied head counted once.
  std::int64_t parameter_count() const {
    std::int64_t const C = n_embd, b = bias ? 1 : 0;
    std::int64_t const block =
        2 * (C + b * C) + (3 * C * C + b * 3 * C) + (C * C + b * C) + (4 * C * C + b * 4 * C) + (4 * C * C + b * C);
    return vocab_size * C + block_size * C + n_layer * block + C + b * C;
  }
  // Multiply-adds ×2 of one token's forward and backward at sequence length t (the matrix products only:
  // the Linear layers, the tied head, q·kᵀ and att·v over the causal half counted whole, as PyTorch computes it).
  double flops_per_token(std::int64_t t) const {
    double const C = double(n_embd), L = double(n_layer);
    double const dense = L * 12 * C * C + C * double(vocab_size);  // qkv 3C², proj C², fc 4C², proj 4C²; head
    double const attention = L * 2 * double(t) * C;                // q·kᵀ and att·v
    return 6 * (dense + attention);                                // forward 2, backward 4
  }
};

template <class T = float, MemorySpace S = HostSpace>
class basic_gpt {
 public:
  using value_type = T;
  using space = S;
  using V = Variable<T, S>;

  basic_gpt(GptConfig cfg, Generator& gen) : cfg_((cfg.validate(), cfg)) {
    std::int64_t const C = cfg.n_embd;
    LinearOptions const lin{.bias = cfg.bias};
    LayerNormOptions const ln{.eps = cfg.layer_norm_eps, .bias = cfg.bias};
    wte_.emplace(cfg.vocab_size, C, gen);
    wpe_.emplace(cfg.block_size, C, gen);
    for (std::int64_t l = 0; l < cfg.n_layer; ++l)
      blocks_.push_back(Block{.ln_1 = basic_layer_norm<T, S>(C, ln),
                              .c_attn = basic_linear<T, S>(C, 3 * C, gen, lin),
                              .attn_proj = basic_linear<T, S>(C, C, gen, lin),
                              .ln_2 = basic_layer_norm<T, S>(C, ln),
                              .c_fc = basic_linear<T, S>(C, 4 * C, gen, lin),
                              .mlp_proj = basic_linear<T, S>(4 * C, C, gen, lin)});
    ln_f_.emplace(C, ln);
    // nanoGPT's initialisation: every weight matrix and embedding normal(0, 0.02), the residual projections
    // normal(0, 0.02/√(2·n_layer)), biases 0 (LayerNorms keep 1 and 0), drawn in parameter order.
    double const proj_std = 0.02 / std::sqrt(2.0 * double(cfg.n_layer));
    for (auto const& p : named_parameters()) {
      if (p.var.shape().rank() == 1 && p.name.find("ln") != std::string::npos) continue;
      bool const proj = p.name.ends_with("c_proj.weight");
      Tensor<T> h(p.var.shape());
      if (p.var.shape().rank() == 1)
        std::fill(h.data(), h.data() + h.numel(), T(0));
      else
        init::normal(h, 0.0, proj ? proj_std : 0.02, gen);
      Kernels<S>::from_host(h.numel(), h.data(), p.var.value().data());
    }
    if (cfg.dropout > 0) {
      std::uint64_t seed = cfg.dropout_seed;
      drops_.push_back({"drop", basic_dropout<T, S>(cfg.dropout, seed++)});
      for (std::int64_t l = 0; l < cfg.n_layer; ++l)
        for (char const* d : {"attn.attn_dropout", "attn.resid_dropout", "mlp.dropout"})
          drops_.push_back({ddp::detail::cat("h.", l, ".", d), basic_dropout<T, S>(cfg.dropout, seed++)});
    }
  }

  // idx:(B, T') token ids as exact float values, T' <= block_size -> logits (B, T', vocab_size).
  V forward(V const& idx) {
    check_input(idx.shape());
    return forward(detail::ids_from_values("GPT", idx.value(), cfg_.vocab_size));
  }
  V forward(Tensor<std::int32_t, S> const& idx) {
    check_input(idx.shape());
    std::int64_t const B = idx.shape()[0], Tn = idx.shape()[1], C = cfg_.n_embd;
    V x = add((*wte_)(idx), (*wpe_)(positions(Tn)));  // (B, T', C) + (T', C)
    x = drop(0, x);
    for (std::size_t l = 0; l < blocks_.size(); ++l) x = block(l, x, B, Tn, C);
    x = (*ln_f_)(x);
    return linear(x, wte_->weight);  // the head is the token table: (B, T', C)·(V, C)ᵀ
  }
  V operator()(V const& idx) { return forward(idx); }
  V operator()(Tensor<std::int32_t, S> const& idx) { return forward(idx); }

  std::vector<NamedParameter<T, S>> named_parameters() const {
    std::vector<NamedParameter<T, S>> ps;
    std::vector<NamedBuffer<T, S>> bs;
    append_prefixed("wte", *wte_, ps, bs);
    append_prefixed("wpe", *wpe_, ps, bs);
    for (std::size_t l = 0; l < blocks_.size(); ++l) {
      auto const& b = blocks_[l];
      std::string const h = ddp::detail::cat("h.", l, ".");
      append_prefixed(h + "ln_1", b.ln_1, ps, bs);
      append_prefixed(h + "attn.c_attn", b.c_attn, ps, bs);
      append_prefixed(h + "attn.c_proj", b.attn_proj, ps, bs);
      append_prefixed(h + "ln_2", b.ln_2, ps, bs);
      append_prefixed(h + "mlp.c_fc", b.c_fc, ps, bs);
      append_prefixed(h + "mlp.c_proj", b.mlp_proj, ps, bs);
    }
    append_prefixed("ln_f", *ln_f_, ps, bs);
    return ps;
  }
  std::vector<NamedBuffer<T, S>> named_buffers() const { return {}; }
  std::vector<NamedGenerator> named_generators() const {
    std::vector<NamedGenerator> gs;
    for (auto const& d : drops_) append_prefixed(d.name, d.layer, gs);
    return gs;
  }
  void set_mode(Mode m) {
    mode_ = m;
    for (auto& d : drops_) d.layer.set_mode(m);
  }
  Mode mode() const noexcept { return mode_; }
  GptConfig const& config() const noexcept { return cfg_; }

 private:
  struct Block {
    basic_layer_norm<T, S> ln_1;
    basic_linear<T, S> c_attn, attn_proj;
    basic_layer_norm<T, S> ln_2;
    basic_linear<T, S> c_fc, mlp_proj;
  };
  struct NamedDropout {
    std::string name;
    basic_dropout<T, S> layer;
  };

  void check_input(Shape const& s) const {
    if (s.rank() != 2)
      throw ShapeError(ddp::detail::cat("GPT: input of shape ", s, "; expected (batch, sequence) token ids"));
    if (s[1] > cfg_.block_size || s[1] < 1)
      throw ShapeError(ddp::detail::cat("GPT: sequence length ", s[1], " is past block_size ", cfg_.block_size,
                                        " (the position table wpe has ", cfg_.block_size, " rows)"));
  }
  // Ids 0..n-1 in the model's memory space, made once per length.
  Tensor<std::int32_t, S> const& positions(std::int64_t n) {
    if (pos_.numel() != n) {
      Tensor<std::int32_t> h(Shape{n});
      for (std::int64_t i = 0; i < n; ++i) h[i] = static_cast<std::int32_t>(i);
      pos_ = to_space<S>(h);
    }
    return pos_;
  }
  // Dropout k (0: after the embeddings; then per block: attention weights, attention output, MLP output).
  V drop(std::size_t k, V const& x) { return drops_.empty() ? x : drops_[k].layer(x); }

  V block(std::size_t l, V const& x, std::int64_t B, std::int64_t Tn, std::int64_t C) {
    auto& b = blocks_[l];
    std::int64_t const H = cfg_.n_head, D = C / H;
    std::size_t const d0 = 1 + 3 * l;
    V const qkv = b.c_attn(b.ln_1(x));                               // (B, T', 3C)
    bool const no_dropout = drops_.empty() || mode_ == Mode::kEval;  // none, or eval mode: every Dropout the identity
    V y;
    if (no_dropout) {
      y = causal_self_attention(qkv, H);  // fused where the memory space has the kernel
    } else {                              // dropout on the attention weights: the composed form, which has them
      auto heads = [&](V const& t) { return transpose(reshape(t, Shape{B, Tn, H, D}), 1, 2); };  // (B, H, T', D)
      auto parts = split_last(qkv, 3);
      V att = bmm(heads(parts[0]), heads(parts[1]), Trans::kNo, Trans::kYes);  // (B, H, T', T')
      att = drop(d0, softmax(att, {.scale = 1.0 / std::sqrt(double(D)), .mask = SoftmaxMask::kCausal}));
      y = reshape(transpose(bmm(att, heads(parts[2])), 1, 2), Shape{B, Tn, C});
    }
    // Without dropout the residual sums fold into the projections (linear_residual: no pass of their own); with it,
    // dropout sits between each projection and its sum.
    V const h =
        no_dropout ? linear_residual(x, y, b.attn_proj.weight, b.attn_proj.bias) : add(x, drop(d0 + 1, b.attn_proj(y)));
    V const a = gelu(b.c_fc(b.ln_2(h)), cfg_.gelu);
    return no_dropout ? linear_residual(h, a, b.mlp_proj.weight, b.mlp_proj.bias) : add(h, drop(d0 + 2, b.mlp_proj(a)));
  }

  GptConfig cfg_;
  std::optional<basic_embedding<T, S>> wte_, wpe_;
  std::vector<Block> blocks_;
  std::optional<basic_layer_norm<T, S>> ln_f_;
  std::vector<NamedDropout> drops_;
  Tensor<std::int32_t, S> pos_;
  Mode mode_ = Mode::kTrain;
};

using Gpt = basic_gpt<>;
static_assert(Model<Gpt> && HasGenerators<Gpt>);

// Mean next-token cross-entropy of logits (B, T', V) against targets (B, T') of int32 ids.
template <class T, MemorySpace S>
Variable<T, S> gpt_loss(Variable<T, S> const& logits, Tensor<std::int32_t, S> const& targets) {
  Shape const& ls = logits.shape();
  if (ls.rank() != 3 || !(targets.shape() == Shape{ls[0], ls[1]}))
    throw ShapeError(ddp::detail::cat("gpt_loss: logits of shape ", ls, " and targets of shape ", targets.shape(),
                                      "; expected (B, T, V) and (B, T)"));
  return cross_entropy(reshape(logits, Shape{ls[0] * ls[1], ls[2]}), targets.reshape(Shape{ls[0] * ls[1]}));
}

struct SampleOptions {
  std::int64_t tokens = 200;  // how many to generate
  double temperature = 1.0;   // > 0; logits are divided by it
  std::int64_t top_k = 0;     // > 0: sample among the k most likely only
  std::uint64_t seed = 1;
};

// Extends `context` (token ids, at least one) by options.tokens tokens sampled from the model (nanoGPT's
// generate(): the last block_size tokens as context, logits of the last position / temperature, top-k, then a
// draw). Runs without autograd in eval mode and restores the model's mode. Host reads of one row per token.
template <class T, MemorySpace S>
std::vector<std::int32_t> sample(basic_gpt<T, S>& model, std::vector<std::int32_t> context, SampleOptions opt) {
  if (context.empty()) throw ArgumentError("sample: the context needs at least one token");
  if (!(opt.temperature > 0))
    throw ArgumentError(ddp::detail::cat("sample: temperature must be > 0, got ", opt.temperature));
  if (opt.top_k < 0) throw ArgumentError(ddp::detail::cat("sample: top_k must be >= 0, got ", opt.top_k));
  NoGradGuard no_grad;
  Mode const was = model.mode();
  model.set_mode(Mode::kEval);
  Generator gen(opt.seed);
  std::int64_t const V = model.config().vocab_size, block = model.config().block_size;
  std::vector<T> row(static_cast<std::size_t>(V));
  std::vector<double> p(static_cast<std::size_t>(V));
  for (std::int64_t t = 0; t < opt.tokens; ++t) {
    auto const n = std::min<std::int64_t>(block, static_cast<std::int64_t>(context.size()));
    Tensor<std::int32_t> ids(Shape{1, n});
    std::copy(context.end() - n, context.end(), ids.data());
    Variable<T, S> logits = model(to_space<S>(ids));
    Kernels<S>::to_host(V, logits.value().data() + (n - 1) * V, row.data());
    double cut = -std::numeric_limits<double>::infinity();
    if (opt.top_k > 0 && opt.top_k < V) {
      std::vector<T> sorted(row);
      std::nth_element(sorted.begin(), sorted.begin() + (opt.top_k - 1), sorted.end(), std::greater<T>());
      cut = double(sorted[static_cast<std::size_t>(opt.top_k - 1)]);
    }
    double mx = -std::numeric_limits<double>::infinity();
    for (std::int64_t v = 0; v < V; ++v)
      if (double(row[v]) >= cut) mx = std::max(mx, double(row[v]) / opt.temperature);
    double z = 0;
    for (std::int64_t v = 0; v < V; ++v)
      z += p[v] = double(row[v]) >= cut ? std::exp(double(row[v]) / opt.temperature - mx) : 0.0;
    double u = gen.uniform_double() * z;
    std::int32_t pick = 0;
    for (std::int64_t v = 0; v < V; ++v) {
      if (p[v] == 0) continue;
      pick = static_cast<std::int32_t>(v);
      if ((u -= p[v]) < 0) break;
    }
    context.push_back(pick);
  }
  model.set_mode(was);
  return context;
}

}  // namespace ddp::nn
