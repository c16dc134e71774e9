/* SPDX-License-Identifier: MIT */
/*  config.c: hyper-parameters: defaults, checks, text form. */
#include <ctype.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <zdist/error.h>
#include "core/sized.h"
#include "optim/optim_private.h"

#define K_SGD     (1u << ZD_OPTIM_SGD)
#define K_ADAM    (1u << ZD_OPTIM_ADAM | 1u << ZD_OPTIM_ADAMW)
#define K_ADAGRAD (1u << ZD_OPTIM_ADAGRAD)
#define K_RMSPROP (1u << ZD_OPTIM_RMSPROP)
#define K_ALL     (K_SGD | K_ADAM | K_ADAGRAD | K_RMSPROP)

/*  Every field with the kinds that read it, in the order the text form
    lists them. */
static const struct {
    const char *key;
    size_t offset;
    bool is_bool;
    unsigned kinds;
} fields[] = {
    {"lr", offsetof(zd_optim_config_t, lr), false, K_ALL},
    {"alpha", offsetof(zd_optim_config_t, alpha), false, K_RMSPROP},
    {"beta1", offsetof(zd_optim_config_t, beta1), false, K_ADAM},
    {"beta2", offsetof(zd_optim_config_t, beta2), false, K_ADAM},
    {"lr_decay", offsetof(zd_optim_config_t, lr_decay), false, K_ADAGRAD},
    {"momentum", offsetof(zd_optim_config_t, momentum), false, K_SGD | K_RMSPROP},
    {"dampening", offsetof(zd_optim_config_t, dampening), false, K_SGD},
    {"eps", offsetof(zd_optim_config_t, eps), false, K_ADAM | K_ADAGRAD | K_RMSPROP},
    {"weight_decay", offsetof(zd_optim_config_t, weight_decay), false, K_ALL},
    {"initial_accumulator_value", offsetof(zd_optim_config_t, initial_accumulator_value), false,
     K_ADAGRAD},
    {"nesterov", offsetof(zd_optim_config_t, nesterov), true, K_SGD},
    {"amsgrad", offsetof(zd_optim_config_t, amsgrad), true, K_ADAM},
    {"centered", offsetof(zd_optim_config_t, centered), true, K_RMSPROP},
    {"maximize", offsetof(zd_optim_config_t, maximize), true, K_ALL},
};
#define N_FIELDS (sizeof fields / sizeof fields[0])

static const char *const kind_names[] = {NULL, "sgd", "adam", "adamw", "adagrad", "rmsprop"};
static const char *const class_names[] = {NULL, "SGD", "Adam", "AdamW", "Adagrad", "RMSprop"};

static bool valid_kind(zd_optim_kind_t kind)
{
    return kind >= ZD_OPTIM_SGD && kind <= ZD_OPTIM_RMSPROP;
}

const char *zd_optim_kind_name(zd_optim_kind_t kind)
{
    return valid_kind(kind) ? kind_names[kind] : "?";
}

int zd_optim_kind_from_name(const char *name, zd_optim_kind_t *kind)
{
    if (!name)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_optim_kind_from_name: NULL name");
    if (!kind)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_optim_kind_from_name: NULL kind");
    for (int k = ZD_OPTIM_SGD; k <= ZD_OPTIM_RMSPROP; k++)
        if (strcasecmp(name, kind_names[k]) == 0) {
            *kind = (zd_optim_kind_t)k;
            return 0;
        }
    return zd_error_set_code(
        ZD_ERR_ARGUMENT, "optimizer: unknown kind '%s' (sgd, adam, adamw, adagrad, rmsprop)", name);
}

int zd__optim_config_read(zd_optim_config_t *out, const zd_optim_config_t *in)
{
    if (!in)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "optimizer: the zd_optim_config_t is NULL");
    size_t size;
    memcpy(&size, in, sizeof size);
    zd_optim_kind_t kind = ZD_OPTIM_SGD;
    if (size >= ZD__SIZE_THROUGH(zd_optim_config_t, kind))
        kind = in->kind;
    *out = zd_optim_defaults(kind); /* the fields an older program does not know */
    return zd__sized_read(out, sizeof *out, in, ZD__SIZE_THROUGH(zd_optim_config_t, maximize),
                          "zd_optim_config_t", "a zd_optim_*_defaults() function");
}

/*  The shortest text that reads back as exactly v. */
static const char *shortest(double v, char *buf, size_t size)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, size, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    return buf;
}

/*  The same with ".0" on whole numbers, as Python prints floats (PyTorch's
    messages show them that way). */
static const char *py_float(double v, char *buf, size_t size)
{
    shortest(v, buf, size);
    if (isfinite(v) && !strpbrk(buf, ".e"))
        strncat(buf, ".0", size - strlen(buf) - 1);
    return buf;
}

/*  "not 0 <= v" as Python writes it: NaN fails too. */
static bool nonneg(double v)
{
    return v >= 0.0;
}

int zd_optim_config_check(const zd_optim_config_t *cfg)
{
    zd_optim_config_t cv, *c = &cv;
    if (zd__optim_config_read(c, cfg) < 0)
        return -1;
    char s[40];
    if (!valid_kind(c->kind))
        return zd_error_set_code(ZD_ERR_ARGUMENT, "optimizer: unknown kind %d", (int)c->kind);
    const char *k = class_names[c->kind];
    if (c->kind == ZD_OPTIM_SGD && isnan(c->lr))
        return zd_error_set_code(
            ZD_ERR_ARGUMENT, "SGD: lr is required (PyTorch's SGD has no default learning rate)");
    if (!nonneg(c->lr))
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: Invalid learning rate: %s", k,
                                 py_float(c->lr, s, sizeof s));
    if (!nonneg(c->weight_decay))
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: Invalid weight_decay value: %s", k,
                                 py_float(c->weight_decay, s, sizeof s));
    if (c->kind != ZD_OPTIM_SGD && !nonneg(c->eps))
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: Invalid epsilon value: %s", k,
                                 py_float(c->eps, s, sizeof s));
    switch (c->kind) {
    case ZD_OPTIM_SGD:
        if (!nonneg(c->momentum))
            return zd_error_set_code(ZD_ERR_ARGUMENT, "SGD: Invalid momentum value: %s",
                                     py_float(c->momentum, s, sizeof s));
        if (c->nesterov && (c->momentum <= 0 || c->dampening != 0))
            return zd_error_set_code(
                ZD_ERR_ARGUMENT, "SGD: Nesterov momentum requires a momentum and zero dampening");
        break;
    case ZD_OPTIM_ADAM:
    case ZD_OPTIM_ADAMW:
        if (!(c->beta1 >= 0.0 && c->beta1 < 1.0))
            return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: Invalid beta parameter at index 0: %s",
                                     k, py_float(c->beta1, s, sizeof s));
        if (!(c->beta2 >= 0.0 && c->beta2 < 1.0))
            return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: Invalid beta parameter at index 1: %s",
                                     k, py_float(c->beta2, s, sizeof s));
        break;
    case ZD_OPTIM_ADAGRAD:
        if (!nonneg(c->lr_decay))
            return zd_error_set_code(ZD_ERR_ARGUMENT, "Adagrad: Invalid lr_decay value: %s",
                                     py_float(c->lr_decay, s, sizeof s));
        if (!nonneg(c->initial_accumulator_value))
            return zd_error_set_code(ZD_ERR_ARGUMENT,
                                     "Adagrad: Invalid initial_accumulator_value value: %s",
                                     py_float(c->initial_accumulator_value, s, sizeof s));
        break;
    case ZD_OPTIM_RMSPROP:
        if (!nonneg(c->momentum))
            return zd_error_set_code(ZD_ERR_ARGUMENT, "RMSprop: Invalid momentum value: %s",
                                     py_float(c->momentum, s, sizeof s));
        if (!nonneg(c->alpha))
            return zd_error_set_code(ZD_ERR_ARGUMENT, "RMSprop: Invalid alpha value: %s",
                                     py_float(c->alpha, s, sizeof s));
        break;
    }
    return 0;
}

int zd_optim_config_format(const zd_optim_config_t *cfg, char *buf, size_t size)
{
    if (!buf && size > 0)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_optim_config_format: NULL buf");
    zd_optim_config_t cv, *c = &cv;
    if (zd__optim_config_read(c, cfg) < 0)
        return -1;
    if (!valid_kind(c->kind))
        return zd_error_set_code(ZD_ERR_ARGUMENT, "optimizer: unknown kind %d", (int)c->kind);
    char num[40];
    int n = snprintf(buf, size, "%s", kind_names[c->kind]);
    if (n < 0)
        return zd_error_set("optimizer: cannot format the config");
    size_t off = (size_t)n;
    for (size_t i = 0; i < N_FIELDS; i++) {
        if (!(fields[i].kinds & 1u << c->kind))
            continue;
        char *dst = off < size ? buf + off : NULL;
        size_t room = off < size ? size - off : 0;
        const char *field = (const char *)c + fields[i].offset;
        if (fields[i].is_bool)
            n = snprintf(dst, room, " %s=%d", fields[i].key, *(const bool *)field ? 1 : 0);
        else
            n = snprintf(dst, room, " %s=%s", fields[i].key,
                         shortest(*(const double *)field, num, sizeof num));
        if (n < 0)
            return zd_error_set("optimizer: cannot format the config");
        off += (size_t)n;
    }
    return (int)off;
}

static int parse_pair(zd_optim_config_t *c, const char *tok, size_t len)
{
    const char *eq = memchr(tok, '=', len);
    if (!eq)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "optimizer config: '%.*s' is not key=value",
                                 (int)len, tok);
    size_t klen = (size_t)(eq - tok);
    char value[64];
    size_t vlen = len - klen - 1;
    if (vlen == 0 || vlen >= sizeof value)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "optimizer config: bad value in '%.*s'", (int)len,
                                 tok);
    memcpy(value, eq + 1, vlen);
    value[vlen] = '\0';
    for (size_t i = 0; i < N_FIELDS; i++) {
        if (strlen(fields[i].key) != klen || memcmp(fields[i].key, tok, klen) != 0)
            continue;
        if (!(fields[i].kinds & 1u << c->kind))
            return zd_error_set_code(ZD_ERR_ARGUMENT, "optimizer config: %s has no '%s'",
                                     class_names[c->kind], fields[i].key);
        char *field = (char *)c + fields[i].offset;
        if (fields[i].is_bool) {
            bool v;
            if (!strcmp(value, "1") || !strcasecmp(value, "true"))
                v = true;
            else if (!strcmp(value, "0") || !strcasecmp(value, "false"))
                v = false;
            else
                return zd_error_set_code(ZD_ERR_ARGUMENT,
                                         "optimizer config: %s=%s is not a boolean (0, 1, true, "
                                         "false)",
                                         fields[i].key, value);
            *(bool *)field = v;
        } else {
            char *end;
            double v = strtod(value, &end);
            if (*end)
                return zd_error_set_code(ZD_ERR_ARGUMENT, "optimizer config: %s=%s is not a number",
                                         fields[i].key, value);
            *(double *)field = v;
        }
        return 0;
    }
    return zd_error_set_code(ZD_ERR_ARGUMENT, "optimizer config: unknown key '%.*s'", (int)klen,
                             tok);
}

int zd_optim_config_parse(const char *text, zd_optim_config_t *cfg, size_t size)
{
    if (!text)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "optimizer config: the text is NULL");
    const char *p = text;
    zd_optim_config_t c;
    bool have_kind = false;
    while (*p) {
        while (isspace((unsigned char)*p))
            p++;
        size_t len = 0;
        while (p[len] && !isspace((unsigned char)p[len]))
            len++;
        if (len == 0)
            break;
        if (!have_kind) {
            char name[16];
            if (len >= sizeof name)
                return zd_error_set_code(ZD_ERR_ARGUMENT, "optimizer config: unknown kind '%.*s'",
                                         (int)len, p);
            memcpy(name, p, len);
            name[len] = '\0';
            zd_optim_kind_t kind = ZD_OPTIM_SGD;
            if (zd_optim_kind_from_name(name, &kind) < 0)
                return -1;
            c = zd_optim_defaults(kind);
            have_kind = true;
        } else if (parse_pair(&c, p, len) < 0) {
            return -1;
        }
        p += len;
    }
    if (!have_kind)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "optimizer config: empty text (expected '<kind> key=value ...')");
    return zd__optim_config_write(cfg, size, &c, "zd_optim_config_parse: zd_optim_config_t");
}

int zd__optim_config_write(zd_optim_config_t *out, size_t size, const zd_optim_config_t *c,
                           const char *who)
{
    if (zd__sized_write(out, size, c, sizeof *c, ZD__SIZE_THROUGH(zd_optim_config_t, maximize),
                        who) < 0)
        return -1;
    /* the fields written are those of the smaller struct: a later call reads no more */
    size_t written = size < sizeof *c ? size : sizeof *c;
    memcpy(out, &written, sizeof written);
    return 0;
}
