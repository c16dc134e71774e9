/* SPDX-License-Identifier: MIT */
/*  Training curves (SPEC B4): the CSV reads back; the PNG is a valid file
    (signature, chunk CRCs, an IDAT that inflates to the image) whose
    pixels hold the two curves; a file that cannot be written is named.
    KEEP=1 leaves the files in /tmp/zdist_curves* to look at. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include <zdist/error.h>
#include "examples/curves.h"

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint8_t *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = 0;
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* Decodes a PNG as curves_png_write makes them (8-bit RGB, filter 0, no
   interlace), checking every chunk's CRC. Returns the pixels (malloc'ed). */
static uint8_t *png_decode(const char *path, int *w, int *h)
{
    size_t len;
    uint8_t *f = read_all(path, &len);
    static const uint8_t signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    assert_true(len > 8 && memcmp(f, signature, 8) == 0);
    uint8_t *idat = NULL;
    size_t idat_len = 0, at = 8;
    bool ended = false;
    while (at + 12 <= len && !ended) {
        uint32_t n = get32(f + at);
        assert_true(at + 12 + n <= len);
        const uint8_t *type = f + at + 4, *data = f + at + 8;
        uLong crc = crc32(crc32(0, type, 4), data, n);
        assert_int_equal(get32(data + n), (uint32_t)crc);
        if (!memcmp(type, "IHDR", 4)) {
            assert_int_equal(n, 13);
            *w = (int)get32(data), *h = (int)get32(data + 4);
            assert_int_equal(data[8], 8);    /* bits */
            assert_int_equal(data[9], 2);    /* RGB */
            assert_int_equal(data[12], 0);   /* no interlace */
        } else if (!memcmp(type, "IDAT", 4)) {
            idat = realloc(idat, idat_len + n);
            memcpy(idat + idat_len, data, n);
            idat_len += n;
        } else if (!memcmp(type, "IEND", 4)) {
            ended = true;
        }
        at += 12 + n;
    }
    assert_true(ended && idat && *w > 0 && *h > 0);
    size_t row = 1 + 3 * (size_t)*w;
    uLongf raw_len = (uLongf)(row * (size_t)*h);
    uint8_t *raw = malloc(raw_len), *rgb = malloc(3 * (size_t)*w * (size_t)*h);
    assert_int_equal(uncompress(raw, &raw_len, idat, (uLong)idat_len), Z_OK);
    assert_int_equal(raw_len, row * (size_t)*h);
    for (int y = 0; y < *h; y++) {
        assert_int_equal(raw[(size_t)y * row], 0);
        memcpy(rgb + (size_t)y * 3 * (size_t)*w, raw + (size_t)y * row + 1, 3 * (size_t)*w);
    }
    free(raw);
    free(idat);
    free(f);
    return rgb;
}

static char dir[] = "/tmp/zdist_curvesXXXXXX";

static int setup(void **state)
{
    (void)state;
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return getenv("KEEP") ? 0 : (system(cmd) == 0 ? 0 : -1);
}

static void test_png_round_trip(void **state)
{
    (void)state;
    uint8_t img[2][3][3];
    for (int y = 0; y < 2; y++)
        for (int x = 0; x < 3; x++)
            for (int c = 0; c < 3; c++)
                img[y][x][c] = (uint8_t)(40 * y + 70 * x + 11 * c);
    char path[256];
    snprintf(path, sizeof path, "%s/small.png", dir);
    assert_int_equal(curves_png_write(path, &img[0][0][0], 3, 2), 0);
    int w, h;
    uint8_t *rgb = png_decode(path, &w, &h);
    assert_int_equal(w, 3);
    assert_int_equal(h, 2);
    assert_memory_equal(rgb, img, sizeof img);
    free(rgb);
    assert_int_equal(curves_png_write(path, &img[0][0][0], 0, 2), -1);
}

static int count_color(const uint8_t *rgb, int w, int h, int r, int g, int b)
{
    int n = 0;
    for (int i = 0; i < w * h; i++)
        n += rgb[3 * i] == r && rgb[3 * i + 1] == g && rgb[3 * i + 2] == b;
    return n;
}

static void test_csv_and_png(void **state)
{
    (void)state;
    curves_t *c = curves_new("rank 1");
    assert_non_null(c);
    for (int b = 0; b <= 200; b += 5)
        assert_int_equal(curves_add(c, b, 2.3 * exp(-b / 60.0), b ? 900 + b : 0), 0);
    assert_int_equal(curves_add(c, 205, NAN, 1100), 0);   /* a lost loss is skipped */
    curves_set_accuracy(c, 0.8931);
    char prefix[256], path[300];
    snprintf(prefix, sizeof prefix, "%s/run", dir);
    assert_int_equal(curves_write(c, prefix), 0);
    curves_free(c);

    snprintf(path, sizeof path, "%s.csv", prefix);
    size_t len;
    char *csv = (char *)read_all(path, &len);
    int lines = 0;
    for (char *p = csv; *p; p++)
        lines += *p == '\n';
    assert_int_equal(lines, 1 + 42 + 1);   /* header, points, accuracy */
    assert_true(!strncmp(csv, "batch,loss,samples_per_s,test_accuracy\n0,2.3,0,\n5,", 50));
    assert_non_null(strstr(csv, "\n205,nan,1100,\n205,,,0.8931\n"));
    free(csv);

    snprintf(path, sizeof path, "%s.png", prefix);
    int w, h;
    uint8_t *rgb = png_decode(path, &w, &h);
    assert_int_equal(w, 640);
    assert_int_equal(h, 480);
    assert_true(rgb[0] == 255 && rgb[1] == 255 && rgb[2] == 255);   /* background */
    /* Both curves are drawn, across most of the width. */
    int loss_px = count_color(rgb, w, h, 20, 90, 200), speed_px = count_color(rgb, w, h, 0, 140, 60);
    assert_true(loss_px > 500);
    assert_true(speed_px > 500);
    int left = w, right = 0;
    for (int y = 38; y < 244; y++)   /* the loss panel, right of its label */
        for (int x = 110; x < w; x++) {
            const uint8_t *p = rgb + 3 * ((size_t)y * (size_t)w + (size_t)x);
            if (p[0] == 20 && p[1] == 90 && p[2] == 200)
                left = x < left ? x : left, right = x > right ? x : right;
        }
    assert_true(left >= 120 && left <= 124 && right >= 600);
    free(rgb);
}

/*  Points in any order, one of them far out: drawn at once, within the
    canvas (this once walked billions of pixels). */
static void test_points_in_any_order(void **state)
{
    (void)state;
    curves_t *c = curves_new("odd");
    const int64_t batches[] = {100, 0, 200000000, 101};
    for (int i = 0; i < 4; i++)
        assert_int_equal(curves_add(c, batches[i], i == 2 ? 1e30 : 1.0 / (1 + i), 10.0 * i), 0);
    char prefix[256];
    snprintf(prefix, sizeof prefix, "%s/odd", dir);
    assert_int_equal(curves_write(c, prefix), 0);
    curves_free(c);
}

static void test_unwritable_path_is_named(void **state)
{
    (void)state;
    curves_t *c = curves_new("x");
    assert_int_equal(curves_add(c, 0, 1, 1), 0);
    assert_int_equal(curves_write(c, "/nonexistent/dir/run"), -1);
    assert_non_null(strstr(zd_error_last(), "/nonexistent/dir/run.csv"));
    curves_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_png_round_trip),
        cmocka_unit_test(test_csv_and_png),
        cmocka_unit_test(test_points_in_any_order),
        cmocka_unit_test(test_unwritable_path_is_named),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
