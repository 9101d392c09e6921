#include "report.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "dtypes.h"

namespace perf {

namespace {

std::string fmtWrong(const std::optional<uint64_t>& w) {
  return w ? std::to_string(*w) : std::string("N/A");
}

std::string fmtOpt(const std::optional<double>& v, const char* f) {
  if (!v) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, f, *v);
  return buf;
}

template <typename T>
nlohmann::ordered_json orNull(const std::optional<T>& v) {
  return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr);
}

nlohmann::ordered_json placementJson(const Placement& p) {
  nlohmann::ordered_json j;
  j["time"] = p.timeUs;
  j["alg_bw"] = p.algBw;
  j["bus_bw"] = p.busBw;
  j["nwrong"] = orNull(p.nwrong);
  return j;
}

}  // namespace

void Report::note(const std::string& line) { std::fprintf(out_, "# %s\n", line.c_str()); }

void Report::header() {
  std::fprintf(out_, "#\n");
  std::fprintf(out_,
      "# %10s  %12s  %8s  %6s  %6s  %-31s  %-31s  %-8s %3s %8s %8s %8s %8s %9s %9s %9s %5s %6s\n",
      "", "", "", "", "", "            out-of-place", "              in-place", "", "", "", "", "",
      "", "", "", "", "", "");
  std::fprintf(out_,
      "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s  %-8s %3s %8s %8s %8s "
      "%8s %9s %9s %9s %5s %6s\n",
      "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time",
      "algbw", "busbw", "#wrong", "mode", "k", "ratio", "relerr", "cumrel", "opt", "compute",
      "comm", "bound", "eff", "factor");
  std::fprintf(out_,
      "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s  %-8s %3s %8s %8s %8s "
      "%8s %9s %9s %9s %5s %6s\n",
      "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)",
      "", "", "", "", "", "", "", "(us)", "(us)", "(us)", "", "(wire)");
  std::fflush(out_);
}

void Report::row(const Row& r) {
  rows_.push_back(r);
  std::fprintf(out_,
      "  %10zu  %12zu  %8s  %6s  %6d  %7.2f  %6.2f  %6.2f  %6s  %7.2f  %6.2f  %6.2f  %6s  %-8s %3d "
      "%8s %8s %8s %8s %9s %9s %9s %5s %6s\n",
      r.size, r.count, typeName(r.type), opName(r.op), -1, r.outOfPlace.timeUs, r.outOfPlace.algBw,
      r.outOfPlace.busBw, fmtWrong(r.outOfPlace.nwrong).c_str(), r.inPlace.timeUs, r.inPlace.algBw,
      r.inPlace.busBw, fmtWrong(r.inPlace.nwrong).c_str(), modeName(r.mode), r.k,
      fmtOpt(r.ratio, "%.2f").c_str(), fmtOpt(r.relerr, "%.4f").c_str(),
      fmtOpt(r.cumrelerr, "%.4f").c_str(), fmtOpt(r.relerrOpt, "%.4f").c_str(),
      fmtOpt(r.computeUs, "%.1f").c_str(), fmtOpt(r.commUs, "%.1f").c_str(),
      fmtOpt(r.boundUs, "%.1f").c_str(), fmtOpt(r.computeEff, "%.2f").c_str(),
      r.factorDtype.empty() ? "-" : r.factorDtype.c_str());
  std::fflush(out_);
}

uint64_t Report::footer() {
  outOfBounds_ = 0;
  double bw = 0;
  for (const auto& r : rows_) {
    if (r.expectExact)
      outOfBounds_ += r.outOfPlace.nwrong.value_or(0) + r.inPlace.nwrong.value_or(0);
    bw += r.outOfPlace.busBw + r.inPlace.busBw;
  }
  avgBusBw_ = rows_.empty() ? 0.0 : bw / (2.0 * static_cast<double>(rows_.size()));
  std::fprintf(out_, "# Out of bounds values : %llu %s\n",
               static_cast<unsigned long long>(outOfBounds_), outOfBounds_ ? "FAILED" : "OK");
  std::fprintf(out_, "# Avg bus bandwidth    : %g \n", avgBusBw_);
  std::fprintf(out_, "#\n");
  std::fflush(out_);
  return outOfBounds_;
}

bool Report::writeJson(const std::string& path, const Args& args, int nranks) const {
  nlohmann::ordered_json j;
  j["command_line"] = args.commandLine;
  j["nranks"] = nranks;
  j["rounds"] = args.rounds;
  j["triad_gbps"] = orNull(triad_.alone);
  j["triad_shared_gbps"] = orNull(triad_.shared);
  j["triad_concurrent_ranks"] = triad_.concurrent;
  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  for (const auto& r : rows_) {
    nlohmann::ordered_json e;
    e["size"] = r.size;
    e["count"] = r.count;
    e["type"] = typeName(r.type);
    e["redop"] = opName(r.op);
    e["root"] = -1;
    e["out_of_place"] = placementJson(r.outOfPlace);
    e["in_place"] = placementJson(r.inPlace);
    nlohmann::ordered_json l;
    l["mode"] = modeName(r.mode);
    l["k"] = r.k;
    l["alternate"] = r.alternate;
    if (r.factorDtype.empty()) l["factor_dtype"] = nullptr;
    else l["factor_dtype"] = r.factorDtype;
    l["wire_bytes"] = orNull(r.wireBytes);
    l["ratio"] = orNull(r.ratio);
    l["relerr"] = orNull(r.relerr);
    l["cumrelerr"] = orNull(r.cumrelerr);
    l["relerr_opt"] = orNull(r.relerrOpt);
    l["expect_exact"] = r.expectExact;
    l["compute_us"] = orNull(r.computeUs);
    l["comm_us"] = orNull(r.commUs);
    l["bound_us"] = orNull(r.boundUs);
    l["bound_alone_us"] = orNull(r.boundAloneUs);
    l["compute_eff"] = orNull(r.computeEff);
    l["p_elements"] = orNull(r.pElements);
    l["q_elements"] = orNull(r.qElements);
    l["exact_elements"] = orNull(r.exactElements);
    e["lowrank"] = l;
    results.push_back(e);
  }
  j["results"] = results;
  j["out_of_bounds"] = outOfBounds_;
  j["average_bus_bandwidth"] = avgBusBw_;
  std::ofstream f(path);
  if (!f) {
    std::fprintf(stderr, "lowrank_allreduce_perf: cannot write %s\n", path.c_str());
    return false;
  }
  f << j.dump(2) << "\n";
  f.close();
  if (!f) {
    std::fprintf(stderr, "lowrank_allreduce_perf: error writing %s\n", path.c_str());
    return false;
  }
  return true;
}

}  // namespace perf
