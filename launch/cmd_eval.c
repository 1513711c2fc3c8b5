/* baton eval: loss and perplexity of a model (Hugging Face directory or GGUF
 * file, ckpt/model_source.h).
 *
 *   baton eval --model DIR|FILE.gguf (--ids FILE | --text FILE) [--window T]
 *              [--max-tokens N] [--grad-norm] [--json]
 *
 * --ids FILE: one sequence per line, whitespace-separated token ids; blank
 * lines are ignored. Each sequence is scored on its own exactly as
 * transformers does with labels = input ids (next-token NLL at positions
 * 0..len-2), and the loss is the mean over all scored positions of all
 * sequences. A sequence longer than the window is cut into consecutive
 * windows of at most T tokens, each scored as its own sequence.
 * --text FILE: the text tokenized with the model's tokenizer (DIR/tokenizer.json
 * or the GGUF vocabulary), then cut into windows the same way.
 * --window T: default max_position_embeddings of the config.
 * --max-tokens N: keep only the first N token ids of the input (all of its
 * sequences together, before windowing): "the first 64 K tokens in windows
 * of 1024" is --max-tokens 65536 --window 1024 = 64 windows, 1023 scored
 * positions each.
 * --grad-norm: also the global L2 norm of d(mean loss)/d(parameters).
 * --json: one JSON object {"tokens", "loss", "ppl"[, "grad_norm"][, "moe_dropped"]} on
 * stdout ("moe_dropped": the routed choices an expert's capacity dropped, for a
 * model with a capacity_factor).
 * --device D, --dtype P: where to run (cpu, cuda[:N], fenced, auto; default
 * cpu) and in which precision (fp32, bf16; default fp32).
 * --layout tp=N,pp=N,dp=N[,cp=N][,ep=N]: evaluate as processes in that parallel layout
 * (launch/driver.h): the windows become rows padded to the longest (targets
 * -100 on padding, exact under causal attention), split into microbatches
 * among the data-parallel replicas; same loss as the single process.
 */
#include "launch/cli.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "ckpt/model_source.h"
#include "data/tokenizer.h"
#include "launch/driver.h"
#include "launch/job.h"
#include "launch/run_mem.h"
#include "launch/run_setup.h"
#include "model/model.h"

typedef struct {
    int32_t *ids;   /* all tokens, sequences back to back */
    int64_t  n_ids, cap_ids;
    int64_t *start; /* [n_seq] offset of each sequence in ids */
    int64_t *len;   /* [n_seq] */
    int64_t  n_seq, cap_seq;
} eval_seqs_t;

static void eval_seqs_free(eval_seqs_t *s)
{
    free(s->ids);
    free(s->start);
    free(s->len);
    memset(s, 0, sizeof *s);
}

static int eval_seqs_push_id(eval_seqs_t *s, int32_t id)
{
    if (s->n_ids == s->cap_ids) {
        int64_t cap = s->cap_ids ? s->cap_ids * 2 : 4096;
        int32_t *p = realloc(s->ids, (size_t)cap * sizeof *p);
        if (!p) return -1;
        s->ids = p;
        s->cap_ids = cap;
    }
    s->ids[s->n_ids++] = id;
    return 0;
}

static int eval_seqs_push_seq(eval_seqs_t *s, int64_t start, int64_t len)
{
    if (s->n_seq == s->cap_seq) {
        int64_t cap = s->cap_seq ? s->cap_seq * 2 : 64;
        int64_t *a = realloc(s->start, (size_t)cap * sizeof *a);
        if (!a) return -1;
        s->start = a;
        int64_t *b = realloc(s->len, (size_t)cap * sizeof *b);
        if (!b) return -1;
        s->len = b;
        s->cap_seq = cap;
    }
    s->start[s->n_seq] = start;
    s->len[s->n_seq] = len;
    s->n_seq++;
    return 0;
}

/* Reads the --ids file. Errors name the file, line and column. */
static int eval_ids_read(const char *path, int64_t vocab, eval_seqs_t *s)
{
    FILE *f = fopen(path, "re");
    if (!f) {
        log_error("%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int64_t lineno = 0;
    int rc = -1;
    while ((n = getline(&line, &cap, f)) >= 0) {
        lineno++;
        int64_t start = s->n_ids;
        char *p = line;
        for (;;) {
            while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n' || *p == '\v' || *p == '\f')
                p++;
            if (!*p) break;
            char *tok = p;
            while (*p && !(*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n' || *p == '\v' ||
                           *p == '\f'))
                p++;
            char save = *p;
            *p = '\0';
            char *end;
            errno = 0;
            long long v = strtoll(tok, &end, 10);
            long col = (long)(tok - line) + 1;
            if (*end || end == tok || errno || tok[0] == '+') {
                log_error("%s:%lld:%ld: bad token '%.40s' (expected a token id)", path,
                          (long long)lineno, col, tok);
                goto done;
            }
            if (v < 0 || v >= vocab) {
                log_error("%s:%lld:%ld: token id %lld outside the vocabulary [0, %lld)", path,
                          (long long)lineno, col, v, (long long)vocab);
                goto done;
            }
            if (eval_seqs_push_id(s, (int32_t)v) != 0) goto oom;
            *p = save;
        }
        if (s->n_ids > start && eval_seqs_push_seq(s, start, s->n_ids - start) != 0) goto oom;
    }
    if (ferror(f)) {
        log_error("%s: read error", path);
        goto done;
    }
    if (s->n_seq == 0) {
        log_error("%s: no sequences (only blank lines)", path);
        goto done;
    }
    rc = 0;
    goto done;
oom:
    log_error("%s: out of memory", path);
done:
    free(line);
    fclose(f);
    return rc;
}

/* Reads the --text file and tokenizes it with the model's tokenizer into one
 * sequence (no special tokens added). */
static int eval_text_read(const char *path, const char *model, int64_t vocab, eval_seqs_t *s)
{
    FILE *f = fopen(path, "rbe");
    if (!f) {
        log_error("%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    int rc = -1;
    char *text = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 65536 > cap) {
            cap = cap ? cap * 2 : 1u << 20;
            char *t = realloc(text, cap);
            if (!t) {
                log_error("%s: out of memory", path);
                goto free_text;
            }
            text = t;
        }
        size_t r = fread(text + len, 1, cap - len, f);
        len += r;
        if (r == 0) break;
    }
    if (ferror(f)) {
        log_error("%s: read error", path);
        goto free_text;
    }
    tok_t *tok = NULL;
    if (ckpt_source_tokenizer(model, &tok, NULL) != BT_OK) goto free_text; /* it said why */
    uint32_t *ids = NULL;
    size_t n = 0;
    if (tok_encode(tok, text ? text : "", len, &ids, &n) != BT_OK) {
        log_error("%s: tokenization failed", path);
        goto free_tok;
    }
    for (size_t i = 0; i < n; i++) {
        if ((int64_t)ids[i] >= vocab) {
            log_error("%s: token %zu has id %u, outside the model's vocabulary (%lld): the "
                      "tokenizer does not match the model", path, i, ids[i], (long long)vocab);
            goto free_ids;
        }
        if (eval_seqs_push_id(s, (int32_t)ids[i]) != 0) {
            log_error("%s: out of memory", path);
            goto free_ids;
        }
    }
    if (n == 0) {
        log_error("%s: the text has no tokens", path);
        goto free_ids;
    }
    if (eval_seqs_push_seq(s, 0, (int64_t)n) != 0) {
        log_error("%s: out of memory", path);
        goto free_ids;
    }
    rc = 0;
free_ids:
    free(ids);
free_tok:
    tok_free(tok);
free_text:
    free(text);
    fclose(f);
    return rc;
}

/* Keeps the first max_tokens ids of all sequences together. */
static void eval_seqs_truncate(eval_seqs_t *s, int64_t max_tokens)
{
    int64_t left = max_tokens;
    int64_t n = 0;
    for (; n < s->n_seq && left > 0; n++) {
        if (s->len[n] > left) s->len[n] = left;
        left -= s->len[n];
    }
    s->n_seq = n;
    s->n_ids = max_tokens - left;
}

/* Cuts every sequence longer than window into windows of at most `window`. */
static int eval_seqs_window(eval_seqs_t *s, int64_t window)
{
    eval_seqs_t w = *s;
    w.start = NULL;
    w.len = NULL;
    w.n_seq = w.cap_seq = 0;
    for (int64_t i = 0; i < s->n_seq; i++)
        for (int64_t o = 0; o < s->len[i]; o += window) {
            int64_t n = s->len[i] - o < window ? s->len[i] - o : window;
            if (eval_seqs_push_seq(&w, s->start[i] + o, n) != 0) {
                free(w.start);
                free(w.len);
                return -1;
            }
        }
    free(s->start);
    free(s->len);
    s->start = w.start;
    s->len = w.len;
    s->n_seq = w.n_seq;
    s->cap_seq = w.cap_seq;
    return 0;
}

/* --ids: one line is one sequence, so a line longer than the model's
 * positions is refused rather than silently cut into windows, unless
 * --window asks for that. Positions past max_position_embeddings with an
 * explicit larger --window are the caller's choice (RoPE computes them;
 * transformers does too). */
static int eval_window_check(const eval_seqs_t *s, const char *ids_path, int64_t window,
                             int64_t max_pos)
{
    if (!ids_path || window != 0) return 0;
    for (int64_t i = 0; i < s->n_seq; i++)
        if (s->len[i] > max_pos) {
            log_error("%s: sequence %lld (of the non-blank lines) has %lld tokens, more than the model's "
                      "max_position_embeddings=%lld; give --window N to score it in windows of "
                      "N tokens (each scored on its own)", ids_path, (long long)i + 1,
                      (long long)s->len[i], (long long)max_pos);
            return -1;
        }
    return 0;
}

/* The result line. A loss or gradient norm that is not a finite number
 * (NaN or infinite weights, an overflow in the model) is an error: exit
 * status 1, a message on stderr, nothing on stdout, so that no script takes
 * it for a result (and --json never prints the non-JSON "nan"). A finite
 * loss whose perplexity overflows a double (loss > 709.78 nats) prints ppl
 * as null in JSON. */
static int eval_result_print(bool json, int64_t tokens, double loss, bool has_gn, double gn,
                             int64_t dropped, int64_t n_seq, int64_t window, const char *layout)
{
    if (!isfinite(loss) || (has_gn && !isfinite(gn))) {
        const char *what = !isfinite(loss) ? "loss" : "gradient norm";
        double v = !isfinite(loss) ? loss : gn;
        fprintf(stderr, "baton eval: the %s is %s, not a finite number: the model's weights "
                        "hold NaN or infinite values, or its activations overflowed (%lld scored "
                        "positions)\n", what, isnan(v) ? "NaN" : v > 0 ? "+infinity" : "-infinity",
                (long long)tokens);
        return 1;
    }
    double ppl = exp(loss);
    if (json) {
        printf("{\"tokens\": %lld, \"loss\": %.17g, \"ppl\": ", (long long)tokens, loss);
        run_json_num(stdout, "%.17g", ppl);
        if (has_gn) printf(", \"grad_norm\": %.17g", gn);
        if (dropped >= 0) printf(", \"moe_dropped\": %lld", (long long)dropped);
        printf("}\n");
        return 0;
    }
    printf("tokens %lld  loss %.6f nats  ppl %.4f", (long long)tokens, loss, ppl);
    if (has_gn) printf("  grad_norm %.6g", gn);
    if (dropped >= 0) printf("  moe_dropped %lld", (long long)dropped);
    if (layout)
        printf("  (%lld sequences, window %lld, layout %s)\n", (long long)n_seq, (long long)window,
               layout);
    else
        printf("  (%lld sequences, window %lld)\n", (long long)n_seq, (long long)window);
    return 0;
}

static void eval_usage(FILE *f)
{
    fprintf(f,
            "usage: baton eval --model DIR|FILE.gguf (--ids FILE | --text FILE) [--window T]\n"
            "                  [--max-tokens N] [--grad-norm] [--json] [--layout tp=N,pp=N,dp=N]\n"
            "  --model M      Hugging Face model directory (config.json + safetensors +\n"
            "                 tokenizer.json) or a llama GGUF file\n"
            "  --ids FILE     one sequence per line, whitespace-separated token ids\n"
            "  --text FILE    text, tokenized with the model's tokenizer\n"
            "  --window T     score sequences in windows of at most T tokens\n"
            "                 (default: max_position_embeddings)\n"
            "  --max-tokens N only the first N token ids of the input\n"
            "  --grad-norm    also print the global L2 norm of the loss gradient\n"
            "  --json         print one JSON object: {\"tokens\", \"loss\", \"ppl\"[, \"grad_norm\"]"
            "[, \"moe_dropped\"]}\n"
            "  --layout L     evaluate as processes in parallel layout L, e.g. tp=2,pp=2,dp=1\n"
            "                 (also cp=N and, for routed experts, ep=N)\n"
            "  --device D     cpu (default), cuda, cuda:N, fenced (the test device) or auto\n"
            "  --dtype P      fp32 (default) or bf16\n");
}

int cmd_eval(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'}, {"ids", required_argument, NULL, 'i'},
        {"text", required_argument, NULL, 't'},  {"window", required_argument, NULL, 'w'},
        {"grad-norm", no_argument, NULL, 'g'},   {"json", no_argument, NULL, 'j'},
        {"max-tokens", required_argument, NULL, 'n'},
        {"help", no_argument, NULL, 'h'},        {"layout", required_argument, NULL, 'l'},
        {"device", required_argument, NULL, 'd'}, {"dtype", required_argument, NULL, 'D'},
        {NULL, 0, NULL, 0},
    };
    const char *dir = NULL, *ids_path = NULL, *text_path = NULL, *layout = NULL;
    const char *device = NULL, *dtype = NULL;
    int64_t window = 0, max_tokens = 0;
    bool grad_norm = false, json = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'm': dir = optarg; break;
        case 'i': ids_path = optarg; break;
        case 't': text_path = optarg; break;
        case 'w': {
            char *end;
            long long v = strtoll(optarg, &end, 10);
            if (*end || v < 2) {
                fprintf(stderr, "baton eval: --window needs an integer >= 2, got '%s'\n", optarg);
                return 2;
            }
            window = v;
            break;
        }
        case 'n': {
            char *end;
            long long v = strtoll(optarg, &end, 10);
            if (*end || end == optarg || v < 2) {
                fprintf(stderr, "baton eval: --max-tokens needs an integer >= 2, got '%s'\n", optarg);
                return 2;
            }
            max_tokens = v;
            break;
        }
        case 'g': grad_norm = true; break;
        case 'j': json = true; break;
        case 'l': layout = optarg; break;
        case 'd': device = optarg; break;
        case 'D': dtype = optarg; break;
        case 'h': eval_usage(stdout); return 0;
        default: eval_usage(stderr); return 2;
        }
    }
    if (optind < argc || !dir || (!ids_path == !text_path)) {
        if (optind < argc) fprintf(stderr, "baton eval: unexpected argument '%s'\n", argv[optind]);
        else if (!dir) fprintf(stderr, "baton eval: --model DIR|FILE.gguf is required\n");
        else fprintf(stderr, "baton eval: give exactly one of --ids FILE and --text FILE\n");
        eval_usage(stderr);
        return 2;
    }

    int rc = 1;
    model_t *m = NULL;
    model_acts_t *a = NULL;
    eval_seqs_t seqs = {0};
    int32_t *targets = NULL;
    model_config_t cfg;
    model_place_t place;
    if (run_place_parse(device, dtype, &place) != BT_OK) return 2;
    /* The config first: the input is checked against it and the memory the
     * run needs is estimated before the weights are allocated. With
     * --layout the workers load the model, each its share; this process
     * never does. */
    if (ckpt_source_config(dir, &cfg) != BT_OK) return 1; /* the reader said why */
    if (text_path ? eval_text_read(text_path, dir, cfg.vocab_size, &seqs) != 0
                  : eval_ids_read(ids_path, cfg.vocab_size, &seqs) != 0)
        goto free_seqs;
    if (max_tokens > 0) eval_seqs_truncate(&seqs, max_tokens);
    int64_t max_pos = cfg.max_position_embeddings;
    if (eval_window_check(&seqs, ids_path, window, max_pos) != 0) goto free_seqs;
    bool default_window = window == 0;
    if (default_window) window = max_pos;
    int64_t n_before = seqs.n_seq;
    if (eval_seqs_window(&seqs, window) != 0) {
        log_error("eval: out of memory");
        goto free_seqs;
    }
    if (text_path && default_window && seqs.n_seq > n_before)
        fprintf(stderr, "baton eval: %s: %lld tokens scored as %lld windows of at most "
                        "max_position_embeddings=%lld tokens (--window sets another size)\n",
                text_path, (long long)seqs.n_ids, (long long)seqs.n_seq, (long long)window);
    int64_t tmax = 0, total = 0;
    for (int64_t i = 0; i < seqs.n_seq; i++) {
        if (seqs.len[i] > tmax) tmax = seqs.len[i];
        total += seqs.len[i] - 1;
    }
    if (total == 0) {
        log_error("%s: no scored positions (every sequence has a single token)",
                  text_path ? text_path : ids_path);
        goto free_seqs;
    }
    if (!layout) { /* --layout: the driver checks each rank's share (launch/driver.c) */
        run_mem_plan_t plan;
        run_mem_plan_single(&cfg, 1, tmax, grad_norm, false, 0, &plan);
        char hint[96], why[JOB_ERR_MAX];
        snprintf(hint, sizeof hint, "the activations of the longest window, %lld tokens (--window)",
                 (long long)tmax);
        if (run_mem_source_check(dir, &cfg, &plan, hint, why, sizeof why)) {
            fprintf(stderr, "baton eval: %s\n", why);
            goto free_seqs;
        }
    }
    if (layout) {
        if (grad_norm) {
            fprintf(stderr, "baton eval: --grad-norm is not available with --layout\n");
            goto free_seqs;
        }
        int64_t rows = seqs.n_seq, n_tok = 0;
        int32_t *ids = calloc((size_t)(rows * tmax) + 1, sizeof *ids);
        targets = malloc((size_t)(rows * tmax + 1) * sizeof *targets);
        double lloss = 0;
        if (!ids || !targets) {
            free(ids);
            goto free_targets;
        }
        for (int64_t i = 0; i < rows; i++)
            memcpy(ids + i * tmax, seqs.ids + seqs.start[i], (size_t)seqs.len[i] * sizeof *ids);
        model_targets_from_ids(targets, ids, seqs.len, rows, tmax);
        int drc = driver_eval(dir, layout, device, dtype, ids, targets, rows, tmax, &lloss, &n_tok);
        free(ids);
        if (drc) {
            rc = drc;
            goto free_targets;
        }
        if (n_tok != total) BT_PANIC("eval: scored %lld of %lld positions", (long long)n_tok,
                                     (long long)total);
        rc = eval_result_print(json, n_tok, lloss, false, 0, -1, rows, window, layout);
        goto free_targets;
    }
    if (ckpt_source_load_part(dir, NULL, NULL, &place, &m) != BT_OK) goto free_seqs; /* it said why */
    if ((grad_norm ? model_acts_create : model_acts_create_fwd)(m, 1, tmax, &a) != BT_OK)
        goto free_seqs;
    targets = malloc((size_t)tmax * sizeof *targets);
    if (!targets) goto destroy_acts;
    float dloss = grad_norm ? (float)(1.0 / (double)total) : 0.0f;
    double sum = 0;
    int64_t scored = 0;
    /* a long evaluation says how far it is, on stderr, every
     * BATON_PROGRESS_SECONDS (default 10) */
    clock_every_t every;
    clock_every_start(&every);
    for (int64_t i = 0; i < seqs.n_seq; i++) {
        double el;
        if (i > 0 && clock_every_due(&every, &el)) {
            fprintf(stderr, "baton eval: window %lld/%lld, %lld positions scored, loss so far %.4f, "
                            "%.0f tok/s, ETA %.0f s\n", (long long)i, (long long)seqs.n_seq,
                    (long long)scored, sum / (double)scored, (double)scored / el,
                    el / (double)i * (double)(seqs.n_seq - i));
        }
        int64_t T = seqs.len[i];
        const int32_t *ids = seqs.ids + seqs.start[i];
        model_targets_from_ids(targets, ids, NULL, 1, T);
        model_batch_t b = {.B = 1, .T = T, .ids = ids, .targets = targets};
        model_loss_t l;
        if (model_forward_backward(m, a, &b, dloss, &l) != BT_OK) goto free_targets;
        sum += l.loss_sum;
        scored += l.n_scored;
    }
    if (scored != total) BT_PANIC("eval: scored %lld of %lld positions", (long long)scored,
                                  (long long)total);
    double loss = sum / (double)scored;
    double gn = grad_norm ? sqrt(model_grads_sumsq(m)) : 0.0;
    /* routed choices an expert's capacity dropped (docs/MODELS.md): only
     * with a capacity_factor, so a dropless model prints what it always did */
    int64_t dropped = m->cfg.moe.capacity_factor > 0 ? m->moe_dropped : -1;
    rc = eval_result_print(json, scored, loss, grad_norm, gn, dropped, seqs.n_seq, window, NULL);
free_targets:
    free(targets);
destroy_acts:
    model_acts_destroy(a);
free_seqs:
    eval_seqs_free(&seqs);
    model_destroy(m);
    return rc;
}
