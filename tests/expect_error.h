// expect_error(call, {fragments...}): `call` must throw leanmoe::Error (not another exception)
// whose message contains every fragment, e.g. the argument's name and the rule it broke.
#pragma once
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>

#include "leanmoe/leanmoe.h"

namespace leanmoe {

template <class F>
void expect_error(F&& call, std::initializer_list<const char*> fragments) {
  try {
    call();
    ADD_FAILURE() << "no leanmoe::Error thrown (expected one mentioning '" << *fragments.begin() << "')";
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const char* f : fragments) EXPECT_NE(what.find(f), std::string::npos) << "'" << f << "' missing from: " << what;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-leanmoe exception: " << e.what();
  }
}

}  // namespace leanmoe
