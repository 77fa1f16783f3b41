#include "loader/pipeline/window_stager.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <numeric>
#include <random>

#include "formats/pack/pack.h"
#include "tests/support/fault_shard_files.h"
#include "tests/support/test_util.h"

namespace nl {
namespace {

std::string PackCifar(const testing::ScratchDir& d, uint64_t n, uint32_t shards = 0) {
  EXPECT_TRUE(WriteFakeCifar100(d / "src", {.train = n, .test = 10, .seed = 3}).ok());
  PackOptions o;
  o.encoding = PackEncoding::kRaw;
  o.threads = 1;
  if (shards) o.shards = shards;
  EXPECT_TRUE(PackCifar100(d / "src", d / "packed", CifarLabel::kFine, o).ok());
  return d / "packed";
}

struct Split {
  Manifest manifest;
  std::unique_ptr<SplitReader> reader;
};
Split Open(const std::string& dir) {
  Split s;
  Result<Manifest> m = LoadManifest(dir);
  EXPECT_TRUE(m.ok());
  s.manifest = *m;
  auto r = SplitReader::Open(dir, s.manifest, "train");
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  s.reader = std::move(*r);
  return s;
}

// Windows of 37 positions over a shuffled list with repeats (padding),
// across shards, read past the page cache: every record Find gives is the
// record's bytes (as CopyOf reads them), for every window, to the end.
TEST(WindowStager, EveryWindowsRecordsAreTheirBytes) {
  testing::ScratchDir d;
  const std::string dir = PackCifar(d, 400, 3);
  Split s = Open(dir);
  ASSERT_EQ(s.reader->shards().size(), 3u);
  std::vector<uint64_t> list(400);
  std::iota(list.begin(), list.end(), 0);
  std::shuffle(list.begin(), list.end(), std::mt19937_64(7));
  list.resize(420);  // repeats, as padding makes
  std::copy_n(list.begin(), 20, list.begin() + 400);
  constexpr uint64_t kWindow = 37;
  const uint64_t windows = (list.size() + kWindow - 1) / kWindow;
  for (bool direct : {true, false}) {
    WindowStager st(*s.reader, direct, 1 << 20, 0, [&](uint64_t w) {
      WindowStager::Window win;
      if (w >= windows) {
        win.end = true;
        return win;
      }
      const uint64_t lo = w * kWindow, hi = std::min<uint64_t>(lo + kWindow, list.size());
      win.indices.assign(list.begin() + lo, list.begin() + hi);
      win.positions = hi - lo;
      return win;
    });
    auto txn = s.reader->BeginRead();
    std::vector<uint8_t> want;
    for (uint64_t p = 0; p < list.size(); ++p) {
      const uint64_t w = p / kWindow;
      std::span<const uint8_t> got = st.Find(w, list[p]);
      auto copy = txn.CopyOf(list[p], &want);
      ASSERT_TRUE(copy.ok());
      ASSERT_EQ(got.size(), copy->size()) << "position " << p << ", direct " << direct;
      ASSERT_TRUE(std::equal(got.begin(), got.end(), copy->begin())) << p;
      st.Done(w);
    }
    EXPECT_GE(st.staged_bytes(), 400u * 3072) << "every record read once at least";
    EXPECT_FALSE(!direct && st.direct());
    if (direct) std::printf("O_DIRECT used here: %s\n", st.direct() ? "yes" : "no (refused)");
  }
}

// A shard cut short after the reader opened it, on disk or as its shard
// file's seam reports it (tests/support/fault_shard_files.h): the records
// past the cut are not staged (the worker's own read then reports the
// truncation), the ones before it are. The stager's transaction is begun
// before the cut (its window 0), as a transaction begun after it is refused.
TEST(WindowStager, RecordsPastAShardsEndAreLeftToTheWorker) {
  for (bool by_seam : {false, true}) {
    SCOPED_TRACE(by_seam ? "cut by the seam" : "cut on disk");
    testing::ScratchDir d;
    const std::string dir = PackCifar(d, 200);
    const Manifest manifest = *LoadManifest(dir);
    testing::FaultShardFiles seam;  // no faults until the cut; refuses O_DIRECT
    auto opened = SplitReader::Open(dir, manifest, "train",
                                    by_seam ? static_cast<const ShardFiles&>(seam)
                                            : ShardFiles::Local());
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    const SplitReader& reader = **opened;
    auto txn = reader.BeginRead();
    // Every record located before the cut (its leaf may lie past it).
    std::vector<ShardReader::ReadTxn::Extent> where;
    for (uint64_t i = 0; i < 200; ++i) {
      auto e = txn.Locate(i);
      ASSERT_TRUE(e.ok());
      where.push_back(*e);
    }
    const uint64_t cut = where[150].offset + 100;
    ASSERT_GT(where[150].offset, where[0].offset);
    std::promise<void> cut_done;
    std::shared_future<void> after_cut = cut_done.get_future().share();
    WindowStager st(reader, true, 4 << 20, 0, [&](uint64_t w) {
      WindowStager::Window win;
      if (w == 0) {  // record 0 alone: the stager's transaction begins
        win.indices = {0};
        win.positions = 1;
      } else if (w == 1) {
        after_cut.wait();
        for (uint64_t i = 0; i < 200; ++i) win.indices.push_back(i);
        win.positions = 200;
      } else {
        win.end = true;
      }
      return win;
    });
    EXPECT_EQ(st.Find(0, 0).size(), where[0].size);
    const std::string mdb = dir + "/" + manifest.FindSplit("train")->shards[0].path + "/data.mdb";
    if (by_seam) {
      seam.Set({.shrink_to = cut});
    } else {
      ASSERT_EQ(::truncate(mdb.c_str(), static_cast<off_t>(cut)), 0);
    }
    cut_done.set_value();
    st.Done(0);
    uint64_t staged = 0, missing = 0;
    for (uint64_t i = 0; i < 200; ++i) {
      const ShardReader::ReadTxn::Extent* e = &where[i];
      std::span<const uint8_t> got = st.Find(1, i);
      if (e->offset + e->size <= cut) {
        EXPECT_EQ(got.size(), e->size) << i;
        ++staged;
      } else {
        EXPECT_TRUE(got.empty()) << i;
        ++missing;
      }
      st.Done(1);
    }
    EXPECT_GE(staged, 140u);
    EXPECT_GE(missing, 49u);
    std::vector<uint8_t> buf;
    auto cut_short = txn.CopyOf(199, &buf);
    ASSERT_FALSE(cut_short.ok());
    EXPECT_NE(cut_short.status().message().find("truncated"), std::string::npos)
        << cut_short.status().ToString();
    // A transaction begun now is refused: its reads through the map would fault.
    Status later = reader.BeginRead().Read(5).status();
    EXPECT_NE(later.message().find("it was truncated while open"), std::string::npos)
        << later.ToString();
  }
}

// A window whose records take more than its memory (scattered records: a
// read is whole pages) reads what fits and leaves the rest to the workers.
TEST(WindowStager, AWindowStaysWithinItsMemory) {
  testing::ScratchDir d;
  const std::string dir = PackCifar(d, 300);
  Split s = Open(dir);
  constexpr uint64_t kBytes = 64 << 10;
  WindowStager st(*s.reader, true, kBytes, 0, [&](uint64_t w) {
    WindowStager::Window win;
    if (w > 0) {
      win.end = true;
      return win;
    }
    for (uint64_t i = 0; i < 300; i += 3) win.indices.push_back(i);  // every third record
    win.positions = win.indices.size();
    return win;
  });
  uint64_t staged = 0;
  for (uint64_t i = 0; i < 300; i += 3) {
    staged += st.Find(0, i).empty() ? 0 : 1;
    st.Done(0);
  }
  EXPECT_GT(staged, 0u);
  EXPECT_LT(staged, 100u);
  EXPECT_LE(st.staged_bytes(), kBytes);
}

// A worker waiting for a window that cannot be read yet (the one two before
// it is not done) is let go by Stop, and the stager's thread ends.
TEST(WindowStager, StopLetsAWaitingWorkerGo) {
  testing::ScratchDir d;
  const std::string dir = PackCifar(d, 50);
  Split s = Open(dir);
  std::atomic<uint64_t> asked{0};
  WindowStager st(*s.reader, false, 1 << 20, 0, [&](uint64_t w) {
    asked = w + 1;
    WindowStager::Window win;
    win.indices = {w % 50};
    win.positions = 1;
    return win;
  });
  ASSERT_EQ(st.Find(0, 0).size() > 0, true);
  ASSERT_EQ(st.Find(1, 1).size() > 0, true);
  // Window 0 is not done: window 2 cannot take its memory.
  auto waiting = std::async(std::launch::async, [&] { return st.Find(2, 2).size(); });
  EXPECT_EQ(waiting.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  EXPECT_EQ(asked.load(), 2u) << "window 2 was read before window 0 was done";
  st.Stop();
  ASSERT_EQ(waiting.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(waiting.get(), 0u);
  // Done on windows 0 and 1 after Stop is harmless.
  st.Done(0);
  st.Done(1);
}

}  // namespace
}  // namespace nl
