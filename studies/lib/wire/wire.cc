// wire: a user-space Ethernet switch whose links delay and pace like a wire, for kernels without
// netem (issue 40). One TAP device per host network namespace (made there as eth0), one thread.
//
// The link model (Model below, the one place of the formula). Each host port p has a sending side
// (host -> switch) and a receiving side (switch -> host), each at the link rate, and every frame
// is delayed once by the one-way delay between them:
//   sent     = max(arrival, end of the previous frame sent by p)              + wire(frame)
//   released = max(sent + delay, end of the previous frame released toward q) + wire(frame)
//   wire(frame) = frame bytes * 8 / rate; frame bytes = what the TAP carries: the 14-byte
//   Ethernet header and the IP packet (no preamble, FCS or inter-frame gap: a real Ethernet
//   adds 24 bytes a frame, 1.6% at 1514 bytes; TCP's goodput here is rate x 1448/1514).
// That is netem's delay then a rate limiter, on both ends of each link, as through a
// store-and-forward switch: in order, no drops (below a safety cap of queued bytes), and no burst
// (each frame starts when the previous one on its port ends; the sender is paced too, so a host
// that posts many sends at once still leaves at the rate). Frames are switched by destination
// MAC (learned from source MACs; broadcast, multicast and unknown destinations go to every other
// port, each copy on its own port's clock).
//
// Timing. A release is scheduled at its ideal time (never early); the thread sleeps on a timerfd
// until `lead` before it, then spins. lead is the 90th percentile of the last 64 wake-ups'
// lateness plus 5 us (20-50 us on the VMs this was written on, at most 100 us), so a release is
// late only when a wake-up is later than that. While spinning it keeps reading the TAPs, so
// arrivals are stamped when they come. SCHED_FIFO (and mlockall) if allowed, so that other work
// on the machine does not delay the thread. Spinning is capped at half of every 20 ms: a
// real-time thread that spins through a whole second is stopped by the kernel's RT throttling
// (sched_rt_runtime_us, 50 ms a second by default), which would stall the links; past the cap
// (trains at ~1 Gbit/s and more) releases come from the timer alone, as late as its wake-ups,
// still scheduled at their ideal times, so the rate holds and only the spacing loosens.
//
// usage:
//   wire --netns PATH [--netns PATH ...] --status FILE [--ctl FIFO] [--rate BPS] [--delay-ns NS]
//        [--rt-priority P] [--txqueuelen N] [--no-napi] [--trace FILE]
//     makes eth0 (TAP) in each namespace (port i = i-th --netns), writes FILE ("gen 0 ...") when
//     ready, then switches until SIGTERM/SIGINT (the TAPs go with the process). A line
//     "gen G [rate BPS] [delay_ns NS]" written to FIFO sets the link and rewrites FILE with
//     "gen G rate .. delay_ns .. fifo .. frames .. late_p50_ns .. late_p99_ns .. late_max_ns ..
//     lead_ns .. dropped .. loss .. lost .. cut .. cut_dropped ..": the counters since the previous
//     line (how late releases were; frames lost and dropped at cut ports). Faults (issue 42):
//     "loss P" loses each frame toward a port with probability P (0 <= P < 1; "seed S" reseeds the
//     draws), "cut I" cuts host I's link (nothing in or out), "heal I" mends it (-1: all).
//     The TAPs are made with IFF_NAPI unless --no-napi (see open_tap_in). --trace FILE writes
//     "A port arrival_ns sent_ns bytes" per frame taken in and "R port due_ns released_ns bytes"
//     per frame released (CLOCK_MONOTONIC, as time.monotonic()): where a message's time went.
//   wire --schedule --ports N [--rate BPS] [--delay-ns NS]
//     the model alone, for tests: stdin lines "arrival_ns in_port out_port bytes" (out_port -1:
//     every other port), one stdout line "out_port sent_ns released_ns" per copy.
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <sched.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <random>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

constexpr int64_t kNever = INT64_MAX;

struct Model {
  double rate_bps = 0;  // 0: no rate limit
  int64_t delay_ns = 0;
  std::vector<int64_t> in_free, out_free;  // when port p's sending / receiving side is next idle
  explicit Model(int ports) : in_free(ports, INT64_MIN), out_free(ports, INT64_MIN) {}
  int64_t wire_ns(size_t bytes) const {
    return rate_bps > 0 ? std::llround(static_cast<double>(bytes) * 8e9 / rate_bps) : 0;
  }
  int64_t sent(int port, int64_t arrival, size_t bytes) {
    in_free[port] = std::max(arrival, in_free[port]) + wire_ns(bytes);
    return in_free[port];
  }
  int64_t released(int port, int64_t sent_ns, size_t bytes) {
    out_free[port] = std::max(sent_ns + delay_ns, out_free[port]) + wire_ns(bytes);
    return out_free[port];
  }
};

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "wire: %s: %s\n", what.c_str(), errno ? std::strerror(errno) : "");
  std::exit(1);
}

int schedule_mode(int ports, double rate, int64_t delay) {
  Model m(ports);
  m.rate_bps = rate;
  m.delay_ns = delay;
  long long arrival;
  int in, out;
  long long bytes;
  while (std::scanf("%lld %d %d %lld", &arrival, &in, &out, &bytes) == 4) {
    if (in < 0 || in >= ports || out < -1 || out >= ports || out == in || bytes <= 0) {
      std::fprintf(stderr, "wire: bad line: %lld %d %d %lld\n", arrival, in, out, bytes);
      return 2;
    }
    int64_t s = m.sent(in, arrival, bytes);
    for (int q = 0; q < ports; ++q)
      if (q != in && (out == -1 || q == out))
        std::printf("%d %lld %lld\n", q, static_cast<long long>(s),
                    static_cast<long long>(m.released(q, s, bytes)));
  }
  return 0;
}

struct Frame {
  int64_t due;
  std::vector<uint8_t> bytes;
};

// how late releases were, in microsecond buckets
struct Lateness {
  std::array<uint64_t, 2001> us{};  // last bucket: 2 ms or more
  uint64_t n = 0;
  int64_t max_ns = 0;
  void add(int64_t ns) {
    ++n;
    max_ns = std::max(max_ns, ns);
    us[std::min<int64_t>(ns / 1000, 2000)]++;
  }
  int64_t quantile_ns(double q) const {
    if (n == 0) return 0;
    uint64_t want = static_cast<uint64_t>(std::ceil(q * n)), c = 0;
    for (size_t i = 0; i < us.size(); ++i)
      if ((c += us[i]) >= want) return static_cast<int64_t>(i + 1) * 1000;  // upper edge
    return max_ns;
  }
};

class Switch {
 public:
  Switch(std::vector<int> taps, double rate, int64_t delay, std::string status, int ctl, bool fifo)
      : taps_(std::move(taps)), model_(static_cast<int>(taps_.size())), queues_(taps_.size()),
        status_(std::move(status)), ctl_(ctl), fifo_(fifo) {
    model_.rate_bps = rate;
    model_.delay_ns = delay;
    cut_.assign(taps_.size(), false);
  }
  int run();

 private:
  void on_tap(int p);
  void on_ctl();
  void release_due(int64_t now);
  int64_t next_due() const;
  void write_status();
  std::string cut_ports() const;

  std::vector<int> taps_;
  Model model_;
  std::vector<std::deque<Frame>> queues_;  // per receiving port, in release order
  std::unordered_map<uint64_t, int> mac_port_;
  std::string status_, ctl_buf_;
  int ctl_, timer_ = -1, sig_ = -1, ep_ = -1;
  bool fifo_;
  long gen_ = 0;
  int64_t lead_ns_ = 50000;  // how early to wake before a release (the wake-ups' lateness)
  size_t queued_bytes_ = 0;
  uint64_t frames_ = 0, dropped_ = 0;
  // Faults (issue 42): each copy toward a port is lost with probability loss_ (drawn from rng_,
  // seeded by the control word "seed", so a run's losses repeat with its arrivals); a cut port
  // ("cut P") neither sends nor receives: its frames, and those queued toward it, are dropped
  // until "heal P" (-1: every port).
  double loss_ = 0;
  std::mt19937_64 rng_{1};
  std::vector<bool> cut_;
  uint64_t lost_ = 0, cut_dropped_ = 0;
  bool lose() { return loss_ > 0 && std::uniform_real_distribution<double>(0, 1)(rng_) < loss_; }
  Lateness late_;
  int live_ports_;
  static constexpr int64_t kWindowNs = 20000000;
  static constexpr int64_t kLingerNs = 300000;
  int64_t last_activity_ = INT64_MIN / 2;
  std::array<int64_t, 64> wakes_{};  // the last wake-ups' lateness, for lead
  size_t nwakes_ = 0;
  bool armed_lead_ = true;

 public:
  FILE* trace_ = nullptr;  // --trace: one line per frame taken in and per frame released
 private:
  static constexpr size_t kCapBytes = size_t(256) << 20;  // a safety net, not a buffer model
};

void Switch::write_status() {
  std::string tmp = status_ + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) die("cannot write " + tmp);
  std::fprintf(f,
               "gen %ld rate %.0f delay_ns %lld fifo %d frames %llu late_p50_ns %lld "
               "late_p99_ns %lld late_max_ns %lld lead_ns %lld dropped %llu loss %g lost %llu "
               "cut %s cut_dropped %llu\n",
               gen_, model_.rate_bps, static_cast<long long>(model_.delay_ns), fifo_ ? 1 : 0,
               static_cast<unsigned long long>(frames_),
               static_cast<long long>(late_.quantile_ns(0.5)),
               static_cast<long long>(late_.quantile_ns(0.99)),
               static_cast<long long>(late_.max_ns), static_cast<long long>(lead_ns_),
               static_cast<unsigned long long>(dropped_), loss_,
               static_cast<unsigned long long>(lost_), cut_ports().c_str(),
               static_cast<unsigned long long>(cut_dropped_));
  std::fclose(f);
  if (std::rename(tmp.c_str(), status_.c_str()) != 0) die("cannot rename " + tmp);
}

std::string Switch::cut_ports() const {
  std::string s;
  for (size_t q = 0; q < cut_.size(); ++q)
    if (cut_[q]) s += (s.empty() ? "" : ",") + std::to_string(q);
  return s.empty() ? "-" : s;
}

uint64_t mac_key(const uint8_t* m) {
  uint64_t k = 0;
  for (int i = 0; i < 6; ++i) k = (k << 8) | m[i];
  return k;
}

void Switch::on_tap(int p) {
  static uint8_t buf[65536];
  for (;;) {
    ssize_t n = read(taps_[p], buf, sizeof buf);
    if (n < 0 && errno == EAGAIN) return;
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {  // the namespace (and its eth0) went away
      epoll_ctl(ep_, EPOLL_CTL_DEL, taps_[p], nullptr);
      --live_ports_;
      return;
    }
    int64_t t = now_ns();
    last_activity_ = t;
    if (n < 14) continue;
    size_t len = static_cast<size_t>(n);
    if (!(buf[6] & 1)) mac_port_[mac_key(buf + 6)] = p;
    int to = -1;  // -1: every other port
    if (!(buf[0] & 1)) {
      auto it = mac_port_.find(mac_key(buf));
      if (it != mac_port_.end()) to = it->second;
    }
    if (to == p) continue;
    if (cut_[size_t(p)]) {  // a cut link carries nothing from its host
      ++cut_dropped_;
      continue;
    }
    int64_t s = model_.sent(p, t, len);
    if (trace_)
      std::fprintf(trace_, "A %d %lld %lld %zu\n", p, static_cast<long long>(t),
                   static_cast<long long>(s), len);
    for (int q = 0; q < static_cast<int>(taps_.size()); ++q) {
      if (q == p || (to != -1 && q != to)) continue;
      if (lose()) {  // lost on the way: it took its sender's wire time, never reaches q
        ++lost_;
        continue;
      }
      if (queued_bytes_ + len > kCapBytes) {
        ++dropped_;
        continue;
      }
      queues_[q].push_back(Frame{model_.released(q, s, len), std::vector<uint8_t>(buf, buf + len)});
      queued_bytes_ += len;
    }
  }
}

void Switch::on_ctl() {
  char b[512];
  ssize_t n;
  while ((n = read(ctl_, b, sizeof b)) > 0) ctl_buf_.append(b, static_cast<size_t>(n));
  size_t eol;
  while ((eol = ctl_buf_.find('\n')) != std::string::npos) {
    std::istringstream line(ctl_buf_.substr(0, eol));
    ctl_buf_.erase(0, eol + 1);
    std::string key;
    double v;
    while (line >> key >> v) {
      if (key == "gen") gen_ = static_cast<long>(v);
      else if (key == "rate") model_.rate_bps = v;
      else if (key == "delay_ns") model_.delay_ns = static_cast<int64_t>(v);
      else if (key == "loss" && v >= 0 && v < 1) loss_ = v;
      else if (key == "seed") rng_.seed(static_cast<uint64_t>(v));
      else if (key == "cut" && v >= 0 && v < static_cast<double>(cut_.size())) cut_[size_t(v)] = true;
      else if (key == "heal" && v >= -1 && v < static_cast<double>(cut_.size()))
        v < 0 ? cut_.assign(cut_.size(), false) : void(cut_[size_t(v)] = false);
      else std::fprintf(stderr, "wire: unknown control word %s\n", key.c_str());
    }
    write_status();
    late_ = Lateness{};
    frames_ = dropped_ = lost_ = cut_dropped_ = 0;
  }
}

void Switch::release_due(int64_t now) {
  for (size_t q = 0; q < queues_.size(); ++q) {
    auto& dq = queues_[q];
    while (!dq.empty() && dq.front().due <= now) {
      Frame& f = dq.front();
      if (cut_[q]) {  // queued toward a host whose link was cut since
        ++cut_dropped_;
        queued_bytes_ -= f.bytes.size();
        dq.pop_front();
        continue;
      }
      late_.add(now_ns() - f.due);  // before the write: the host receives the frame inside it
      if (trace_)
        std::fprintf(trace_, "R %zu %lld %lld %zu\n", q, static_cast<long long>(f.due),
                     static_cast<long long>(now_ns()), f.bytes.size());
      ssize_t w = write(taps_[q], f.bytes.data(), f.bytes.size());
      (void)w;  // a TAP takes every frame (its host's stack may still drop one: not ours to see)
      ++frames_;
      last_activity_ = now;
      queued_bytes_ -= f.bytes.size();
      dq.pop_front();
    }
  }
}

int64_t Switch::next_due() const {
  int64_t t = kNever;
  for (auto& dq : queues_)
    if (!dq.empty()) t = std::min(t, dq.front().due);
  return t;
}

int Switch::run() {
  live_ports_ = static_cast<int>(taps_.size());
  ep_ = epoll_create1(0);
  timer_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK);
  sigset_t ss;
  sigemptyset(&ss);
  sigaddset(&ss, SIGTERM);
  sigaddset(&ss, SIGINT);
  sigprocmask(SIG_BLOCK, &ss, nullptr);
  sig_ = signalfd(-1, &ss, SFD_NONBLOCK);
  if (ep_ < 0 || timer_ < 0 || sig_ < 0) die("epoll/timerfd/signalfd");
  const int n = static_cast<int>(taps_.size());
  auto add = [&](int fd, uint32_t id) {
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.u32 = id;
    if (epoll_ctl(ep_, EPOLL_CTL_ADD, fd, &e) != 0) die("epoll_ctl");
  };
  for (int p = 0; p < n; ++p) add(taps_[p], static_cast<uint32_t>(p));
  add(timer_, n);
  add(sig_, n + 1);
  if (ctl_ >= 0) add(ctl_, n + 2);
  write_status();  // ready
  epoll_event evs[64];
  int64_t armed = kNever;
  int64_t window = now_ns(), spun = 0, last = window;
  bool spinning = false;
  for (;;) {
    int64_t now = now_ns();
    if (spinning) spun += now - last;
    if (now - window > kWindowNs) window = now, spun = 0;
    last = now;
    release_due(now);
    int64_t next = next_due();
    int timeout = -1;
    bool may_spin = spun < kWindowNs / 2;
    // and for kLingerNs after the last frame taken in or released: an answer (an ACK, a pong)
    // usually follows within it, and is then stamped when it comes, not after a wake-up
    spinning = may_spin && ((next != kNever && next - now <= lead_ns_) ||
                            now - last_activity_ < kLingerNs);
    if (spinning) {
      timeout = 0;  // still taking arrivals
    } else {
      int64_t at = next == kNever ? kNever : may_spin ? next - lead_ns_ : next;
      armed_lead_ = may_spin;
      if (at != armed) {
        itimerspec its{};
        if (at != kNever) {
          its.it_value.tv_sec = at / 1000000000;
          its.it_value.tv_nsec = at % 1000000000;
        }
        timerfd_settime(timer_, TFD_TIMER_ABSTIME, &its, nullptr);
        armed = at;
      }
    }
    int k = epoll_wait(ep_, evs, 64, timeout);
    if (k < 0 && errno != EINTR) die("epoll_wait");
    for (int i = 0; i < k; ++i) {
      uint32_t id = evs[i].data.u32;
      if (id < static_cast<uint32_t>(n)) {
        on_tap(static_cast<int>(id));
      } else if (id == static_cast<uint32_t>(n)) {
        uint64_t ticks;
        if (read(timer_, &ticks, sizeof ticks) > 0 && armed != kNever) {
          if (armed_lead_) {
            wakes_[nwakes_++ % wakes_.size()] = now_ns() - armed;
            size_t m = std::min(nwakes_, wakes_.size());
            std::array<int64_t, 64> w = wakes_;
            std::nth_element(w.begin(), w.begin() + m * 9 / 10, w.begin() + m);
            lead_ns_ = std::clamp<int64_t>(w[m * 9 / 10] + 5000, 5000, 100000);
          }
          armed = kNever;
        }
      } else if (id == static_cast<uint32_t>(n + 1)) {
        if (trace_) std::fflush(trace_);
        write_status();
        return 0;
      } else {
        on_ctl();
      }
    }
    if (live_ports_ == 0) {
      write_status();
      return 0;
    }
  }
}

int open_tap_in(const std::string& netns, int txqueuelen, bool napi) {
  int self = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  int ns = open(netns.c_str(), O_RDONLY | O_CLOEXEC);
  if (self < 0 || ns < 0) die("cannot open namespace " + netns);
  if (setns(ns, CLONE_NEWNET) != 0) die("setns " + netns);
  int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) die("/dev/net/tun");
  ifreq ifr{};
  // IFF_NAPI: a frame written to the TAP is taken in by the device's NAPI poll, which
  // netns_hosts.sh runs in a thread of its own (threaded NAPI), as a NIC's interrupt work runs
  // beside the program that fed it; without it this thread would run the receiving host's
  // TCP/IP stack inside each write and release late at 1 Gbit/s (issue 40)
  ifr.ifr_flags = static_cast<short>(IFF_TAP | IFF_NO_PI | (napi ? IFF_NAPI : 0));
  std::strncpy(ifr.ifr_name, "eth0", IFNAMSIZ - 1);
  if (ioctl(fd, TUNSETIFF, &ifr) != 0) die("TUNSETIFF eth0 in " + netns);
  // the TAP's queue toward us: a host's whole window may arrive at once (a TAP never pushes back)
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ifr.ifr_qlen = txqueuelen;
  if (s < 0 || ioctl(s, SIOCSIFTXQLEN, &ifr) != 0) die("txqueuelen of eth0 in " + netns);
  close(s);
  if (setns(self, CLONE_NEWNET) != 0) die("setns back");
  close(ns);
  close(self);
  return fd;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> netns;
  std::string status, ctl_path;
  double rate = 0;
  long long delay = 0;
  int ports = 0, prio = 50, txq = 20000;
  bool schedule = false, napi = true;
  std::string trace;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "wire: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--netns") netns.push_back(val());
    else if (a == "--status") status = val();
    else if (a == "--ctl") ctl_path = val();
    else if (a == "--rate") rate = std::atof(val().c_str());
    else if (a == "--delay-ns") delay = std::atoll(val().c_str());
    else if (a == "--rt-priority") prio = std::atoi(val().c_str());
    else if (a == "--txqueuelen") txq = std::atoi(val().c_str());
    else if (a == "--ports") ports = std::atoi(val().c_str());
    else if (a == "--schedule") schedule = true;
    else if (a == "--no-napi") napi = false;
    else if (a == "--trace") trace = val();
    else {
      std::fprintf(stderr, "wire: unknown argument %s (see the comment atop wire.cc)\n", a.c_str());
      return 2;
    }
  }
  if (rate < 0 || delay < 0) {
    std::fprintf(stderr, "wire: --rate and --delay-ns must be >= 0\n");
    return 2;
  }
  if (schedule) {
    if (ports < 2) {
      std::fprintf(stderr, "wire: --schedule needs --ports >= 2\n");
      return 2;
    }
    return schedule_mode(ports, rate, delay);
  }
  if (netns.size() < 2 || status.empty()) {
    std::fprintf(stderr, "wire: needs --netns for at least 2 hosts and --status\n");
    return 2;
  }
  std::vector<int> taps;
  for (auto& ns : netns) taps.push_back(open_tap_in(ns, txq, napi));
  int ctl = -1;
  if (!ctl_path.empty() && (ctl = open(ctl_path.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC)) < 0)
    die("cannot open " + ctl_path);
  bool fifo = false;
  if (prio > 0) {
    sched_param sp{};
    sp.sched_priority = prio;
    fifo = sched_setscheduler(0, SCHED_FIFO, &sp) == 0;
    if (!fifo) std::fprintf(stderr, "wire: no SCHED_FIFO (%s): timing will suffer under load\n", std::strerror(errno));
    mlockall(MCL_CURRENT | MCL_FUTURE);
  }
  errno = 0;
  Switch sw(std::move(taps), rate, delay, status, ctl, fifo);
  if (!trace.empty() && !(sw.trace_ = std::fopen(trace.c_str(), "w"))) die("cannot write " + trace);
  return sw.run();
}
