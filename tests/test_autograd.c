/* SPDX-License-Identifier: MIT */
/*  Local autograd engine: recording, dependency order, accumulation, modes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <pthread.h>
#include <math.h>
#include <string.h>

#include <zdist/autograd.h>
#include <zdist/error.h>

static zd_tensor_t *leaf(int64_t n, const float *v)
{
    zd_tensor_t *t = zd_tensor_from_data(ZD_FLOAT32, &n, 1, v);
    assert_non_null(t);
    assert_int_equal(zd_tensor_set_requires_grad(t, true), 0);
    return t;
}

static void test_shared_node_runs_once_with_summed_gradient(void **state)
{
    (void)state;
    int64_t before = zd_tensor_live_count();
    zd_tensor_t *x = leaf(3, (float[]){1, 2, 3});
    zd_tensor_t *y, *z, *w, *s;
    /* y = x*x; z = y + y; w = z * x; s = sum(w) = sum(2 x^3): ds/dx = 6 x^2 */
    assert_int_equal(zd_tensor_mul(x, x, &y), 0);
    assert_int_equal(zd_tensor_add(y, y, &z), 0);
    assert_int_equal(zd_tensor_mul(z, x, &w), 0);
    assert_int_equal(zd_tensor_sum(w, &s), 0);
    assert_float_equal(zd_tensor_data(s)[0], 2 * (1 + 8 + 27), 1e-5);
    assert_int_equal(zd_autograd_backward(s, NULL, false), 0);
    zd_tensor_t *g = zd_tensor_grad(x);
    assert_non_null(g);
    assert_float_equal(zd_tensor_data(g)[0], 6, 1e-5);
    assert_float_equal(zd_tensor_data(g)[1], 24, 1e-5);
    assert_float_equal(zd_tensor_data(g)[2], 54, 1e-5);
    /* The graph was freed: a second backward is refused with a reason. */
    assert_int_equal(zd_autograd_backward(s, NULL, false), -1);
    assert_non_null(strstr(zd_error_last(), "second time"));
    zd_tensor_unref(g);
    zd_tensor_unref(s);
    zd_tensor_unref(w);
    zd_tensor_unref(z);
    zd_tensor_unref(y);
    zd_tensor_unref(x);
    assert_int_equal(zd_tensor_live_count(), before);
}

static void test_retain_graph_accumulates(void **state)
{
    (void)state;
    zd_tensor_t *x = leaf(2, (float[]){3, -1});
    zd_tensor_t *y, *s;
    assert_int_equal(zd_tensor_mul(x, x, &y), 0);
    assert_int_equal(zd_tensor_mean(y, &s), 0);
    assert_int_equal(zd_autograd_backward(s, NULL, true), 0);
    assert_int_equal(zd_autograd_backward(s, NULL, false), 0);
    zd_tensor_t *g = zd_tensor_grad(x);
    assert_float_equal(zd_tensor_data(g)[0], 2 * 3.0f, 1e-5); /* 2 * (2x/2) */
    assert_float_equal(zd_tensor_data(g)[1], -2.0f, 1e-5);
    zd_tensor_unref(g);
    zd_tensor_unref(s);
    zd_tensor_unref(y);
    zd_tensor_unref(x);
}

static void test_no_grad_records_nothing(void **state)
{
    (void)state;
    zd_tensor_t *x = leaf(2, (float[]){1, 2});
    bool prev = zd_autograd_set_grad_enabled(false);
    zd_tensor_t *y;
    assert_int_equal(zd_tensor_scale(x, 2.0f, &y), 0);
    zd_autograd_set_grad_enabled(prev);
    assert_false(zd_tensor_requires_grad(y));
    assert_null(zd_tensor_grad_fn(y));
    assert_int_equal(zd_autograd_backward(y, NULL, false), -1);
    zd_tensor_unref(y);
    zd_tensor_unref(x);
}

static void test_matmul_and_reshape(void **state)
{
    (void)state;
    zd_tensor_t *a =
        zd_tensor_from_data(ZD_FLOAT32, (int64_t[]){2, 3}, 2, (float[]){1, 2, 3, 4, 5, 6});
    zd_tensor_t *b =
        zd_tensor_from_data(ZD_FLOAT32, (int64_t[]){6}, 1, (float[]){1, 0, -1, 2, 1, 0});
    zd_tensor_set_requires_grad(a, true);
    zd_tensor_set_requires_grad(b, true);
    zd_tensor_t *b2, *y, *s;
    assert_int_equal(zd_tensor_reshape(b, (int64_t[]){3, -1}, 2, &b2), 0);
    assert_int_equal(zd_tensor_size(b2, 1), 2);
    assert_int_equal(zd_tensor_matmul(a, b2, &y), 0);
    /* y = [[1*1+2*-1+3*1, 1*0+2*2+3*0],[4-5+6, 0+10+0]] */
    assert_float_equal(zd_tensor_data(y)[0], 2, 1e-6);
    assert_float_equal(zd_tensor_data(y)[3], 10, 1e-6);
    assert_int_equal(zd_tensor_sum(y, &s), 0);
    assert_int_equal(zd_autograd_backward(s, NULL, false), 0);
    zd_tensor_t *ga = zd_tensor_grad(a), *gb = zd_tensor_grad(b);
    /* dA = 1 B^T: each row = row sums of B2 = [1, 1, 1] */
    assert_float_equal(zd_tensor_data(ga)[0], 1, 1e-6);
    assert_float_equal(zd_tensor_data(ga)[1], 1, 1e-6);
    /* dB2 = A^T 1: [5,5],[7,7],[9,9] */
    assert_int_equal(zd_tensor_ndim(gb), 1);
    assert_float_equal(zd_tensor_data(gb)[0], 5, 1e-6);
    assert_float_equal(zd_tensor_data(gb)[5], 9, 1e-6);
    zd_tensor_unref(ga);
    zd_tensor_unref(gb);
    zd_tensor_unref(s);
    zd_tensor_unref(y);
    zd_tensor_unref(b2);
    zd_tensor_unref(a);
    zd_tensor_unref(b);
}

/*  A parameter server builds separate graphs over shared parameters on many
    threads: the shared leaf must collect every contribution. */
#define THREADS 4
#define ROUNDS  200
static zd_tensor_t *shared_w;

static void *worker(void *arg)
{
    (void)arg;
    for (int r = 0; r < ROUNDS; r++) {
        zd_tensor_t *y, *s;
        if (zd_tensor_scale(shared_w, 1.0f, &y) < 0 || zd_tensor_sum(y, &s) < 0)
            return (void *)1;
        if (zd_autograd_backward(s, NULL, false) < 0)
            return (void *)1;
        zd_tensor_unref(s);
        zd_tensor_unref(y);
    }
    return NULL;
}

static void test_threads_share_parameters(void **state)
{
    (void)state;
    shared_w = leaf(4, (float[]){1, 2, 3, 4});
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++)
        pthread_create(&th[i], NULL, worker, NULL);
    for (int i = 0; i < THREADS; i++) {
        void *rv;
        pthread_join(th[i], &rv);
        assert_null(rv);
    }
    zd_tensor_t *g = zd_tensor_grad(shared_w);
    for (int i = 0; i < 4; i++)
        assert_float_equal(zd_tensor_data(g)[i], THREADS * ROUNDS, 1e-3);
    zd_tensor_unref(g);
    zd_tensor_unref(shared_w);
}

static void test_bad_shapes_are_errors(void **state)
{
    (void)state;
    zd_tensor_t *a = zd_tensor_zeros1(3), *b = zd_tensor_zeros1(4), *y = NULL;
    assert_int_equal(zd_tensor_add(a, b, &y), -1);
    assert_null(y);
    assert_non_null(strstr(zd_error_last(), "(3) and (4)"));
    assert_int_equal(zd_tensor_reshape(a, (int64_t[]){5}, 1, &y), -1);
    assert_null(zd_tensor_new(ZD_FLOAT32, (int64_t[]){-2}, 1));
    zd_tensor_unref(a);
    zd_tensor_unref(b);
}

/*  A stand-in for distributed autograd's send function: a start node whose
    gradients come from outside. */
static int identity_backward(zd_autograd_node_t *n, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    (void)n;
    gin[0] = zd_tensor_ref(gout[0]);
    return 0;
}

static const zd_autograd_node_ops_t send_ops =
    ZD_AUTOGRAD_NODE_OPS("SendBackward", identity_backward, NULL);

static zd_autograd_node_t *send_over(zd_tensor_t *t)
{
    zd_autograd_node_t *n;
    assert_int_equal(zd_autograd_node_new(&send_ops, &t, 1, 1, &n), 0);
    assert_non_null(n);
    return n;
}

static void test_task_waits_for_every_start_then_flush(void **state)
{
    (void)state;
    zd_tensor_t *x = leaf(2, (float[]){1, 3});
    zd_tensor_t *a, *b;
    assert_int_equal(zd_tensor_scale(x, 2.0f, &a), 0); /* a = 2x */
    assert_int_equal(zd_tensor_mul(a, a, &b), 0);      /* b = a^2 */
    zd_autograd_node_t *s1 = send_over(a), *s2 = send_over(b);
    zd_autograd_node_t *starts[2] = {s1, s2};
    zd_tensor_t *g1 = zd_tensor_from_data(ZD_FLOAT32, (int64_t[]){2}, 1, (float[]){1, 1});
    zd_tensor_t *g2 = zd_tensor_from_data(ZD_FLOAT32, (int64_t[]){2}, 1, (float[]){1, 2});

    zd_autograd_options_t keep = zd_autograd_options_default();
    keep.retain_graph = true;
    zd_autograd_task_t *t = zd_autograd_task_new(starts, 2, &keep);
    assert_non_null(t);
    assert_int_equal(zd_autograd_task_feed(t, s1, &g1), 0);
    zd_tensor_t *g = zd_tensor_grad(x);
    assert_null(g); /* the scale node still waits for b's branch */
    assert_int_equal(zd_autograd_task_feed(t, s2, &g2), 0);
    g = zd_tensor_grad(x);
    /* dx = 2 * (g1 + g2 * 2a) = 2 * (1 + 1*4, 1 + 2*12) */
    assert_float_equal(zd_tensor_data(g)[0], 10, 1e-5);
    assert_float_equal(zd_tensor_data(g)[1], 50, 1e-5);
    assert_int_equal(zd_autograd_task_feed(t, s1, &g1), -1); /* each start runs once */
    zd_tensor_unref(g);
    zd_autograd_task_free(t);
    zd_tensor_clear_grad(x);

    /* Only s1 ever receives a gradient: flushing runs the rest with zeros. */
    t = zd_autograd_task_new(starts, 2, NULL);
    assert_int_equal(zd_autograd_task_feed(t, s1, &g1), 0);
    int ran = 0;
    assert_int_equal(zd_autograd_task_flush(t, &ran), 0);
    assert_int_equal(ran, 1);
    g = zd_tensor_grad(x);
    assert_float_equal(zd_tensor_data(g)[0], 2, 1e-5);
    assert_float_equal(zd_tensor_data(g)[1], 2, 1e-5);
    zd_tensor_unref(g);
    zd_autograd_task_free(t);

    zd_autograd_node_unref(s1);
    zd_autograd_node_unref(s2);
    zd_tensor_unref(g1);
    zd_tensor_unref(g2);
    zd_tensor_unref(b);
    zd_tensor_unref(a);
    zd_tensor_unref(x);
}

static void test_copy_and_cat(void **state)
{
    (void)state;
    zd_tensor_t *a = zd_tensor_from_data(ZD_FLOAT32, (int64_t[]){2, 1}, 2, (float[]){1, 2});
    zd_tensor_t *b = zd_tensor_from_data(ZD_FLOAT32, (int64_t[]){2, 2}, 2, (float[]){3, 4, 5, 6});
    zd_tensor_set_requires_grad(a, true);
    zd_tensor_set_requires_grad(b, true);
    zd_tensor_t *ac, *cat, *w, *prod, *s;
    assert_int_equal(zd_tensor_clone(a, &ac), 0);
    zd_tensor_data(a)[0] = 100; /* the copy does not see later changes */
    zd_tensor_t *parts[2] = {ac, b};
    assert_int_equal(zd_tensor_cat(parts, 2, 1, &cat), 0);
    assert_int_equal(zd_tensor_size(cat, 1), 3);
    float expect[6] = {1, 3, 4, 2, 5, 6};
    for (int i = 0; i < 6; i++)
        assert_float_equal(zd_tensor_data(cat)[i], expect[i], 0);
    w = zd_tensor_from_data(ZD_FLOAT32, (int64_t[]){2, 3}, 2, (float[]){1, 2, 3, 4, 5, 6});
    assert_int_equal(zd_tensor_mul(cat, w, &prod), 0);
    assert_int_equal(zd_tensor_sum(prod, &s), 0);
    assert_int_equal(zd_autograd_backward(s, NULL, false), 0);
    zd_tensor_t *ga = zd_tensor_grad(a), *gb = zd_tensor_grad(b);
    assert_float_equal(zd_tensor_data(ga)[0], 1, 0);
    assert_float_equal(zd_tensor_data(ga)[1], 4, 0);
    assert_float_equal(zd_tensor_data(gb)[0], 2, 0);
    assert_float_equal(zd_tensor_data(gb)[3], 6, 0);
    zd_tensor_t *bad = zd_tensor_zeros1(3);
    zd_tensor_t *mixed[2] = {a, bad}, *y = NULL;
    assert_int_equal(zd_tensor_cat(mixed, 2, 1, &y), -1);
    zd_tensor_t *all[] = {a, b, ac, cat, w, prod, s, ga, gb, bad};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        zd_tensor_unref(all[i]);
}

/*  x (2, 3, 4) = 0..23; y = x[:, 1:3, :] is a copy; sum(y * w) gives x
    the gradient w in those positions and zeros elsewhere. */
static void test_narrow_copies_inner_dims_with_gradient(void **state)
{
    (void)state;
    int64_t before = zd_tensor_live_count();
    float xv[24], wv[16];
    for (int i = 0; i < 24; i++)
        xv[i] = (float)i;
    for (int i = 0; i < 16; i++)
        wv[i] = 0.5f * (float)(i + 1);
    zd_tensor_t *x = zd_tensor_from_data(ZD_FLOAT32, (int64_t[]){2, 3, 4}, 3, xv);
    zd_tensor_t *w = zd_tensor_from_data(ZD_FLOAT32, (int64_t[]){2, 2, 4}, 3, wv);
    zd_tensor_set_requires_grad(x, true);
    zd_tensor_t *y, *p, *s;
    assert_int_equal(zd_tensor_narrow(x, 1, 1, 2, &y), 0);
    char shape[64];
    assert_string_equal(zd_tensor_shape_str(y, shape, sizeof shape), "(2, 2, 4)");
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++)
            for (int c = 0; c < 4; c++)
                assert_float_equal(zd_tensor_data(y)[(a * 2 + b) * 4 + c],
                                   xv[(a * 3 + b + 1) * 4 + c], 0);
    assert_string_equal(zd_autograd_node_name(zd_tensor_grad_fn(y)), "NarrowBackward");
    assert_int_equal(zd_tensor_mul(y, w, &p), 0);
    assert_int_equal(zd_tensor_sum(p, &s), 0);
    assert_int_equal(zd_autograd_backward(s, NULL, false), 0);
    zd_tensor_t *g = zd_tensor_grad(x);
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 4; c++)
                assert_float_equal(zd_tensor_data(g)[(a * 3 + b) * 4 + c],
                                   b == 0 ? 0 : wv[(a * 2 + b - 1) * 4 + c], 0);
    zd_tensor_t *all[] = {x, w, y, p, s, g};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        zd_tensor_unref(all[i]);
    assert_int_equal(zd_tensor_live_count(), before);
}

/*  Along dim 0 the rows are one block: a view of x's memory, which keeps
    that memory alive after x is gone. */
static void test_narrow_rows_is_a_view(void **state)
{
    (void)state;
    int64_t before = zd_tensor_live_count();
    zd_tensor_t *x = zd_tensor_from_data(ZD_FLOAT32, (int64_t[]){4, 3}, 2,
                                         (float[]){0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
    zd_tensor_set_requires_grad(x, true);
    zd_tensor_t *y, *z, *v, *s;
    assert_int_equal(zd_tensor_narrow(x, 0, 1, 2, &y), 0);
    assert_int_equal(zd_tensor_size(y, 0), 2);
    assert_ptr_equal(zd_tensor_data(y), zd_tensor_data(x) + 3);
    /* Negative dim and start count from the end: rows 2..3 of x, a view of
       a view. */
    assert_int_equal(zd_tensor_narrow(y, -2, -1, 1, &z), 0);
    assert_ptr_equal(zd_tensor_data(z), zd_tensor_data(x) + 6);
    zd_tensor_data(x)[7] = 70; /* in place, as PyTorch's views see it */
    assert_float_equal(zd_tensor_data(z)[1], 70, 0);
    /* Gradients go through both narrows into row 2 of x. */
    zd_tensor_t *w = zd_tensor_from_data(ZD_FLOAT32, (int64_t[]){1, 3}, 2, (float[]){1, 2, 3});
    assert_int_equal(zd_tensor_mul(z, w, &v), 0);
    assert_int_equal(zd_tensor_sum(v, &s), 0);
    assert_int_equal(zd_autograd_backward(s, NULL, false), 0);
    zd_tensor_t *g = zd_tensor_grad(x);
    float want[12] = {0, 0, 0, 0, 0, 0, 1, 2, 3, 0, 0, 0};
    assert_memory_equal(zd_tensor_data(g), want, sizeof want);
    zd_tensor_unref(g);
    zd_tensor_unref(x);
    assert_float_equal(zd_tensor_data(z)[0], 6, 0); /* x's memory lives on */
    /* Other dtypes narrow too; an empty range is a tensor of size 0. */
    zd_tensor_t *labels =
        zd_tensor_from_data(ZD_INT64, (int64_t[]){5}, 1, (int64_t[]){10, 11, 12, 13, 14});
    zd_tensor_t *l, *empty;
    assert_int_equal(zd_tensor_narrow(labels, 0, 3, 2, &l), 0);
    assert_int_equal(zd_tensor_data_i64(l)[0], 13);
    assert_int_equal(zd_tensor_data_i64(l)[1], 14);
    assert_int_equal(zd_tensor_narrow(labels, 0, 5, 0, &empty), 0);
    assert_int_equal(zd_tensor_numel(empty), 0);
    /* Without grad mode nothing is recorded. */
    zd_tensor_t *nograd;
    bool prev = zd_autograd_set_grad_enabled(false);
    assert_int_equal(zd_tensor_narrow(y, 0, 0, 1, &nograd), 0);
    zd_autograd_set_grad_enabled(prev);
    assert_null(zd_tensor_grad_fn(nograd));
    zd_tensor_t *all[] = {y, z, w, v, s, labels, l, empty, nograd};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        zd_tensor_unref(all[i]);
    assert_int_equal(zd_tensor_live_count(), before);
}

static void test_narrow_bad_arguments(void **state)
{
    (void)state;
    zd_tensor_t *x = zd_tensor_zeros2(4, 3), *scalar = zd_tensor_new(ZD_FLOAT32, NULL, 0), *y = x;
    assert_int_equal(zd_tensor_narrow(scalar, 0, 0, 1, &y), -1);
    assert_null(y);
    assert_non_null(strstr(zd_error_last(), "scalar"));
    assert_int_equal(zd_tensor_narrow(x, 2, 0, 1, &y), -1);
    assert_string_equal(zd_error_last(), "narrow: dimension 2 out of range for a 2-D tensor");
    assert_int_equal(zd_tensor_narrow(x, -3, 0, 1, &y), -1);
    assert_non_null(strstr(zd_error_last(), "out of range"));
    assert_int_equal(zd_tensor_narrow(x, 0, 3, 2, &y), -1);
    assert_string_equal(zd_error_last(),
                        "narrow: start 3 and length 2 do not fit dimension 0 of shape (4, 3)");
    assert_int_equal(zd_tensor_narrow(x, 1, 0, -1, &y), -1);
    assert_non_null(strstr(zd_error_last(), "length -1"));
    assert_int_equal(zd_tensor_narrow(x, 1, 4, 0, &y), -1);
    assert_int_equal(zd_tensor_narrow(x, 1, -4, 1, &y), -1);
    assert_non_null(strstr(zd_error_last(), "start -4"));
    assert_int_equal(zd_tensor_narrow(NULL, 0, 0, 1, &y), -1);
    assert_null(y);
    zd_tensor_unref(x);
    zd_tensor_unref(scalar);
}

/*  An op that saves its own output must not keep itself alive. */
static int square_backward(zd_autograd_node_t *n, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    zd_tensor_t *y = zd_autograd_node_saved(n, 0);
    gin[0] = zd_tensor_detach_copy(gout[0]);
    zd_tensor_data(gin[0])[0] *= 2 * zd_tensor_data(y)[0];
    return 0;
}

static const zd_autograd_node_ops_t square_ops =
    ZD_AUTOGRAD_NODE_OPS("SquareBackward", square_backward, NULL);

static void test_saving_the_output_frees_without_backward(void **state)
{
    (void)state;
    int64_t before = zd_tensor_live_count();
    zd_tensor_t *x = leaf(1, (float[]){3});
    zd_tensor_t *y = zd_tensor_detach_copy(x);
    zd_autograd_node_t *n;
    assert_int_equal(zd_autograd_node_new(&square_ops, &x, 1, 1, &n), 0);
    zd_autograd_node_save(n, 0, y); /* saved before becoming the output */
    zd_autograd_node_set_output(n, y);
    zd_autograd_node_save(n, 1, y); /* and after */
    zd_autograd_node_unref(n);
    zd_tensor_unref(y);
    zd_tensor_unref(x);
    assert_int_equal(zd_tensor_live_count(), before);
}

/*  A node that passes its output's gradient on as its input's, as a
    forward on a copy of parameters would, and one that makes a new
    gradient and notes where its values are. */
static const float *made_here;

static int pass_backward(zd_autograd_node_t *n, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    (void)n;
    gin[0] = zd_tensor_ref(gout[0]);
    return 0;
}

static int make_backward(zd_autograd_node_t *n, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    (void)n;
    gin[0] = zd_tensor_detach_copy(gout[0]);
    made_here = gin[0] ? zd_tensor_data(gin[0]) : NULL;
    return 0;
}

static const zd_autograd_node_ops_t pass_ops =
    ZD_AUTOGRAD_NODE_OPS("PassBackward", pass_backward, NULL);
static const zd_autograd_node_ops_t make_ops =
    ZD_AUTOGRAD_NODE_OPS("MakeBackward", make_backward, NULL);

/*  x -> pass -> make: the gradient make_backward made reaches the leaf
    through pass_backward held by nobody else, and the leaf keeps it
    instead of copying it (for a Net's fc1, 4.8 MB a backward). */
static void test_passed_gradient_is_kept_not_copied(void **state)
{
    (void)state;
    int64_t before = zd_tensor_live_count();
    zd_tensor_t *x = leaf(3, (float[]){1, 2, 3});
    zd_tensor_t *y = zd_tensor_detach_copy(x), *z = NULL;
    zd_autograd_node_t *n;
    assert_int_equal(zd_autograd_node_new(&pass_ops, &x, 1, 1, &n), 0);
    zd_autograd_node_set_output(n, y);
    zd_autograd_node_unref(n);
    z = zd_tensor_detach_copy(y);
    assert_int_equal(zd_autograd_node_new(&make_ops, &y, 1, 1, &n), 0);
    zd_autograd_node_set_output(n, z);
    zd_autograd_node_unref(n);
    zd_tensor_t *seed = leaf(3, (float[]){4, 5, 6});
    assert_int_equal(zd_autograd_backward(z, seed, false), 0);
    zd_tensor_t *g = zd_tensor_grad(x);
    assert_non_null(g);
    assert_non_null(made_here);
    assert_ptr_equal(zd_tensor_data(g), made_here);
    assert_true(zd_tensor_data(g)[0] == 4 && zd_tensor_data(g)[2] == 6);
    zd_tensor_unref(g);
    zd_tensor_unref(seed);
    zd_tensor_unref(z);
    zd_tensor_unref(y);
    zd_tensor_unref(x);
    assert_int_equal(zd_tensor_live_count(), before);
}

/*  An op's table carries its size (docs/conventions.md): one that
    ZD_AUTOGRAD_NODE_OPS did not build is refused, naming the struct, even
    with grad mode off; one built against a newer header (a larger size)
    works. */
static void test_node_ops_size(void **state)
{
    (void)state;
    zd_tensor_t *x = leaf(1, (float[]){3});
    zd_autograd_node_t *n = NULL;
    static const zd_autograd_node_ops_t unsized = {.name = "SquareBackward",
                                                   .backward = square_backward};
    assert_int_equal(zd_autograd_node_new(&unsized, &x, 1, 1, &n), -1);
    assert_null(n);
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    assert_non_null(strstr(zd_error_last(), "zd_autograd_node_ops_t.size is 0"));
    assert_non_null(strstr(zd_error_last(), "ZD_AUTOGRAD_NODE_OPS"));
    zd_tensor_t *y = zd_tensor_detach_copy(x);
    assert_int_equal(zd_autograd_record(&unsized, &x, 1, y, NULL, 0, NULL), -1);
    assert_non_null(strstr(zd_error_last(), "zd_autograd_node_ops_t"));
    bool was = zd_autograd_set_grad_enabled(false);
    assert_int_equal(zd_autograd_node_new(&unsized, &x, 1, 1, &n), -1);
    zd_autograd_set_grad_enabled(was);

    assert_int_equal(square_ops.size, sizeof(zd_autograd_node_ops_t));
    struct {
        zd_autograd_node_ops_t ops;
        void *newer;
    } big = {.ops = ZD_AUTOGRAD_NODE_OPS("SquareBackward", square_backward, NULL)};
    big.ops.size = sizeof big;
    assert_int_equal(zd_autograd_node_new(&big.ops, &x, 1, 1, &n), 0);
    assert_non_null(n);
    zd_autograd_node_unref(n);
    zd_tensor_unref(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shared_node_runs_once_with_summed_gradient),
        cmocka_unit_test(test_node_ops_size),
        cmocka_unit_test(test_retain_graph_accumulates),
        cmocka_unit_test(test_no_grad_records_nothing),
        cmocka_unit_test(test_matmul_and_reshape),
        cmocka_unit_test(test_threads_share_parameters),
        cmocka_unit_test(test_bad_shapes_are_errors),
        cmocka_unit_test(test_task_waits_for_every_start_then_flush),
        cmocka_unit_test(test_copy_and_cat),
        cmocka_unit_test(test_narrow_copies_inner_dims_with_gradient),
        cmocka_unit_test(test_narrow_rows_is_a_view),
        cmocka_unit_test(test_narrow_bad_arguments),
        cmocka_unit_test(test_saving_the_output_frees_without_backward),
        cmocka_unit_test(test_passed_gradient_is_kept_not_copied),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
