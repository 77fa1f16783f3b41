#include "trainer/diagnostics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

namespace nl::trainer {
namespace {

std::string Ms(double ms) {
  char buf[32];
  if (ms >= 100) {
    std::snprintf(buf, sizeof buf, "%.0f", ms);
  } else if (ms >= 10) {
    std::snprintf(buf, sizeof buf, "%.1f", ms);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f", ms);
  }
  return buf;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string Ranks(const std::vector<int>& r) {
  std::string s = r.size() > 1 ? "Ranks " : "Rank ";
  for (size_t i = 0; i < r.size(); ++i) {
    if (i > 0) s += i + 1 == r.size() ? " and " : ", ";
    s += std::to_string(r[i]);
  }
  return s;
}

const RankBinding* Find(const std::vector<RankBinding>& b, int rank) {
  for (const RankBinding& x : b) {
    if (x.rank == rank) return &x;
  }
  return nullptr;
}

std::string GpuText(const RankBinding& b) {
  if (b.gpu < 0) return "cpu";
  return "cuda:" + std::to_string(b.gpu) + " (node " +
         (b.gpu_node >= 0 ? std::to_string(b.gpu_node) : std::string("?")) + ")";
}

}  // namespace

Summary Summarize(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / static_cast<double>(v.size());
  std::sort(v.begin(), v.end());
  const size_t k = static_cast<size_t>(std::ceil(0.95 * static_cast<double>(v.size())));
  s.p95 = v[std::min(v.size() - 1, k == 0 ? 0 : k - 1)];
  return s;
}

std::string NodeList(uint64_t bits) {
  std::string s;
  for (int n = 0; n < 64; ++n) {
    if (bits & (uint64_t{1} << n)) {
      if (!s.empty()) s += ',';
      s += std::to_string(n);
    }
  }
  return s.empty() ? "?" : s;
}

std::string NodeText(int bound, uint64_t ran_on) {
  const std::string b = bound >= 0 ? std::to_string(bound) : "unbound";
  if (ran_on == 0 || (bound >= 0 && bound < 64 && ran_on == (uint64_t{1} << bound))) return bound >= 0 ? b : "-";
  return (bound >= 0 ? b + ", ran " : "ran ") + NodeList(ran_on);
}

namespace {

// The slowest rank by the rule in diagnostics.h (its data wait more than
// twice the others' median, over 10% of its step and at least 1 ms), or -1;
// *others_median: the others' median data wait.
// The median of the other ranks' mean `field` (data_ms, compute_ms) than rank i's.
double OthersMedian(const std::vector<RankTiming>& t, size_t i, Summary RankTiming::*field) {
  std::vector<double> others;
  for (size_t j = 0; j < t.size(); ++j) {
    if (j != i) others.push_back((t[j].*field).mean);
  }
  return Median(others);
}

int FindStraggler(const std::vector<RankTiming>& t, double* others_median) {
  int worst = -1;
  double worst_data = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    const double med = OthersMedian(t, i, &RankTiming::data_ms);
    const double d = t[i].data_ms.mean;
    const bool slow = d > 2 * med && d > 0.10 * t[i].step_ms.mean && d >= 1.0;
    if (slow && d > worst_data) {
      worst = static_cast<int>(i);
      worst_data = d;
      *others_median = med;
    }
  }
  return worst;
}

// With no data straggler: the rank whose compute stands out (diagnostics.h), or -1.
int FindComputeStraggler(const std::vector<RankTiming>& t, double* others_median) {
  int worst = -1;
  double worst_excess = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    const double med = OthersMedian(t, i, &RankTiming::compute_ms);
    const double c = t[i].compute_ms.mean;
    const double excess = c - med;
    const bool slow = c > 1.5 * med && excess >= 1.0 && excess > 0.10 * t[i].step_ms.mean;
    if (slow && excess > worst_excess) {
      worst = static_cast<int>(i);
      worst_excess = excess;
      *others_median = med;
    }
  }
  return worst;
}

// Bound to another node than its plan's, or ran there: the sentence's rest.
void SayBindingCause(const RankTiming& s, const RankBinding& b, bool bound_elsewhere, std::ostringstream& o) {
  const int should = b.planned_node;
  const std::string where_should =
      b.gpu >= 0 ? "its GPU (cuda:" + std::to_string(b.gpu) + ") is on node " + std::to_string(should)
                 : "its plan puts it on node " + std::to_string(should);
  if (bound_elsewhere) {
    o << "Its loader runs on NUMA node " << b.loader_node << " (cpus " << b.loader_cpus << ") while "
      << where_should << ": a binding problem";
    if (b.misbound) o << " (made on purpose with --misbind-rank " << s.rank << ")";
    o << ". Bind its loader to node " << should << " (the default plan does; `loader topo` shows it).";
  } else {
    o << "Its loader is bound to node " << b.loader_node << " but its threads ran on node(s) "
      << NodeList(s.ran_on_nodes) << ": a binding problem (something overrode the binding: "
      << "taskset, cgroups or numactl around the job). Let the plan bind it.";
  }
}

// Bound right but too slow for the step rate.
void SayCapacityCause(const RankTiming& s, const RankBinding& b, const std::vector<int>& previous,
                      std::ostringstream& o) {
  o << "Its loader is bound right (";
  if (b.loader_node >= 0) {
    o << "node " << b.loader_node << ", cpus " << b.loader_cpus;
  } else {
    o << "unbound";
  }
  o << ") but its " << b.loader_threads << " thread" << (b.loader_threads == 1 ? "" : "s")
    << " cannot keep up with the step rate: a capacity problem. Give it more loader threads "
       "(--loader-threads) or cores, or resize on the device (--resize-on device).";
  bool moved = false;
  for (int p : previous) moved = moved || (p >= 0 && p != s.rank);
  if (moved) o << " The straggler moves between ranks from epoch to epoch, as capacity stragglers do.";
}

// The cause (binding, simulated, capacity), said after the sentence's start.
std::string SayCause(const RankTiming& s, const RankBinding& b, const std::vector<int>& previous,
                     std::ostringstream& o) {
  const bool bound_elsewhere = b.loader_node >= 0 && b.planned_node >= 0 && b.loader_node != b.planned_node;
  const uint64_t expected_bits = b.loader_node >= 0 ? (uint64_t{1} << b.loader_node) : 0;
  const bool ran_elsewhere = s.ran_on_nodes != 0 && expected_bits != 0 && (s.ran_on_nodes & ~expected_bits) != 0;
  if (bound_elsewhere || ran_elsewhere) {
    SayBindingCause(s, b, bound_elsewhere, o);
    return "binding";
  }
  if (b.simulated_delay_ms > 0 && b.simulated_phase == "data") {
    o << "Its loader is bound right (node " << (b.loader_node >= 0 ? std::to_string(b.loader_node) : "unbound")
      << ") but was slowed on purpose: --simulate-slow-rank " << s.rank << " --delay-ms "
      << Ms(b.simulated_delay_ms) << " sleeps that long before each batch.";
    return "simulated";
  }
  SayCapacityCause(s, b, previous, o);
  return "capacity";
}

// The others wait for it in the all-reduce: "" when that wait is under 0.5 ms.
// `what`: what they wait for ("data wait", "compute").
std::string SayWaiting(const std::vector<RankTiming>& t, const RankTiming& s, const std::string& what) {
  std::vector<int> waiting;
  double wait_sum = 0;
  for (const RankTiming& x : t) {
    if (x.rank == s.rank) continue;
    waiting.push_back(x.rank);
    wait_sum += std::max(0.0, x.comm_ms.mean - s.comm_ms.mean);
  }
  const double wait = waiting.empty() ? 0 : wait_sum / static_cast<double>(waiting.size());
  if (wait < 0.5) return "";
  const bool one = waiting.size() == 1;
  return Ranks(waiting) + (one ? " waits " : " wait ") + Ms(wait) + " ms a step in the all-reduce for rank " +
         std::to_string(s.rank) + ": " + (one ? "its" : "their") + " comm_time is the straggler's " + what +
         ", not the network.";
}

// A compute straggler: the sentence, the cause and the others' wait.
Verdict DiagnoseCompute(const std::vector<RankTiming>& t, const RankTiming& s, const RankBinding& b,
                        double others_median) {
  Verdict v;
  v.straggler = s.rank;
  std::ostringstream o;
  const double share = s.step_ms.mean > 0 ? 100.0 * (s.compute_ms.mean - others_median) / s.step_ms.mean : 0;
  o << "Rank " << s.rank << " is the straggler: its compute (forward, backward, optimiser) takes "
    << Ms(s.compute_ms.mean) << " ms a step against " << Ms(others_median)
    << " ms on the other ranks (median): " << Ms(s.compute_ms.mean - others_median) << " ms more, "
    << static_cast<int>(std::lround(share)) << "% of its " << Ms(s.step_ms.mean) << " ms step. ";
  if (b.simulated_delay_ms > 0 && b.simulated_phase == "compute") {
    o << "It was slowed on purpose: --simulate-slow-rank " << s.rank << " --delay-ms " << Ms(b.simulated_delay_ms)
      << " --slow-phase compute sleeps that long in each step's compute.";
    v.cause = "simulated";
  } else {
    o << "Its data is on time: a compute problem (a slower or busier device, other processes on its cores or "
         "GPU, throttling, or a larger share of work). Check what else runs there (nvidia-smi, top).";
    v.cause = "compute";
  }
  v.sentence = o.str();
  v.waiting = SayWaiting(t, s, "compute");
  return v;
}

}  // namespace

Verdict Diagnose(const std::vector<RankTiming>& t, const std::vector<RankBinding>& b,
                 const std::vector<int>& previous) {
  Verdict v;
  if (t.size() < 2) return v;
  double others_median = 0;
  const int worst = FindStraggler(t, &others_median);
  if (worst < 0) {
    const int slow = FindComputeStraggler(t, &others_median);
    if (slow < 0) return v;
    const RankTiming& s = t[static_cast<size_t>(slow)];
    const RankBinding* found = Find(b, s.rank);
    return DiagnoseCompute(t, s, found ? *found : RankBinding{}, others_median);
  }
  const RankTiming& s = t[static_cast<size_t>(worst)];
  v.straggler = s.rank;
  const RankBinding* found = Find(b, s.rank);
  const RankBinding sb = found ? *found : RankBinding{};

  std::ostringstream o;
  const double share = s.step_ms.mean > 0 ? 100.0 * s.data_ms.mean / s.step_ms.mean : 0;
  o << "Rank " << s.rank << " is the straggler: it waits " << Ms(s.data_ms.mean)
    << " ms a step for data (" << static_cast<int>(std::lround(share)) << "% of its "
    << Ms(s.step_ms.mean) << " ms step) against " << Ms(others_median)
    << " ms on the other ranks (median). ";
  v.cause = SayCause(s, sb, previous, o);
  v.sentence = o.str();
  v.waiting = SayWaiting(t, s, "data wait");
  return v;
}

std::vector<std::string> DescribeStalls(const std::vector<RankTiming>& t) {
  std::vector<double> own;
  for (const RankTiming& x : t) own.push_back(x.data_ms.mean + x.compute_ms.mean);
  const double typical = Median(own);
  std::vector<std::string> out;
  char line[512];
  for (const RankTiming& x : t) {
    const char* others = t.size() > 1 ? "; the other ranks waited for it in the all-reduce" : "";
    if (x.frozen_ms >= 1000) {
      std::snprintf(line, sizeof line,
                    "rank %d stalled: its process did not run for at least %.1f s at step %lld (stopped: SIGSTOP, a "
                    "debugger, or the machine swapping)%s",
                    x.rank, x.frozen_ms / 1000, static_cast<long long>(x.frozen_step), others);
    } else if (x.own_max_ms >= 1000 && x.own_max_ms >= 10 * typical) {
      std::snprintf(line, sizeof line, "rank %d stalled: step %lld took it %.1f s in its %s (a step's work is %s ms)%s",
                    x.rank, static_cast<long long>(x.own_max_step), x.own_max_ms / 1000,
                    x.own_max_in_data ? "data wait" : "compute", Ms(typical).c_str(), others);
    } else {
      continue;
    }
    out.push_back(line);
  }
  return out;
}

std::string FormatTable(const std::vector<RankTiming>& t, const std::vector<RankBinding>& b) {
  std::ostringstream o;
  char line[512];
  std::snprintf(line, sizeof line, "%4s  %17s  %17s  %17s  %17s  %17s  %8s  %-14s %-9s %-13s\n", "rank",
                "data ms mean/p95", "compute ms", "comm wait ms", "all-reduce ms", "step ms", "img/s",
                "loader cpus", "node", "gpu");
  o << line;
  for (const RankTiming& x : t) {
    const RankBinding* rb = Find(b, x.rank);
    auto pair = [](const Summary& s) { return Ms(s.mean) + " / " + Ms(s.p95); };
    const std::string node = NodeText(rb ? rb->loader_node : -1, x.ran_on_nodes);
    std::snprintf(line, sizeof line, "%4d  %17s  %17s  %17s  %17s  %17s  %8.1f  %-14s %-9s %-13s\n",
                  x.rank, pair(x.data_ms).c_str(), pair(x.compute_ms).c_str(),
                  pair(x.comm_ms).c_str(), pair(x.allreduce_ms).c_str(), pair(x.step_ms).c_str(), x.images_per_s,
                  rb && !rb->loader_cpus.empty() ? rb->loader_cpus.c_str() : "unbound",
                  node.c_str(), rb ? GpuText(*rb).c_str() : "?");
    o << line;
  }
  return o.str();
}

std::string ReportJsonLines(int64_t epoch, int64_t step, const std::vector<RankTiming>& t) {
  std::string out;
  for (const RankTiming& x : t) {
    nlohmann::json j = {{"epoch", epoch},
                        {"step", step},
                        {"rank", x.rank},
                        {"data_ms", x.data_ms.mean},
                        {"compute_ms", x.compute_ms.mean},
                        {"comm_ms", x.comm_ms.mean},
                        {"allreduce_ms", x.allreduce_ms.mean},
                        {"step_ms", x.step_ms.mean},
                        {"loss", x.loss},
                        {"data_ms_p95", x.data_ms.p95},
                        {"compute_ms_p95", x.compute_ms.p95},
                        {"comm_ms_p95", x.comm_ms.p95},
                        {"allreduce_ms_p95", x.allreduce_ms.p95},
                        {"step_ms_p95", x.step_ms.p95},
                        {"images_per_s", x.images_per_s},
                        {"steps", x.steps},
                        {"longest_own_ms", x.own_max_ms},
                        {"longest_own_step", x.own_max_step},
                        {"frozen_ms", x.frozen_ms},
                        {"frozen_step", x.frozen_step}};
    out += j.dump() + "\n";
  }
  return out;
}

std::string EpochJsonLine(const EpochRecord& e) {
  nlohmann::json j = {{"epoch", e.epoch},
                      {"train_loss", e.train_loss},
                      {"test_top1", e.evaluated ? nlohmann::json(e.test_top1) : nlohmann::json()},
                      {"test_top5", e.evaluated ? nlohmann::json(e.test_top5) : nlohmann::json()},
                      {"images_per_s", e.images_per_s},
                      {"straggler", e.straggler >= 0 ? nlohmann::json(e.straggler) : nlohmann::json()},
                      {"step", e.steps}};
  return j.dump() + "\n";
}

std::string ChartSvg(const std::string& title, const std::vector<RankTiming>& t, int straggler) {
  // The right margin holds the longest label ("12345.6 ms  straggler" at
  // 13 px, about 7.5 px a character) inside the canvas.
  const int bar_h = 28, gap = 12, left = 90, width = 560, right = 200, top = 50;
  const int height = top + static_cast<int>(t.size()) * (bar_h + gap) + 60;
  double max_ms = 0;
  for (const RankTiming& x : t) {
    max_ms = std::max({max_ms, x.step_ms.mean, x.data_ms.mean + x.compute_ms.mean + x.comm_ms.mean});
  }
  if (max_ms <= 0) max_ms = 1;
  const double scale = width / max_ms;
  auto esc = [](const std::string& s) {
    std::string r;
    for (char c : s) {
      if (c == '<') r += "&lt;";
      else if (c == '>') r += "&gt;";
      else if (c == '&') r += "&amp;";
      else r += c;
    }
    return r;
  };
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << left + width + right << "\" height=\""
    << height << "\" font-family=\"sans-serif\" font-size=\"13\">\n";
  o << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  o << "<text x=\"10\" y=\"24\" font-size=\"15\">" << esc(title) << "</text>\n";
  constexpr int kParts = 4;
  const char* colors[kParts] = {"#e8702a", "#3b75af", "#9e9e9e", "#cfcfcf"};
  const char* names[kParts] = {"data", "compute", "comm wait", "other (optimiser step, reports)"};
  for (size_t i = 0; i < t.size(); ++i) {
    const RankTiming& x = t[i];
    const int y = top + static_cast<int>(i) * (bar_h + gap);
    o << "<text x=\"10\" y=\"" << y + bar_h / 2 + 5 << "\"" << (x.rank == straggler ? " font-weight=\"bold\"" : "")
      << ">rank " << x.rank << "</text>\n";
    // The parts add up to the table's step time: what the three phases leave is "other".
    const double named = x.data_ms.mean + x.compute_ms.mean + x.comm_ms.mean;
    const double parts[kParts] = {x.data_ms.mean, x.compute_ms.mean, x.comm_ms.mean,
                                  std::max(0.0, x.step_ms.mean - named)};
    double at = left;
    for (int k = 0; k < kParts; ++k) {
      const double w = parts[k] * scale;
      o << "<rect x=\"" << at << "\" y=\"" << y << "\" width=\"" << w << "\" height=\"" << bar_h
        << "\" fill=\"" << colors[k] << "\"><title>rank " << x.rank << " " << names[k] << " "
        << Ms(parts[k]) << " ms</title></rect>\n";
      const std::string label = Ms(parts[k]);
      if (w >= 8.0 * static_cast<double>(label.size()) + 6) {  // the number on the part, where it fits
        o << "<text x=\"" << at + w / 2 << "\" y=\"" << y + bar_h / 2 + 5 << "\" text-anchor=\"middle\" fill=\""
          << (k == 3 ? "black" : "white") << "\">" << label << "</text>\n";
      }
      at += w;
    }
    o << "<text x=\"" << at + 6 << "\" y=\"" << y + bar_h / 2 + 5 << "\">"
      << Ms(std::max(x.step_ms.mean, named)) << " ms" << (x.rank == straggler ? "  straggler" : "") << "</text>\n";
  }
  const int ly = height - 30;
  const int key_x[kParts] = {0, 70, 160, 265};
  for (int k = 0; k < kParts; ++k) {
    o << "<rect x=\"" << left + key_x[k] << "\" y=\"" << ly << "\" width=\"14\" height=\"14\" fill=\""
      << colors[k] << "\"/><text x=\"" << left + key_x[k] + 20 << "\" y=\"" << ly + 12 << "\">"
      << names[k] << "</text>\n";
  }
  o << "<text x=\"" << left + 450 << "\" y=\"" << ly + 12 << "\">mean ms per step</text>\n";
  o << "</svg>\n";
  return o.str();
}

}  // namespace nl::trainer
