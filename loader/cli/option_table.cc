#include "loader/cli/option_table.h"

#include <nlohmann/json.hpp>

#include "base/parse_number.h"
#include "base/quoted_names.h"
#include "loader/cli/cli_options.h"

namespace nl {

std::string OptionDef::Field() const {
  std::string f(flag.substr(2));
  for (char& c : f) c = c == '-' ? '_' : c;
  return f;
}

std::vector<std::string> OptionDef::Choices() const {
  std::vector<std::string> out;
  if (choices.empty()) return out;
  for (std::string_view c : SplitText(choices, '|')) out.emplace_back(c);
  return out;
}

const std::vector<const OptionDef*>& AllOptions() {
  using namespace opt;
  static const std::vector<const OptionDef*> all = {
      &kData, &kSplit, &kBatchSize, &kPrefetch, &kSeed, &kNoShuffle, &kDropLast, &kDropLastBatch,
      &kOnBadRecord, &kOrder, &kIoMemory, &kEpochs, &kStartEpoch, &kStartBatch,
      &kImageSize, &kResize, &kResizeSize, &kAugment, &kPadCrop, &kRandomResizedCrop, &kNoFlip,
      &kDecode, &kLayout, &kNormalize, &kMean, &kStd,
      &kJobId, &kRank, &kWorldSize, &kLocalRank, &kLocalWorldSize, &kThreads, &kAttachTimeout,
      &kStallWarning, &kSimulateDelayMs, &kTimeout, &kLoaderBin,
      &kTopology, &kNprocPerNode, &kGpus, &kNumaNode, &kCpuAffinity, &kTrainerCores,
      &kAllowSharedCores, &kIgnoreGpus, &kNoBind,
      &kJson, &kOut};
  return all;
}

const OptionDef* FindOption(std::string_view flag) {
  for (const OptionDef* d : AllOptions()) {
    if (d->flag == flag) return d;
  }
  return nullptr;
}

namespace {

// A CLI11 validator from one of base's parsers: the message is the parser's,
// without the flag (CLI11 puts it in front).
template <class F>
CLI::Validator Checked(const std::string& desc, const std::string& flag, F parse) {
  return CLI::Validator(
      [parse, flag](std::string& text) -> std::string {
        Status st = parse(text);
        if (st.ok()) return std::string();
        // base's parsers say "--flag: 'TEXT' is ..."; CLI11 puts the flag in front.
        const std::string& m = st.message();
        return m.rfind(flag + ": ", 0) == 0 ? m.substr(flag.size() + 2) : m;
      },
      desc);
}

}  // namespace

CLI::Validator OptionCheck(const OptionDef& d) {
  const std::string what(d.flag);
  switch (d.kind) {
    case OptionKind::kInt:
      return Checked("INT in [" + std::to_string(d.min) + " - " + std::to_string(d.max) + "]", what,
                     [d, what](const std::string& t) {
                       return d.min >= 0 ? ParseUint(t, what, static_cast<uint64_t>(d.min), d.max).status()
                                         : ParseInt(t, what, d.min, static_cast<int64_t>(d.max)).status();
                     });
    case OptionKind::kReal:
      return Checked("FLOAT in [" + FormatNumber(d.lo) + " - " + FormatNumber(d.hi) + "]", what,
                     [d, what](const std::string& t) { return ParseDouble(t, what, d.lo, d.hi).status(); });
    case OptionKind::kInts:
      return Checked("LIST of INT in [" + std::to_string(d.min) + " - " + std::to_string(d.max) + "]", what,
                     [d, what](const std::string& t) {
                       return ParseIntList(t, what, d.min, static_cast<int64_t>(d.max)).status();
                     });
    case OptionKind::kReals:
      return Checked("LIST of NUMBER", what,
                     [d, what](const std::string& t) { return ParseDoubleList(t, what, d.lo, d.hi).status(); });
    case OptionKind::kChoice:
      return CLI::IsMember(d.Choices());
    default:
      return CLI::Validator();
  }
}

std::string FlagText(std::string_view text) {
  return MapQuotedNames(text, [](std::string_view name) {
    for (const OptionDef* d : AllOptions()) {
      if (d->Field() == name) return std::string(d->flag);
    }
    return std::string();
  });
}

void Push(std::vector<std::string>* argv, const OptionDef& d, const std::string& value) {
  argv->emplace_back(d.flag);
  argv->push_back(value);
}
void Push(std::vector<std::string>* argv, const OptionDef& d, const char* value) {
  Push(argv, d, std::string(value));
}
void Push(std::vector<std::string>* argv, const OptionDef& d, bool on) {
  if (on) argv->emplace_back(d.flag);
}
void Push(std::vector<std::string>* argv, const OptionDef& d, uint64_t value) {
  Push(argv, d, std::to_string(value));
}
void Push(std::vector<std::string>* argv, const OptionDef& d, int64_t value) {
  Push(argv, d, std::to_string(value));
}
void Push(std::vector<std::string>* argv, const OptionDef& d, uint32_t value) {
  Push(argv, d, std::to_string(value));
}
void Push(std::vector<std::string>* argv, const OptionDef& d, int value) {
  Push(argv, d, std::to_string(value));
}
void Push(std::vector<std::string>* argv, const OptionDef& d, double value) {
  Push(argv, d, FormatNumber(value));
}

namespace {

const char* KindName(OptionKind k) {
  switch (k) {
    case OptionKind::kFlag: return "flag";
    case OptionKind::kInt: return "int";
    case OptionKind::kReal: return "float";
    case OptionKind::kText: return "str";
    case OptionKind::kChoice: return "choice";
    case OptionKind::kBytes: return "size";
    case OptionKind::kInts: return "ints";
    case OptionKind::kReals: return "floats";
  }
  return "str";
}

// The default CLI11 shows for the option, typed as its kind; null for none.
nlohmann::json DefaultOf(const OptionDef& d, const CLI::Option& o) {
  if (d.kind == OptionKind::kFlag) return false;
  const std::string text = o.get_default_str();
  if (!d.shows_default || text.empty()) return nullptr;
  if (d.kind == OptionKind::kInt) {
    if (d.min >= 0) {
      Result<uint64_t> v = ParseUint(text, d.flag, 0, UINT64_MAX);
      if (v.ok()) return *v;
    } else if (Result<int64_t> v = ParseInt(text, d.flag, INT64_MIN, INT64_MAX); v.ok()) {
      return *v;
    }
  }
  if (d.kind == OptionKind::kReal) {
    Result<double> v = ParseDouble(text, d.flag, -1e300, 1e300);
    if (v.ok()) return *v;
  }
  return text;
}

}  // namespace

std::string OptionsJson(const CLI::App& app) {
  nlohmann::json out = nlohmann::json::array();
  for (const CLI::Option* o : app.get_options()) {
    const OptionDef* d = nullptr;
    for (const std::string& name : o->get_lnames()) {
      if (d == nullptr) d = FindOption("--" + name);
    }
    if (d == nullptr) continue;
    nlohmann::json j = {{"field", d->Field()},
                        {"flag", std::string(d->flag)},
                        {"set", std::string(d->set)},
                        {"kind", KindName(d->kind)},
                        {"default", DefaultOf(*d, *o)},
                        {"required", o->get_required()},
                        {"help", std::string(d->help)}};
    if (d->kind == OptionKind::kInt || d->kind == OptionKind::kInts) {
      j["min"] = d->min;
      j["max"] = d->max;
    } else if (d->kind == OptionKind::kReal || d->kind == OptionKind::kReals) {
      j["min"] = d->lo;
      j["max"] = d->hi;
    } else if (d->kind == OptionKind::kBytes) {
      j["min"] = 0;
      j["max"] = d->max;
    }
    if (d->kind == OptionKind::kChoice) j["choices"] = d->Choices();
    out.push_back(std::move(j));
  }
  return out.dump(1);
}

}  // namespace nl
