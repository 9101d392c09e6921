// The value a C caller passed for a parameter of a C enum type. C lets any int through such a
// parameter; C++ forbids loading an enum outside its enumerators' range (UBSan: "load of value
// ..., which is not a valid value"), so the API's checks read the parameter's bits as an int and
// use the enum only once the value is known to be one of its enumerators.
#pragma once
#include <cstring>

namespace lowrank {

template <typename E>
int cEnumValue(const E& e) {
  static_assert(sizeof(E) == sizeof(int), "a C enum is int-sized");
  int v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

}  // namespace lowrank
