// Numbers from text: every rejection names the value's source and quotes the text.
#include "base/parse_number.h"

#include <gtest/gtest.h>

namespace nl {
namespace {

void ExpectError(const Status& s, const std::string& words) {
  const StatusCode want = words.find("out of range") != std::string::npos
                              ? StatusCode::kOutOfRange
                              : StatusCode::kInvalidArgument;
  EXPECT_EQ(s.code(), want) << s.ToString();
  EXPECT_NE(s.message().find(words), std::string::npos) << s.message();
}

TEST(ParseNumber, WholeNumbersInRange) {
  EXPECT_EQ(*ParseInt("0", "--x", 0, 10), 0);
  EXPECT_EQ(*ParseInt("-5", "--x", -10, 10), -5);
  EXPECT_EQ(*ParseUint("18446744073709551615", "--x", 0, UINT64_MAX), UINT64_MAX);
}

TEST(ParseNumber, TwentyDigitsIsOutOfRangeNotAnException) {
  ExpectError(ParseInt("99999999999999999999999", "CUDA_VISIBLE_DEVICES", 0, 7).status(),
              "CUDA_VISIBLE_DEVICES: '99999999999999999999999' is out of range (0..7)");
  ExpectError(ParseUint("99999999999999999999999", "--n", 0, 9).status(), "out of range");
}

TEST(ParseNumber, NegativeIsRefusedForUnsignedInsteadOfWrapping) {
  ExpectError(ParseUint("-1", "--index", 0, 100).status(),
              "--index: '-1' is out of range (0..100)");
  ExpectError(ParseInt("-1", "--threads", 1, 1024).status(), "'-1' is out of range (1..1024)");
}

TEST(ParseNumber, TrailingGarbageSpacesAndEmptyAreRefused) {
  for (const char* t : {"", " 1", "1 ", "1x", "+1", "0x10", "1.5", "--1"}) {
    ExpectError(ParseInt(t, "--n", -100, 100).status(), "is not a whole number");
  }
}

TEST(ParseNumber, Doubles) {
  EXPECT_DOUBLE_EQ(*ParseDouble("0.485", "--mean", 0, 1), 0.485);
  ExpectError(ParseDouble("nan", "--std", 0, 10).status(), "--std: 'nan' is not a finite number");
  ExpectError(ParseDouble("inf", "--std", 0, 10).status(), "not a finite number");
  ExpectError(ParseDouble("1e400", "--std", 0, 10).status(), "'1e400' is out of range (0..10)");
  ExpectError(ParseDouble("1e-400", "--std", 0.5, 10).status(), "out of range (0.5..10)");
  ExpectError(ParseDouble("11", "--std", 0, 10).status(), "out of range");
}

TEST(ParseNumber, ListsNameTheItemAndQuoteTheList) {
  EXPECT_EQ(*ParseIntList("0,2,3", "--gpus", 0, 7), (std::vector<int64_t>{0, 2, 3}));
  ExpectError(ParseIntList("0,x,3", "--gpus", 0, 7).status(),
              "'x' is not a whole number in --gpus '0,x,3'");
  ExpectError(ParseIntList("0,,3", "--gpus", 0, 7).status(), "'' is not a whole number");
  ExpectError(ParseIntList("0,9", "--gpus", 0, 7).status(), "'9' is out of range (0..7)");
  ExpectError(ParseIntList("", "--gpus", 0, 7).status(), "in --gpus ''");
  EXPECT_EQ(ParseDoubleList("1,2.5", "--mean", 0, 5)->size(), 2u);
}

TEST(ParseNumber, SplitKeepsEmptyItems) {
  EXPECT_EQ(SplitText("a,,b", ','), (std::vector<std::string_view>{"a", "", "b"}));
  EXPECT_EQ(SplitText("", ','), (std::vector<std::string_view>{""}));
}

TEST(ParseNumber, ByteSizes) {
  EXPECT_EQ(*ParseByteSize("0", "--io-memory", UINT64_MAX), 0u);
  EXPECT_EQ(*ParseByteSize("4096", "--io-memory", UINT64_MAX), 4096u);
  EXPECT_EQ(*ParseByteSize("512M", "--io-memory", UINT64_MAX), uint64_t{512} << 20);
  EXPECT_EQ(*ParseByteSize("2GiB", "--io-memory", UINT64_MAX), uint64_t{2} << 30);
  EXPECT_EQ(*ParseByteSize("1T", "--io-memory", UINT64_MAX), uint64_t{1} << 40);
  for (const char* bad : {"", "M", "1.5G", "-1G", "12 M", "7X", "1g"}) {
    Result<uint64_t> r = ParseByteSize(bad, "--io-memory", UINT64_MAX);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(ParseByteSize("9999999T", "--io-memory", uint64_t{1} << 50).status().message(),
            "--io-memory: '9999999T' is more than 1125899906842624 bytes");
  EXPECT_EQ(ParseByteSize("99999999999999999999", "--io-memory", UINT64_MAX).status().code(),
            StatusCode::kOutOfRange);
  // Twenty digits are over the bound too, said the same way.
  EXPECT_EQ(
      ParseByteSize("99999999999999999999", "--io-memory", uint64_t{1} << 40).status().message(),
      "--io-memory: '99999999999999999999' is more than 1099511627776 bytes");
}

}  // namespace
}  // namespace nl
