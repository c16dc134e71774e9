/* SPDX-License-Identifier: MIT */
/*  progress.c: the progress line of the training programs (progress.h). */
#include "examples/progress.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>

void progress_init(progress_t *p, FILE *out, bool tty, const progress_config_t *c, double now)
{
    memset(p, 0, sizeof *p);
    p->c = *c;
    snprintf(p->label, sizeof p->label, "%s", c->label ? c->label : "");
    p->c.label = p->label;
    if (!p->c.unit)
        p->c.unit = "batch";
    if (p->c.samples_per_step < 1)
        p->c.samples_per_step = 1;
    p->out = out;
    p->tty = tty;
    p->done = p->last_done = c->first;
    p->t0 = p->last_t = now;
    p->shown_loss = NAN;
}

char *progress_duration(double seconds, char *buf, size_t size)
{
    if (!(seconds >= 0) || seconds > 1e9) { /* NaN, negative, absurd */
        snprintf(buf, size, "?");
        return buf;
    }
    long long s = llround(seconds);
    if (s < 60)
        snprintf(buf, size, "%llds", s);
    else if (s < 3600)
        snprintf(buf, size, "%lldm%02llds", s / 60, s % 60);
    else
        snprintf(buf, size, "%lldh%02lldm", s / 3600, s % 3600 / 60);
    return buf;
}

/*  Appends to buf at *at, never past size. */
static void add(char *buf, size_t size, size_t *at, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void add(char *buf, size_t size, size_t *at, const char *fmt, ...)
{
    if (*at >= size)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *at, size - *at, fmt, ap);
    va_end(ap);
    if (n > 0)
        *at = *at + (size_t)n < size ? *at + (size_t)n : size - 1;
}

char *progress_format(const progress_t *p, double now, char *buf, size_t size)
{
    const progress_config_t *c = &p->c;
    size_t at = 0;
    char d[32];
    if (size == 0)
        return buf;
    buf[0] = 0;
    add(buf, size, &at, "%s", p->label);
    if (c->per_epoch > 0) {
        int64_t epoch = p->done > 0 ? (p->done - 1) / c->per_epoch + 1 : 1;
        if (c->epochs > 0)
            add(buf, size, &at, "%sepoch %lld/%lld", at ? " " : "", (long long)epoch,
                (long long)c->epochs);
        else
            add(buf, size, &at, "%sepoch %lld", at ? " " : "", (long long)epoch);
    }
    add(buf, size, &at, "%s%s %lld", at ? " " : "", c->unit, (long long)p->done);
    if (c->total > 0)
        add(buf, size, &at, "/%lld %lld%%", (long long)c->total,
            (long long)(100 * p->done / c->total));
    /* The rate of the last interval: what the run does now. */
    double dt = now - p->last_t;
    int64_t steps = p->done - p->last_done;
    if (!(dt > 0) || steps <= 0)
        dt = now - p->t0, steps = p->done - c->first;
    if (dt > 0 && steps > 0)
        add(buf, size, &at, " %.0f samples/s", (double)(steps * c->samples_per_step) / dt);
    double loss = p->loss_n > 0 ? p->loss_sum / (double)p->loss_n : p->shown_loss;
    if (!isnan(loss))
        add(buf, size, &at, " loss(avg) %.4f", loss);
    add(buf, size, &at, " elapsed %s", progress_duration(now - p->t0, d, sizeof d));
    /* The time left at the average rate of the whole run: steadier than
       the last interval's, which jumps with every evaluation or hiccup. */
    int64_t run = p->done - c->first;
    if (c->total > 0 && run > 0 && now > p->t0)
        add(buf, size, &at, " left %s",
            progress_duration((double)(c->total - p->done) * (now - p->t0) / (double)run, d,
                              sizeof d));
    return buf;
}

/*  Prints the line; a new interval starts unless it is a redraw (after
    progress_clear), which must not cut the interval short. */
static void show(progress_t *p, double now, bool new_interval)
{
    char line[256];
    progress_format(p, now, line, sizeof line);
    if (p->tty) {
        /* back to the start of the line, the text, clear what is left of
           a longer previous one */
        fprintf(p->out, "\r%s\033[K", line);
        p->shown = true;
    } else {
        fprintf(p->out, "%s\n", line);
    }
    fflush(p->out);
    p->redraw = false;
    if (!new_interval)
        return;
    if (p->loss_n > 0)
        p->shown_loss = p->loss_sum / (double)p->loss_n;
    p->loss_sum = 0;
    p->loss_n = 0;
    p->last_t = now;
    p->last_done = p->done;
}

void progress_step(progress_t *p, double now, double loss)
{
    p->done++;
    if (!isnan(loss)) {
        p->loss_sum += loss;
        p->loss_n++;
    }
    if (p->c.every_s > 0 && now - p->last_t >= p->c.every_s)
        show(p, now, true);
    else if (p->redraw)
        show(p, now, false);
}

void progress_skip(progress_t *p, double seconds)
{
    if (seconds > 0)
        p->last_t += seconds;
}

void progress_clear(progress_t *p)
{
    if (!p->shown)
        return;
    fputs("\r\033[K", p->out);
    fflush(p->out);
    p->shown = false;
    p->redraw = true;
}

void progress_end(progress_t *p, double now)
{
    if (!p->tty || p->c.every_s <= 0)
        return;
    show(p, now, true);
    fputc('\n', p->out);
    fflush(p->out);
    p->shown = false;
}
