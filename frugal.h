// frugal: the one header a user includes. Names live in namespace frugal (frugal::memory, ...).
//
//   #include <frugal/frugal.h>
//   using namespace frugal;
//   Tensor w = randn({3, 2}).requires_grad_();
//   Tensor loss = sum(relu(matmul(randn({4, 3}), w) + 1.0));
//   loss.backward();  // w.grad()
#pragma once

#include "amp/autocast.h"
#include "autograd/functions.h"
#include "autograd/gradcheck.h"
#include "autograd/graph.h"
#include "autograd/recompute.h"
#include "autograd/sparse.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/memory_history.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "core/shape.h"
#include "core/tensor.h"
#include "data/dataloader.h"
#include "data/dataset.h"
#include "data/idx.h"
#include "data/text.h"
#include "io/checkpoint.h"
#include "io/file.h"
#include "io/safetensors.h"
#include "io/serialize.h"
#include "nn/attention.h"
#include "nn/containers.h"
#include "nn/conv.h"
#include "nn/functional.h"
#include "nn/gpt.h"
#include "nn/init.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "nn/module_holder.h"
#include "nn/ordered_dict.h"
#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "optim/sgd.h"
#include "optim/sparse_adam.h"
