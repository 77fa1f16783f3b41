// A training checkpoint: the model, the optimizer and where the run stood
// (epoch, batch, step), with what it fits (model, classes, data set size,
// ranks, batch size: the sample order and the tensors' shapes depend on
// them). Save writes through the one atomic writer; Load refuses a
// checkpoint that does not fit, with a message saying what differs.
// Errors are RankError (kOwn).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/optim/sgd.h>

#include "trainer/models.h"

namespace nl::trainer {

struct Checkpoint {
  int64_t epoch = 0, batch = 0, step = 0, seed = 0, world = 0, batch_size = 0;
  // What it fits: the model and the data set it was trained on.
  std::string model;
  int64_t classes = 0, train_samples = 0;
  // The run it belongs to: a resume with other values would restart the
  // learning-rate schedule or change the images (RunChanges; max_steps is
  // only where that run stopped, and may change).
  int64_t epochs = 0, max_steps = 0, warmup_steps = 0, image_size = 0;
  double lr = 0, momentum = 0, weight_decay = 0, label_smoothing = 0;
  // The order the run read its samples in, resolved (SequenceOf: "random",
  // or "blocks of K samples, W a window"), and the read-ahead memory its
  // blocks were sized from: a resume in another order would train some
  // samples twice and others never. Empty: a checkpoint of an older trainer
  // (its order unknown: resumed in random order only, whose sequence is as
  // it was; blocks were sized otherwise then).
  std::string order;
  int64_t io_memory = 0;
};

// What a resume would change of the saved run: "--epochs 3 (the
// checkpoint's run: 2)", one entry a setting; empty when nothing.
std::vector<std::string> RunChanges(const Checkpoint& saved, const Checkpoint& now);

// Serialised in memory first (LibTorch's file writer throws from its
// destructor on a short write, which aborts), then written atomically: a
// full disk says "cannot write the checkpoint <path> (as <temporary>): No
// space left on device" and leaves no temporary.
void SaveCheckpoint(const std::string& path, Net& model, torch::optim::SGD& opt, const Checkpoint& c);

// Loads path into model and opt after checking it fits `expect` (its
// model, classes, train_samples, world, batch_size and order); every tensor's
// shape is checked after the load too, and every tensor (the model's
// parameters and buffers, the optimizer's momentum) against the CRC-32C
// written with it: a damaged file is refused, naming the tensor (model and
// opt are then unusable: the caller stops). Returns the checkpoint's fields.
Checkpoint LoadCheckpoint(const std::string& path, Net& model, torch::optim::SGD& opt, const Checkpoint& expect);

// FNV-1a over the parameters' bytes (on the CPU): equal on every rank after
// every step of a correct DDP run.
uint64_t ParamHash(Net& model);

}  // namespace nl::trainer
