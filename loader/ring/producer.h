// The producer side of a rank's ring: makes the unnamed segment, listens on
// the rank's abstract socket, hands the segment to one consumer of the same
// uid, and publishes batches into slots in order.
//
//   RingSpec spec;  spec.job_id = "job1";  spec.rank = 0;
//   NL_ASSIGN_OR_RETURN(spec.geometry, ring::MakeGeometry(4, 64, 224, 224, kUint8, kNCHW));
//   NL_ASSIGN_OR_RETURN(auto p, RingProducer::Create(spec));
//   NL_RETURN_IF_ERROR(p->WaitForConsumer(-1, stop));
//   for (uint64_t i = 0;; ++i) {
//     NL_RETURN_IF_ERROR(p->WaitForFreeSlot(60.0, stop));   // slot of position p->published()
//     BatchBuffer b = p->slot_buffer(p->next_slot());
//     Fill(b);  ...
//     NL_RETURN_IF_ERROR(p->Publish(meta, p->request().id));
//   }
//   p->Finish(ring::ProducerState::kEnd, "");
//
// Threads: Publish/WaitForFreeSlot from one thread; FreedSince, request(),
// SetActivity and Finish may be called from others (they lock the ring).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "base/status.h"
#include "loader/pipeline/pipeline.h"
#include "loader/ring/ring_layout.h"

namespace nl {

struct RingSpec {
  std::string job_id;
  int rank = 0;
  ring::Geometry geometry;  // from ring::MakeGeometry
  uint64_t batches_per_epoch = 0;
  uint64_t epochs = 0;  // 0: unbounded
  uint64_t first_epoch = 0;
  uint64_t first_batch = 0;
  // Where refusals and warnings go (one line each); stderr when empty.
  std::function<void(const std::string&)> log;
};

class RingProducer {
 public:
  // Creates the sealed memfd segment and binds the abstract socket.
  // AlreadyExists when another producer serves (job_id, rank).
  static Result<std::unique_ptr<RingProducer>> Create(const RingSpec& spec);
  ~RingProducer();
  RingProducer(const RingProducer&) = delete;
  RingProducer& operator=(const RingProducer&) = delete;

  // Waits up to timeout_s (< 0: no limit) for a consumer of our uid; others
  // are told why and refused. `stop` (may be null) is polled every 100 ms:
  // Aborted when it turns true.
  Status WaitForConsumer(double timeout_s, const std::atomic<bool>* stop);
  int consumer_pid() const;

  ring::Header* header() const;
  uint32_t slot_count() const;
  BatchBuffer slot_buffer(uint32_t slot) const;  // pixels, labels, indices, meta of a slot

  // The position the next Publish() gets, and its slot (position % slot_count).
  uint64_t published() const;
  uint32_t next_slot() const;

  // Waits until the next position's slot is free. DeadlineExceeded after
  // timeout_s (< 0: no limit) with the consumer alive; Unavailable when the
  // consumer is gone; Aborted when *stop turns true.
  Status WaitForFreeSlot(double timeout_s, const std::atomic<bool>* stop);
  // Publishes the next slot (its pixels, labels and indices written) with
  // `meta` and the request it answers.
  Status Publish(const BatchMeta& meta, uint64_t generation);

  // The consumer's latest request (a seek bumps id; batches carry it as
  // their generation).
  struct Request {
    uint64_t id = 0, epoch = 0, batch = 0;
  };
  Request request() const;
  // After a seek: takes back every published slot the consumer has not
  // taken, once it holds none (waits up to timeout_s), marks `id` served and
  // the stream running again (after an end).
  Status Reclaim(uint64_t id, double timeout_s, const std::atomic<bool>* stop);

  // Blocks until the consumer frees a slot or makes a request, or timeout_s
  // passes.
  void WaitForConsumerEvent(double timeout_s);
  // Whether the slot of `position` is free again (the consumer released it,
  // or it was reclaimed).
  bool IsFree(uint64_t position) const;

  void SetActivity(ring::Activity a, uint64_t epoch = 0, uint64_t batch = 0);
  // Ends the stream: kEnd (a seek may restart it), kError or kStopped with
  // the text the consumer reports.
  void Finish(ring::ProducerState state, const std::string& error);

  // True once the consumer's connection has closed; `detached` says whether
  // it said goodbye first. Non-blocking.
  bool ConsumerGone(bool* detached = nullptr);
  // The connection's descriptor (poll it for POLLIN / POLLHUP) and the
  // listening socket's (later consumers are refused through it).
  int connection_fd() const;
  // What a consumer that refused the ring said (empty when none did).
  std::string refusal() const;
  int listen_fd() const;
  // Accepts and refuses one pending connection (a second consumer).
  void RefuseOne();

  struct Impl;

 private:
  explicit RingProducer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace nl
