/* ssh launch of a job's ranks (ssh.h). */
#include "launch/ssh.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/log.h"

static bool host_is_local(const char *h)
{
    return !strcmp(h, "local") || !strcmp(h, "localhost") || !strcmp(h, "127.0.0.1");
}

bool ssh_job_remote(const job_t *job)
{
    for (int h = 0; h < job->n_hosts; h++)
        if (!host_is_local(job->hosts[h])) return true;
    return false;
}

bt_status_t launch_addr_toward(const char *host, char *out, size_t cap)
{
    char name[JOB_HOST_MAX], port[16] = "9";
    const char *at = strrchr(host, '@');
    snprintf(name, sizeof name, "%s", at ? at + 1 : host);
    char *colon = strrchr(name, ':');
    if (colon && !strchr(colon + 1, ']') && strchr(name, ':') == colon) { /* a.b.c.d:port */
        snprintf(port, sizeof port, "%s", colon + 1);
        *colon = 0;
    }
    if (name[0] == '[') { /* [v6]:port */
        memmove(name, name + 1, strlen(name));
        char *e = strchr(name, ']');
        if (e) {
            if (e[1] == ':') snprintf(port, sizeof port, "%s", e + 2);
            *e = 0;
        }
    }
    struct addrinfo hints = {.ai_socktype = SOCK_DGRAM}, *ai = NULL;
    int rc = getaddrinfo(name, port, &hints, &ai);
    if (rc) {
        log_error("launch: host %s: cannot resolve '%s': %s", host, name, gai_strerror(rc));
        return BT_ERR_NOT_FOUND;
    }
    bt_status_t st = BT_ERR_IO;
    /* A connected datagram socket sends nothing: the kernel only picks the
     * route, and with it the source address a peer there sees. */
    int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
        const void *a = ss.ss_family == AF_INET6 ? (const void *)&((struct sockaddr_in6 *)&ss)->sin6_addr
                                                 : (const void *)&((struct sockaddr_in *)&ss)->sin_addr;
        char text[INET6_ADDRSTRLEN];
        if (inet_ntop(ss.ss_family, a, text, sizeof text)) {
            if (ss.ss_family == AF_INET6) snprintf(out, cap, "[%s]", text);
            else snprintf(out, cap, "%s", text);
            st = BT_OK;
        }
    }
    if (st) log_error("launch: host %s: no route to %s: %s", host, name, strerror(errno));
    if (fd >= 0) close(fd);
    freeaddrinfo(ai);
    return st;
}

/* s in single quotes for a POSIX shell (a ' becomes '\''). */
static void shell_quote(char *out, size_t cap, const char *s)
{
    size_t o = 0;
    if (o + 1 < cap) out[o++] = '\'';
    for (; *s && o + 5 < cap; s++) {
        if (*s == '\'') {
            memcpy(out + o, "'\\''", 4);
            o += 4;
        } else {
            out[o++] = *s;
        }
    }
    if (o + 1 < cap) out[o++] = '\'';
    out[o < cap ? o : cap - 1] = 0;
}

/* The binary the hosts run and the directory they run it in. */
static bt_status_t remote_paths(const job_t *job, char *baton, size_t bcap, char *wd, size_t wcap)
{
    if (job->launch.baton[0]) {
        snprintf(baton, bcap, "%s", job->launch.baton);
    } else {
        ssize_t n = readlink("/proc/self/exe", baton, bcap - 1);
        if (n <= 0) {
            log_error("launch: cannot find this binary (/proc/self/exe): %s", strerror(errno));
            return BT_ERR_IO;
        }
        baton[n] = 0;
    }
    if (job->launch.workdir[0]) snprintf(wd, wcap, "%s", job->launch.workdir);
    else if (!getcwd(wd, wcap)) {
        log_error("launch: getcwd: %s", strerror(errno));
        return BT_ERR_IO;
    }
    return BT_OK;
}

#define SSH_ARGS_MAX (JOB_MAX_SSH_OPTS + 16)

/* argv of `ssh ... DEST CMD` (pointers into job and cmd). */
static void ssh_argv(const job_t *job, const char *dest, const char *cmd, char **argv)
{
    int a = 0;
    argv[a++] = "ssh";
    argv[a++] = "-T";
    argv[a++] = "-o";
    argv[a++] = "BatchMode=yes";
    argv[a++] = "-o";
    argv[a++] = "ConnectTimeout=10";
    for (int i = 0; i < job->launch.n_ssh; i++) argv[a++] = (char *)job->launch.ssh[i];
    argv[a++] = "--";
    argv[a++] = (char *)dest;
    argv[a++] = (char *)cmd;
    argv[a] = NULL;
}

/* fork + exec ssh with stdin from in_fd (-1: /dev/null), stderr into
 * err_fd (-1: ours), stdout to /dev/null when quiet. */
static pid_t ssh_fork(char **argv, int in_fd, int err_fd, bool quiet)
{
    pid_t parent = getpid();
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid != 0) return pid;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    int null = open("/dev/null", O_RDWR);
    if (dup2(in_fd >= 0 ? in_fd : null, 0) < 0) _exit(127);
    if (quiet && dup2(null, 1) < 0) _exit(127);
    if (err_fd >= 0 && dup2(err_fd, 2) < 0) _exit(127);
    close_range(3, ~0u, 0);
    execvp("ssh", argv);
    static const char msg[] = "launch: cannot run ssh (is openssh-client installed?)\n";
    if (write(2, msg, sizeof msg - 1) < 0) {}
    _exit(126);
}

bt_status_t ssh_probe(const job_t *job, const char *run_dir, char *err, size_t errlen)
{
    char baton[JOB_PATH_MAX], wd[JOB_PATH_MAX];
    if (remote_paths(job, baton, sizeof baton, wd, sizeof wd)) {
        snprintf(err, errlen, "cannot name the baton binary or working directory");
        return BT_ERR_IO;
    }
    char qb[2 * JOB_PATH_MAX], qw[2 * JOB_PATH_MAX], qr[2 * JOB_PATH_MAX], cmd[8 * JOB_PATH_MAX];
    char job_file[JOB_PATH_MAX + 32];
    snprintf(job_file, sizeof job_file, "%s/job.yaml", run_dir);
    shell_quote(qb, sizeof qb, baton);
    shell_quote(qw, sizeof qw, wd);
    shell_quote(qr, sizeof qr, job_file);
    snprintf(cmd, sizeof cmd, "cd %s 2>/dev/null || exit 3; test -x %s || exit 4; test -r %s || exit 5; exit 0",
             qw, qb, qr);
    pid_t pids[JOB_MAX_HOSTS];
    int errs[JOB_MAX_HOSTS];
    int n = job->n_hosts;
    for (int h = 0; h < n; h++) {
        pids[h] = -1;
        errs[h] = -1;
        int ep[2];
        if (pipe2(ep, O_CLOEXEC)) continue;
        char *argv[SSH_ARGS_MAX];
        ssh_argv(job, job->hosts[h], cmd, argv);
        pids[h] = ssh_fork(argv, -1, ep[1], true);
        close(ep[1]);
        errs[h] = ep[0];
    }
    bt_status_t st = BT_OK;
    for (int h = 0; h < n; h++) {
        char text[2048] = "";
        size_t len = 0;
        if (errs[h] >= 0) {
            ssize_t r;
            while ((r = read(errs[h], text + len, sizeof text - 1 - len)) > 0) len += (size_t)r;
            close(errs[h]);
        }
        text[len] = 0;
        while (len && (text[len - 1] == '\n' || text[len - 1] == '\r')) text[--len] = 0;
        const char *last = strrchr(text, '\n') ? strrchr(text, '\n') + 1 : text;
        int status = 0;
        if (pids[h] < 0) status = -1;
        else while (waitpid(pids[h], &status, 0) < 0 && errno == EINTR) {}
        if (st) continue; /* one message: the first host that fails */
        int code = pids[h] < 0 ? -1 : WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        const char *host = job->hosts[h];
        switch (code) {
        case 0: break;
        case 3: snprintf(err, errlen, "hosts[%d] %s: launch.workdir %s does not exist there", h, host, wd); break;
        case 4: snprintf(err, errlen, "hosts[%d] %s: the baton binary %s is missing or not executable there "
                         "(launch.baton names it)", h, host, baton); break;
        case 5: snprintf(err, errlen, "hosts[%d] %s: cannot see the run directory %s (the hosts must share "
                         "the driver's TMPDIR; docs/PARALLEL.md)", h, host, run_dir); break;
        case 255: snprintf(err, errlen, "hosts[%d] %s: cannot reach it over ssh: %s", h, host,
                           *last ? last : "ssh failed"); break;
        default: snprintf(err, errlen, "hosts[%d] %s: the ssh check failed (status %d)%s%s", h, host, code,
                          *last ? ": " : "", last); break;
        }
        if (code) st = BT_ERR_IO;
    }
    return st;
}

extern char **environ;

/* " K='V'..." for this process's BATON_* settings (BATON_LOG, the CPU
 * threads, the timeouts, test hooks), UCX_* ones (UCX reads them as its
 * library loads; a ThreadSanitizer build needs UCX_MEM_EVENTS=no) and
 * OPENBLAS_* ones (OPENBLAS_CORETYPE picks the CPU kernels, and with them
 * the bits of every product: a rank started without it computes with
 * another kernel than the ranks beside the driver): ssh carries no
 * environment, so they go on the agent's command line. Never
 * BATON_SECRET_*, nor the listen address each agent finds for itself. */
static void forwarded_env(char *out, size_t cap)
{
    size_t o = 0;
    out[0] = 0;
    for (char **e = environ; *e; e++) {
        const char *eq = strchr(*e, '=');
        if ((strncmp(*e, "BATON_", 6) && strncmp(*e, "UCX_", 4) && strncmp(*e, "OPENBLAS_", 9)) ||
            !eq || !strncmp(*e, "BATON_SECRET_", 13) ||
            !strncmp(*e, "BATON_LISTEN_HOST=", 18))
            continue;
        bool plain = true;
        for (const char *c = *e; c < eq; c++) plain &= (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '_';
        if (!plain) continue;
        char q[1024];
        shell_quote(q, sizeof q, eq + 1);
        int n = snprintf(out + o, cap - o, " %.*s=%s", (int)(eq - *e), *e, q);
        if (n < 0 || (size_t)n >= cap - o) {
            out[o] = 0;
            log_warn("launch: too many BATON_* settings to forward to the hosts; %s and later ones dropped", *e);
            return;
        }
        o += (size_t)n;
    }
}

bt_status_t ssh_start(const job_t *job, const char *run_dir, const uint8_t *secret, size_t secret_len,
                      int world, const char *peer, spawn_group_t *out)
{
    int n = job->n_hosts;
    if (world % n) {
        log_error("launch: hosts: %d ranks do not split evenly over %d hosts", world, n);
        return BT_ERR_INVALID;
    }
    int per = world / n;
    char baton[JOB_PATH_MAX], wd[JOB_PATH_MAX];
    if (remote_paths(job, baton, sizeof baton, wd, sizeof wd)) return BT_ERR_IO;
    spawn_proc_t *ps = calloc((size_t)world, sizeof *ps);
    if (!ps) return BT_ERR_NOMEM;
    for (int r = 0; r < world; r++) ps[r].out_fd = ps[r].in_fd = -1, ps[r].same_as = -1;
    *out = (spawn_group_t){.procs = ps, .n = 0};
    for (int h = 0; h < n; h++) {
        char qb[2 * JOB_PATH_MAX], qw[2 * JOB_PATH_MAX], qr[2 * JOB_PATH_MAX], qh[2 * JOB_HOST_MAX];
        char qp[160], cmd[10 * JOB_PATH_MAX];
        shell_quote(qb, sizeof qb, baton);
        shell_quote(qw, sizeof qw, wd);
        shell_quote(qr, sizeof qr, run_dir);
        shell_quote(qh, sizeof qh, job->hosts[h]);
        shell_quote(qp, sizeof qp, peer);
        char envs[4096];
        forwarded_env(envs, sizeof envs);
        snprintf(cmd, sizeof cmd, "cd %s && exec env%s %s agent --run-dir %s --first %d --count %d --host %s "
                 "--peer %s", qw, envs, qb, qr, h * per, per, qh, qp);
        int ip[2];
        if (pipe2(ip, O_CLOEXEC)) {
            log_error("launch: pipe for host %s: %s", job->hosts[h], strerror(errno));
            goto fail;
        }
        char *argv[SSH_ARGS_MAX];
        ssh_argv(job, job->hosts[h], cmd, argv);
        pid_t pid = ssh_fork(argv, ip[0], -1, false);
        close(ip[0]);
        if (pid < 0) {
            log_error("launch: fork of ssh for host %s: %s", job->hosts[h], strerror(errno));
            close(ip[1]);
            goto fail;
        }
        for (int k = 0; k < per; k++) {
            spawn_proc_t *p = &ps[h * per + k];
            p->pid = pid;
            p->host = job->hosts[h];
            p->same_as = k ? h * per : -1;
        }
        ps[h * per].in_fd = ip[1];
        out->n = (h + 1) * per;
        if (write(ip[1], secret, secret_len) != (ssize_t)secret_len) {
            log_error("launch: cannot hand the job secret to host %s: %s", job->hosts[h], strerror(errno));
            goto fail;
        }
    }
    return BT_OK;
fail:
    spawn_stop(out, 0, NULL);
    return BT_ERR_IO;
}
