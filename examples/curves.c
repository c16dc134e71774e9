/* SPDX-License-Identifier: MIT */
/*  curves.c: training curves as CSV and PNG (curves.h).

    The CSV is written row by row as points come. The plot is drawn with
    cairo (a dependency of the examples only, not of libzdist) from the
    points kept in memory: panels stacked over one batch axis, each with
    ticks at "nice" values (1, 2, 5 times a power of ten), gridlines, its
    axis title and a legend. Loss and throughput axes start at zero, so a
    line's height is its value; the accuracy axis ends at 100 % and starts
    at the tens below the lowest value, so that the differences of a
    converged run stay visible. */
#include "examples/curves.h"

#include <cairo.h>
#include <errno.h>
#include <fontconfig/fontconfig.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zdist/error.h>

#define CURVES_PI 3.14159265358979323846

typedef struct {
    int64_t batch;
    double loss, samples_per_s;
} point_t;

typedef struct {
    int64_t batch;
    double accuracy; /* in [0, 1] */
} eval_t;

struct curves {
    char *csv_path, *png_path, *title;
    FILE *csv;
    int64_t per_epoch;
    point_t *points;
    int n, cap;
    eval_t *evals;
    int n_evals, cap_evals;
};

/*  curves_t objects open: cairo's and fontconfig's caches are freed when
    the last one closes, so that a leak checker sees a clean exit (only the
    plots here use cairo; the programs keep their curves on one thread). */
static int n_open;

static char *path_with(const char *prefix, const char *ext)
{
    size_t n = strlen(prefix) + strlen(ext) + 1;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s%s", prefix, ext);
    return p;
}

curves_t *curves_open(const char *prefix, const char *title, int64_t per_epoch)
{
    curves_t *c = calloc(1, sizeof *c);
    if (c)
        n_open++;
    if (!c || !(c->csv_path = path_with(prefix, ".csv")) ||
        !(c->png_path = path_with(prefix, ".png")) || !(c->title = strdup(title ? title : ""))) {
        curves_close(c);
        zd_error_set("curves: out of memory");
        return NULL;
    }
    c->per_epoch = per_epoch > 0 ? per_epoch : 0;
    if (!(c->csv = fopen(c->csv_path, "w"))) {
        zd_error_set("curves: cannot write %s: %s", c->csv_path, strerror(errno));
        curves_close(c);
        return NULL;
    }
    if (fputs("batch,epoch,loss,samples_per_s,test_accuracy\n", c->csv) < 0 ||
        fflush(c->csv) != 0) {
        zd_error_set("curves: cannot write %s: %s", c->csv_path, strerror(errno));
        curves_close(c);
        return NULL;
    }
    return c;
}

void curves_close(curves_t *c)
{
    if (!c)
        return;
    if (--n_open == 0) {
        cairo_debug_reset_static_data();
        FcFini();
    }
    if (c->csv)
        fclose(c->csv);
    free(c->csv_path);
    free(c->png_path);
    free(c->title);
    free(c->points);
    free(c->evals);
    free(c);
}

const char *curves_png_path(const curves_t *c)
{
    return c->png_path;
}

static int64_t epoch_of(const curves_t *c, int64_t batch)
{
    return c->per_epoch > 0 && batch > 0 ? (batch - 1) / c->per_epoch + 1 : 1;
}

/*  One CSV row, flushed: a run killed after this keeps it. */
static int csv_row(curves_t *c, int64_t batch, const char *rest)
{
    if (fprintf(c->csv, "%lld,%lld,%s\n", (long long)batch, (long long)epoch_of(c, batch), rest) <
            0 ||
        fflush(c->csv) != 0)
        return zd_error_set("curves: cannot write %s: %s", c->csv_path, strerror(errno));
    return 0;
}

/*  An empty CSV field for NaN, else the number. */
static void field(char *buf, size_t size, double v)
{
    if (isnan(v))
        buf[0] = 0;
    else
        snprintf(buf, size, "%.6g", v);
}

int curves_add(curves_t *c, int64_t batch, double loss, double samples_per_s)
{
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 64;
        point_t *p = realloc(c->points, (size_t)cap * sizeof *p);
        if (!p)
            return zd_error_set("curves: out of memory");
        c->points = p;
        c->cap = cap;
    }
    c->points[c->n++] = (point_t){batch, loss, samples_per_s};
    char l[32], s[32], row[80];
    field(l, sizeof l, loss);
    field(s, sizeof s, samples_per_s);
    snprintf(row, sizeof row, "%s,%s,", l, s);
    return csv_row(c, batch, row);
}

int curves_add_accuracy(curves_t *c, int64_t batch, double accuracy)
{
    if (c->n_evals == c->cap_evals) {
        int cap = c->cap_evals ? 2 * c->cap_evals : 16;
        eval_t *e = realloc(c->evals, (size_t)cap * sizeof *e);
        if (!e)
            return zd_error_set("curves: out of memory");
        c->evals = e;
        c->cap_evals = cap;
    }
    c->evals[c->n_evals++] = (eval_t){batch, accuracy};
    char row[48];
    snprintf(row, sizeof row, ",,%.6g", accuracy);
    if (csv_row(c, batch, row) < 0)
        return -1;
    return curves_draw(c);
}

/*  ---- layout ---- */

#define TOP    64.0 /* title, the first panel's legend */
#define BOTTOM 58.0 /* x tick labels, x axis title */
#define LEFT   92.0 /* y tick labels, y axis title */
#define RIGHT  28.0
#define GAP    30.0 /* between panels: the next one's legend */

typedef struct {
    bool drawn;
    double x0, y0, x1, y1; /* the plot area, pixels */
    double lo, hi, step;   /* the value axis (accuracy in %) */
} panel_t;

typedef struct {
    double x_hi, x_step; /* the batch axis: 0 .. x_hi */
    panel_t p[3];        /* by curves_panel_t */
} layout_t;

/*  A tick step of 1, 2 or 5 times a power of ten giving about n ticks. */
static double nice_step(double range, int n)
{
    if (!(range > 0) || !isfinite(range))
        return 1;
    double raw = range / n, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
}

/*  An axis from 0 to the tick at or above the largest finite value. */
static void zero_based(panel_t *p, double max)
{
    if (!(max > 0) || !isfinite(max))
        max = 1;
    p->lo = 0;
    p->step = nice_step(max, 5);
    p->hi = ceil(max / p->step - 1e-9) * p->step;
}

static void layout(const curves_t *c, layout_t *L)
{
    memset(L, 0, sizeof *L);
    double x_max = 0, loss_max = 0, speed_max = 0, acc_min = 100;
    for (int i = 0; i < c->n; i++) {
        const point_t *p = &c->points[i];
        x_max = fmax(x_max, (double)p->batch);
        if (isfinite(p->loss))
            loss_max = fmax(loss_max, p->loss);
        if (isfinite(p->samples_per_s))
            speed_max = fmax(speed_max, p->samples_per_s);
    }
    for (int i = 0; i < c->n_evals; i++) {
        x_max = fmax(x_max, (double)c->evals[i].batch);
        if (isfinite(c->evals[i].accuracy))
            acc_min = fmin(acc_min, 100 * c->evals[i].accuracy);
    }
    if (!(x_max > 0))
        x_max = 1;
    L->x_step = nice_step(x_max, 8);
    if (L->x_step < 1)
        L->x_step = 1; /* batches are whole */
    L->x_hi = ceil(x_max / L->x_step - 1e-9) * L->x_step;

    int n = c->n_evals > 0 ? 3 : 2;
    double h = (CURVES_PNG_HEIGHT - TOP - BOTTOM - GAP * (n - 1)) / n, y = TOP;
    for (int k = 0; k < 3; k++) {
        panel_t *p = &L->p[k];
        if (k == CURVES_ACCURACY && n == 2)
            continue;
        *p = (panel_t){true, LEFT, y, CURVES_PNG_WIDTH - RIGHT, y + h, 0, 1, 1};
        y += h + GAP;
    }
    zero_based(&L->p[CURVES_LOSS], loss_max);
    zero_based(&L->p[CURVES_SPEED], speed_max);
    panel_t *a = &L->p[CURVES_ACCURACY];
    a->hi = 100;
    a->lo = fmax(0, fmin(90, floor((acc_min - 2) / 10) * 10)); /* room for the markers */
    a->step = nice_step(a->hi - a->lo, 5);
}

static double px_x(const layout_t *L, const panel_t *p, double batch)
{
    return p->x0 + batch / L->x_hi * (p->x1 - p->x0);
}

static double px_y(const panel_t *p, double v)
{
    return p->y1 - (v - p->lo) / (p->hi - p->lo) * (p->y1 - p->y0);
}

int curves_locate(const curves_t *c, curves_panel_t panel, int64_t batch, double value, double *x,
                  double *y)
{
    layout_t L;
    layout(c, &L);
    const panel_t *p = &L.p[panel];
    if (!p->drawn)
        return -1;
    *x = px_x(&L, p, (double)batch);
    *y = px_y(p, panel == CURVES_ACCURACY ? 100 * value : value);
    return 0;
}

/*  ---- drawing ---- */

typedef struct {
    double r, g, b;
} rgb_t;

/*  matplotlib's first colours: what readers of plots are used to */
static const rgb_t blue = {0.122, 0.467, 0.706}, orange = {1.0, 0.498, 0.055},
                   green = {0.173, 0.627, 0.173}, ink = {0.15, 0.15, 0.15},
                   grid = {0.88, 0.88, 0.88}, epoch_ink = {0.45, 0.45, 0.45};

static void set_color(cairo_t *cr, rgb_t c)
{
    cairo_set_source_rgb(cr, c.r, c.g, c.b);
}

/*  Text placed by its box: ax 0 left, 0.5 centred, 1 right; ay likewise
    0 top, 0.5 middle, 1 bottom (of the font's ink of digits). */
static void text(cairo_t *cr, double x, double y, double ax, double ay, const char *s)
{
    cairo_text_extents_t e;
    cairo_text_extents(cr, s, &e);
    cairo_move_to(cr, x - e.x_bearing - ax * e.width, y - e.y_bearing - ay * e.height);
    cairo_show_text(cr, s);
}

static void font(cairo_t *cr, double size, bool bold)
{
    cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL,
                           bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, size);
}

/*  A tick value: integers as such, others with what they need. */
static void tick_label(char *buf, size_t size, double v, double step)
{
    if (fabs(v) < step * 1e-9)
        v = 0;
    if (fabs(v) >= 1e7)
        snprintf(buf, size, "%.3g", v);
    else if (step >= 1)
        snprintf(buf, size, "%.0f", v);
    else
        snprintf(buf, size, "%.*f", (int)ceil(-log10(step) - 1e-9), v);
}

/*  Pixels clamped far outside the image: cairo's fixed point wraps beyond
    about 8 million, and a wild value must not draw across the plot. */
static double clampd(double v)
{
    return fmin(fmax(v, -1e5), 1e5);
}

static void draw_frame(cairo_t *cr, const layout_t *L, const panel_t *p, const char *y_title,
                       bool x_labels, const char *x_title)
{
    char buf[32];
    cairo_set_line_width(cr, 1);
    font(cr, 12, false);
    /* gridlines and value ticks */
    for (double v = p->lo; v <= p->hi + p->step * 1e-6; v += p->step) {
        double y = round(px_y(p, v)) + 0.5;
        set_color(cr, grid);
        cairo_move_to(cr, p->x0, y);
        cairo_line_to(cr, p->x1, y);
        cairo_stroke(cr);
        set_color(cr, ink);
        cairo_move_to(cr, p->x0 - 5, y);
        cairo_line_to(cr, p->x0, y);
        cairo_stroke(cr);
        tick_label(buf, sizeof buf, v, p->step);
        text(cr, p->x0 - 8, y, 1, 0.5, buf);
    }
    for (double b = 0; b <= L->x_hi + L->x_step * 1e-6; b += L->x_step) {
        double x = round(px_x(L, p, b)) + 0.5;
        set_color(cr, grid);
        cairo_move_to(cr, x, p->y0);
        cairo_line_to(cr, x, p->y1);
        cairo_stroke(cr);
        set_color(cr, ink);
        cairo_move_to(cr, x, p->y1);
        cairo_line_to(cr, x, p->y1 + 5);
        cairo_stroke(cr);
        if (x_labels) {
            tick_label(buf, sizeof buf, b, L->x_step);
            text(cr, x, p->y1 + 9, 0.5, 0, buf);
        }
    }
    set_color(cr, ink);
    cairo_rectangle(cr, p->x0 + 0.5, p->y0 + 0.5, p->x1 - p->x0 - 1, p->y1 - p->y0 - 1);
    cairo_stroke(cr);
    font(cr, 13, false);
    cairo_save(cr);
    cairo_translate(cr, 22, (p->y0 + p->y1) / 2);
    cairo_rotate(cr, -CURVES_PI / 2);
    text(cr, 0, 0, 0.5, 0.5, y_title);
    cairo_restore(cr);
    if (x_labels)
        text(cr, (p->x0 + p->x1) / 2, p->y1 + 34, 0.5, 0, x_title);
}

/*  Dashed lines where epochs begin (every k-th when there are more than
    40); the labels inside the top of the first panel when they have room. */
static void draw_epochs(cairo_t *cr, const curves_t *c, const layout_t *L, bool label)
{
    if (c->per_epoch <= 0)
        return;
    const double dash[] = {5, 4};
    double n = L->x_hi / (double)c->per_epoch;
    int64_t every = n > 40 ? (int64_t)ceil(n / 40) : 1;
    const panel_t *first = &L->p[CURVES_LOSS];
    label = label && px_x(L, first, (double)(every * c->per_epoch)) - first->x0 >= 60;
    font(cr, 11, false);
    for (int64_t k = every; (double)k * (double)c->per_epoch < L->x_hi; k += every) {
        for (int i = 0; i < 3; i++) {
            const panel_t *p = &L->p[i];
            if (!p->drawn)
                continue;
            double x = round(px_x(L, p, (double)(k * c->per_epoch))) + 0.5;
            set_color(cr, epoch_ink);
            cairo_set_line_width(cr, 1);
            cairo_set_dash(cr, dash, 2, 0);
            cairo_move_to(cr, x, p->y0);
            cairo_line_to(cr, x, p->y1);
            cairo_stroke(cr);
            cairo_set_dash(cr, NULL, 0, 0);
            if (label && i == CURVES_LOSS) {
                char buf[32];
                snprintf(buf, sizeof buf, "epoch %lld", (long long)(k + 1));
                text(cr, x + 4, p->y0 + 5, 0, 0, buf);
            }
        }
    }
}

/*  The legend in the band above the panel, right-aligned: it never hides
    a point. */
static void draw_legend(cairo_t *cr, const panel_t *p, rgb_t color, bool marker, const char *name)
{
    font(cr, 12, false);
    cairo_text_extents_t e;
    cairo_text_extents(cr, name, &e);
    double y = p->y0 - 11, x = p->x1 - e.x_advance - 32;
    set_color(cr, color);
    cairo_set_line_width(cr, 2);
    cairo_move_to(cr, x, y);
    cairo_line_to(cr, x + 24, y);
    cairo_stroke(cr);
    if (marker) {
        cairo_arc(cr, x + 12, y, 3.5, 0, 2 * CURVES_PI);
        cairo_fill(cr);
    }
    set_color(cr, ink);
    text(cr, x + 30, y, 0, 0.5, name);
}

typedef double (*value_fn)(const curves_t *c, int i, int64_t *batch);

static double loss_at(const curves_t *c, int i, int64_t *batch)
{
    *batch = c->points[i].batch;
    return c->points[i].loss;
}

static double speed_at(const curves_t *c, int i, int64_t *batch)
{
    *batch = c->points[i].batch;
    return c->points[i].samples_per_s;
}

static double accuracy_at(const curves_t *c, int i, int64_t *batch)
{
    *batch = c->evals[i].batch;
    return 100 * c->evals[i].accuracy;
}

/*  The series as a line broken at unknown values, clipped to the panel. */
static void draw_series(cairo_t *cr, const curves_t *c, const layout_t *L, const panel_t *p,
                        value_fn at, int n, rgb_t color, bool markers)
{
    cairo_save(cr);
    /* a marker's width beyond the frame: points at its edges stay whole */
    cairo_rectangle(cr, p->x0 - 5, p->y0 - 5, p->x1 - p->x0 + 10, p->y1 - p->y0 + 10);
    cairo_clip(cr);
    set_color(cr, color);
    cairo_set_line_width(cr, 2);
    cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
    bool open = false;
    for (int i = 0; i < n; i++) {
        int64_t b;
        double v = at(c, i, &b);
        if (!isfinite(v)) {
            open = false;
            continue;
        }
        double x = clampd(px_x(L, p, (double)b)), y = clampd(px_y(p, v));
        if (open)
            cairo_line_to(cr, x, y);
        else
            cairo_move_to(cr, x, y);
        open = true;
    }
    cairo_stroke(cr);
    for (int i = 0; markers && i < n; i++) {
        int64_t b;
        double v = at(c, i, &b);
        if (isfinite(v)) {
            cairo_arc(cr, clampd(px_x(L, p, (double)b)), clampd(px_y(p, v)), 3.5, 0, 2 * CURVES_PI);
            cairo_fill(cr);
        }
    }
    cairo_restore(cr);
}

static void draw(cairo_t *cr, const curves_t *c)
{
    layout_t L;
    layout(c, &L);
    cairo_set_source_rgb(cr, 1, 1, 1);
    cairo_paint(cr);

    char title[512];
    if (c->n_evals > 0)
        snprintf(title, sizeof title, "%s: test accuracy %.2f %% after %lld batches", c->title,
                 100 * c->evals[c->n_evals - 1].accuracy,
                 (long long)c->evals[c->n_evals - 1].batch);
    else
        snprintf(title, sizeof title, "%s", c->title);
    font(cr, 16, true);
    set_color(cr, ink);
    text(cr, LEFT, 14, 0, 0, title);

    const char *x_title = c->per_epoch > 0 ? "batches (all epochs)" : "batches";
    const panel_t *loss = &L.p[CURVES_LOSS], *acc = &L.p[CURVES_ACCURACY],
                  *speed = &L.p[CURVES_SPEED];
    draw_frame(cr, &L, loss, "loss", false, x_title);
    if (acc->drawn)
        draw_frame(cr, &L, acc, "test accuracy (%)", false, x_title);
    draw_frame(cr, &L, speed, "samples/s", true, x_title);
    draw_epochs(cr, c, &L, true);
    draw_series(cr, c, &L, loss, loss_at, c->n, blue, false);
    draw_legend(cr, loss, blue, false, "training loss (mean since the previous point)");
    if (acc->drawn) {
        draw_series(cr, c, &L, acc, accuracy_at, c->n_evals, orange, true);
        draw_legend(cr, acc, orange, true, "test accuracy");
    }
    draw_series(cr, c, &L, speed, speed_at, c->n, green, false);
    draw_legend(cr, speed, green, false, "training throughput");
}

int curves_draw(const curves_t *c)
{
    size_t n = strlen(c->png_path) + 32;
    char *tmp = malloc(n);
    if (!tmp)
        return zd_error_set("curves: out of memory");
    /* in the same directory, so that the rename is atomic */
    snprintf(tmp, n, "%s.tmp%ld", c->png_path, (long)getpid());
    cairo_surface_t *s =
        cairo_image_surface_create(CAIRO_FORMAT_RGB24, CURVES_PNG_WIDTH, CURVES_PNG_HEIGHT);
    cairo_t *cr = cairo_create(s);
    draw(cr, c);
    cairo_status_t st = cairo_status(cr);
    cairo_destroy(cr);
    int rc = 0;
    if (st != CAIRO_STATUS_SUCCESS)
        rc = zd_error_set("curves: drawing %s: %s", c->png_path, cairo_status_to_string(st));
    else if ((st = cairo_surface_write_to_png(s, tmp)) != CAIRO_STATUS_SUCCESS)
        rc = zd_error_set("curves: cannot write %s: %s", tmp, cairo_status_to_string(st));
    else if (rename(tmp, c->png_path) != 0)
        rc = zd_error_set("curves: cannot write %s: %s", c->png_path, strerror(errno));
    if (rc < 0)
        unlink(tmp);
    cairo_surface_destroy(s);
    free(tmp);
    return rc;
}

void curves_points_init(curves_points_t *p, int64_t every, double now)
{
    *p = (curves_points_t){.every = every, .since = now};
}

int curves_batch(curves_t *c, curves_points_t *p, int64_t done, double loss, int64_t samples,
                 double now)
{
    p->loss += loss;
    p->n++;
    if (!c || done % p->every != 0)
        return 0;
    double rate = now > p->since ? (double)(p->n * samples) / (now - p->since) : NAN;
    int rc = curves_add(c, done, p->loss / (double)p->n, rate);
    p->loss = 0, p->n = 0, p->since = now;
    return rc;
}

void curves_points_skip(curves_points_t *p, double seconds)
{
    p->since += seconds;
}
