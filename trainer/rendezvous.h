// How the ranks of a job find each other: rank 0's TCPStore (hosted by rank
// 0, or by torchrun's agent), the join (every rank there, all of one
// WORLD_SIZE), and the process group over it (Gloo on CPU, NCCL on GPU).
// Errors are RankError: kEcho for a rendezvous timeout and a store that is
// unreachable or lost (another process's failure or stall), kOwn otherwise.
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "trainer/heartbeat.h"
#include "trainer/options.h"
#include "trainer/settings.h"

namespace nl::trainer {

// "host:port", as the messages name the store.
std::string StoreWhere(const Placement& p);

// A MASTER_ADDR that does not resolve fails now, not after --timeout of retries.
void ResolveMasterAddr(const std::string& addr);

// Hosts (rank 0 without torchrun's agent store) or reaches the store, under
// the job's prefix (torchrun's restarts each get their own); *address gets
// what a second connection (the heartbeat's) needs.
c10::intrusive_ptr<c10d::Store> ConnectRendezvousStore(const Placement& p, std::chrono::milliseconds timeout,
                                                       StoreAddress* address);

// Each rank publishes its WORLD_SIZE under world/RANK; a rank is there once
// that key is. A rank other than 0 compares rank 0's WORLD_SIZE with its own
// before it publishes: rank 0 can only find a mismatch, and end the store with
// its exit, once the other rank has found it too, so both name it. A rank
// that joins twice is an error of its own, except under our launcher (which
// starts each rank once): there the store is another job's, reached because
// this job's rank 0 found the port taken, and the error is an echo, so the
// launcher names rank 0's failure.
void Join(c10d::Store& store, int rank, int world, bool launched_by_us, const std::string& where,
          std::chrono::milliseconds timeout);

// Each rank publishes its settings under settings/RANK and compares every
// rank's with its own; a difference throws RankError on every rank, naming
// each setting that differs and each rank's value ("--batch-size (rank 0: 32;
// rank 1: 16)"). Rank 0 throws only once every rank has read them (its exit
// ends the store). After Join: every rank is there.
void AgreeSettings(c10d::Store& store, int rank, int world, const Settings& mine, const std::string& where,
                   std::chrono::milliseconds timeout);

c10::intrusive_ptr<c10d::ProcessGroup> CreateProcessGroup(const c10::intrusive_ptr<c10d::Store>& store,
                                                          const Placement& p, std::chrono::milliseconds timeout,
                                                          bool cuda);

}  // namespace nl::trainer
