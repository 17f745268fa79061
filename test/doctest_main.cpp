// doctest's main(), compiled once and shared by every unit-test target.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
