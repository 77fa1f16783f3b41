// GPU order: CUDA ordinals from PCI order, CUDA_VISIBLE_DEVICES (with CUDA's
// rule that the list ends at the first invalid entry) and the CUDA runtime.
#include "loader/plan/gpu_order.h"

#include <gtest/gtest.h>

#include "tests/support/test_topologies.h"

namespace nl {
namespace {

Topology Load(const std::string& name) { return testing::LoadTestTopology(name); }

TEST(GpuOrder, PciOrderAndCudaVisibleDevices) {
  Topology t = Load("incident.xml");
  auto ids = [&](const std::optional<std::string>& cvd) {
    Result<std::vector<VisibleGpu>> v = ResolveVisibleGpus(t, {cvd, {}});
    EXPECT_TRUE(v.ok()) << v.status().ToString();
    std::vector<std::string> out;
    for (size_t i = 0; i < v->size(); ++i) {
      EXPECT_EQ((*v)[i].index, static_cast<int>(i));
      out.push_back((*v)[i].gpu.pci_bus_id);
    }
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(ids(std::nullopt), (V{"0000:02:00.0", "0000:03:00.0", "0000:81:00.0", "0000:82:00.0"}));
  EXPECT_EQ(ids("0,2,3"), (V{"0000:02:00.0", "0000:81:00.0", "0000:82:00.0"}));
  EXPECT_EQ(ids("1,3"), (V{"0000:03:00.0", "0000:82:00.0"}));
  EXPECT_EQ(ids("3,2,1,0"), (V{"0000:82:00.0", "0000:81:00.0", "0000:03:00.0", "0000:02:00.0"}));
  EXPECT_EQ(ids(""), V{});
  EXPECT_EQ(ids("1,7,2"), V{"0000:03:00.0"});  // as CUDA: stops at the first invalid entry
  EXPECT_EQ(ids("-1"), V{});
  Status uuid = ResolveVisibleGpus(t, {"GPU-8a1f", {}}).status();
  EXPECT_EQ(uuid.code(), StatusCode::kUnsupported);
  EXPECT_NE(uuid.message().find("CUDA_VISIBLE_DEVICES entry 'GPU-8a1f' is a UUID"),
            std::string::npos)
      << uuid.ToString();
}

TEST(GpuOrder, CudaRuntimeIsAuthoritative) {
  Topology t = Load("incident.xml");
  // The runtime's own order (e.g. FASTEST_FIRST), in NVML's 8-digit spelling.
  Result<std::vector<VisibleGpu>> v =
      ResolveVisibleGpus(t, {"0,1", {"00000000:81:00.0", "0000:02:00.0"}});
  ASSERT_TRUE(v.ok());
  ASSERT_EQ(v->size(), 2u);
  EXPECT_EQ((*v)[0].gpu.pci_bus_id, "0000:81:00.0");
  EXPECT_EQ((*v)[0].gpu.numa_node, 1);
  EXPECT_EQ((*v)[1].gpu.numa_node, 0);
  EXPECT_EQ(NormalizeBusId("0000:8A:00.0"), "0000:8a:00.0");
  EXPECT_EQ(NormalizeBusId("nonsense"), "");
}

TEST(GpuOrder, AnEntryTooLongForAnyIntegerEndsTheListWithANote) {
  Topology t = Load("incident.xml");
  std::string note;
  Result<std::vector<VisibleGpu>> v =
      ResolveVisibleGpus(t, {"1,99999999999999999999999,2", {}}, &note);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  ASSERT_EQ(v->size(), 1u);
  EXPECT_EQ((*v)[0].gpu.pci_bus_id, "0000:03:00.0");
  EXPECT_EQ(note,
            "CUDA_VISIBLE_DEVICES='1,99999999999999999999999,2': entry "
            "'99999999999999999999999' is not a GPU index (4 GPUs in PCI order); CUDA ignores "
            "it and every entry after it");
  note.clear();
  v = ResolveVisibleGpus(t, {"2,2", {}}, &note);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->size(), 1u);
  EXPECT_NE(note.find("entry '2' is listed twice"), std::string::npos) << note;
}

TEST(GpuOrder, SetButEmptyCudaVisibleDevicesIsNoted) {
  Topology t = Load("incident.xml");
  std::string note;
  Result<std::vector<VisibleGpu>> v = ResolveVisibleGpus(t, {"", {}}, &note);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_TRUE(v->empty());
  EXPECT_EQ(note, "CUDA_VISIBLE_DEVICES is set but empty: no GPU is visible");
}

}  // namespace
}  // namespace nl
