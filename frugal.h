/* frugal.h: everything a program needs, in one include: tensors and the
 * memory ledger, autograd and the differentiable ops, the model-building
 * API and the built-in models, the model registry, the training loop,
 * optimizers and schedules, mixed precision, safetensors and training
 * checkpoints, datasets and loaders, and the program helpers (flags,
 * --data specs, the progress line). docs/MODELS.md starts from here. */
#ifndef FRUGAL_H
#define FRUGAL_H

#include "autograd/autograd.h"
#include "autograd/functions.h"
#include "data/loader.h"
#include "nn/amp.h"
#include "nn/build.h"
#include "nn/checkpoint.h"
#include "nn/cli.h"
#include "nn/densenet.h"
#include "nn/model.h"
#include "nn/optim.h"
#include "nn/params.h"
#include "nn/registry.h"
#include "nn/resnet.h"
#include "nn/schedule.h"
#include "nn/train.h"
#include "tensor/memory.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"

#endif
