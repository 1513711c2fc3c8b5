/* baton: one binary, many subcommands. Only main() may exit. */
#include "launch/cli.h"
#include "launch/version.h"
#include "transport/xport.h"

#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <unistd.h>

#include "base/file.h"
#include "base/log.h"
#include "base/mem.h"

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
    {"agent", cmd_agent, "(internal) the ranks of one host, started over ssh"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: baton COMMAND [ARGS]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-9s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n`baton help COMMAND` (or `baton COMMAND --help`) tells more; `baton --version`.\n"
               "BATON_LOG=error|warn|info|debug sets how much is logged (debug adds source lines).\n");
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
    /* NVLink multicast off in this process and all it starts, before
     * anything could load NCCL (launch/spawn.h: SPAWN_NCCL_NVLS) */
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    if (argc >= 2 && (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version"))) {
        printf("baton %s (source revision %s)\n", BATON_RELEASE, baton_revision());
        return 0;
    }
    /* `baton help CMD` is `baton CMD --help`: one text, exit 0 */
    if (argc == 3 && !strcmp(argv[1], "help")) {
        for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
            if (!strcmp(argv[2], commands[i].name)) {
                char *args[] = {argv[2], "--help", NULL};
                return commands[i].fn(2, args);
            }
        fprintf(stderr, "baton: help: unknown command '%s'\n", argv[2]);
        usage(stderr);
        return 2;
    }
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
            long long hwm = base_mem_peak_rss();
            if (hwm >= 0) log_debug("%s: peak resident memory %lld KiB", argv[1], hwm / 1024);
        }
        return rc;
    }
    fprintf(stderr, "baton: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
