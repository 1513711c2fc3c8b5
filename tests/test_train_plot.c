/* Loss-curve PNG: read the picture back with libpng and probe pixels where
 * the data must (and must not) be drawn. */
#include "launch/plot.h"

#include <fcntl.h>
#include <math.h>
#include <png.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/test.h"

static uint32_t px_get(const uint8_t *rgb, int w, int x, int y)
{
    const uint8_t *p = rgb + ((size_t)y * (size_t)w + (size_t)x) * 3;
    return (uint32_t)p[0] << 16 | (uint32_t)p[1] << 8 | p[2];
}

static uint8_t *png_read_rgb(const char *path, int *w, int *h)
{
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_file(&img, path)) return NULL;
    img.format = PNG_FORMAT_RGB;
    uint8_t *buf = malloc(PNG_IMAGE_SIZE(img));
    if (!buf || !png_image_finish_read(&img, NULL, buf, 0, NULL)) {
        free(buf);
        png_image_free(&img);
        return NULL;
    }
    *w = (int)img.width;
    *h = (int)img.height;
    return buf;
}

/* Whether a pixel within 1 of (x, y) is close to rgb (antialiased edges
 * blend; a 2-pixel line has a pixel of its own colour at every point). */
static bool near_rgb(const uint8_t *img, int w, int h, int x, int y, uint32_t rgb)
{
    for (int dy = -1; dy <= 1; dy++)
        for (int dx = -1; dx <= 1; dx++) {
            int xx = x + dx, yy = y + dy;
            if (xx < 0 || yy < 0 || xx >= w || yy >= h) continue;
            uint32_t p = px_get(img, w, xx, yy);
            int d = 0;
            for (int k = 0; k < 24; k += 8) d += abs((int)(p >> k & 0xFF) - (int)(rgb >> k & 0xFF));
            if (d < 60) return true;
        }
    return false;
}

/* dark pixels (text, axes) in the box [x0, x1) x [y0, y1) */
static int dark_in(const uint8_t *img, int w, int x0, int x1, int y0, int y1)
{
    int n = 0;
    for (int y = y0; y < y1; y++)
        for (int x = x0; x < x1; x++) {
            uint32_t p = px_get(img, w, x, y);
            n += (p >> 16 & 0xFF) + (p >> 8 & 0xFF) + (p & 0xFF) < 200;
        }
    return n;
}

static char *tmp_png(void)
{
    static char path[64];
    snprintf(path, sizeof path, "/tmp/test_plot_XXXXXX");
    int fd = mkostemp(path, O_CLOEXEC);
    if (fd < 0) return NULL;
    close(fd);
    return path;
}

static void test_train_plot_png(void)
{
    char *path = tmp_png();
    REQUIRE(path);
    /* a straight falling line from (1, 5) to (101, 1) and two val points */
    double x[101], y[101];
    for (int i = 0; i < 101; i++) { x[i] = 1 + i; y[i] = 5.0 - 4.0 * i / 100.0; }
    double vx[2] = {51, 101}, vy[2] = {3.5, 1.5};
    plot_series_t s[2] = {{x, y, 101, "training loss", PLOT_RGB_TRAIN, false},
                          {vx, vy, 2, "validation loss", PLOT_RGB_VAL, true}};
    plot_opts_t o = {.width = 640, .height = 400, .title = "loss", .xlabel = "step", .ylabel = "loss"};
    REQUIRE(plot_png(path, s, 2, &o) == BT_OK);

    int w = 0, h = 0;
    uint8_t *rgb = png_read_rgb(path, &w, &h);
    REQUIRE(rgb);
    CHECK(w == 640 && h == 400);
    plot_frame_t f = plot_frame(s, 2, &o);
    CHECK(f.x0 == 1 && f.x1 == 101 && fabs(f.y0 - (1 - 0.16)) < 1e-12 && fabs(f.y1 - (5 + 0.16)) < 1e-12);
    /* every data point of the training line is blue, but where the legend
     * box (top right) covers the line's start */
    int blue = 0;
    for (int i = 0; i < 101; i++) {
        int px, py;
        plot_frame_map(&f, x[i], y[i], &px, &py);
        blue += near_rgb(rgb, w, h, px, py, PLOT_RGB_TRAIN);
    }
    CHECK_MSG(blue == 101, "%d of 101 points blue", blue);
    /* above and below the line: no blue */
    int px, py;
    plot_frame_map(&f, 21, 4.2 + 1.0, &px, &py);
    CHECK(!near_rgb(rgb, w, h, px, py, PLOT_RGB_TRAIN));
    plot_frame_map(&f, 21, 4.2 - 1.0, &px, &py);
    CHECK(!near_rgb(rgb, w, h, px, py, PLOT_RGB_TRAIN));
    /* validation points red, the frame black */
    plot_frame_map(&f, 51, 3.5, &px, &py);
    CHECK(near_rgb(rgb, w, h, px, py, PLOT_RGB_VAL));
    CHECK(near_rgb(rgb, w, h, f.left - 1, (f.top + f.bottom) / 2, PLOT_RGB_AXIS));
    CHECK(near_rgb(rgb, w, h, (f.left + f.right) / 2, f.bottom + 1, PLOT_RGB_AXIS));
    /* tick labels left of the y axis and under the x axis, the axis titles,
     * the title, and a legend with both colours in the top right corner */
    CHECK(dark_in(rgb, w, 24, f.left - 8, f.top, f.bottom) > 100);
    CHECK(dark_in(rgb, w, f.left, f.right, f.bottom + 8, f.bottom + 24) > 100);
    CHECK(dark_in(rgb, w, 0, 22, f.top, f.bottom) > 20);         /* "loss", rotated */
    CHECK(dark_in(rgb, w, f.left, f.right, h - 22, h) > 20);      /* "step" */
    CHECK(dark_in(rgb, w, 0, w, 0, f.top - 8) > 20);              /* the title */
    int leg_blue = 0, leg_red = 0;
    for (int yy = f.top; yy < f.top + 60; yy++)
        for (int xx = f.right - 200; xx < f.right; xx++) {
            leg_blue += px_get(rgb, w, xx, yy) == PLOT_RGB_TRAIN;
            leg_red += px_get(rgb, w, xx, yy) == PLOT_RGB_VAL;
        }
    CHECK_MSG(leg_blue > 10 && leg_red > 10, "legend: %d blue, %d red pixels", leg_blue, leg_red);
    free(rgb);
    unlink(path);
}

/* A logarithmic y axis: equal ratios are equal distances. */
static void test_train_plot_log(void)
{
    char *path = tmp_png();
    REQUIRE(path);
    double x[3] = {1, 2, 3}, y[3] = {100, 10, 1};
    plot_series_t s = {x, y, 3, "loss", PLOT_RGB_TRAIN, false};
    plot_opts_t o = {.log_y = true};
    REQUIRE(plot_png(path, &s, 1, &o) == BT_OK);
    plot_frame_t f = plot_frame(&s, 1, &o);
    int x0, y0, x1, y1, x2, y2;
    plot_frame_map(&f, 1, 100, &x0, &y0);
    plot_frame_map(&f, 2, 10, &x1, &y1);
    plot_frame_map(&f, 3, 1, &x2, &y2);
    CHECK(y0 > f.top && y0 < f.top + 30 && y2 < f.bottom && y2 > f.bottom - 30);
    CHECK_MSG(abs((y1 - y0) - (y2 - y1)) <= 1, "%d %d %d", y0, y1, y2);
    int w, h;
    uint8_t *rgb = png_read_rgb(path, &w, &h);
    REQUIRE(rgb);
    CHECK(w == 800 && h == 500);
    CHECK(near_rgb(rgb, w, h, x1, y1, PLOT_RGB_TRAIN));
    free(rgb);
    unlink(path);
}

static void test_train_plot_bad_path(void)
{
    double x = 1, y = 1;
    plot_series_t tr = {&x, &y, 1, NULL, PLOT_RGB_TRAIN, false};
    CHECK(plot_png("/nonexistent/dir/loss.png", &tr, 1, NULL) == BT_ERR_IO);
}

int main(int argc, char **argv)
{
    TEST_RUN(argc, argv, test_train_plot_png, test_train_plot_log, test_train_plot_bad_path);
}
