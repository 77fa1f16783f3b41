#include "trainer/checkpoint.h"

#include <sys/types.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <sstream>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include "formats/crc32c.h"
#include "trainer/outputs.h"
#include "trainer/rank_error.h"

namespace nl::trainer {
namespace {

std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

std::string ShapeText(const torch::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

// A checkpoint is a zip archive laid out as LibTorch's: it begins with a
// local header whose name is in a folder ("archive/..."), and ends with an
// end record. What is not so is named here, before LibTorch reads it (whose
// error paths also leak what they had read): an empty file, or one that
// begins as a zip but whose end record is missing, was cut short (a copy
// that stopped, a full disk outside the atomic writer); a zip whose first
// bytes are broken is damaged; a zip of entries outside a folder (another
// program's) and anything else are not a checkpoint. "" when the shape is
// a checkpoint's.
std::string ShapeProblem(const std::string& path) {
  std::string head, tail;
  off_t size = -1;
  if (FILE* f = std::fopen(path.c_str(), "rb")) {
    char b[512] = {0};
    head.assign(b, std::fread(b, 1, sizeof b, f));
    // The end record (22 bytes, then a comment of up to 64 KiB) lies in the last 65,557 bytes.
    if (fseeko(f, 0, SEEK_END) == 0 && (size = ftello(f)) > 0) {
      const off_t from = std::max<off_t>(0, size - 65557);
      tail.resize(static_cast<size_t>(size - from));
      if (fseeko(f, from, SEEK_SET) != 0 || std::fread(tail.data(), 1, tail.size(), f) != tail.size()) tail.clear();
    }
    std::fclose(f);
  }
  if (size < 0) return "";  // (unreadable: LibTorch says why)
  const std::string again = ": resume from another checkpoint";
  if (size == 0) return "it is empty (0 bytes): a damaged checkpoint, cut short to nothing" + again;
  // The end record: its signature, then its comment's length at bytes 20-21,
  // that comment ending the file (a signature elsewhere is only data).
  const std::string end_sig("PK\x05\x06", 4);
  bool ends = false;
  for (size_t at = tail.rfind(end_sig); at != std::string::npos && !ends;
       at = at ? tail.rfind(end_sig, at - 1) : std::string::npos) {
    const auto byte = [&](size_t i) { return static_cast<size_t>(static_cast<unsigned char>(tail[i])); };
    ends = at + 22 <= tail.size() && at + 22 + (byte(at + 20) | byte(at + 21) << 8) == tail.size();
  }
  const bool zip_head = head.compare(0, 4, std::string("PK\x03\x04", 4)) == 0;
  if (zip_head && !ends) {  // (or bytes added after its end: rarer than a copy cut short)
    return "it is a damaged checkpoint: cut short (its " + std::to_string(size) +
           " bytes begin as a checkpoint's archive, but the archive's end is missing)" + again;
  }
  if (!zip_head && ends) return "it is a damaged checkpoint (its first bytes are not an archive's)" + again;
  if (!zip_head) return "it is not a checkpoint of this trainer (not a zip archive, as checkpoints are)";
  // The first entry's name (its length at bytes 26-27, the name from byte 30).
  const size_t name_len = static_cast<unsigned char>(head[26]) | static_cast<unsigned char>(head[27]) << 8;
  const std::string name = head.size() >= 30 + name_len ? head.substr(30, name_len) : std::string();
  if (!name.empty() && name.find('/') == std::string::npos) {
    return "it is not a checkpoint of this trainer (a zip archive whose entries, " + name +
           " first, are not a checkpoint's)";
  }
  return "";
}

// Why LibTorch could not read an archive of a checkpoint's shape, in our words.
std::string WhyUnreadable(const std::string& libtorch) {
  const std::string told = " (LibTorch: " + libtorch + ")";
  if (libtorch.find("hasRecord") != std::string::npos || libtorch.find("failed locating file") != std::string::npos) {
    return "it is not a checkpoint of this trainer (a zip archive without a checkpoint's records" + told + ")";
  }
  return "it is a damaged checkpoint (its archive cannot be read): resume from another checkpoint" + told;
}

std::string Older(const std::string& path, const std::string& what) {
  return "cannot resume from " + path + ": it has no " + what +
         " (not a checkpoint of this trainer, or one from an older version)";
}

// The optimizer state's key for parameter p: LibTorch 1.13 keys it by the
// TensorImpl's address as text, later releases by the address itself.
template <typename Map>
typename Map::key_type StateKey(const Map&, const torch::Tensor& p) {
  if constexpr (std::is_same_v<typename Map::key_type, std::string>) {
    return c10::guts::to_string(p.unsafeGetTensorImpl());
  } else {
    return static_cast<typename Map::key_type>(p.unsafeGetTensorImpl());
  }
}

// Every tensor a checkpoint holds, named: the model's parameters and
// buffers, and the optimizer's momentum of each parameter that has one.
std::vector<std::pair<std::string, torch::Tensor>> NamedTensors(Net& model, torch::optim::SGD& opt) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& p : model.named_parameters()) out.emplace_back("model parameter " + p.key(), p.value());
  for (const auto& b : model.named_buffers()) out.emplace_back("model buffer " + b.key(), b.value());
  auto& state = opt.state();
  for (const auto& p : model.named_parameters()) {
    auto it = state.find(StateKey(state, p.value()));
    if (it == state.end()) continue;
    const auto& s = static_cast<const torch::optim::SGDParamState&>(*it->second);
    if (s.momentum_buffer().defined()) out.emplace_back("optimizer momentum of " + p.key(), s.momentum_buffer());
  }
  return out;
}

int64_t TensorCrc(const torch::Tensor& t) {
  const torch::Tensor c = t.detach().to(torch::kCPU).contiguous();
  return Crc32c(0, c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size());
}

void WriteChecksums(torch::serialize::OutputArchive& a, Net& model, torch::optim::SGD& opt) {
  std::string names;
  std::vector<int64_t> crcs;
  for (const auto& [name, t] : NamedTensors(model, opt)) {
    names += name + "\n";
    crcs.push_back(TensorCrc(t));
  }
  a.write("tensor_names", c10::IValue(names));
  a.write("tensor_crc32c", torch::tensor(crcs, torch::kInt64));
}

// After the load: every tensor against the checksum written with it.
void VerifyChecksums(const std::string& path, torch::serialize::InputArchive& a, Net& model,
                     torch::optim::SGD& opt) {
  c10::IValue names;
  torch::Tensor crcs;
  if (!a.try_read("tensor_names", names) || !names.isString() || !a.try_read("tensor_crc32c", crcs) ||
      crcs.scalar_type() != torch::kInt64 || crcs.dim() != 1) {
    throw RankError(Older(path, "checksums"));
  }
  std::vector<std::string> saved;
  const std::string& text = names.toStringRef();
  for (size_t at = 0, nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1) {
    saved.push_back(text.substr(at, nl - at));
  }
  if (static_cast<int64_t>(saved.size()) != crcs.numel()) {
    throw RankError("cannot resume from " + path + ": its checksums are damaged (" + std::to_string(saved.size()) +
                    " names, " + std::to_string(crcs.numel()) + " checksums)");
  }
  const auto tensors = NamedTensors(model, opt);
  for (const auto& [name, t] : tensors) {
    const auto it = std::find(saved.begin(), saved.end(), name);
    if (it == saved.end()) {
      throw RankError("cannot resume from " + path + ": it has no checksum for its " + name +
                      " (the file is damaged)");
    }
    if (TensorCrc(t) != crcs[it - saved.begin()].item<int64_t>()) {
      throw RankError("cannot resume from " + path + ": its " + name +
                      " does not match the checksum written with it (the file is damaged: resume from another "
                      "checkpoint)");
    }
  }
  if (tensors.size() != saved.size()) {
    throw RankError("cannot resume from " + path + ": it holds " + std::to_string(saved.size()) +
                    " checksummed tensors and this model and optimizer " + std::to_string(tensors.size()));
  }
}

// The fields, read before the tensors (so a checkpoint that does not fit is
// named before LibTorch complains about a shape).
Checkpoint ReadFields(const std::string& path, torch::serialize::InputArchive& a) {
  Checkpoint c;
  auto tensor = [&](const char* k) {
    torch::Tensor t;
    if (!a.try_read(k, t) || t.numel() != 1) throw RankError(Older(path, k));
    return t;
  };
  auto get = [&](const char* k) { return tensor(k).item<int64_t>(); };
  auto real = [&](const char* k) { return tensor(k).item<double>(); };
  c.epoch = get("epoch");
  c.batch = get("batch");
  c.step = get("step");
  c.seed = get("seed");
  c.world = get("world");
  c.batch_size = get("batch_size");
  c.classes = get("num_classes");
  c.train_samples = get("train_samples");
  c.epochs = get("epochs");
  c.max_steps = get("max_steps");
  c.warmup_steps = get("warmup_steps");
  c.image_size = get("image_size");
  c.lr = real("lr");
  c.momentum = real("momentum");
  c.weight_decay = real("weight_decay");
  c.label_smoothing = real("label_smoothing");
  c10::IValue name;
  if (!a.try_read("model_name", name) || !name.isString()) {
    throw RankError("cannot resume from " + path +
                    ": it has no model name (not a checkpoint of this "
                    "trainer, or one from an older version)");
  }
  c.model = name.toStringRef();
  c10::IValue order;
  if (a.try_read("order", order)) {  // (older checkpoints have none)
    if (!order.isString()) throw RankError(Older(path, "order"));
    c.order = order.toStringRef();
    c.io_memory = get("io_memory");
  }
  return c;
}

void CheckFits(const std::string& path, const Checkpoint& c, const Checkpoint& expect) {
  const std::string from = "the checkpoint " + path + " was written for ";
  if (c.model != expect.model) {
    throw RankError(from + "--model " + c.model + "; this run has --model " + expect.model);
  }
  if (c.classes != expect.classes || c.train_samples != expect.train_samples) {
    throw RankError(from + "a data set of " + std::to_string(c.classes) + " classes and " +
                    std::to_string(c.train_samples) + " training samples; --data has " +
                    std::to_string(expect.classes) + " and " + std::to_string(expect.train_samples) +
                    " (resume on the data set it was trained on)");
  }
  if (c.world != expect.world || c.batch_size != expect.batch_size) {
    throw RankError(from + std::to_string(c.world) + " ranks of batch " + std::to_string(c.batch_size) +
                    "; this run has " + std::to_string(expect.world) + " of " + std::to_string(expect.batch_size) +
                    " (the sample order would differ): resume with the same ranks and batch size");
  }
  if (c.order.empty() && expect.order != "random") {  // random order's sequence is as it was
    throw RankError(from + "a run whose sample order it does not record (an earlier trainer, which sized blocks "
                    "otherwise); this run reads them in order " + expect.order +
                    ": resume with --order random if that run read in random order, else start again");
  }
  if (!c.order.empty() && c.order != expect.order) {
    const bool blocks = c.order != "random";
    throw RankError(from + "a run that read its samples in order " + c.order + "; this run reads them in order " +
                    expect.order + " (the rest of the epoch would train some samples twice and others never): " +
                    "resume with --order " + (blocks ? "blocks --io-memory " + std::to_string(c.io_memory) : "random") +
                    (blocks ? " on the same ranks" : ""));
  }
}

// Loads the tensors, then checks each one's shape against the model's before the load.
void LoadTensors(const std::string& path, torch::serialize::InputArchive& a, Net& model, torch::optim::SGD& opt) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  for (const auto& p : model.named_parameters()) shapes.push_back({p.key(), p.value().sizes().vec()});
  for (const auto& b : model.named_buffers()) shapes.push_back({b.key(), b.value().sizes().vec()});
  torch::serialize::InputArchive m, o;
  try {
    a.read("model", m);
    model.load(m);
    a.read("optimizer", o);
    opt.load(o);
  } catch (const c10::Error& e) {
    throw RankError("cannot resume from " + path + ": " + e.what_without_backtrace());
  }
  size_t i = 0;
  auto check = [&](const std::string& key, const torch::Tensor& t) {
    if (i < shapes.size() && shapes[i].first == key && t.sizes().vec() != shapes[i].second) {
      throw RankError("cannot resume from " + path + ": its " + key + " is " + ShapeText(t) +
                      ", which does not fit this model");
    }
    ++i;
  };
  for (const auto& p : model.named_parameters()) check(p.key(), p.value());
  for (const auto& b : model.named_buffers()) check(b.key(), b.value());
}

}  // namespace

void SaveCheckpoint(const std::string& path, Net& model, torch::optim::SGD& opt, const Checkpoint& c) {
  torch::serialize::OutputArchive a, m, o;
  model.save(m);
  opt.save(o);
  a.write("model", m);
  a.write("optimizer", o);
  a.write("epoch", torch::tensor(c.epoch));
  a.write("batch", torch::tensor(c.batch));
  a.write("step", torch::tensor(c.step));
  a.write("seed", torch::tensor(c.seed));
  a.write("world", torch::tensor(c.world));
  a.write("batch_size", torch::tensor(c.batch_size));
  a.write("model_name", c10::IValue(c.model));
  a.write("order", c10::IValue(c.order));
  a.write("io_memory", torch::tensor(c.io_memory));
  a.write("num_classes", torch::tensor(c.classes));
  a.write("train_samples", torch::tensor(c.train_samples));
  a.write("epochs", torch::tensor(c.epochs));
  a.write("max_steps", torch::tensor(c.max_steps));
  a.write("warmup_steps", torch::tensor(c.warmup_steps));
  a.write("image_size", torch::tensor(c.image_size));
  a.write("lr", torch::tensor(c.lr, torch::kFloat64));
  a.write("momentum", torch::tensor(c.momentum, torch::kFloat64));
  a.write("weight_decay", torch::tensor(c.weight_decay, torch::kFloat64));
  a.write("label_smoothing", torch::tensor(c.label_smoothing, torch::kFloat64));
  WriteChecksums(a, model, opt);
  std::ostringstream buf;
  a.save_to(buf);
  WriteAtomically(path, buf.str(), "the checkpoint");
}

Checkpoint LoadCheckpoint(const std::string& path, Net& model, torch::optim::SGD& opt, const Checkpoint& expect) {
  if (const std::string why = ShapeProblem(path); !why.empty()) throw RankError("cannot resume from " + path + ": " + why);
  torch::serialize::InputArchive a;
  Checkpoint c;
  try {
    a.load_from(path);
  } catch (const c10::Error& e) {
    throw RankError("cannot resume from " + path + ": " + WhyUnreadable(FirstLine(e.what_without_backtrace())));
  }
  try {
    c = ReadFields(path, a);
  } catch (const c10::Error& e) {
    throw RankError("cannot resume from " + path + ": " + e.what_without_backtrace());
  }
  CheckFits(path, c, expect);
  LoadTensors(path, a, model, opt);
  try {
    VerifyChecksums(path, a, model, opt);
  } catch (const c10::Error& e) {
    throw RankError("cannot resume from " + path + ": its checksums cannot be read: " + e.what_without_backtrace());
  }
  return c;
}

std::vector<std::string> RunChanges(const Checkpoint& saved, const Checkpoint& now) {
  std::vector<std::string> out;
  auto whole = [&](const char* flag, int64_t was, int64_t is) {
    if (was != is) out.push_back(std::string(flag) + " " + std::to_string(is) + " (the checkpoint's run: " +
                                 std::to_string(was) + ")");
  };
  auto text = [](double v) {  // the shortest text that reads back as v
    char b[32];
    return std::string(b, std::to_chars(b, b + sizeof b, v).ptr);
  };
  auto real = [&](const char* flag, double was, double is) {
    if (was != is) out.push_back(std::string(flag) + " " + text(is) + " (the checkpoint's run: " + text(was) + ")");
  };
  whole("--epochs", saved.epochs, now.epochs);
  whole("--image-size", saved.image_size, now.image_size);
  real("--lr", saved.lr, now.lr);
  whole("--warmup-steps", saved.warmup_steps, now.warmup_steps);
  real("--momentum", saved.momentum, now.momentum);
  real("--weight-decay", saved.weight_decay, now.weight_decay);
  real("--label-smoothing", saved.label_smoothing, now.label_smoothing);
  return out;
}

uint64_t ParamHash(Net& model) {
  uint64_t h = 1469598103934665603ull;
  for (const auto& p : model.parameters()) {
    torch::Tensor c = p.detach().to(torch::kCPU).contiguous();
    const auto* bytes = static_cast<const unsigned char*>(c.data_ptr());
    const size_t n = static_cast<size_t>(c.numel()) * c.element_size();
    for (size_t i = 0; i < n; ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  }
  return h;
}

}  // namespace nl::trainer
