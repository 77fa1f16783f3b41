#include "trainer/timing.h"

namespace nl::trainer {

void Window::Add(double d, double c, double m, double a, double s, double loss, int64_t n, int64_t index) {
  if (index > 0 && d + c > own_max_ms) {
    own_max_ms = d + c;
    own_max_step = index;
    own_max_in_data = d > c;
  }
  data.push_back(d);
  compute.push_back(c);
  comm.push_back(m);
  allreduce.push_back(a);
  step.push_back(s);
  loss_sum += loss;
  images += n;
}

void Window::NoteFrozen(double ms, int64_t at) {
  if (ms > frozen_ms) {
    frozen_ms = ms;
    frozen_step = at;
  }
}

TimingRow RowOf(const Window& w, uint64_t ran_on) {
  const Summary d = Summarize(w.data), c = Summarize(w.compute), m = Summarize(w.comm),
                s = Summarize(w.step), a = Summarize(w.allreduce);
  double step_sum = 0;
  for (double x : w.step) step_sum += x;
  return {d.mean, d.p95, c.mean, c.p95, m.mean, m.p95, s.mean, s.p95,
          step_sum > 0 ? 1000.0 * static_cast<double>(w.images) / step_sum : 0,
          w.steps() ? w.loss_sum / static_cast<double>(w.steps()) : 0,
          static_cast<double>(w.steps()), static_cast<double>(ran_on), a.mean, a.p95,
          w.own_max_ms, static_cast<double>(w.own_max_step), w.own_max_in_data ? 1.0 : 0.0,
          w.frozen_ms, static_cast<double>(w.frozen_step)};
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
  x.allreduce_ms = {a[12], a[13]};
  x.own_max_ms = a[14];
  x.own_max_step = static_cast<int64_t>(a[15]);
  x.own_max_in_data = a[16] != 0;
  x.frozen_ms = a[17];
  x.frozen_step = static_cast<int64_t>(a[18]);
  return x;
}

}  // namespace nl::trainer
