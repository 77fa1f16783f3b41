// Writes an ImageFolder of JPEGs in every chroma sampling
// (nl::testing::EveryJpegSampling), one class each: OUT/<sampling>/<w>x<h>.jpg,
// photo-like pictures at widths of each remainder modulo 4 and sizes that a
// 64 or 224 px output decodes at 1/8 to 8/8. The valgrind check's data
// (tests/valgrind_jpeg_test.sh), made with libjpeg's own encoder since
// Pillow and TurboJPEG cannot code 4:4:0 or 3x2.
//
//   sampled_jpeg_folder OUT
#include <sys/stat.h>

#include <cstdio>
#include <exception>
#include <string>
#include <utility>

#include "tests/support/test_util.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: sampled_jpeg_folder OUT\n");
    return 2;
  }
  const std::string out = argv[1];
  try {
    ::mkdir(out.c_str(), 0755);
    uint32_t seed = 1;
    for (const nl::testing::NamedJpegSampling& s : nl::testing::EveryJpegSampling()) {
      const std::string dir = out + "/" + s.name;
      if (::mkdir(dir.c_str(), 0755) != 0) {
        std::fprintf(stderr, "sampled_jpeg_folder: cannot make %s\n", dir.c_str());
        return 1;
      }
      for (const auto& [w, h] : {std::pair{501, 377}, std::pair{402, 299}, std::pair{259, 203}}) {
        const std::vector<uint8_t> px =
            nl::testing::PhotoLikePixels(w, h, s.coding.components, seed++);
        nl::testing::WriteBytes(dir + "/" + std::to_string(w) + "x" + std::to_string(h) + ".jpg",
                                nl::testing::EncodeJpegCoded(px, w, h, s.coding));
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sampled_jpeg_folder: %s\n", e.what());
    return 1;
  }
  return 0;
}
