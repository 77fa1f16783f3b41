// The consumer side of a rank's ring, in C++ (the C API in nl_client.h wraps
// this class; the Python package wraps the C API).
//
//   NL_ASSIGN_OR_RETURN(auto client, RingClient::Attach("job1", 0, 30.0));
//   while (true) {
//     Result<RingBatch> b = client->Next(60.0);  // OutOfRange: the last epoch is out
//     if (!b.ok()) ...;                           // Unavailable: producer gone, with its error text
//     Train(b->pixels, b->labels, b->size);       // DeadlineExceeded: alive but stuck
//     NL_RETURN_IF_ERROR(client->Release(*b));
//   }
//
// A RingBatch views the shared slot: valid until it is released or the client
// is destroyed (which detaches: the producer then exits cleanly).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"
#include "loader/ring/ring_layout.h"

namespace nl {

struct RingBatch {
  const void* pixels = nullptr;  // size * sample_bytes
  const int64_t* labels = nullptr;
  const int64_t* indices = nullptr;
  uint32_t size = 0;
  uint32_t slot = 0;
  uint64_t epoch = 0, batch = 0;
  uint64_t sequence = 0;  // 0, 1, ... over this client's batches
  uint64_t position = 0;  // the ring's publication number (identifies the slot's use)
  double wait_s = 0;      // time Next() spent waiting for the producer (not ring cost)
};

struct RingInfo {
  ring::Geometry geometry;
  std::string job_id;
  int rank = 0;
  int producer_pid = 0;
  uint64_t batches_per_epoch = 0;
  uint64_t epochs = 0;  // 0: unbounded
};

class RingClient {
 public:
  // Connects to the abstract socket of (job_id, rank), waiting up to
  // timeout_s for a producer to appear; checks its uid and the segment.
  static Result<std::unique_ptr<RingClient>> Attach(const std::string& job_id, int rank,
                                                    double timeout_s);
  ~RingClient();  // detaches (a goodbye on the socket, unless Goodbye said it) and unmaps
  // Says goodbye to the producer (it exits cleanly) and ends this client's
  // use of the ring, which stays mapped: batches' pointers still read their
  // last bytes until the client is destroyed. Next, Release and Seek then
  // fail with FailedPrecondition. Idempotent.
  void Goodbye();
  RingClient(const RingClient&) = delete;
  RingClient& operator=(const RingClient&) = delete;

  const RingInfo& info() const;

  // The next batch in order; timeout_s < 0: no limit while the producer lives.
  Result<RingBatch> Next(double timeout_s);
  Status Release(const RingBatch& b);
  // Batches from (epoch, batch) on; only with no batch held.
  Status Seek(uint64_t epoch, uint64_t batch);
  uint32_t held() const;

  // The start of slot i and its length (for registering the ring as pinned
  // memory: every slot lies in one mapping, [ring_base, ring_base + ring_bytes)).
  void* ring_base() const;
  uint64_t ring_bytes() const;

  struct Impl;

 private:
  explicit RingClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace nl
