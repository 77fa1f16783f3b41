#include "loader/plan/gpu_order.h"

#include <cctype>
#include <cstdio>

#include "base/parse_number.h"

namespace nl {

std::string NormalizeBusId(const std::string& id) {
  unsigned domain = 0, bus = 0, dev = 0, fn = 0;
  char tail = 0;
  if (std::sscanf(id.c_str(), "%x:%x:%x.%x%c", &domain, &bus, &dev, &fn, &tail) != 4) {
    domain = 0;
    if (std::sscanf(id.c_str(), "%x:%x.%x%c", &bus, &dev, &fn, &tail) != 3) return "";
  }
  if (domain > 0xffff || bus > 0xff || dev > 0x1f || fn > 7) return "";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%04x:%02x:%02x.%x", domain, bus, dev, fn);
  return buf;
}

Result<std::vector<VisibleGpu>> ResolveVisibleGpus(const Topology& topo, const GpuOrderInputs& in,
                                                   std::string* note) {
  std::vector<VisibleGpu> out;
  if (!in.cuda_bus_ids.empty()) {
    // The runtime already applied CUDA_VISIBLE_DEVICES and its own ordering.
    for (size_t i = 0; i < in.cuda_bus_ids.size(); ++i) {
      VisibleGpu v;
      v.index = static_cast<int>(i);
      v.gpu.pci_bus_id = NormalizeBusId(in.cuda_bus_ids[i]);
      for (const Gpu& g : topo.gpus())
        if (g.pci_bus_id == v.gpu.pci_bus_id) v.gpu = g;
      out.push_back(v);
    }
    return out;
  }
  const std::vector<Gpu>& pci = topo.gpus();  // ascending bus id
  if (!in.cuda_visible_devices) {
    for (size_t i = 0; i < pci.size(); ++i) out.push_back({static_cast<int>(i), pci[i]});
    return out;
  }
  const std::string& list = *in.cuda_visible_devices;
  if (list.empty()) {  // CUDA then shows no device: not a silent "all GPUs" or "none"
    if (note) *note = "CUDA_VISIBLE_DEVICES is set but empty: no GPU is visible";
    return out;
  }
  std::vector<bool> used(pci.size(), false);
  size_t start = 0;
  while (start < list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    std::string tok = list.substr(start, comma - start);
    start = comma + 1;
    while (!tok.empty() && std::isspace(static_cast<unsigned char>(tok.back()))) tok.pop_back();
    while (!tok.empty() && std::isspace(static_cast<unsigned char>(tok.front()))) tok.erase(0, 1);
    if (tok.rfind("GPU-", 0) == 0 || tok.rfind("MIG-", 0) == 0) {
      return Status::Unsupported(
          "CUDA_VISIBLE_DEVICES entry '" + tok +
          "' is a UUID; without the CUDA driver it cannot be mapped to a PCI "
          "bus id (use indices, or run where the driver is present)");
    }
    // CUDA ignores a non-numeric or out-of-range entry and all after it; a
    // number too long for any integer is just another out-of-range index.
    bool numeric = !tok.empty();
    for (char c : tok) numeric = numeric && std::isdigit(static_cast<unsigned char>(c));
    Result<uint64_t> idx =
        numeric ? ParseUint(tok, "index", 0, pci.size()) : Status::InvalidArgument("not an index");
    if (!idx.ok() || *idx >= pci.size() || used[*idx]) {
      if (note) {
        *note = "CUDA_VISIBLE_DEVICES='" + list + "': entry '" + tok + "' is " +
                (!idx.ok() || *idx >= pci.size()
                     ? "not a GPU index (" + std::to_string(pci.size()) + " GPUs in PCI order)"
                     : "listed twice") +
                "; CUDA ignores it and every entry after it";
      }
      break;
    }
    used[*idx] = true;
    out.push_back({static_cast<int>(out.size()), pci[*idx]});
  }
  return out;
}

}  // namespace nl
