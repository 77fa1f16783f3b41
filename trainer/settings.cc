#include "trainer/settings.h"

#include <algorithm>
#include <charconv>
#include <cstdio>

#include "formats/crc32c.h"

namespace nl::trainer {
namespace {

std::string Number(double v) {  // the shortest text that reads back as v
  char b[32];
  return std::string(b, std::to_chars(b, b + sizeof b, v).ptr);
}

}  // namespace

std::string DescribeTransform(const TransformConfig& t) {
  std::string s = t.train ? "train" : "eval";
  if (t.train) {
    if (t.pad_crop) s += ", pad-crop " + std::to_string(t.pad_crop);
    if (t.random_resized_crop) {
      s += ", random-resized-crop (scale " + Number(t.rrc_scale[0]) + "-" + Number(t.rrc_scale[1]) + ", ratio " +
           Number(t.rrc_ratio[0]) + "-" + Number(t.rrc_ratio[1]) + ")";
    }
    s += t.flip ? ", flip" : ", no flip";
  }
  s += std::string(", resize ") + (t.resize == ResizeMode::kSquash ? "squash" : "shorter-crop");
  if (t.resize_size) s += " " + std::to_string(t.resize_size);
  s += std::string(", decode ") + DecodeModeName(t.decode);
  s += std::string(", layout ") + (t.layout == Layout::kNCHW ? "nchw" : "nhwc");
  if (t.normalize) {
    s += ", normalize (mean " + Number(t.mean[0]) + "," + Number(t.mean[1]) + "," + Number(t.mean[2]) + "; std " +
         Number(t.std[0]) + "," + Number(t.std[1]) + "," + Number(t.std[2]) + ")";
  }
  return s;
}

std::string RankList(const std::vector<int>& ranks) {
  std::string list;
  for (size_t i = 0; i < ranks.size(); ++i) {
    list += (i ? (i + 1 == ranks.size() ? " and " : ", ") : "") + std::to_string(ranks[i]);
  }
  return list;
}

Settings SharedSettings(const Options& o, const Manifest& m, const std::string& resume_at,
                        const std::string& sequence) {
  const std::string manifest = ManifestToJson(m);
  char crc[16];
  std::snprintf(crc, sizeof crc, "%08x", Crc32c(0, manifest.data(), manifest.size()));
  const SplitInfo* train = m.FindSplit("train");
  return {
      {"--data (its manifest)", std::string("crc32c:") + crc + ", " + std::to_string(m.classes.size()) +
                                    " classes, " + std::to_string(train ? train->num_samples : 0) +
                                    " training samples"},
      {"--model", o.model},
      {"--batch-size", std::to_string(o.batch_size)},
      {"--image-size", std::to_string(o.transform.image_size)},
      {"the train transform", DescribeTransform(o.transform)},
      {"--eval-transform", o.eval_transform},
      {"--order", OrderChoiceName(o.order)},
      // auto resolves by each node's memory, and blocks by --io-memory: the
      // ranks' shares are cut from one sequence of blocks, and a checkpoint
      // records rank 0's window for every rank (capped at a rank's share,
      // windows differ only where the memories do).
      {"the sample order (resolved)", sequence},
      {"--seed", std::to_string(o.seed)},
      {"--epochs", std::to_string(o.epochs)},
      {"--max-steps", std::to_string(o.max_steps)},
      {"--lr", Number(o.lr)},
      {"--momentum", Number(o.momentum)},
      {"--weight-decay", Number(o.weight_decay)},
      {"--label-smoothing", Number(o.label_smoothing)},
      {"--warmup-steps", std::to_string(o.warmup_steps)},
      {"--resize-on", o.resize_on},
      {"--reduce", o.reduce},
      {"--eval-split", o.eval_split},
      {"--resume (where it starts)", resume_at},
  };
}

std::vector<std::string> SettingsDiffer(const std::vector<Settings>& ranks) {
  std::vector<std::string> lines;
  if (ranks.empty()) return lines;
  // The names in rank 0's order, then any that another rank alone has.
  std::vector<std::string> names;
  for (const auto& s : ranks)
    for (const auto& kv : s)
      if (std::find(names.begin(), names.end(), kv.first) == names.end()) names.push_back(kv.first);
  for (const std::string& name : names) {
    std::vector<std::pair<std::string, std::vector<int>>> groups;  // value -> ranks, in first-seen order
    for (size_t r = 0; r < ranks.size(); ++r) {
      std::string value = "(nothing)";
      for (const auto& kv : ranks[r])
        if (kv.first == name) value = kv.second;
      auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& x) { return x.first == value; });
      if (g == groups.end()) {
        groups.push_back({value, {static_cast<int>(r)}});
      } else {
        g->second.push_back(static_cast<int>(r));
      }
    }
    if (groups.size() < 2) continue;
    std::string line = name + " (";
    for (size_t i = 0; i < groups.size(); ++i) {
      const auto& rs = groups[i].second;
      line += (i ? "; " : "") + std::string(rs.size() > 1 ? "ranks " : "rank ") + RankList(rs) + ": " +
              groups[i].first;
    }
    lines.push_back(line + ")");
  }
  return lines;
}

}  // namespace nl::trainer
