/* baton: one binary, many subcommands. Only main() may exit. */
#include "launch/cli.h"
#include "transport/xport.h"

#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <unistd.h>

#include "base/file.h"
#include "base/log.h"

typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} cli_cmd_t;

static const cli_cmd_t commands[] = {
    {"run", cmd_run, "JOB.yaml [--set key=value ...]   train as described by a job file"},
    {"graph", cmd_graph, "JOB.yaml                          print the actor graph without running"},
    {"flops", cmd_flops, "JOB.yaml [--json]                 training FLOPs per token (MFU's numerator)"},
    {"convert", cmd_convert, "--from SRC --to DIR [--format hf|native]   checkpoint <-> Hugging Face"},
    {"eval", cmd_eval, "--model DIR (--ids F | --text F) [--json]  loss and perplexity"},
    {"generate", cmd_generate, "--model DIR --prompt TEXT --max-new N   generate text"},
    {"data", cmd_data, "prepare --tokenizer DIR --input F... --output DIR   tokenize a corpus"},
    {"trace", cmd_trace, "DIR [--summary]                   merge traces into Perfetto JSON"},
    {"bench", cmd_bench, "transport|train ...               benchmarks"},
    {"worker", cmd_worker, "(internal) one rank process of a job"},
};

/* VmHWM of /proc/self/status in KiB, or -1 */
static long peak_rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "re");
    if (!f) return -1;
    char line[256];
    long kib = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kib = strtol(line + 6, NULL, 10);
    fclose(f);
    return kib;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: baton COMMAND [ARGS]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-9s %s\n", commands[i].name, commands[i].help);
}

int main(int argc, char **argv)
{
    const char *env_bad = xport_ucx_env_check();
    if (env_bad) {
        fprintf(stderr, "baton: %s\n", env_bad);
        _exit(2); /* not exit(): OpenBLAS's exit handler ends its threads, which is the crash */
    }
    /* Nothing this process inherited or a library opened while loading
     * (UCX opens pipes and /dev/null without close-on-exec) goes on to
     * the programs it runs; what it opens itself is close-on-exec. */
    base_fd_cloexec_all(3);
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") ||
        !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(argv[1], commands[i].name)) continue;
        int rc = commands[i].fn(argc - 1, argv + 1);
        /* what the process held at most (tests/sh/test_rank_memory.sh reads
         * it): VmHWM, which starts afresh at exec (getrusage's ru_maxrss
         * would include what the forking driver held) */
        if (log_enabled(LOG_DEBUG)) {
            long hwm = peak_rss_kib();
            if (hwm >= 0) log_debug("%s: peak resident memory %ld KiB", argv[1], hwm);
        }
        return rc;
    }
    fprintf(stderr, "baton: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
