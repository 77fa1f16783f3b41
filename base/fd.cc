#include "base/fd.h"

#include <unistd.h>

namespace nl {

void Fd::Reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

}  // namespace nl
