#include "trainer/checkpoint.h"

#include <sstream>
#include <utility>
#include <vector>

#include "trainer/outputs.h"
#include "trainer/rank_error.h"

namespace nl::trainer {
namespace {

std::string ShapeText(const torch::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

// The fields, read before the tensors (so a checkpoint that does not fit is
// named before LibTorch complains about a shape).
Checkpoint ReadFields(const std::string& path, torch::serialize::InputArchive& a) {
  Checkpoint c;
  auto get = [&](const char* k) {
    torch::Tensor t;
    if (!a.try_read(k, t) || t.numel() != 1) {
      throw RankError("cannot resume from " + path + ": it has no " + k +
                      " (not a checkpoint of this trainer, or one from an older version)");
    }
    return t.item<int64_t>();
  };
  c.epoch = get("epoch");
  c.batch = get("batch");
  c.step = get("step");
  c.seed = get("seed");
  c.world = get("world");
  c.batch_size = get("batch_size");
  c.classes = get("num_classes");
  c.train_samples = get("train_samples");
  c10::IValue name;
  if (!a.try_read("model_name", name) || !name.isString()) {
    throw RankError("cannot resume from " + path +
                    ": it has no model name (not a checkpoint of this "
                    "trainer, or one from an older version)");
  }
  c.model = name.toStringRef();
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
  a.write("num_classes", torch::tensor(c.classes));
  a.write("train_samples", torch::tensor(c.train_samples));
  std::ostringstream buf;
  a.save_to(buf);
  WriteAtomically(path, buf.str(), "the checkpoint");
}

Checkpoint LoadCheckpoint(const std::string& path, Net& model, torch::optim::SGD& opt, const Checkpoint& expect) {
  torch::serialize::InputArchive a;
  Checkpoint c;
  try {
    a.load_from(path);
    c = ReadFields(path, a);
  } catch (const c10::Error& e) {
    throw RankError("cannot resume from " + path + ": " + e.what_without_backtrace());
  }
  CheckFits(path, c, expect);
  LoadTensors(path, a, model, opt);
  return c;
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
