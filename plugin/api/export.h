// Marks the C API functions exported from liblowrank.so (everything else is hidden).
#pragma once
#define LOWRANK_API extern "C" __attribute__((visibility("default")))
