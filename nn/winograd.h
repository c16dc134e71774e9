/* SPDX-License-Identifier: MIT */
/*  winograd.h: 3x3 stride-1 convolutions by Winograd's F(2x2, 3x3)
    (private to nn/; conv.c calls it for the geometries zd__nn_winograd_applies
    accepts).

    Each 2x2 block of outputs comes from a 4x4 input tile (tiles overlap by
    2): the tile is transformed (B^T d B), multiplied elementwise by the
    transformed filter (G g G^T), summed over input channels, and transformed
    back (A^T m A). The elementwise products summed over channels are 16
    GEMMs, one per position of the 4x4 transformed tile: 16 multiplications
    per 4 outputs instead of 36, 2.25x fewer (Lavin & Gray, "Fast Algorithms
    for Convolutional Neural Networks", 2015). The transforms add a few
    additions and some float32 rounding: results differ from a direct
    convolution by about 1e-6 of the magnitudes summed.

    The input gradient of a stride-1 convolution is itself a 3x3
    convolution (of dy, padded by 2 - padding, with the filters turned by 180
    degrees and their C and O swapped), so it runs on the same code.

    Both entry points split the batch over the pool's threads, one sample
    per chunk (zd__nn_parallel_run, parallel.c): a sample's result does not
    depend on the batch, the thread count or the thread. Their scratch is
    the pool's, reused from call to call (about 1 MB per thread for the
    Net's conv2). */
#ifndef ZDIST_NN_WINOGRAD_H
#define ZDIST_NN_WINOGRAD_H

#include <stdbool.h>

/*  True when the convolution (C input and O output channels, H x W input
    planes) is one these functions compute (kernel 3x3, stride 1, dilation
    1, padding 0 or 1) and where they beat zd_nn_conv2d's own paths (measured
    with bench_winograd --shape on this 2-core AVX-512 machine):
    - the forward pass (input_grad false) with C >= 16, O >= 32 and an
      output of at least 8x8: with fewer channels the 16 GEMMs are too thin,
      on smaller planes too many of the 16 lanes of the transforms idle
      (the Net's conv1, C = 1, stays where it is; its conv2 qualifies);
    - the input gradient (input_grad true) with C >= 4 and O >= 4: it won
      on every such shape tried, 1.1x (8 -> 8 channels) to 2.3x. */
bool zd__nn_winograd_applies(int C, int O, int H, int W, int kh, int kw, int stride, int padding,
                             int dilation, bool input_grad);

/*  Called once per sample n as soon as that sample's raw convolution output
    y_n (O planes of Ho x Wo, contiguous) is complete, on the thread that
    computed it: the place for conv.c's relu or pooling epilogue, while the
    sample is in cache. Calls for different samples may run concurrently. */
typedef void(nn_winograd_epilogue_fn)(void *arg, int n, float *y_n);

/*  Returns sample n's output gradient (O planes of Ho x Wo, contiguous):
    a pointer into memory the caller has, or buf (room for O*Ho*Wo floats,
    scratch of the calling thread) after filling it, e.g. with the
    gradient rebuilt through a relu or a pool (conv.c's conv_out_grad).
    Called once per sample; calls for different samples may run
    concurrently. */
typedef const float *(nn_winograd_prologue_fn)(void *arg, int n, float *buf);

/*  y[n,o] = bias[o] + sum_c w[o,c] (*) x[n,c] (cross-correlation, zero
    padding `padding` on each side, stride 1), for x [N,C,H,W], w [O,C,3,3],
    bias [O] or NULL, into y [N,O,Ho,Wo], Ho = H + 2*padding - 2,
    Wo = W + 2*padding - 2 (every element written; odd sizes allowed).
    padding may be 0, 1 or 2. epilogue (may be NULL) runs on each sample's
    output, arg passed through; y may be NULL if an epilogue is given: each
    sample's output then lives in scratch only for the epilogue's call.
    Runs the batch on the pool's threads; called from inside a pool chunk,
    it runs serially. Returns 0, or -1 (zd_error_set) for sizes out of range
    or out of memory (then y's contents are undefined). */
int zd__nn_winograd_forward(const float *x, int N, int C, int H, int W, const float *w, int O,
                            const float *bias, int padding, float *y,
                            nn_winograd_epilogue_fn *epilogue, void *arg);

/*  The input gradient of that convolution (without bias):
    dx[n,c] = sum_o dy[n,o] (*) w[o,c] transposed, for dy [N,O,Ho,Wo] and
    w [O,C,3,3], written over dx [N,C,H,W] with H = Ho + 2 - 2*padding,
    W = Wo + 2 - 2*padding (padding 0, 1 or 2, the forward pass's). dy may
    be NULL if a prologue is given (then it supplies each sample's dy, arg
    passed through). Threads and errors as for the forward pass. */
int zd__nn_winograd_backward_input(const float *dy, int N, int O, int Ho, int Wo, const float *w,
                                   int C, int padding, float *dx, nn_winograd_prologue_fn *prologue,
                                   void *arg);

#endif
