#include "engine/checkpoint.h"

#include <zlib.h>

#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <string>

#include "util/dtype.h"

namespace lowrank {
namespace {

// Header: magic[8] version u32, headerBytes u32, count u64, dtype u32, k i32, seed i64, nranks i32,
// rank i32, calls u64, flags u32, ntensors u32, residual elems u64, qt elems u64; then per tensor
// ndims u32 and its sizes u64; then the residual and Qt (float32); then the CRC-32 (u32).
constexpr char kMagic[8] = {'L', 'R', 'S', 'T', 'A', 'T', 'E', '\0'};
constexpr size_t kFixed = 80, kCrc = 4;
constexpr uint32_t kErrorFeedback = 1, kHaveQ = 2, kPerTensor = 4, kKnownFlags = 7;
constexpr uint32_t kMaxDims = 8;
constexpr uint64_t kMaxCalls = uint64_t(1) << 62;  // far beyond any run; no counter wraps after it

class Writer {
 public:
  explicit Writer(uint8_t* p) : p_(p) {}
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) *p_++ = uint8_t(v >> (8 * i));
  }
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) *p_++ = uint8_t(v >> (8 * i));
  }
  void floats(const std::vector<float>& v) {
    for (float f : v) {
      uint32_t bits = 0;
      std::memcpy(&bits, &f, 4);
      u32(bits);
    }
  }
  void raw(const void* d, size_t n) {
    std::memcpy(p_, d, n);
    p_ += n;
  }
  uint8_t* at() const { return p_; }

 private:
  uint8_t* p_;
};

// Reads within [p, end): every read checks the room left, so no input reads past the bytes.
class Reader {
 public:
  Reader(const uint8_t* p, const uint8_t* end) : p_(p), end_(end) {}
  bool u32(uint32_t* v) {
    if (left() < 4) return false;
    *v = 0;
    for (int i = 0; i < 4; ++i) *v |= uint32_t(*p_++) << (8 * i);
    return true;
  }
  bool u64(uint64_t* v) {
    if (left() < 8) return false;
    *v = 0;
    for (int i = 0; i < 8; ++i) *v |= uint64_t(*p_++) << (8 * i);
    return true;
  }
  bool floats(size_t n, std::vector<float>* v) {
    if (left() / 4 < n) return false;
    v->resize(n);
    for (size_t i = 0; i < n; ++i) {
      uint32_t bits = 0;
      u32(&bits);
      std::memcpy(&(*v)[i], &bits, 4);
    }
    return true;
  }
  size_t left() const { return size_t(end_ - p_); }
  const uint8_t* at() const { return p_; }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

uint32_t crc(const uint8_t* p, size_t n) {
  uLong c = crc32(0L, Z_NULL, 0);
  while (n) {  // zlib takes uInt lengths
    const uInt chunk = uInt(std::min<size_t>(n, 1u << 30));
    c = crc32(c, p, chunk);
    p += chunk;
    n -= chunk;
  }
  return uint32_t(c);
}

size_t layoutBytes(const std::optional<Layout>& l) {
  size_t n = 0;
  if (l)
    for (const Shape& s : *l) n += 4 + 8 * s.size();
  return n;
}

Status bad(const char* what) {
  return Status::Error(lowrankInvalidArgument, "lowrankBufferRestoreState: the bytes are %s", what);
}

std::string shapes(const std::optional<Layout>& l) {
  if (!l) return "batched (no layout)";
  std::string out = std::to_string(l->size()) + " tensors [";
  for (size_t t = 0; t < l->size(); ++t) {
    out += t ? ", (" : "(";
    for (size_t d = 0; d < (*l)[t].size(); ++d) {
      if (d) out += ',';
      out += std::to_string((*l)[t][d]);
    }
    out += ")";
    if (out.size() > 200) return out + ", ...]";
  }
  return out + "]";
}

Status differs(const char* what, const std::string& saved, const std::string& now) {
  return Status::Error(lowrankInvalidUsage,
                       "lowrankBufferRestoreState: the state was saved with %s %s, this buffer has "
                       "%s",
                       what, saved.c_str(), now.c_str());
}

}  // namespace

size_t encodedSize(const SavedState& s) {
  return kFixed + layoutBytes(s.layout) + 4 * (s.residual.size() + s.qt.size()) + kCrc;
}

void encode(const SavedState& s, uint8_t* out) {
  Writer w(out);
  w.raw(kMagic, sizeof kMagic);
  w.u32(SavedState::kFormatVersion);
  w.u32(uint32_t(kFixed + layoutBytes(s.layout)));
  w.u64(s.count);
  w.u32(uint32_t(s.dtype));
  w.u32(uint32_t(s.approxRank));
  w.u64(uint64_t(s.seed));
  w.u32(uint32_t(s.nranks));
  w.u32(uint32_t(s.rank));
  w.u64(s.calls);
  w.u32((s.errorFeedback ? kErrorFeedback : 0) | (s.haveQ ? kHaveQ : 0) |
        (s.layout ? kPerTensor : 0));
  w.u32(s.layout ? uint32_t(s.layout->size()) : 0);
  w.u64(s.residual.size());
  w.u64(s.qt.size());
  if (s.layout)
    for (const Shape& sh : *s.layout) {
      w.u32(uint32_t(sh.size()));
      for (size_t d : sh) w.u64(d);
    }
  w.floats(s.residual);
  w.floats(s.qt);
  w.u32(crc(out, size_t(w.at() - out)));
}

Status decode(const void* bytes, size_t size, SavedState* out) {
  const auto* p = static_cast<const uint8_t*>(bytes);
  if (size < sizeof kMagic || std::memcmp(p, kMagic, sizeof kMagic) != 0)
    return bad(size < sizeof kMagic ? "too short to be lowrank's saved state (truncated?)"
                                    : "not lowrank's saved state (no \"LRSTATE\" magic)");
  if (size < kFixed + kCrc) return bad("truncated (shorter than the header)");
  Reader r(p + sizeof kMagic, p + size - kCrc);
  uint32_t version = 0, headerBytes = 0;
  r.u32(&version);
  r.u32(&headerBytes);
  uint32_t stored = 0;
  Reader(p + size - kCrc, p + size).u32(&stored);
  const bool crcOk = crc(p, size - kCrc) == stored;
  // Another version only where the bytes are whole: a flipped bit in the version field is corrupt.
  if (version != SavedState::kFormatVersion && crcOk)
    return Status::Error(lowrankInvalidArgument,
                         "lowrankBufferRestoreState: the bytes are of format version %u; this "
                         "library reads versions %u and %u",
                         version, SavedState::kFormatVersion, SavedTensors::kFormatVersion);
  if (!crcOk) return bad("corrupt or truncated (their CRC-32 does not match)");

  SavedState s;
  uint32_t dtype = 0, k = 0, nranks = 0, rank = 0, flags = 0, ntensors = 0;
  uint64_t seed = 0, nres = 0, nq = 0;
  r.u64(&s.count);
  r.u32(&dtype);
  r.u32(&k);
  r.u64(&seed);
  r.u32(&nranks);
  r.u32(&rank);
  r.u64(&s.calls);
  r.u32(&flags);
  r.u32(&ntensors);
  r.u64(&nres);
  r.u64(&nq);
  // A CRC that matches vouches for the bytes, not for their sense: a writer of another build, or
  // an attacker, can make consistent-looking nonsense. Check every field before trusting it.
  if (!dtypeCompressible(lowrankDataType_t(dtype)) || (flags & ~kKnownFlags) || int32_t(k) <= 0 ||
      int32_t(nranks) <= 0 || int32_t(rank) < 0 || int32_t(rank) >= int32_t(nranks) ||
      int64_t(seed) < 0 || s.count == 0 || ((flags & kPerTensor) != 0) != (ntensors != 0) ||
      s.calls > kMaxCalls)
    return bad("inconsistent (a header field out of its range)");
  s.dtype = lowrankDataType_t(dtype);
  s.approxRank = int32_t(k);
  s.seed = int64_t(seed);
  s.nranks = int32_t(nranks);
  s.rank = int32_t(rank);
  s.errorFeedback = flags & kErrorFeedback;
  s.haveQ = flags & kHaveQ;
  if (ntensors) {
    if (ntensors > s.count) return bad("inconsistent (more tensors than elements)");
    Layout layout;
    uint64_t total = 0;
    for (uint32_t t = 0; t < ntensors; ++t) {
      uint32_t nd = 0;
      if (!r.u32(&nd)) return bad("truncated (in the layout)");
      if (nd < 1 || nd > kMaxDims) return bad("inconsistent (a tensor of 0 or more than 8 dimensions)");
      Shape sh(nd);
      uint64_t numel = 1;
      for (uint32_t d = 0; d < nd; ++d) {
        uint64_t v = 0;
        if (!r.u64(&v)) return bad("truncated (in the layout)");
        if (v == 0 || numel > s.count / v) return bad("inconsistent (a layout larger than count)");
        numel *= v;
        sh[d] = size_t(v);
      }
      total += numel;
      if (total > s.count) return bad("inconsistent (a layout larger than count)");
      layout.push_back(std::move(sh));
    }
    if (total != s.count) return bad("inconsistent (the layout does not hold count elements)");
    s.layout = std::move(layout);
  }
  if (size_t(r.at() - p) != headerBytes) return bad("inconsistent (the header's size)");
  if (nres != (s.errorFeedback ? s.count : 0))
    return bad("inconsistent (the residual is not count elements, or present without error feedback)");
  if (nq > r.left() / 4 || nres > (r.left() / 4) - nq) return bad("truncated (in the residual or Q)");
  r.floats(size_t(nres), &s.residual);
  r.floats(size_t(nq), &s.qt);
  if (r.left()) return bad("inconsistent (bytes after Q)");
  *out = std::move(s);
  return Status::Ok();
}

Status checkRestore(const SavedState& s, const EngineConfig& cfg, int rank, int nranks,
                    const std::optional<Layout>& layout) {
  using std::to_string;
  if (s.nranks != nranks) return differs("comm size", to_string(s.nranks), to_string(nranks));
  if (s.rank != rank) return differs("comm rank", to_string(s.rank), to_string(rank));
  if (s.approxRank != cfg.approxRank)
    return differs("approximation rank k", to_string(s.approxRank), to_string(cfg.approxRank));
  if (uint64_t(s.seed) != cfg.seed) return differs("seed", to_string(s.seed), to_string(cfg.seed));
  if (s.errorFeedback != bool(cfg.errorFeedback))
    return differs("error feedback", s.errorFeedback ? "on" : "off",
                   cfg.errorFeedback ? "on" : "off");
  if (layout && s.layout != layout) return differs("layout", shapes(s.layout), shapes(layout));
  return Status::Ok();
}

// Tensor t of a plan as a saved tensor: its slices of the plan's whole residual and Qt (host
// copies; residual empty without error feedback), the one place a tensor's state is cut out.
SavedTensor sliceOf(const TensorPlan& t, uint64_t id, const Shape& shape, uint64_t calls,
                    bool haveQ, const std::vector<float>& residual, const std::vector<float>& qt,
                    bool qStep, const std::vector<float>& p) {
  SavedTensor s;
  s.id = id;
  s.shape = shape;
  s.k = t.compressed ? t.k : 0;
  s.calls = calls;
  s.haveQ = t.compressed && haveQ;
  if (!residual.empty())
    s.residual.assign(residual.begin() + long(t.offset), residual.begin() + long(t.offset + t.numel));
  if (s.haveQ)
    s.qt.assign(qt.begin() + long(t.qOffset),
                qt.begin() + long(t.qOffset + size_t(t.k) * t.view.cols));
  s.qStep = s.haveQ && qStep && !p.empty();
  if (s.qStep)
    s.p.assign(p.begin() + long(t.pOffset), p.begin() + long(t.pOffset + size_t(t.k) * t.view.rows));
  return s;
}

Status tensorsOf(const SavedState& s, const EngineConfig& cfg, SavedTensors* out) {
  Plan pl;  // where the saved buffer kept each tensor's residual and Q
  LR_RETURN_IF_ERROR(makePlan(s.count, s.dtype, lowrankSum, s.layout ? &*s.layout : nullptr, cfg,
                              &pl));
  if (s.qt.size() != pl.qElems)
    return Status::Error(lowrankInvalidUsage,
                         "lowrankBufferRestoreState: the state holds Q of %zu elements, this "
                         "layout %zu (another min compression rate?)", s.qt.size(), pl.qElems);
  const Layout shapes = s.layout ? *s.layout : Layout{Shape{s.count}};
  out->seed = s.seed;
  out->nranks = s.nranks;
  out->rank = s.rank;
  out->errorFeedback = s.errorFeedback;
  out->byPosition = true;
  for (size_t i = 0; i < pl.tensors.size(); ++i)
    out->tensors.push_back(sliceOf(pl.tensors[i], i, shapes[i], s.calls, s.haveQ, s.residual, s.qt));
  return Status::Ok();
}

Status sameLayout(const Layout& saved, const std::optional<Layout>& now, size_t count) {
  if (now ? saved == *now : saved == Layout{Shape{count}}) return Status::Ok();
  return differs("layout", shapes(saved), shapes(now));
}

uint32_t formatVersion(const void* bytes, size_t size) {
  const auto* p = static_cast<const uint8_t*>(bytes);
  if (size < sizeof kMagic + 4 || std::memcmp(p, kMagic, sizeof kMagic) != 0) return 0;
  uint32_t v = 0;
  Reader(p + sizeof kMagic, p + size).u32(&v);
  return v;
}

// Format 2: magic[8], version u32, headerBytes u32 (40), seed i64, nranks i32, rank i32, flags u32
// (error feedback, by position), ntensors u32; per tensor: id u64, ndims u32, sizes u64..., k i32, calls u64,
// flags u32 (haveQ, qStep), residual elems u64, qt elems u64, the residual and Qt (float32), and
// with qStep: P elems u64 and P (float32); the CRC-32.
namespace {
constexpr size_t kFixed2 = 40;
// Format 2's header flags beside kErrorFeedback. A reader refuses the flags it does not know, so
// a flag (or a per-tensor one beside kHaveQ) extends the format without a new version.
constexpr uint32_t kByPosition = 2, kKnownFlags2 = kErrorFeedback | kByPosition;
// Per tensor beside kHaveQ: alternating PowerSGD's next step is a Q step, its kept P follows.
constexpr uint32_t kQStep = 4, kKnownTensorFlags = kHaveQ | kQStep;
size_t tensorBytes(const SavedTensor& t) {
  return 8 + 4 + 8 * t.shape.size() + 4 + 8 + 4 + 16 + 4 * (t.residual.size() + t.qt.size()) +
         (t.qStep ? 8 + 4 * t.p.size() : 0);
}
}  // namespace

size_t encodedSize(const SavedTensors& s) {
  size_t n = kFixed2 + kCrc;
  for (const SavedTensor& t : s.tensors) n += tensorBytes(t);
  return n;
}

void encode(const SavedTensors& s, uint8_t* out) {
  Writer w(out);
  w.raw(kMagic, sizeof kMagic);
  w.u32(SavedTensors::kFormatVersion);
  w.u32(uint32_t(kFixed2));
  w.u64(uint64_t(s.seed));
  w.u32(uint32_t(s.nranks));
  w.u32(uint32_t(s.rank));
  w.u32((s.errorFeedback ? kErrorFeedback : 0) | (s.byPosition ? kByPosition : 0));
  w.u32(uint32_t(s.tensors.size()));
  for (const SavedTensor& t : s.tensors) {
    w.u64(t.id);
    w.u32(uint32_t(t.shape.size()));
    for (size_t d : t.shape) w.u64(d);
    w.u32(uint32_t(t.k));
    w.u64(t.calls);
    w.u32((t.haveQ ? kHaveQ : 0) | (t.qStep ? kQStep : 0));
    w.u64(t.residual.size());
    w.u64(t.qt.size());
    w.floats(t.residual);
    w.floats(t.qt);
    if (t.qStep) {
      w.u64(t.p.size());
      w.floats(t.p);
    }
  }
  w.u32(crc(out, size_t(w.at() - out)));
}

Status decode(const void* bytes, size_t size, SavedTensors* out) {
  const auto* p = static_cast<const uint8_t*>(bytes);
  if (formatVersion(bytes, size) != SavedTensors::kFormatVersion)
    return bad("not lowrank's per-tensor saved state (format version 2)");
  if (size < kFixed2 + kCrc) return bad("truncated (shorter than the header)");
  uint32_t stored = 0;
  Reader(p + size - kCrc, p + size).u32(&stored);
  if (crc(p, size - kCrc) != stored) return bad("corrupt or truncated (their CRC-32 does not match)");
  Reader r(p + sizeof kMagic + 4, p + size - kCrc);
  SavedTensors s;
  uint32_t headerBytes = 0, nranks = 0, rank = 0, flags = 0, ntensors = 0;
  uint64_t seed = 0;
  r.u32(&headerBytes);
  r.u64(&seed);
  r.u32(&nranks);
  r.u32(&rank);
  r.u32(&flags);
  r.u32(&ntensors);
  if (headerBytes != kFixed2 || (flags & ~kKnownFlags2) || int32_t(nranks) <= 0 ||
      int32_t(rank) < 0 || int32_t(rank) >= int32_t(nranks) || int64_t(seed) < 0)
    return bad("inconsistent (a header field out of its range)");
  s.seed = int64_t(seed);
  s.nranks = int32_t(nranks);
  s.rank = int32_t(rank);
  s.errorFeedback = flags & kErrorFeedback;
  s.byPosition = flags & kByPosition;
  std::vector<uint64_t> seen;
  for (uint32_t i = 0; i < ntensors; ++i) {
    SavedTensor t;
    uint32_t nd = 0, k = 0, tflags = 0;
    uint64_t nres = 0, nq = 0;
    if (!r.u64(&t.id) || !r.u32(&nd)) return bad("truncated (in a tensor)");
    if (nd < 1 || nd > kMaxDims) return bad("inconsistent (a tensor of 0 or more than 8 dimensions)");
    uint64_t numel = 1;
    for (uint32_t d = 0; d < nd; ++d) {
      uint64_t v = 0;
      if (!r.u64(&v)) return bad("truncated (in a tensor)");
      if (v == 0 || numel > (uint64_t(1) << 48) / v) return bad("inconsistent (a tensor's size)");
      numel *= v;
      t.shape.push_back(size_t(v));
    }
    if (!r.u32(&k) || !r.u64(&t.calls) || !r.u32(&tflags) || !r.u64(&nres) || !r.u64(&nq))
      return bad("truncated (in a tensor)");
    t.k = int32_t(k);
    t.haveQ = tflags & kHaveQ;
    // A 1-D tensor with Q: a batched buffer's one tensor (by position), Q of the batched view.
    const bool batched = nd == 1 && s.byPosition && ntensors == 1;
    const uint64_t cols = !t.haveQ ? 0 : batched ? batchedView(size_t(numel)).cols : numel / t.shape[0];
    t.qStep = tflags & kQStep;
    if (t.k < 0 || t.k > 65536 || (tflags & ~kKnownTensorFlags) || t.calls > kMaxCalls ||
        (t.qStep && !t.haveQ) ||
        nres != (s.errorFeedback ? numel : 0) ||
        nq != (t.haveQ ? uint64_t(t.k) * cols : 0) ||
        (t.haveQ && (t.k == 0 || (nd < 2 && !batched))))
      return bad("inconsistent (a tensor's residual or Q does not fit its shape and rank)");
    if (nq > r.left() / 4 || nres > (r.left() / 4) - nq) return bad("truncated (in a tensor)");
    r.floats(size_t(nres), &t.residual);
    r.floats(size_t(nq), &t.qt);
    if (t.qStep) {  // the kept P: rows of its view x k
      uint64_t np = 0;
      const uint64_t rows = batched ? batchedView(size_t(numel)).rows : t.shape[0];
      if (!r.u64(&np)) return bad("truncated (in a tensor)");
      if (np != rows * uint64_t(t.k))
        return bad("inconsistent (a tensor's P does not fit its shape and rank)");
      if (np > r.left() / 4) return bad("truncated (in a tensor)");
      r.floats(size_t(np), &t.p);
    }
    seen.push_back(t.id);
    s.tensors.push_back(std::move(t));
  }
  if (r.left()) return bad("inconsistent (bytes after the last tensor)");
  std::sort(seen.begin(), seen.end());
  if (std::adjacent_find(seen.begin(), seen.end()) != seen.end())
    return bad("inconsistent (an id given twice)");
  *out = std::move(s);
  return Status::Ok();
}

Status checkRestore(const SavedTensors& s, const EngineConfig& cfg, int rank, int nranks) {
  using std::to_string;
  if (s.nranks != nranks) return differs("comm size", to_string(s.nranks), to_string(nranks));
  if (s.rank != rank) return differs("comm rank", to_string(s.rank), to_string(rank));
  if (uint64_t(s.seed) != cfg.seed) return differs("seed", to_string(s.seed), to_string(cfg.seed));
  if (s.errorFeedback != bool(cfg.errorFeedback))
    return differs("error feedback", s.errorFeedback ? "on" : "off",
                   cfg.errorFeedback ? "on" : "off");
  return Status::Ok();
}

uint64_t agreementId(const SavedTensor& t) {
  uint64_t h = mix(mix(mix(0x746e7372ull, t.id), t.calls), t.haveQ);
  h = mix(h, crc(reinterpret_cast<const uint8_t*>(t.qt.data()), 4 * t.qt.size()));
  if (t.qStep) h = mix(mix(h, 0x7153746570ull), crc(reinterpret_cast<const uint8_t*>(t.p.data()), 4 * t.p.size()));
  return h ? h : 1;
}

Status addCalls(void* bytes, size_t size, uint64_t calls) {
  static const char* fn = "lowrankStateAddCalls";
  const uint32_t version = formatVersion(bytes, size);  // 0: not lowrank's (decode says why)
  if (version != 0 && version != SavedState::kFormatVersion)
    return Status::Error(lowrankInvalidArgument,
                         "%s: the bytes are of format version %u; only format 1 holds a buffer's "
                         "call count", fn, version);
  SavedState s;
  if (Status st = decode(bytes, size, &s); !st.ok()) {
    const size_t colon = st.msg.find(": ");  // decode's messages name the restore
    return Status::Error(lowrankInvalidArgument, "%s: %s", fn,
                         colon == std::string::npos ? st.msg.c_str() : st.msg.c_str() + colon + 2);
  }
  if (calls > kMaxCalls - s.calls)
    return Status::Error(lowrankInvalidArgument,
                         "%s: %" PRIu64 " calls + %" PRIu64 " passes the largest count, 2^62", fn,
                         s.calls, calls);
  // Format 1's fixed header (above): the call count is the u64 at byte 48. Patched in place, so
  // everything else stays the bytes as saved; the CRC-32 covers all that precedes it.
  auto* p = static_cast<uint8_t*>(bytes);
  Writer(p + 48).u64(s.calls + calls);
  Writer(p + size - kCrc).u32(crc(p, size - kCrc));
  return Status::Ok();
}

}  // namespace lowrank
