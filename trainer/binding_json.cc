#include "trainer/binding_json.h"

#include <nlohmann/json.hpp>

namespace nl::trainer {

std::string BindingToJson(const RankBinding& b) {
  const nlohmann::json j = {{"rank", b.rank},
                            {"host", b.host},
                            {"loader_cpus", b.loader_cpus},
                            {"loader_node", b.loader_node},
                            {"planned_node", b.planned_node},
                            {"gpu", b.gpu},
                            {"gpu_node", b.gpu_node},
                            {"loader_threads", b.loader_threads},
                            {"misbound", b.misbound},
                            {"simulated_delay_ms", b.simulated_delay_ms},
                            {"simulated_phase", b.simulated_phase}};
  return j.dump();
}

RankBinding BindingFromJson(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text);
  RankBinding b;
  b.rank = j.at("rank");
  b.host = j.at("host");
  b.loader_cpus = j.at("loader_cpus");
  b.loader_node = j.at("loader_node");
  b.planned_node = j.at("planned_node");
  b.gpu = j.at("gpu");
  b.gpu_node = j.at("gpu_node");
  b.loader_threads = j.at("loader_threads");
  b.misbound = j.at("misbound");
  b.simulated_delay_ms = j.at("simulated_delay_ms");
  b.simulated_phase = j.at("simulated_phase");
  return b;
}

}  // namespace nl::trainer
