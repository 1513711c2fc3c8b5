/* Loss-curve picture: a PNG (libpng) drawn by hand: white background, black
 * axes with tick marks, the training loss as a blue polyline, validation
 * losses as red squares, and the axis ranges written in a tiny built-in
 * 3x5 digit font (y: min and max loss at the left; x: first and last step
 * under the axis). */
#ifndef BT_LAUNCH_PLOT_H
#define BT_LAUNCH_PLOT_H

#include <stdint.h>

#include "base/status.h"

typedef struct {
    const double *x, *y;  /* [n] step, loss */
    int n;
} plot_series_t;

/* A growing series of points, as a training run collects them. A failed
 * growth drops the point: the picture is a convenience, the metrics file has
 * every value. */
typedef struct {
    double *x, *y;
    int n, cap;
} plot_curve_t;

void          plot_curve_push(plot_curve_t *c, double x, double y);
plot_series_t plot_curve_view(const plot_curve_t *c);
void          plot_curve_free(plot_curve_t *c);

typedef struct {
    int width, height;    /* pixels; 0 = 640 x 400 */
    int margin;           /* pixels around the plot area; 0 = 40 */
} plot_opts_t;

/* Map data to pixels as the plot does (tests use it to probe the picture). */
typedef struct {
    double x0, x1, y0, y1;  /* data ranges */
    int left, right, top, bottom;  /* plot area in pixels (inclusive) */
} plot_frame_t;

plot_frame_t plot_frame(const plot_series_t *train, const plot_series_t *val, const plot_opts_t *opts);
void         plot_frame_map(const plot_frame_t *f, double x, double y, int *px, int *py);

/* Write the picture. `val` may be NULL. At least one training point. */
bt_status_t plot_loss_png(const char *path, const plot_series_t *train, const plot_series_t *val,
                          const plot_opts_t *opts);

/* Colours used (RGB), exposed for tests. */
#define PLOT_RGB_BG    0xFFFFFFu
#define PLOT_RGB_AXIS  0x000000u
#define PLOT_RGB_TRAIN 0x1F5FD0u
#define PLOT_RGB_VAL   0xD02020u
#define PLOT_RGB_TEXT  0x404040u

#endif
