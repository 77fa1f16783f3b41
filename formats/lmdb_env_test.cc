// Tests of formats/lmdb_env.h: LMDB codes as Status, the key encoding and
// the transaction owner.
#include "formats/lmdb_env.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "tests/support/test_util.h"

namespace nl {
namespace {

using testing::ScratchDir;

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST(LmdbStatus, MapsEachDocumentedCode) {
  EXPECT_TRUE(LmdbStatus(MDB_SUCCESS, "get").ok());
  struct Case {
    int rc;
    StatusCode code;
  };
  const Case cases[] = {
      {MDB_NOTFOUND, StatusCode::kNotFound},
      {MDB_CORRUPTED, StatusCode::kCorruption},
      {MDB_PAGE_NOTFOUND, StatusCode::kCorruption},
      {MDB_INVALID, StatusCode::kCorruption},
      {MDB_MAP_FULL, StatusCode::kResourceExhausted},
      {ENOSPC, StatusCode::kIOError},
      {EIO, StatusCode::kIOError},
      {ENOENT, StatusCode::kNotFound},
  };
  for (const Case& c : cases) {
    Status s = LmdbStatus(c.rc, "cannot read shard train/shard-00003");
    EXPECT_EQ(s.code(), c.code) << c.rc << ": " << s.ToString();
    EXPECT_EQ(s.message(),
              std::string("cannot read shard train/shard-00003: ") + mdb_strerror(c.rc));
  }
}

TEST(LmdbWriteStatus, NamesTheFullDiskAndTheFile) {
  ScratchDir d;
  const std::string file = d / "data.mdb";
  Status s = LmdbWriteStatus(ENOSPC, "cannot commit shard train/shard-00001", file);
  EXPECT_EQ(s.code(), StatusCode::kIOError);
  EXPECT_TRUE(Contains(s.message(),
                       "cannot commit shard train/shard-00001: no space left on "
                       "device writing " +
                           file))
      << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "bytes free")) << s.ToString();
}

TEST(LmdbWriteStatus, OtherCodesAreLmdbStatus) {
  ScratchDir d;
  const std::string file = d / "data.mdb";
  for (int rc : {MDB_MAP_FULL, MDB_CORRUPTED, MDB_NOTFOUND}) {
    Status w = LmdbWriteStatus(rc, "cannot put record 7", file);
    Status plain = LmdbStatus(rc, "cannot put record 7");
    EXPECT_EQ(w.code(), plain.code()) << rc;
    EXPECT_EQ(w.message(), plain.message()) << rc;
  }
}

TEST(LmdbWriteStatus, NamesTheFileSizeLimit) {
  struct rlimit saved {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  const rlim_t limit = rlim_t{64} << 20;
  if (saved.rlim_max != RLIM_INFINITY && saved.rlim_max < limit) {
    GTEST_SKIP() << "the hard file-size limit is below 64 MiB";
  }
  struct rlimit lowered = saved;
  lowered.rlim_cur = limit;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lowered), 0);
  ScratchDir d;
  const std::string file = d / "data.mdb";
  Status s = LmdbWriteStatus(EFBIG, "cannot commit shard x", file);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &saved), 0);
  EXPECT_EQ(s.code(), StatusCode::kIOError);
  EXPECT_TRUE(Contains(s.message(), file + " reached the file-size limit (ulimit -f) of " +
                                        std::to_string(limit) + " bytes"))
      << s.ToString();
}

TEST(LmdbKey, RoundTripsAndIsBigEndian) {
  unsigned char k[8];
  EncodeKey(0x0102030405060708ull, k);
  const unsigned char want[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_EQ(std::memcmp(k, want, 8), 0);
  for (uint64_t v :
       {uint64_t{0}, uint64_t{1}, uint64_t{255}, uint64_t{256}, uint64_t{1} << 32, ~uint64_t{0}}) {
    EncodeKey(v, k);
    EXPECT_EQ(DecodeKey(k), v);
  }
  // Byte order of the keys is index order (LMDB compares keys with memcmp).
  const uint64_t ordered[] = {0, 1, 255, 256, 65535, 65536, uint64_t{1} << 40, ~uint64_t{0}};
  for (size_t i = 1; i < std::size(ordered); ++i) {
    unsigned char a[8], b[8];
    EncodeKey(ordered[i - 1], a);
    EncodeKey(ordered[i], b);
    EXPECT_LT(std::memcmp(a, b, 8), 0) << ordered[i - 1] << " vs " << ordered[i];
  }
}

class LmdbTxnTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MDB_env* e = nullptr;
    ASSERT_EQ(mdb_env_create(&e), MDB_SUCCESS);
    env_.reset(e);
    ASSERT_EQ(mdb_env_set_mapsize(e, size_t{1} << 20), MDB_SUCCESS);
    ASSERT_EQ(mdb_env_open(e, dir_.path().c_str(), 0, 0644), MDB_SUCCESS);
    LmdbTxn t = Begin(0);
    ASSERT_EQ(mdb_dbi_open(t.get(), nullptr, 0, &dbi_), MDB_SUCCESS);
    ASSERT_EQ(t.Commit(), MDB_SUCCESS);
  }
  LmdbTxn Begin(unsigned flags) {
    MDB_txn* t = nullptr;
    EXPECT_EQ(mdb_txn_begin(env_.get(), nullptr, flags, &t), MDB_SUCCESS);
    return LmdbTxn(t);
  }
  int Put(LmdbTxn& t, uint64_t index, const std::string& value) {
    unsigned char k[8];
    EncodeKey(index, k);
    MDB_val key{8, k};
    MDB_val val{value.size(), const_cast<char*>(value.data())};
    return mdb_put(t.get(), dbi_, &key, &val, 0);
  }
  Status Get(uint64_t index, std::string* value) {
    LmdbTxn t = Begin(MDB_RDONLY);
    unsigned char k[8];
    EncodeKey(index, k);
    MDB_val key{8, k};
    MDB_val val{};
    NL_RETURN_IF_ERROR(LmdbStatus(mdb_get(t.get(), dbi_, &key, &val),
                                  "cannot get record " + std::to_string(index)));
    value->assign(static_cast<const char*>(val.mv_data), val.mv_size);
    return Status::Ok();
  }

  ScratchDir dir_;
  LmdbEnv env_;
  MDB_dbi dbi_ = 0;
};

TEST_F(LmdbTxnTest, AbortsOnDestructionWithoutCommit) {
  {
    LmdbTxn t = Begin(0);
    ASSERT_EQ(Put(t, 1, "never committed"), MDB_SUCCESS);
  }  // dies without Commit: aborted
  std::string v;
  Status s = Get(1, &v);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.message(), std::string("cannot get record 1: ") + mdb_strerror(MDB_NOTFOUND));

  // The write lock was let go: a new write transaction starts and commits.
  {
    LmdbTxn t = Begin(0);
    ASSERT_NE(t.get(), nullptr);
    ASSERT_EQ(Put(t, 2, "committed"), MDB_SUCCESS);
    EXPECT_EQ(t.Commit(), MDB_SUCCESS);
    EXPECT_EQ(t.get(), nullptr);
  }
  ASSERT_TRUE(Get(2, &v).ok());
  EXPECT_EQ(v, "committed");
}

TEST_F(LmdbTxnTest, MoveAssignAbortsTheOldTransaction) {
  LmdbTxn a = Begin(0);
  ASSERT_EQ(Put(a, 3, "dropped"), MDB_SUCCESS);
  LmdbTxn b;
  b = std::move(a);             // b takes a's transaction
  EXPECT_EQ(a.get(), nullptr);  // NOLINT(bugprone-use-after-move)
  b.Abort();
  EXPECT_EQ(b.get(), nullptr);
  std::string v;
  EXPECT_EQ(Get(3, &v).code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace nl
