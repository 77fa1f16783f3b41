// The one way a stored sample becomes model input: read its record, decode
// it, check the decoded shape against the record's header, and transform it
// into its slot of a batch. The pipeline's workers, `loader preview` and the
// loader service all call this; none of them reads, decodes or transforms a
// sample any other way.
//
//   SamplePath path(*split_reader, transform_config, decode_limits);  // one per thread
//   int64_t label;
//   NL_RETURN_IF_ERROR(path.Load(epoch, index, slot_pixels, &label));
#pragma once

#include <cstddef>
#include <cstdint>

#include "formats/image.h"
#include "formats/shard.h"
#include "base/status.h"
#include "loader/pipeline/transforms.h"

namespace nl {

// Time spent in each step, added to by Load().
struct SampleTimes {
  uint64_t read_ns = 0, decode_ns = 0, transform_ns = 0;
};

// Thread-compatible: one per thread (it owns that thread's read transaction
// and scratch buffers). `reader` must outlive it.
class SamplePath {
 public:
  // `pread_records`: records read with pread into this path's buffer
  // (ReadPlan::pread_records), else through the map.
  SamplePath(const SplitReader& reader, const TransformConfig& transform,
             const DecodeLimits& limits, bool pread_records = false);

  // Bytes Load() writes: SampleTransform(transform).SampleBytes().
  size_t sample_bytes() const { return transform_.SampleBytes(); }

  // Writes sample `index`, as epoch `epoch` sees it, to dst[0, sample_bytes())
  // and its label to *label. Errors (record checks, decode failures, a
  // payload that decodes to another size than its header states, the pixel
  // limit) name the split, shard and index; dst is then unspecified. A
  // JPEG is decoded only as far as the sample's crop reads it (its crop is
  // chosen from the header's size before decoding; DecodeImageRegionInto),
  // with the same pixels as a full decode.
  // `staged`: the record's bytes, read already (WindowStager); empty: read here.
  Status Load(uint64_t epoch, uint64_t index, uint8_t* dst, int64_t* label,
              SampleTimes* times = nullptr, std::span<const uint8_t> staged = {});

  // Asks the CPU to start loading record `soon`'s bytes and where record
  // `later` lies (where records are read through the map): a worker names
  // samples it will take in a few turns, so that the memory's latency on a
  // split much bigger than the caches overlaps the current sample's work
  // (SplitReader::ReadTxn::PrefetchRecord). Only a hint: a record that
  // cannot be found is left for its Load to report.
  void Prefetch(uint64_t soon, uint64_t later);
  // The same for a record read into memory already (WindowStager).
  static void Prefetch(std::span<const uint8_t> staged);

 private:
  const SplitReader* reader_;
  SplitReader::ReadTxn txn_;
  SampleTransform transform_;
  DecodeLimits limits_;
  DecodedRegion decoded_;  // the decoded image, or the part of it the crop reads
  bool pread_records_;
  std::vector<uint8_t> record_;  // the record's bytes, read with pread
};

}  // namespace nl
