// The path choice in a build without the CUDA toolkit: always the CPU path.
#include <string>

#include "loader/staging/staging_backend.h"

namespace nl {

Result<BackendChoice> ChooseBackend(RingClient* client, const StagingOptions& options) {
  if (options.device >= 0) {
    return Status::InvalidArgument("staging: device " + std::to_string(options.device) +
                                   " asked for, but this build has no CUDA (the toolkit was not "
                                   "found when it was configured)");
  }
  return BackendChoice{MakeCpuBackend(client), "CPU path: built without CUDA"};
}

}  // namespace nl
