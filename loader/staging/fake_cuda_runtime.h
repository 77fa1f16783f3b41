// The fake CUDA runtime's own query (see fake_cuda_runtime.cc): what is
// still allocated, for tests that check every handle is released.
#pragma once

#include <cstdint>

namespace nl {

struct FakeCudaCounts {
  int64_t streams = 0;
  int64_t events = 0;
  int64_t device_allocations = 0;
  int64_t registrations = 0;  // cudaHostRegister'd ranges
};

FakeCudaCounts FakeCudaLiveObjects();

}  // namespace nl
