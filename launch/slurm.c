/* Slurm launch of a job's ranks (slurm.h). */
#include "launch/slurm.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/log.h"
#include "launch/ssh.h"

#define SLURM_SECRET_ENV "BATON_AGENT_SECRET"
#define SLURM_NODES_MAX  JOB_MAX_HOSTS

static int env_nodes(void)
{
    const char *v = getenv("SLURM_JOB_NUM_NODES");
    if (!v) v = getenv("SLURM_NNODES");
    return v ? atoi(v) : 0;
}

bool slurm_job_wanted(const job_t *job, int *nodes)
{
    *nodes = getenv("SLURM_JOB_ID") ? env_nodes() : 0;
    if (job->n_hosts == 1 && !strcmp(job->hosts[0], "slurm")) return true;
    const char *l = getenv("BATON_LAUNCH");
    if (l && !strcmp(l, "local")) return false;
    return *nodes >= 2 && job->n_hosts == 1 && !strcmp(job->hosts[0], "local");
}

/* Runs argv (no shell) and returns its stdout, trimmed, in out. */
static bt_status_t capture(char *const argv[], char *out, size_t cap)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC)) return BT_ERR_IO;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return BT_ERR_IO;
    }
    if (pid == 0) {
        int null = open("/dev/null", O_RDWR);
        if (dup2(null, 0) < 0 || dup2(p[1], 1) < 0) _exit(127);
        close_range(3, ~0u, 0);
        execvp(argv[0], argv);
        _exit(126);
    }
    close(p[1]);
    size_t len = 0;
    ssize_t r;
    while (len + 1 < cap && ((r = read(p[0], out + len, cap - 1 - len)) > 0 || (r < 0 && errno == EINTR)))
        if (r > 0) len += (size_t)r;
    close(p[0]);
    out[len] = 0;
    while (len && (out[len - 1] == '\n' || out[len - 1] == ' ')) out[--len] = 0;
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 && len ? BT_OK : BT_ERR_IO;
}

/* The allocation's node names, in SLURM_PROCID order (scontrol expands
 * the compressed list). */
static char node_names[SLURM_NODES_MAX][JOB_HOST_MAX];
static int  n_node_names;

static bt_status_t load_node_names(void)
{
    if (n_node_names) return BT_OK;
    const char *list = getenv("SLURM_JOB_NODELIST");
    if (!list) list = getenv("SLURM_NODELIST");
    if (!list) {
        log_error("launch: slurm: SLURM_JOB_NODELIST is not set (run inside salloc or sbatch)");
        return BT_ERR_INVALID;
    }
    char text[SLURM_NODES_MAX * 64];
    char *argv[] = {"scontrol", "show", "hostnames", (char *)list, NULL};
    if (capture(argv, text, sizeof text)) {
        log_error("launch: slurm: `scontrol show hostnames %s` failed (is slurm-client installed?)", list);
        return BT_ERR_IO;
    }
    for (char *save, *t = strtok_r(text, "\n", &save); t && n_node_names < SLURM_NODES_MAX;
         t = strtok_r(NULL, "\n", &save))
        snprintf(node_names[n_node_names++], JOB_HOST_MAX, "%s", t);
    return n_node_names ? BT_OK : BT_ERR_IO;
}

bt_status_t slurm_driver_addr(char *out, size_t cap)
{
    if (load_node_names()) return BT_ERR_IO;
    char addr[JOB_HOST_MAX];
    char *argv[] = {"sinfo", "-h", "-N", "-n", node_names[0], "-o", "%o", NULL};
    if (capture(argv, addr, sizeof addr)) snprintf(addr, sizeof addr, "%s", node_names[0]);
    char *nl = strchr(addr, '\n');
    if (nl) *nl = 0;
    return launch_addr_toward(addr, out, cap);
}

bt_status_t slurm_start(const job_t *job, const char *run_dir, const uint8_t *secret, size_t secret_len,
                        int world, int nodes, const char *peer, spawn_group_t *out)
{
    if (nodes < 1 || world % nodes) {
        log_error("launch: slurm: %d ranks do not split evenly over the allocation's %d nodes", world, nodes);
        return BT_ERR_INVALID;
    }
    if (load_node_names()) return BT_ERR_IO;
    if (n_node_names < nodes) {
        log_error("launch: slurm: the node list names %d nodes, SLURM_JOB_NUM_NODES %d", n_node_names, nodes);
        return BT_ERR_INVALID;
    }
    int per = world / nodes;
    char baton[JOB_PATH_MAX];
    if (job->launch.baton[0]) {
        snprintf(baton, sizeof baton, "%s", job->launch.baton);
    } else {
        ssize_t n = readlink("/proc/self/exe", baton, sizeof baton - 1);
        if (n <= 0) {
            log_error("launch: cannot find this binary (/proc/self/exe): %s", strerror(errno));
            return BT_ERR_IO;
        }
        baton[n] = 0;
    }
    char hex[2 * 64 + 1];
    if (secret_len > 64) return BT_ERR_INVALID;
    for (size_t i = 0; i < secret_len; i++) snprintf(hex + 2 * i, 3, "%02x", secret[i]);
    char n_opt[32], t_opt[32], count[16], chdir_opt[JOB_PATH_MAX + 16];
    snprintf(n_opt, sizeof n_opt, "--nodes=%d", nodes);
    snprintf(t_opt, sizeof t_opt, "--ntasks=%d", nodes);
    snprintf(count, sizeof count, "%d", per);
    char cwd[JOB_PATH_MAX];
    if (job->launch.workdir[0]) snprintf(cwd, sizeof cwd, "%s", job->launch.workdir);
    else if (!getcwd(cwd, sizeof cwd)) snprintf(cwd, sizeof cwd, "/");
    snprintf(chdir_opt, sizeof chdir_opt, "--chdir=%s", cwd);
    char *argv[] = {"srun", n_opt, t_opt, "--ntasks-per-node=1", "--input=all", "--kill-on-bad-exit=1",
                    "--quiet", chdir_opt, baton, "agent", "--slurm", "--run-dir", (char *)run_dir,
                    "--count", count, "--peer", (char *)peer, NULL};
    int ip[2];
    if (pipe2(ip, O_CLOEXEC)) {
        log_error("launch: slurm: pipe: %s", strerror(errno));
        return BT_ERR_IO;
    }
    spawn_proc_t *ps = calloc((size_t)world, sizeof *ps);
    if (!ps) {
        close(ip[0]);
        close(ip[1]);
        return BT_ERR_NOMEM;
    }
    pid_t parent = getpid();
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGPIPE, SIG_DFL);
        if (dup2(ip[0], 0) < 0) _exit(127);
        close_range(3, ~0u, 0);
        /* only in this child, which becomes srun: the environment srun
         * hands to its tasks (never argv) */
        setenv(SLURM_SECRET_ENV, hex, 1);
        unsetenv("BATON_LISTEN_HOST");
        execvp("srun", argv);
        static const char msg[] = "launch: slurm: cannot run srun (is slurm-client installed?)\n";
        if (write(2, msg, sizeof msg - 1) < 0) {}
        _exit(126);
    }
    explicit_bzero(hex, sizeof hex);
    close(ip[0]);
    if (pid < 0) {
        log_error("launch: slurm: fork of srun: %s", strerror(errno));
        close(ip[1]);
        free(ps);
        return BT_ERR_IO;
    }
    for (int r = 0; r < world; r++) {
        ps[r] = (spawn_proc_t){.pid = pid, .out_fd = -1, .in_fd = -1, .same_as = r ? 0 : -1,
                               .host = node_names[r / per]};
    }
    ps[0].in_fd = ip[1];
    *out = (spawn_group_t){.procs = ps, .n = world};
    log_info("launch: slurm: srun (pid %d) starts %d agents of %d ranks each on %s..%s", (int)pid, nodes, per,
             node_names[0], node_names[nodes - 1]);
    return BT_OK;
}

bt_status_t slurm_agent_env(int count, int *first, char *host, size_t host_cap, uint8_t *secret,
                            size_t secret_len)
{
    const char *hex = getenv(SLURM_SECRET_ENV), *procid = getenv("SLURM_PROCID"),
               *node = getenv("SLURMD_NODENAME");
    bt_status_t st = BT_OK;
    if (!hex || strlen(hex) != 2 * secret_len) {
        log_error("agent: %s in the environment is %s (agents are started by `baton run` through srun)",
                  SLURM_SECRET_ENV, hex ? "malformed" : "missing");
        st = BT_ERR_INVALID;
    }
    for (size_t i = 0; !st && i < secret_len; i++) {
        unsigned b;
        if (sscanf(hex + 2 * i, "%2x", &b) != 1) st = BT_ERR_INVALID;
        secret[i] = (uint8_t)b;
    }
    if (hex) {
        explicit_bzero((char *)hex, strlen(hex));
        unsetenv(SLURM_SECRET_ENV);
    }
    if (st) return st;
    if (!procid) {
        log_error("agent: SLURM_PROCID is not set (not a task of srun)");
        return BT_ERR_INVALID;
    }
    *first = atoi(procid) * count;
    snprintf(host, host_cap, "%s", node ? node : "slurm");
    return BT_OK;
}
