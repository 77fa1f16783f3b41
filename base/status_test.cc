#include "base/status.h"

#include <gtest/gtest.h>

namespace nl {
namespace {

Result<int> Half(int x) {
  if (x % 2) return Status::InvalidArgument(std::to_string(x) + " is odd");
  return x / 2;
}

Status Quarter(int x, int* out) {
  NL_ASSIGN_OR_RETURN(int h, Half(x));
  NL_ASSIGN_OR_RETURN(*out, Half(h));
  return Status::Ok();
}

TEST(Status, OkAndErrors) {
  EXPECT_TRUE(Status().ok());
  Status s = Status::Corruption("bad magic");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_EQ(s.ToString(), "Corruption: bad magic");
  EXPECT_EQ(s.WithContext("shard 3").ToString(), "Corruption: shard 3: bad magic");
  EXPECT_TRUE(Status::Ok().WithContext("x").ok());
  EXPECT_EQ(Status::FromErrno("open f", ENOENT).code(), StatusCode::kNotFound);
}

TEST(Result, ValueOrStatusAndMacros) {
  int q = 0;
  EXPECT_TRUE(Quarter(8, &q).ok());
  EXPECT_EQ(q, 2);
  Status s = Quarter(6, &q);
  EXPECT_EQ(s.ToString(), "Invalid argument: 3 is odd");
  Result<int> r = Half(3);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "3 is odd");
}

}  // namespace
}  // namespace nl
