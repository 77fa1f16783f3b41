// The resize kernel against OpenCV's cv::resize(INTER_LINEAR), one thread,
// same input (32x32 RGB, interleaved) and output size (224x224):
//  - ours: the loader's eval transform, HWC uint8 in -> NCHW uint8 out (what
//    a batch slot receives), Pillow-exact;
//  - OpenCV: HWC in -> HWC out (its native layout; no channel split).
// Each is timed in alternating rounds; the best round of each is reported.
// Usage: resize_bench [--in 32] [--out 224] [--seconds 2]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#include <random>
#include <string>
#include <vector>

#include "base/parse_number.h"
#include "loader/pipeline/transforms.h"

namespace {
using Clock = std::chrono::steady_clock;

template <typename F>
double PerSecond(F&& f, double seconds) {
  // Warm up, then run for `seconds`.
  for (int i = 0; i < 100; ++i) f(i);
  uint64_t n = 0;
  const auto t0 = Clock::now();
  double el = 0;
  while (el < seconds) {
    for (int i = 0; i < 200; ++i) f(static_cast<int>(n++));
    el = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  return n / el;
}
// --in, --out and --seconds; an error names the flag and quotes its text.
nl::Status ParseArgs(int argc, char** argv, int* in, int* out, double* seconds) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--in" || flag == "--out") {
      const nl::Result<int64_t> v = nl::ParseInt(argv[i + 1], flag, 1, 8192);
      if (!v.ok()) return v.status();
      *(flag == "--in" ? in : out) = static_cast<int>(*v);
    } else if (flag == "--seconds") {
      const nl::Result<double> v = nl::ParseDouble(argv[i + 1], flag, 0.01, 3600);
      if (!v.ok()) return v.status();
      *seconds = *v;
    }
  }
  return nl::Status::Ok();
}

struct Rates {
  double ours = 0, scalar = 0, cv = 0;
};

// Alternates the contenders in short rounds and keeps each one's best round,
// so a noisy neighbour on the machine hurts neither side more.
Rates Measure(const std::vector<std::vector<uint8_t>>& imgs, int in, int out, double seconds) {
  const int n = static_cast<int>(imgs.size());
  nl::TransformConfig c;
  c.image_size = out;
  nl::SampleTransform ours(c);
  std::vector<uint8_t> dst(ours.SampleBytes());
  c.isa = nl::Isa::kScalar;
  nl::SampleTransform scalar(c);
  cv::Mat cv_out(out, out, CV_8UC3);
  constexpr int kRounds = 5;
  Rates r;
  for (int round = 0; round < kRounds; ++round) {
    r.ours = std::max(
        r.ours, PerSecond([&](int i) { ours.Apply(imgs[i % n].data(), in, in, 0, 0, dst.data()); },
                          seconds / kRounds));
    r.cv = std::max(r.cv, PerSecond(
                              [&](int i) {
                                cv::Mat src(in, in, CV_8UC3,
                                            const_cast<uint8_t*>(imgs[i % n].data()));
                                cv::resize(src, cv_out, cv::Size(out, out), 0, 0, cv::INTER_LINEAR);
                              },
                              seconds / kRounds));
  }
  r.scalar = PerSecond([&](int i) { scalar.Apply(imgs[i % n].data(), in, in, 0, 0, dst.data()); },
                       seconds / kRounds);
  return r;
}

// How close the two are (OpenCV does not antialias and rounds differently):
// the largest difference of a pixel's channel.
int WorstDifference(std::vector<uint8_t>& img, int in, int out) {
  nl::TransformConfig c;
  c.image_size = out;
  nl::SampleTransform ours(c);
  std::vector<uint8_t> dst(ours.SampleBytes());
  ours.Apply(img.data(), in, in, 0, 0, dst.data());
  cv::Mat src(in, in, CV_8UC3, img.data());
  cv::Mat cv_out(out, out, CV_8UC3);
  cv::resize(src, cv_out, cv::Size(out, out), 0, 0, cv::INTER_LINEAR);
  int worst = 0;
  const size_t plane = size_t(out) * out;
  for (size_t p = 0; p < plane; ++p)
    for (int ch = 0; ch < 3; ++ch)
      worst = std::max(worst, std::abs(int(dst[ch * plane + p]) - int(cv_out.data[p * 3 + ch])));
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  int in = 32, out = 224;
  double seconds = 2;
  if (const nl::Status st = ParseArgs(argc, argv, &in, &out, &seconds); !st.ok()) {
    std::fprintf(stderr, "resize_bench: error: %s\n", st.ToString().c_str());
    return 1;
  }
  cv::setNumThreads(1);
  constexpr int kImages = 64;
  std::mt19937 g(1);
  std::vector<std::vector<uint8_t>> imgs(kImages, std::vector<uint8_t>(size_t(in) * in * 3));
  for (auto& im : imgs)
    for (auto& p : im) p = static_cast<uint8_t>(g());
  const Rates r = Measure(imgs, in, out, seconds);
  const int worst = WorstDifference(imgs[0], in, out);
  std::printf("resize %dx%d -> %dx%d RGB, 1 thread (OpenCV %s, %s)\n", in, in, out, out, CV_VERSION,
              nl::BestIsa() == nl::Isa::kAvx2 ? "ours with AVX2" : "ours scalar");
  std::printf("  ours (Pillow-exact, HWC -> NCHW)   %9.0f images/s  %6.1f us/image\n", r.ours,
              1e6 / r.ours);
  std::printf("  ours, scalar path                  %9.0f images/s  %6.1f us/image\n", r.scalar,
              1e6 / r.scalar);
  std::printf("  OpenCV cv::resize INTER_LINEAR     %9.0f images/s  %6.1f us/image\n", r.cv,
              1e6 / r.cv);
  std::printf("  ours / OpenCV = %.2fx   (largest pixel difference between them: %d)\n",
              r.ours / r.cv, worst);
  return 0;
}
