// Test helper: loads one of the topology files in tests/topologies/.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "loader/plan/topology.h"

namespace nl::testing {

inline Topology LoadTestTopology(const std::string& name) {
  Result<Topology> t = Topology::FromXmlFile(std::string(NL_TOPOLOGY_DIR) + "/" + name);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return std::move(*t);
}

}  // namespace nl::testing
