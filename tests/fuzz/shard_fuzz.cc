// libFuzzer target: a shard's data.mdb, as a damaged disk or a hostile file
// would hold it, opened by ShardReader (its tree check, formats/FORMAT.md),
// then read by key and walked with a cursor, every record decoded; as
// `pack_tool verify` and the loader read a shard. LMDB itself trusts its
// pages: anything that reaches it must already have been checked.
#include <sys/stat.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "formats/record.h"
#include "formats/shard.h"
#include "tests/fuzz/fuzz_fs.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string root = nl_fuzz::FreshDir();
  if (mkdir((root + "/s").c_str(), 0700) != 0) __builtin_trap();
  nl_fuzz::WriteFile(root + "/s/data.mdb", data, size);
  nl::ShardInfo info;
  info.path = "s";
  info.bytes = size;
  nl::Result<std::unique_ptr<nl::ShardReader>> r = nl::ShardReader::Open(root, info);
  if (!r.ok()) return 0;
  nl::Result<nl::ShardReader::ReadTxn> txn = (*r)->BeginRead();
  if (!txn.ok()) return 0;
  nl::RecordLimits limits;
  limits.max_pixels = 1u << 16;
  limits.num_classes = 100;
  // Reads by key first, on a fresh reader: each checks only the pages on its
  // way (the first record's were checked at open); then the cursor, after
  // its check of the whole tree.
  for (uint64_t i = 0; i < std::min<uint64_t>((*r)->entries(), 256); ++i) {
    nl::Result<std::span<const uint8_t>> v = txn->Get(i);
    if (v.ok()) (void)nl::DecodeRecord(*v, limits);
  }
  for (size_t j = 0; size >= 8 && j < 8; ++j) {  // keys the file suggests, from across it
    uint64_t key;
    std::memcpy(&key, data + (size - 8) * j / 7, 8);
    (void)txn->Get(key);
  }
  uint64_t seen = 0;
  (void)txn->ForEach([&](const nl::ShardReader::Entry& e) {
    (void)nl::DecodeRecord(e.value, limits);
    return ++seen < 4096 ? nl::Status::Ok() : nl::Status::Aborted("enough");
  });
  return 0;
}
