#include "util/log.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "util/env.h"

namespace lowrank {
namespace {

struct Sink {
  LogLevel level = LogLevel::None;
  bool version = false;  // LOWRANK_DEBUG=VERSION or any level: the version line once, as NCCL
  FILE* out = stderr;
  char host[64] = "?";
  std::mutex mu;

  Sink() {
    gethostname(host, sizeof host - 1);
    if (char* dot = strchr(host, '.')) *dot = 0;
    if (const char* v = env::get("LOWRANK_DEBUG")) {
      if (!strcasecmp(v, "WARN")) level = LogLevel::Warn;
      else if (!strcasecmp(v, "INFO")) level = LogLevel::Info;
      else if (!strcasecmp(v, "TRACE")) level = LogLevel::Trace;
      else if (!strcasecmp(v, "NONE")) level = LogLevel::None;
      else if (!strcasecmp(v, "VERSION")) version = true;
      else {
        // A bad value is never silently ignored: say so and log warnings.
        fprintf(stderr, "%s:%d:%ld LOWRANK WARN LOWRANK_DEBUG=%s is not one of WARN, INFO, TRACE, "
                "VERSION, NONE: logging warnings, and making a communicator fails\n", host,
                getpid(), (long)syscall(SYS_gettid), v);
        level = LogLevel::Warn;
      }
    }
    if (level != LogLevel::None) version = true;
    const char* f = env::get("LOWRANK_DEBUG_FILE");
    if (version && f) {
      std::string path;
      for (const char* c = f; *c; ++c) {
        if (c[0] == '%' && c[1] == 'h') { path += host; ++c; }
        else if (c[0] == '%' && c[1] == 'p') { path += std::to_string(getpid()); ++c; }
        else path += *c;
      }
      if (FILE* fp = fopen(path.c_str(), "a")) out = fp;
      else fprintf(stderr, "%s:%d:%ld LOWRANK WARN cannot open LOWRANK_DEBUG_FILE=%s; logging to "
                   "stderr\n", host, getpid(), (long)syscall(SYS_gettid), f);
    }
  }
};

Sink& sink() {
  static Sink* s = new Sink();  // never destroyed: logging may run during static destruction
  return *s;
}

}  // namespace

LogLevel logLevel() { return sink().level; }

namespace {
thread_local int logDevice = -1;
}  // namespace

void setLogDevice(int device) { logDevice = device; }

void logVersionOnce(const char* version) {
  Sink& s = sink();
  static std::once_flag once;
  if (!s.version) return;
  std::call_once(once, [&] {
    std::lock_guard<std::mutex> lock(s.mu);
    fprintf(s.out, "%s:%d:%ld LOWRANK INFO lowrank version %s\n", s.host, getpid(),
            (long)syscall(SYS_gettid), version);
    fflush(s.out);
  });
}

void logPrint(LogLevel level, const char* file, int line, const char* fmt, ...) {
  Sink& s = sink();
  const char* name = level == LogLevel::Warn ? "WARN" : level == LogLevel::Info ? "INFO" : "TRACE";
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  char dev[16] = "";
  if (logDevice >= 0) snprintf(dev, sizeof dev, " [%d]", logDevice);
  std::lock_guard<std::mutex> lock(s.mu);
  if (level == LogLevel::Trace) {
    const char* base = strrchr(file, '/');
    fprintf(s.out, "%s:%d:%ld%s LOWRANK %s %s:%d %s\n", s.host, getpid(), (long)syscall(SYS_gettid),
            dev, name, base ? base + 1 : file, line, msg);
  } else {
    fprintf(s.out, "%s:%d:%ld%s LOWRANK %s %s\n", s.host, getpid(), (long)syscall(SYS_gettid), dev,
            name, msg);
  }
  fflush(s.out);
}

}  // namespace lowrank
