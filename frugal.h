/* frugal.h: the user tier, everything a program needs, in one include: tensors and the
 * memory ledger, the GPU (tensor/cuda.h), autograd and the differentiable ops,
 * the model-building API and the built-in models, the model registry, the
 * training loop, optimizers and schedules, mixed precision, safetensors and
 * training checkpoints, datasets and loaders, and the program helpers (flags,
 * --data specs, the progress line). docs/MODELS.md starts from here.
 * Programs spell it #include <frugal/frugal.h>: installed, that is
 * <prefix>/include/frugal/frugal.h beside the other public headers (Makefile:
 * PUBLIC_HEADERS) and `pkg-config --cflags frugal` gives -I<prefix>/include;
 * in the tree, the build links <build>/include/frugal/frugal.h to this file.
 * The includes below are quoted and relative to this file, so they resolve
 * beside it once installed and through -I. in the tree. config.h, generated
 * by the build, records its options and version.
 *
 * The headers come in two tiers (docs/ARCHITECTURE.md): this one, for
 * programs, and <frugal/ext.h>, for op authors (the tape's node API, the
 * tape-free ops); a header in neither is internal and is not installed. */
#ifndef FRUGAL_H
#define FRUGAL_H

#include "config.h"

#include "autograd/autograd.h"
#include "autograd/functions.h"
#include "data/loader.h"
#include "dist/dist.h"
#include "train/amp.h"
#include "nn/build.h"
#include "train/state.h"
#include "programs/cli.h"
#include "models/densenet.h"
#include "nn/model.h"
#include "train/optim.h"
#include "io/outfile.h"
#include "nn/params.h"
#include "programs/programs.h"
#include "models/registry.h"
#include "models/resnet.h"
#include "train/schedule.h"
#include "train/train.h"
#include "tensor/cuda.h"
#include "tensor/memory.h"
#include "tensor/tensor.h"

#include "nn/init.h"
#include "planner/planner.h"
#include "io/safetensors.h"

#include "data/augment.h"
#include "data/dataset.h"

#endif
