#include "trainer/grad_reducer.h"

#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>

namespace nl::trainer {

// When each bucket's all-reduce arrived, written by the works' completion
// callbacks (which may outlive the reducer after a failure: hence shared).
struct Arrivals {
  explicit Arrivals(size_t buckets) : ns(buckets, 0) {}
  Mutex mu;
  CondVar cv;
  std::vector<int64_t> ns NL_GUARDED_BY(mu);  // 0: not yet
};

namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

namespace {

// The parameters that train (a frozen one gets no gradient, nor a bucket).
std::vector<at::Tensor> Trained(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : params) {
    if (p.requires_grad()) out.push_back(p);
  }
  return out;
}

}  // namespace

GradReducer::GradReducer(const std::vector<at::Tensor>& params, int64_t bucket_bytes, Comm* comm, ReduceMode mode)
    : params_(Trained(params)),
      bucket_of_(params_.size()),
      offset_of_(params_.size()),
      comm_(comm),
      mode_(mode) {
  // Reverse order; a bucket also ends where the dtype or device changes (one flat buffer each).
  std::vector<std::vector<size_t>> groups;
  int64_t bytes = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const at::Tensor& p = params_[k];
    const int64_t b = p.numel() * static_cast<int64_t>(p.element_size());
    // The first bucket is small (as DDP's first_bucket_bytes_cap), so that
    // the first all-reduce starts early in backward.
    const int64_t cap = groups.size() == 1 ? std::min(bucket_bytes, kFirstBucketBytes) : bucket_bytes;
    const bool fresh = groups.empty() || bytes + b > cap ||
                       params_[groups.back().front()].options().dtype() != p.options().dtype() ||
                       params_[groups.back().front()].device() != p.device();
    if (fresh) {
      groups.emplace_back();
      bytes = 0;
    }
    groups.back().push_back(k);
    bytes += b;
  }
  buckets_.resize(groups.size());
  state_.resize(groups.size());  // (no hook yet: a constructor's accesses are not checked)
  for (size_t i = 0; i < groups.size(); ++i) {
    Bucket& bucket = buckets_[i];
    bucket.params = groups[i];
    int64_t total = 0;
    for (size_t k : bucket.params) {
      bucket_of_[k] = i;
      offset_of_[k] = static_cast<size_t>(total);
      total += params_[k].numel();
    }
    bucket.buffer = at::zeros({total}, params_[bucket.params.front()].options().requires_grad(false));
    for (size_t k : bucket.params) Repoint(k);
  }
  arrivals_ = std::make_shared<Arrivals>(buckets_.size());
  if (mode_ != ReduceMode::kOverlap || comm_ == nullptr || comm_->world() == 1) return;
  for (size_t k = 0; k < params_.size(); ++k) {
    std::shared_ptr<torch::autograd::Node> acc = torch::autograd::impl::grad_accumulator(params_[k]);
    hook_keys_.push_back(acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, k](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
          Ready(k);
          return outputs;
        })));
    accumulators_.push_back(std::move(acc));
  }
}

GradReducer::~GradReducer() {
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
}

at::Tensor GradReducer::ViewOf(size_t k) const {
  const Bucket& b = buckets_[bucket_of_[k]];
  return b.buffer.narrow(0, static_cast<int64_t>(offset_of_[k]), params_[k].numel()).view(params_[k].sizes());
}

bool GradReducer::IsView(size_t k) const {
  const at::Tensor& g = params_[k].grad();
  return g.defined() && g.data_ptr() == ViewOf(k).data_ptr();
}

// Makes parameter k's .grad its view again, keeping what it held (zeros if
// it had none): an optimizer may set it to none, or a caller replace it.
void GradReducer::Repoint(size_t k) {
  at::Tensor view = ViewOf(k);
  at::Tensor& g = params_[k].mutable_grad();
  at::NoGradGuard no_grad;
  if (g.defined()) {
    view.copy_(g);
  } else {
    view.zero_();
  }
  g = view;
}

void GradReducer::Begin() {
  for (size_t k = 0; k < params_.size(); ++k) {
    if (!IsView(k)) Repoint(k);
  }
  for (Bucket& b : buckets_) b.buffer.zero_();
  MutexLock lock(&mu_);
  next_ = 0;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    state_[i].pending = buckets_[i].params.size();
    state_[i].work.reset();
  }
  MutexLock alock(&arrivals_->mu);
  std::fill(arrivals_->ns.begin(), arrivals_->ns.end(), 0);
}

size_t GradReducer::launched() {
  MutexLock lock(&mu_);
  return next_;
}

void GradReducer::Ready(size_t k) {
  MutexLock lock(&mu_);
  BucketState& b = state_[bucket_of_[k]];
  if (b.pending == 0) return;  // counted already (a second backward without Begin)
  if (--b.pending == 0) {
    while (next_ < buckets_.size() && state_[next_].pending == 0) Launch(next_++);
  }
}

void GradReducer::Launch(size_t i) {
  Bucket& b = buckets_[i];
  BucketState& s = state_[i];
  b.buffer.div_(comm_->world());  // summing the shares averages them
  std::vector<at::Tensor> v{b.buffer};
  s.launched = Clock::now();
  s.work = comm_->StartAllReduceSum(v);
  std::shared_ptr<Arrivals> arrivals = arrivals_;
  s.work->getFuture()->addCallback([arrivals, i](c10::ivalue::Future&) {
    MutexLock lock(&arrivals->mu);
    arrivals->ns[i] = NowNs();
    arrivals->cv.NotifyAll();
  });
}

ReduceTimes GradReducer::Finish(const std::string& what) {
  ReduceTimes t;
  if (comm_ == nullptr || comm_->world() == 1 || buckets_.empty()) return t;
  const Clock::time_point end = Clock::now();
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  Clock::time_point first;
  {
    MutexLock lock(&mu_);
    while (next_ < buckets_.size()) Launch(next_++);  // after backward, or held back by an unused parameter
    first = state_.front().launched;
    for (const BucketState& s : state_) {
      works.push_back(s.work);
      first = std::min(first, s.launched);
    }
  }
  for (const auto& w : works) comm_->Wait(w, what);
  const Clock::time_point done = Clock::now();
  t.exposed_ms = std::chrono::duration<double, std::milli>(done - end).count();
  // The completion callbacks run before a wait returns (Gloo completes the
  // future first); a late one is waited for briefly, else taken as now.
  Arrivals& arrivals = *arrivals_;
  MutexLock lock(&arrivals.mu);
  const Clock::time_point late = Clock::now() + std::chrono::milliseconds(100);
  while (!std::all_of(arrivals.ns.begin(), arrivals.ns.end(), [](int64_t ns) { return ns != 0; }) &&
         arrivals.cv.WaitUntil(&arrivals.mu, late)) {
  }
  int64_t last = 0;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    last = std::max(last, arrivals.ns[i] ? arrivals.ns[i] : NowNs());
  }
  const double first_ns = static_cast<double>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(first.time_since_epoch()).count());
  t.allreduce_ms = std::max(0.0, (static_cast<double>(last) - first_ns) / 1e6);
  return t;
}

}  // namespace nl::trainer
