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
#include <cstring>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#include <random>
#include <string>
#include <vector>

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
}  // namespace

int main(int argc, char** argv) {
  int in = 32, out = 224;
  double seconds = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--in")) in = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--out")) out = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--seconds")) seconds = std::atof(argv[i + 1]);
  }
  cv::setNumThreads(1);
  constexpr int kImages = 64;
  std::mt19937 g(1);
  std::vector<std::vector<uint8_t>> imgs(kImages, std::vector<uint8_t>(size_t(in) * in * 3));
  for (auto& im : imgs)
    for (auto& p : im) p = static_cast<uint8_t>(g());

  nl::TransformConfig c;
  c.image_size = out;
  nl::SampleTransform ours(c);
  std::vector<uint8_t> dst(ours.SampleBytes());
  c.isa = nl::Isa::kScalar;
  nl::SampleTransform scalar(c);
  cv::Mat cv_out(out, out, CV_8UC3);
  // Alternate the contenders in short rounds and keep each one's best round,
  // so a noisy neighbour on the machine hurts neither side more.
  constexpr int kRounds = 5;
  double ours_rate = 0, scalar_rate = 0, cv_rate = 0;
  for (int round = 0; round < kRounds; ++round) {
    ours_rate = std::max(
        ours_rate,
        PerSecond([&](int i) { ours.Apply(imgs[i % kImages].data(), in, in, 0, 0, dst.data()); },
                  seconds / kRounds));
    cv_rate =
        std::max(cv_rate, PerSecond(
                              [&](int i) {
                                cv::Mat src(in, in, CV_8UC3, imgs[i % kImages].data());
                                cv::resize(src, cv_out, cv::Size(out, out), 0, 0, cv::INTER_LINEAR);
                              },
                              seconds / kRounds));
  }
  scalar_rate =
      PerSecond([&](int i) { scalar.Apply(imgs[i % kImages].data(), in, in, 0, 0, dst.data()); },
                seconds / kRounds);

  // How close the two are (OpenCV does not antialias and rounds differently).
  ours.Apply(imgs[0].data(), in, in, 0, 0, dst.data());
  cv::Mat src(in, in, CV_8UC3, imgs[0].data());
  cv::resize(src, cv_out, cv::Size(out, out), 0, 0, cv::INTER_LINEAR);
  int worst = 0;
  const size_t plane = size_t(out) * out;
  for (size_t p = 0; p < plane; ++p)
    for (int ch = 0; ch < 3; ++ch)
      worst = std::max(worst, std::abs(int(dst[ch * plane + p]) - int(cv_out.data[p * 3 + ch])));

  std::printf("resize %dx%d -> %dx%d RGB, 1 thread (OpenCV %s, %s)\n", in, in, out, out, CV_VERSION,
              nl::BestIsa() == nl::Isa::kAvx2 ? "ours with AVX2" : "ours scalar");
  std::printf("  ours (Pillow-exact, HWC -> NCHW)   %9.0f images/s  %6.1f us/image\n", ours_rate,
              1e6 / ours_rate);
  std::printf("  ours, scalar path                  %9.0f images/s  %6.1f us/image\n", scalar_rate,
              1e6 / scalar_rate);
  std::printf("  OpenCV cv::resize INTER_LINEAR     %9.0f images/s  %6.1f us/image\n", cv_rate,
              1e6 / cv_rate);
  std::printf("  ours / OpenCV = %.2fx   (largest pixel difference between them: %d)\n",
              ours_rate / cv_rate, worst);
  return 0;
}
