// libFuzzer target: a shard record value (header and payload) through the
// record decoder, then its payload through the image decoder, as the loader
// reads one (formats/FORMAT.md, "Record").
#include <cstddef>
#include <cstdint>

#include "formats/image.h"
#include "formats/record.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nl::RecordLimits limits;
  limits.max_pixels = 1u << 22;  // keep decodes within the fuzzer's memory
  limits.num_classes = 100;
  nl::Result<nl::RecordView> r = nl::DecodeRecord({data, size}, limits);
  if (!r.ok()) return 0;
  if (r->header.encoding != nl::Encoding::kRaw) {
    nl::Image img;
    nl::DecodeLimits dl;
    dl.max_pixels = limits.max_pixels;
    if (nl::DecodeImageInto(r->payload, dl, &img).ok()) (void)nl::CheckDecodedShape(r->header, img);
  }
  return 0;
}
