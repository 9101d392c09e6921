// Fuzz target: the bytes lowrankBufferRestoreState reads (plugin/engine/checkpoint.cc: decode of
// format 1 and of format 2 (tensors with ids, fuzzTensors below), and
// the checks of a decoded state, checkRestore and checkPlan). Every input is decoded as it is; then
//  - an input that starts with the magic "LRSTATE\0" (the seed corpus: bytes the library saved,
//    tests/fuzz/corpus/restore/README) and decodes is also mutated in fixed ways: every header and
//    layout field set to extremes and to its neighbours, with the CRC-32 recomputed so that the
//    field checks are reached and not only the CRC; truncations; extensions; bit flips;
//  - any other input is read as choices (fuzz_input.h): a valid state (batched or per tensor, the
//    sizes of a real plan), encoded, decoded back field for field, then mutated as the input says
//    (bit flips, truncation, extension, a field set to a value, with or without the CRC fixed).
// Invariants, for every decode: no crash or read out of bounds (ASan/UBSan); the result is Ok or
// lowrankInvalidArgument with a message; *out is untouched on error; on Ok, encodedSize of the
// state is the input's size and encode() gives the input back byte for byte, agreementId is not 0,
// checkRestore against the communicator the bytes name is Ok (and lowrankInvalidUsage naming the
// field against one that differs), and checkPlan against the plan of the state's count, dtype and
// layout returns Ok or lowrankInvalidUsage only (Ok when the sizes match).
#include <zlib.h>

#include <cstring>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/plan.h"
#include "tests/fuzz/fuzz_input.h"

using namespace lowrank;

namespace {

constexpr const char* kName = "restore";
#define CHECK(cond) FUZZ_CHECK(kName, cond, #cond)
#define CHECK_MSG(cond, msg) FUZZ_CHECK(kName, cond, std::string(#cond ": ") + (msg))

constexpr uint8_t kMagic[8] = {'L', 'R', 'S', 'T', 'A', 'T', 'E', '\0'};
constexpr size_t kFixed = 80;  // the fixed header; then the layout, the floats and the CRC

// Field offsets and widths of the fixed header (checkpoint.cc).
struct Field {
  size_t at, width;
};
constexpr Field kFields[] = {{8, 4},  {12, 4}, {16, 8}, {24, 4}, {28, 4}, {32, 8}, {40, 4},
                             {44, 4}, {48, 8}, {56, 4}, {60, 4}, {64, 8}, {72, 8}};

uint32_t crcOf(const uint8_t* p, size_t n) {
  return uint32_t(crc32(crc32(0L, Z_NULL, 0), p, uInt(n)));
}

void put(std::vector<uint8_t>& b, size_t at, size_t width, uint64_t v) {
  for (size_t i = 0; i < width && at + i < b.size(); ++i) b[at + i] = uint8_t(v >> (8 * i));
}

uint64_t get(const std::vector<uint8_t>& b, size_t at, size_t width) {
  uint64_t v = 0;
  for (size_t i = 0; i < width && at + i < b.size(); ++i) v |= uint64_t(b[at + i]) << (8 * i);
  return v;
}

void fixCrc(std::vector<uint8_t>& b) {
  if (b.size() >= 4) put(b, b.size() - 4, 4, crcOf(b.data(), b.size() - 4));
}

bool sameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), 4 * a.size()) == 0);
}

bool same(const SavedState& a, const SavedState& b) {
  return a.count == b.count && a.dtype == b.dtype && a.layout == b.layout &&
         a.approxRank == b.approxRank && a.seed == b.seed && a.nranks == b.nranks &&
         a.rank == b.rank && a.errorFeedback == b.errorFeedback && a.calls == b.calls &&
         a.haveQ == b.haveQ && sameBits(a.residual, b.residual) && sameBits(a.qt, b.qt);
}

// What a decode must leave in *out when it fails: this, unchanged.
SavedState sentinel() {
  SavedState s;
  s.count = 0x5e5e;
  s.dtype = lowrankBfloat16;
  s.layout = Layout{{3, 7}, {11}};
  s.approxRank = 77;
  s.seed = 99;
  s.nranks = 5;
  s.rank = 4;
  s.calls = 123456;
  s.haveQ = true;
  s.residual = {1.f, -2.f};
  s.qt = {3.f};
  return s;
}

EngineConfig configOf(const SavedState& s) {
  EngineConfig cfg;
  cfg.approxRank = s.approxRank;
  cfg.seed = uint64_t(s.seed);
  cfg.errorFeedback = s.errorFeedback;
  return cfg;
}

// The checks of a state that decoded.
void checkDecoded(const SavedState& s, const uint8_t* data, size_t size) {
  CHECK(encodedSize(s) == size);
  std::vector<uint8_t> again(encodedSize(s));
  encode(s, again.data());
  CHECK(again.size() == size && std::memcmp(again.data(), data, size) == 0);

  // checkRestore: Ok against the communicator and layout the bytes name; lowrankInvalidUsage
  // naming the field against one that differs in that field alone.
  const EngineConfig cfg = configOf(s);
  CHECK(checkRestore(s, cfg, s.rank, s.nranks, s.layout).ok());
  CHECK(checkRestore(s, cfg, s.rank, s.nranks, std::nullopt).ok());
  auto refused = [&](const Status& st, const char* what) {
    CHECK_MSG(st.code == lowrankInvalidUsage && st.msg.find(what) != std::string::npos, st.msg);
  };
  refused(checkRestore(s, cfg, s.rank, s.nranks == 1 ? 2 : s.nranks - 1, s.layout), "comm size");
  if (s.nranks > 1)
    refused(checkRestore(s, cfg, (s.rank + 1) % s.nranks, s.nranks, s.layout), "comm rank");
  EngineConfig other = cfg;
  other.approxRank = s.approxRank == 1 ? 2 : s.approxRank - 1;
  refused(checkRestore(s, other, s.rank, s.nranks, s.layout), "approximation rank");
  other = cfg;
  other.seed = cfg.seed ^ 1;
  refused(checkRestore(s, other, s.rank, s.nranks, s.layout), "seed");
  other = cfg;
  other.errorFeedback = !cfg.errorFeedback;
  refused(checkRestore(s, other, s.rank, s.nranks, s.layout), "error feedback");
  const Layout otherLayout{{size_t(s.count)}};
  if (!s.layout || *s.layout != otherLayout)
    refused(checkRestore(s, cfg, s.rank, s.nranks, otherLayout), "layout");

  // tensorsOf: the state as per-tensor states by position, against the plan of its own count,
  // dtype and layout (bounded: a plan of a huge count would only cost time): Ok exactly when its
  // Q fits that plan, and then the tensors' residuals and Qs are the state's, cut in order.
  if (s.count > (1u << 20) || (s.layout && s.layout->size() > 4096)) return;
  Plan plan;
  const Layout* l = s.layout ? &*s.layout : nullptr;
  if (!makePlan(size_t(s.count), s.dtype, lowrankSum, l, cfg, &plan).ok()) return;
  SavedTensors t;
  const Status st = tensorsOf(s, cfg, &t);
  CHECK_MSG(st.ok() || st.code == lowrankInvalidUsage, st.msg);
  CHECK_MSG(st.ok() == (s.qt.size() == plan.qElems), st.msg);
  if (!st.ok()) return;
  CHECK(t.byPosition && t.tensors.size() == plan.tensors.size());
  size_t res = 0, q = 0;
  for (size_t i = 0; i < t.tensors.size(); ++i) {
    const SavedTensor& x = t.tensors[i];
    CHECK(x.id == i && x.calls == s.calls);
    auto same = [](const std::vector<float>& part, const std::vector<float>& whole, size_t at) {
      return part.empty() || std::memcmp(part.data(), whole.data() + at, 4 * part.size()) == 0;
    };  // bit for bit: NaN bits too
    CHECK(same(x.residual, s.residual, res) && same(x.qt, s.qt, q));
    res += x.residual.size();
    q += x.qt.size();
  }
  CHECK(res == s.residual.size() && (!s.haveQ || q == s.qt.size()));
}

// Decodes bytes and checks every invariant; returns whether they decoded.
bool decodeChecked(const uint8_t* data, size_t size, SavedState* decoded = nullptr) {
  SavedState out = sentinel();
  const Status st = decode(data, size, &out);
  if (!st.ok()) {
    CHECK_MSG(st.code == lowrankInvalidArgument, st.msg);
    CHECK(!st.msg.empty());
    CHECK(same(out, sentinel()));
    return false;
  }
  checkDecoded(out, data, size);
  if (decoded) *decoded = std::move(out);
  return true;
}

bool decodeChecked(const std::vector<uint8_t>& b, SavedState* decoded = nullptr) {
  // A copy of exactly b.size() bytes: ASan finds a read one past them.
  std::vector<uint8_t> exact(b);
  return decodeChecked(exact.data(), exact.size(), decoded);
}

// The fixed mutations of a valid encoding (the seed corpus, and what libFuzzer grows from it).
void mutateAll(const std::vector<uint8_t>& valid, const SavedState& s) {
  // Each header field, and each layout field, set to extremes and neighbours, the CRC recomputed.
  std::vector<Field> fields(std::begin(kFields), std::end(kFields));
  size_t at = kFixed;
  if (s.layout)
    for (const Shape& sh : *s.layout) {
      fields.push_back({at, 4});
      at += 4;
      for (size_t d = 0; d < sh.size(); ++d, at += 8) fields.push_back({at, 8});
    }
  for (const Field& f : fields) {
    const uint64_t v = get(valid, f.at, f.width), top = f.width == 8 ? ~0ull : 0xffffffffull;
    const uint64_t values[] = {0, 1, 2, v + 1, v - 1, top, top - 1, top >> 1, (top >> 1) + 1,
                               v << 1, v ^ 0x80, uint64_t(valid.size())};
    for (uint64_t x : values) {
      std::vector<uint8_t> b(valid);
      put(b, f.at, f.width, x);
      fixCrc(b);
      decodeChecked(b);
      put(b, b.size() - 4, 4, get(b, b.size() - 4, 4) ^ 1);  // the same with a wrong CRC
      CHECK(!decodeChecked(b));
    }
  }
  // A tensor whose sizes multiply to its element count only modulo 2^64 (2^63 + numel / 2, 2,
  // 1, ...): refused, not a shape of 2^63 rows.
  if (s.layout) {
    size_t off = kFixed;
    for (const Shape& sh : *s.layout) {
      uint64_t numel = 1;
      for (size_t d : sh) numel *= d;
      if (sh.size() >= 2 && numel % 2 == 0) {
        std::vector<uint8_t> b(valid);
        put(b, off + 4, 8, (1ull << 63) + numel / 2);
        put(b, off + 12, 8, 2);
        for (size_t d = 2; d < sh.size(); ++d) put(b, off + 4 + 8 * d, 8, 1);
        fixCrc(b);
        CHECK(!decodeChecked(b));
      }
      off += 4 + 8 * sh.size();
    }
  }
  // Truncations and extensions, with the CRC as it was and recomputed.
  for (size_t cut : {size_t(0), size_t(1), size_t(7), size_t(8), size_t(12), kFixed - 1, kFixed,
                     kFixed + 3, kFixed + 4, valid.size() / 2, valid.size() - 5, valid.size() - 4,
                     valid.size() - 1}) {
    if (cut >= valid.size()) continue;
    std::vector<uint8_t> b(valid.begin(), valid.begin() + long(cut));
    CHECK(!decodeChecked(b));
    fixCrc(b);
    CHECK(!decodeChecked(b));
  }
  for (size_t extra : {1, 3, 4, 5, 8, 64}) {
    std::vector<uint8_t> b(valid);
    b.insert(b.end(), extra, uint8_t(0xa5));
    CHECK(!decodeChecked(b));
    fixCrc(b);
    CHECK(!decodeChecked(b));
    // Room for more floats, with the sizes and the CRC made to match: Q may grow (it is checked
    // against the plan later), the residual may not.
    if (extra % 4 == 0) {
      std::vector<uint8_t> g(valid);
      g.insert(g.end() - 4, extra, uint8_t(0));
      put(g, 72, 8, get(g, 72, 8) + extra / 4);
      fixCrc(g);
      SavedState d;
      CHECK(decodeChecked(g, &d) && d.qt.size() == s.qt.size() + extra / 4);
      put(g, 72, 8, get(g, 72, 8) - extra / 4);
      put(g, 64, 8, get(g, 64, 8) + extra / 4);
      fixCrc(g);
      CHECK(!decodeChecked(g));
    }
  }
  // Single bit flips of a few bytes spread over the whole encoding: the CRC catches them all.
  const size_t step = valid.size() / 61 + 1;
  for (size_t i = 0; i < valid.size(); i += step) {
    std::vector<uint8_t> b(valid);
    b[i] ^= uint8_t(1u << (i % 8));
    CHECK(!decodeChecked(b));
  }
}

// A valid state from choices: a real plan's sizes, so that checkPlan must accept it.
bool makeState(fuzz::Input& in, SavedState* out) {
  SavedState s;
  EngineConfig cfg;
  cfg.approxRank = int(in.range(1, 9));
  cfg.errorFeedback = in.flag();
  cfg.minCompressionRate = 1 + double(in.range(0, 30)) / 10;
  const lowrankDataType_t dtypes[] = {lowrankFloat32, lowrankFloat16, lowrankBfloat16};
  s.dtype = dtypes[in.range(0, 2)];
  if (in.flag()) {
    Layout l;
    const size_t nt = size_t(in.range(1, 5));
    for (size_t t = 0; t < nt; ++t) {
      Shape sh(size_t(in.range(1, 3)));
      for (size_t& d : sh) d = size_t(in.range(1, 16));
      s.count += [&] {
        uint64_t n = 1;
        for (size_t d : sh) n *= d;
        return n;
      }();
      l.push_back(std::move(sh));
    }
    s.layout = std::move(l);
  } else {
    s.count = in.range(1, 2000);
  }
  Plan plan;
  if (!makePlan(size_t(s.count), s.dtype, lowrankSum, s.layout ? &*s.layout : nullptr, cfg, &plan)
           .ok())
    return false;
  s.approxRank = cfg.approxRank;
  s.seed = int64_t(in.u64() >> 1);
  s.nranks = int32_t(in.range(1, 1024));
  s.rank = int32_t(in.range(0, uint64_t(s.nranks) - 1));
  s.errorFeedback = cfg.errorFeedback;
  s.calls = (in.u64() >> 2) >> in.range(0, 61);  // < 2^62: decode refuses more calls
  s.haveQ = in.flag();
  auto floatBits = [&] {  // any bits: NaNs (signalling too), infinities, denormals
    const uint32_t bits = uint32_t(in.u64());
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  };
  if (s.errorFeedback) {
    s.residual.resize(size_t(s.count));
    for (float& f : s.residual) f = floatBits();
  }
  s.qt.resize(plan.qElems);
  for (float& f : s.qt) f = floatBits();
  *out = std::move(s);
  return true;
}

void mutateChosen(fuzz::Input& in, std::vector<uint8_t> b) {
  const int n = int(in.range(1, 4));
  for (int i = 0; i < n && !b.empty(); ++i) {
    switch (in.range(0, 4)) {
      case 0:  // bit flip
        b[size_t(in.range(0, b.size() - 1))] ^= uint8_t(1u << in.range(0, 7));
        break;
      case 1:  // truncation
        b.resize(size_t(in.range(0, b.size() - 1)));
        break;
      case 2:  // extension
        for (size_t k = size_t(in.range(1, 16)); k > 0; --k) b.push_back(in.byte());
        break;
      case 3: {  // a header field set to a chosen value
        const Field& f = kFields[in.range(0, std::size(kFields) - 1)];
        put(b, f.at, f.width, in.u64());
        break;
      }
      default: {  // any u32 or u64 at any place
        const size_t width = in.flag() ? 8 : 4;
        put(b, size_t(in.range(0, b.size() - 1)), width, in.u64());
      }
    }
    if (in.flag()) fixCrc(b);
  }
  decodeChecked(b);
}

// Format 2 (tensors with ids): the same invariants. On Ok the bytes re-encode to themselves, the
// communicator they name accepts them, and every tensor's agreement id is not 0.
bool decodeTensorsChecked(const std::vector<uint8_t>& b) {
  std::vector<uint8_t> exact(b);  // exactly b.size() bytes: ASan finds a read one past them
  SavedTensors out;
  out.seed = 12345;
  const Status st = decode(exact.data(), exact.size(), &out);
  if (!st.ok()) {
    CHECK_MSG(st.code == lowrankInvalidArgument, st.msg);
    CHECK(!st.msg.empty());
    CHECK(out.seed == 12345 && out.tensors.empty());  // untouched on error
    return false;
  }
  CHECK(encodedSize(out) == exact.size());
  std::vector<uint8_t> again(encodedSize(out));
  encode(out, again.data());
  CHECK(again == exact);
  EngineConfig cfg;
  cfg.seed = uint64_t(out.seed);
  cfg.errorFeedback = out.errorFeedback;
  CHECK(checkRestore(out, cfg, out.rank, out.nranks).ok());
  CHECK(checkRestore(out, cfg, out.rank, out.nranks + 1).code == lowrankInvalidUsage);
  for (const SavedTensor& t : out.tensors) CHECK(agreementId(t) != 0);
  return true;
}

// A valid format-2 state from choices, encoded, decoded back, then mutated as the input says.
void fuzzTensors(fuzz::Input& in) {
  SavedTensors s;
  s.seed = int64_t(in.u64() >> 1);
  s.nranks = int32_t(in.range(1, 1024));
  s.rank = int32_t(in.range(0, uint64_t(s.nranks) - 1));
  s.errorFeedback = in.flag();
  const size_t nt = size_t(in.range(0, 4));
  for (size_t i = 0; i < nt; ++i) {
    SavedTensor t;
    t.id = in.flag() ? uint64_t(i) : in.u64() ^ (uint64_t(i) << 56);  // distinct either way
    t.shape.resize(size_t(in.range(1, 3)));
    size_t numel = 1;
    for (size_t& d : t.shape) numel *= (d = size_t(in.range(1, 12)));
    t.k = int32_t(in.range(0, 4));
    t.calls = (in.u64() >> 2) >> in.range(0, 61);
    t.haveQ = t.k > 0 && t.shape.size() >= 2 && in.flag();
    if (s.errorFeedback) t.residual.assign(numel, float(in.range(0, 100)));
    if (t.haveQ) t.qt.assign(size_t(t.k) * (numel / t.shape[0]), float(in.range(0, 100)));
    s.tensors.push_back(std::move(t));
  }
  std::vector<uint8_t> b(encodedSize(s));
  encode(s, b.data());
  CHECK(decodeTensorsChecked(b));
  const int n = int(in.range(0, 3));
  for (int i = 0; i < n && !b.empty(); ++i) {
    switch (in.range(0, 2)) {
      case 0:
        b[size_t(in.range(0, b.size() - 1))] ^= uint8_t(1u << in.range(0, 7));
        break;
      case 1:
        b.resize(size_t(in.range(0, b.size() - 1)));
        break;
      default:
        put(b, size_t(in.range(0, b.size() - 1)), in.flag() ? 8 : 4, in.u64());
    }
    if (in.flag()) fixCrc(b);
  }
  decodeTensorsChecked(b);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  SavedState s;
  const bool ok = decodeChecked(data, size, &s);
  decodeTensorsChecked(std::vector<uint8_t>(data, data + size));
  if (size >= sizeof kMagic && std::memcmp(data, kMagic, sizeof kMagic) == 0) {
    if (ok) mutateAll(std::vector<uint8_t>(data, data + size), s);
    return 0;
  }
  fuzz::Input in(data, size);
  if (!makeState(in, &s)) return 0;
  std::vector<uint8_t> b(encodedSize(s));
  encode(s, b.data());
  SavedState d;
  CHECK(decodeChecked(b, &d));
  CHECK(same(d, s));
  if (in.flag()) mutateAll(b, s);
  mutateChosen(in, std::move(b));
  if (!in.empty()) fuzzTensors(in);
  return 0;
}
