// FashionMnist: loads the train or test split of Fashion-MNIST (IDX files, e.g. Debian's dataset-fashion-mnist).
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <string_view>

#include "ddp/data/dataset.hpp"
#include "ddp/data/idx.hpp"
#include "ddp/error.hpp"

namespace ddp {

enum class Split { kTrain, kTest };

constexpr std::string_view name(Split s) noexcept { return s == Split::kTrain ? "train" : "test"; }

// Where Debian's dataset-fashion-mnist package (installed by tools/setup.sh) puts the files.
inline constexpr std::string_view kFashionMnistDefaultDir = "/usr/share/datasets/fashion-mnist/";

struct FashionMnistOptions {
  std::filesystem::path dir = std::filesystem::path(kFashionMnistDefaultDir);
  Split split = Split::kTrain;
  std::int64_t limit = 0;          // keep only the first `limit` samples (0: all 60000 / 10000)
  double normalize_mean = 0.2860;  // the training set's pixel mean and std (after / 255), as the seeds use
  double normalize_std = 0.3530;
};

// Fashion-MNIST: 28×28 grey images of 10 clothing classes; 60000 train and 10000 test samples. Files in
// `dir`: train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz,
// t10k-labels-idx1-ubyte.gz (the same names without .gz are accepted when the .gz is absent).
// load() reads and validates both files of a split (see read_idx_images / read_idx_labels) and checks that
// they hold the same number of samples of 28×28 pixels; every failure is an IoError naming the file.
struct FashionMnist {
  static constexpr int kNumClasses = 10;
  static constexpr int kRows = 28;
  static constexpr int kCols = 28;
  static constexpr std::array<std::string_view, kNumClasses> kClassNames{
      "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};

  static std::filesystem::path images_path(std::filesystem::path const& dir, Split split) {
    return pick(dir, split == Split::kTrain ? "train-images-idx3-ubyte" : "t10k-images-idx3-ubyte");
  }
  static std::filesystem::path labels_path(std::filesystem::path const& dir, Split split) {
    return pick(dir, split == Split::kTrain ? "train-labels-idx1-ubyte" : "t10k-labels-idx1-ubyte");
  }

  // x: float (N, 1, 28, 28), normalised; y: int32 class ids (N) in [0, 10).
  static TensorDataset<std::int32_t> load(FashionMnistOptions const& opts = {}) {
    std::error_code ec;
    if (!std::filesystem::is_directory(opts.dir, ec))
      throw IoError(detail::cat("Fashion-MNIST directory ", opts.dir.string(),
                                " does not exist: run tools/setup.sh (it installs Debian's dataset-fashion-mnist) or "
                                "pass the directory that holds train-images-idx3-ubyte.gz and the other three files"));
    auto const img_path = images_path(opts.dir, opts.split);
    auto const lbl_path = labels_path(opts.dir, opts.split);
    // Compare the headers' counts first: with a limit, the kept counts could agree for mismatched files.
    std::int64_t const n_images = read_idx_dims(img_path).front();
    std::int64_t const n_labels = read_idx_dims(lbl_path).front();
    if (n_images != n_labels)
      throw IoError(detail::cat("Fashion-MNIST ", name(opts.split), " split: ", img_path.string(), " has ", n_images,
                                " images but ", lbl_path.string(), " has ", n_labels,
                                " labels; the files must come from the same split"));
    auto x = read_idx_images(
        img_path, {.normalize_mean = opts.normalize_mean, .normalize_std = opts.normalize_std, .limit = opts.limit});
    auto y = read_idx_labels(lbl_path, {.num_classes = kNumClasses, .limit = opts.limit});
    if (x.size(2) != kRows || x.size(3) != kCols)
      throw IoError(
          detail::cat(img_path.string(), ": images are ", x.size(2), "×", x.size(3), "; Fashion-MNIST's are 28×28"));
    return TensorDataset<std::int32_t>(std::move(x), std::move(y));
  }

 private:
  static std::filesystem::path pick(std::filesystem::path const& dir, std::string_view stem) {
    auto gz = dir / (std::string(stem) + ".gz");
    std::error_code ec;
    if (!std::filesystem::exists(gz, ec) && std::filesystem::exists(dir / stem, ec)) return dir / stem;
    return gz;
  }
};

}  // namespace ddp
