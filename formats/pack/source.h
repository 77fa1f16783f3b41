// What pack reads from: an indexed list of samples, loadable from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/image.h"
#include "base/status.h"

namespace nl {

struct SourceSample {
  uint32_t label = 0;
  bool decoded = false;             // true: `image` holds RGB; false: `file_bytes` holds a file
  Image image;                      // when decoded
  std::vector<uint8_t> file_bytes;  // when not decoded (an image file's bytes)
};

class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual uint64_t size() const = 0;
  virtual const std::vector<std::string>& classes() const = 0;
  // Where sample i comes from, for messages: a file path, or "train.bin record 17".
  virtual std::string Describe(uint64_t i) const = 0;
  // Loads sample i into *out (reusing its buffers). Thread-safe.
  virtual Status Load(uint64_t i, SourceSample* out) const = 0;
};

}  // namespace nl
