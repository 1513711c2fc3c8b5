/* The run's pictures with cairo (launch/plot.h). */
#include "launch/plot.h"

#include <cairo.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

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
    c->y[c->n] = y;
    c->n++;
}

plot_series_t plot_curve_view(const plot_curve_t *c, const char *label, uint32_t rgb, bool markers)
{
    return (plot_series_t){.x = c->x, .y = c->y, .n = c->n, .label = label, .rgb = rgb, .markers = markers};
}

void plot_curve_free(plot_curve_t *c)
{
    free(c->x);
    free(c->y);
    *c = (plot_curve_t){0};
}

/* The value as plotted: log10 on a log axis (NaN for what it cannot show). */
static double yval(double y, bool log_y) { return !log_y ? y : y > 0 ? log10(y) : NAN; }

plot_frame_t plot_frame(const plot_series_t *s, int n_series, const plot_opts_t *o)
{
    int w = o && o->width ? o->width : 800, h = o && o->height ? o->height : 500;
    bool log_y = o && o->log_y;
    plot_frame_t f = {.x0 = INFINITY, .x1 = -INFINITY, .y0 = INFINITY, .y1 = -INFINITY, .log_y = log_y,
                      .left = 76, .right = w - 20, .top = 40, .bottom = h - 52};
    for (int k = 0; k < n_series; k++)
        for (int i = 0; i < s[k].n; i++) {
            double x = s[k].x[i], y = yval(s[k].y[i], log_y);
            if (!isfinite(x) || !isfinite(y)) continue;
            if (x < f.x0) f.x0 = x;
            if (x > f.x1) f.x1 = x;
            if (y < f.y0) f.y0 = y;
            if (y > f.y1) f.y1 = y;
        }
    if (!(f.x0 <= f.x1)) f.x0 = 0, f.x1 = 1;
    if (!(f.y0 <= f.y1)) f.y0 = 0, f.y1 = 1;
    if (f.x1 == f.x0) f.x1 = f.x0 + 1;
    if (f.y1 == f.y0) f.y0 -= 0.5, f.y1 += 0.5;
    double pad = 0.04 * (f.y1 - f.y0); /* the curves clear the frame */
    f.y0 -= pad;
    f.y1 += pad;
    return f;
}

static void map_d(const plot_frame_t *f, double x, double y, double *px, double *py)
{
    *px = f->left + (x - f->x0) / (f->x1 - f->x0) * (f->right - f->left);
    *py = f->bottom - (y - f->y0) / (f->y1 - f->y0) * (f->bottom - f->top);
}

void plot_frame_map(const plot_frame_t *f, double x, double y, int *px, int *py)
{
    double dx, dy;
    map_d(f, x, yval(y, f->log_y), &dx, &dy);
    *px = (int)lround(dx);
    *py = (int)lround(dy);
}

static void rgb_set(cairo_t *cr, uint32_t rgb)
{
    cairo_set_source_rgb(cr, (rgb >> 16 & 0xFF) / 255.0, (rgb >> 8 & 0xFF) / 255.0, (rgb & 0xFF) / 255.0);
}

/* Round tick spacing: 1, 2 or 5 times a power of ten, about `want` ticks. */
static double tick_step(double lo, double hi, int want)
{
    double raw = (hi - lo) / want, p = pow(10, floor(log10(raw))), m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

static void tick_label(double v, double step, char *buf, size_t cap)
{
    if (fabs(v) < step * 1e-9) v = 0;
    double a = fabs(v);
    if (a >= 1e6 || (a > 0 && a < 1e-3)) snprintf(buf, cap, "%.2g", v);
    else if (step >= 1) snprintf(buf, cap, "%.0f", v);
    else snprintf(buf, cap, "%.*f", (int)ceil(-log10(step) - 1e-9), v);
}

static void text_at(cairo_t *cr, double x, double y, const char *s, double ax, double ay)
{
    cairo_text_extents_t e;
    cairo_text_extents(cr, s, &e);
    cairo_move_to(cr, x - e.x_bearing - ax * e.width, y - e.y_bearing - ay * e.height);
    cairo_show_text(cr, s);
}

static void axes_draw(cairo_t *cr, const plot_frame_t *f, const plot_opts_t *o, int w, int h)
{
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, 12);
    cairo_set_line_width(cr, 1);
    /* x ticks */
    double xs = tick_step(f->x0, f->x1, 8);
    for (double v = ceil(f->x0 / xs) * xs; v <= f->x1 + xs * 1e-9; v += xs) {
        double px, py;
        map_d(f, v, f->y0, &px, &py);
        rgb_set(cr, PLOT_RGB_GRID);
        cairo_move_to(cr, floor(px) + 0.5, f->top);
        cairo_line_to(cr, floor(px) + 0.5, f->bottom);
        cairo_stroke(cr);
        rgb_set(cr, PLOT_RGB_AXIS);
        cairo_move_to(cr, floor(px) + 0.5, f->bottom);
        cairo_line_to(cr, floor(px) + 0.5, f->bottom + 5);
        cairo_stroke(cr);
        char buf[32];
        tick_label(v, xs, buf, sizeof buf);
        rgb_set(cr, PLOT_RGB_TEXT);
        text_at(cr, px, f->bottom + 8, buf, 0.5, 0);
    }
    /* y ticks: round values, or on a log axis 1-2-5 times powers of ten
     * (the exponents themselves when the range spans many decades) */
    double lo = f->y0, hi = f->y1;
    double ys = tick_step(lo, hi, 6);
    double vals[64];
    int nv = 0;
    if (!f->log_y || hi - lo > 3) {
        if (f->log_y && ys < 1) ys = 1;
        for (double v = ceil(lo / ys) * ys; v <= hi + ys * 1e-9 && nv < 64; v += ys) vals[nv++] = v;
    } else {
        for (double d = floor(lo); d <= ceil(hi) && nv < 60; d++)
            for (int m = 0; m < 3; m++) {
                double v = d + log10((double[]){1, 2, 5}[m]);
                if (v >= lo - 1e-12 && v <= hi + 1e-12) vals[nv++] = v;
            }
        if (nv < 2) /* a narrow range: linear ticks in value, placed logarithmically */
            for (nv = 0; nv < 2; nv++) vals[nv] = nv ? hi : lo;
    }
    for (int i = 0; i < nv; i++) {
        double px, py, v = vals[i];
        map_d(f, f->x0, v, &px, &py);
        rgb_set(cr, PLOT_RGB_GRID);
        cairo_move_to(cr, f->left, floor(py) + 0.5);
        cairo_line_to(cr, f->right, floor(py) + 0.5);
        cairo_stroke(cr);
        rgb_set(cr, PLOT_RGB_AXIS);
        cairo_move_to(cr, f->left - 5, floor(py) + 0.5);
        cairo_line_to(cr, f->left, floor(py) + 0.5);
        cairo_stroke(cr);
        char buf[32];
        if (f->log_y) {
            double real = pow(10, v);
            snprintf(buf, sizeof buf, real >= 1e5 || real < 1e-3 ? "%.0e" : "%.4g", real);
        } else {
            tick_label(v, ys, buf, sizeof buf);
        }
        rgb_set(cr, PLOT_RGB_TEXT);
        text_at(cr, f->left - 8, py, buf, 1, 0.5);
    }
    /* the frame */
    rgb_set(cr, PLOT_RGB_AXIS);
    cairo_rectangle(cr, f->left - 0.5, f->top - 0.5, f->right - f->left + 1, f->bottom - f->top + 1);
    cairo_stroke(cr);
    /* titles */
    rgb_set(cr, PLOT_RGB_TEXT);
    if (o && o->xlabel) text_at(cr, (f->left + f->right) / 2.0, h - 20, o->xlabel, 0.5, 0);
    if (o && o->ylabel) {
        cairo_save(cr);
        cairo_translate(cr, 6, (f->top + f->bottom) / 2.0);
        cairo_rotate(cr, -M_PI / 2);
        text_at(cr, 0, 0, o->ylabel, 0.5, 0);
        cairo_restore(cr);
    }
    if (o && o->title) {
        cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_BOLD);
        cairo_set_font_size(cr, 15);
        text_at(cr, w / 2.0, 12, o->title, 0.5, 0);
    }
}

static void series_draw(cairo_t *cr, const plot_frame_t *f, const plot_series_t *s)
{
    rgb_set(cr, s->rgb);
    cairo_set_line_width(cr, 2);
    bool pen = false;
    for (int i = 0; i < s->n; i++) {
        double y = yval(s->y[i], f->log_y), px, py;
        if (!isfinite(s->x[i]) || !isfinite(y)) { /* a gap: a diverged step, a non-positive value */
            pen = false;
            continue;
        }
        map_d(f, s->x[i], y, &px, &py);
        if (s->markers) {
            cairo_rectangle(cr, px - 4, py - 4, 8, 8);
            cairo_fill(cr);
        } else if (!pen) {
            cairo_move_to(cr, px, py);
            pen = true;
        } else {
            cairo_line_to(cr, px, py);
        }
    }
    if (!s->markers) cairo_stroke(cr);
}

static void legend_draw(cairo_t *cr, const plot_frame_t *f, const plot_series_t *s, int n)
{
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, 12);
    double wmax = 0;
    int rows = 0;
    for (int k = 0; k < n; k++) {
        if (!s[k].label) continue;
        cairo_text_extents_t e;
        cairo_text_extents(cr, s[k].label, &e);
        if (e.x_advance > wmax) wmax = e.x_advance;
        rows++;
    }
    if (!rows) return;
    double bw = wmax + 44, bh = rows * 18 + 8, x = f->right - bw - 8, y = f->top + 8;
    cairo_rectangle(cr, x, y, bw, bh);
    rgb_set(cr, PLOT_RGB_BG);
    cairo_fill_preserve(cr);
    rgb_set(cr, PLOT_RGB_AXIS);
    cairo_set_line_width(cr, 1);
    cairo_stroke(cr);
    int r = 0;
    for (int k = 0; k < n; k++) {
        if (!s[k].label) continue;
        double cy = y + 13 + 18 * r++;
        rgb_set(cr, s[k].rgb);
        if (s[k].markers) {
            cairo_rectangle(cr, x + 14, cy - 4, 8, 8);
            cairo_fill(cr);
        } else {
            cairo_set_line_width(cr, 2);
            cairo_move_to(cr, x + 8, cy);
            cairo_line_to(cr, x + 28, cy);
            cairo_stroke(cr);
        }
        rgb_set(cr, PLOT_RGB_TEXT);
        text_at(cr, x + 36, cy, s[k].label, 0, 0.5);
    }
}

bt_status_t plot_png(const char *path, const plot_series_t *s, int n_series, const plot_opts_t *o)
{
    int w = o && o->width ? o->width : 800, h = o && o->height ? o->height : 500;
    plot_frame_t f = plot_frame(s, n_series, o);
    cairo_surface_t *sf = cairo_image_surface_create(CAIRO_FORMAT_RGB24, w, h);
    cairo_t *cr = cairo_create(sf);
    rgb_set(cr, PLOT_RGB_BG);
    cairo_paint(cr);
    axes_draw(cr, &f, o, w, h);
    cairo_save(cr);
    cairo_rectangle(cr, f.left, f.top, f.right - f.left, f.bottom - f.top);
    cairo_clip(cr);
    for (int k = 0; k < n_series; k++) series_draw(cr, &f, &s[k]);
    cairo_restore(cr);
    legend_draw(cr, &f, s, n_series);
    bt_status_t st = BT_OK;
    cairo_status_t cs = cairo_status(cr);
    if (cs == CAIRO_STATUS_SUCCESS) cs = cairo_surface_write_to_png(sf, path);
    if (cs != CAIRO_STATUS_SUCCESS) {
        log_error("plot: cannot write %s: %s", path, cairo_status_to_string(cs));
        st = BT_ERR_IO;
    }
    cairo_destroy(cr);
    cairo_surface_destroy(sf);
    return st;
}
