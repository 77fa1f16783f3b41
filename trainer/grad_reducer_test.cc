// GradReducer over a real Gloo process group: two ranks as two threads of
// this process (an in-memory store for the rendezvous, Gloo's own TCP pairs
// on loopback for the collectives).
#include "trainer/grad_reducer.h"

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <functional>
#include <mutex>
#include <thread>

namespace nl::trainer {
namespace {

constexpr int kWorld = 2;

// A small model as plain leaf tensors: one parameter the forward never uses
// (registered first, so last in the buckets' reverse order), then three layers.
struct Net {
  std::vector<at::Tensor> params;
  explicit Net(uint64_t seed) {
    static std::mutex mu;  // the generator is the process's: one net at a time
    std::lock_guard<std::mutex> lock(mu);
    at::manual_seed(static_cast<int64_t>(seed));
    for (auto shape : std::vector<std::vector<int64_t>>{{5}, {16, 8}, {16}, {16, 16}, {16}, {4, 16}, {4}}) {
      params.push_back(at::randn(shape).set_requires_grad(true));
    }
  }
  at::Tensor Loss(const at::Tensor& x, const at::Tensor& y) const {
    at::Tensor h = at::relu(at::linear(x, params[1], params[2]));
    h = at::relu(at::linear(h, params[3], params[4]));
    return at::cross_entropy_loss(at::linear(h, params[5], params[6]), y);
  }
};

at::Tensor Inputs(int rank) { return at::arange(rank * 64, rank * 64 + 64).reshape({8, 8}).to(at::kFloat).div(100); }
at::Tensor Labels(int rank) { return at::arange(rank, rank + 8).remainder(4); }

// Runs body(rank, comm) on kWorld threads, each with its own process group.
void OnRanks(const std::function<void(int, Comm&)>& body) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::thread> threads;
  std::vector<std::string> errors(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto opts = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(30));
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
        Comm comm(c10::make_intrusive<c10d::ProcessGroupGloo>(store, r, kWorld, opts), kWorld,
                  std::chrono::seconds(30), nullptr);
        body(r, comm);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// The mean of the ranks' gradients, computed on one thread without any reducer.
std::vector<at::Tensor> ExpectedMean() {
  std::vector<at::Tensor> sum;
  for (int r = 0; r < kWorld; ++r) {
    Net n(7);
    n.Loss(Inputs(r), Labels(r)).backward();
    for (size_t i = 0; i < n.params.size(); ++i) {
      at::Tensor g = n.params[i].grad().defined() ? n.params[i].grad() : at::zeros_like(n.params[i]);
      if (sum.size() <= i) {
        sum.push_back(g.clone());
      } else {
        sum[i] += g;
      }
    }
  }
  for (auto& g : sum) g /= kWorld;
  return sum;
}

struct Outcome {
  std::vector<std::vector<at::Tensor>> grads{kWorld};
  std::vector<size_t> launched_in_backward = std::vector<size_t>(kWorld);
  std::vector<size_t> buckets = std::vector<size_t>(kWorld);
  std::vector<ReduceTimes> times = std::vector<ReduceTimes>(kWorld);
  bool views = true;
};

// Two steps on each rank (the second after the grads were zeroed in place,
// or set to none when drop_grads), with buckets of bucket_bytes.
Outcome Train(ReduceMode mode, int64_t bucket_bytes, bool drop_grads) {
  Outcome out;
  std::mutex mu;
  OnRanks([&](int r, Comm& comm) {
    Net n(7);
    GradReducer red(n.params, bucket_bytes, &comm, mode);
    for (int step = 0; step < 2; ++step) {
      for (auto& p : n.params) {
        if (drop_grads) {
          p.mutable_grad() = at::Tensor();
        } else if (p.grad().defined()) {
          p.mutable_grad().zero_();
        }
      }
      red.Begin();
      n.Loss(Inputs(r), Labels(r)).backward();
      const size_t early = red.launched();
      const ReduceTimes t = red.Finish("the test's all-reduce");
      std::lock_guard<std::mutex> lock(mu);
      out.launched_in_backward[r] = early;
      out.times[r] = t;
    }
    std::lock_guard<std::mutex> lock(mu);
    out.buckets[r] = red.buckets();
    for (size_t i = 0; i < n.params.size(); ++i) {
      out.grads[r].push_back(n.params[i].grad().clone());
      out.views = out.views && red.IsView(i);
    }
  });
  return out;
}

void ExpectMean(const Outcome& o) {
  const std::vector<at::Tensor> want = ExpectedMean();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(o.grads[r].size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_TRUE(at::allclose(o.grads[r][i], want[i], 1e-5, 1e-6)) << "rank " << r << " parameter " << i;
    }
  }
}

TEST(GradReducer, OverlappedBucketsStartDuringBackwardAndAverage) {
  const Outcome o = Train(ReduceMode::kOverlap, 1, false);  // a bucket per parameter
  EXPECT_EQ(o.buckets[0], 7u);
  ExpectMean(o);
  EXPECT_TRUE(o.views) << "every .grad stays a view of its bucket";
  for (int r = 0; r < kWorld; ++r) {
    // The six used parameters' buckets start while backward runs; the unused
    // one's (its zeros, averaged too) when Finish finds it never filled.
    EXPECT_EQ(o.launched_in_backward[r], 6u) << "rank " << r;
    EXPECT_GE(o.times[r].allreduce_ms, 0);
    EXPECT_GE(o.times[r].exposed_ms, 0);
    EXPECT_TRUE(at::equal(o.grads[r].front(), at::zeros({5})));
  }
}

TEST(GradReducer, ABucketWithAnUnusedParameterHoldsBackItselfAndEveryLaterOne) {
  const Outcome o = Train(ReduceMode::kOverlap, 1 << 20, false);  // one bucket, the unused parameter in it
  EXPECT_EQ(o.buckets[0], 1u);
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(o.launched_in_backward[r], 0u);
  ExpectMean(o);
}

TEST(GradReducer, AfterBackwardGivesTheSameGradientsAndStartsNothingEarly) {
  const Outcome a = Train(ReduceMode::kAfterBackward, 1, false);
  const Outcome b = Train(ReduceMode::kOverlap, 1, false);
  ExpectMean(a);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(a.launched_in_backward[r], 0u);
    for (size_t i = 0; i < a.grads[r].size(); ++i) EXPECT_TRUE(at::equal(a.grads[r][i], b.grads[r][i])) << i;
  }
}

TEST(GradReducer, GradientsSetToNoneAreViewsAgainAtTheNextStep) {
  const Outcome o = Train(ReduceMode::kOverlap, 1, true);
  ExpectMean(o);
  EXPECT_TRUE(o.views);
}

TEST(GradReducer, AFrozenParameterIsLeftOut) {
  OnRanks([&](int r, Comm& comm) {
    Net n(7);
    std::vector<at::Tensor> with_frozen = n.params;
    with_frozen.push_back(at::ones({3}));  // requires no gradient: no bucket, no hook
    GradReducer red(with_frozen, 1, &comm, ReduceMode::kOverlap);
    EXPECT_EQ(red.buckets(), n.params.size());
    red.Begin();
    n.Loss(Inputs(r), Labels(r)).backward();
    red.Finish("the test's all-reduce");
    EXPECT_FALSE(with_frozen.back().grad().defined());
  });
}

}  // namespace
}  // namespace nl::trainer
