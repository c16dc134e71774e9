/* SPDX-License-Identifier: MIT */
/*  The training programs' progress line (examples/progress.h), on a fake
    clock: when a line comes, what it says (epoch, batch across epochs,
    rate of the last interval, mean loss, time left), resumed runs, and the
    in-place line of a terminal. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "examples/progress.h"

typedef struct {
    FILE *f;
    char *buf;
    size_t len;
} sink_t;

static void sink_open(sink_t *s)
{
    s->buf = NULL;
    s->len = 0;
    s->f = open_memstream(&s->buf, &s->len);
    assert_non_null(s->f);
}

/*  What was written so far (the stream stays open). */
static const char *sink_text(sink_t *s)
{
    fflush(s->f);
    return s->buf;
}

static void sink_close(sink_t *s)
{
    fclose(s->f);
    free(s->buf);
}

static int count(const char *s, const char *what)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, what)); p += strlen(what))
        n++;
    return n;
}

static void test_duration(void **state)
{
    (void)state;
    char b[32];
    assert_string_equal(progress_duration(0, b, sizeof b), "0s");
    assert_string_equal(progress_duration(42.4, b, sizeof b), "42s");
    assert_string_equal(progress_duration(59.6, b, sizeof b), "1m00s");
    assert_string_equal(progress_duration(187, b, sizeof b), "3m07s");
    assert_string_equal(progress_duration(7500, b, sizeof b), "2h05m");
    assert_string_equal(progress_duration(NAN, b, sizeof b), "?");
    assert_string_equal(progress_duration(-1, b, sizeof b), "?");
}

/*  120 batches of 32 in 3 epochs of 40, a line every 5 s: the first 20
    batches take 0.25 s each, the next ones 0.5 s. */
static void test_lines_on_a_fake_clock(void **state)
{
    (void)state;
    sink_t s;
    sink_open(&s);
    progress_t p;
    progress_config_t c = {.label = "Rank 1",
                           .total = 120,
                           .per_epoch = 40,
                           .epochs = 3,
                           .samples_per_step = 32,
                           .every_s = 5};
    double t = 100;
    progress_init(&p, s.f, false, &c, t);
    for (int i = 1; i <= 19; i++)
        progress_step(&p, t += 0.25, i);
    assert_int_equal(s.len, 0); /* 4.75 s: nothing yet */
    progress_step(&p, t += 0.25, 20);
    assert_string_equal(sink_text(&s),
                        "Rank 1 epoch 1/3 batch 20/120 16% 128 samples/s "
                        "loss(avg) 10.5000 elapsed 5s left 25s\n");
    /* Slower: the rate is the last interval's, the time left the run's
       average; the loss is the mean since the previous line. */
    for (int i = 21; i <= 30; i++)
        progress_step(&p, t += 0.5, i);
    assert_string_equal(sink_text(&s) +
                            strlen("Rank 1 epoch 1/3 batch 20/120 16% 128 samples/s "
                                   "loss(avg) 10.5000 elapsed 5s left 25s\n"),
                        "Rank 1 epoch 1/3 batch 30/120 25% 64 samples/s loss(avg) 25.5000 "
                        "elapsed 10s left 30s\n");
    /* The batch counts across epochs: batch 41 is in epoch 2. */
    for (int i = 31; i <= 50; i++)
        progress_step(&p, t += 0.5, 1.0);
    assert_non_null(strstr(sink_text(&s),
                           "Rank 1 epoch 1/3 batch 40/120 33% 64 samples/s "
                           "loss(avg) 1.0000 elapsed 15s left 30s\n"
                           "Rank 1 epoch 2/3 batch 50/120 41% 64 samples/s "
                           "loss(avg) 1.0000 elapsed 20s left 28s\n"));
    assert_int_equal(count(s.buf, "\n"), 4);
    /* An evaluation of 3 s is left out of the rate, not of the time left. */
    progress_skip(&p, 3);
    t += 3;
    for (int i = 51; i <= 60; i++)
        progress_step(&p, t += 0.5, 1.0);
    assert_non_null(strstr(sink_text(&s),
                           "Rank 1 epoch 2/3 batch 60/120 50% 64 samples/s "
                           "loss(avg) 1.0000 elapsed 28s left 28s\n"));
    assert_null(strchr(s.buf, '\r'));
    progress_end(&p, t); /* into a file: nothing more */
    assert_int_equal(count(sink_text(&s), "\n"), 5);
    sink_close(&s);
}

/*  A run resumed after 40 batches counts from 40 and its time left comes
    from its own batches only. */
static void test_resumed_run(void **state)
{
    (void)state;
    sink_t s;
    sink_open(&s);
    progress_t p;
    progress_config_t c = {.label = "Rank 2",
                           .first = 40,
                           .total = 120,
                           .per_epoch = 40,
                           .epochs = 3,
                           .samples_per_step = 32,
                           .every_s = 5};
    double t = 0;
    progress_init(&p, s.f, false, &c, t);
    for (int i = 0; i < 20; i++)
        progress_step(&p, t += 0.25, 2.0);
    assert_string_equal(sink_text(&s),
                        "Rank 2 epoch 2/3 batch 60/120 50% 128 samples/s "
                        "loss(avg) 2.0000 elapsed 5s left 15s\n");
    sink_close(&s);
}

/*  No total, no epochs, no loss (ps_sync_async's driver): just what is
    known; every_s 0: silent. */
static void test_what_is_unknown_is_left_out(void **state)
{
    (void)state;
    sink_t s;
    sink_open(&s);
    progress_t p;
    progress_config_t c = {.unit = "iteration", .samples_per_step = 256, .every_s = 1};
    double t = 0;
    progress_init(&p, s.f, false, &c, t);
    for (int i = 0; i < 4; i++)
        progress_step(&p, t += 0.25, NAN);
    assert_string_equal(sink_text(&s), "iteration 4 1024 samples/s elapsed 1s\n");
    progress_config_t off = {.total = 10, .every_s = 0};
    progress_init(&p, s.f, true, &off, 0);
    for (int i = 0; i < 10; i++)
        progress_step(&p, 100.0 * i, 1);
    progress_clear(&p);
    progress_end(&p, 1000);
    assert_string_equal(sink_text(&s), "iteration 4 1024 samples/s elapsed 1s\n");
    sink_close(&s);
}

/*  On a terminal: one line, rewritten in place; cleared before other
    output and drawn again at the next step without starting a new interval;
    left on screen at the end. */
static void test_terminal_line(void **state)
{
    (void)state;
    sink_t s;
    sink_open(&s);
    progress_t p;
    progress_config_t c = {
        .label = "train_local", .total = 100, .samples_per_step = 10, .every_s = 1};
    double t = 0;
    progress_init(&p, s.f, true, &c, t);
    for (int i = 0; i < 8; i++)
        progress_step(&p, t += 0.25, 0.5);
    assert_string_equal(sink_text(&s),
                        "\rtrain_local batch 4/100 4% 40 samples/s loss(avg) 0.5000 elapsed 1s "
                        "left 24s\033[K"
                        "\rtrain_local batch 8/100 8% 40 samples/s loss(avg) 0.5000 elapsed 2s "
                        "left 23s\033[K");
    size_t before = s.len;
    progress_clear(&p);
    assert_string_equal(sink_text(&s) + before, "\r\033[K");
    fprintf(s.f, "a line of its own\n");
    before = s.len + strlen("a line of its own\n");
    progress_step(&p, t += 0.25, 0.5); /* drawn again at once, same interval */
    assert_string_equal(sink_text(&s) + before,
                        "\rtrain_local batch 9/100 9% 40 samples/s loss(avg) 0.5000 elapsed 2s "
                        "left 23s\033[K");
    before = s.len;
    progress_step(&p, t += 0.25, 0.5); /* 2.5 s: not yet */
    progress_step(&p, t += 0.25, 0.5); /* 2.75 s */
    assert_int_equal(s.len, before);
    progress_end(&p, t += 0.25);
    assert_string_equal(sink_text(&s) + before,
                        "\rtrain_local batch 11/100 11% 30 samples/s loss(avg) 0.5000 elapsed 3s "
                        "left 24s\033[K\n");
    assert_int_equal(count(s.buf, "\n"), 2);
    sink_close(&s);
}

/*  A line longer than the buffer is cut, not overrun. */
static void test_long_label_is_cut(void **state)
{
    (void)state;
    progress_t p;
    char label[200], buf[40];
    memset(label, 'x', sizeof label - 1);
    label[sizeof label - 1] = 0;
    progress_config_t c = {.label = label, .total = 10, .every_s = 1};
    progress_init(&p, stdout, false, &c, 0);
    progress_format(&p, 1, buf, sizeof buf);
    assert_int_equal(strlen(buf), sizeof buf - 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_duration),      cmocka_unit_test(test_lines_on_a_fake_clock),
        cmocka_unit_test(test_resumed_run),   cmocka_unit_test(test_what_is_unknown_is_left_out),
        cmocka_unit_test(test_terminal_line), cmocka_unit_test(test_long_label_is_cut),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
