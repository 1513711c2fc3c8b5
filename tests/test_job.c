/* Job files: parsing, types, overrides and every validation rule, each
 * failure checked for the file, line and field it names. */
#include "launch/job.h"

#include <fcntl.h>
#include <stdbool.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/test.h"

static char err[JOB_ERR_MAX];

static const char *good =
    "model:\n"
    "  layers: 4\n"
    "  hidden: 256\n"
    "  heads: 8\n"
    "  kv_heads: 4\n"
    "  vocab: 1000\n"
    "  seq: 512\n"
    "data:\n"
    "  dir: /tmp/shards\n"
    "  seq_len: 256\n"
    "  split: 0.05\n"
    "train: {steps: 50, micro_batch: 2, grad_accum: 4, seed: 7, eval_every: 10, log_every: 5}\n"
    "optim:\n"
    "  lr: 1e-3\n"
    "  min_lr: 1.0e-4\n"
    "  warmup: 5\n"
    "  warmup_from: min_lr\n"
    "  betas: [0.9, 0.99]\n"
    "  eps: 1e-8\n"
    "  weight_decay: 0.05\n"
    "  clip: 0.5\n"
    "  decay: all\n"
    "parallel:\n"
    "  tp: 2\n"
    "  pp: 2\n"
    "  dp: 1\n"
    "  split: [1, 3]\n"
    "  schedule: 1f1b\n"
    "  microbatches: 4\n"
    "  zero1: false\n"
    "transport: {control: tcp, pipeline: inproc, data_parallel: auto}\n"
    "hosts: [local]\n"
    "export: {dir: /tmp/ck, every: 10}\n"
    "checkpoint: {dir: /tmp/ckn, every: 5, keep: 2}\n"
    "trace: {dir: /tmp/tr}\n"
    "metrics: {file: m.jsonl, plot: loss.png}\n";

static void test_job_parse_all_sections(void)
{
    job_t job;
    REQUIRE(job_load_string("good.yaml", good, &job, err, sizeof err) == BT_OK);
    CHECK(job_validate(&job, err, sizeof err) == BT_OK);
    CHECK(job.model.layers == 4 && job.model.hidden == 256 && job.model.heads == 8);
    CHECK(job.model.kv_heads == 4 && job.model.vocab == 1000 && job.model.seq == 512);
    CHECK(!strcmp(job.data.dir, "/tmp/shards") && job.data.seq_len == 256);
    CHECK_NEAR(job.data.split, 0.05, 0, 0);
    CHECK(job.train.steps == 50 && job.train.micro_batch == 2 && job.train.grad_accum == 4);
    CHECK(job.train.seed == 7 && job.train.eval_every == 10 && job.train.log_every == 5);
    CHECK_NEAR(job.optim.lr, 1e-3, 0, 0);
    CHECK_NEAR(job.optim.min_lr, 1e-4, 0, 0);
    CHECK(job.optim.warmup == 5 && job.optim.warmup_from == JOB_WARMUP_FROM_MIN);
    CHECK_NEAR(job.optim.betas[1], 0.99, 0, 0);
    CHECK_NEAR(job.optim.clip, 0.5, 0, 0);
    CHECK(job.optim.decay == JOB_DECAY_ALL);
    CHECK(job.parallel.tp == 2 && job.parallel.pp == 2 && job.parallel.n_split == 2);
    CHECK(job.parallel.split[0] == 1 && job.parallel.split[1] == 3);
    CHECK(job.transport[JOB_EDGE_CONTROL] == JOB_XPORT_TCP);
    CHECK(job.transport[JOB_EDGE_PIPELINE] == JOB_XPORT_INPROC);
    CHECK(job.transport[JOB_EDGE_TENSOR_PARALLEL] == JOB_XPORT_AUTO);
    CHECK(job.n_hosts == 1 && !strcmp(job.hosts[0], "local"));
    CHECK(!strcmp(job.export.dir, "/tmp/ck") && job.export.every == 10);
    CHECK(!strcmp(job.checkpoint.dir, "/tmp/ckn") && job.checkpoint.every == 5 && job.checkpoint.keep == 2);
    CHECK(!strcmp(job.trace_dir, "/tmp/tr") && !strcmp(job.metrics.plot, "loss.png"));
    int64_t layers[8];
    CHECK(job_stage_layers(&job, layers, 8) == 2 && layers[0] == 1 && layers[1] == 3);
}

static void test_job_defaults_and_derived(void)
{
    job_t job;
    REQUIRE(job_load_string("d.yaml", "data: {dir: x}\nmodel: {hidden: 96, heads: 3, vocab: 50}\n",
                            &job, err, sizeof err) == BT_OK);
    REQUIRE(job_validate(&job, err, sizeof err) == BT_OK);
    CHECK(job.model.kv_heads == 3);                /* = heads */
    CHECK(job.model.ffn == 256);                   /* 8*96/3 = 256, multiple of 64 */
    CHECK(job.model.seq == job.data.seq_len);
    CHECK(job.model.init_seed == job.train.seed);
    int64_t layers[4];
    job.model.layers = 5;
    job.parallel.pp = 2;
    CHECK(job_stage_layers(&job, layers, 4) == 2 && layers[0] == 3 && layers[1] == 2);
}

/* Expect `yaml` to fail in job_load_string (or in validate when load passes)
 * with a message containing every one of the given fragments. */
static void expect_error(const char *yaml, const char *frag1, const char *frag2, const char *frag3)
{
    job_t job;
    err[0] = '\0';
    bt_status_t st = job_load_string("bad.yaml", yaml, &job, err, sizeof err);
    if (st == BT_OK) st = job_validate(&job, err, sizeof err);
    CHECK_MSG(st == BT_ERR_INVALID, "accepted:\n%s", yaml);
    CHECK_MSG(strstr(err, frag1) != NULL, "'%s' lacks '%s'", err, frag1);
    if (frag2) CHECK_MSG(strstr(err, frag2) != NULL, "'%s' lacks '%s'", err, frag2);
    if (frag3) CHECK_MSG(strstr(err, frag3) != NULL, "'%s' lacks '%s'", err, frag3);
}

#define BASE "data: {dir: x}\n"

static void test_job_unknown_key(void)
{
    expect_error(BASE "optim:\n  lr: 0.1\n  lrr: 0.2\n", "bad.yaml:4:3:", "optim.lrr", "unknown key");
    expect_error(BASE "optimizer:\n  lr: 0.1\n", "bad.yaml:2:1:", "optimizer", "unknown section (did you mean optim?)");
    /* the nearest known key, a typo or the right key in the wrong section */
    expect_error(BASE "train:\n  stpes: 3\n", "bad.yaml:3:3:", "train.stpes", "did you mean train.steps?");
    expect_error(BASE "optim:\n  steps: 3\n", "bad.yaml:3:3:", "optim.steps", "did you mean train.steps?");
    expect_error(BASE "train:\n  zzzzzzzz: 3\n", "bad.yaml:3:3:", "train.zzzzzzzz", "docs/JOBS.md lists every field");
    expect_error(BASE "optim:\n  lr: 1\n  lr: 2\n", "bad.yaml:4:3:", "optim.lr", "duplicate");
}

static void test_job_wrong_type(void)
{
    expect_error(BASE "train:\n  steps: ten\n", "bad.yaml:3:10:", "train.steps", "expected an integer");
    expect_error(BASE "train:\n  steps: 1.5\n", "bad.yaml:3:10:", "train.steps", "expected an integer");
    expect_error(BASE "optim:\n  lr: \"0.1\"\n", "bad.yaml:3:7:", "optim.lr", "quoted");
    expect_error(BASE "parallel:\n  zero1: maybe\n", "bad.yaml:3:10:", "parallel.zero1", "true or false");
    expect_error(BASE "parallel:\n  schedule: gpipe\n", "bad.yaml:3:13:", "parallel.schedule",
                 "1f1b|interleaved");
    expect_error(BASE "optim:\n  betas: [0.9]\n", "bad.yaml:3:10:", "optim.betas", "exactly 2");
    expect_error(BASE "parallel:\n  split: [1, x]\n", "bad.yaml:3:14:", "parallel.split", "integer");
    expect_error(BASE "transport:\n  pipeline: carrier-pigeon\n", "bad.yaml:3:13:",
                 "transport.pipeline", "auto|inproc|tcp|ucx");
    expect_error(BASE "model: 3\n", "bad.yaml:2:8:", "model", "mapping");
    expect_error(BASE "optim:\n  lr: [1, 2\n", "bad.yaml:", "(syntax)", NULL);
}

static void test_job_out_of_range(void)
{
    expect_error(BASE "train:\n  micro_batch: 0\n", "bad.yaml:3:16:", "train.micro_batch", "out of range");
    expect_error(BASE "optim:\n  betas: [0.9, 1.5]\n", "bad.yaml:3:16:", "optim.betas", "out of range");
    expect_error(BASE "data:\n  split: -0.1\n", "bad.yaml", "data", "duplicate"); /* data twice */
    expect_error("data: {dir: x, split: 0.95}\n", "bad.yaml:1:23:", "data.split", "out of range");
    expect_error(BASE "optim: {lr: 0.001, min_lr: 0.01}\n", "bad.yaml:2:20:", "optim.min_lr",
                 "larger than optim.lr");
    expect_error(BASE "train: {steps: 10}\noptim: {warmup: 11}\n", "bad.yaml:3:9:", "optim.warmup",
                 "exceed");
    expect_error(BASE "export: {every: 5}\n", "bad.yaml:2:10:", "export.every",
                 "export.dir names no directory");
    expect_error(BASE "checkpoint: {every: 5}\n", "bad.yaml:2:14:", "checkpoint.every",
                 "checkpoint.dir names no directory");
    expect_error(BASE "train: {steps: 10, stop_after: 11}\n", "bad.yaml:2:20:", "train.stop_after",
                 "past train.steps");
}

/* Out-of-range integers say the allowed range (in full, not as %g), in the
 * file and in --set, instead of "expected an integer". */
static void test_job_integer_range(void)
{
    expect_error(BASE "model: {vocab: 99999999999999999999}\n", "bad.yaml:2:16:", "model.vocab",
                 "99999999999999999999 is out of range [0, 16777216]");
    expect_error(BASE "model: {vocab: 16777217}\n", "bad.yaml:2:16:", "model.vocab",
                 "16777217 is out of range [0, 16777216]");
    expect_error(BASE "train: {steps: 1e400}\n", "bad.yaml:2:16:", "train.steps",
                 "1e400 is out of range [1, 9000000000000000]");
    expect_error(BASE "train: {steps: -99999999999999999999}\n", "train.steps",
                 "is out of range [1, 9000000000000000]", NULL);
    expect_error(BASE "parallel: {pp: 2, split: [1, 99999999999999999999]}\n", "bad.yaml:2:30:",
                 "parallel.split", "out of range [1, 4096]");
    expect_error(BASE "optim: {lr: 1e400}\n", "bad.yaml:2:13:", "optim.lr", "1e400 is out of range [0, 10]");
    expect_error(BASE "optim: {eps: 1e-400}\n", "bad.yaml:2:14:", "optim.eps", "1e-400 is out of range [1e-30, 1]");
    /* not numbers at all are still said to be that */
    expect_error(BASE "model: {vocab: 12abc}\n", "model.vocab", "expected an integer, got '12abc'", NULL);
    expect_error(BASE "optim: {lr: nan}\n", "optim.lr", "expected a number", NULL);

    job_t job;
    REQUIRE(job_load_string("good.yaml", good, &job, err, sizeof err) == BT_OK);
    CHECK(job_override(&job, "model.vocab=99999999999999999999", err, sizeof err) == BT_ERR_INVALID);
    CHECK_MSG(strstr(err, "--set model.vocab=99999999999999999999: model.vocab:") &&
              strstr(err, "out of range [0, 16777216]"), "%s", err);
    CHECK(job_override(&job, "model.hidden=2097152", err, sizeof err) == BT_ERR_INVALID);
    CHECK_MSG(strstr(err, "2097152 is out of range [1, 1048576]"), "%s", err);
    CHECK(job_override(&job, "parallel.split=[1, 1e30]", err, sizeof err) == BT_ERR_INVALID);
    CHECK_MSG(strstr(err, "parallel.split") && strstr(err, "out of range [1, 4096]"), "%s", err);
}

/* A file of `depth` nested flow lists under key x (2 bytes a level). */
static bool deep_file_write(const char *path, int depth)
{
    FILE *f = fopen(path, "w");
    if (!f) return false;
    fputs("data: {dir: x}\nhosts: ", f);
    for (int i = 0; i < depth; i++) fputc('[', f);
    for (int i = 0; i < depth; i++) fputc(']', f);
    fputc('\n', f);
    return fclose(f) == 0;
}

/* Deep nesting and huge files are refused with the limit, before libyaml
 * spends time quadratic in the depth on them (200 000 levels: minutes). */
static void test_job_input_limits(void)
{
    char path[] = "/tmp/test_job_deepXXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    close(fd);
    job_t job;
    REQUIRE(deep_file_write(path, 200000));
    CHECK(job_load(path, &job, err, sizeof err) == BT_ERR_INVALID);
    char want[128];
    snprintf(want, sizeof want, "%s:2:39: (file): nested deeper than 32 levels", path);
    CHECK_MSG(strstr(err, want), "%s", err);
    /* 32 levels are allowed by the reader (the schema then refuses the list) */
    REQUIRE(deep_file_write(path, 31));
    CHECK(job_load(path, &job, err, sizeof err) == BT_ERR_INVALID);
    CHECK_MSG(strstr(err, "hosts") && strstr(err, "entry 0") && !strstr(err, "nested"), "%s", err);

    /* block nesting counts the same */
    char block[4096] = "data: {dir: x}\n";
    size_t o = strlen(block);
    for (int i = 0; i < 40 && o + 100 < sizeof block; i++)
        o += (size_t)snprintf(block + o, sizeof block - o, "%*sk%d:\n", 2 * i, "", i);
    expect_error(block, "bad.yaml:34:", "(file): nested deeper than 32 levels", NULL);

    /* size: one byte over the limit (a comment) */
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    fputs("data: {dir: x}\n#", f);
    for (unsigned i = 0; i < JOB_FILE_MAX_BYTES; i++) fputc('x', f);
    fputc('\n', f);
    REQUIRE(fclose(f) == 0);
    CHECK(job_load(path, &job, err, sizeof err) == BT_ERR_INVALID);
    snprintf(want, sizeof want, "%s: (file): %u bytes, more than the 1048576-byte limit", path,
             JOB_FILE_MAX_BYTES + 17);
    CHECK_MSG(strstr(err, want), "%s", err);
    unlink(path);

    /* --set values: the same depth limit */
    REQUIRE(job_load_string("good.yaml", good, &job, err, sizeof err) == BT_OK);
    char *deep = malloc(2 * 100000 + 16);
    REQUIRE(deep);
    o = (size_t)sprintf(deep, "hosts=");
    for (int i = 0; i < 100000; i++) deep[o++] = '[';
    for (int i = 0; i < 100000; i++) deep[o++] = ']';
    deep[o] = '\0';
    CHECK(job_override(&job, deep, err, sizeof err) == BT_ERR_INVALID);
    CHECK_MSG(strstr(err, "--set hosts=[[[") && strstr(err, "(200006 bytes): hosts: nested deeper than 32 levels"),
              "%s", err);
    free(deep);
}

static void test_job_model_shape_rules(void)
{
    expect_error(BASE "model:\n  hidden: 64\n  heads: 6\n", "bad.yaml:4:3:", "model.heads",
                 "do not divide hidden");
    expect_error(BASE "model:\n  heads: 4\n  kv_heads: 3\n", "bad.yaml:4:3:", "model.kv_heads",
                 "do not divide");
    expect_error(BASE "model: {seq: 64}\ndata: {seq_len: 128}\n", "bad.yaml", "data", "duplicate");
    expect_error("data: {dir: x, seq_len: 128}\nmodel: {seq: 64}\n", "bad.yaml:1:16:",
                 "data.seq_len", "longer than");
    expect_error("train: {steps: 3}\n", "bad.yaml: data.dir", "required", NULL);
}

static void test_job_attention(void)
{
    job_t job;
    REQUIRE(job_load_string("a.yaml", BASE "attention: cudnn\n", &job, err, sizeof err) == BT_OK);
    CHECK(job_validate(&job, err, sizeof err) == BT_OK);
    CHECK(job.attention == JOB_ATTN_CUDNN && !strcmp(job_attention_env(job.attention), "cudnn"));
    REQUIRE(job_load_string("a.yaml", BASE, &job, err, sizeof err) == BT_OK);
    CHECK(job.attention == JOB_ATTN_DEFAULT && job_attention_env(job.attention) == NULL);
    expect_error(BASE "attention: cudnnn\n", "bad.yaml:2:12:", "attention", "cudnn");
}

static void test_job_parallel_rules(void)
{
    /* tp must divide the attention heads, and divide the KV heads or (replicating
     * them) be a multiple of them */
    expect_error(BASE "model: {hidden: 96, heads: 6, kv_heads: 2}\nparallel:\n  tp: 3\n",
                 "bad.yaml:4:3:", "parallel.tp", "3 is not a multiple of 2 KV heads");
    expect_error(BASE "model: {hidden: 96, heads: 12, kv_heads: 6}\nparallel:\n  tp: 4\n",
                 "bad.yaml:4:3:", "parallel.tp", "4 does not divide 6 KV heads");
    {
        job_t ok;
        char e[512];
        REQUIRE(job_load_string("ok.yaml", BASE "model: {hidden: 64, heads: 4, kv_heads: 2}\n"
                                               "parallel:\n  tp: 4\n", &ok, e, sizeof e) == BT_OK);
        CHECK_MSG(job_validate(&ok, e, sizeof e) == BT_OK, "tp 4 over 2 KV heads: %s", e);
    }
    expect_error(BASE "model: {hidden: 96, heads: 6, kv_heads: 6}\nparallel:\n  tp: 4\n",
                 "bad.yaml:4:3:", "parallel.tp", "6 attention heads");
    /* a split must cover every layer exactly: never a silently dropped one */
    expect_error(BASE "model: {layers: 4}\nparallel:\n  pp: 2\n  split: [1, 2]\n", "bad.yaml:5:3:",
                 "parallel.split", "sum to 3, but the model has 4 layers");
    expect_error(BASE "model: {layers: 4}\nparallel:\n  pp: 2\n  split: [4]\n", "bad.yaml:5:3:",
                 "parallel.split", "1 entries, but there are 2 stages");
    expect_error(BASE "model: {layers: 4}\nparallel:\n  pp: 2\n  split: [0, 4]\n", "bad.yaml:5:11:",
                 "parallel.split", "out of range");
    /* more stages than layers */
    expect_error(BASE "model: {layers: 2}\ntrain: {grad_accum: 8}\nparallel:\n  pp: 3\n",
                 "bad.yaml:5:3:", "parallel.pp", "3 pipeline stages");
    expect_error(BASE "model: {layers: 4}\ntrain: {grad_accum: 8}\n"
                 "parallel: {pp: 2, virtual_stages: 3, schedule: interleaved}\n",
                 "bad.yaml:4:19:", "parallel.virtual_stages", "6 pipeline stages");
    expect_error(BASE "model: {layers: 4}\nparallel: {pp: 2, virtual_stages: 2}\n", "bad.yaml",
                 "parallel.schedule", "interleaved");
    expect_error(BASE "model: {layers: 8}\nparallel: {pp: 4, microbatches: 2}\n", "bad.yaml:3:19:",
                 "parallel.microbatches", "cannot fill");
    expect_error(BASE "parallel: {zero1: true}\n", "bad.yaml:2:12:", "parallel.zero1", "dp >= 2");
    expect_error(BASE "hosts: {a: 1}\n", "bad.yaml:2:8:", "hosts", "list of strings");
    /* context parallelism: 2 x cp equal chunks of every sequence */
    expect_error("data: {dir: x, seq_len: 100}\nparallel: {cp: 4}\n", "bad.yaml:2:12:",
                 "parallel.cp", "seq_len 100 does not cut into 2 x cp = 8");
    expect_error(BASE "parallel: {cp: 2, cp_mode: rings}\n", "bad.yaml:2:28:",
                 "parallel.cp_mode", "allgather");
    expect_error(BASE "parallel: {cp: 0}\n", "bad.yaml:2:16:", "parallel.cp", "out of range");
    /* sequence parallelism shards inside a TP group */
    expect_error(BASE "parallel: {sequence_parallel: true}\n", "bad.yaml:2:12:",
                 "parallel.sequence_parallel", "needs tp >= 2");
}

static void test_job_overrides(void)
{
    job_t job;
    REQUIRE(job_load_string("good.yaml", good, &job, err, sizeof err) == BT_OK);
    CHECK(job_override(&job, "optim.lr=0.01", err, sizeof err) == BT_OK);
    CHECK_NEAR(job.optim.lr, 0.01, 0, 0);
    CHECK(job_override(&job, "train.steps=7", err, sizeof err) == BT_OK && job.train.steps == 7);
    CHECK(job_override(&job, "parallel.split=[2, 2]", err, sizeof err) == BT_OK);
    CHECK(job.parallel.n_split == 2 && job.parallel.split[0] == 2);
    CHECK(job_override(&job, "optim.betas=[0.8,0.9]", err, sizeof err) == BT_OK);
    CHECK_NEAR(job.optim.betas[0], 0.8, 0, 0);
    CHECK(job_override(&job, "parallel.zero1=true", err, sizeof err) == BT_OK && job.parallel.zero1);
    CHECK(job_override(&job, "transport.pipeline=tcp", err, sizeof err) == BT_OK);
    CHECK(job.transport[JOB_EDGE_PIPELINE] == JOB_XPORT_TCP);
    CHECK(job_override(&job, "trace.dir=", err, sizeof err) == BT_OK && job.trace_dir[0] == '\0');
    CHECK(job_override(&job, "hosts=[local, local]", err, sizeof err) == BT_OK && job.n_hosts == 2);

    CHECK(job_override(&job, "optim.lr=fast", err, sizeof err) == BT_ERR_INVALID);
    CHECK(strstr(err, "--set optim.lr=fast") && strstr(err, "expected a number"));
    CHECK(job_override(&job, "optim.nope=1", err, sizeof err) == BT_ERR_INVALID);
    CHECK(strstr(err, "optim.nope") && strstr(err, "unknown key"));
    CHECK(job_override(&job, "train.steps", err, sizeof err) == BT_ERR_INVALID);
    CHECK(strstr(err, "section.key=value"));
    CHECK(job_override(&job, "train.steps=-3", err, sizeof err) == BT_ERR_INVALID);
    CHECK(strstr(err, "out of range"));

    /* a validation failure caused by an override names the override */
    REQUIRE(job_load_string("good.yaml", good, &job, err, sizeof err) == BT_OK);
    CHECK(job_override(&job, "parallel.tp=3", err, sizeof err) == BT_OK);
    CHECK(job_validate(&job, err, sizeof err) == BT_ERR_INVALID);
    CHECK_MSG(strstr(err, "--set parallel.tp=3: parallel.tp:") && strstr(err, "does not divide 8 attention heads"),
              "%s", err);
}

static void test_job_hf_config(void)
{
    char dir[] = "/tmp/test_job_hfXXXXXX";
    REQUIRE(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "we");
    REQUIRE(f);
    fprintf(f, "{\"model_type\": \"llama\", \"num_hidden_layers\": 3, \"hidden_size\": 48, \"num_attention_heads\": 6,"
               " \"num_key_value_heads\": 2, \"intermediate_size\": 100, \"vocab_size\": 77,"
               " \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-6}\n");
    fclose(f);
    char yaml[512];
    job_t job;
    snprintf(yaml, sizeof yaml, "data: {dir: x, seq_len: 32}\nmodel:\n  hf: %s\nparallel: {pp: 3}\ntrain: {grad_accum: 3}\n", dir);
    REQUIRE(job_load_string("hf.yaml", yaml, &job, err, sizeof err) == BT_OK);
    CHECK_MSG(job_validate(&job, err, sizeof err) == BT_OK, "%s", err);
    CHECK(job.model.layers == 3 && job.model.heads == 6 && job.model.kv_heads == 2);
    CHECK(job.model.ffn == 100 && job.model.vocab == 77 && job.model.seq == 64);
    CHECK_NEAR(job.model.norm_eps, 1e-6, 0, 0);

    /* pp 4 > 3 layers read from config.json */
    snprintf(yaml, sizeof yaml, "data: {dir: x, seq_len: 32}\nmodel:\n  hf: %s\nparallel: {pp: 4}\ntrain: {grad_accum: 4}\n", dir);
    expect_error(yaml, "bad.yaml:4:12:", "parallel.pp", "only 3 layers");
    /* tp 3 is not a multiple of the 2 KV heads from config.json */
    snprintf(yaml, sizeof yaml, "data: {dir: x, seq_len: 32}\nmodel:\n  hf: %s\nparallel: {tp: 3}\n", dir);
    expect_error(yaml, "parallel.tp", "is not a multiple of 2 KV heads", NULL);
    /* shape keys conflict with hf */
    snprintf(yaml, sizeof yaml, "data: {dir: x, seq_len: 32}\nmodel:\n  hf: %s\n  layers: 2\n", dir);
    expect_error(yaml, "bad.yaml:4:3:", "model.layers", "model.hf");
    /* missing directory */
    expect_error(BASE "model:\n  hf: /nonexistent/dir\n", "bad.yaml:3:3:", "model.hf",
                 "/nonexistent/dir/config.json");
    unlink(path);
    rmdir(dir);
}

static void test_job_file_errors(void)
{
    job_t job;
    CHECK(job_load("/nonexistent/job.yaml", &job, err, sizeof err) == BT_ERR_INVALID);
    CHECK(strstr(err, "/nonexistent/job.yaml") && strstr(err, "cannot open"));
    char path[] = "/tmp/test_job_XXXXXX";
    int fd = mkostemp(path, O_CLOEXEC);
    REQUIRE(fd >= 0);
    const char *text = "data:\n  dir: d\ntrain:\n  log_every: 0\n";
    CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
    close(fd);
    CHECK(job_load(path, &job, err, sizeof err) == BT_ERR_INVALID);
    char want[64];
    snprintf(want, sizeof want, "%s:4:14:", path);
    CHECK_MSG(strstr(err, want) && strstr(err, "train.log_every"), "%s", err);
    unlink(path);
    CHECK(job_load_string("e.yaml", "", &job, err, sizeof err) == BT_ERR_INVALID);
    CHECK(strstr(err, "empty"));
    CHECK(job_load_string("l.yaml", "- a\n- b\n", &job, err, sizeof err) == BT_ERR_INVALID);
    CHECK(strstr(err, "l.yaml:1:1:") && strstr(err, "mapping"));
}

static void test_job_schema_names(void)
{
    /* every schema field is reachable by override with its own name */
    int n = job_field_count();
    CHECK(n > 40);
    for (int i = 0; i < n; i++) CHECK(job_field_name(i) && strchr(job_field_name(i), ' ') == NULL);
    CHECK(job_field_name(n) == NULL);
}

/* The example job files under jobs/ stay valid. */
static void test_job_examples_valid(void)
{
    static const char *const files[] = {"jobs/austen_small.yaml", "jobs/tiny_hf.yaml",
                                        "jobs/layout_example.yaml"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        job_t job;
        bt_status_t st = job_load(files[i], &job, err, sizeof err);
        if (st == BT_OK) st = job_validate(&job, err, sizeof err);
        CHECK_MSG(st == BT_OK, "%s: %s", files[i], err);
    }
    /* every job file of jobs/ reads (those naming a fetched model or
     * data are validated where the model is: here they must parse) */
    glob_t gl;
    REQUIRE(glob("jobs/*.yaml", 0, NULL, &gl) == 0);
    CHECK(gl.gl_pathc >= 8);
    for (size_t i = 0; i < gl.gl_pathc; i++) {
        static job_t any;
        CHECK_MSG(job_load(gl.gl_pathv[i], &any, err, sizeof err) == BT_OK, "%s: %s", gl.gl_pathv[i], err);
    }
    globfree(&gl);
    job_t job;
    REQUIRE(job_load("jobs/layout_example.yaml", &job, err, sizeof err) == BT_OK);
    REQUIRE(job_validate(&job, err, sizeof err) == BT_OK);
    CHECK(job.parallel.tp == 2 && job.parallel.pp == 2 && job.parallel.dp == 2);
    CHECK(job.parallel.schedule == JOB_SCHED_INTERLEAVED && job.parallel.zero1);
    CHECK(job.transport[JOB_EDGE_TENSOR_PARALLEL] == JOB_XPORT_INPROC);
    int64_t layers[8];
    CHECK(job_stage_layers(&job, layers, 8) == 4 && layers[3] == 2);
    /* one layer short in the split: an error naming the file and line */
    CHECK(job_override(&job, "parallel.split=[2,2,2,1]", err, sizeof err) == BT_OK);
    CHECK(job_validate(&job, err, sizeof err) == BT_ERR_INVALID && strstr(err, "sum to 7"));
}

/* The resolved job a run directory records (job_write_yaml) loads back to
 * the same job: every field, overrides included, lists and quoted paths. */
static char *yaml_of(const job_t *job)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return NULL;
    job_write_yaml(job, f);
    fclose(f);
    return text;
}

static void test_job_write_roundtrip(void)
{
    static job_t a, b;
    REQUIRE(job_load_string("a.yaml", "data: {dir: \"my data\"}\nparallel: {pp: 2, split: [3, 1]}\n"
                            "model: {layers: 4}\nhosts: [local]\noptim: {betas: [0.8, 0.99]}\n", &a,
                            err, sizeof err) == BT_OK);
    REQUIRE(job_override(&a, "train.steps=7", err, sizeof err) == BT_OK);
    REQUIRE(job_override(&a, "optim.lr=0.1", err, sizeof err) == BT_OK);
    REQUIRE(job_override(&a, "trace.dir={run}/trace", err, sizeof err) == BT_OK);
    char *ya = yaml_of(&a);
    REQUIRE(ya);
    CHECK(strstr(ya, "  steps: 7\n") && strstr(ya, "  split: [3, 1]\n") && strstr(ya, "  dir: \"{run}/trace\"\n"));
    CHECK_MSG(job_load_string("b.yaml", ya, &b, err, sizeof err) == BT_OK, "%s", err);
    char *yb = yaml_of(&b);
    CHECK(yb && !strcmp(ya, yb));
    CHECK(b.train.steps == 7 && b.optim.lr == 0.1 && b.parallel.n_split == 2 && b.optim.betas[0] == 0.8 &&
          !strcmp(b.data.dir, "my data"));
    free(ya);
    free(yb);
}

/* An HF-config job (NemotronH: no RoPE, rope_theta 0 from its config)
 * written and loaded back validates to the same dimensions and writes the
 * same text: what model.hf decided comes back from model.hf. */
static void test_job_write_roundtrip_hf(void)
{
    static job_t a, b;
    REQUIRE(job_load_string("h.yaml", "model: {hf: tests/fixtures/nemotronh}\ndata: {dir: x, seq_len: 16}\n", &a,
                            err, sizeof err) == BT_OK);
    CHECK_MSG(job_validate(&a, err, sizeof err) == BT_OK, "%s", err);
    REQUIRE(a.model.rope_theta == 0 && a.model.layers == 6);
    char *ya = yaml_of(&a);
    REQUIRE(ya);
    CHECK_MSG(strstr(ya, "  # rope_theta: 0  (from model.hf)\n") &&
              strstr(ya, "  # layers: 6  (from model.hf)\n"), "%s", ya);
    CHECK_MSG(job_load_string("h2.yaml", ya, &b, err, sizeof err) == BT_OK, "%s", err);
    CHECK_MSG(job_validate(&b, err, sizeof err) == BT_OK, "%s", err);
    char *yb = yaml_of(&b);
    CHECK(yb && !strcmp(ya, yb));
    CHECK(b.model.layers == 6 && b.model.hidden == a.model.hidden && b.model.rope_theta == 0 &&
          b.model.vocab == a.model.vocab && b.model.seq == a.model.seq);
    free(ya);
    free(yb);
}

/* launch.collective_timeout: 30 s unless set; a positive number of
 * seconds, 0 and negatives refused naming the field and the range. */
static void test_job_collective_timeout(void)
{
    static job_t job;
    REQUIRE(job_load_string("c.yaml", "data: {dir: x}\n", &job, err, sizeof err) == BT_OK);
    CHECK(job.launch.collective_timeout == 30 && job.launch.step_timeout == 300);
    CHECK(job_override(&job, "launch.collective_timeout=2.5", err, sizeof err) == BT_OK &&
          job.launch.collective_timeout == 2.5);
    CHECK(job_override(&job, "launch.collective_timeout=0", err, sizeof err) == BT_ERR_INVALID);
    CHECK_MSG(strstr(err, "launch.collective_timeout: 0 is out of range [0.001, 86400]"), "%s", err);
    CHECK(job_load_string("c.yaml", "data: {dir: x}\nlaunch: {collective_timeout: -1}\n", &job, err,
                          sizeof err) == BT_ERR_INVALID);
    CHECK_MSG(strstr(err, "c.yaml:2:") && strstr(err, "launch.collective_timeout: -1 is out of range"),
              "%s", err);
}

/* train.global_batch fixes the sequences per step; each layout's
 * microbatches are derived, and what cannot split is an error naming it. */
static void test_job_global_batch(void)
{
    static job_t job;
    static const struct { int dp; int64_t mb; int64_t want; } ok[] = {{1, 2, 4}, {2, 2, 2}, {4, 2, 1}, {2, 1, 4}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        char y[256];
        snprintf(y, sizeof y, "data: {dir: x}\ntrain: {global_batch: 8, micro_batch: %lld}\n"
                 "parallel: {dp: %d}\n", (long long)ok[i].mb, ok[i].dp);
        REQUIRE(job_load_string("g.yaml", y, &job, err, sizeof err) == BT_OK);
        CHECK_MSG(job_validate(&job, err, sizeof err) == BT_OK, "%s", err);
        CHECK_MSG(job.train.grad_accum == ok[i].want, "dp %d: %lld", ok[i].dp, (long long)job.train.grad_accum);
        CHECK(job.parallel.dp * job.train.grad_accum * job.train.micro_batch == 8);
    }
    REQUIRE(job_load_string("g.yaml", "data: {dir: x}\ntrain: {global_batch: 8, micro_batch: 2}\n"
                            "parallel: {dp: 3}\n", &job, err, sizeof err) == BT_OK);
    CHECK(job_validate(&job, err, sizeof err) == BT_ERR_INVALID);
    CHECK_MSG(strstr(err, "g.yaml:2:") && strstr(err, "train.global_batch: 8 sequences per step do not split "
                                                    "into parallel.dp 3 x train.micro_batch 2"), "%s", err);
    /* an explicit grad_accum must agree */
    REQUIRE(job_load_string("g.yaml", "data: {dir: x}\ntrain: {global_batch: 8, micro_batch: 2, grad_accum: 4}\n"
                            "parallel: {dp: 2}\n", &job, err, sizeof err) == BT_OK);
    CHECK(job_validate(&job, err, sizeof err) == BT_ERR_INVALID);
    CHECK_MSG(strstr(err, "train.grad_accum: 4, but train.global_batch 8 = dp 2 x micro_batch 2 x 2 microbatches"),
              "%s", err);
    /* in tokens: 8 sequences of 16 at any dp that splits them */
    for (int dp = 1; dp <= 4; dp *= 2) {
        char y[256];
        snprintf(y, sizeof y, "data: {dir: x, seq_len: 16}\ntrain: {global_batch_tokens: 128, micro_batch: 1}\n"
                 "parallel: {dp: %d}\n", dp);
        REQUIRE(job_load_string("g.yaml", y, &job, err, sizeof err) == BT_OK);
        CHECK_MSG(job_validate(&job, err, sizeof err) == BT_OK, "%s", err);
        CHECK(job.train.global_batch == 8);
        CHECK_MSG(job.train.grad_accum == 8 / dp, "dp %d: %lld", dp, (long long)job.train.grad_accum);
    }
    REQUIRE(job_load_string("g.yaml", "data: {dir: x, seq_len: 16}\ntrain: {global_batch_tokens: 100}\n", &job,
                            err, sizeof err) == BT_OK);
    CHECK(job_validate(&job, err, sizeof err) == BT_ERR_INVALID);
    CHECK_MSG(strstr(err, "g.yaml:2:") && strstr(err, "train.global_batch_tokens: 100 tokens per step are not whole "
                                                    "sequences of data.seq_len 16") && strstr(err, "e.g. 96"),
              "%s", err);
    REQUIRE(job_load_string("g.yaml", "data: {dir: x, seq_len: 16}\ntrain: {global_batch_tokens: 128, global_batch: 4}\n",
                            &job, err, sizeof err) == BT_OK);
    CHECK(job_validate(&job, err, sizeof err) == BT_ERR_INVALID);
    CHECK_MSG(strstr(err, "train.global_batch: 4 sequences, but train.global_batch_tokens 128 / data.seq_len 16 = 8"),
              "%s", err);
}

/* A bare "cuda" gives each of a host's ranks a GPU of its own (ranks fill
 * hosts in blocks), round robin when there are fewer; "cuda:N" and others
 * stay as they are; with the GPUs visible (CUDA_VISIBLE_DEVICES) fewer than
 * a host's ranks, auto collectives stay on host and nccl is refused. */
static void test_job_rank_devices(void)
{
    job_t job;
    char d[JOB_DEVICE_MAX];
    REQUIRE(job_load_string("r.yaml", "data: {dir: x}\ndevice: cuda\nparallel: {dp: 4}\n", &job, err,
                            sizeof err) == BT_OK);
    const int want1[4] = {0, 1, 2, 3}, want2[4] = {0, 1, 0, 1};
    for (int r = 0; r < 4; r++) {
        job_rank_device(&job, 4, r, 4, d, sizeof d);
        CHECK_MSG(atoi(d + 5) == want1[r] && !strncmp(d, "cuda:", 5), "rank %d of 4 on 4 GPUs: %s", r, d);
        job_rank_device(&job, 4, r, 2, d, sizeof d);
        CHECK_MSG(atoi(d + 5) == want2[r] && !strncmp(d, "cuda:", 5), "rank %d of 4 on 2 GPUs: %s", r, d);
    }
    job.n_hosts = 2; /* 2 ranks a host: local indices 0 1 0 1 */
    for (int r = 0; r < 4; r++) {
        job_rank_device(&job, 4, r, 8, d, sizeof d);
        CHECK_MSG(atoi(d + 5) == r % 2, "rank %d of 2 hosts: %s", r, d);
    }
    job_rank_device(&job, 4, 3, 0, d, sizeof d);
    CHECK_MSG(!strcmp(d, "cuda"), "no GPU counted: %s", d);
    snprintf(job.device, sizeof job.device, "cuda:1");
    job_rank_device(&job, 4, 2, 4, d, sizeof d);
    CHECK_MSG(!strcmp(d, "cuda:1"), "an indexed device stays: %s", d);

    coll_backend_t cb;
    char why[600];
    const char *old = getenv("CUDA_VISIBLE_DEVICES");
    char saved[256] = "";
    if (old) snprintf(saved, sizeof saved, "%s", old);
    job.n_hosts = 1;
    snprintf(job.device, sizeof job.device, "cuda");
    job.parallel.collectives = COLL_BACKEND_AUTO;
    setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3", 1);
    CHECK(job_gpus_here() == 4);
    CHECK_MSG(job_collectives(&job, &cb, why, sizeof why) == BT_OK && cb == COLL_BACKEND_NCCL, "%s", why);
    setenv("CUDA_VISIBLE_DEVICES", "0,1,-1,3", 1);
    CHECK(job_gpus_here() == 2);
    CHECK_MSG(job_collectives(&job, &cb, why, sizeof why) == BT_OK && cb == COLL_BACKEND_HOST &&
                  strstr(why, "4 ranks a host share its 2 visible GPUs"), "%s", why);
    job.parallel.collectives = COLL_BACKEND_NCCL;
    CHECK_MSG(job_collectives(&job, &cb, why, sizeof why) == BT_ERR_INVALID, "%s", why);
    snprintf(job.device, sizeof job.device, "cuda:0");
    setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3", 1);
    CHECK_MSG(job_collectives(&job, &cb, why, sizeof why) == BT_ERR_INVALID && strstr(why, "share cuda:0"), "%s",
              why);
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    CHECK(job_gpus_here() == 0);
    if (old) setenv("CUDA_VISIBLE_DEVICES", saved, 1);
    else unsetenv("CUDA_VISIBLE_DEVICES");
}

int main(int argc, char **argv)
{
    TEST_RUN(argc, argv, test_job_global_batch, test_job_write_roundtrip, test_job_write_roundtrip_hf, test_job_collective_timeout, test_job_parse_all_sections, test_job_defaults_and_derived,
             test_job_unknown_key, test_job_wrong_type, test_job_out_of_range,
             test_job_integer_range, test_job_input_limits,
             test_job_model_shape_rules, test_job_parallel_rules, test_job_attention, test_job_overrides,
             test_job_hf_config, test_job_file_errors, test_job_schema_names,
             test_job_examples_valid, test_job_rank_devices);
}
