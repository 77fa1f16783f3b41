// CRC32C (Castagnoli), as used by the record header and shard checksums.
// Uses the SSE4.2 crc32 instruction when the CPU has it, else a table.
// Both paths give identical values; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

namespace nl {

// Extends `crc` (the value returned by a previous call, or 0 to start) over
// `data[0, n)`. Crc32c(0, "123456789", 9) == 0xE3069283.
uint32_t Crc32c(uint32_t crc, const void* data, size_t n);

// The table path alone, for tests that compare it with the dispatched one.
uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t n);

}  // namespace nl
