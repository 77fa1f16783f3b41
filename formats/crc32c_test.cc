#include "formats/crc32c.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace nl {
namespace {

TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(Crc32c(0, "123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32cPortable(0, "123456789", 9), 0xE3069283u);
  std::vector<uint8_t> zeros(32, 0);
  EXPECT_EQ(Crc32c(0, zeros.data(), zeros.size()), 0x8A9136AAu);  // RFC 3720 B.4
  EXPECT_EQ(Crc32c(0, "", 0), 0u);
}

TEST(Crc32c, HardwareAndTableAgreeAndExtend) {
  std::vector<uint8_t> data(10007);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 31 + (i >> 7));
  for (size_t n : {0u, 1u, 7u, 8u, 9u, 63u, 1000u, 10007u}) {
    EXPECT_EQ(Crc32c(0, data.data(), n), Crc32cPortable(0, data.data(), n)) << n;
  }
  const uint32_t whole = Crc32c(0, data.data(), data.size());
  const uint32_t split =
      Crc32c(Crc32c(0, data.data(), 4001), data.data() + 4001, data.size() - 4001);
  EXPECT_EQ(whole, split);
}

}  // namespace
}  // namespace nl
