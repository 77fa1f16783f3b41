#include "trainer/timing.h"

namespace nl::trainer {

void Window::Add(double d, double c, double m, double s, double loss, int64_t n) {
  data.push_back(d);
  compute.push_back(c);
  comm.push_back(m);
  step.push_back(s);
  loss_sum += loss;
  images += n;
}

TimingRow RowOf(const Window& w, uint64_t ran_on) {
  const Summary d = Summarize(w.data), c = Summarize(w.compute), m = Summarize(w.comm),
                s = Summarize(w.step);
  double step_sum = 0;
  for (double x : w.step) step_sum += x;
  return {d.mean, d.p95, c.mean, c.p95, m.mean, m.p95, s.mean, s.p95,
          step_sum > 0 ? 1000.0 * static_cast<double>(w.images) / step_sum : 0,
          w.steps() ? w.loss_sum / static_cast<double>(w.steps()) : 0,
          static_cast<double>(w.steps()), static_cast<double>(ran_on)};
}

RankTiming TimingOf(int rank, const TimingRow& a) {
  RankTiming x;
  x.rank = rank;
  x.data_ms = {a[0], a[1]};
  x.compute_ms = {a[2], a[3]};
  x.comm_ms = {a[4], a[5]};
  x.step_ms = {a[6], a[7]};
  x.images_per_s = a[8];
  x.loss = a[9];
  x.steps = static_cast<int64_t>(a[10]);
  x.ran_on_nodes = static_cast<uint64_t>(a[11]);
  return x;
}

}  // namespace nl::trainer
