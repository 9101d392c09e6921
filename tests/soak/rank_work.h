// The work of one comm rank in a soak step, around its lowrankAllReduce: its input, and its slice
// of the reference and of the checks. Every rank reads the other ranks' buffers (threads of one
// process), between barriers, so no two ranks touch the same element concurrently.
#pragma once
#include <cstddef>
#include <vector>

#include "lowrank/lowrank.h"
#include "soak/step.h"

namespace lowrank::soak {

// Writes comm rank r's input of the step into s.send[r] (which is s.recv[r] in place).
void fillInput(const Step& s, int r, int nranks);

// Elements [lo, hi), before the call. Compressed and fallback calls: slot->d += mean of the ranks'
// inputs. Exact calls: s.expected = the reduction of the ranks' inputs.
void reference(Step& s, int nranks, size_t lo, size_t hi, Partial& p);

// Elements [lo, hi) of a slot's invariant: p.maxErr = largest |d - mean over ranks of E|, p.maxE =
// largest |E|, with E read from the engine's state of recv[q] on comms[q]; a state of another
// count counts in p.wrong.
void checkInvariant(const Slot& sl, const std::vector<void*>& recv,
                    const std::vector<lowrankComm_t>& comms, size_t lo, size_t hi, Partial& p);

// Elements [lo, hi), after the call: outputs equal on every rank; exact calls equal to the
// reference; compressed calls: slot->d -= output, and on checked calls d compared with the mean
// of the residuals the engine holds (comms: this step's communicator on each rank).
void verify(Step& s, const std::vector<lowrankComm_t>& comms, size_t lo, size_t hi, Partial& p);

}  // namespace lowrank::soak
