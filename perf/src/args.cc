#include "args.h"

#include <getopt.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "dtypes.h"

namespace perf {

const char* modeName(Mode m) {
  switch (m) {
    case Mode::PowerSgd: return "powersgd";
    case Mode::Exact: return "exact";
    case Mode::Fp16: return "fp16";
  }
  return "?";
}

bool parseSize(const std::string& s, size_t* out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || end == s.c_str() || v < 0) return false;
  double mult = 1;
  std::string suffix(end);
  if (suffix == "K" || suffix == "k") mult = 1024.0;
  else if (suffix == "M" || suffix == "m") mult = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "g") mult = 1024.0 * 1024 * 1024;
  else if (!suffix.empty()) return false;
  const double r = v * mult;
  if (r > 1e18) return false;
  *out = static_cast<size_t>(r);
  return true;
}

namespace {

[[noreturn]] void usage(FILE* f, int status) {
  std::fprintf(f,
      "Usage: lowrank_allreduce_perf [flags]\n"
      "  nccl-tests flags:\n"
      "  -b, --minbytes <size>     smallest size in bytes, K/M/G suffixes (default 32M)\n"
      "  -e, --maxbytes <size>     largest size in bytes (default 32M)\n"
      "  -i, --stepbytes <size>    additive step between sizes (default 1M)\n"
      "  -f, --stepfactor <x>      multiplicative step between sizes (overrides -i)\n"
      "  -n, --iters <n>           timed iterations per size (default 20)\n"
      "  -w, --warmup_iters <n>    untimed warm-up iterations (default 5)\n"
      "  -c, --check <0/1>         check results: #wrong against the exact allreduce (default 1)\n"
      "  -d, --datatype <type>     float, half, bfloat16, double, int8, uint8, int32, uint32,\n"
      "                            int64, uint64 or all (default float)\n"
      "  -o, --op <op>             sum, prod, max, min, avg or all (default sum)\n"
      "  -t, --nthreads <n>        comm ranks, as threads of this process (default 1)\n"
      "  -J, --output_file <file>  write the results as JSON\n"
      "  -g -a -m -p -z -G -C -R -T -N -u -x -y -r: accepted for nccl-tests compatibility, ignored\n"
      "  lowrank flags:\n"
      "  -k, --approx-rank <k>     PowerSGD approximation rank (default 4)\n"
      "  -M, --mode <list>         powersgd, exact, fp16, comma-separated (default powersgd)\n"
      "      --gradients <dir>     real gradients: <step>_worker<i>.safetensors, one per rank\n"
      "      --step <prefix>       file prefix in --gradients (default: the first found)\n"
      "      --rounds <n>          calls summed for cumrelerr (default 10)\n"
      "      --seed <n>            seed of the synthetic inputs (default 0)\n"
      "      --triad-mib <n>       MiB per array of the triad measured at start (default 64;\n"
      "                            0: no triad, no bandwidth bound)\n"
      "      --phases <0/1>        measure compute_us and comm_us, each alone (default 1)\n"
      "      --digest              after each row, a '# digest' line per comm rank: FNV-1a 64 of\n"
      "                            recvbuff after each of the row's calls (bit-exactness checks)\n"
      "      --ids                 with --gradients: declare the tensors with ids 0..n-1\n"
      "                            (lowrankBufferSetTensors) instead of a layout\n"
      "      --move                with --ids: recvbuff alternates between two allocations, a new\n"
      "                            address at every call, the ids declared on it each call (FSDP)\n"
      "  -h, --help                this help\n");
  std::exit(status);
}

[[noreturn]] void bad(const std::string& msg) {
  std::fprintf(stderr, "lowrank_allreduce_perf: %s (see -h)\n", msg.c_str());
  std::exit(2);
}

long parseInt(const char* flag, const char* v, long lo, long hi) {
  errno = 0;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0' || x < lo || x > hi) {
    bad(std::string("bad value '") + v + "' for " + flag + " (an integer in [" +
        std::to_string(lo) + ", " + std::to_string(hi) + "] expected)");
  }
  return x;
}

size_t parseBytes(const char* flag, const char* v) {
  size_t x;
  if (!parseSize(v, &x)) bad(std::string("bad size '") + v + "' for " + flag);
  return x;
}

std::vector<std::string> splitComma(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(item);
  if (s.empty() || s.back() == ',') out.push_back("");  // "float," names an empty item: refused
  return out;
}

// The flag getopt_long complains about: the short letter, else the word as typed.
std::string flagName(char** argv, int opt) {
  if (opt > 0 && opt < 128 && std::isalpha(opt)) return std::string("-") + static_cast<char>(opt);
  std::string w = argv[optind - 1];
  return w.substr(0, w.find('='));
}

enum LongOnly { kGradients = 1000, kStep, kRounds, kSeed, kTriadMib, kPhases, kDigest, kIds, kMove };

}  // namespace

Args parseArgs(int argc, char** argv) {
  Args a;
  for (int i = 0; i < argc; ++i) {
    if (i) a.commandLine += ' ';
    a.commandLine += argv[i];
  }
  static const option longOpts[] = {
      {"minbytes", required_argument, nullptr, 'b'},
      {"maxbytes", required_argument, nullptr, 'e'},
      {"stepbytes", required_argument, nullptr, 'i'},
      {"stepfactor", required_argument, nullptr, 'f'},
      {"iters", required_argument, nullptr, 'n'},
      {"warmup_iters", required_argument, nullptr, 'w'},
      {"check", required_argument, nullptr, 'c'},
      {"datatype", required_argument, nullptr, 'd'},
      {"op", required_argument, nullptr, 'o'},
      {"nthreads", required_argument, nullptr, 't'},
      {"output_file", required_argument, nullptr, 'J'},
      {"approx-rank", required_argument, nullptr, 'k'},
      {"mode", required_argument, nullptr, 'M'},
      {"gradients", required_argument, nullptr, kGradients},
      {"step", required_argument, nullptr, kStep},
      {"rounds", required_argument, nullptr, kRounds},
      {"seed", required_argument, nullptr, kSeed},
      {"triad-mib", required_argument, nullptr, kTriadMib},
      {"phases", required_argument, nullptr, kPhases},
      {"digest", no_argument, nullptr, kDigest},
      {"ids", no_argument, nullptr, kIds},
      {"move", no_argument, nullptr, kMove},
      {"help", no_argument, nullptr, 'h'},
      // nccl-tests flags accepted and ignored
      {"ngpus", required_argument, nullptr, 'g'},
      {"average", required_argument, nullptr, 'a'},
      {"agg_iters", required_argument, nullptr, 'm'},
      {"parallel_init", required_argument, nullptr, 'p'},
      {"blocking", required_argument, nullptr, 'z'},
      {"cudagraph", required_argument, nullptr, 'G'},
      {"report_cputime", required_argument, nullptr, 'C'},
      {"local_register", required_argument, nullptr, 'R'},
      {"timeout", required_argument, nullptr, 'T'},
      {"run_cycles", required_argument, nullptr, 'N'},
      {"memory", required_argument, nullptr, 'u'},
      {"stream_null", required_argument, nullptr, 'y'},
      {"root", required_argument, nullptr, 'r'},
      {"split_mask", required_argument, nullptr, 'x'},
      {nullptr, 0, nullptr, 0},
  };
  bool stepBytesSet = false, stepFactorSet = false;
  opterr = 0;
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, ":b:e:i:f:n:w:c:d:o:t:J:k:M:hg:a:m:p:z:G:C:R:T:N:u:y:r:x:",
                          longOpts, nullptr)) != -1) {
    switch (c) {
      case 'b': a.minBytes = parseBytes("-b", optarg); break;
      case 'e': a.maxBytes = parseBytes("-e", optarg); break;
      case 'i': a.stepBytes = parseBytes("-i", optarg); stepBytesSet = true; break;
      case 'f': {
        char* end = nullptr;
        a.stepFactor = std::strtod(optarg, &end);
        if (end == optarg || *end != '\0' || !(a.stepFactor > 1.0))
          bad(std::string("bad value '") + optarg + "' for -f (a factor > 1 expected)");
        stepFactorSet = true;
        break;
      }
      case 'n': a.iters = static_cast<int>(parseInt("-n", optarg, 1, 1000000)); break;
      case 'w': a.warmup = static_cast<int>(parseInt("-w", optarg, 0, 1000000)); break;
      case 'c': a.check = parseInt("-c", optarg, 0, 1) != 0; break;
      case 'd': {
        a.types.clear();
        for (const auto& s : splitComma(optarg)) {
          if (s == "all") {
            for (auto t : allTypes()) a.types.push_back(t);
            continue;
          }
          auto t = parseType(s);
          if (!t) bad("unknown datatype '" + s + "' for -d");
          a.types.push_back(*t);
        }
        if (a.types.empty()) bad("empty -d");
        break;
      }
      case 'o': {
        a.ops.clear();
        for (const auto& s : splitComma(optarg)) {
          if (s == "all") {
            for (auto op : allOps()) a.ops.push_back(op);
            continue;
          }
          auto op = parseOp(s);
          if (!op) bad("unknown op '" + s + "' for -o (sum, prod, max, min, avg, all)");
          a.ops.push_back(*op);
        }
        if (a.ops.empty()) bad("empty -o");
        break;
      }
      case 't': a.nthreads = static_cast<int>(parseInt("-t", optarg, 1, 1024)); break;
      case 'J': a.jsonFile = optarg; break;
      case 'k': a.approxRank = static_cast<int>(parseInt("-k", optarg, 0, 1 << 16)); break;  // the library's limit
      case 'M': {
        a.modes.clear();
        for (const auto& s : splitComma(optarg)) {
          if (s == "powersgd") a.modes.push_back(Mode::PowerSgd);
          else if (s == "exact") a.modes.push_back(Mode::Exact);
          else if (s == "fp16") a.modes.push_back(Mode::Fp16);
          else bad("unknown mode '" + s + "' for --mode (powersgd, exact, fp16)");
        }
        if (a.modes.empty()) bad("empty --mode");
        break;
      }
      case kGradients: a.gradientsDir = optarg; break;
      case kStep: a.step = optarg; break;
      case kRounds: a.rounds = static_cast<int>(parseInt("--rounds", optarg, 1, 1000000)); break;
      case kSeed:
        a.seed = static_cast<uint64_t>(parseInt("--seed", optarg, 0, 0x7fffffffffffffffL));
        break;
      case kTriadMib:
        a.triadMib = static_cast<size_t>(parseInt("--triad-mib", optarg, 0, 1 << 16));
        break;
      case kPhases: a.phases = parseInt("--phases", optarg, 0, 1) != 0; break;
      case kDigest: a.digest = true; break;
      case kIds: a.ids = true; break;
      case kMove: a.move = true; break;
      case 'h': usage(stdout, 0);
      case 'g': case 'a': case 'm': case 'p': case 'z': case 'G': case 'C': case 'R': case 'T':
      case 'N': case 'u': case 'y': case 'r': case 'x':
        break;  // nccl-tests flags without meaning here
      case ':':
        bad("flag " + flagName(argv, optopt) + " needs a value");
      default:
        bad("unknown flag " + flagName(argv, optopt));
    }
  }
  if (optind < argc) bad(std::string("unexpected argument '") + argv[optind] + "'");
  if (a.minBytes > a.maxBytes) bad("-b is larger than -e");
  if (stepFactorSet && stepBytesSet) {
    // nccl-tests: -f wins when given
  }
  if (!stepFactorSet) a.stepFactor = 1.0;
  if (!stepFactorSet && a.stepBytes == 0) bad("-i must be > 0");
  if (!a.step.empty() && a.gradientsDir.empty()) bad("--step needs --gradients");
  if (a.ids && a.gradientsDir.empty()) bad("--ids needs --gradients (per-tensor mode)");
  if (a.move && !a.ids) bad("--move needs --ids");
  return a;
}

}  // namespace perf
