// The communicator behind lowrankComm_t: the lock that serializes its calls, its engine (all of its
// state, engine/engine.h), and the text of its last error. The API layer's alone.
#pragma once
#include <memory>
#include <mutex>
#include <string>

#include "engine/engine.h"

struct lowrankComm {
  std::mutex callMu;  // held by every call; destroy and abort wait on it before freeing
  std::unique_ptr<lowrank::Engine> engine;
  std::mutex errMu;
  std::string lastError;  // lowrankGetLastError (under errMu)
};
