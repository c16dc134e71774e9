/* SPDX-License-Identifier: MIT */
/*  zdist.h: the whole public API in one include, for programs that would
    rather not pick headers one by one:

        #include <zdist/zdist.h>

    compiled with `pkg-config --cflags zdist`, or linked to zdist::zdist in
    CMake. Every header below may also be included on its own; each includes
    what it needs. C and C++ alike (the declarations have C linkage). */
#ifndef ZDIST_ZDIST_H
#define ZDIST_ZDIST_H

/*  Ground floor: errors, tensors, the local autograd engine. */
#include <zdist/export.h>        /* ZD_API, ZD_BEGIN_DECLS / ZD_END_DECLS */
#include <zdist/version.h>       /* ZD_VERSION_* and zd_version() */
#include <zdist/error.h>         /* the calling thread's last error */
#include <zdist/log.h>           /* log levels, ZDIST_LOG_LEVEL, a sink for the lines */
#include <zdist/strings.h>       /* lists of strings: skipped names, a file's metadata */
#include <zdist/tensor.h>        /* reference-counted n-dimensional tensors */
#include <zdist/function.h>      /* writing a differentiable operation */
#include <zdist/autograd.h>      /* the local autograd engine, basic differentiable ops */
#include <zdist/scope.h>         /* scopes that drop temporary tensors together */
#include <zdist/named_tensors.h> /* (name, tensor) lists: state dicts, checkpoints */

/*  RPC: workers calling each other's functions, futures, remote references. */
#include <zdist/value.h>  /* the values an RPC carries; argument helpers */
#include <zdist/future.h> /* values that become available later */
#include <zdist/rpc.h>    /* the RPC agent: init, calls, RRefs, shutdown */

/*  Distributed autograd, on RPC. */
#include <zdist/dist_autograd.h> /* contexts and the distributed backward pass */

/*  Neural networks and data. */
#include <zdist/rng.h>         /* seeded random numbers (xoshiro256**) */
#include <zdist/nn.h>          /* layers, losses, PyTorch's default initialisation */
#include <zdist/rnn.h>         /* LSTM, GRU and tanh cells, a multi-layer LSTM */
#include <zdist/model.h>       /* the example programs' two models */
#include <zdist/idx.h>         /* IDX files (the MNIST format), plain or gzip */
#include <zdist/dataset.h>     /* MNIST-format data sets: loading, shuffling, batches */
#include <zdist/checkpoint.h>  /* saving and loading named tensors */
#include <zdist/safetensors.h> /* safetensors files: weights to and from PyTorch */

/*  Optimizers: local ones, and the DistributedOptimizer on RPC. */
#include <zdist/optim.h>      /* SGD, Adam, ... with PyTorch's update rules */
#include <zdist/dist_optim.h> /* the DistributedOptimizer */
#include <zdist/module.h>     /* a parameter container: nn.Module */
#include <zdist/dist_nn.h>    /* parameter RRefs and RemoteModule */

/*  Parameter servers for any model, on RPC and the optimizers. */
#include <zdist/ps.h> /* push/pull over sharded servers, sync rounds or bounded staleness */

#endif
