// Writes the fuzzers' seed corpus: small valid IDX files and checkpoints (written by ddp itself) plus edge cases
// (truncated, trailing bytes, overflowing or huge declared sizes, gzip framing). Usage, from the repository root:
//   bazel run //test/fuzz:make_corpus -- $PWD/test/fuzz/corpus
// The files are committed; rerun it when the formats change.
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <ddp/ddp.hpp>
#include <ddp/train/checkpoint.hpp>

using namespace ddp;
namespace fs = std::filesystem;

namespace {

using Bytes = std::string;

void put_u32(Bytes& b, std::uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<char>(v >> s));
}
Bytes idx(std::vector<std::uint32_t> const& header, std::size_t data_bytes) {
  Bytes b;
  for (auto v : header) put_u32(b, v);
  for (std::size_t i = 0; i < data_bytes; ++i) b.push_back(static_cast<char>((i * 37) % 256));
  return b;
}
Bytes gz(Bytes const& b) {
  auto const tmp = fs::temp_directory_path() / "ddp_make_corpus.gz";
  gzFile f = gzopen(tmp.c_str(), "wb9");
  if (!b.empty()) gzwrite(f, b.data(), static_cast<unsigned>(b.size()));
  gzclose(f);
  std::ifstream in(tmp, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}
void write(fs::path const& p, Bytes const& b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(b.data(), static_cast<std::streamsize>(b.size()));
  std::printf("%6zu bytes  %s\n", b.size(), p.c_str());
}

auto small_model(std::uint64_t seed) {
  Generator g(seed);
  return nn::Sequential(nn::named("fc1", nn::Linear(4, 3, g)), nn::ReLU(), nn::named("fc2", nn::Linear(3, 2, g)));
}
template <class M, class O>
void take_steps(M& model, O& opt, int steps) {
  Generator g(7);
  Tensor<float> x(Shape{5, 4}), y(Shape{5, 2});
  for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = g.uniform(-1.0f, 1.0f);
  for (std::int64_t i = 0; i < y.numel(); ++i) y[i] = g.uniform(-1.0f, 1.0f);
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    backward(mse_loss(model(Var(x)), y));
    opt.step();
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_corpus DIR (writes DIR/idx and DIR/checkpoint)\n");
    return 2;
  }
  fs::path const dir = argv[1], id = dir / "idx", ck = dir / "checkpoint";
  fs::create_directories(id);
  fs::create_directories(ck);

  Bytes const images = idx({0x803, 3, 4, 5}, 60), labels = idx({0x801, 6}, 6);
  write(id / "images", images);
  write(id / "images.gz", gz(images));
  write(id / "labels", labels);
  write(id / "labels.gz", gz(labels));
  write(id / "two-members.gz", gz(images.substr(0, 20)) + gz(images.substr(20)));
  write(id / "rank4", idx({0x804, 1, 2, 2, 2}, 8));
  write(id / "truncated", images.substr(0, 50));
  write(id / "truncated.gz", gz(images).substr(0, 30));
  write(id / "trailing", images + "xyz");
  write(id / "trailing-after-gzip.gz", gz(images) + "junk");
  write(id / "zero-dim", idx({0x803, 3, 0, 5}, 0));
  write(id / "dims-overflow", idx({0x803, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}, 0));
  write(id / "dims-wrap-to-zero", idx({0x803, 1u << 20, 1u << 20, 1u << 24}, 0));  // 2^64 bytes: 0 if unchecked
  write(id / "huge-declared.gz", gz(idx({0x803, 100000, 1000, 1000}, 100)));
  write(id / "float32-dtype", idx({0xD03, 1, 1, 1}, 4));
  write(id / "empty", "");
  write(id / "empty.gz", gz(""));

  {
    auto m = small_model(1);
    nn::ParameterArena<float> arena(m);
    optim::AdamW opt(arena, {.lr = 0.01});
    take_steps(m, opt, 3);
    TrainPosition const pos{.epoch = 1, .step = 2, .global_step = 10, .world_size = 2, .global_batch = 8, .seed = 3};
    auto c = capture_checkpoint(m, opt, pos, "metrics,csv\n1,2\n");
    Bytes const adamw = encode_checkpoint(c);
    write(ck / "adamw.ckpt", adamw);
    write(ck / "truncated.ckpt", adamw.substr(0, adamw.size() / 2));
    write(ck / "header-only.ckpt", adamw.substr(0, kCheckpointHeaderBytes));
    write(ck / "trailing.ckpt", adamw + "zz");
    c.generators.names = {"drop.generator"};
    c.generators.ranks = {{GeneratorState{1, 3, 0.5, true}}, {GeneratorState{2, 5, 0.0, false}}};
    write(ck / "generators.ckpt", encode_checkpoint(c));
  }
  {
    auto m = small_model(2);
    nn::ParameterArena<float> arena(m);
    optim::SGD opt(arena, {.lr = 0.1, .momentum = 0.9});
    take_steps(m, opt, 2);
    write(ck / "sgd-momentum.ckpt", encode_checkpoint(capture_checkpoint(m, opt, TrainPosition{})));
  }
  {
    Generator g(3);
    auto m = nn::Sequential(nn::named("bn", nn::BatchNorm2d(2)), nn::Flatten(), nn::named("drop", nn::Dropout(0.5, 9)));
    nn::ParameterArena<float> arena(m);
    optim::Adam opt(arena, {.lr = 0.001});
    write(ck / "buffers.ckpt", encode_checkpoint(capture_checkpoint(m, opt, TrainPosition{.epoch = 4})));
  }
  {
    CheckpointData<double> d;
    d.parameters = {{"w", {2}, {1.5, -2.5}}};
    d.optimizer = {"sgd", 0.5, {}, {{"w", {2}, 7, {}}}};
    write(ck / "double.ckpt", encode_checkpoint(d));
  }
  return 0;
}
