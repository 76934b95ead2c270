#pragma once
// A fixture of the layers_catch_upward_include test: the DSL may not include the runtime.
#include "core/error.h"
#include "runtime/jit.h"
