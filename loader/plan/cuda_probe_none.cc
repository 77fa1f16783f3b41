// QueryCudaBusIds without the CUDA toolkit: the PCI order is used.
#include "loader/plan/gpu_order.h"

namespace nl {

std::vector<std::string> QueryCudaBusIds(std::string* why) {
  if (why) *why = "built without the CUDA runtime";
  return {};
}

}  // namespace nl
