// For the staging tests: a ring producer in a forked child process that
// publishes batches with a known pattern, and the pattern itself, so a test
// can check every byte the consumer side sees.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "loader/ring/client.h"

namespace nl::staging_test {

struct ProducerPlan {
  std::string job_id;  // UniqueJobId()
  int rank = 0;
  uint32_t slots = 3;
  uint32_t batch_size = 4;
  uint32_t height = 8, width = 8;  // 3 channels, uint8, NCHW
  uint64_t batches_per_epoch = 5;
  uint32_t last_batch_size = 3;  // the epoch's last batch is short
  uint64_t epochs = 2;
  // After publishing this many batches, end with ProducerState::kError and
  // `error_text` (the consumer reports it) and exit 3.
  uint64_t fail_after = UINT64_MAX;
  std::string error_text;
};

// A job id no other test (or run) uses: "staging-<pid>-<name>-<n>".
std::string UniqueJobId(const std::string& name);

uint64_t SampleBytes(const ProducerPlan& p);
uint32_t BatchSizeOf(const ProducerPlan& p, uint64_t batch);
// The pattern: byte k of sample s of (epoch, batch), its label and index.
uint8_t PixelByte(uint64_t epoch, uint64_t batch, uint32_t sample, uint64_t k);
int64_t LabelOf(uint64_t epoch, uint64_t batch, uint32_t sample);
int64_t IndexOf(uint64_t epoch, uint64_t batch, uint32_t sample);

// Empty when `pixels`/`labels`/`indices` (host memory) hold exactly the
// pattern of (epoch, batch); else what differs first.
std::string DiffFromPattern(const ProducerPlan& p, uint64_t epoch, uint64_t batch,
                            const void* pixels, const int64_t* labels, const int64_t* indices);

// The producer, forked at construction. It publishes epochs * batches_per_epoch
// batches in order, ends the stream, and exits 0 once the consumer has gone
// (1 on any error, printed to stderr). The destructor kills (SIGKILL) and
// reaps it if it is still running.
class ForkedProducer {
 public:
  explicit ForkedProducer(const ProducerPlan& plan);
  ~ForkedProducer();
  ForkedProducer(const ForkedProducer&) = delete;
  ForkedProducer& operator=(const ForkedProducer&) = delete;

  pid_t pid() const { return pid_; }
  // Waits up to timeout_s for the child to exit; its exit code, or -1 when it
  // is still running (then killed) or died of a signal.
  int Wait(double timeout_s);

 private:
  pid_t pid_ = -1;
};

}  // namespace nl::staging_test
