/* baton generate: a quick look at what a model says.
 *
 *   baton generate --model DIR|FILE.gguf --prompt TEXT [--max-new N]
 *                  [--temperature T] [--top-k K] [--top-p P] [--seed S]
 *                  [--bos] [--ignore-eos] [--json]
 *
 * The prompt is tokenized with the model's tokenizer without special tokens
 * (--bos puts the BOS id in front). Each new token is chosen from the logits
 * of the last position: --temperature 0 (the default) is greedy (the first
 * largest logit, as torch.argmax), else softmax(logits / T) restricted to
 * the K most likely tokens (--top-k, 0 = all) and then to the smallest set
 * whose probability reaches P (--top-p, 1 = all), drawn with xoshiro256**
 * seeded by --seed (train/train.h), so a seed gives the same text on every
 * run. Generation stops after N tokens or at an EOS id of the model
 * (ckpt/model_source.h says where they come from) unless --ignore-eos.
 *
 * The prompt runs through the model once (only its last position's logits
 * are computed), then each new token alone, attending over the K and V the
 * attention sublayers keep for every earlier position (a decode arena,
 * model_acts_create_decode). --no-cache instead runs the whole prefix again
 * for every token, the way to check the cache against (tests/sh/test_generate.sh).
 */
#include "launch/cli.h"

#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "ckpt/model_source.h"
#include "data/tokenizer.h"
#include "launch/job.h"
#include "launch/run_mem.h"
#include "launch/run_setup.h"
#include "model/model.h"
#include "train/train.h"

typedef struct {
    double   temperature; /* 0: greedy */
    int64_t  top_k;       /* 0: no limit */
    double   top_p;       /* 1: no limit */
    uint64_t seed;
} gen_sampling_t;

/* Index of the first largest value. */
static int64_t gen_argmax(const float *x, int64_t n)
{
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

typedef struct {
    float   p;
    int64_t id;
} gen_cand_t;

static int gen_cand_cmp(const void *a, const void *b)
{
    const gen_cand_t *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* One draw from softmax(logits / T) cut to top-k then top-p. cand[V] is scratch. */
static int64_t gen_sample(const float *logits, int64_t V, const gen_sampling_t *s,
                          train_rng_t *rng, gen_cand_t *cand)
{
    float mx = logits[gen_argmax(logits, V)];
    for (int64_t i = 0; i < V; i++) {
        cand[i].id = i;
        cand[i].p = (float)exp(((double)logits[i] - mx) / s->temperature);
    }
    qsort(cand, (size_t)V, sizeof *cand, gen_cand_cmp);
    int64_t n = s->top_k > 0 && s->top_k < V ? s->top_k : V;
    double kept = 0;
    for (int64_t i = 0; i < n; i++) kept += cand[i].p;
    /* smallest prefix whose share of the kept mass reaches top_p */
    if (s->top_p < 1.0) {
        double acc = 0;
        int64_t i = 0;
        while (i < n) {
            acc += cand[i++].p;
            if (acc >= s->top_p * kept) break;
        }
        n = i;
        kept = acc;
    }
    /* u in [0, kept): 53 random bits */
    double u = (double)(train_rng_next(rng) >> 11) * 0x1.0p-53 * kept;
    double acc = 0;
    for (int64_t i = 0; i < n; i++) {
        acc += cand[i].p;
        if (u < acc) return cand[i].id;
    }
    return cand[n - 1].id;
}

static void gen_usage(FILE *f)
{
    fprintf(f,
            "usage: baton generate --model DIR|FILE.gguf --prompt TEXT [--max-new N]\n"
            "                      [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
            "                      [--bos] [--ignore-eos] [--json] [--device D] [--dtype P]\n"
            "                      [--no-cache]\n"
            "  --model M        Hugging Face model directory or llama GGUF file\n"
            "  --prompt TEXT    tokenized without special tokens\n"
            "  --max-new N      new tokens at most (default 32)\n"
            "  --temperature T  0 = greedy (default); else sample from softmax(logits/T)\n"
            "  --top-k K        sample among the K most likely tokens (0 = all, default)\n"
            "  --top-p P        ... and among the smallest set reaching probability P (default 1)\n"
            "  --seed S         sampling seed (default 0)\n"
            "  --bos            put the model's BOS id before the prompt\n"
            "  --ignore-eos     do not stop at an EOS id\n"
            "  --json           print {\"prompt_ids\", \"ids\", \"text\"} (new tokens only)\n"
            "  --device D       cpu (default), cuda, cuda:N, fenced (the test device) or auto\n"
            "  --dtype P        fp32 (default) or bf16\n"
            "  --no-cache       recompute the whole prefix for every token (no KV cache)\n");
}

static bool gen_num(const char *opt, const char *arg, double lo, double hi, double *out)
{
    char *end;
    double v = strtod(arg, &end);
    if (*end || end == arg || !(v >= lo && v <= hi)) {
        fprintf(stderr, "baton generate: %s needs a number in [%g, %g], got '%s'\n", opt, lo, hi, arg);
        return false;
    }
    *out = v;
    return true;
}

int cmd_generate(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},       {"prompt", required_argument, NULL, 'p'},
        {"max-new", required_argument, NULL, 'n'},     {"temperature", required_argument, NULL, 't'},
        {"top-k", required_argument, NULL, 'k'},       {"top-p", required_argument, NULL, 'P'},
        {"seed", required_argument, NULL, 's'},        {"bos", no_argument, NULL, 'b'},
        {"ignore-eos", no_argument, NULL, 'e'},        {"json", no_argument, NULL, 'j'},
        {"device", required_argument, NULL, 'd'},      {"dtype", required_argument, NULL, 'D'},
        {"no-cache", no_argument, NULL, 'C'},          {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *model_path = NULL, *prompt = NULL, *device = NULL, *dtype = NULL;
    double max_new = 32, top_k = 0, seed = 0;
    gen_sampling_t smp = {.temperature = 0, .top_k = 0, .top_p = 1.0, .seed = 0};
    bool bos = false, ignore_eos = false, json = false, no_cache = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model_path = optarg; break;
        case 'p': prompt = optarg; break;
        case 'n': if (!gen_num("--max-new", optarg, 1, 1 << 20, &max_new)) return 2; break;
        case 't': if (!gen_num("--temperature", optarg, 0, 1e6, &smp.temperature)) return 2; break;
        case 'k': if (!gen_num("--top-k", optarg, 0, 1 << 30, &top_k)) return 2; break;
        case 'P': if (!gen_num("--top-p", optarg, 1e-9, 1, &smp.top_p)) return 2; break;
        case 's': if (!gen_num("--seed", optarg, 0, 9007199254740992.0, &seed)) return 2; break;
        case 'b': bos = true; break;
        case 'e': ignore_eos = true; break;
        case 'j': json = true; break;
        case 'd': device = optarg; break;
        case 'D': dtype = optarg; break;
        case 'C': no_cache = true; break;
        case 'h': gen_usage(stdout); return 0;
        default: gen_usage(stderr); return 2;
        }
    }
    if (optind < argc || !model_path || !prompt) {
        if (optind < argc) fprintf(stderr, "baton generate: unexpected argument '%s'\n", argv[optind]);
        else fprintf(stderr, "baton generate: --model and --prompt are required\n");
        gen_usage(stderr);
        return 2;
    }
    if (max_new != floor(max_new) || top_k != floor(top_k) || seed != floor(seed)) {
        fprintf(stderr, "baton generate: --max-new, --top-k and --seed take integers\n");
        return 2;
    }
    smp.top_k = (int64_t)top_k;
    smp.seed = (uint64_t)seed;

    int rc = 1;
    model_t *m = NULL;
    tok_t *tok = NULL;
    model_acts_t *a = NULL;
    uint32_t *pids = NULL;
    int32_t *ids = NULL, *targets = NULL, *pos = NULL;
    float *logits = NULL;
    gen_cand_t *cand = NULL;
    char *text = NULL;
    ckpt_source_special_t sp;
    model_config_t cfg;
    model_place_t place;
    if (run_place_parse(device, dtype, &place) != BT_OK) return 2;
    /* The config first: the run's memory is estimated before the weights
     * are allocated. */
    if (ckpt_source_config(model_path, &cfg) != BT_OK) return 1; /* the reader said why */
    if (ckpt_source_tokenizer(model_path, &tok, &sp) != BT_OK) goto out;
    size_t np = 0;
    if (tok_encode(tok, prompt, strlen(prompt), &pids, &np) != BT_OK) {
        log_error("generate: cannot tokenize the prompt");
        goto out;
    }
    int64_t V = cfg.vocab_size, n0 = (int64_t)np + (bos ? 1 : 0);
    int64_t tmax = n0 + (int64_t)max_new;
    if (bos && sp.bos < 0) {
        log_error("generate: --bos: %s names no BOS token", model_path);
        goto out;
    }
    if (n0 == 0) {
        log_error("generate: the prompt has no tokens (give some text or --bos)");
        goto out;
    }
    if (tmax > cfg.max_position_embeddings) {
        log_error("generate: prompt (%lld tokens) + --max-new %lld exceeds the model's %lld positions",
                  (long long)n0, (long long)max_new, (long long)cfg.max_position_embeddings);
        goto out;
    }
    run_mem_plan_t plan; /* + the logits (every position's without the cache) and the sampling scratch */
    double n_logits = no_cache ? (double)tmax : 1.0;
    run_mem_plan_single(&cfg, 1, tmax, false, !no_cache,
                        n_logits * (double)V * sizeof *logits + (double)V * sizeof *cand, &plan);
    char hint[96], why[JOB_ERR_MAX];
    snprintf(hint, sizeof hint, "the activations of %lld positions (the prompt + --max-new)",
             (long long)tmax);
    if (run_mem_source_check(model_path, &cfg, &plan, hint, why, sizeof why)) {
        fprintf(stderr, "baton generate: %s\n", why);
        goto out;
    }
    if (ckpt_source_load_part(model_path, NULL, NULL, &place, &m) != BT_OK) goto out; /* it said why */
    ids = malloc((size_t)tmax * sizeof *ids);
    pos = malloc((size_t)tmax * sizeof *pos);
    targets = malloc((size_t)tmax * sizeof *targets);
    logits = malloc((size_t)(no_cache ? tmax : 1) * (size_t)V * sizeof *logits);
    cand = malloc((size_t)V * sizeof *cand);
    if (!ids || !pos || !targets || !logits || !cand) {
        log_error("generate: out of memory");
        goto out;
    }
    int64_t n = 0;
    if (bos) ids[n++] = (int32_t)sp.bos;
    for (size_t i = 0; i < np; i++) {
        if ((int64_t)pids[i] >= V) {
            log_error("generate: prompt token %zu has id %u, outside the model's vocabulary (%lld)",
                      i, pids[i], (long long)V);
            goto out;
        }
        ids[n++] = (int32_t)pids[i];
    }
    for (int64_t i = 0; i < tmax; i++) targets[i] = MODEL_IGNORE_INDEX;
    if ((no_cache ? model_acts_create_fwd(m, 1, tmax, &a) : model_acts_create_decode(m, tmax, &a)) !=
        BT_OK)
        goto out;
    train_rng_t rng;
    train_rng_seed(&rng, smp.seed);
    for (int64_t i = 0; i < tmax; i++) pos[i] = (int32_t)i;
    int64_t done = 0; /* positions the decode arena has seen */
    while (n < tmax) {
        /* with the cache: the tokens not yet seen (the prompt, then the last
         * new one); without: the whole prefix. Only the last row's logits. */
        int64_t from = no_cache ? 0 : done;
        model_batch_t b = {.B = 1, .T = n - from, .ids = ids + from, .targets = targets,
                           .pos = pos + from, .logits_out = logits, .logits_from = n - from - 1};
        model_loss_t l;
        if (model_forward_backward(m, a, &b, 0.0f, &l) != BT_OK) goto out;
        done = n;
        const float *last = logits;
        int64_t next = smp.temperature == 0 ? gen_argmax(last, V) : gen_sample(last, V, &smp, &rng, cand);
        ids[n++] = (int32_t)next;
        bool stop = false;
        for (int i = 0; i < sp.n_eos && !ignore_eos; i++) stop |= next == sp.eos[i];
        if (stop) break;
    }
    size_t tlen;
    bt_status_t st = json ? tok_decode(tok, (const uint32_t *)(ids + n0), (size_t)(n - n0), &text, &tlen)
                          : tok_decode(tok, (const uint32_t *)ids, (size_t)n, &text, &tlen);
    if (st != BT_OK) {
        log_error("generate: cannot decode the generated ids");
        goto out;
    }
    if (json) {
        printf("{\"prompt_ids\": [");
        for (int64_t i = 0; i < n0; i++) printf("%s%d", i ? ", " : "", ids[i]);
        printf("], \"ids\": [");
        for (int64_t i = n0; i < n; i++) printf("%s%d", i > n0 ? ", " : "", ids[i]);
        printf("], \"text\": ");
        run_json_str(stdout, text, tlen);
        printf("}\n");
    } else {
        fwrite(text, 1, tlen, stdout);
        printf("\n");
    }
    rc = 0;
out:
    free(text);
    free(cand);
    free(logits);
    free(targets);
    free(ids);
    free(pos);
    free(pids);
    model_acts_destroy(a);
    tok_free(tok);
    model_destroy(m);
    return rc;
}
