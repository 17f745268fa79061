// 09_gpt_quickstart: the GPT composition in one page (README "Transformers"): a character-level GPT with a tied head,
// data-parallel on 2 thread ranks, AdamW with weight decay on matrices only, warm-up + cosine, gradient clipping.
#include <ddp/ddp.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  using namespace ddp;
  auto corpus = data::TextCorpus::load(argc > 1 ? argv[1] : "third_party/tinyshakespeare/input.txt");
  spawn(2, [&](ThreadsBackend& comm) {
    Generator gen(1337);  // the same initial weights on every rank
    nn::Gpt model({.vocab_size = corpus.vocab().size(), .block_size = 32, .n_layer = 2, .n_head = 2, .n_embd = 64},
                  gen);
    DistributedDataParallel ddp(model, comm);
    optim::AdamW opt(ddp.parameters(),
                     {.lr = 2e-3, .beta2 = 0.99, .weight_decay_rule = optim::decay_matrices_only(0.1)});
    optim::WarmupCosineLR schedule(opt, {.warmup = 10, .t_max = 150, .eta_min = 2e-4});
    data::BlockBatcher batches(corpus.train(), {.block_size = 32, .seed = 1});

    for (std::int64_t step = 0; step < 150; ++step) {
      schedule.set_epoch(step);
      auto const offsets = batches.offsets(step, 16);  // the global batch; each rank takes its 8
      auto const b = batches.batch(std::span(offsets).subspan(8 * comm.rank(), 8));
      opt.zero_grad();
      Var loss = nn::gpt_loss(ddp(Var(b.x)), b.y);
      backward(loss);  // the tied embedding's gradient: both uses, all-reduced once
      nn::clip_grad_norm(ddp.parameters(), 1.0);
      opt.step();
      if (comm.rank() == 0 && step % 50 == 49) std::printf("step %3lld  loss %.4f\n", (long long)step + 1, loss.item());
    }
    if (comm.rank() == 0) {
      auto const text = nn::sample(model, corpus.vocab().encode("\n"), {.tokens = 60, .temperature = 0.8});
      std::printf("sample:%s\n", corpus.vocab().decode(text).c_str());
    }
  });
}
