/* Loss-curve PNG: read the picture back with libpng and probe pixels where
 * the data must (and must not) be drawn. */
#include "launch/plot.h"

#include <fcntl.h>
#include <png.h>
#include <stdio.h>
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

static void test_train_plot_png(void)
{
    char path[] = "/tmp/test_plot_XXXXXX";
    int fd = mkostemp(path, O_CLOEXEC);
    REQUIRE(fd >= 0);
    close(fd);
    /* a straight falling line from (1, 5) to (101, 1) and two val points */
    double x[101], y[101];
    for (int i = 0; i < 101; i++) { x[i] = 1 + i; y[i] = 5.0 - 4.0 * i / 100.0; }
    double vx[2] = {51, 101}, vy[2] = {3.5, 1.5};
    plot_series_t tr = {x, y, 101}, va = {vx, vy, 2};
    plot_opts_t o = {.width = 320, .height = 200};
    REQUIRE(plot_loss_png(path, &tr, &va, &o) == BT_OK);

    int w = 0, h = 0;
    uint8_t *rgb = png_read_rgb(path, &w, &h);
    REQUIRE(rgb);
    CHECK(w == 320 && h == 200);
    plot_frame_t f = plot_frame(&tr, &va, &o);
    CHECK(f.x0 == 1 && f.x1 == 101 && f.y0 == 1 && f.y1 == 5);
    /* every data point of the training line is blue */
    int blue = 0;
    for (int i = 0; i < 101; i++) {
        int px, py;
        plot_frame_map(&f, x[i], y[i], &px, &py);
        blue += px_get(rgb, w, px, py) == PLOT_RGB_TRAIN;
    }
    CHECK_MSG(blue == 101, "%d of 101 points blue", blue);
    /* above and below the line, away from the validation squares: background */
    int px, py;
    plot_frame_map(&f, 21, 4.2 + 1.0, &px, &py);
    CHECK(px_get(rgb, w, px, py) == PLOT_RGB_BG);
    plot_frame_map(&f, 21, 4.2 - 1.0, &px, &py);
    CHECK(px_get(rgb, w, px, py) == PLOT_RGB_BG);
    /* validation points red, axes black */
    plot_frame_map(&f, 51, 3.5, &px, &py);
    CHECK(px_get(rgb, w, px, py) == PLOT_RGB_VAL);
    CHECK(px_get(rgb, w, f.left - 1, (f.top + f.bottom) / 2) == PLOT_RGB_AXIS);
    CHECK(px_get(rgb, w, (f.left + f.right) / 2, f.bottom + 1) == PLOT_RGB_AXIS);
    /* some label text exists left of the y axis */
    int text = 0;
    for (int yy = 0; yy < h; yy++)
        for (int xx = 0; xx < f.left - 6; xx++) text += px_get(rgb, w, xx, yy) == PLOT_RGB_TEXT;
    CHECK(text > 20);
    free(rgb);
    unlink(path);
}

static void test_train_plot_bad_path(void)
{
    double x = 1, y = 2;
    plot_series_t tr = {&x, &y, 1};
    CHECK(plot_loss_png("/nonexistent/dir/loss.png", &tr, NULL, NULL) == BT_ERR_IO);
}

int main(int argc, char **argv)
{
    TEST_RUN(argc, argv, test_train_plot_png, test_train_plot_bad_path);
}
