#include "trainer/progress.h"
#include "loader/cli/option_table.h"

#include <cmath>
#include <utility>

namespace nl::trainer {
namespace {

std::string Clock(double s) {
  if (!(s >= 0) || s > 359999) return "??:??";
  const long t = std::lround(s);
  char buf[32];
  if (t >= 3600) {
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%02ld:%02ld", t / 60, t % 60);
  }
  return buf;
}

}  // namespace

std::string ProgressLine(const std::string& desc, int64_t n, int64_t total, double elapsed_s,
                         double loss) {
  const double frac = total > 0 ? std::min(1.0, static_cast<double>(n) / static_cast<double>(total)) : 0;
  // tqdm's ASCII bar: 10 cells of '#', the partial cell as a digit 1-9.
  const int cells = 10;
  const double filled = frac * cells;
  const int full = static_cast<int>(filled);
  std::string bar(static_cast<size_t>(full), '#');
  if (full < cells) {
    const int digit = static_cast<int>((filled - full) * 10);
    bar += digit > 0 ? static_cast<char>('0' + digit) : ' ';
    bar += std::string(static_cast<size_t>(cells - full - 1), ' ');
  }
  const double rate = elapsed_s > 0 ? static_cast<double>(n) / elapsed_s : 0;
  const double remaining = rate > 0 ? static_cast<double>(total - n) / rate : -1;
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s: %3d%%|%s| %lld/%lld [%s<%s, %.2fit/s, loss=%.4f]",
                desc.c_str(), static_cast<int>(frac * 100), bar.c_str(),
                static_cast<long long>(n), static_cast<long long>(total),
                Clock(elapsed_s).c_str(), Clock(remaining).c_str(), rate, loss);
  return buf;
}

Progress::Progress(std::string desc, int64_t total, bool terminal, int64_t plain_every, FILE* out)
    : desc_(std::move(desc)),
      total_(total),
      plain_every_(plain_every),
      terminal_(terminal),
      out_(out),
      start_(std::chrono::steady_clock::now()) {}

void Progress::Update(int64_t n, double loss) {
  n_ = n;
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  if (terminal_) {
    if (now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    std::fprintf(out_, "\r%s", ProgressLine(desc_, n, total_, elapsed, loss).c_str());
    std::fflush(out_);
  } else if (plain_every_ > 0 && n % plain_every_ == 0 && n < total_) {  // (Finish prints the last)
    std::fprintf(out_, "%s\n", ProgressLine(desc_, n, total_, elapsed, loss).c_str());
    std::fflush(out_);
  }
}

void Progress::Finish(double loss) {
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::fprintf(out_, "%s%s\n", terminal_ ? "\r" : "",
               ProgressLine(desc_, n_, total_, elapsed, loss).c_str());
  std::fflush(out_);
}

void Say(const std::string& line) {
  std::printf("%s\n", FlagText(line).c_str());
  std::fflush(stdout);
}

}  // namespace nl::trainer
