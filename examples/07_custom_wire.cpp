// 07_custom_wire: a gradient compression of your own, as a reduction policy (PyTorch's register_comm_hook).
// A wire format is a tag type W plus a specialisation of ddp::BucketWire<T, W, S>, which the BucketWireFormat
// concept (<ddp/bucket/wire.hpp>) checks: the buffer it needs (buffer_numel), what a bucket sends into it (pack),
// what arrives (unpack), and its bytes. It sees gradients only. ddp::WireReduction<W> is then its reduction policy
// (as AverageAllReduce is WireReduction<InPlace>), and DistributedDataParallel takes it like the built-in ones; bucketing,
// overlap with backward, unused parameters, Join, the bucket fingerprint and the non-finite checks stay the
// library's.
//
// This wire is float16 with error feedback: each rank adds to its share the rounding error its previous float16
// share lost, so what rounding drops comes back in later steps instead of being lost (the idea of 1-bit SGD,
// Seide et al. 2014, at 16 bits). It trains one MLP three ways (float buckets, Fp16AllReduce, and this wire),
// prints what each sends and how far its weights end from the float run's, and exits 1 unless the ranks agree
// bit for bit, the 16-bit wires send half the bytes and the loss stays within 2% of the float run's.
//   custom_wire [--world-size 2]      mpirun -n 2 custom_wire --backend mpi
#include <cmath>
#include <cstdio>
#include <string_view>
#include <vector>

#include "examples/common/flags.hpp"
#include "examples/common/launch.hpp"
#include "examples/common/rows.hpp"

// The tag: buckets travel as float16, error-compensated. It names the reduction policy for logs.
struct EfFloat16 {
  static constexpr std::string_view policy_name = "EfFp16AllReduce";
};

// The wire, for float gradients in host memory. It sees a bucket's gradients only: the library adds its own
// bookkeeping to the first collective.
template <>
class ddp::BucketWire<float, EfFloat16, ddp::HostSpace> {
 public:
  using value_type = ddp::float16;                 // what travels: the backend must move it (ddp::HalfCommunicator)
  using config = ddp::NoWireConfig;                // no options
  static constexpr bool single_collective = true;  // one all-reduce per bucket

  BucketWire(std::vector<ddp::WireBucket> layout, int world, config = {})
      : layout_(std::move(layout)), inv_world_(1.0f / static_cast<float>(world)) {
    for (auto const& b : layout_) error_.emplace_back(static_cast<std::size_t>(b.grads), 0.0f);
  }
  // What the library lends pack() for bucket b: one float16 per gradient.
  std::int64_t buffer_numel(std::size_t b) const noexcept { return layout_[b].grads; }
  // This rank's share g / world plus what its last share lost, rounded to float16; the loss kept for next time.
  ddp::WirePiece<ddp::float16, ddp::HostSpace> pack(std::size_t b, float const* grads, ddp::Participation,
                                                    ddp::HostSpan<ddp::float16> buffer) {
    auto& e = error_[b];
    for (std::size_t i = 0; i < e.size(); ++i) {
      float const share = grads[i] * inv_world_ + e[i];
      buffer.data()[i] = ddp::float16(share);
      e[i] = share - static_cast<float>(buffer.data()[i]);
    }
    return {buffer.first(e.size()), ddp::ReduceOp::kSum, "bucket"};
  }
  // The sum of the shares is the average gradient.
  std::optional<ddp::WirePiece<ddp::float16, ddp::HostSpace>> unpack(std::size_t b, float* grads,
                                                                     ddp::HostSpan<ddp::float16> buffer) {
    for (std::size_t i = 0; i < error_[b].size(); ++i) grads[i] = static_cast<float>(buffer.data()[i]);
    return std::nullopt;  // no second collective
  }
  std::int64_t bytes() const noexcept {
    std::int64_t n = 0;
    for (auto const& b : layout_) n += b.grads * static_cast<std::int64_t>(sizeof(ddp::float16));
    return n;
  }

 private:
  std::vector<ddp::WireBucket> layout_;
  float inv_world_;
  std::vector<std::vector<float>> error_;  // per bucket: what this rank's last share lost
};
static_assert(ddp::BucketWireFormat<ddp::BucketWire<float, EfFloat16, ddp::HostSpace>, float, ddp::HostSpace>);

// The reduction policy: the library's bucket reducer over this wire.
using EfFp16AllReduce = ddp::WireReduction<EfFloat16>;
static_assert(ddp::ReductionPolicy<EfFp16AllReduce>);

using namespace ddp;
using examples::slice_rows;

namespace {
auto make_model() {
  Generator g(1);
  return nn::Sequential(nn::Linear(16, 64, g), nn::Tanh(), nn::Linear(64, 64, g), nn::ReLU(), nn::Linear(64, 4, g));
}
struct Run {
  std::vector<float> weights;
  double last_loss = 0;  // mean over the last 10 steps
  std::int64_t bytes = 0;
};
}  // namespace

int main(int argc, char** argv) {
  examples::Flags flags("custom_wire", "A gradient compression of your own: float16 with error feedback.");
  examples::add_launch_flags(flags)
      .add("batch", "32", "global batch (divisible by the world size)")
      .add("steps", "200", "SGD steps");
  try {
    if (!flags.parse(argc, argv)) return 0;
    auto const launch = examples::launch_choice(flags);
    std::int64_t const B = flags.at_least("batch", 1), steps = flags.at_least("steps", 10);
    return examples::launch(launch, argc, argv, [&](auto& comm) {
      using C = std::remove_reference_t<decltype(comm)>;
      int const n = comm.world_size(), r = comm.rank();
      if (B % n != 0) throw ArgumentError(detail::cat("--batch ", B, " must be divisible by the world size ", n));
      std::int64_t const local = B / n;
      Generator dg(7);
      Tensor<float> x(Shape{B * steps, 16}), y(Shape{B * steps, 4});
      for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = dg.uniform(-1.0f, 1.0f);
      for (std::int64_t i = 0; i < y.numel(); ++i) y[i] = 0.5f * std::sin(3.0f * x[i / 4 * 16 + i % 4]);

      auto train = [&](auto reduction) {
        Recording<C> recording(comm);  // to count the bytes the buckets really send
        auto model = make_model();
        DistributedDataParallel<decltype(model), Recording<C>, SizeCapped, decltype(reduction)> ddp(
            model, recording, {}, {.reduction = reduction});
        optim::SGD opt(ddp.parameters(), {.lr = 0.05, .momentum = 0.9});
        Run run;
        for (std::int64_t s = 0; s < steps; ++s) {
          opt.zero_grad();
          auto loss =
              mse_loss(ddp(Var(slice_rows(x, s * B + r * local, local))), slice_rows(y, s * B + r * local, local));
          if (s >= steps - 10) run.last_loss += loss.item() / 10;
          backward(loss);
          opt.step();
        }
        for (auto const& e : ddp.parameters().entries())
          run.weights.insert(run.weights.end(), e.var.value().data(), e.var.value().data() + e.numel);
        for (auto const& rec : recording.records())
          if (rec.tag.label == "bucket") run.bytes += static_cast<std::int64_t>(rec.count * size_of(rec.dtype));
        run.bytes /= steps;
        if (r == 0) std::printf("%s\n", ddp.describe().c_str());
        return run;
      };
      Run const f32 = train(AverageAllReduce{}), f16 = train(Fp16AllReduce{}), ef = train(EfFp16AllReduce{});

      auto distance = [&](Run const& a) {
        double d = 0, big = 0;
        for (std::size_t i = 0; i < a.weights.size(); ++i) {
          d = std::max(d, double(std::abs(a.weights[i] - f32.weights[i])));
          big = std::max(big, double(std::abs(f32.weights[i])));
        }
        return d / std::max(1.0, big);
      };
      // Every rank must hold rank 0's weights: compare each run's checksum's min and max over the ranks.
      std::vector<double> sums;
      for (Run const* run : {&f32, &f16, &ef}) {
        double s = 0;
        for (std::size_t i = 0; i < run->weights.size(); ++i) s += double(run->weights[i]) * double(i % 97 + 1);
        sums.push_back(s);
        sums.push_back(-s);
      }
      comm.all_reduce(std::span<double>(sums), ReduceOp::kMax);
      double losses[3] = {f32.last_loss, f16.last_loss, ef.last_loss};
      comm.all_reduce(std::span<double>(losses), ReduceOp::kAvg);
      if (r == 0)
        std::printf(
            "world size %d, %lld steps: loss of the last 10 steps float %.5f, fp16 %.5f, fp16 + error feedback %.5f; "
            "weights from the float run's: fp16 %.3g, fp16 + error feedback %.3g (relative)\n",
            n, static_cast<long long>(steps), losses[0], losses[1], losses[2], distance(f16), distance(ef));
      for (std::size_t k = 0; k < sums.size(); k += 2)
        if (sums[k] != -sums[k + 1]) throw Error("the ranks ended with different weights");
      if (f16.bytes != ef.bytes || 2 * ef.bytes != f32.bytes)
        throw Error(detail::cat("bytes a step: float ", f32.bytes, ", fp16 ", f16.bytes, ", this wire ", ef.bytes,
                                "; the 16-bit wires should send half of float's"));
      for (double l : {losses[1], losses[2]})
        if (std::abs(l - losses[0]) > 0.02 * losses[0])
          throw Error(detail::cat("a 16-bit run's loss ", l, " is not within 2% of the float run's ", losses[0]));
    });
  } catch (std::exception const& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
