// IDX reader: good plain/gzip files, every kind of defect, Fashion-MNIST loading, and a slice of the real data.
#include <doctest/doctest.h>
#include <zlib.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ddp/data/data.hpp"
#include "ddp/data/fashion_mnist.hpp"
#include "ddp/data/idx.hpp"

using namespace ddp;
namespace fs = std::filesystem;

namespace {

using Bytes = std::vector<unsigned char>;

fs::path temp_dir() {
  char const* t = std::getenv("TEST_TMPDIR");
  fs::path d = fs::path(t ? t : fs::temp_directory_path().string()) / "ddp_idx_test";
  fs::create_directories(d);
  return d;
}

void put_u32(Bytes& b, std::uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<unsigned char>(v >> s));
}

// An IDX image file: magic 0x00000803, n × rows × cols, pixel (i, r, c) = (i * 31 + r * 7 + c) % 256.
Bytes image_file(std::uint32_t n, std::uint32_t rows, std::uint32_t cols) {
  Bytes b;
  put_u32(b, 0x00000803);
  put_u32(b, n);
  put_u32(b, rows);
  put_u32(b, cols);
  for (std::uint32_t i = 0; i < n; ++i)
    for (std::uint32_t r = 0; r < rows; ++r)
      for (std::uint32_t c = 0; c < cols; ++c) b.push_back(static_cast<unsigned char>((i * 31 + r * 7 + c) % 256));
  return b;
}

Bytes label_file(std::vector<unsigned char> const& labels) {
  Bytes b;
  put_u32(b, 0x00000801);
  put_u32(b, static_cast<std::uint32_t>(labels.size()));
  b.insert(b.end(), labels.begin(), labels.end());
  return b;
}

fs::path write_plain(std::string const& name, Bytes const& b) {
  auto const p = temp_dir() / name;
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<char const*>(b.data()), static_cast<std::streamsize>(b.size()));
  REQUIRE(f.good());
  return p;
}

fs::path write_gz(std::string const& name, Bytes const& b) {
  auto const p = temp_dir() / name;
  gzFile f = gzopen(p.c_str(), "wb");
  REQUIRE(f != nullptr);
  if (!b.empty()) REQUIRE(gzwrite(f, b.data(), static_cast<unsigned>(b.size())) == static_cast<int>(b.size()));
  REQUIRE(gzclose(f) == Z_OK);
  return p;
}

Bytes read_all(fs::path const& p) {
  std::ifstream f(p, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), {});
}

// Runs f, which must throw IoError; returns its message.
template <class F>
std::string io_error(F&& f) {
  try {
    f();
  } catch (IoError const& e) {
    return e.what();
  } catch (std::exception const& e) {
    FAIL("expected IoError, got: ", e.what());
  }
  FAIL("expected IoError, nothing was thrown");
  return {};
}

constexpr ImageOptions kRaw{.normalize_mean = 0.0, .normalize_std = 1.0};

}  // namespace

TEST_CASE("good IDX files parse, plain and gzip, with normalisation and limit") {
  auto const img = image_file(5, 4, 3);
  for (auto const& path : {write_plain("good-images", img), write_gz("good-images.gz", img)}) {
    CAPTURE(path.string());
    auto const x = read_idx_images(path, kRaw);
    REQUIRE(x.shape() == Shape{5, 1, 4, 3});
    for (std::int64_t i = 0; i < x.numel(); ++i) CHECK(x[i] == static_cast<float>(img[16 + i]) / 255.0f);
    auto const xn = read_idx_images(path, {.normalize_mean = 0.5, .normalize_std = 0.25});
    for (std::int64_t i = 0; i < x.numel(); ++i)
      CHECK(xn[i] == (static_cast<float>(img[16 + i]) / 255.0f - 0.5f) / 0.25f);
    auto const first2 = read_idx_images(path, {.normalize_mean = 0, .normalize_std = 1, .limit = 2});
    REQUIRE(first2.shape() == Shape{2, 1, 4, 3});
    for (std::int64_t i = 0; i < first2.numel(); ++i) CHECK(first2[i] == x[i]);
    CHECK(read_idx_images(path, {.limit = 99}).size(0) == 5);  // a limit past N keeps all
    CHECK(read_idx_dims(path) == std::vector<std::int64_t>{5, 4, 3});
  }
  auto const lbl = label_file({3, 0, 9, 1});
  for (auto const& path : {write_plain("good-labels", lbl), write_gz("good-labels.gz", lbl)}) {
    auto const y = read_idx_labels(path);
    REQUIRE(y.shape() == Shape{4});
    CHECK(y[0] == 3);
    CHECK(y[2] == 9);
    CHECK(read_idx_labels(path, {.limit = 1}).shape() == Shape{1});
  }
}

TEST_CASE("defective IDX files throw IoError naming the file and the defect") {
  auto const img = image_file(3, 4, 5);  // 60 bytes of data

  SUBCASE("missing file") {
    auto const msg = io_error([] { read_idx_images(temp_dir() / "no-such-file.gz"); });
    CHECK(msg.find("no-such-file.gz: cannot open: no such file") != std::string::npos);
    CHECK(io_error([] { read_idx_images(temp_dir()); }).find("is a directory") != std::string::npos);
  }
  SUBCASE("truncated data, plain and gzip") {
    Bytes cut(img.begin(), img.end() - 10);
    auto const p = write_plain("trunc-images", cut);
    auto msg = io_error([&] { read_idx_images(p); });
    CHECK(msg == p.string() + ": truncated: header says 3×4×5 = 60 bytes of data, found 50");
    auto const g = write_gz("trunc-images.gz", cut);
    msg = io_error([&] { read_idx_images(g); });
    CHECK(msg == g.string() + ": truncated: header says 3×4×5 = 60 bytes of data, found 50 after decompression");
    // A limit does not hide it: the whole file is validated.
    CHECK(io_error([&] { read_idx_images(g, {.limit = 1}); }).find("truncated") != std::string::npos);
    CHECK(io_error([&] { read_idx_images(p, {.limit = 1}); }).find("truncated") != std::string::npos);
  }
  SUBCASE("truncated gzip stream (the .gz file itself cut short)") {
    auto const good = read_all(write_gz("whole.gz", image_file(50, 28, 28)));
    auto const g = write_plain("cut.gz", Bytes(good.begin(), good.begin() + static_cast<long>(good.size() / 2)));
    auto const msg = io_error([&] { read_idx_images(g); });
    CHECK(msg.find(g.string() + ": truncated: header says 50×28×28 = 39200 bytes of data, found") == 0);
    CHECK(msg.find("; the gzip stream ends early (file cut short)") != std::string::npos);
    // Cut inside the 8-byte gzip trailer: all data is there but the CRC is not.
    auto const g2 = write_plain("cut-trailer.gz", Bytes(good.begin(), good.end() - 3));
    CHECK(io_error([&] { read_idx_images(g2); }).find("truncated") != std::string::npos);
  }
  SUBCASE("corrupt gzip data") {
    auto bytes = read_all(write_gz("whole2.gz", image_file(50, 28, 28)));
    for (std::size_t i = bytes.size() / 3; i < bytes.size() / 3 + 8; ++i) bytes[i] ^= 0x5A;
    auto const g = write_plain("corrupt.gz", bytes);
    // zlib's wording depends on where the damage lands (here: "invalid distance too far back").
    CHECK(io_error([&] { read_idx_images(g); }).find(g.string() + ": corrupt gzip data (zlib: ") == 0);
    // One flipped bit in the CRC-32 trailer: the data inflates fine but fails the check.
    auto crc = read_all(write_gz("whole3.gz", image_file(50, 28, 28)));
    crc[crc.size() - 6] ^= 1;
    auto const c = write_plain("bad-crc.gz", crc);
    CHECK(io_error([&] { read_idx_images(c, {.limit = 1}); }) ==
          c.string() + ": corrupt gzip data (zlib: incorrect data check)");
  }
  SUBCASE("truncated header") {
    auto const p = write_plain("short-header", Bytes(img.begin(), img.begin() + 9));
    CHECK(io_error([&] { read_idx_images(p); }) ==
          p.string() + ": truncated: the file ends 9 bytes in, inside the 16-byte IDX header");
    auto const p2 = write_plain("two-bytes", Bytes{0, 0});
    CHECK(io_error([&] { read_idx_images(p2); }).find("truncated: the file has 2 bytes") != std::string::npos);
    auto const p3 = write_gz("empty.gz", Bytes{});
    CHECK(io_error([&] { read_idx_images(p3); }).find("truncated: the file has 0 bytes") != std::string::npos);
  }
  SUBCASE("bad magic") {
    auto bad = img;
    bad[0] = 0x12;
    bad[1] = 0x34;
    auto const p = write_plain("bad-magic.gz", bad);  // a misleading name: it is neither gzip nor IDX
    CHECK(io_error([&] { read_idx_images(p); }) ==
          p.string() + ": bad magic number 0x12340803: not an IDX file (expected 0x00000803 for images)");
  }
  SUBCASE("wrong dtype") {
    auto bad = img;
    bad[2] = 0x0D;
    auto const p = write_gz("float-images.gz", bad);
    CHECK(io_error([&] { read_idx_images(p); }) ==
          p.string() +
              ": magic number 0x00000D03 has dtype byte 0x0D (float32); only 0x08 (uint8) is supported "
              "(expected 0x00000803 for images)");
  }
  SUBCASE("wrong number of dimensions: a label file read as images and the reverse") {
    auto const lp = write_plain("labels-as-images", label_file({1, 2, 3}));
    CHECK(io_error([&] { read_idx_images(lp); }).find("magic number 0x00000801 says 1 dimension, but images have 3") !=
          std::string::npos);
    auto const ip = write_plain("images-as-labels", img);
    CHECK(io_error([&] { read_idx_labels(ip); }).find("says 3 dimensions, but labels have 1") != std::string::npos);
  }
  SUBCASE("zero dimension") {
    auto const p = write_plain("zero-rows", image_file(3, 0, 5));
    CHECK(io_error([&] { read_idx_images(p); }).find("dimension 1 of (N, rows, cols) as 0") != std::string::npos);
  }
  SUBCASE("trailing bytes, plain and gzip") {
    auto longer = img;
    longer.insert(longer.end(), {1, 2, 3, 4, 5});
    auto const p = write_plain("long-images", longer);
    CHECK(io_error([&] { read_idx_images(p); }) ==
          p.string() + ": trailing garbage: header says 3×4×5 = 60 bytes of data, found 65 (5 extra bytes)");
    auto const g = write_gz("long-images.gz", longer);
    CHECK(io_error([&] { read_idx_images(g, {.limit = 1}); }) ==
          g.string() +
              ": trailing garbage: header says 3×4×5 = 60 bytes of data, found 65 (5 extra bytes) after decompression");
  }
  SUBCASE("label out of range") {
    auto const p = write_gz("bad-labels.gz", label_file({1, 2, 10, 3}));
    CHECK(io_error([&] { read_idx_labels(p); }) ==
          p.string() + ": label 10 at index 2 is outside [0, 10) (LabelOptions::num_classes)");
    CHECK(read_idx_labels(p, {.num_classes = 11}).numel() == 4);
  }
  SUBCASE("bad options are ArgumentErrors") {
    auto const p = write_plain("opt-images", img);
    CHECK_THROWS_AS(read_idx_images(p, {.normalize_std = 0}), ArgumentError);
    CHECK_THROWS_AS(read_idx_images(p, {.limit = -1}), ArgumentError);
    CHECK_THROWS_AS(read_idx_labels(p, {.num_classes = 0}), ArgumentError);
  }
}

TEST_CASE("hostile IDX headers are IoErrors naming the file and the field, without allocating what they declare") {
  SUBCASE("a 16-byte file whose dimensions overflow 64 bits") {
    Bytes b;
    for (std::uint32_t v : {0x00000803u, 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu}) put_u32(b, v);
    auto const p = write_plain("overflow-images", b);
    CHECK(io_error([&] { read_idx_images(p); }) ==
          p.string() +
              ": header's dimensions 4294967295×4294967295×4294967295 (N, rows, cols) multiply to more than 1 TiB of "
              "data; the header is corrupt");
    // 2^20 × 2^20 × 2^24 = 2^64 wraps to 0 when multiplied unchecked: such a 16-byte file passed as "0 bytes of
    // data" and then asked for a (2^20, 1, 2^20, 2^24) tensor.
    Bytes wrap;
    for (std::uint32_t v : {0x00000803u, 0x100000u, 0x100000u, 0x1000000u}) put_u32(wrap, v);
    auto const pw = write_plain("wrap-to-zero", wrap);
    CHECK(io_error([&] { read_idx_images(pw); }) ==
          pw.string() +
              ": header's dimensions 1048576×1048576×16777216 (N, rows, cols) multiply to more than 1 TiB of data; "
              "the header is corrupt");
    Bytes four;  // four dimensions: the unchecked product would wrap around 2^64
    for (std::uint32_t v : {0x00000804u, 0x10000u, 0x10000u, 0x10000u, 0x10000u}) put_u32(four, v);
    auto const p4 = write_plain("overflow-4d", four);
    CHECK(io_error([&] { read_idx_dims(p4); }).find(p4.string() + ": header's dimensions 65536×65536×65536×65536") ==
          0);
  }
  SUBCASE("a small gzip file declaring 100 GB: refused by max_data_bytes, or truncated when allowed") {
    Bytes b;
    for (std::uint32_t v : {0x00000803u, 100000u, 1000u, 1000u}) put_u32(b, v);
    b.insert(b.end(), 100, 7);
    auto const g = write_gz("huge-images.gz", b);
    CHECK(io_error([&] { read_idx_images(g); }) ==
          g.string() +
              ": header's dimensions 100000×1000×1000 (N, rows, cols) declare 100000000000 bytes of data, more than "
              "the limit of 17179869184 (ImageOptions::max_data_bytes; raise it for a genuine file this large)");
    // Allowed up to 1 TiB, it must fail as truncated after reading what is there, not allocate 100 GB first.
    CHECK(io_error([&] { read_idx_images(g, {.max_data_bytes = std::uint64_t{1} << 40}); }) ==
          g.string() +
              ": truncated: header says 100000×1000×1000 = 100000000000 bytes of data, found 100 after "
              "decompression");
    Bytes l;
    for (std::uint32_t v : {0x00000801u, 0xFFFFFFFFu}) put_u32(l, v);
    l.insert(l.end(), {1, 2, 3});
    auto const gl = read_all(write_gz("huge-labels.gz", l));
    CHECK(io_error([&] { decode_idx_labels(gl, "huge-labels (memory)"); }) ==
          "huge-labels (memory): truncated: header says 4294967295 = 4294967295 bytes of data, found 3 after "
          "decompression");
    CHECK(io_error([&] {
            decode_idx_labels(gl, "m", {.max_data_bytes = 1000});
          }).find("more than the limit of 1000 (LabelOptions::max_data_bytes;") != std::string::npos);
  }
  SUBCASE("rank 0 and rank 5 magic numbers name the dimension count") {
    Bytes b;
    put_u32(b, 0x00000800);
    auto const p = write_plain("rank0", b);
    CHECK(io_error([&] { read_idx_dims(p); }) ==
          p.string() +
              ": magic number 0x00000800 says 0 dimensions, but uint8 IDX files have 1 to 4 dimensions (expected "
              "magic 0x000008nn)");
    b[3] = 5;
    auto const p5 = write_plain("rank5", b);
    CHECK(io_error([&] { read_idx_dims(p5); }).find("says 5 dimensions") != std::string::npos);
  }
  SUBCASE("/dev/zero (not a regular file) fails at once on its magic number") {
    CHECK(io_error([] { read_idx_images("/dev/zero"); }) ==
          "/dev/zero: magic number 0x00000000 has dtype byte 0x00 (unknown); only 0x08 (uint8) is supported "
          "(expected 0x00000803 for images)");
  }
}

TEST_CASE("gzip framing: concatenated members are one stream, anything else after the stream is an error") {
  auto const img = image_file(3, 4, 5);
  auto first = read_all(write_gz("part1.gz", Bytes(img.begin(), img.begin() + 20)));
  auto const second = read_all(write_gz("part2.gz", Bytes(img.begin() + 20, img.end())));
  auto both = first;
  both.insert(both.end(), second.begin(), second.end());
  auto const x = decode_idx_images(both, "two members", kRaw);
  REQUIRE(x.shape() == Shape{3, 1, 4, 5});
  CHECK(x[59] == static_cast<float>(img.back()) / 255.0f);

  auto whole = read_all(write_gz("whole-images.gz", img));
  auto junk = whole;
  junk.insert(junk.end(), {'j', 'u', 'n', 'k'});
  auto const p = write_plain("junk-after.gz", junk);
  CHECK(io_error([&] { read_idx_images(p); }) ==
        p.string() + ": trailing garbage after the gzip stream: 4 bytes that are not a gzip member");
  junk.resize(whole.size() + 1);  // a single byte cannot even start a member
  CHECK(io_error([&] { decode_idx_images(junk, "m"); }) ==
        "m: trailing garbage after the gzip stream: 1 byte that is not a gzip member");

  auto bad_method = whole;
  bad_method[2] = 7;  // compression method: only 8 (deflate) exists
  CHECK(io_error([&] { decode_idx_images(bad_method, "bad-method.gz"); }) ==
        "bad-method.gz: corrupt gzip data (zlib: unknown compression method)");
}

TEST_CASE("decode_idx_images / decode_idx_labels read bytes in memory exactly as the file readers read files") {
  auto const img = image_file(5, 4, 3);
  auto const lbl = label_file({3, 0, 9, 1});
  auto const from_file = read_idx_images(write_plain("mem-images", img), kRaw);
  auto const gz = read_all(write_gz("mem-images.gz", img));
  for (auto const& bytes : {img, gz}) {
    auto const x = decode_idx_images(bytes, "in memory", kRaw);
    REQUIRE(x.shape() == from_file.shape());
    for (std::int64_t i = 0; i < x.numel(); ++i) CHECK(x[i] == from_file[i]);
  }
  CHECK(decode_idx_labels(lbl, "labels")[2] == 9);
  Bytes cut(img.begin(), img.end() - 1);
  CHECK(io_error([&] { decode_idx_images(cut, "cut (memory)"); }) ==
        "cut (memory): truncated: header says 5×4×3 = 60 bytes of data, found 59");
  CHECK(io_error([&] { decode_idx_images({}, "empty"); }).find("empty: truncated: the file has 0 bytes") == 0);
}

TEST_CASE("FashionMnist::load checks the directory, the image size and that images and labels agree") {
  auto const dir = temp_dir() / "fmnist";
  fs::create_directories(dir);
  write_gz("fmnist/t10k-images-idx3-ubyte.gz", image_file(5, 28, 28));
  write_gz("fmnist/t10k-labels-idx1-ubyte.gz", label_file({0, 1, 2, 3}));
  auto msg = io_error([&] { FashionMnist::load({.dir = dir, .split = Split::kTest, .limit = 2}); });
  CHECK(msg.find("has 5 images but") != std::string::npos);
  CHECK(msg.find("t10k-labels-idx1-ubyte.gz has 4 labels") != std::string::npos);

  write_gz("fmnist/t10k-labels-idx1-ubyte.gz", label_file({0, 1, 2, 3, 9}));
  auto const ds = FashionMnist::load({.dir = dir, .split = Split::kTest});
  CHECK(ds.size() == 5);
  CHECK(ds.y()[4] == 9);

  write_gz("fmnist/t10k-images-idx3-ubyte.gz", image_file(5, 28, 27));
  CHECK(io_error([&] { FashionMnist::load({.dir = dir, .split = Split::kTest}); }).find("are 28×27") !=
        std::string::npos);

  msg = io_error([&] { FashionMnist::load({.dir = dir / "absent"}); });
  CHECK(msg.find("does not exist: run tools/setup.sh") != std::string::npos);
  // The train split is missing from this directory.
  CHECK(io_error([&] { FashionMnist::load({.dir = dir}); }).find("train-images-idx3-ubyte.gz: cannot open") !=
        std::string::npos);
}

TEST_CASE("the real Fashion-MNIST files (installed by tools/setup.sh): first 100 test samples") {
  fs::path const dir(kFashionMnistDefaultDir);
  REQUIRE_MESSAGE(fs::is_directory(dir), dir.string(),
                  " does not exist: run tools/setup.sh (it installs Debian's dataset-fashion-mnist)");
  CHECK(read_idx_dims(FashionMnist::images_path(dir, Split::kTest)) == std::vector<std::int64_t>{10000, 28, 28});
  CHECK(read_idx_dims(FashionMnist::labels_path(dir, Split::kTest)) == std::vector<std::int64_t>{10000});
  auto const ds = FashionMnist::load({.split = Split::kTest, .limit = 100});
  REQUIRE(ds.x().shape() == Shape{100, 1, 28, 28});
  REQUIRE(ds.y().shape() == Shape{100});
  float const lo = (0.0f - 0.2860f) / 0.3530f, hi = (1.0f - 0.2860f) / 0.3530f;
  float mn = hi, mx = lo;
  double mean = 0;
  for (std::int64_t i = 0; i < ds.x().numel(); ++i) {
    float const v = ds.x()[i];
    mn = std::min(mn, v);
    mx = std::max(mx, v);
    mean += v;
  }
  mean /= static_cast<double>(ds.x().numel());
  CHECK(mn == lo);              // background pixels are 0
  CHECK(mx == hi);              // and some pixel is saturated
  CHECK(std::abs(mean) < 0.3);  // normalised with the dataset's own statistics
  std::vector<int> per_class(10, 0);
  for (std::int64_t i = 0; i < 100; ++i) {
    REQUIRE((ds.y()[i] >= 0 && ds.y()[i] < 10));
    ++per_class[static_cast<std::size_t>(ds.y()[i])];
  }
  for (int c : per_class) CHECK(c > 0);  // 100 test samples cover all 10 classes
  CHECK(ds.y()[0] == 9);                 // the first test image is an ankle boot
}

TEST_CASE("the mlp fixture's inputs are the first 256 training images, normalised as read_idx_images does") {
  fs::path const dir(kFashionMnistDefaultDir);
  REQUIRE_MESSAGE(fs::is_directory(dir), dir.string(),
                  " does not exist: run tools/setup.sh (it installs Debian's dataset-fashion-mnist)");
  auto const ds = FashionMnist::load({.split = Split::kTrain, .limit = 256});
  std::ifstream fx("test/fixtures/mlp/data_x.bin", std::ios::binary),
      fy("test/fixtures/mlp/data_y.bin", std::ios::binary);
  REQUIRE(fx.good());
  REQUIRE(fy.good());
  std::vector<float> x(256 * 784);
  std::vector<std::int32_t> y(256);
  fx.read(reinterpret_cast<char*>(x.data()), static_cast<std::streamsize>(x.size() * sizeof(float)));
  fy.read(reinterpret_cast<char*>(y.data()), static_cast<std::streamsize>(y.size() * sizeof(std::int32_t)));
  REQUIRE(fx.gcount() == static_cast<std::streamsize>(x.size() * sizeof(float)));
  float maxdiff = 0;
  for (std::size_t i = 0; i < x.size(); ++i)
    maxdiff = std::max(maxdiff, std::abs(x[i] - ds.x()[static_cast<std::int64_t>(i)]));
  CHECK(maxdiff == 0.0f);  // bitwise: the same float operations as torchvision's ToTensor + Normalize
  for (std::size_t i = 0; i < y.size(); ++i) CHECK(y[i] == ds.y()[static_cast<std::int64_t>(i)]);
}
