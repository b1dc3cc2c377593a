/* ext.h: the extension tier, for op authors: everything of <frugal/frugal.h>
 * plus what writing a differentiable op or a memory strategy needs: the
 * tape's node record and the API that records a node and saves tensors
 * (autograd/node.h), and the tape-free, checked tensor-level ops with their
 * shape functions (tensor/ops.h), in-place (_out, _) and forward/backward
 * pairs. A program that only builds, trains and runs models includes
 * <frugal/frugal.h> alone. Installed as <prefix>/include/frugal/ext.h
 * (Makefile: EXT_HEADERS); scripts/check-headers.sh keeps the tiers closed. */
#ifndef FRUGAL_EXT_H
#define FRUGAL_EXT_H

#include "frugal.h"

#include "autograd/node.h"
#include "tensor/ops.h"

#endif
