/* baton data: tokenize text into token shards (data/shard.h), inspect them.
 *
 *   baton data prepare --tokenizer DIR|tokenizer.json|MODEL.gguf --input FILE... --output DIR
 *                      [--shard-tokens N] [--chunk-bytes N] [--quiet]
 *   baton data info DIR
 *
 * Each input file is one document. Document rule (docs/DATA.md): when the
 * tokenizer has an EOS id, it follows every document; otherwise, when it has
 * a BOS id, it precedes every document; otherwise documents are simply
 * concatenated. */
#include "launch/cli.h"

#include "base/clock.h"
#include "base/log.h"
#include "ckpt/model_source.h"
#include "data/shard.h"
#include "data/tokenizer.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

enum { DATA_CHUNK_BYTES = 8 << 20 };
#define DATA_DEFAULT_SHARD_TOKENS (64ull << 20)

static void data_usage(FILE *f)
{
    fprintf(f,
            "usage: baton data prepare --tokenizer DIR|FILE|MODEL.gguf --input FILE... --output DIR\n"
            "                          [--shard-tokens N] [--chunk-bytes N] [--quiet]\n"
            "       baton data info DIR\n"
            "prepare: tokenize each input file (one document each) into token shards in DIR\n"
            "         with DIR/index.json; shards hold at most N tokens (default %llu);\n"
            "         files are encoded in pieces of about --chunk-bytes (default %d) where\n"
            "         the tokenizer allows a cut (same ids as encoding the whole file).\n"
            "info:    validate a shard directory (headers, sizes, checksums) and summarize it.\n",
            DATA_DEFAULT_SHARD_TOKENS, DATA_CHUNK_BYTES);
}

/* Tokenizes one mapped file in chunks cut where the tokenizer allows it. */
typedef struct {
    uint64_t shard_tokens;
    size_t chunk_bytes;
    int quiet;
} data_opts_t;

static bt_status_t data_encode_file(tok_t *tok, shard_writer_t *w, const char *path,
                                    const char *text, size_t len, const data_opts_t *o,
                                    uint64_t *n_tokens)
{
    uint64_t t0 = clock_now_ns(), last = t0;
    size_t pos = 0;
    *n_tokens = 0;
    while (pos < len) {
        size_t want = pos + o->chunk_bytes < len ? pos + o->chunk_bytes : len;
        size_t end = pos + tok_safe_cut(tok, text + pos, len - pos, want - pos);
        uint32_t *ids = NULL;
        size_t n = 0;
        bt_status_t st = tok_encode(tok, text + pos, end - pos, &ids, &n);
        if (st != BT_OK) {
            log_error("%s: tokenizing bytes [%zu, %zu) failed: %s", path, pos, end,
                      bt_status_str(st));
            return st;
        }
        st = shard_writer_append(w, ids, n);
        free(ids);
        if (st != BT_OK) return st;
        *n_tokens += n;
        pos = end;
        uint64_t now = clock_now_ns();
        if (!o->quiet && (now - last > 1000000000ull || pos == len) && len > o->chunk_bytes) {
            double s = (double)(now - t0) / 1e9;
            fprintf(stderr, "data: %s: %5.1f%%  %" PRIu64 " tokens  %.1f MB/s\n", path,
                    100.0 * (double)pos / (double)len, *n_tokens, (double)pos / 1e6 / s);
            last = now;
        }
    }
    return BT_OK;
}

static bt_status_t data_prepare_input(tok_t *tok, shard_writer_t *w, const char *path,
                                      const data_opts_t *o, uint64_t *n_tokens)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        log_error("%s: cannot open input: %s", path, strerror(errno));
        return BT_ERR_IO;
    }
    struct stat sb;
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
        log_error("%s: not a regular file", path);
        close(fd);
        return BT_ERR_IO;
    }
    size_t len = (size_t)sb.st_size;
    void *map = len ? mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    close(fd);
    if (map == MAP_FAILED) {
        log_error("%s: mmap failed: %s", path, strerror(errno));
        return BT_ERR_IO;
    }
    tok_special_t sp = tok_special(tok);
    bt_status_t st = BT_OK;
    uint64_t n = 0;
    if (sp.eos < 0 && sp.bos >= 0) {
        uint32_t bos = (uint32_t)sp.bos;
        st = shard_writer_append(w, &bos, 1);
        n++;
    }
    uint64_t body = 0;
    if (st == BT_OK) st = data_encode_file(tok, w, path, map, len, o, &body);
    n += body;
    if (st == BT_OK && sp.eos >= 0) {
        uint32_t eos = (uint32_t)sp.eos;
        st = shard_writer_append(w, &eos, 1);
        n++;
    }
    if (st == BT_OK) st = shard_writer_mark_input(w, path, len);
    if (map) munmap(map, len);
    *n_tokens = n;
    return st;
}

/* A GGUF file (its magic): its tokenizer is rebuilt from the metadata. */
static bool data_is_gguf(const char *path)
{
    char magic[4] = {0};
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    bool yes = fread(magic, 1, 4, f) == 4 && !memcmp(magic, "GGUF", 4);
    fclose(f);
    return yes;
}

static int data_prepare(int argc, char **argv)
{
    static const struct option opts[] = {
        {"tokenizer", required_argument, NULL, 't'},
        {"input", required_argument, NULL, 'i'},
        {"output", required_argument, NULL, 'o'},
        {"shard-tokens", required_argument, NULL, 's'},
        {"chunk-bytes", required_argument, NULL, 'c'},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {0, 0, 0, 0},
    };
    const char *tok_path = NULL, *out_dir = NULL;
    const char **inputs = calloc((size_t)argc + 1, sizeof *inputs);
    size_t n_inputs = 0;
    data_opts_t o = {.shard_tokens = DATA_DEFAULT_SHARD_TOKENS, .chunk_bytes = DATA_CHUNK_BYTES};
    int c;
    if (!inputs) return 1;
    optind = 1;
    while ((c = getopt_long(argc, argv, "t:i:o:s:c:qh", opts, NULL)) != -1) {
        switch (c) {
        case 't': tok_path = optarg; break;
        case 'i': inputs[n_inputs++] = optarg; break;
        case 'o': out_dir = optarg; break;
        case 's':
        case 'c': {
            char *end;
            unsigned long long v = strtoull(optarg, &end, 10);
            if (*end || !v || *optarg == '-') {
                fprintf(stderr, "baton data prepare: --%s wants a positive integer, got '%s'\n",
                        c == 's' ? "shard-tokens" : "chunk-bytes", optarg);
                free(inputs);
                return 2;
            }
            if (c == 's') o.shard_tokens = v;
            else o.chunk_bytes = (size_t)v;
            break;
        }
        case 'q': o.quiet = 1; break;
        case 'h': data_usage(stdout); free(inputs); return 0;
        default: data_usage(stderr); free(inputs); return 2;
        }
    }
    /* `--input a b c`: getopt moves b and c behind the options */
    while (optind < argc) inputs[n_inputs++] = argv[optind++];
    if (!tok_path || !out_dir || !n_inputs) {
        fprintf(stderr, "baton data prepare: --tokenizer, --input and --output are required\n");
        data_usage(stderr);
        free(inputs);
        return 2;
    }
    tok_t *tok = NULL;
    shard_writer_t *w = NULL;
    int rc = 1;
    if ((data_is_gguf(tok_path) ? ckpt_source_tokenizer(tok_path, &tok, NULL)
                                : tok_load(tok_path, &tok)) != BT_OK) {
        fprintf(stderr, "baton data prepare: cannot load tokenizer %s (see the error above)\n",
                tok_path);
        goto out_inputs;
    }
    tok_special_t sp = tok_special(tok);
    if (shard_writer_open(out_dir, tok_vocab_size(tok), tok_hash(tok), sp.bos, sp.eos,
                          o.shard_tokens, &w) != BT_OK)
        goto out_tok;
    uint64_t t0 = clock_now_ns(), total = 0, bytes = 0;
    for (size_t i = 0; i < n_inputs; i++) {
        uint64_t n = 0;
        if (data_prepare_input(tok, w, inputs[i], &o, &n) != BT_OK) {
            fprintf(stderr, "baton data prepare: failed on %s; no index written\n", inputs[i]);
            shard_writer_abort(w);
            goto out_tok;
        }
        struct stat sb;
        if (!stat(inputs[i], &sb)) bytes += (uint64_t)sb.st_size;
        total += n;
        if (!o.quiet) fprintf(stderr, "data: %s: %" PRIu64 " tokens\n", inputs[i], n);
    }
    if (shard_writer_close(w) != BT_OK) goto out_tok;
    double s = (double)(clock_now_ns() - t0) / 1e9;
    printf("prepared %" PRIu64 " tokens from %zu file(s), %" PRIu64 " bytes, in %.2f s "
           "(%.2f M tokens/s) into %s (vocab %u, bos %" PRId64 ", eos %" PRId64 ")\n",
           total, n_inputs, bytes, s, s > 0 ? (double)total / s / 1e6 : 0.0, out_dir,
           tok_vocab_size(tok), sp.bos, sp.eos);
    rc = 0;
out_tok:
    tok_free(tok);
out_inputs:
    free(inputs);
    return rc;
}

static int data_info(int argc, char **argv)
{
    if (argc != 2) {
        data_usage(stderr);
        return 2;
    }
    shard_set_t *set = NULL;
    if (shard_set_open(argv[1], &set) != BT_OK) {
        fprintf(stderr, "baton data info: %s is not a valid shard set (see the error above)\n",
                argv[1]);
        return 1;
    }
    printf("%s: %" PRIu64 " tokens, vocab %u, tokenizer xxh64 %016" PRIx64 ", all checksums ok\n",
           argv[1], shard_set_count(set), shard_set_vocab_size(set),
           shard_set_tokenizer_hash(set));
    shard_set_close(set);
    return 0;
}

int cmd_data(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        data_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "prepare")) return data_prepare(argc - 1, argv + 1);
    if (!strcmp(argv[1], "info")) return data_info(argc - 1, argv + 1);
    fprintf(stderr, "baton data: unknown subcommand '%s'\n", argv[1]);
    data_usage(stderr);
    return 2;
}
