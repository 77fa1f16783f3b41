// Which GPU a CUDA ordinal names. GPU index = CUDA ordinal under
// CUDA_DEVICE_ORDER=PCI_BUS_ID: visible GPUs in ascending PCI bus id, then
// CUDA_VISIBLE_DEVICES (a list of indices into that order; reordering is
// honoured; as in CUDA, the list ends at the first invalid entry). When the
// CUDA runtime finds devices, cudaDeviceGetPCIBusId is authoritative and
// the PCI order is not used. Never assume GPU index = position in any other list.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "loader/plan/topology.h"

namespace nl {

struct VisibleGpu {
  int index = 0;  // CUDA ordinal
  Gpu gpu;        // numa_node -1 when the topology does not show this device
};

struct GpuOrderInputs {
  std::optional<std::string> cuda_visible_devices;  // the variable, if set
  std::vector<std::string> cuda_bus_ids;  // from the CUDA runtime, by ordinal; empty without one
};

// Pure: the visible GPUs in CUDA ordinal order. When CUDA_VISIBLE_DEVICES
// holds an entry that ends the list early (not an index of a GPU, or listed
// twice), *note (if given) says which and why; so it does when the variable
// is set but empty (no GPU is visible).
Result<std::vector<VisibleGpu>> ResolveVisibleGpus(const Topology& topo, const GpuOrderInputs& in,
                                                   std::string* note = nullptr);

// "0000:82:00.0" in lower case from any of CUDA's, NVML's or hwloc's spellings
// ("00000000:82:00.0", "0000:82:00.0"). Empty if unparsable.
std::string NormalizeBusId(const std::string& id);

// Asks the CUDA runtime (when built with it) for each device's PCI bus id.
// Returns empty, with *why set, when there is no runtime, driver or device.
std::vector<std::string> QueryCudaBusIds(std::string* why);

}  // namespace nl
