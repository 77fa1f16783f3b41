#include "loader/staging/staging_test_producer.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "loader/ring/producer.h"

namespace nl::staging_test {

std::string UniqueJobId(const std::string& name) {
  static std::atomic<int> counter{0};
  return "staging-" + std::to_string(getpid()) + "-" + name + "-" + std::to_string(counter++);
}

uint64_t SampleBytes(const ProducerPlan& p) { return uint64_t{3} * p.height * p.width; }

uint32_t BatchSizeOf(const ProducerPlan& p, uint64_t batch) {
  return batch + 1 == p.batches_per_epoch ? p.last_batch_size : p.batch_size;
}

uint8_t PixelByte(uint64_t epoch, uint64_t batch, uint32_t sample, uint64_t k) {
  uint64_t x = (epoch * 1000003u + batch * 10007u + sample * 101u + k) * 0x9E3779B97F4A7C15ull;
  return static_cast<uint8_t>(x >> 56);
}
int64_t LabelOf(uint64_t epoch, uint64_t batch, uint32_t sample) {
  return static_cast<int64_t>(epoch * 1000000 + batch * 1000 + sample);
}
int64_t IndexOf(uint64_t epoch, uint64_t batch, uint32_t sample) {
  return static_cast<int64_t>(epoch * 7777 + batch * 97 + sample * 3 + 1);
}

std::string DiffFromPattern(const ProducerPlan& p, uint64_t epoch, uint64_t batch,
                            const void* pixels, const int64_t* labels, const int64_t* indices) {
  const std::string at =
      "(epoch " + std::to_string(epoch) + ", batch " + std::to_string(batch) + ")";
  if (pixels == nullptr || labels == nullptr || indices == nullptr) return at + ": null pointer";
  const uint32_t n = BatchSizeOf(p, batch);
  const uint64_t sb = SampleBytes(p);
  const auto* px = static_cast<const uint8_t*>(pixels);
  for (uint32_t s = 0; s < n; ++s) {
    for (uint64_t k = 0; k < sb; ++k) {
      uint8_t want = PixelByte(epoch, batch, s, k);
      if (px[s * sb + k] != want) {
        return at + ": sample " + std::to_string(s) + " byte " + std::to_string(k) + " is " +
               std::to_string(px[s * sb + k]) + ", want " + std::to_string(want);
      }
    }
    if (labels[s] != LabelOf(epoch, batch, s)) {
      return at + ": label of sample " + std::to_string(s) + " is " + std::to_string(labels[s]);
    }
    if (indices[s] != IndexOf(epoch, batch, s)) {
      return at + ": index of sample " + std::to_string(s) + " is " + std::to_string(indices[s]);
    }
  }
  return "";
}

namespace {

Status RunProducer(const ProducerPlan& plan) {
  RingSpec spec;
  spec.job_id = plan.job_id;
  spec.rank = plan.rank;
  spec.batches_per_epoch = plan.batches_per_epoch;
  spec.epochs = plan.epochs;
  NL_ASSIGN_OR_RETURN(spec.geometry,
                      ring::MakeGeometry(plan.slots, plan.batch_size, plan.height, plan.width,
                                         ring::Dtype::kUint8, ring::PixelLayout::kNCHW));
  NL_ASSIGN_OR_RETURN(auto producer, RingProducer::Create(spec));
  NL_RETURN_IF_ERROR(producer->WaitForConsumer(30.0, nullptr));
  uint64_t sequence = 0;
  for (uint64_t e = 0; e < plan.epochs; ++e) {
    for (uint64_t b = 0; b < plan.batches_per_epoch; ++b, ++sequence) {
      if (sequence == plan.fail_after) {
        producer->Finish(ring::ProducerState::kError, plan.error_text);
        _exit(3);
      }
      NL_RETURN_IF_ERROR(producer->WaitForFreeSlot(30.0, nullptr));
      BatchBuffer buf = producer->slot_buffer(producer->next_slot());
      const uint32_t n = BatchSizeOf(plan, b);
      const uint64_t sb = SampleBytes(plan);
      for (uint32_t s = 0; s < n; ++s) {
        for (uint64_t k = 0; k < sb; ++k) buf.pixels[s * sb + k] = PixelByte(e, b, s, k);
        buf.labels[s] = LabelOf(e, b, s);
        buf.indices[s] = IndexOf(e, b, s);
      }
      BatchMeta meta;
      meta.sequence = sequence;
      meta.epoch = e;
      meta.batch = b;
      meta.size = n;
      NL_RETURN_IF_ERROR(producer->Publish(meta, producer->request().id));
    }
  }
  producer->Finish(ring::ProducerState::kEnd, "");
  // Stay (and keep the stream's end visible as an end, not a death) until the
  // consumer detaches.
  for (int i = 0; i < 600 && !producer->ConsumerGone(); ++i) producer->WaitForConsumerEvent(0.1);
  return Status::Ok();
}

}  // namespace

ForkedProducer::ForkedProducer(const ProducerPlan& plan) {
  std::fflush(nullptr);
  pid_ = fork();
  if (pid_ == 0) {
    Status s = RunProducer(plan);
    if (!s.ok())
      std::fprintf(stderr, "test producer %s: %s\n", plan.job_id.c_str(), s.ToString().c_str());
    std::fflush(stderr);
    _exit(s.ok() ? 0 : 1);
  }
}

ForkedProducer::~ForkedProducer() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

int ForkedProducer::Wait(double timeout_s) {
  if (pid_ <= 0) return -1;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (true) {
    int st = 0;
    pid_t r = waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    }
    if (r < 0 || std::chrono::steady_clock::now() > deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace nl::staging_test
