#pragma once
// A fixture of the layers_catch_upward_include test: the device library includes its siblings only.
#include "codegen/device/tile.cuh"
