#include "formats/manifest.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/file_util.h"

namespace nl {

using nlohmann::json;

uint64_t SplitInfo::total_bytes() const {
  uint64_t b = 0;
  for (const auto& s : shards) b += s.bytes;
  return b;
}

const SplitInfo* Manifest::FindSplit(const std::string& name) const {
  auto it = splits.find(name);
  return it == splits.end() ? nullptr : &it->second;
}

namespace {

// Length of the valid UTF-8 sequence at s[i], or 0 when there is none.
size_t Utf8SequenceLength(const std::string& s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;  // no overlong forms
    if (c == 0xED) hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
  }
  return n;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Applies f to every string of j, object keys included.
template <typename F>
json MapStrings(const json& j, const F& f) {
  if (j.is_string()) return f(j.get_ref<const std::string&>());
  if (j.is_array()) {
    json out = json::array();
    for (const auto& e : j) out.push_back(MapStrings(e, f));
    return out;
  }
  if (j.is_object()) {
    json out = json::object();
    for (const auto& [k, v] : j.items()) out[f(k)] = MapStrings(v, f);
    return out;
  }
  return j;
}

}  // namespace

std::string EscapeManifestString(const std::string& raw) {
  std::string out;
  out.reserve(raw.size());
  for (size_t i = 0; i < raw.size();) {
    if (raw[i] == '\\') {
      out += "\\\\";
      ++i;
      continue;
    }
    const size_t n = Utf8SequenceLength(raw, i);
    if (n == 0) {
      static const char kHex[] = "0123456789ABCDEF";
      const auto c = static_cast<unsigned char>(raw[i]);
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
      ++i;
      continue;
    }
    out.append(raw, i, n);
    i += n;
  }
  return out;
}

std::string UnescapeManifestString(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size() && s[i + 1] == '\\') {
      out += '\\';
      ++i;
    } else if (s[i] == '\\' && i + 3 < s.size() && s[i + 1] == 'x' && HexValue(s[i + 2]) >= 0 &&
               HexValue(s[i + 3]) >= 0) {
      out += static_cast<char>(HexValue(s[i + 2]) * 16 + HexValue(s[i + 3]));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::string ManifestToJson(const Manifest& m) {
  json j;
  j["format_version"] = m.format_version;
  j["source"] = {{"kind", m.source_kind}, {"path", m.source_path}, {"label_kind", m.label_kind}};
  j["classes"] = m.classes;
  json splits = json::object();
  for (const auto& [name, s] : m.splits) {
    json js;
    js["source"] = s.source;
    js["num_samples"] = s.num_samples;
    js["encoding"] = s.encoding;
    js["shape"] = s.shape ? json(*s.shape) : json(nullptr);
    json shards = json::array();
    for (const auto& sh : s.shards) {
      shards.push_back({{"path", sh.path},
                        {"first_index", sh.first_index},
                        {"count", sh.count},
                        {"bytes", sh.bytes},
                        {"checksum", sh.checksum}});
    }
    js["shards"] = shards;
    json skipped = json::array();
    for (const auto& f : s.skipped) skipped.push_back({{"path", f.path}, {"reason", f.reason}});
    js["skipped"] = skipped;
    if (s.max_side > 0) {
      js["max_side"] = s.max_side;
      js["original_sizes"] = s.original_sizes;
    }
    if (s.jpeg_restarts) js["jpeg_restarts"] = true;
    splits[name] = js;
  }
  j["splits"] = splits;
  // Escaping leaves only valid UTF-8, so dump() cannot throw (type_error 316);
  // the replace handler is a second guard.
  return MapStrings(j, EscapeManifestString).dump(2, ' ', false, json::error_handler_t::replace) +
         "\n";
}

namespace {

// A shard path is relative, below the root: not empty, not absolute, no NUL
// (the OS would stop at it and open another path), no "." or ".." component.
bool SafeShardPath(const std::string& p) {
  if (p.empty() || p[0] == '/' || p.find('\0') != std::string::npos) return false;
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find('/', start);
    if (end == std::string::npos) end = p.size();
    const std::string_view part(p.data() + start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  return true;
}

// The path as text that shows a NUL (json escapes it).
std::string Shown(const std::string& p) { return json(p).dump(); }

Status CheckSplit(const std::string& name, const SplitInfo& s) {
  uint64_t next = 0;
  for (size_t i = 0; i < s.shards.size(); ++i) {
    const ShardInfo& sh = s.shards[i];
    if (sh.first_index != next) {
      return Status::Corruption("split '" + name + "' shard " + std::to_string(i) +
                                " starts at index " + std::to_string(sh.first_index) +
                                ", expected " + std::to_string(next));
    }
    if (!SafeShardPath(sh.path)) {
      return Status::Corruption("split '" + name + "' shard " + std::to_string(i) +
                                " has an unsafe path " + Shown(sh.path) +
                                " (it must be relative, non-empty, without NUL, '.' or '..')");
    }
    if (sh.count > UINT64_MAX - next) {
      return Status::Corruption("split '" + name + "' shard " + std::to_string(i) + " count " +
                                std::to_string(sh.count) + " overflows the index range");
    }
    next += sh.count;
  }
  if (next != s.num_samples) {
    return Status::Corruption("split '" + name + "' shards hold " + std::to_string(next) +
                              " records but num_samples is " + std::to_string(s.num_samples));
  }
  if (s.encoding != "raw" && s.encoding != "png" && s.encoding != "jpeg" && s.encoding != "mixed") {
    return Status::Corruption("split '" + name + "' has unknown encoding '" + s.encoding + "'");
  }
  // With max_side: 8 bytes of original size per sample, as base64 (4
  // characters per 3 bytes, padded); without, none. (The text is decoded
  // only by OriginalSizes.)
  const bool too_many = s.max_side > 0 && s.num_samples > (uint64_t{1} << 58);  // (8 bytes each)
  const uint64_t want = s.max_side > 0 && !too_many ? (s.num_samples * 8 + 2) / 3 * 4 : 0;
  if (too_many || s.original_sizes.size() != want) {
    return Status::Corruption("split '" + name + "' original_sizes holds " +
                              std::to_string(s.original_sizes.size()) + " characters, expected " +
                              std::to_string(want) + " (max_side " + std::to_string(s.max_side) +
                              ", " + std::to_string(s.num_samples) + " samples)");
  }
  return Status::Ok();
}

constexpr char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int Base64Value(char c) {
  const char* p = c ? std::strchr(kBase64, c) : nullptr;
  return p ? static_cast<int>(p - kBase64) : -1;
}

// A count or size: a non-negative JSON integer (nlohmann would wrap -1 to
// 2^64 - 1 and truncate 1.5). Errors name the field and quote the text.
Result<uint64_t> GetCount(const json& obj, const char* field, const std::string& where) {
  const json& v = obj.at(field);
  if (!v.is_number_unsigned()) {
    return Status::Corruption(where + " field '" + field +
                              "' must be a non-negative integer, not " + v.dump());
  }
  return v.get<uint64_t>();
}

// The steps of ManifestFromJson. Each sets *field to what it reads before
// reading it: a type error (an exception from the JSON library, caught by
// ManifestFromJson) then names the field.

Status ReadFormatVersion(const json& j, const std::string& where, std::string* field) {
  *field = "format_version";
  // An integer, compared without conversion: get<int>() of 4.4e27 or of
  // 2^63 is undefined behaviour (manifest_fuzz found the first).
  const json& fv = j.at("format_version");
  const bool supported =
      fv.is_number_unsigned() ? fv.get<uint64_t>() == static_cast<uint64_t>(kManifestFormatVersion)
      : fv.is_number_integer() ? fv.get<int64_t>() == kManifestFormatVersion
                               : false;
  if (!fv.is_number_integer()) {
    return Status::Corruption(where + ": manifest format_version must be an integer, not " +
                              fv.dump());
  }
  if (!supported) {
    return Status::Corruption(where + ": manifest format_version " + fv.dump() +
                              " is not supported (this build reads " +
                              std::to_string(kManifestFormatVersion) + ")");
  }
  return Status::Ok();
}

Status ReadSourceAndClasses(const json& j, const std::string& where, std::string* field,
                            Manifest* m) {
  *field = "source";
  const json& src = j.at("source");
  m->source_kind = src.at("kind").get<std::string>();
  m->source_path = src.at("path").get<std::string>();
  m->label_kind = src.value("label_kind", "");
  *field = "classes";
  m->classes = j.at("classes").get<std::vector<std::string>>();
  if (m->classes.empty()) {
    return Status::Corruption(where +
                              ": the manifest's class list is empty (labels could not "
                              "be checked)");
  }
  if (m->classes.size() >= UINT32_MAX) {  // labels are 32-bit
    return Status::Corruption(where + ": the manifest lists " + std::to_string(m->classes.size()) +
                              " classes, more than 32-bit labels can name");
  }
  return Status::Ok();
}

// A split's shape: null, or [height, width, 3], each side in the record's
// bounds (1 .. 2^20).
Status ReadShape(const json& sj, const std::string& at_split, SplitInfo* s) {
  if (sj.is_null()) return Status::Ok();
  if (!sj.is_array() || sj.size() != 3) {
    return Status::Corruption(at_split + " shape " + sj.dump() +
                              ": must be [height, width, 3] or null");
  }
  for (int i = 0; i < 2; ++i) {
    if (!sj[i].is_number_unsigned() || sj[i].get<uint64_t>() < 1 ||
        sj[i].get<uint64_t>() > (1u << 20)) {
      return Status::Corruption(at_split + " shape " + sj.dump() +
                                ": height and width must be 1 .. 1048576");
    }
  }
  if (!sj[2].is_number_unsigned() || sj[2].get<uint64_t>() != 3) {
    return Status::Corruption(at_split + " shape " + sj.dump() + ": channels must be 3");
  }
  s->shape = sj.get<std::array<uint32_t, 3>>();
  return Status::Ok();
}

Status ReadShards(const json& js, const std::string& name, const std::string& at_split,
                  std::string* field, SplitInfo* s) {
  *field = "splits." + name + ".shards";
  const json& shards = js.at("shards");
  if (!shards.is_array()) {
    return Status::Corruption(at_split + ": shards must be an array, not " +
                              std::string(shards.type_name()));
  }
  for (const auto& jsh : shards) {
    ShardInfo sh;
    const std::string at_shard = at_split + " shard " + std::to_string(s->shards.size());
    *field = "splits." + name + ".shards[" + std::to_string(s->shards.size()) + "]";
    sh.path = jsh.at("path").get<std::string>();
    NL_ASSIGN_OR_RETURN(sh.first_index, GetCount(jsh, "first_index", at_shard));
    NL_ASSIGN_OR_RETURN(sh.count, GetCount(jsh, "count", at_shard));
    NL_ASSIGN_OR_RETURN(sh.bytes, GetCount(jsh, "bytes", at_shard));
    sh.checksum = jsh.at("checksum").get<std::string>();
    s->shards.push_back(std::move(sh));
  }
  return Status::Ok();
}

Result<SplitInfo> ReadSplit(const std::string& name, const json& js, const std::string& where,
                            std::string* field) {
  SplitInfo s;
  const std::string at_split = where + ": split '" + name + "'";
  *field = "splits." + name;
  s.source = js.value("source", "");
  NL_ASSIGN_OR_RETURN(s.num_samples, GetCount(js, "num_samples", at_split));
  *field = "splits." + name + ".encoding";
  s.encoding = js.at("encoding").get<std::string>();
  *field = "splits." + name + ".shape";
  NL_RETURN_IF_ERROR(ReadShape(js.at("shape"), at_split, &s));
  NL_RETURN_IF_ERROR(ReadShards(js, name, at_split, field, &s));
  *field = "splits." + name + ".skipped";
  for (const auto& jf : js.value("skipped", json::array())) {
    s.skipped.push_back({jf.at("path").get<std::string>(), jf.at("reason").get<std::string>()});
  }
  if (js.contains("max_side")) {
    *field = "splits." + name + ".max_side";
    NL_ASSIGN_OR_RETURN(const uint64_t max_side, GetCount(js, "max_side", at_split));
    if (max_side < 1 || max_side > (uint64_t{1} << 20)) {
      return Status::Corruption(at_split + " max_side " + std::to_string(max_side) +
                                " is outside 1 .. 1048576");
    }
    s.max_side = static_cast<uint32_t>(max_side);
    *field = "splits." + name + ".original_sizes";
    s.original_sizes = js.at("original_sizes").get<std::string>();
  }
  *field = "splits." + name + ".jpeg_restarts";
  s.jpeg_restarts = js.value("jpeg_restarts", false);
  NL_RETURN_IF_ERROR(CheckSplit(name, s).WithContext(where));
  return s;
}

}  // namespace

std::string EncodeOriginalSizes(const std::vector<std::array<uint32_t, 2>>& sizes) {
  std::vector<uint8_t> bytes;
  bytes.reserve(sizes.size() * 8);
  for (const auto& wh : sizes)
    for (uint32_t v : wh)
      for (int b = 0; b < 4; ++b) bytes.push_back(static_cast<uint8_t>(v >> (8 * b)));
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const uint32_t n = (uint32_t{bytes[i]} << 16) | (i + 1 < bytes.size() ? uint32_t{bytes[i + 1]} << 8 : 0) |
                       (i + 2 < bytes.size() ? bytes[i + 2] : 0);
    out += kBase64[(n >> 18) & 63];
    out += kBase64[(n >> 12) & 63];
    out += i + 1 < bytes.size() ? kBase64[(n >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kBase64[n & 63] : '=';
  }
  return out;
}

Result<std::vector<std::array<uint32_t, 2>>> OriginalSizes(const SplitInfo& s) {
  std::vector<std::array<uint32_t, 2>> sizes;
  if (s.max_side == 0) return sizes;
  const std::string& t = s.original_sizes;
  const uint64_t n_bytes = s.num_samples * 8;
  if (s.num_samples > (uint64_t{1} << 58) || t.size() != (n_bytes + 2) / 3 * 4) {
    return Status::Corruption("original_sizes holds " + std::to_string(t.size()) + " characters for " +
                              std::to_string(s.num_samples) + " samples");
  }
  // Exactly as EncodeOriginalSizes writes it: the last (3 - n_bytes % 3) % 3
  // characters are '=', and the bits they stand for are 0.
  const size_t pad = (3 - n_bytes % 3) % 3;
  std::vector<uint8_t> bytes;
  bytes.reserve(n_bytes + 2);
  for (size_t i = 0; i < t.size(); i += 4) {
    uint32_t n = 0;
    for (size_t k = 0; k < 4; ++k) {
      const size_t at = i + k;
      const bool padding = at >= t.size() - pad;
      const int v = padding ? (t[at] == '=' ? 0 : -1) : Base64Value(t[at]);
      if (v < 0) {
        return Status::Corruption("original_sizes is not base64: character " + std::to_string(at) +
                                  " is " + Shown(std::string(1, t[at])));
      }
      n = (n << 6) | static_cast<uint32_t>(v);
    }
    for (int b = 2; b >= 0; --b) bytes.push_back(static_cast<uint8_t>(n >> (8 * b)));
  }
  for (size_t i = n_bytes; i < bytes.size(); ++i) {
    if (bytes[i] != 0) return Status::Corruption("original_sizes is not canonical base64: its last bits are not 0");
  }
  sizes.resize(s.num_samples);
  for (uint64_t i = 0; i < s.num_samples; ++i) {
    for (int k = 0; k < 2; ++k) {
      const uint8_t* p = &bytes[i * 8 + k * 4];
      const uint32_t v = p[0] | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
      if (v < 1 || v > (uint32_t{1} << 20)) {
        return Status::Corruption("original_sizes: sample " + std::to_string(i) + " has a side of " +
                                  std::to_string(v) + " (sides are 1 .. 1048576)");
      }
      sizes[i][k] = v;
    }
  }
  return sizes;
}

Result<Manifest> ManifestFromJson(const std::string& text, const std::string& where) {
  Manifest m;
  std::string field = "the document";  // what is being read, for a type error's message
  try {
    json j = MapStrings(json::parse(text), UnescapeManifestString);
    if (!j.is_object()) {
      return Status::Corruption(where + ": invalid manifest: it must be a JSON object, not " +
                                std::string(j.type_name()));
    }
    NL_RETURN_IF_ERROR(ReadFormatVersion(j, where, &field));
    m.format_version = kManifestFormatVersion;
    NL_RETURN_IF_ERROR(ReadSourceAndClasses(j, where, &field, &m));
    field = "splits";
    const json& splits = j.at("splits");
    if (!splits.is_object()) {
      return Status::Corruption(where + ": invalid manifest: splits must be an object, not " +
                                std::string(splits.type_name()));
    }
    for (const auto& [name, js] : splits.items()) {
      NL_ASSIGN_OR_RETURN(SplitInfo s, ReadSplit(name, js, where, &field));
      m.splits.emplace(name, std::move(s));
    }
  } catch (const json::exception& e) {
    return Status::Corruption(where + ": invalid manifest, at " + field + ": " + e.what());
  }
  return m;
}

Result<Manifest> LoadManifest(const std::string& root) {
  const std::string path = root + "/" + kManifestFileName;
  // 256 MiB: a manifest is a few hundred bytes per shard and per skipped file.
  NL_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, uint64_t{256} << 20));
  return ManifestFromJson(text, path);
}

Status SaveManifest(const std::string& root, const Manifest& m) {
  return WriteFileAtomically(root + "/" + kManifestFileName, ManifestToJson(m));
}

}  // namespace nl
