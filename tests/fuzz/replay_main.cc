// main() of a fuzz target built without libFuzzer (g++, CI): runs LLVMFuzzerTestOneInput on every
// file named (or found in a named folder: a corpus, a crash to reproduce), then on --runs N
// pseudo-random inputs of up to --max-len bytes from a fixed seed, so that a run is repeatable.
//   fuzz_TARGET [--runs N] [--max-len L] [--seed S] [FILE|DIR]...
#include <dirent.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

int runFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    return 1;
  }
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), {});
  LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  long runs = 1000, maxLen = 512;
  uint64_t seed = 0x6c6f7772616e6bull;
  std::vector<std::string> paths;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--runs" || a == "--max-len" || a == "--seed") && i + 1 < argc) {
      char* end = nullptr;
      errno = 0;
      const long v = std::strtol(argv[++i], &end, 10);
      if (errno || *end || end == argv[i] || v < 0 || (a == "--max-len" && v > (1L << 24))) {
        std::fprintf(stderr, "%s: %s %s: not an integer in range (--max-len at most 2^24)\n",
                     argv[0], a.c_str(), argv[i]);
        return 2;
      }
      if (a == "--runs") runs = v;
      else if (a == "--max-len") maxLen = v;
      else seed = uint64_t(v);
    } else if (a.rfind("--", 0) == 0 || a == "-h") {
      std::fprintf(stderr, "usage: %s [--runs N] [--max-len L] [--seed S] [FILE|DIR]...\n",
                   argv[0]);
      return 2;
    } else {
      paths.push_back(a);
    }
  }
  if (runs < 0 || maxLen < 1) {
    std::fprintf(stderr, "usage: %s [--runs N] [--max-len L] [--seed S] [FILE|DIR]...\n", argv[0]);
    return 2;
  }
  long files = 0;
  for (const std::string& p : paths) {
    struct stat st {};
    if (stat(p.c_str(), &st) != 0) {
      std::fprintf(stderr, "no such file or folder: %s\n", p.c_str());
      return 1;
    }
    if (!S_ISDIR(st.st_mode)) {
      if (runFile(p)) return 1;
      ++files;
      continue;
    }
    DIR* d = opendir(p.c_str());
    std::vector<std::string> names;
    while (dirent* e = d ? readdir(d) : nullptr)
      if (e->d_name[0] != '.') names.push_back(p + "/" + e->d_name);
    if (d) closedir(d);
    for (const std::string& n : names) {
      if (runFile(n)) return 1;
      ++files;
    }
  }
  uint64_t s = seed;
  auto next = [&] {  // xorshift64*
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 0x2545f4914f6cdd1dull;
  };
  std::vector<uint8_t> buf;
  for (long r = 0; r < runs; ++r) {
    buf.resize(size_t(next() % uint64_t(maxLen + 1)));
    for (uint8_t& b : buf) b = uint8_t(next() >> 56);
    LLVMFuzzerTestOneInput(buf.data(), buf.size());
  }
  std::printf("%s: %ld corpus files and %ld generated inputs, no invariant broken\n", argv[0], files,
              runs);
  return 0;
}
