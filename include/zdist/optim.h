/* SPDX-License-Identifier: MIT */
/*  optim.h: local optimizers with PyTorch 1.13's update rules and defaults.

    SGD (momentum, dampening, Nesterov, weight decay), Adam and AdamW (with
    AMSGrad), Adagrad and RMSprop (centered, momentum), all with maximize.
    An optimizer is created over an array of float32 leaf parameters and
    keeps per-parameter state (momentum buffers, moment estimates, step
    counts), created at a parameter's first step as PyTorch does. A step
    updates the parameters in place, element by element, without recording
    anything for autograd.

    The hyper-parameters are one plain value, zd_optim_config_t (kind plus
    numbers, no pointers), which can be copied, compared, and sent to
    another process as text (zd_optim_config_format / zd_optim_config_parse): a
    DistributedOptimizer creates one local optimizer per owner from it.

    Thread safety: every function taking a zd_optim_t locks the optimizer, so
    two threads may step the same optimizer (their steps run one after the
    other). The parameters' contents are not locked: a forward pass reading
    them during a step sees a mix of old and new values, as in PyTorch. */
#ifndef ZDIST_OPTIM_H
#define ZDIST_OPTIM_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include <zdist/named_tensors.h>
#include <zdist/tensor.h>
#include <zdist/export.h>

ZD_BEGIN_DECLS

typedef enum {
    ZD_OPTIM_SGD = 1,
    ZD_OPTIM_ADAM,
    ZD_OPTIM_ADAMW,
    ZD_OPTIM_ADAGRAD,
    ZD_OPTIM_RMSPROP,
} zd_optim_kind_t;

/*  Hyper-parameters. Each kind reads only its own fields (listed with
    PyTorch's defaults); the others are ignored.

      SGD:     lr (required), momentum 0, dampening 0, weight_decay 0,
               nesterov false, maximize false
      Adam:    lr 1e-3, beta1 0.9, beta2 0.999, eps 1e-8, weight_decay 0
               (L2: added to the gradient), amsgrad false, maximize false
      AdamW:   as Adam but weight_decay 1e-2, decoupled: p *= 1 - lr*wd
      Adagrad: lr 1e-2, lr_decay 0, weight_decay 0,
               initial_accumulator_value 0, eps 1e-10, maximize false
      RMSprop: lr 1e-2, alpha 0.99, eps 1e-8, weight_decay 0, momentum 0,
               centered false, maximize false

    Start from a zd_optim_*_defaults() function: it sets size, and the
    library reads only the fields within size. */
typedef struct {
    size_t size; /* sizeof(zd_optim_config_t), set by the *_defaults() functions */
    zd_optim_kind_t kind;
    double lr;
    double momentum;
    double dampening;
    double weight_decay;
    double beta1, beta2;
    double eps;
    double lr_decay;
    double initial_accumulator_value;
    double alpha;
    bool nesterov;
    bool amsgrad;
    bool centered;
    bool maximize;
} zd_optim_config_t;

typedef struct zd_optim zd_optim_t;

/*  Defaults of any kind, with size set (inline: this program's size); for
    SGD lr is NaN ("required"), which zd_optim_config_check refuses until
    set. Returns the struct. */
static inline zd_optim_config_t zd_optim_defaults(zd_optim_kind_t kind)
{
    zd_optim_config_t c;
    memset(&c, 0, sizeof c);
    c.size = sizeof c;
    c.kind = kind;
    c.lr = 1e-3;
    c.beta1 = 0.9;
    c.beta2 = 0.999;
    c.eps = 1e-8;
    c.alpha = 0.99;
    if (kind == ZD_OPTIM_SGD)
        c.lr = NAN;
    else if (kind == ZD_OPTIM_ADAMW)
        c.weight_decay = 1e-2;
    else if (kind == ZD_OPTIM_ADAGRAD)
        c.lr = 1e-2, c.eps = 1e-10;
    else if (kind == ZD_OPTIM_RMSPROP)
        c.lr = 1e-2;
    return c;
}

/*  Defaults per kind (zd_optim_defaults). SGD has no default learning rate
    in PyTorch, so it takes one. Return the struct. */
static inline zd_optim_config_t zd_optim_sgd_defaults(double lr)
{
    zd_optim_config_t c = zd_optim_defaults(ZD_OPTIM_SGD);
    c.lr = lr;
    return c;
}
static inline zd_optim_config_t zd_optim_adam_defaults(void)
{
    return zd_optim_defaults(ZD_OPTIM_ADAM);
}
static inline zd_optim_config_t zd_optim_adamw_defaults(void)
{
    return zd_optim_defaults(ZD_OPTIM_ADAMW);
}
static inline zd_optim_config_t zd_optim_adagrad_defaults(void)
{
    return zd_optim_defaults(ZD_OPTIM_ADAGRAD);
}
static inline zd_optim_config_t zd_optim_rmsprop_defaults(void)
{
    return zd_optim_defaults(ZD_OPTIM_RMSPROP);
}

/*  "sgd", "adam", "adamw", "adagrad", "rmsprop"; "?" for anything else. Static. */
ZD_API const char *zd_optim_kind_name(zd_optim_kind_t kind);

/*  The kind named (case-insensitive: "SGD", "Adam", "AdamW", "Adagrad",
    "RMSprop"). Returns 0, or -1 for an unknown name. */
ZD_API int zd_optim_kind_from_name(const char *name, zd_optim_kind_t *kind);

/*  Checks hyper-parameters as PyTorch's constructors do ("Invalid learning
    rate: -0.1", "Nesterov momentum requires a momentum and zero
    dampening", "Invalid beta parameter at index 0: 1", ...). Returns 0, or
    -1 with zd_error_last() set (ZD_ERR_ARGUMENT for a cfg whose size no
    *_defaults() function set; every function taking a cfg checks it so). */
ZD_API int zd_optim_config_check(const zd_optim_config_t *cfg);

/*  Text form: the kind and every field the kind uses, as key=value with
    enough digits to read back the same doubles, e.g.
    "sgd lr=0.03 momentum=0.9 dampening=0 weight_decay=0.0001 nesterov=0
    maximize=0". Returns the length it needed (as snprintf), or -1. */
ZD_API int zd_optim_config_format(const zd_optim_config_t *cfg, char *buf, size_t size);

/*  Parses "<kind> [key=value ...]": the kind's defaults, overridden by the
    pairs given (booleans as 0/1/true/false). Unknown keys, keys of another
    kind, and malformed numbers are errors. Does not check ranges (see
    zd_optim_config_check). Writes *cfg, a struct of size bytes (sizeof
    *cfg), no further than size, and sets its size: zd_optim_config_parse(t,
    &c, sizeof c). Returns 0, or -1 (cfg then left alone). */
ZD_API int zd_optim_config_parse(const char *text, zd_optim_config_t *cfg, size_t size);

/*  New optimizer over n float32 leaf parameters (taking a reference on
    each). Refuses invalid hyper-parameters, an empty list, non-float32,
    non-leaf or repeated parameters. A new object (zd_optim_free), or NULL. */
ZD_API zd_optim_t *zd_optim_new(const zd_optim_config_t *cfg, zd_tensor_t *const *params, int n);

/*  Frees the optimizer and drops its parameter references (NULL-safe). */
ZD_API void zd_optim_free(zd_optim_t *opt);

/*  One step with explicit gradients: grads[i] is the gradient of params[i]
    (same shape, float32), or NULL to leave that parameter (and its state)
    untouched, as PyTorch skips parameters without .grad. All gradients are
    checked before anything changes: on -1 no parameter moved. */
ZD_API int zd_optim_step(zd_optim_t *opt, zd_tensor_t *const *grads);

/*  zd_optim_step with each parameter's own .grad (zd_tensor_grad()): 0, or
    -1 as zd_optim_step (no parameter moved). */
ZD_API int zd_optim_step_grad(zd_optim_t *opt);

/*  Resets the parameters' .grad: drops it when set_to_none (PyTorch 2's
    default), else fills it with zeros (PyTorch 1.13's default; such a
    parameter is still stepped, with a zero gradient). */
ZD_API void zd_optim_zero_grad(zd_optim_t *opt, bool set_to_none);

/*  The optimizer's config (with its current lr) into *out, a struct of size
    bytes, written no further than size: zd_optim_config(opt, &c, sizeof c).
    0, or -1 (ZD_ERR_ARGUMENT: a size below the 1.0 struct's). */
ZD_API int zd_optim_config(zd_optim_t *opt, zd_optim_config_t *out, size_t size);

/*  Accessors; zd_optim_param returns a borrowed tensor. */
ZD_API int zd_optim_n_params(const zd_optim_t *opt);
ZD_API zd_tensor_t *zd_optim_param(const zd_optim_t *opt, int i);

/*  Changes the learning rate for later steps (for schedules). Returns 0, or
    -1 for a negative or NaN lr. */
ZD_API int zd_optim_set_lr(zd_optim_t *opt, double lr);

/*  ---- state (to checkpoint an optimizer and resume) ----
    The state is a list of named tensors, as PyTorch's state_dict()["state"]:
    "<i>.<slot>" for parameter i, slots momentum_buffer (SGD, RMSprop),
    exp_avg, exp_avg_sq, max_exp_avg_sq (Adam, AdamW), sum (Adagrad),
    square_avg, grad_avg (RMSprop), and "<i>.step" (int64, shape (1)) for
    the kinds that count steps. Parameters not stepped yet have no entry. */

/*  Copies the state out: a new object (zd_named_tensors_free) holding a
    copy of each entry, or NULL. */
ZD_API zd_named_tensors_t *zd_optim_state_export(zd_optim_t *opt);

/*  Replaces the whole state with the list's entries (copied), which must
    be exactly what zd_optim_state_export of an optimizer of the same kind,
    flags and parameter shapes produces. All or nothing. Returns 0, or -1
    with zd_error_last() naming the entry. */
ZD_API int zd_optim_state_import(zd_optim_t *opt, const zd_named_tensors_t *state);

ZD_END_DECLS

#endif
