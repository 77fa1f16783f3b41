// QueryCudaBusIds with the CUDA runtime (built when the toolkit is found).
#include <cuda_runtime_api.h>

#include "loader/plan/gpu_order.h"

namespace nl {

std::vector<std::string> QueryCudaBusIds(std::string* why) {
  std::vector<std::string> ids;
  int n = 0;
  cudaError_t rc = cudaGetDeviceCount(&n);
  if (rc != cudaSuccess) {
    if (why) *why = std::string("CUDA runtime: ") + cudaGetErrorString(rc);
    return ids;
  }
  for (int i = 0; i < n; ++i) {
    char buf[64] = {};
    if (cudaDeviceGetPCIBusId(buf, sizeof buf, i) != cudaSuccess) {
      if (why) *why = "cudaDeviceGetPCIBusId failed for device " + std::to_string(i);
      return {};
    }
    ids.push_back(buf);
  }
  if (n == 0 && why) *why = "CUDA runtime: no devices";
  return ids;
}

}  // namespace nl
