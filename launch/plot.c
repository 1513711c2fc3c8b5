#include "launch/plot.h"

#include <errno.h>
#include <math.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

typedef struct {
    int w, h;
    uint8_t *rgb;  /* [h][w][3] */
} canvas_t;

static void px_set(canvas_t *c, int x, int y, uint32_t rgb)
{
    if (x < 0 || y < 0 || x >= c->w || y >= c->h) return;
    uint8_t *p = c->rgb + ((size_t)y * (size_t)c->w + (size_t)x) * 3;
    p[0] = (uint8_t)(rgb >> 16);
    p[1] = (uint8_t)(rgb >> 8);
    p[2] = (uint8_t)rgb;
}

/* Bresenham, both endpoints included. */
static void line_draw(canvas_t *c, int x0, int y0, int x1, int y1, uint32_t rgb)
{
    int dx = abs(x1 - x0), sx = x0 < x1 ? 1 : -1;
    int dy = -abs(y1 - y0), sy = y0 < y1 ? 1 : -1;
    int e = dx + dy;
    for (;;) {
        px_set(c, x0, y0, rgb);
        if (x0 == x1 && y0 == y1) break;
        int e2 = 2 * e;
        if (e2 >= dy) { e += dy; x0 += sx; }
        if (e2 <= dx) { e += dx; y0 += sy; }
    }
}

/* 3x5 glyphs, one row per 3 low bits (bit 2 = left column), top row first. */
static const char glyph_chars[] = "0123456789.-e+";
static const uint8_t glyphs[][5] = {
    {7, 5, 5, 5, 7}, {2, 6, 2, 2, 7}, {7, 1, 7, 4, 7}, {7, 1, 7, 1, 7}, {5, 5, 7, 1, 1},
    {7, 4, 7, 1, 7}, {7, 4, 7, 5, 7}, {7, 1, 1, 1, 1}, {7, 5, 7, 5, 7}, {7, 5, 7, 1, 7},
    {0, 0, 0, 0, 2}, {0, 0, 7, 0, 0}, {0, 7, 5, 6, 3}, {0, 2, 7, 2, 0},
};
_Static_assert(sizeof glyphs / sizeof glyphs[0] == sizeof glyph_chars - 1, "one glyph per char");

#define FONT_SCALE 2
/* Width in pixels of text drawn by text_draw. */
static int text_width(const char *s) { return (int)strlen(s) * 4 * FONT_SCALE; }

static void text_draw(canvas_t *c, int x, int y, const char *s, uint32_t rgb)
{
    for (; *s; s++, x += 4 * FONT_SCALE) {
        const char *g = strchr(glyph_chars, *s);
        if (!g) continue;
        const uint8_t *rows = glyphs[g - glyph_chars];
        for (int r = 0; r < 5; r++)
            for (int col = 0; col < 3; col++)
                if (rows[r] & (4 >> col))
                    for (int dy = 0; dy < FONT_SCALE; dy++)
                        for (int dx = 0; dx < FONT_SCALE; dx++)
                            px_set(c, x + col * FONT_SCALE + dx, y + r * FONT_SCALE + dy, rgb);
    }
}

static void range_update(const plot_series_t *s, double *x0, double *x1, double *y0, double *y1)
{
    if (!s) return;
    for (int i = 0; i < s->n; i++) {
        if (!isfinite(s->x[i]) || !isfinite(s->y[i])) continue;
        if (s->x[i] < *x0) *x0 = s->x[i];
        if (s->x[i] > *x1) *x1 = s->x[i];
        if (s->y[i] < *y0) *y0 = s->y[i];
        if (s->y[i] > *y1) *y1 = s->y[i];
    }
}

plot_frame_t plot_frame(const plot_series_t *train, const plot_series_t *val, const plot_opts_t *opts)
{
    int w = opts && opts->width ? opts->width : 640;
    int h = opts && opts->height ? opts->height : 400;
    int m = opts && opts->margin ? opts->margin : 40;
    plot_frame_t f = {.x0 = INFINITY, .x1 = -INFINITY, .y0 = INFINITY, .y1 = -INFINITY,
                      .left = m + 24, .right = w - m, .top = m, .bottom = h - m};
    range_update(train, &f.x0, &f.x1, &f.y0, &f.y1);
    range_update(val, &f.x0, &f.x1, &f.y0, &f.y1);
    if (!(f.x0 <= f.x1)) { f.x0 = 0; f.x1 = 1; }
    if (!(f.y0 <= f.y1)) { f.y0 = 0; f.y1 = 1; }
    if (f.x1 == f.x0) f.x1 = f.x0 + 1;
    if (f.y1 == f.y0) { f.y0 -= 0.5; f.y1 += 0.5; }
    return f;
}

void plot_frame_map(const plot_frame_t *f, double x, double y, int *px, int *py)
{
    *px = f->left + (int)lround((x - f->x0) / (f->x1 - f->x0) * (f->right - f->left));
    *py = f->bottom - (int)lround((y - f->y0) / (f->y1 - f->y0) * (f->bottom - f->top));
}

static bt_status_t png_save(const char *path, const canvas_t *c)
{
    FILE *fp = fopen(path, "wbe");
    if (!fp) {
        log_error("plot: cannot create %s: %s", path, strerror(errno));
        return BT_ERR_IO;
    }
    bt_status_t st = BT_ERR_IO;
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!png || !info) {
        st = BT_ERR_NOMEM;
        goto out_png;
    }
    if (setjmp(png_jmpbuf(png))) {
        log_error("plot: libpng failed writing %s", path);
        goto out_png;
    }
    png_init_io(png, fp);
    png_set_IHDR(png, info, (png_uint_32)c->w, (png_uint_32)c->h, 8, PNG_COLOR_TYPE_RGB,
                 PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    for (int y = 0; y < c->h; y++) png_write_row(png, c->rgb + (size_t)y * (size_t)c->w * 3);
    png_write_end(png, NULL);
    st = BT_OK;
out_png:
    png_destroy_write_struct(&png, &info);
    if (fclose(fp) != 0 && st == BT_OK) {
        log_error("plot: writing %s: %s", path, strerror(errno));
        st = BT_ERR_IO;
    }
    return st;
}

bt_status_t plot_loss_png(const char *path, const plot_series_t *train, const plot_series_t *val,
                          const plot_opts_t *opts)
{
    plot_frame_t f = plot_frame(train, val, opts);
    canvas_t c = {.w = opts && opts->width ? opts->width : 640,
                  .h = opts && opts->height ? opts->height : 400};
    c.rgb = malloc((size_t)c.w * (size_t)c.h * 3);
    if (!c.rgb) return BT_ERR_NOMEM;
    memset(c.rgb, 0xFF, (size_t)c.w * (size_t)c.h * 3);

    /* axes: left and bottom edge of the plot area, ticks every tenth */
    line_draw(&c, f.left - 1, f.top, f.left - 1, f.bottom + 1, PLOT_RGB_AXIS);
    line_draw(&c, f.left - 1, f.bottom + 1, f.right, f.bottom + 1, PLOT_RGB_AXIS);
    for (int i = 0; i <= 10; i++) {
        int x = f.left + (f.right - f.left) * i / 10, y = f.bottom - (f.bottom - f.top) * i / 10;
        line_draw(&c, x, f.bottom + 2, x, f.bottom + 5, PLOT_RGB_AXIS);
        line_draw(&c, f.left - 5, y, f.left - 2, y, PLOT_RGB_AXIS);
    }
    char label[32];
    snprintf(label, sizeof label, "%.3g", f.y1);
    text_draw(&c, 4, f.top - 5, label, PLOT_RGB_TEXT);
    snprintf(label, sizeof label, "%.3g", f.y0);
    text_draw(&c, 4, f.bottom - 5, label, PLOT_RGB_TEXT);
    snprintf(label, sizeof label, "%.0f", f.x0);
    text_draw(&c, f.left, f.bottom + 10, label, PLOT_RGB_TEXT);
    snprintf(label, sizeof label, "%.0f", f.x1);
    text_draw(&c, f.right - text_width(label), f.bottom + 10, label, PLOT_RGB_TEXT);

    int px = 0, py = 0, have_prev = 0;
    for (int i = 0; i < train->n; i++) {
        if (!isfinite(train->y[i])) { have_prev = 0; continue; }
        int x, y;
        plot_frame_map(&f, train->x[i], train->y[i], &x, &y);
        if (have_prev) line_draw(&c, px, py, x, y, PLOT_RGB_TRAIN);
        else px_set(&c, x, y, PLOT_RGB_TRAIN);
        px = x; py = y; have_prev = 1;
    }
    for (int i = 0; val && i < val->n; i++) {
        if (!isfinite(val->y[i])) continue;
        int x, y;
        plot_frame_map(&f, val->x[i], val->y[i], &x, &y);
        for (int dy = -2; dy <= 2; dy++) line_draw(&c, x - 2, y + dy, x + 2, y + dy, PLOT_RGB_VAL);
    }
    bt_status_t st = png_save(path, &c);
    free(c.rgb);
    return st;
}

void plot_curve_push(plot_curve_t *c, double x, double y)
{
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 256;
        double *nx = realloc(c->x, (size_t)cap * sizeof *nx);
        if (!nx) return;
        c->x = nx;
        double *ny = realloc(c->y, (size_t)cap * sizeof *ny);
        if (!ny) return;
        c->y = ny;
        c->cap = cap;
    }
    c->x[c->n] = x;
    c->y[c->n++] = y;
}

plot_series_t plot_curve_view(const plot_curve_t *c)
{
    return (plot_series_t){c->x, c->y, c->n};
}

void plot_curve_free(plot_curve_t *c)
{
    free(c->x);
    free(c->y);
    *c = (plot_curve_t){0};
}
