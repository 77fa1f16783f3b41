#include "loader/plan/cpu_list.h"

#include <gtest/gtest.h>

namespace nl {
namespace {

TEST(CpuList, ParseAndFormat) {
  Result<CpuList> l = ParseCpuList("23-32,67-76,5");
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->size(), 21u);
  EXPECT_EQ(l->front(), 5);
  EXPECT_EQ(FormatCpuList(*l), "5,23-32,67-76");
  EXPECT_EQ(FormatCpuList({0, 1, 2, 4, 6, 7}), "0-2,4,6-7");
  EXPECT_EQ(FormatCpuList({}), "");
  EXPECT_EQ(*ParseCpuList("3,1,2,2"), (CpuList{1, 2, 3}));
}

TEST(CpuList, BadInputNamesTheItem) {
  EXPECT_EQ(ParseCpuList("0-3,x").status().message(), "bad item 'x' in cpu list '0-3,x'");
  EXPECT_EQ(ParseCpuList("5-2").status().message(), "bad item '5-2' in cpu list '5-2'");
  Status empty = ParseCpuList("").status();
  EXPECT_EQ(empty.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(empty.message(), "empty item in cpu list ''");
  Status gap = ParseCpuList("1,,2").status();
  EXPECT_EQ(gap.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(gap.message(), "empty item in cpu list '1,,2'");
}

// A range repeated is one set of bits, not a vector of every cpu named (the
// old parser pushed 131 million ints here, ~530 MB, before sort/unique).
TEST(CpuList, RepeatedWholeRangeIsOneSet) {
  std::string text;
  for (int i = 0; i < 2000; ++i) text += (i ? ",0-" : "0-") + std::to_string(kMaxCpuIndex);
  Result<CpuList> l = ParseCpuList(text);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ASSERT_EQ(l->size(), static_cast<size_t>(kMaxCpuIndex) + 1);
  EXPECT_EQ(l->front(), 0);
  EXPECT_EQ(l->back(), kMaxCpuIndex);
  EXPECT_EQ(FormatCpuList(*l), "0-" + std::to_string(kMaxCpuIndex));
}

TEST(CpuList, FormatRankListUsesRanges) {
  std::vector<int> all(1024);
  for (int i = 0; i < 1024; ++i) all[i] = i;
  EXPECT_EQ(FormatRankList(all), "0-1023");
  EXPECT_EQ(FormatRankList({2, 3}), "2,3");
  EXPECT_EQ(FormatRankList({0, 1, 2, 5, 7, 8}), "0-2,5,7,8");
  EXPECT_EQ(FormatRankList({}), "");
  std::vector<int> even;
  for (int i = 0; i < 1024; i += 2) even.push_back(i);
  EXPECT_EQ(FormatRankList(even), "0,2,4,6,8,10,12,14,16,18,20,22,24,26,28,30,... (512 ranks)");
}

TEST(CpuList, SetOperations) {
  CpuList a{0, 1, 2, 3}, b{2, 3, 4};
  EXPECT_EQ(Intersect(a, b), (CpuList{2, 3}));
  EXPECT_EQ(Union(a, b), (CpuList{0, 1, 2, 3, 4}));
  EXPECT_TRUE(IsSubset({1, 2}, a));
  EXPECT_FALSE(IsSubset({1, 4}, a));
  EXPECT_TRUE(Disjoint({0, 1}, {2}));
}

}  // namespace
}  // namespace nl
