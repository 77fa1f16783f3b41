// Decodes each file named on stdin (one path per line) with the decoder that
// pack_tool and the loader use, and prints one JSON line per file:
//   {"path": P, "ok": true, "width": W, "height": H, "crc32": C}   (C: zlib crc32 of the RGB bytes)
//   {"path": P, "ok": false, "error": "..."}
// pillow_agreement.py compares these with Pillow's decisions and pixels.
#include <zlib.h>

#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "base/file_util.h"
#include "formats/image.h"

int main() {
  std::string path;
  nl::Image img;
  while (std::getline(std::cin, path)) {
    nlohmann::json j;
    j["path"] = path;
    nl::Result<std::vector<uint8_t>> bytes = nl::ReadFileBytes(path);
    nl::Status st = bytes.ok() ? nl::DecodeImageInto(*bytes, {}, &img) : bytes.status();
    if (st.ok()) {
      j["ok"] = true;
      j["width"] = img.width;
      j["height"] = img.height;
      j["crc32"] = crc32(crc32(0, nullptr, 0), img.pixels.data(), static_cast<uInt>(img.pixels.size()));
    } else {
      j["ok"] = false;
      j["error"] = st.ToString();
    }
    std::cout << j.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace) << "\n" << std::flush;
  }
  return 0;
}
