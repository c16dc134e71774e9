/* SPDX-License-Identifier: MIT */
/*  Training curves (SPEC B4; examples/curves.h): the CSV holds every point
    as soon as it is added, also after the process is killed; the PNG reads
    back (with cairo) as an image of the expected size with the lines where
    the points are; a redraw replaces the file whole; a file that cannot be
    written is named. KEEP=1 leaves the files in /tmp/zdist_curves* to look
    at. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <cairo.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <dirent.h>

#include <zdist/error.h>
#include "examples/curves.h"

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

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = 0;
    fclose(f);
    return buf;
}

/*  The PNG read back by cairo: a valid file of the plot's size. */
static cairo_surface_t *png_read(const char *path)
{
    cairo_surface_t *s = cairo_image_surface_create_from_png(path);
    assert_int_equal(cairo_surface_status(s), CAIRO_STATUS_SUCCESS);
    assert_int_equal(cairo_image_surface_get_width(s), CURVES_PNG_WIDTH);
    assert_int_equal(cairo_image_surface_get_height(s), CURVES_PNG_HEIGHT);
    return s;
}

static void pixel(cairo_surface_t *s, int x, int y, int rgb[3])
{
    cairo_surface_flush(s);
    const unsigned char *d = cairo_image_surface_get_data(s);
    uint32_t v;
    memcpy(&v, d + (size_t)y * (size_t)cairo_image_surface_get_stride(s) + 4 * (size_t)x, 4);
    rgb[0] = (int)(v >> 16 & 255), rgb[1] = (int)(v >> 8 & 255), rgb[2] = (int)(v & 255);
}

/*  Whether a pixel within 1 of (x, y) is close to colour c. */
static bool near_color(cairo_surface_t *s, double x, double y, const int c[3])
{
    for (int dy = -1; dy <= 1; dy++)
        for (int dx = -1; dx <= 1; dx++) {
            int p[3];
            pixel(s, (int)x + dx, (int)y + dy, p);
            if (abs(p[0] - c[0]) + abs(p[1] - c[1]) + abs(p[2] - c[2]) < 60)
                return true;
        }
    return false;
}

static const int blue[3] = {31, 119, 180}, orange[3] = {255, 127, 14}, green[3] = {44, 160, 44};

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

/*  Every row is in the file once added, before the curves are closed. */
static void test_csv_rows_as_points_come(void **state)
{
    (void)state;
    char prefix[256], path[300];
    snprintf(prefix, sizeof prefix, "%s/rows", dir);
    curves_t *c = curves_open(prefix, "rows", 100);
    assert_non_null(c);
    snprintf(path, sizeof path, "%s.csv", prefix);
    char *csv = read_all(path);
    assert_string_equal(csv, "batch,epoch,loss,samples_per_s,test_accuracy\n");
    free(csv);
    assert_int_equal(curves_add(c, 50, 2.25, 1000), 0);
    assert_int_equal(curves_add(c, 100, 1.5, NAN), 0); /* end of epoch 1 */
    assert_int_equal(curves_add(c, 150, NAN, 1200.5), 0);
    csv = read_all(path);
    assert_string_equal(csv,
                        "batch,epoch,loss,samples_per_s,test_accuracy\n"
                        "50,1,2.25,1000,\n"
                        "100,1,1.5,,\n"
                        "150,2,,1200.5,\n");
    free(csv);
    assert_int_equal(curves_add_accuracy(c, 150, 0.8931), 0);
    csv = read_all(path);
    assert_non_null(strstr(csv, "150,2,,1200.5,\n150,2,,,0.8931\n"));
    free(csv);
    curves_close(c);
    /* The evaluation drew the plot. */
    snprintf(path, sizeof path, "%s.png", prefix);
    cairo_surface_destroy(png_read(path));
}

/*  A run killed in the middle keeps its points and its last plot. */
static void test_killed_run_keeps_its_points(void **state)
{
    (void)state;
    char prefix[256], path[300];
    snprintf(prefix, sizeof prefix, "%s/killed", dir);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        curves_t *c = curves_open(prefix, "killed", 10);
        for (int b = 5; c && b <= 30; b += 5)
            if (curves_add(c, b, 1.0 / b, 100.0 * b) < 0)
                _exit(1);
        if (!c || curves_add_accuracy(c, 30, 0.5) < 0 || curves_add(c, 35, 0.01, 3500) < 0)
            _exit(1);
        raise(SIGKILL); /* no close, no exit handlers */
        _exit(2);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    snprintf(path, sizeof path, "%s.csv", prefix);
    char *csv = read_all(path);
    assert_int_equal(count_lines(csv), 1 + 6 + 1 + 1);
    assert_non_null(strstr(csv, "\n30,3,0.0333333,3000,\n30,3,,,0.5\n35,4,0.01,3500,\n"));
    free(csv);
    snprintf(path, sizeof path, "%s.png", prefix);
    cairo_surface_destroy(png_read(path));
}

/*  A known series: each panel's line passes through its points and not
    far above them; the accuracy panel comes with the first evaluation. */
static void test_plot_has_the_lines_where_the_points_are(void **state)
{
    (void)state;
    char prefix[256], path[300];
    snprintf(prefix, sizeof prefix, "%s/plot", dir);
    curves_t *c = curves_open(prefix, "known series", 500);
    assert_non_null(c);
    for (int b = 20; b <= 1500; b += 20)
        assert_int_equal(curves_add(c, b, 2.3 * exp(-b / 300.0), 900 + b / 10.0), 0);
    double x, y;
    assert_int_equal(curves_locate(c, CURVES_ACCURACY, 500, 0.8, &x, &y), -1);
    assert_int_equal(curves_draw(c), 0);
    for (int b = 500; b <= 1500; b += 500)
        assert_int_equal(curves_add_accuracy(c, b, 0.7 + b / 10000.0), 0);
    snprintf(path, sizeof path, "%s.png", prefix);
    cairo_surface_t *s = png_read(path);

    int bg[3];
    pixel(s, 2, 2, bg);
    assert_true(bg[0] == 255 && bg[1] == 255 && bg[2] == 255);
    const int64_t at[] = {100, 400, 700, 1000};
    for (int i = 0; i < 4; i++) {
        int64_t b = at[i];
        double loss = 2.3 * exp(-(double)b / 300.0), speed = 900 + (double)b / 10.0;
        assert_int_equal(curves_locate(c, CURVES_LOSS, b, loss, &x, &y), 0);
        assert_true(near_color(s, x, y, blue));
        assert_false(near_color(s, x, y - 25, blue));
        assert_int_equal(curves_locate(c, CURVES_SPEED, b, speed, &x, &y), 0);
        assert_true(near_color(s, x, y, green));
        assert_false(near_color(s, x, y - 25, green));
    }
    /* The throughput axis starts at zero: 1000 samples/s sits near the
       middle of the panel, 0 at its bottom. */
    double y0, y1000;
    assert_int_equal(curves_locate(c, CURVES_SPEED, 0, 0, &x, &y0), 0);
    assert_int_equal(curves_locate(c, CURVES_SPEED, 0, 1000, &x, &y1000), 0);
    assert_true(y0 - y1000 > 50);
    /* The accuracy line between its evaluations. */
    assert_int_equal(curves_locate(c, CURVES_ACCURACY, 750, 0.775, &x, &y), 0);
    assert_true(near_color(s, x, y, orange));
    assert_false(near_color(s, x, y - 25, orange));
    cairo_surface_destroy(s);
    curves_close(c);

    /* No temporary file is left beside the PNG. */
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)))
        assert_null(strstr(e->d_name, ".tmp"));
    closedir(d);
}

/*  A redraw replaces the PNG by rename: a reader that had the old file
    open still reads a whole PNG, and the path is a new file. */
static void test_redraw_replaces_the_file_whole(void **state)
{
    (void)state;
    char prefix[256], path[300];
    snprintf(prefix, sizeof prefix, "%s/atomic", dir);
    curves_t *c = curves_open(prefix, "atomic", 0);
    assert_int_equal(curves_add(c, 10, 1, 10), 0);
    assert_int_equal(curves_add_accuracy(c, 10, 0.5), 0);
    snprintf(path, sizeof path, "%s.png", prefix);
    struct stat before, after;
    assert_int_equal(stat(path, &before), 0);
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(curves_add(c, 20, 0.5, 20), 0);
    assert_int_equal(curves_add_accuracy(c, 20, 0.6), 0);
    assert_int_equal(stat(path, &after), 0);
    assert_true(before.st_ino != after.st_ino);
    char *old = malloc((size_t)before.st_size);
    assert_int_equal(pread(fd, old, (size_t)before.st_size, 0), before.st_size);
    assert_memory_equal(old, "\x89PNG\r\n\x1a\n", 8);
    assert_memory_equal(old + before.st_size - 8, "IEND", 4);
    free(old);
    close(fd);
    curves_close(c);
}

/*  Points in any order, one of them far out, others unknown: drawn at
    once, within the canvas. */
static void test_points_in_any_order(void **state)
{
    (void)state;
    char prefix[256], path[300];
    snprintf(prefix, sizeof prefix, "%s/odd", dir);
    curves_t *c = curves_open(prefix, "odd", 7);
    const int64_t batches[] = {100, 0, 200000000, 101, 5};
    for (int i = 0; i < 5; i++)
        assert_int_equal(curves_add(c, batches[i],
                                    i == 2       ? 1e30
                                        : i == 4 ? NAN
                                                 : 1.0 / (1 + i),
                                    i == 3 ? INFINITY : 10.0 * i),
                         0);
    assert_int_equal(curves_draw(c), 0);
    curves_close(c);
    snprintf(path, sizeof path, "%s.png", prefix);
    cairo_surface_destroy(png_read(path));
}

static void test_unwritable_path_is_named(void **state)
{
    (void)state;
    assert_null(curves_open("/nonexistent/dir/run", "x", 0));
    assert_non_null(strstr(zd_error_last(), "/nonexistent/dir/run.csv"));
    /* A PNG that cannot replace what is there (a directory): named, and
       its temporary file removed. */
    char prefix[256], path[300];
    snprintf(prefix, sizeof prefix, "%s/blocked", dir);
    snprintf(path, sizeof path, "%s.png", prefix);
    assert_int_equal(mkdir(path, 0700), 0);
    curves_t *c = curves_open(prefix, "x", 0);
    assert_non_null(c);
    assert_int_equal(curves_add(c, 1, 1, 1), 0);
    assert_int_equal(curves_draw(c), -1);
    assert_non_null(strstr(zd_error_last(), path));
    curves_close(c);
    DIR *d = opendir(dir);
    struct dirent *e;
    while ((e = readdir(d)))
        assert_null(strstr(e->d_name, ".tmp"));
    closedir(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_csv_rows_as_points_come),
        cmocka_unit_test(test_killed_run_keeps_its_points),
        cmocka_unit_test(test_plot_has_the_lines_where_the_points_are),
        cmocka_unit_test(test_redraw_replaces_the_file_whole),
        cmocka_unit_test(test_points_in_any_order),
        cmocka_unit_test(test_unwritable_path_is_named),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
