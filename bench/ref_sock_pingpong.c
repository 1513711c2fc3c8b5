/* Reference: blocking-socket ping-pong over loopback (see ref.h). */
#include "bench/ref.h"

#include "base/clock.h"
#include "base/log.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static bool sock_write_all(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

static bool sock_read_all(int fd, uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t r = recv(fd, p, n, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        p += r;
        n -= (size_t)r;
    }
    return true;
}

/* The child: echo `rounds` messages, then exit. */
static void sock_child(int port, size_t bytes, int rounds)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    uint8_t *buf = malloc(bytes ? bytes : 1);
    if (fd < 0 || !buf || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) _exit(1);
    for (int i = 0; i < rounds; i++)
        if (!sock_read_all(fd, buf, bytes) || !sock_write_all(fd, buf, bytes)) _exit(2);
    _exit(0);
}

bt_status_t bench_ref_sock_pingpong(size_t bytes, int iters, double *lat_us, double *gbytes_s)
{
    if (iters <= 0 || bytes == 0) return BT_ERR_INVALID;
    int warm = bytes <= (1u << 20) ? 100 : 1;
    bt_status_t st = BT_OK;
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof a) != 0 || listen(lfd, 1) != 0
        || getsockname(lfd, (struct sockaddr *)&a, &al) != 0) {
        log_error("ref sock pingpong: cannot listen on loopback: %s", strerror(errno));
        if (lfd >= 0) close(lfd);
        return BT_ERR_IO;
    }
    uint8_t *buf = malloc(bytes);
    if (!buf) {
        close(lfd);
        return BT_ERR_NOMEM;
    }
    memset(buf, 0x5a, bytes);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        log_error("ref sock pingpong: fork: %s", strerror(errno));
        st = BT_ERR_IO;
        goto free_buf;
    }
    if (pid == 0) {
        close(lfd);
        sock_child(ntohs(a.sin_port), bytes, warm + iters);
    }
    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) {
        log_error("ref sock pingpong: accept: %s", strerror(errno));
        st = BT_ERR_IO;
        goto reap_child;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    uint64_t t0 = 0;
    for (int i = 0; i < warm + iters; i++) {
        if (i == warm) t0 = clock_now_ns();
        if (!sock_write_all(fd, buf, bytes) || !sock_read_all(fd, buf, bytes)) {
            log_error("ref sock pingpong: the echo child went away at round %d", i);
            st = BT_ERR_PEER_CLOSED;
            break;
        }
    }
    if (st == BT_OK) {
        double one_way_s = (double)(clock_now_ns() - t0) / 1e9 / iters / 2.0;
        *lat_us = one_way_s * 1e6;
        *gbytes_s = (double)bytes / one_way_s / 1e9;
    }
    close(fd);
reap_child:
    if (st != BT_OK) kill(pid, SIGKILL);
    int ws;
    waitpid(pid, &ws, 0);
free_buf:
    free(buf);
    close(lfd);
    return st;
}
