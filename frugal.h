// frugal: the one header a user includes. Names live in namespace frugal (frugal::memory, ...).
//
//   #include "frugal.h"
//   using namespace frugal;
//   Tensor y = relu(matmul(randn({4, 3}), randn({3, 2})) + 1.0);
#pragma once

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/ops.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "core/shape.h"
#include "core/tensor.h"
