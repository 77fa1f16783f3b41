#include "trainer/models.h"

#include <torch/nn.h>

#include <stdexcept>

namespace nl::trainer {
namespace {

namespace nn = torch::nn;

nn::Conv2d Conv(int64_t in, int64_t out, int64_t k, int64_t stride, int64_t pad) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, k).stride(stride).padding(pad).bias(false));
}

// torchvision's BasicBlock (expansion 1).
struct BasicBlock : nn::Module {
  nn::Conv2d conv1{nullptr}, conv2{nullptr};
  nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
  nn::Sequential downsample{nullptr};
  BasicBlock(int64_t in, int64_t planes, int64_t stride, nn::Sequential down) {
    conv1 = register_module("conv1", Conv(in, planes, 3, stride, 1));
    bn1 = register_module("bn1", nn::BatchNorm2d(planes));
    conv2 = register_module("conv2", Conv(planes, planes, 3, 1, 1));
    bn2 = register_module("bn2", nn::BatchNorm2d(planes));
    if (down) downsample = register_module("downsample", down);
  }
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor identity = downsample ? downsample->forward(x) : x;
    torch::Tensor out = torch::relu(bn1(conv1(x)));
    out = bn2(conv2(out));
    return torch::relu(out + identity);
  }
};

// torchvision's Bottleneck (ResNet v1.5: stride on the 3x3; expansion 4).
struct Bottleneck : nn::Module {
  nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr};
  nn::BatchNorm2d bn1{nullptr}, bn2{nullptr}, bn3{nullptr};
  nn::Sequential downsample{nullptr};
  Bottleneck(int64_t in, int64_t planes, int64_t stride, nn::Sequential down) {
    conv1 = register_module("conv1", Conv(in, planes, 1, 1, 0));
    bn1 = register_module("bn1", nn::BatchNorm2d(planes));
    conv2 = register_module("conv2", Conv(planes, planes, 3, stride, 1));
    bn2 = register_module("bn2", nn::BatchNorm2d(planes));
    conv3 = register_module("conv3", Conv(planes, planes * 4, 1, 1, 0));
    bn3 = register_module("bn3", nn::BatchNorm2d(planes * 4));
    if (down) downsample = register_module("downsample", down);
  }
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor identity = downsample ? downsample->forward(x) : x;
    torch::Tensor out = torch::relu(bn1(conv1(x)));
    out = torch::relu(bn2(conv2(out)));
    out = bn3(conv3(out));
    return torch::relu(out + identity);
  }
};

struct ResNet : Net {
  nn::Conv2d conv1{nullptr};
  nn::BatchNorm2d bn1{nullptr};
  nn::Linear fc{nullptr};
  std::vector<nn::Sequential> layers_;
  int64_t inplanes = 64;

  ResNet(bool bottleneck, const std::vector<int>& layers, int64_t classes) {
    const int64_t expansion = bottleneck ? 4 : 1;
    conv1 = register_module("conv1", Conv(3, 64, 7, 2, 3));
    bn1 = register_module("bn1", nn::BatchNorm2d(64));
    const int64_t planes[4] = {64, 128, 256, 512};
    for (int l = 0; l < 4; ++l) {
      nn::Sequential layer;
      for (int b = 0; b < layers[static_cast<size_t>(l)]; ++b) {
        const int64_t stride = (b == 0 && l > 0) ? 2 : 1;
        nn::Sequential down{nullptr};
        if (b == 0 && (stride != 1 || inplanes != planes[l] * expansion)) {
          down = nn::Sequential(Conv(inplanes, planes[l] * expansion, 1, stride, 0),
                                nn::BatchNorm2d(planes[l] * expansion));
        }
        if (bottleneck) {
          layer->push_back(std::make_shared<Bottleneck>(inplanes, planes[l], stride, down));
        } else {
          layer->push_back(std::make_shared<BasicBlock>(inplanes, planes[l], stride, down));
        }
        inplanes = planes[l] * expansion;
      }
      // torchvision's names: layer1.0.conv1.weight, ...
      layers_.push_back(register_module("layer" + std::to_string(l + 1), layer));
    }
    fc = register_module("fc", nn::Linear(512 * expansion, classes));
    for (auto& m : modules(/*include_self=*/false)) {
      if (auto* c = m->as<nn::Conv2d>()) {
        nn::init::kaiming_normal_(c->weight, 0.0, torch::kFanOut, torch::kReLU);
      } else if (auto* bn = m->as<nn::BatchNorm2d>()) {
        nn::init::ones_(bn->weight);
        nn::init::zeros_(bn->bias);
      }
    }
  }
  torch::Tensor forward(torch::Tensor x) override {
    x = torch::relu(bn1(conv1(x)));
    x = torch::max_pool2d(x, 3, 2, 1);
    for (auto& layer : layers_) x = layer->forward(x);
    x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
    return fc(x);
  }
};

// Two convolutions and a linear layer, no batch norm: DDP over W ranks of
// batch b equals one rank of batch W*b up to float rounding.
struct SmallCnn : Net {
  nn::Conv2d conv1{nullptr}, conv2{nullptr};
  nn::Linear fc{nullptr};
  explicit SmallCnn(int64_t classes) {
    conv1 = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(3, 16, 3).stride(2).padding(1)));
    conv2 = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(16, 32, 3).stride(2).padding(1)));
    fc = register_module("fc", nn::Linear(32, classes));
  }
  torch::Tensor forward(torch::Tensor x) override {
    x = torch::relu(conv1(x));
    x = torch::relu(conv2(x));
    x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
    return fc(x);
  }
};

}  // namespace

std::vector<std::string> ModelNames() { return {"resnet18", "resnet50", "smallcnn"}; }

std::shared_ptr<Net> MakeModel(const std::string& name, int64_t num_classes) {
  if (name == "resnet18") return std::make_shared<ResNet>(false, std::vector<int>{2, 2, 2, 2}, num_classes);
  if (name == "resnet50") return std::make_shared<ResNet>(true, std::vector<int>{3, 4, 6, 3}, num_classes);
  if (name == "smallcnn") return std::make_shared<SmallCnn>(num_classes);
  throw std::invalid_argument("unknown model '" + name + "' (resnet18, resnet50 or smallcnn)");
}

}  // namespace nl::trainer
