/* SPDX-License-Identifier: MIT */
/*  curves.c: training curves as CSV and PNG (curves.h).

    The chart is drawn into an RGB buffer: two panels (loss, samples/s)
    over a shared batch axis, lines between consecutive points, axis
    values and labels in a 5x7 pixel font drawn at twice its size. The PNG
    is the simplest valid one: 8-bit RGB, no interlace, every row with
    filter 0, one IDAT chunk compressed by zlib, CRCs by zlib's crc32. */
#include "examples/curves.h"

#include <ctype.h>
#include <stdbool.h>
#include <stddef.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include <zdist/error.h>

typedef struct {
    int64_t batch;
    double loss, samples_per_s;
} point_t;

struct curves {
    char *title;
    point_t *points;
    int n, cap;
    double accuracy;            /* < 0: not set */
};

curves_t *curves_new(const char *title)
{
    curves_t *c = calloc(1, sizeof *c);
    if (!c || !(c->title = strdup(title ? title : ""))) {
        free(c);
        zd_error_set("curves: out of memory");
        return NULL;
    }
    c->accuracy = -1;
    return c;
}

void curves_free(curves_t *c)
{
    if (!c)
        return;
    free(c->title);
    free(c->points);
    free(c);
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
    return 0;
}

void curves_set_accuracy(curves_t *c, double accuracy)
{
    c->accuracy = accuracy;
}

/* ---- CSV ---- */

static int write_csv(const curves_t *c, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return zd_error_set("curves: cannot write %s: %s", path, strerror(errno));
    fprintf(f, "batch,loss,samples_per_s,test_accuracy\n");
    for (int i = 0; i < c->n; i++)
        fprintf(f, "%lld,%.6g,%.6g,\n", (long long)c->points[i].batch, c->points[i].loss,
                c->points[i].samples_per_s);
    if (c->accuracy >= 0)
        fprintf(f, "%lld,,,%.6g\n", (long long)(c->n ? c->points[c->n - 1].batch : 0),
                c->accuracy);
    bool failed = ferror(f) != 0;
    if (fclose(f) != 0 || failed)
        return zd_error_set("curves: cannot write %s: %s", path, strerror(errno));
    return 0;
}

/* ---- PNG ---- */

static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static int write_chunk(FILE *f, const char *type, const uint8_t *data, uint32_t len)
{
    uint8_t head[8], tail[4];
    put32(head, len);
    memcpy(head + 4, type, 4);
    uLong crc = crc32(0, (const Bytef *)type, 4);
    if (len)
        crc = crc32(crc, data, len);
    put32(tail, (uint32_t)crc);
    return fwrite(head, 1, 8, f) == 8 && (len == 0 || fwrite(data, 1, len, f) == len) &&
                   fwrite(tail, 1, 4, f) == 4
               ? 0
               : -1;
}

int curves_png_write(const char *path, const uint8_t *rgb, int w, int h)
{
    if (w < 1 || h < 1 || w > 16384 || h > 16384)
        return zd_error_set("curves: a %dx%d image for %s", w, h, path);
    size_t row = 1 + 3 * (size_t)w, raw_len = row * (size_t)h;
    uLongf z_len = compressBound((uLong)raw_len);
    uint8_t *raw = malloc(raw_len), *z = malloc(z_len);
    int rc = raw && z ? 0 : zd_error_set("curves: out of memory for %s", path);
    for (int y = 0; rc == 0 && y < h; y++) {
        raw[(size_t)y * row] = 0;   /* filter: none */
        memcpy(raw + (size_t)y * row + 1, rgb + (size_t)y * 3 * (size_t)w, 3 * (size_t)w);
    }
    if (rc == 0 && compress2(z, &z_len, raw, (uLong)raw_len, 6) != Z_OK)
        rc = zd_error_set("curves: zlib could not compress %s", path);
    FILE *f = rc == 0 ? fopen(path, "wb") : NULL;
    if (rc == 0 && !f)
        rc = zd_error_set("curves: cannot write %s: %s", path, strerror(errno));
    if (rc == 0) {
        static const uint8_t signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
        uint8_t ihdr[13] = {0};
        put32(ihdr, (uint32_t)w);
        put32(ihdr + 4, (uint32_t)h);
        ihdr[8] = 8;    /* bits per sample */
        ihdr[9] = 2;    /* RGB */
        if (fwrite(signature, 1, 8, f) != 8 || write_chunk(f, "IHDR", ihdr, 13) < 0 ||
            write_chunk(f, "IDAT", z, (uint32_t)z_len) < 0 || write_chunk(f, "IEND", NULL, 0) < 0)
            rc = zd_error_set("curves: cannot write %s: %s", path, strerror(errno));
    }
    if (f && fclose(f) != 0 && rc == 0)
        rc = zd_error_set("curves: cannot write %s: %s", path, strerror(errno));
    free(raw);
    free(z);
    return rc;
}

/* ---- drawing ---- */

#define W 640
#define H 480

typedef struct {
    uint8_t px[H][W][3];
} canvas_t;

static const uint8_t black[3] = {0, 0, 0}, grey[3] = {200, 200, 200},
                     blue[3] = {20, 90, 200}, green[3] = {0, 140, 60};

static void plot(canvas_t *cv, int x, int y, const uint8_t *rgb)
{
    if (x >= 0 && x < W && y >= 0 && y < H)
        memcpy(cv->px[y][x], rgb, 3);
}

static int clamp(int v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* Bresenham, two pixels thick; the ends are first brought within a pixel
   of the canvas, so a wild point costs a short walk, not billions. */
static void line(canvas_t *cv, int x0, int y0, int x1, int y1, const uint8_t *rgb)
{
    x0 = clamp(x0, -1, W), x1 = clamp(x1, -1, W), y0 = clamp(y0, -1, H), y1 = clamp(y1, -1, H);
    int dx = abs(x1 - x0), dy = -abs(y1 - y0), sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
    int err = dx + dy;
    for (;;) {
        plot(cv, x0, y0, rgb);
        plot(cv, x0, y0 + 1, rgb);
        if (x0 == x1 && y0 == y1)
            break;
        int e2 = 2 * err;
        if (e2 >= dy)
            err += dy, x0 += sx;
        if (e2 <= dx)
            err += dx, y0 += sy;
    }
}

/* 5x7 glyphs, one byte a row, bit 4 the leftmost column; lower case is
   drawn as upper case, characters without a glyph as spaces. */
static const struct {
    char ch;
    uint8_t rows[7];
} font[] = {
    {'0', {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E}},
    {'1', {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E}},
    {'2', {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F}},
    {'3', {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E}},
    {'4', {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02}},
    {'5', {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E}},
    {'6', {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E}},
    {'7', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08}},
    {'8', {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E}},
    {'9', {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C}},
    {'A', {0x0E, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11}},
    {'B', {0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E}},
    {'C', {0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E}},
    {'D', {0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C}},
    {'E', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F}},
    {'F', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10}},
    {'G', {0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F}},
    {'H', {0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11}},
    {'I', {0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E}},
    {'J', {0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C}},
    {'K', {0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11}},
    {'L', {0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F}},
    {'M', {0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11}},
    {'N', {0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11}},
    {'O', {0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}},
    {'P', {0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10}},
    {'Q', {0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D}},
    {'R', {0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11}},
    {'S', {0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E}},
    {'T', {0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04}},
    {'U', {0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}},
    {'V', {0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04}},
    {'W', {0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A}},
    {'X', {0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11}},
    {'Y', {0x11, 0x11, 0x11, 0x0A, 0x04, 0x04, 0x04}},
    {'Z', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F}},
    {'.', {0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C}},
    {',', {0x00, 0x00, 0x00, 0x00, 0x0C, 0x04, 0x08}},
    {'%', {0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03}},
    {'/', {0x00, 0x01, 0x02, 0x04, 0x08, 0x10, 0x00}},
    {':', {0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x0C, 0x00}},
    {'-', {0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00}},
    {'+', {0x00, 0x04, 0x04, 0x1F, 0x04, 0x04, 0x00}},
    {'=', {0x00, 0x00, 0x1F, 0x00, 0x1F, 0x00, 0x00}},
    {'_', {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1F}},
    {'(', {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02}},
    {')', {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08}},
};

#define SCALE 2
#define ADVANCE (6 * SCALE)

/* Draws text with its top left corner at (x, y); returns its width. */
static int text(canvas_t *cv, int x, int y, const char *s, const uint8_t *rgb)
{
    int x0 = x;
    for (; *s; s++, x += ADVANCE) {
        char ch = (char)toupper((unsigned char)*s);
        for (size_t g = 0; g < sizeof font / sizeof font[0]; g++) {
            if (font[g].ch != ch)
                continue;
            for (int r = 0; r < 7; r++)
                for (int col = 0; col < 5; col++)
                    if (font[g].rows[r] & (0x10 >> col))
                        for (int dy = 0; dy < SCALE; dy++)
                            for (int dx = 0; dx < SCALE; dx++)
                                plot(cv, x + col * SCALE + dx, y + r * SCALE + dy, rgb);
            break;
        }
    }
    return x - x0;
}

typedef struct {
    int x0, y0, x1, y1;         /* the plot area */
    const char *label;
    const uint8_t *color;
    size_t offset;              /* of the value in point_t */
} panel_t;

static double value_of(const point_t *p, size_t offset)
{
    double v;
    memcpy(&v, (const char *)p + offset, sizeof v);
    return v;
}

static void draw_panel(canvas_t *cv, const curves_t *c, const panel_t *pn, int64_t b_lo,
                       int64_t b_hi)
{
    double lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < c->n; i++) {
        double v = value_of(&c->points[i], pn->offset);
        if (isfinite(v))
            lo = v < lo ? v : lo, hi = v > hi ? v : hi;
    }
    if (!(lo <= hi))
        lo = 0, hi = 1;   /* no finite value: an empty frame */
    if (hi - lo < 1e-12 * (fabs(hi) + 1))
        hi = lo + 1;
    for (int x = pn->x0; x <= pn->x1; x += 4)   /* dotted middle line */
        plot(cv, x, (pn->y0 + pn->y1) / 2, grey);
    line(cv, pn->x0, pn->y0, pn->x0, pn->y1, black);
    line(cv, pn->x0, pn->y1, pn->x1, pn->y1, black);
    char buf[32];
    snprintf(buf, sizeof buf, "%.4g", hi);
    text(cv, 4, pn->y0, buf, black);
    snprintf(buf, sizeof buf, "%.4g", lo);
    text(cv, 4, pn->y1 - 7 * SCALE, buf, black);
    text(cv, 4, pn->y0 + 10 * SCALE, pn->label, pn->color);   /* under the top value */
    double bw = b_hi > b_lo ? (double)(b_hi - b_lo) : 1;
    int px = 0, py = 0;
    bool have = false;
    for (int i = 0; i < c->n; i++) {
        double v = value_of(&c->points[i], pn->offset);
        if (!isfinite(v)) {
            have = false;
            continue;
        }
        double fx = pn->x0 + (double)(c->points[i].batch - b_lo) / bw * (pn->x1 - pn->x0);
        double fy = pn->y1 - (v - lo) / (hi - lo) * (pn->y1 - pn->y0);
        int x = clamp((int)lround(fmin(fmax(fx, -1), W)), -1, W);
        int y = clamp((int)lround(fmin(fmax(fy, -1), H)), -1, H);
        if (have)
            line(cv, px, py, x, y, pn->color);
        else
            plot(cv, x, y, pn->color);
        px = x, py = y, have = true;
    }
}

static int write_png(const curves_t *c, const char *path)
{
    canvas_t *cv = malloc(sizeof *cv);
    if (!cv)
        return zd_error_set("curves: out of memory for %s", path);
    memset(cv, 255, sizeof *cv);
    char title[256];
    if (c->accuracy >= 0)
        snprintf(title, sizeof title, "%s  test accuracy %.2f %%", c->title, 100 * c->accuracy);
    else
        snprintf(title, sizeof title, "%s", c->title);
    text(cv, 10, 8, title, black);
    int64_t b_lo = c->n ? c->points[0].batch : 0, b_hi = c->n ? c->points[0].batch : 1;
    for (int i = 1; i < c->n; i++) {   /* points may come in any order */
        b_lo = c->points[i].batch < b_lo ? c->points[i].batch : b_lo;
        b_hi = c->points[i].batch > b_hi ? c->points[i].batch : b_hi;
    }
    const panel_t panels[2] = {
        {120, 40, 620, 240, "loss", blue, offsetof(point_t, loss)},
        {120, 270, 620, 430, "samples/s", green, offsetof(point_t, samples_per_s)},
    };
    for (int i = 0; i < 2; i++)
        draw_panel(cv, c, &panels[i], b_lo, b_hi);
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", (long long)b_lo);
    text(cv, 120, 440, buf, black);
    snprintf(buf, sizeof buf, "%lld", (long long)b_hi);
    text(cv, 620 - (int)strlen(buf) * ADVANCE, 440, buf, black);
    text(cv, 340, 440, "batch", black);
    int rc = curves_png_write(path, &cv->px[0][0][0], W, H);
    free(cv);
    return rc;
}

int curves_write(const curves_t *c, const char *path_prefix)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s.csv", path_prefix) >= (int)sizeof path)
        return zd_error_set("curves: path too long: %s", path_prefix);
    if (write_csv(c, path) < 0)
        return -1;
    snprintf(path, sizeof path, "%s.png", path_prefix);
    return write_png(c, path);
}
