/* frugal.h: everything a program needs, in one include. */
#ifndef FRUGAL_H
#define FRUGAL_H

#include "autograd/autograd.h"
#include "autograd/functions.h"
#include "tensor/memory.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"

#endif
