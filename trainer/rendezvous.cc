#include "trainer/rendezvous.h"

#include <netdb.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if NL_TRAINER_CUDA
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "trainer/rank_error.h"

namespace nl::trainer {
namespace {

double SecondsOf(std::chrono::milliseconds t) { return std::chrono::duration<double>(t).count(); }

std::string WorldOf(c10d::Store& store, int r) {
  const std::vector<uint8_t> v = store.get("world/" + std::to_string(r));
  return std::string(v.begin(), v.end());
}

// Waits for the ranks' world/ keys; past the timeout, names those missing.
void WaitFor(c10d::Store& store, const std::vector<int>& ranks, int world, const std::string& where,
             std::chrono::milliseconds timeout) {
  std::vector<std::string> keys;
  for (int r : ranks) keys.push_back("world/" + std::to_string(r));
  try {
    store.wait(keys, timeout);
  } catch (const std::exception&) {
    std::vector<int> missing;
    for (int r : ranks) {
      try {
        if (!store.check({"world/" + std::to_string(r)})) missing.push_back(r);
      } catch (const std::exception&) {
        throw StoreLost(where, "", "");
      }
    }
    throw RendezvousTimeout(where, SecondsOf(timeout), RankList(missing), missing.size(), world);
  }
}

void JoinSteps(c10d::Store& store, int rank, int world, bool launched_by_us, const std::string& where,
               std::chrono::milliseconds timeout) {
  const std::string me = std::to_string(rank);
  const std::string w = std::to_string(world);
  if (store.add("join/" + me, 1) > 1) {
    // Our launcher starts each rank once: the store is another job's (this
    // job's rank 0 found the port taken, and says so itself).
    if (launched_by_us) {
      throw RankError::Echo("rank " + me + " joined the rendezvous at " + where + " twice, and this launcher "
                            "started it once: that store is another job's (the port was taken, so this job's rank 0 "
                            "could not host its store there; it says so)");
    }
    throw RankError("rank " + me + " joined the rendezvous at " + where + " twice: two processes were started with RANK=" +
                    me + " (each needs its own), or that address is not this job's store");
  }
  std::string w0 = w;
  if (rank != 0) {
    WaitFor(store, {0}, world, where, timeout);
    w0 = WorldOf(store, 0);
  }
  store.set("world/" + me, std::vector<uint8_t>(w.begin(), w.end()));
  if (w0 != w) {
    throw RankError("this rank has WORLD_SIZE=" + w + " but rank 0 has WORLD_SIZE=" + w0 +
                    ": start every rank of a job with the same WORLD_SIZE");
  }
  std::vector<int> all;
  for (int r = 0; r < world; ++r) all.push_back(r);
  WaitFor(store, all, world, where, timeout);
  if (rank != 0) return;
  for (int r = 1; r < world; ++r) {
    const std::string wr = WorldOf(store, r);
    if (wr != w) {
      throw RankError("rank " + std::to_string(r) + " has WORLD_SIZE=" + wr + " but this rank (0) has " + w +
                      ": start every rank of a job with the same WORLD_SIZE");
    }
  }
}

// One line a name, one a value: a newline inside either (an --eval-split
// name can hold one) is written as the two characters \n.
std::string OneLine(const std::string& s) {
  std::string out;
  for (char c : s) out += c == '\n' ? std::string("\\n") : std::string(1, c);
  return out;
}

std::string Serialize(const Settings& s) {
  std::string out;
  for (const auto& [k, v] : s) out += OneLine(k) + "\n" + OneLine(v) + "\n";
  return out;
}

Settings Deserialize(const std::vector<uint8_t>& bytes) {
  Settings s;
  const std::string text(bytes.begin(), bytes.end());
  size_t at = 0;
  while (at < text.size()) {
    const size_t k = text.find('\n', at);
    const size_t v = k == std::string::npos ? k : text.find('\n', k + 1);
    if (v == std::string::npos) break;
    s.emplace_back(text.substr(at, k - at), text.substr(k + 1, v - k - 1));
    at = v + 1;
  }
  return s;
}

// Waits for every rank's `prefix`RANK key, naming the missing past the timeout.
void WaitForAll(c10d::Store& store, const std::string& prefix, int world, const std::string& where,
                std::chrono::milliseconds timeout) {
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back(prefix + std::to_string(r));
  try {
    store.wait(keys, timeout);
  } catch (const std::exception&) {
    std::vector<int> missing;
    for (int r = 0; r < world; ++r) {
      try {
        if (!store.check({keys[static_cast<size_t>(r)]})) missing.push_back(r);
      } catch (const std::exception&) {
        throw StoreLost(where, "", "");
      }
    }
    throw RendezvousTimeout(where, SecondsOf(timeout), RankList(missing), missing.size(), world);
  }
}

}  // namespace

void AgreeSettings(c10d::Store& store, int rank, int world, const Settings& mine, const std::string& where,
                   std::chrono::milliseconds timeout) {
  std::vector<Settings> all;
  try {
    const std::string text = Serialize(mine);
    store.set("settings/" + std::to_string(rank), std::vector<uint8_t>(text.begin(), text.end()));
    WaitForAll(store, "settings/", world, where, timeout);
    for (int r = 0; r < world; ++r) all.push_back(Deserialize(store.get("settings/" + std::to_string(r))));
    store.set("settings_read/" + std::to_string(rank), std::vector<uint8_t>{1});
    if (rank == 0) WaitForAll(store, "settings_read/", world, where, timeout);
  } catch (const RankError&) {
    throw;
  } catch (const std::exception& e) {
    throw StoreLost(where, " while the ranks compared their settings", e.what());
  }
  const std::vector<std::string> diff = SettingsDiffer(all);
  if (diff.empty()) return;
  std::string text = "the ranks' settings differ, so every rank stops before its first step: ";
  for (size_t i = 0; i < diff.size(); ++i) text += (i ? ", " : "") + diff[i];
  throw RankError(text + " (start every rank with the same settings)");
}

std::string StoreWhere(const Placement& p) { return p.master_addr + ":" + std::to_string(p.master_port); }

void ResolveMasterAddr(const std::string& addr) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(addr.c_str(), nullptr, &hints, &res);
  if (rc != 0) throw RankError("cannot resolve MASTER_ADDR " + addr + " (--master-addr): " + gai_strerror(rc));
  freeaddrinfo(res);
}

c10::intrusive_ptr<c10d::Store> ConnectRendezvousStore(const Placement& p, std::chrono::milliseconds timeout,
                                                       StoreAddress* address) {
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(p.master_port);
  so.isServer = p.rank == 0 && !p.agent_store;
  so.numWorkers = p.agent_store ? c10::nullopt : c10::optional<std::size_t>(p.world);
  so.waitWorkers = false;
  so.timeout = timeout;
  c10::intrusive_ptr<c10d::Store> tcp;
  try {
    tcp = c10::make_intrusive<c10d::TCPStore>(p.master_addr, so);
  } catch (const std::exception& e) {
    if (!so.isServer) throw StoreUnreachable(StoreWhere(p), SecondsOf(timeout), e.what());
    throw RankError("cannot host the rendezvous store on port " + std::to_string(p.master_port) +
                    " (another job may be using it: pick another --master-port): " + e.what());
  }
  // torchrun's agent store outlives a restart of the workers: each attempt its own keys.
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
  *address = {p.master_addr, std::string("nl_trainer") + (restart && *restart ? std::string("/") + restart : ""),
              p.master_port};
  return c10::make_intrusive<c10d::PrefixStore>(address->prefix, tcp);
}

void Join(c10d::Store& store, int rank, int world, bool launched_by_us, const std::string& where,
          std::chrono::milliseconds timeout) {
  try {
    JoinSteps(store, rank, world, launched_by_us, where, timeout);
  } catch (const RankError&) {
    throw;
  } catch (const std::exception& e) {
    throw StoreLost(where, " during the rendezvous", e.what());
  }
}

c10::intrusive_ptr<c10d::ProcessGroup> CreateProcessGroup(const c10::intrusive_ptr<c10d::Store>& store,
                                                          const Placement& p, std::chrono::milliseconds timeout,
                                                          bool cuda) {
  auto pg_store = c10::make_intrusive<c10d::PrefixStore>("pg", store);
#if NL_TRAINER_CUDA
  if (cuda) {
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout;
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(pg_store, p.rank, p.world, opts);
  }
#else
  (void)cuda;
#endif
  auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
  const bool loopback = p.master_addr == "localhost" || p.master_addr.rfind("127.", 0) == 0;
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME")) {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
  } else if (loopback) {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  } else {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  return c10::make_intrusive<c10d::ProcessGroupGloo>(pg_store, p.rank, p.world, opts);
}

}  // namespace nl::trainer
