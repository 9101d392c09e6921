#include "engine/host_backend.h"
#include "engine/host_schedule.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "kernels/host/powersgd_kernels.h"
#include "util/dtype.h"
#include "util/log.h"

namespace lowrank {

Status HostBackend::exact(const Call& c) {
  if (c.send != c.recv) std::memcpy(c.recv, c.send, c.count * dtypeSize(c.dtype));
  return tr_.allreduce(c.recv, c.count, c.dtype, c.op);
}

// The words travel as bytes, one more than they fill: an odd size that no float32 payload has, so
// that a rank planning while its peers make a compressed call (a restore or reset on some comm
// ranks only) meets a size mismatch at the transport, never a collective that happens to have the
// same size. A byte-wise max keeps the check exact: a word and its complement both come back
// unchanged only if every rank's bytes equal this rank's.
Status HostBackend::agree(uint64_t words[PlanCheck::kWords]) {
  uint8_t bytes[sizeof(uint64_t) * PlanCheck::kWords + 1] = {};
  std::memcpy(bytes, words, sizeof(uint64_t) * PlanCheck::kWords);
  Status s = tr_.allreduce(bytes, sizeof bytes, lowrankUint8, lowrankMax);
  std::memcpy(words, bytes, sizeof(uint64_t) * PlanCheck::kWords);
  return s;
}

Status HostBackend::save(BackendState& state, const Plan& plan, float* residual, float* qt,
                         float* p) {
  const auto& st = static_cast<const HostState&>(state);
  if (residual && !st.error.empty()) {
    std::copy_n(st.error.data(), plan.count, residual);
    if (st.residualPending) {  // the last Q step's residual, as the next P step would take it
      const float* pk = st.payload.data() + plan.payload().p;
      for (const TensorPlan& t : plan.tensors)
        if (t.compressed)
          host::subtractLowRank(residual + t.offset, t.view, pk + t.pOffset,
                                st.ownQ.data() + t.qOffset, t.view.cols, t.k);
    }
  }
  std::copy_n(st.qt.data(), plan.qElems, qt);
  if (p) std::copy_n(st.payload.data() + plan.payload().p, plan.pElems, p);
  return Status::Ok();
}

Status HostBackend::load(BackendState& state, const Plan& plan, const float* residual,
                         const float* qt, const float* p) {
  auto& st = static_cast<HostState&>(state);
  if (residual && !st.error.empty()) std::copy_n(residual, plan.count, st.error.data());
  st.residualPending = false;
  std::copy_n(qt, plan.qElems, st.qt.data());
  if (p) std::copy_n(p, plan.pElems, st.payload.data() + plan.payload().p);
  return Status::Ok();
}

std::unique_ptr<BackendState> HostBackend::allocate(const Plan& plan, const Call&,
                                                    const EngineConfig&, std::string* why,
                                                    bool* refused) {
  *refused = false;  // host memory is lowrank's own
  try {
    auto st = std::make_unique<HostState>();
    if (cfg_.errorFeedback) st->error.assign(plan.count, 0.f);
    st->payload.assign(plan.payload().elems, 0.f);
    st->qt.assign(plan.qElems, 0.f);
    st->qwire.assign(plan.qWireElems(), 0.f);
    st->ownQ.assign(ownQElems(plan, cfg_.errorFeedback), 0.f);
    return st;
  } catch (const std::bad_alloc&) {
    *why = "out of host memory";
    return nullptr;
  }
}

Status HostBackend::compressed(BackendState& state, const Plan& plan, const Call& c,
                               const float* freshQ, bool qStep, bool* fellBack) {
  if (plan.alternate)
    return runAlternateOnHost(static_cast<HostState&>(state), plan, cfg_, c.send, c.recv, c.op,
                              freshQ, qStep, tr_, fellBack);
  return runCompressedOnHost(static_cast<HostState&>(state), plan, cfg_, c.send, c.recv, c.op,
                            freshQ, tr_, fellBack);
}

}  // namespace lowrank
