// Terminating signals (SIGTERM, SIGINT, SIGHUP) during a save: the handler
// unlinks the temporary being written (unlink is async-signal-safe), then
// lets the signal end the process, so a job stopped mid-save leaves no half
// file behind. A signal that was ignored (nohup) stays ignored.
#pragma once

#include <string>

namespace nl::trainer {

// Once per process, before any save.
void InstallSignalHandlers();

// Names the temporary the handler removes while this object lives (one at
// a time: saves are not concurrent). For the one thread that saves.
class UnlinkOnSignal {
 public:
  explicit UnlinkOnSignal(const std::string& temporary);
  ~UnlinkOnSignal();
  UnlinkOnSignal(const UnlinkOnSignal&) = delete;
  UnlinkOnSignal& operator=(const UnlinkOnSignal&) = delete;
};

}  // namespace nl::trainer
