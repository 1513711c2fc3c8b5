/* TensorBoard event files (launch/tb.h). */
#include "launch/tb.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "base/log.h"

static uint32_t crc_table[256];

static void crc_table_fill(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1; /* reflected Castagnoli */
        crc_table[i] = c;
    }
}

uint32_t tb_crc32c(const void *p, size_t n)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, crc_table_fill);
    const uint8_t *b = p;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = crc_table[(c ^ b[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

uint32_t tb_crc_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u; }

/* ---- protobuf wire format ------------------------------------------------ */

typedef struct {
    uint8_t b[512];
    size_t  n;
    bool    over;
} pb_t;

static void pb_bytes(pb_t *m, const void *p, size_t n)
{
    if (m->n + n > sizeof m->b) { m->over = true; return; }
    memcpy(m->b + m->n, p, n);
    m->n += n;
}

static void pb_varint(pb_t *m, uint64_t v)
{
    uint8_t t[10];
    size_t k = 0;
    do {
        t[k++] = (uint8_t)((v & 0x7F) | (v > 0x7F ? 0x80 : 0));
        v >>= 7;
    } while (v);
    pb_bytes(m, t, k);
}

/* key = field number << 3 | wire type (0 varint, 1 fixed64, 2 bytes, 5 fixed32) */
static void pb_key(pb_t *m, unsigned field, unsigned type) { pb_varint(m, (uint64_t)field << 3 | type); }

static void pb_fixed(pb_t *m, uint64_t v, size_t n)
{
    uint8_t t[8];
    for (size_t i = 0; i < n; i++) t[i] = (uint8_t)(v >> (8 * i));
    pb_bytes(m, t, n);
}

static void pb_double(pb_t *m, unsigned field, double d)
{
    uint64_t v;
    memcpy(&v, &d, 8);
    pb_key(m, field, 1);
    pb_fixed(m, v, 8);
}

static void pb_float(pb_t *m, unsigned field, float f)
{
    uint32_t v;
    memcpy(&v, &f, 4);
    pb_key(m, field, 5);
    pb_fixed(m, v, 4);
}

static void pb_len(pb_t *m, unsigned field, const void *p, size_t n)
{
    pb_key(m, field, 2);
    pb_varint(m, n);
    pb_bytes(m, p, n);
}

/* ---- records ------------------------------------------------------------- */

static void record_write(tb_writer_t *w, const pb_t *ev)
{
    if (!w->f) return;
    if (ev->over) BT_PANIC("tb: event larger than its buffer");
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)ev->n >> (8 * i));
    uint32_t c1 = tb_crc_mask(tb_crc32c(len, 8)), c2 = tb_crc_mask(tb_crc32c(ev->b, ev->n));
    uint8_t c[8];
    for (int i = 0; i < 4; i++) c[i] = (uint8_t)(c1 >> (8 * i)), c[4 + i] = (uint8_t)(c2 >> (8 * i));
    if (fwrite(len, 8, 1, w->f) != 1 || fwrite(c, 4, 1, w->f) != 1 ||
        fwrite(ev->b, ev->n, 1, w->f) != 1 || fwrite(c + 4, 4, 1, w->f) != 1 || fflush(w->f)) {
        log_error("metrics.tensorboard: cannot write %s: %s; no more TensorBoard events", w->path,
                  strerror(errno));
        fclose(w->f);
        w->f = NULL;
    }
}

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

bt_status_t tb_open(tb_writer_t *w, const char *dir)
{
    memset(w, 0, sizeof *w);
    char err[512], host[64] = "localhost";
    if (base_dir_make(dir, err, sizeof err)) {
        log_error("metrics.tensorboard: %s", err);
        return BT_ERR_IO;
    }
    gethostname(host, sizeof host - 1);
    snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%lld.%s.%d", dir, (long long)time(NULL),
             host, (int)getpid());
    if (!(w->f = fopen(w->path, "wbe"))) {
        log_error("metrics.tensorboard: cannot create %s: %s", w->path, strerror(errno));
        return BT_ERR_IO;
    }
    pb_t ev = {0};
    pb_double(&ev, 1, wall_now());
    static const char version[] = "brain.Event:2";
    pb_len(&ev, 3, version, sizeof version - 1);
    record_write(w, &ev);
    return w->f ? BT_OK : BT_ERR_IO;
}

void tb_scalar(tb_writer_t *w, const char *tag, int64_t step, double value)
{
    if (!w->f) return;
    pb_t val = {0}, sum = {0}, ev = {0};
    pb_len(&val, 1, tag, strnlen(tag, 128));
    pb_float(&val, 2, (float)value);
    pb_len(&sum, 1, val.b, val.n);
    pb_double(&ev, 1, wall_now());
    pb_key(&ev, 2, 0);
    pb_varint(&ev, (uint64_t)step);
    pb_len(&ev, 5, sum.b, sum.n);
    record_write(w, &ev);
}

void tb_close(tb_writer_t *w)
{
    if (w->f) fclose(w->f);
    w->f = NULL;
}
