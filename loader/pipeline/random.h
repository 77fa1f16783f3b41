// Counter-based randomness: every random choice of the loader is a pure
// function of (seed, stream ids), never of thread timing.
#pragma once

#include <cstdint>

namespace nl {

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A small generator for one stream, e.g. Rng(seed, epoch, sample_index).
class Rng {
 public:
  explicit Rng(uint64_t a, uint64_t b = 0, uint64_t c = 0)
      : state_(SplitMix64(SplitMix64(SplitMix64(a) ^ b) ^ c)) {}
  uint64_t Next() {
    state_ += 0x9E3779B97F4A7C15ull;
    return SplitMix64(state_);
  }
  // Uniform in [0, n), n > 0 (rejection sampling: no modulo bias).
  uint64_t Below(uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do {
      x = Next();
    } while (x >= limit);
    return x % n;
  }
  // Uniform in [0, 1).
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }

 private:
  uint64_t state_;
};

}  // namespace nl
