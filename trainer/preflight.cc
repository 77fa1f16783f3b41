#include "trainer/preflight.h"

#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>

#include "base/file_util.h"

namespace nl::trainer {
namespace {

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string BaseOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string RealPath(const std::string& path) {
  char buf[PATH_MAX];
  return realpath(path.c_str(), buf) ? std::string(buf) : std::string();
}

// "pid 123: trainer --data d ..." (the command line, cut short).
std::string DescribeProcess(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  for (char& c : s) {
    if (c == '\0') c = ' ';
  }
  while (!s.empty() && s.back() == ' ') s.pop_back();
  if (s.size() > 160) s = s.substr(0, 157) + "...";
  return "pid " + std::to_string(pid) + (s.empty() ? "" : ": " + s);
}

// A writable file at `path` (not a directory) in a writable directory.
Status CheckWritableFile(const std::string& flag, const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return Status::InvalidArgument(flag + " " + path + " is a directory");
  }
  if (stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    // A device or FIFO: the parameters are written by renaming a temporary
    // over the path (which would replace /dev/full with a file), and a FIFO
    // would block the job.
    return Status::InvalidArgument(flag + " " + path +
                                   " is not a regular file (a device, FIFO or socket): give a file's path");
  }
  const std::string dir = DirOf(path);
  if (access(dir.c_str(), W_OK) != 0) {
    return Status::InvalidArgument(flag + " " + path + ": cannot write in " + dir + ": " +
                                   std::strerror(errno));
  }
  // The temporary it is written through (a name too long, say) must be possible too.
  const std::string tmp = nl::TemporaryPath(path);
  if (!Fd(open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600)).valid()) {
    return Status::InvalidArgument(flag + " " + path + ": cannot create " + tmp + ": " + std::strerror(errno));
  }
  unlink(tmp.c_str());
  return Status::Ok();
}

// Where writing `path` lands: the file a symbolic link (even a dangling one)
// points to, resolved; else CanonicalTarget(path).
std::string WriteTarget(const std::string& path) {
  std::string p = path;
  for (int hops = 0; hops < 40; ++hops) {
    struct stat st {};
    if (lstat(p.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) break;
    char buf[PATH_MAX];
    const ssize_t n = readlink(p.c_str(), buf, sizeof buf - 1);
    if (n <= 0) break;
    const std::string target(buf, static_cast<size_t>(n));
    p = target[0] == '/' ? target : DirOf(p) + "/" + target;
  }
  return CanonicalTarget(p);
}

// Whether `path` is (a hard link to) a file under `dir`.
bool HardLinkedUnder(const std::string& path, const std::string& dir) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink < 2) return false;
  static dev_t dev;
  static ino_t ino;
  static bool found;
  dev = st.st_dev;
  ino = st.st_ino;
  found = false;
  nftw(dir.c_str(),
       [](const char*, const struct stat* s, int type, struct FTW*) {
         if (type == FTW_F && s->st_dev == dev && s->st_ino == ino) found = true;
         return found ? 1 : 0;
       },
       16, FTW_PHYS);
  return found;
}

// Another job's lock on the directory `path` is written in (its --out).
std::string ForeignLockHolder(const std::string& path) {
  const std::string lock = DirOf(path) + "/.trainer.lock";
  const Fd fd(open(lock.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return "";
  struct flock q {};
  q.l_type = F_WRLCK;
  q.l_whence = SEEK_SET;
  std::string holder;
  // (Our own launcher, our parent, holds our --out's lock.)
  if (fcntl(fd.get(), F_GETLK, &q) == 0 && q.l_type != F_UNLCK && q.l_pid > 0 && q.l_pid != getpid() &&
      q.l_pid != getppid()) {
    holder = DescribeProcess(q.l_pid);
  }
  return holder;
}

Status Busy(const std::string& path, const std::string& what, Fd fd, int err);

// `what` names the output for the user ("--out DIR"); `path` is the file
// locked; `own`: a lock file of ours, removed when the job ends (OutputLock).
Status LockOne(const std::string& path, const std::string& what, OutputLock* lock, bool own = false) {
  for (int attempt = 0;; ++attempt) {
    Fd fd(open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    if (!fd.valid()) return Status::FromErrno("cannot open " + path + " to lock " + what, errno);
    struct flock fl {};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    if (fcntl(fd.get(), F_SETLK, &fl) != 0) {
      const int err = errno;
      return Busy(path, what, std::move(fd), err);
    }
    // A job that ended may have removed the name after we opened it: the
    // lock must be on the file the name holds now.
    struct stat held {}, named {};
    if (!own || (fstat(fd.get(), &held) == 0 && stat(path.c_str(), &named) == 0 && held.st_ino == named.st_ino &&
                 held.st_dev == named.st_dev)) {
      lock->Add(std::move(fd), own ? path : "");
      return Status::Ok();
    }
    if (attempt == 100) return Status::Internal("cannot lock " + path + " for " + what + ": it keeps being replaced");
  }
}

// The lock is taken: who holds it, in the user's words.
Status Busy(const std::string& path, const std::string& what, Fd fd, int err) {
  struct flock q {};
  q.l_type = F_WRLCK;
  q.l_whence = SEEK_SET;
  const bool known = fcntl(fd.get(), F_GETLK, &q) == 0 && q.l_type != F_UNLCK && q.l_pid > 0;
  fd.Reset();
  if (err == EACCES || err == EAGAIN) {
    return Status::FailedPrecondition(
        what + " is in use by another trainer job (" +
        (known ? DescribeProcess(q.l_pid) : std::string("its process is not known")) +
        "): two jobs would overwrite each other's files; wait for it to end or choose another");
  }
  return Status::FromErrno("cannot lock " + path + " for " + what, err);
}

}  // namespace

JobPlanRequest PlanRequest(const Options& o, int local_world) {
  JobPlanRequest rq = o.plan;
  rq.nproc = local_world;
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) rq.cuda_visible_devices = v;
  return rq;
}

Status CheckData(const Options& o, const Manifest& m) {
  const SplitInfo* train = m.FindSplit("train");
  if (!train) return Status::InvalidArgument(o.data + " has no train split");
  if (m.classes.size() < 2) {
    return Status::InvalidArgument(o.data + " has " + std::to_string(m.classes.size()) +
                                   " class(es); classification needs at least 2");
  }
  if (o.eval_split != "none" && !m.FindSplit(o.eval_split)) {
    std::string have;
    for (const auto& [name, split] : m.splits) have += (have.empty() ? "" : ", ") + name;
    return Status::InvalidArgument("--eval-split " + o.eval_split + ": " + o.data +
                                   " has no such split (it has " + have +
                                   "; --eval-split none trains without evaluation)");
  }
  if (o.resize_on == "device" && (!train->shape || (*train->shape)[0] != (*train->shape)[1])) {
    return Status::InvalidArgument(
        "--resize-on device needs a train split of one square image shape (CIFAR's 32x32); " +
        o.data + " has none");
  }
  return Status::Ok();
}

std::string CanonicalTarget(const std::string& path) {
  const std::string dir = RealPath(DirOf(path));
  if (dir.empty()) return "";
  return (dir == "/" ? "" : dir) + "/" + BaseOf(path);
}

Status CheckOutputs(const Options& o) {
  const std::string data = RealPath(o.data);
  auto inside_data = [&](const std::string& path) {
    return !data.empty() && !path.empty() && (path == data || path.rfind(data + "/", 0) == 0);
  };
  auto refuse_inside = [&](const std::string& what) {
    return Status::InvalidArgument(what + " lies inside the shard set " + o.data +
                                   ": write outputs elsewhere (the data set is pack_tool's, "
                                   "and a checkpoint or metrics there could overwrite it)");
  };
  // --out is made only once it is known not to lie in the data set.
  if (!o.out.empty()) {
    const std::string out = RealPath(o.out), parent = RealPath(DirOf(o.out));
    if (inside_data(!out.empty() ? out : parent.empty() ? "" : parent + "/x")) return refuse_inside("--out " + o.out);
    struct stat st {};
    if (mkdir(o.out.c_str(), 0700) != 0 && errno != EEXIST) {
      return Status::FromErrno("cannot make --out " + o.out, errno);
    }
    if (stat(o.out.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || access(o.out.c_str(), W_OK) != 0) {
      return Status::InvalidArgument("--out " + o.out + " is not a writable directory");
    }
  }
  std::vector<std::pair<std::string, std::string>> outs;  // (what, where writing lands)
  if (!o.out.empty()) {
    outs.push_back({"--out's checkpoint " + o.out + "/checkpoint.pt", WriteTarget(o.out + "/checkpoint.pt")});
  }
  if (!o.metrics_out.empty()) outs.push_back({"--metrics-out " + o.metrics_out, WriteTarget(o.metrics_out)});
  if (!o.params_out.empty()) outs.push_back({"--params-out " + o.params_out, CanonicalTarget(o.params_out)});
  for (size_t i = 0; i < outs.size(); ++i) {
    for (size_t j = i + 1; j < outs.size(); ++j) {
      if (!outs[i].second.empty() && outs[i].second == outs[j].second) {
        return Status::InvalidArgument(outs[j].first + " is the same file as " + outs[i].first +
                                       ": give each output its own name");
      }
    }
  }
  for (const auto& [what, path] : outs) {
    if (inside_data(path)) return refuse_inside(what);
  }
  for (const std::string& f : {o.metrics_out, o.params_out}) {
    if (!f.empty() && !data.empty() && HardLinkedUnder(f, data)) {
      return Status::InvalidArgument(f + " is a hard link to a file of the shard set " + o.data +
                                     ": writing it would overwrite the data set");
    }
  }
  const bool in_own_out = !o.out.empty() && !o.metrics_out.empty() &&
                          RealPath(DirOf(WriteTarget(o.metrics_out))) == RealPath(o.out);
  if (!o.metrics_out.empty() && !in_own_out) {
    const std::string holder = ForeignLockHolder(WriteTarget(o.metrics_out));
    if (!holder.empty()) {
      return Status::FailedPrecondition("--metrics-out " + o.metrics_out + " lies in another trainer job's --out (" +
                                        holder + "): choose another place");
    }
  }
  if (!o.params_out.empty()) NL_RETURN_IF_ERROR(CheckWritableFile("--params-out", o.params_out));
  if (!o.metrics_out.empty()) NL_RETURN_IF_ERROR(CheckWritableFile("--metrics-out", o.metrics_out));
  return Status::Ok();
}

Result<OutputLock> LockOutputs(const Options& o) {
  OutputLock lock;
  if (!o.out.empty()) NL_RETURN_IF_ERROR(LockOne(o.out + "/.trainer.lock", "--out " + o.out, &lock, true));
  if (!o.metrics_out.empty()) {
    NL_RETURN_IF_ERROR(LockOne(o.metrics_out, "--metrics-out " + o.metrics_out, &lock));
  }
  return lock;
}

}  // namespace nl::trainer
