/* baton trace DIR [--summary] [-o OUT.json]
 *
 * Merges the per-process trace files of DIR (trace/trace.h) into one Chrome
 * trace-event JSON file, DIR/trace.json by default (open it in
 * ui.perfetto.dev), or prints the per-edge / per-actor summary. */
#include "launch/cli.h"

#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "trace/read.h"
#include "trace/bubble.h"

static void cmd_trace_usage(FILE *f)
{
    fprintf(f, "usage: baton trace DIR [--summary] [-o OUT.json]\n"
               "  merge DIR/trace-*.bin into DIR/trace.json (Chrome trace events; ui.perfetto.dev)\n"
               "  --summary    print per-edge message counts, bytes, latency and per-actor busy/idle\n"
               "  -o, --output write the JSON here instead of DIR/trace.json\n");
}

int cmd_trace(int argc, char **argv)
{
    static const struct option opts[] = {
        {"summary", no_argument, NULL, 's'},
        {"output", required_argument, NULL, 'o'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    bool summary = false;
    const char *output = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "so:h", opts, NULL)) != -1) {
        switch (c) {
        case 's': summary = true; break;
        case 'o': output = optarg; break;
        case 'h': cmd_trace_usage(stdout); return 0;
        default: cmd_trace_usage(stderr); return 2;
        }
    }
    if (optind != argc - 1) {
        cmd_trace_usage(stderr);
        return 2;
    }
    const char *dir = argv[optind];
    trace_set_t set;
    char err[512];
    bt_status_t st = trace_dir_load(dir, &set, err, sizeof err);
    if (st != BT_OK) {
        fprintf(stderr, "baton trace: %s\n", err);
        return 1;
    }
    int rc = 0;
    if (summary) {
        trace_summary_t s;
        if (trace_summary_compute(&set, &s) != BT_OK) {
            fprintf(stderr, "baton trace: out of memory computing the summary\n");
            rc = 1;
        } else {
            size_t n = 0;
            for (size_t i = 0; i < set.nfiles; i++) n += set.files[i].nrecs;
            printf("trace %s: %zu files, %zu events\n", dir, set.nfiles, n);
            trace_summary_print(&s, stdout);
            trace_summary_free(&s);
            /* the pipeline bubble, when the trace holds a pipeline (trace/bubble.h) */
            trace_bubble_t b;
            char berr[256];
            bt_status_t bst = trace_bubble_compute(&set, &b, berr, sizeof berr);
            if (bst == BT_OK) {
                trace_bubble_print(&b, stdout);
                trace_bubble_free(&b);
            } else if (bst == BT_ERR_NOT_FOUND) {
                printf("pipeline: %s\n", berr);
            } else {
                fprintf(stderr, "baton trace: out of memory computing the pipeline bubble\n");
                rc = 1;
            }
        }
    } else {
        char path[4096];
        if (output) snprintf(path, sizeof path, "%s", output);
        else snprintf(path, sizeof path, "%s/trace.json", dir);
        FILE *f = fopen(path, "we");
        if (!f) {
            perror(path);
            rc = 1;
        } else {
            st = trace_json_write(&set, f);
            if (fclose(f) != 0 && st == BT_OK) st = BT_ERR_IO;
            if (st != BT_OK) {
                fprintf(stderr, "baton trace: writing %s failed (%s)\n", path, bt_status_str(st));
                rc = 1;
            } else {
                fprintf(stderr, "baton trace: wrote %s (%zu processes); open it in ui.perfetto.dev\n", path,
                        set.nfiles);
            }
        }
    }
    trace_set_free(&set);
    return rc;
}
