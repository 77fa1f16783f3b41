// The models: ResNet-18 and ResNet-50 with torchvision's architecture
// (torchvision.models.resnet18/resnet50: 7x7 stem, max pool, BasicBlock
// [2,2,2,2] / Bottleneck [3,4,6,3] with the stride on the 3x3 convolution,
// global average pool, one linear layer; Kaiming-normal fan-out
// convolutions, batch-norm weights 1 and biases 0), and a small CNN without
// batch norm whose DDP result can be compared exactly with one rank's.
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

namespace nl::trainer {

struct Net : torch::nn::Module {
  virtual torch::Tensor forward(torch::Tensor x) = 0;
};

// "resnet18", "resnet50" or "smallcnn"; throws std::invalid_argument otherwise.
std::shared_ptr<Net> MakeModel(const std::string& name, int64_t num_classes);
std::vector<std::string> ModelNames();

}  // namespace nl::trainer
