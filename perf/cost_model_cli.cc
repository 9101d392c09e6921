// lowrank_cost_model: the host transport's cost model (plugin/transport/ucx/cost_model.h) on the
// command line, so that scripts (studies/netns/cost_table.py) use the one formula the transport chooses with.
//
//   lowrank_cost_model [--alpha-us A] [--beta-ns B] [--direct-max-ranks R] WORLD:BYTES ...
//
// prints one JSON object per WORLD:BYTES: the algorithm chosen, and for every algorithm its steps,
// the busiest comm rank's bytes and the modelled seconds.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "transport/ucx/cost_model.h"

using namespace lowrank::ucx;

namespace {

int usage() {
  std::fprintf(stderr, "usage: lowrank_cost_model [--alpha-us A] [--beta-ns B] [--direct-max-ranks R] "
                       "WORLD:BYTES ...\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  CostParams c;
  int directMaxRanks = 64;  // UcxTransportOptions' default
  int i = 1;
  for (; i + 1 < argc && !std::strncmp(argv[i], "--", 2); i += 2) {
    const double v = std::atof(argv[i + 1]);
    if (!(v > 0)) return usage();
    if (!std::strcmp(argv[i], "--alpha-us")) c.alphaSec = v * 1e-6;
    else if (!std::strcmp(argv[i], "--beta-ns")) c.betaSecPerByte = v * 1e-9;
    else if (!std::strcmp(argv[i], "--direct-max-ranks")) directMaxRanks = int(v);
    else return usage();
  }
  if (i == argc) return usage();
  for (; i < argc; ++i) {
    int n = 0;
    double bytes = -1;
    if (std::sscanf(argv[i], "%d:%lf", &n, &bytes) != 2 || n < 2 || bytes < 0) return usage();
    std::printf("{\"world\": %d, \"bytes\": %.0f, \"alpha_s\": %g, \"beta_s_per_byte\": %g, "
                "\"chosen\": \"%s\", \"algorithms\": {",
                n, bytes, c.alphaSec, c.betaSecPerByte, algorithmName(choose(n, bytes, c, directMaxRanks)));
    for (int a = 0; a < kNumAlgorithms; ++a)
      std::printf("%s\"%s\": {\"steps\": %d, \"busiest_bytes\": %.1f, \"seconds\": %.9g}", a ? ", " : "",
                  kAlgorithmNames[a], steps(Algorithm(a), n), busiestBytes(Algorithm(a), n, bytes),
                  modelledSeconds(Algorithm(a), n, bytes, c));
    std::printf("}}\n");
  }
  return 0;
}
