/* The run's pictures, drawn with cairo into PNG files: a title, axes with
 * titles and labelled ticks at round values, a grid, one curve per series
 * (a line, or markers), a legend naming each series; the y axis linear or
 * logarithmic. Written at the end of a run: the loss (training line and
 * validation markers) and the throughput (tokens/s per step). */
#ifndef BT_LAUNCH_PLOT_H
#define BT_LAUNCH_PLOT_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"

typedef struct {
    const double *x, *y;  /* [n] */
    int n;
    const char *label;    /* legend text; NULL: not in the legend */
    uint32_t rgb;
    bool markers;         /* squares at the points instead of a line */
} plot_series_t;

/* A growing series of points, as a training run collects them. A failed
 * growth drops the point: the picture is a convenience, the metrics file has
 * every value. */
typedef struct {
    double *x, *y;
    int n, cap;
} plot_curve_t;

void          plot_curve_push(plot_curve_t *c, double x, double y);
/* The curve as a series to draw (label, colour and style given). */
plot_series_t plot_curve_view(const plot_curve_t *c, const char *label, uint32_t rgb, bool markers);
void          plot_curve_free(plot_curve_t *c);

typedef struct {
    int width, height;    /* pixels; 0 = 800 x 500 */
    const char *title, *xlabel, *ylabel;
    bool log_y;           /* logarithmic y axis (values <= 0 are left out) */
} plot_opts_t;

/* Where data lands in the picture (tests probe pixels with it). */
typedef struct {
    double x0, x1, y0, y1;          /* data ranges (y: log10 of the values when log_y) */
    bool   log_y;
    int left, right, top, bottom;   /* plot area in pixels */
} plot_frame_t;

plot_frame_t plot_frame(const plot_series_t *s, int n_series, const plot_opts_t *opts);
void         plot_frame_map(const plot_frame_t *f, double x, double y, int *px, int *py);

/* Draws the series (at least one point among them) into a PNG at path.
 * BT_ERR_IO (logged) when the file cannot be written. */
bt_status_t plot_png(const char *path, const plot_series_t *s, int n_series, const plot_opts_t *opts);

/* Colours (RGB). */
#define PLOT_RGB_BG    0xFFFFFFu
#define PLOT_RGB_AXIS  0x000000u
#define PLOT_RGB_TRAIN 0x1F5FD0u
#define PLOT_RGB_VAL   0xD02020u
#define PLOT_RGB_TPUT  0x208040u
#define PLOT_RGB_TEXT  0x202020u
#define PLOT_RGB_GRID  0xE0E0E0u

#endif
