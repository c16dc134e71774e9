/* SPDX-License-Identifier: MIT */
/*  add.cpp: the public headers compiled as C++ (C linkage through
    ZD_BEGIN_DECLS) and a C++ program linked to libzdist: tensors, a local
    autograd backward, values, errors. Built and run by tests/consumer/run.sh.
    Exits 0 when everything worked. */
#include <cstdio>
#include <cstring>
#include <string>

#include <zdist/zdist.h>

static int failures = 0;

// A differentiable op written in C++: y = 3x, its table made with the
// function form (C++11 has no designated initializers for the macro).
static int triple_backward(zd_autograd_node_t *n, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    if (!zd_autograd_node_needs_grad(n, 0))
        return 0;
    return zd_tensor_scale(gout[0], 3.0f, &gin[0]);
}
static const zd_autograd_node_ops_t triple_ops =
    zd_autograd_node_ops("TripleBackward", triple_backward, nullptr);

static void check(bool ok, const char *what)
{
    if (!ok) {
        std::fprintf(stderr, "add_cpp: %s failed: %s\n", what, zd_error_last());
        failures++;
    }
}

int main()
{
    std::string want = std::to_string(ZD_VERSION_MAJOR) + "." + std::to_string(ZD_VERSION_MINOR) +
        "." + std::to_string(ZD_VERSION_PATCH);
    check(want == zd_version(), "zd_version() matches the headers");

    // y = sum(x * x), so dy/dx = 2x.
    const int64_t shape[1] = {3};
    const float xs[3] = {1.0f, 2.0f, -3.0f};
    zd_tensor_t *x = zd_tensor_from_data(ZD_FLOAT32, shape, 1, xs);
    check(x != nullptr, "zd_tensor_from_data");
    if (x == nullptr)
        return 1;
    check(zd_tensor_set_requires_grad(x, true) == 0, "zd_tensor_set_requires_grad");
    zd_tensor_t *sq = nullptr, *y = nullptr;
    check(zd_tensor_mul(x, x, &sq) == 0, "zd_tensor_mul");
    check(sq && zd_tensor_sum(sq, &y) == 0, "zd_tensor_sum");
    check(y && zd_tensor_data(y)[0] == 14.0f, "sum of squares is 14");
    check(y && zd_autograd_backward(y, nullptr, false) == 0, "zd_autograd_backward");
    zd_tensor_t *g = zd_tensor_grad(x);
    check(g != nullptr, "x has a gradient");
    for (int i = 0; g && i < 3; i++)
        check(zd_tensor_data(g)[i] == 2.0f * xs[i], "gradient is 2x");
    zd_tensor_unref(g);
    zd_tensor_unref(y);
    zd_tensor_unref(sq);

    // The C++ op: d sum(3x)/dx = 3, accumulated on top of 2x.
    zd_tensor_t *t = nullptr, *s3 = nullptr;
    check(zd_tensor_scale(x, 3.0f, &t) == 0, "zd_tensor_scale");
    zd_tensor_t *t3 = t ? zd_tensor_detach(t) : nullptr;
    bool recorded = t3 && zd_autograd_record(&triple_ops, &x, 1, t3, nullptr, 0, nullptr) == 0;
    check(recorded, "zd_autograd_record with an op table from zd_autograd_node_ops");
    if (!recorded)
        t3 = nullptr;   // a failing record drops it
    check(t3 && zd_tensor_sum(t3, &s3) == 0 && zd_autograd_backward(s3, nullptr, false) == 0,
          "backward through the C++ op");
    g = zd_tensor_grad(x);
    for (int i = 0; g && i < 3; i++)
        check(zd_tensor_data(g)[i] == 2.0f * xs[i] + 3.0f, "gradient is 2x + 3");
    zd_tensor_unref(g);
    zd_tensor_unref(s3);
    zd_tensor_unref(t3);
    zd_tensor_unref(t);
    zd_tensor_unref(x);

    // Values as an RPC carries them, and an error from a wrong kind.
    zd_value_t *v = zd_value_string("hello");
    const char *s = nullptr;
    check(v && zd_value_get_string(v, &s) == 0 && std::strcmp(s, "hello") == 0, "string value");
    int64_t n = 0;
    check(v && zd_value_get_int(v, &n) == -1 && zd_error_last()[0] != '\0',
          "a string is not an int, and the error says so");
    zd_value_unref(v);

    if (failures == 0)
        std::printf("add_cpp: ok (zdist %s, d(sum x^2)/dx = 2x)\n", zd_version());
    return failures == 0 ? 0 : 1;
}
