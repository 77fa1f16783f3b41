// Rank 0's progress, in the incident's (tqdm's) format on a terminal:
//   Train Epoch 11:  66%|######6   | 117/176 [00:16<00:04, 9.02it/s, loss=2.2641]
// redrawn in place; when stderr is not a terminal, the same line printed
// every `plain_every` steps (0: never) and once at the end, by Finish, with
// the epoch's mean loss.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace nl::trainer {

// The line for n of total steps after elapsed_s seconds (pure; for tests).
std::string ProgressLine(const std::string& desc, int64_t n, int64_t total, double elapsed_s,
                         double loss);

class Progress {
 public:
  Progress(std::string desc, int64_t total, bool terminal, int64_t plain_every, FILE* out);
  void Update(int64_t n, double loss);
  void Finish(double loss);  // the final line (and a newline on a terminal)

 private:
  std::string desc_;
  int64_t total_, plain_every_, n_ = 0;
  bool terminal_;
  FILE* out_;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

// Rank 0's report lines (the plan, the tables, each epoch's line): stdout,
// flushed line by line (the progress line is stderr's).
void Say(const std::string& line);

}  // namespace nl::trainer
