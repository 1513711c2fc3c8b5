/* Byte-level BPE from tokenizer.json; contract in data/tokenizer.h.
 *
 * Pipeline per encode, as HF does it: split the raw text on the added tokens
 * that are not normalized; normalize each remaining segment and split it on
 * the normalized added tokens; run the pre-tokenizer steps on what is left
 * (each splits every piece of the previous step), then BPE each final piece.
 * Vocabulary entries are kept as raw bytes (the GPT-2 byte-to-unicode
 * mapping is undone at load), so BPE starts from one symbol per byte and
 * decode is plain concatenation. */
#include "data/tokenizer.h"
#include "data/unicode.h"

#include "base/log.h"
#include "base/file.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

/* ---------- hash tables ---------- */

/* byte string -> id; open addressing over a power-of-two slot array */
typedef struct {
    uint32_t *slots; /* id + 1; 0 = empty */
    size_t cap;
} tok_vocab_map_t;

/* (left id, right id) -> (rank, merged id) */
typedef struct {
    uint64_t key; /* (left << 32 | right) + 1; 0 = empty */
    uint32_t rank;
    uint32_t merged;
} tok_merge_slot_t;

typedef struct {
    tok_merge_slot_t *slots;
    size_t cap;
} tok_merge_map_t;

/* word cache: piece bytes -> ids */
typedef struct {
    uint64_t hash;
    uint32_t key_off, key_len; /* in key arena */
    uint32_t ids_off, n_ids;   /* in ids arena */
    int used;
} tok_cache_slot_t;

enum { TOK_CACHE_SLOTS = 1 << 17, TOK_CACHE_MAX_KEY = 96 };

typedef struct {
    tok_cache_slot_t *slots;
    size_t count;
    uint8_t *keys;
    size_t keys_len, keys_cap;
    uint32_t *ids;
    size_t ids_len, ids_cap;
} tok_cache_t;

/* ---------- pre-tokenizer ---------- */

typedef enum {
    BR_LITERAL,             /* literal text, case-sensitive */
    BR_LITERALS_CI,         /* (?i:'s|'t|...) ASCII case-insensitive alternatives */
    BR_OPTSPACE_LETTERS,    /*  ?\p{L}+ */
    BR_OPTSPACE_NUMBERS,    /*  ?\p{N}+ */
    BR_OPTSPACE_OTHER,      /*  ?[^\s\p{L}\p{N}]+ */
    BR_OPTSPACE_OTHER_NL,   /*  ?[^\s\p{L}\p{N}]+[\r\n]* */
    BR_PREFIX_LETTERS,      /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    BR_NUMBERS,             /* \p{N}{1,max} ; \p{N} ; \p{N}+ */
    BR_WS_NEWLINES,         /* \s*[\r\n]+ */
    BR_WS_NOT_BEFORE_NONWS, /* \s+(?!\S) */
    BR_WS,                  /* \s+ */
} tok_branch_kind_t;

typedef struct {
    tok_branch_kind_t kind;
    size_t max;        /* BR_NUMBERS: most digits, 0 = unbounded */
    char **lits;       /* BR_LITERAL (1) / BR_LITERALS_CI */
    size_t *lit_lens;
    size_t n_lits;
} tok_branch_t;

typedef struct {
    tok_branch_t *br;
    size_t n;
} tok_pattern_t;

typedef enum { PRE_SPLIT, PRE_BYTELEVEL, PRE_DIGITS, PRE_METASPACE } tok_pre_kind_t;

/* Metaspace (PRE_METASPACE) and the SentencePiece-style decoders: when the
 * replacement is put in front of a piece */
typedef enum { PREPEND_NEVER = 0, PREPEND_ALWAYS, PREPEND_FIRST } tok_prepend_t;

typedef struct {
    tok_pre_kind_t kind;
    tok_pattern_t pat;     /* PRE_SPLIT, and PRE_BYTELEVEL when use_regex */
    int use_regex;         /* PRE_BYTELEVEL */
    int add_prefix_space;  /* PRE_BYTELEVEL */
    int individual;        /* PRE_DIGITS */
    uint8_t *repl;         /* PRE_METASPACE: what spaces become ("\u2581") */
    size_t repl_len;
    tok_prepend_t prepend; /* PRE_METASPACE: the replacement put in front */
    int split;             /* PRE_METASPACE: a piece at each replacement */
} tok_pre_t;

/* One normalizer step, in order: NFC, Prepend(a) (to a non-empty string),
 * Replace(a -> b) (every occurrence, left to right) */
typedef enum { NORM_NFC, NORM_PREPEND, NORM_REPLACE } tok_norm_kind_t;

typedef struct {
    tok_norm_kind_t kind;
    uint8_t *a, *b;
    size_t la, lb;
} tok_norm_t;

typedef struct {
    uint8_t *content;
    size_t len;
    uint32_t id;
    int lstrip, rstrip, special;
    int normalized; /* matched after normalization, on its normalized content */
} tok_added_t;

typedef struct {
    uint8_t *bytes;
    uint32_t len;
    int present;
    int raw; /* vocab string outside the byte-level alphabet, kept as UTF-8 */
    int fallback_byte; /* sp: a "<0xXX>" byte token's byte + 1, else 0 */
} tok_token_t;

struct tok {
    tok_token_t *tokens;
    uint32_t n_tokens; /* max id + 1 */
    tok_vocab_map_t vocab;
    tok_merge_map_t merges;
    int32_t byte_id[256]; /* id of the single-byte token, -1 if none */

    tok_added_t *added;
    size_t n_added;
    /* added-token indices by first byte, longest first */
    uint32_t *added_by_byte[256];
    uint32_t n_added_by_byte[256];

    tok_norm_t *norm;
    size_t n_norm;
    tok_pre_t *pre;
    size_t n_pre;

    /* SentencePiece style (sp): vocab strings are UTF-8 as they stand
     * ("\u2581the"), a piece starts as one symbol per character, a
     * character outside the vocab becomes its bytes' "<0xXX>" tokens
     * (byte_fallback) or unk; decoding turns the replacement into spaces
     * and may strip the first one (dec_strip) */
    int sp;
    int byte_fallback;
    int32_t fallback_id[256]; /* "<0xXX>" token of each byte, -1 if none */
    uint8_t *dec_repl;        /* the decoder's replacement ("\u2581"), NULL: none */
    size_t dec_repl_len;
    int dec_strip;            /* leading spaces the decoder strips */
    int dec_byte_fallback;    /* the decoder turns "<0xXX>" into its byte (ByteFallback) */

    int ignore_merges;
    int64_t unk;
    int fuse_unk;

    tok_special_t special;
    uint64_t file_hash;
    tok_cache_t cache;
};

/* growable id output */
typedef struct {
    uint32_t *v;
    size_t n, cap;
    int oom;
} tok_ids_t;

static void tok_ids_push(tok_ids_t *o, uint32_t id)
{
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 1024;
        uint32_t *v = realloc(o->v, cap * sizeof *v);
        if (!v) {
            o->oom = 1;
            return;
        }
        o->v = v;
        o->cap = cap;
    }
    o->v[o->n++] = id;
}

/* ---------- byte <-> unicode (GPT-2 byte-level alphabet) ---------- */

/* Printable bytes stand for themselves; the other 68 map to U+0100.. in
 * byte order, so that every byte is a visible character in vocab strings. */
static void tok_bytelevel_table(uint32_t byte_to_cp[256], int16_t cp_to_byte[324])
{
    uint32_t next = 256;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        byte_to_cp[b] = printable ? (uint32_t)b : next++;
    }
    for (int i = 0; i < 324; i++) cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) cp_to_byte[byte_to_cp[b]] = (int16_t)b;
}

/* Vocab string -> raw bytes. Returns 0 when some character is outside the
 * byte-level alphabet (then the caller keeps the UTF-8 as is). */
static int tok_unmap_bytes(const char *s, size_t n, const int16_t cp_to_byte[324], uint8_t *out,
                           size_t *out_len)
{
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t len;
        uint32_t cp = uni_utf8_decode((const uint8_t *)s + i, n - i, &len);
        if (cp >= 324 || cp_to_byte[cp] < 0) return 0;
        out[o++] = (uint8_t)cp_to_byte[cp];
        i += len;
    }
    *out_len = o;
    return 1;
}

/* ---------- maps ---------- */

static uint64_t tok_bytes_hash(const uint8_t *s, size_t n) { return XXH3_64bits(s, n); }

static int64_t tok_vocab_find(const tok_t *tok, const uint8_t *s, size_t n)
{
    size_t mask = tok->vocab.cap - 1;
    for (size_t i = tok_bytes_hash(s, n) & mask;; i = (i + 1) & mask) {
        uint32_t v = tok->vocab.slots[i];
        if (!v) return -1;
        const tok_token_t *t = &tok->tokens[v - 1];
        if (t->len == n && !memcmp(t->bytes, s, n)) return v - 1;
    }
}

/* Inserts id under its bytes unless the bytes are already there. */
static void tok_vocab_insert(tok_t *tok, uint32_t id)
{
    const tok_token_t *t = &tok->tokens[id];
    if (tok_vocab_find(tok, t->bytes, t->len) >= 0) return;
    size_t mask = tok->vocab.cap - 1;
    size_t i = tok_bytes_hash(t->bytes, t->len) & mask;
    while (tok->vocab.slots[i]) i = (i + 1) & mask;
    tok->vocab.slots[i] = id + 1;
}

static uint64_t tok_mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static inline const tok_merge_slot_t *tok_merge_find(const tok_t *tok, uint32_t a, uint32_t b)
{
    uint64_t key = (((uint64_t)a << 32) | b) + 1;
    size_t mask = tok->merges.cap - 1;
    for (size_t i = tok_mix64(key) & mask;; i = (i + 1) & mask) {
        const tok_merge_slot_t *s = &tok->merges.slots[i];
        if (s->key == key) return s;
        if (!s->key) return NULL;
    }
}

/* A pair listed twice keeps its last rank: HF collects the merges into a
 * hash map, so later entries overwrite earlier ones. */
static void tok_merge_insert(tok_t *tok, uint32_t a, uint32_t b, uint32_t rank, uint32_t merged)
{
    uint64_t key = (((uint64_t)a << 32) | b) + 1;
    size_t mask = tok->merges.cap - 1;
    size_t i = tok_mix64(key) & mask;
    while (tok->merges.slots[i].key && tok->merges.slots[i].key != key) i = (i + 1) & mask;
    tok->merges.slots[i] = (tok_merge_slot_t){.key = key, .rank = rank, .merged = merged};
}

static size_t tok_pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

/* ---------- regex branches ---------- */

/* Character classes of one position. */
enum { C_L = 1, C_N = 2, C_S = 4, C_NL = 8 /* \r or \n */ };

static uint8_t tok_ascii_class[128];

static void tok_ascii_class_init(void)
{
    for (int c = 0; c < 128; c++) {
        uint8_t k = 0;
        if (uni_is_letter((uint32_t)c)) k |= C_L;
        if (uni_is_number((uint32_t)c)) k |= C_N;
        if (uni_is_space((uint32_t)c)) k |= C_S;
        if (c == '\r' || c == '\n') k |= C_NL;
        tok_ascii_class[c] = k;
    }
}

static inline unsigned tok_class_at(const uint8_t *s, size_t n, size_t i, size_t *len)
{
    if (s[i] < 0x80) {
        *len = 1;
        return tok_ascii_class[s[i]];
    }
    uint32_t cp = uni_utf8_decode(s + i, n - i, len);
    return (uni_is_letter(cp) ? C_L : 0) | (uni_is_number(cp) ? C_N : 0) |
           (uni_is_space(cp) ? C_S : 0);
}

/* Length of the run of characters at i whose class satisfies (cls & want) ==
 * want_val, at most max chars (0 = unbounded); stores the char count. */
static size_t tok_run(const uint8_t *s, size_t n, size_t i, unsigned mask, unsigned val, size_t max,
                      size_t *chars)
{
    size_t j = i, k = 0;
    while (j < n && (!max || k < max)) {
        size_t len;
        unsigned c = tok_class_at(s, n, j, &len);
        if ((c & mask) != val) break;
        j += len;
        k++;
    }
    if (chars) *chars = k;
    return j - i;
}

#define OTHER_MASK (C_L | C_N | C_S)

/* Match length of branch b at s[i..n), 0 when it does not match there. */
static size_t tok_branch_match(const tok_branch_t *b, const uint8_t *s, size_t n, size_t i)
{
    size_t len;
    unsigned c;
    switch (b->kind) {
    case BR_LITERAL:
        return n - i >= b->lit_lens[0] && !memcmp(s + i, b->lits[0], b->lit_lens[0])
                   ? b->lit_lens[0] : 0;
    case BR_LITERALS_CI:
        for (size_t k = 0; k < b->n_lits; k++) {
            size_t m = b->lit_lens[k];
            if (n - i < m) continue;
            size_t j = 0;
            while (j < m) {
                uint8_t x = s[i + j], y = (uint8_t)b->lits[k][j];
                if (x >= 'A' && x <= 'Z') x = (uint8_t)(x + 32);
                if (x != y) break;
                j++;
            }
            if (j == m) return m;
        }
        return 0;
    case BR_OPTSPACE_LETTERS:
    case BR_OPTSPACE_NUMBERS: {
        /* after a space that the class does not follow, backing off the
         * optional space cannot help: the space itself is not in the class */
        unsigned want = b->kind == BR_OPTSPACE_LETTERS ? C_L : C_N;
        size_t j = i + (s[i] == ' ' && i + 1 < n ? 1 : 0);
        size_t r = tok_run(s, n, j, want, want, 0, NULL);
        return r ? j + r - i : 0;
    }
    case BR_OPTSPACE_OTHER:
    case BR_OPTSPACE_OTHER_NL: {
        size_t j = i;
        size_t r = 0;
        if (s[i] == ' ' && i + 1 < n) r = tok_run(s, n, i + 1, OTHER_MASK, 0, 0, NULL);
        if (r) j = i + 1 + r;
        else {
            r = tok_run(s, n, i, OTHER_MASK, 0, 0, NULL);
            if (!r) return 0;
            j = i + r;
        }
        if (b->kind == BR_OPTSPACE_OTHER_NL)
            while (j < n && (s[j] == '\r' || s[j] == '\n')) j++;
        return j - i;
    }
    case BR_PREFIX_LETTERS:
        c = tok_class_at(s, n, i, &len);
        if (!(c & (C_L | C_N | C_NL)) && i + len < n) {
            size_t r = tok_run(s, n, i + len, C_L, C_L, 0, NULL);
            if (r) return len + r;
        }
        return tok_run(s, n, i, C_L, C_L, 0, NULL);
    case BR_NUMBERS:
        return tok_run(s, n, i, C_N, C_N, b->max, NULL);
    case BR_WS_NEWLINES: {
        /* \s* takes the whole whitespace run, then backs off to the last
         * \r or \n inside it, which [\r\n]+ must end on. */
        size_t j = i, end = 0;
        while (j < n) {
            c = tok_class_at(s, n, j, &len);
            if (!(c & C_S)) break;
            j += len;
            if (c & C_NL) end = j;
        }
        return end ? end - i : 0;
    }
    case BR_WS_NOT_BEFORE_NONWS: {
        size_t chars;
        size_t r = tok_run(s, n, i, C_S, C_S, 0, &chars);
        if (!r) return 0;
        if (i + r == n) return r;
        if (chars < 2) return 0;
        /* give back the last whitespace char so that the lookahead sees one */
        size_t j = i + r - 1;
        while (j > i && (s[j] & 0xC0) == 0x80) j--;
        return j - i;
    }
    case BR_WS:
        return tok_run(s, n, i, C_S, C_S, 0, NULL);
    }
    BT_PANIC("bad branch kind %d", (int)b->kind);
}

/* Leftmost-first alternation at i: the first branch that matches wins. */
static size_t tok_pattern_match(const tok_pattern_t *p, const uint8_t *s, size_t n, size_t i)
{
    for (size_t k = 0; k < p->n; k++) {
        size_t m = tok_branch_match(&p->br[k], s, n, i);
        if (m) return m;
    }
    return 0;
}

static const struct {
    const char *text;
    tok_branch_kind_t kind;
} tok_known_branches[] = {
    {" ?\\p{L}+", BR_OPTSPACE_LETTERS},
    {" ?\\p{N}+", BR_OPTSPACE_NUMBERS},
    {" ?[^\\s\\p{L}\\p{N}]+", BR_OPTSPACE_OTHER},
    {" ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*", BR_OPTSPACE_OTHER_NL},
    {"[^\\r\\n\\p{L}\\p{N}]?\\p{L}+", BR_PREFIX_LETTERS},
    {"\\s*[\\r\\n]+", BR_WS_NEWLINES},
    {"\\s+(?!\\S)", BR_WS_NOT_BEFORE_NONWS},
    {"\\s+", BR_WS},
};

static void tok_pattern_free(tok_pattern_t *p)
{
    for (size_t k = 0; k < p->n; k++) {
        for (size_t j = 0; j < p->br[k].n_lits; j++) free(p->br[k].lits[j]);
        free(p->br[k].lits);
        free(p->br[k].lit_lens);
    }
    free(p->br);
    p->br = NULL;
    p->n = 0;
}

/* Splits s[0..n) at the '|' that are outside (), [] and escapes into parts;
 * returns the count, or max_parts + 1 when there are more. */
static size_t tok_split_alternation(const char *s, size_t n, const char **parts, size_t *lens,
                                    size_t max_parts)
{
    size_t np = 0, start = 0;
    int depth = 0, bracket = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && s[i] == '\\') {
            i++;
            continue;
        }
        if (i < n && bracket) {
            if (s[i] == ']') bracket = 0;
            continue;
        }
        if (i < n && s[i] == '[') bracket = 1;
        else if (i < n && s[i] == '(') depth++;
        else if (i < n && s[i] == ')') depth--;
        else if (i == n || (s[i] == '|' && depth == 0)) {
            if (np == max_parts) return max_parts + 1;
            parts[np] = s + start;
            lens[np] = i - start;
            np++;
            start = i + 1;
        }
    }
    return np;
}

static int tok_is_plain_literal(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strchr("\\[](){}|?*+.^$", s[i])) return 0;
    return n > 0;
}

static bt_status_t tok_branch_add_literals(tok_branch_t *b, const char **parts, const size_t *lens,
                                           size_t np, int fold)
{
    b->lits = calloc(np, sizeof *b->lits);
    b->lit_lens = calloc(np, sizeof *b->lit_lens);
    if (!b->lits || !b->lit_lens) return BT_ERR_NOMEM;
    for (size_t k = 0; k < np; k++) {
        b->lits[k] = strndup(parts[k], lens[k]);
        if (!b->lits[k]) return BT_ERR_NOMEM;
        if (fold)
            for (size_t j = 0; j < lens[k]; j++)
                if (b->lits[k][j] >= 'A' && b->lits[k][j] <= 'Z') b->lits[k][j] += 32;
        b->lit_lens[k] = lens[k];
        b->n_lits++;
    }
    return BT_OK;
}

/* Compiles a Split regex into known branches; refuses any other syntax,
 * naming the branch, rather than splitting differently from HF. */
static bt_status_t tok_pattern_compile(const char *re, tok_pattern_t *out)
{
    enum { MAX_BR = 64 };
    const char *parts[MAX_BR];
    size_t lens[MAX_BR];
    size_t np = tok_split_alternation(re, strlen(re), parts, lens, MAX_BR);
    if (np > MAX_BR) {
        log_error("tokenizer: Split regex has more than %d alternatives: %s", MAX_BR, re);
        return BT_ERR_UNSUPPORTED;
    }
    tok_pattern_t p = {.br = calloc(np, sizeof *p.br), .n = 0};
    if (!p.br) return BT_ERR_NOMEM;
    bt_status_t st = BT_OK;
    for (size_t k = 0; k < np && st == BT_OK; k++) {
        const char *s = parts[k];
        size_t n = lens[k];
        tok_branch_t *b = &p.br[p.n++];
        int known = 0;
        for (size_t j = 0; j < sizeof tok_known_branches / sizeof tok_known_branches[0]; j++)
            if (strlen(tok_known_branches[j].text) == n &&
                !memcmp(tok_known_branches[j].text, s, n)) {
                b->kind = tok_known_branches[j].kind;
                known = 1;
            }
        if (known) continue;
        unsigned mx = 0;
        int used = 0;
        if (n == 6 && !memcmp(s, "\\p{N}+", 6)) {
            b->kind = BR_NUMBERS;
            b->max = 0;
            continue;
        }
        if (n == 5 && !memcmp(s, "\\p{N}", 5)) {
            b->kind = BR_NUMBERS;
            b->max = 1;
            continue;
        }
        if (n > 5 && !memcmp(s, "\\p{N}", 5) && sscanf(s + 5, "{1,%u}%n", &mx, &used) == 1 &&
            (size_t)used == n - 5 && mx >= 1) {
            b->kind = BR_NUMBERS;
            b->max = mx;
            continue;
        }
        if (n > 5 && !memcmp(s, "(?i:", 4) && s[n - 1] == ')') {
            const char *sub[MAX_BR];
            size_t sublen[MAX_BR];
            size_t ns = tok_split_alternation(s + 4, n - 5, sub, sublen, MAX_BR);
            int ok = ns <= MAX_BR;
            for (size_t j = 0; ok && j < ns; j++) {
                ok = tok_is_plain_literal(sub[j], sublen[j]);
                for (size_t c = 0; ok && c < sublen[j]; c++) ok = (unsigned char)sub[j][c] < 0x80;
            }
            if (ok) {
                b->kind = BR_LITERALS_CI;
                st = tok_branch_add_literals(b, sub, sublen, ns, 1);
                continue;
            }
        }
        if (tok_is_plain_literal(s, n)) {
            b->kind = BR_LITERAL;
            st = tok_branch_add_literals(b, &s, &n, 1, 0);
            continue;
        }
        log_error("tokenizer: unsupported Split regex branch '%.*s' in pattern %s", (int)n, s, re);
        st = BT_ERR_UNSUPPORTED;
    }
    if (st != BT_OK) {
        tok_pattern_free(&p);
        return st;
    }
    *out = p;
    return BT_OK;
}

static const char tok_gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---------- word cache ---------- */

static void tok_cache_clear(tok_cache_t *c)
{
    if (c->slots) memset(c->slots, 0, TOK_CACHE_SLOTS * sizeof *c->slots);
    c->count = 0;
    c->keys_len = 0;
    c->ids_len = 0;
}

static const tok_cache_slot_t *tok_cache_find(const tok_cache_t *c, const uint8_t *s, size_t n,
                                              uint64_t h)
{
    size_t mask = TOK_CACHE_SLOTS - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        const tok_cache_slot_t *e = &c->slots[i];
        if (!e->used) return NULL;
        if (e->hash == h && e->key_len == n && !memcmp(c->keys + e->key_off, s, n)) return e;
    }
}

/* Best effort: a full or out-of-memory cache just does not remember. */
static void tok_cache_put(tok_cache_t *c, const uint8_t *s, size_t n, uint64_t h,
                          const uint32_t *ids, size_t n_ids)
{
    if (!c->slots) return;
    if (c->count >= TOK_CACHE_SLOTS / 2) tok_cache_clear(c);
    if (c->keys_len + n > c->keys_cap) {
        size_t cap = c->keys_cap ? c->keys_cap * 2 : 1 << 20;
        uint8_t *k = realloc(c->keys, cap);
        if (!k) return;
        c->keys = k;
        c->keys_cap = cap;
    }
    if (c->ids_len + n_ids > c->ids_cap) {
        size_t cap = c->ids_cap ? c->ids_cap * 2 : 1 << 18;
        uint32_t *v = realloc(c->ids, cap * sizeof *v);
        if (!v) return;
        c->ids = v;
        c->ids_cap = cap;
    }
    size_t mask = TOK_CACHE_SLOTS - 1;
    size_t i = h & mask;
    while (c->slots[i].used) i = (i + 1) & mask;
    c->slots[i] = (tok_cache_slot_t){.hash = h, .key_off = (uint32_t)c->keys_len,
                                     .key_len = (uint32_t)n, .ids_off = (uint32_t)c->ids_len,
                                     .n_ids = (uint32_t)n_ids, .used = 1};
    memcpy(c->keys + c->keys_len, s, n);
    c->keys_len += n;
    if (n_ids) memcpy(c->ids + c->ids_len, ids, n_ids * sizeof *ids);
    c->ids_len += n_ids;
    c->count++;
}

/* ---------- BPE ---------- */

typedef struct {
    uint32_t rank;
    uint32_t pos;    /* left symbol */
    uint32_t merged; /* token the pair at pos made when pushed */
} tok_heap_ent_t;

static int tok_heap_less(const tok_heap_ent_t *a, const tok_heap_ent_t *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void tok_heap_push(tok_heap_ent_t *h, size_t *n, tok_heap_ent_t e)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!tok_heap_less(&e, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static tok_heap_ent_t tok_heap_pop(tok_heap_ent_t *h, size_t *n)
{
    tok_heap_ent_t top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && tok_heap_less(&h[c + 1], &h[c])) c++;
        if (!tok_heap_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

/* Scratch for one piece; grown as needed and reused across pieces. */
typedef struct {
    uint32_t *id;
    int32_t *prev, *next;
    tok_heap_ent_t *heap;
    size_t cap;
} tok_bpe_scratch_t;

static bt_status_t tok_bpe_reserve(tok_bpe_scratch_t *w, size_t n)
{
    if (n <= w->cap) return BT_OK;
    size_t cap = tok_pow2_at_least(n);
    uint32_t *id = realloc(w->id, cap * sizeof *id);
    if (id) w->id = id;
    int32_t *prev = realloc(w->prev, cap * sizeof *prev);
    if (prev) w->prev = prev;
    int32_t *next = realloc(w->next, cap * sizeof *next);
    if (next) w->next = next;
    tok_heap_ent_t *heap = realloc(w->heap, 2 * cap * sizeof *heap);
    if (heap) w->heap = heap;
    if (!id || !prev || !next || !heap) return BT_ERR_NOMEM;
    w->cap = cap;
    return BT_OK;
}

static void tok_bpe_try_pair(const tok_t *tok, tok_bpe_scratch_t *w, size_t *hn, int32_t a)
{
    int32_t b = w->next[a];
    if (b < 0) return;
    const tok_merge_slot_t *m = tok_merge_find(tok, w->id[a], w->id[b]);
    if (!m) return;
    tok_heap_push(w->heap, hn, (tok_heap_ent_t){.rank = m->rank, .pos = (uint32_t)a,
                                                .merged = m->merged});
}

/* Symbol *m of a piece's initial list: id, linked to its neighbours. */
static inline void tok_bpe_symbol(tok_bpe_scratch_t *w, size_t *m, uint32_t id)
{
    w->id[*m] = id;
    w->prev[*m] = (int32_t)*m - 1;
    w->next[*m] = (int32_t)*m + 1;
    (*m)++;
}

/* BPE of one piece (raw bytes) appended to out. */
static bt_status_t tok_bpe_piece(tok_t *tok, tok_bpe_scratch_t *w, const uint8_t *s, size_t n,
                                 tok_ids_t *out)
{
    if (tok->ignore_merges) {
        int64_t id = tok_vocab_find(tok, s, n);
        if (id >= 0) {
            tok_ids_push(out, (uint32_t)id);
            return BT_OK;
        }
    }
    uint64_t h = 0;
    int cacheable = n <= TOK_CACHE_MAX_KEY;
    if (cacheable) {
        h = tok_bytes_hash(s, n);
        const tok_cache_slot_t *e = tok_cache_find(&tok->cache, s, n, h);
        if (e) {
            for (uint32_t k = 0; k < e->n_ids; k++) tok_ids_push(out, tok->cache.ids[e->ids_off + k]);
            return BT_OK;
        }
    }
    bt_status_t st = tok_bpe_reserve(w, n);
    if (st != BT_OK) return st;
    /* initial symbols: one per byte; a byte without a token becomes unk
     * (consecutive ones fused when fuse_unk) or, with no unk, is dropped,
     * as HF's BPE does */
    size_t m = 0;
    int last_unk = 0;
    for (size_t i = 0; i < n;) {
        /* byte-level: one symbol a byte; sp: one a character, or its bytes'
         * fallback tokens when the vocab lacks it and has all of those */
        size_t len = 1, fb = 0;
        int32_t id = tok->byte_id[s[i]];
        if (tok->sp) {
            uni_utf8_decode(s + i, n - i, &len);
            if (!len) len = 1;
            int64_t v = tok_vocab_find(tok, s + i, len);
            id = (int32_t)v;
            if (v < 0 && tok->byte_fallback) {
                fb = len;
                for (size_t k = 0; k < len; k++)
                    if (tok->fallback_id[s[i + k]] < 0) fb = 0;
            }
        }
        if (fb) {
            for (size_t k = 0; k < fb; k++)
                tok_bpe_symbol(w, &m, (uint32_t)tok->fallback_id[s[i + k]]);
            last_unk = 0;
            i += len;
            continue;
        }
        i += len;
        if (id < 0) {
            if (tok->unk < 0 || (tok->fuse_unk && last_unk)) continue;
            id = (int32_t)tok->unk;
            last_unk = 1;
        } else {
            last_unk = 0;
        }
        tok_bpe_symbol(w, &m, (uint32_t)id);
    }
    if (m) w->next[m - 1] = -1;
    size_t hn = 0;
    for (size_t i = 0; i + 1 < m; i++) tok_bpe_try_pair(tok, w, &hn, (int32_t)i);
    while (hn) {
        tok_heap_ent_t e = tok_heap_pop(w->heap, &hn);
        int32_t a = (int32_t)e.pos, b = w->next[a];
        /* An entry is stale when a was merged away or is last, or when the
         * pair now at a no longer makes the same token. HF judges it by the
         * made token alone (not by the neighbour it was pushed with), so an
         * entry whose pair changed but still makes that token is applied at
         * its old rank; we do the same to give the same ids. */
        if (w->id[a] == UINT32_MAX || b < 0) continue;
        const tok_merge_slot_t *cur = tok_merge_find(tok, w->id[a], w->id[b]);
        if (!cur || cur->merged != e.merged) continue;
        w->id[a] = e.merged;
        w->id[b] = UINT32_MAX;
        w->next[a] = w->next[b];
        if (w->next[b] >= 0) w->prev[w->next[b]] = a;
        if (hn + 2 > 2 * w->cap) BT_PANIC("BPE heap overflow");
        if (w->prev[a] >= 0) tok_bpe_try_pair(tok, w, &hn, w->prev[a]);
        tok_bpe_try_pair(tok, w, &hn, a);
    }
    size_t first = out->n;
    for (int32_t i = m ? 0 : -1; i >= 0; i = w->next[i]) tok_ids_push(out, w->id[i]);
    if (out->oom) return BT_ERR_NOMEM;
    if (cacheable) tok_cache_put(&tok->cache, s, n, h, out->n > first ? out->v + first : NULL,
                                 out->n - first);
    return BT_OK;
}

/* ---------- pre-tokenization ---------- */

typedef struct {
    tok_t *tok;
    tok_bpe_scratch_t w;
    tok_ids_t out;
    bt_status_t st;
    /* the segment being pre-tokenized starts the input (no added token
     * before it), at gap_start: Metaspace's prepend_scheme "first" */
    int at_start;
    const uint8_t *gap_start;
} tok_enc_t;

static void tok_pre_run(tok_enc_t *e, size_t step, const uint8_t *s, size_t n);

static void tok_pre_emit(tok_enc_t *e, size_t step, const uint8_t *s, size_t n)
{
    if (!n || e->st != BT_OK) return;
    if (step == e->tok->n_pre) e->st = tok_bpe_piece(e->tok, &e->w, s, n, &e->out);
    else tok_pre_run(e, step, s, n);
}

/* Isolated split: every match and every gap between matches is a piece. */
static void tok_pre_split(tok_enc_t *e, size_t step, const tok_pattern_t *p, const uint8_t *s,
                          size_t n)
{
    size_t gap = 0, i = 0;
    while (i < n) {
        size_t m = tok_pattern_match(p, s, n, i);
        if (m) {
            tok_pre_emit(e, step + 1, s + gap, i - gap);
            tok_pre_emit(e, step + 1, s + i, m);
            i += m;
            gap = i;
        } else {
            size_t len;
            uni_utf8_decode(s + i, n - i, &len);
            i += len;
        }
    }
    tok_pre_emit(e, step + 1, s + gap, n - gap);
}

/* s[0..n) into o (NULL: only count) with every occurrence of a[0..la)
 * (left to right, none when la is 0) replaced by b[0..lb); the length. */
static size_t tok_replace_into(uint8_t *o, const uint8_t *s, size_t n, const uint8_t *a,
                               size_t la, const uint8_t *b, size_t lb)
{
    size_t k = 0;
    for (size_t i = 0; i < n;)
        if (la && i + la <= n && !memcmp(s + i, a, la)) {
            if (o) memcpy(o + k, b, lb);
            k += lb;
            i += la;
        } else {
            if (o) o[k] = s[i];
            k++;
            i++;
        }
    return k;
}

/* The same after a prefix pre[0..lp), into a malloc'd string (NULL when
 * out of memory). */
static uint8_t *tok_replace(const uint8_t *s, size_t n, const uint8_t *a, size_t la,
                            const uint8_t *b, size_t lb, const uint8_t *pre, size_t lp,
                            size_t *out_len)
{
    uint8_t *o = malloc(lp + tok_replace_into(NULL, s, n, a, la, b, lb) + 1);
    if (!o) return NULL;
    if (lp) memcpy(o, pre, lp);
    *out_len = lp + tok_replace_into(o + lp, s, n, a, la, b, lb);
    return o;
}

/* Metaspace: spaces become the replacement, which goes in front as the
 * prepend scheme says (not twice); with split, a piece starts at every
 * replacement (HF's MergedWithNext). */
static void tok_pre_metaspace(tok_enc_t *e, size_t step, const tok_pre_t *p, const uint8_t *s,
                              size_t n)
{
    const uint8_t *r = p->repl;
    size_t lr = p->repl_len;
    int front = (p->prepend == PREPEND_ALWAYS ||
                 (p->prepend == PREPEND_FIRST && e->at_start && s == e->gap_start)) &&
                s[0] != ' ' && !(n >= lr && !memcmp(s, r, lr)); /* not when one begins it */
    size_t tn;
    uint8_t *t = tok_replace(s, n, (const uint8_t *)" ", 1, r, lr, r, front ? lr : 0, &tn);
    if (!t) {
        e->st = BT_ERR_NOMEM;
        return;
    }
    const uint8_t *v = t;
    if (!p->split) {
        tok_pre_emit(e, step + 1, v, tn);
    } else {
        size_t start = 0;
        for (size_t i = lr; i + lr <= tn; i++)
            if (!memcmp(v + i, r, lr)) {
                tok_pre_emit(e, step + 1, v + start, i - start);
                start = i;
            }
        tok_pre_emit(e, step + 1, v + start, tn - start);
    }
    free(t);
}

static void tok_pre_run(tok_enc_t *e, size_t step, const uint8_t *s, size_t n)
{
    const tok_pre_t *p = &e->tok->pre[step];
    switch (p->kind) {
    case PRE_SPLIT:
        tok_pre_split(e, step, &p->pat, s, n);
        return;
    case PRE_BYTELEVEL:
        if (p->add_prefix_space && s[0] != ' ') {
            uint8_t *t = malloc(n + 1);
            if (!t) {
                e->st = BT_ERR_NOMEM;
                return;
            }
            t[0] = ' ';
            memcpy(t + 1, s, n);
            if (p->use_regex) tok_pre_split(e, step, &p->pat, t, n + 1);
            else tok_pre_emit(e, step + 1, t, n + 1);
            free(t);
        } else if (p->use_regex) {
            tok_pre_split(e, step, &p->pat, s, n);
        } else {
            tok_pre_emit(e, step + 1, s, n);
        }
        return;
    case PRE_METASPACE:
        tok_pre_metaspace(e, step, p, s, n);
        return;
    case PRE_DIGITS: {
        /* HF's Digits uses Rust's char::is_numeric, not the regex \p{N} */
        size_t i = 0, start = 0;
        while (i < n) {
            size_t len;
            if (uni_is_numeric(uni_utf8_decode(s + i, n - i, &len))) {
                size_t r = len;
                while (!p->individual && i + r < n) {
                    size_t l2;
                    if (!uni_is_numeric(uni_utf8_decode(s + i + r, n - i - r, &l2))) break;
                    r += l2;
                }
                tok_pre_emit(e, step + 1, s + start, i - start);
                tok_pre_emit(e, step + 1, s + i, r);
                i += r;
                start = i;
            } else {
                i += len;
            }
        }
        tok_pre_emit(e, step + 1, s + start, n - start);
        return;
    }
    }
}

/* Added token of the given kind (normalized or not) at s[i], longest first;
 * index into tok->added or -1. */
static int64_t tok_added_at(const tok_t *tok, const uint8_t *s, size_t n, size_t i, int normalized)
{
    uint32_t k = tok->n_added_by_byte[s[i]];
    const uint32_t *cand = tok->added_by_byte[s[i]];
    for (uint32_t j = 0; j < k; j++) {
        const tok_added_t *a = &tok->added[cand[j]];
        if (a->normalized == normalized && a->len <= n - i && !memcmp(s + i, a->content, a->len))
            return cand[j];
    }
    return -1;
}

static size_t tok_space_before(const uint8_t *s, size_t lo, size_t i)
{
    /* whitespace ending at i, scanning back over whole UTF-8 chars */
    size_t j = i;
    while (j > lo) {
        size_t k = j - 1;
        while (k > lo && (s[k] & 0xC0) == 0x80) k--;
        size_t len;
        if (!uni_is_space(uni_utf8_decode(s + k, j - k, &len)) || k + len != j) break;
        j = k;
    }
    return j;
}

typedef void (*tok_gap_fn)(tok_enc_t *e, const uint8_t *s, size_t n);

/* Splits s[0..n) on the added tokens of one kind, leftmost-longest, pushing
 * their ids; the text between them goes to gap. */
static void tok_split_added(tok_enc_t *e, const uint8_t *s, size_t n, int normalized,
                            tok_gap_fn gap)
{
    const tok_t *tok = e->tok;
    size_t seg = 0, i = 0;
    int outer_start = normalized ? e->at_start : 1;
    while (i < n && e->st == BT_OK) {
        int64_t a = tok->n_added_by_byte[s[i]] ? tok_added_at(tok, s, n, i, normalized) : -1;
        if (a < 0) {
            i++;
            continue;
        }
        const tok_added_t *t = &tok->added[a];
        size_t start = t->lstrip ? tok_space_before(s, seg, i) : i;
        size_t end = i + t->len;
        if (t->rstrip) end += tok_run(s, n, end, C_S, C_S, 0, NULL);
        if (start > seg) {
            e->at_start = outer_start && seg == 0;
            e->gap_start = s + seg;
            gap(e, s + seg, start - seg);
        }
        tok_ids_push(&e->out, t->id);
        seg = i = end;
    }
    if (n > seg && e->st == BT_OK) {
        e->at_start = outer_start && seg == 0;
        e->gap_start = s + seg;
        gap(e, s + seg, n - seg);
    }
}

static void tok_gap_pretokenize(tok_enc_t *e, const uint8_t *s, size_t n)
{
    tok_pre_emit(e, 0, s, n);
}

/* s[0..n) through the normalizer's steps into a malloc'd *out; nonzero
 * when out of memory. */
static int tok_normalize(const tok_t *tok, const uint8_t *s, size_t n, uint8_t **out,
                         size_t *out_len)
{
    uint8_t *cur = malloc(n ? n : 1);
    if (!cur) return -1;
    if (n) memcpy(cur, s, n);
    size_t cn = n;
    for (size_t k = 0; k < tok->n_norm; k++) {
        const tok_norm_t *q = &tok->norm[k];
        uint8_t *nx = NULL;
        size_t nn = 0;
        if (q->kind == NORM_NFC) {
            if (uni_nfc(cur, cn, &nx, &nn)) nx = NULL;
        } else if (q->kind == NORM_PREPEND) {
            if (!cn) continue; /* HF prepends to a non-empty string only */
            nx = tok_replace(cur, cn, NULL, 0, NULL, 0, q->a, q->la, &nn);
        } else {
            nx = tok_replace(cur, cn, q->a, q->la, q->b, q->lb, NULL, 0, &nn);
        }
        free(cur);
        if (!nx) return -1;
        cur = nx;
        cn = nn;
    }
    *out = cur;
    *out_len = cn;
    return 0;
}

/* A segment free of non-normalized added tokens: normalize it, then split
 * it on the normalized added tokens (HF's two passes). */
static void tok_gap_normalize(tok_enc_t *e, const uint8_t *s, size_t n)
{
    if (e->tok->n_norm) {
        uint8_t *norm;
        size_t nn;
        if (tok_normalize(e->tok, s, n, &norm, &nn)) {
            e->st = BT_ERR_NOMEM;
            return;
        }
        tok_split_added(e, norm, nn, 1, tok_gap_pretokenize);
        free(norm);
    } else {
        tok_split_added(e, s, n, 1, tok_gap_pretokenize);
    }
}

bt_status_t tok_encode(tok_t *tok, const char *text, size_t len, uint32_t **ids, size_t *n)
{
    tok_enc_t e = {.tok = tok, .st = BT_OK};
    tok_split_added(&e, (const uint8_t *)text, len, 0, tok_gap_normalize);
    if (e.out.oom && e.st == BT_OK) e.st = BT_ERR_NOMEM;
    free(e.w.id);
    free(e.w.prev);
    free(e.w.next);
    free(e.w.heap);
    if (e.st != BT_OK) {
        free(e.out.v);
        if (e.st == BT_ERR_NOMEM) log_error("tokenizer: out of memory encoding %zu bytes", len);
        return e.st;
    }
    if (!e.out.v) e.out.v = malloc(sizeof *e.out.v);
    if (!e.out.v) return BT_ERR_NOMEM;
    *ids = e.out.v;
    *n = e.out.n;
    return BT_OK;
}

bt_status_t tok_decode(const tok_t *tok, const uint32_t *ids, size_t n, char **text, size_t *len)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= tok->n_tokens || !tok->tokens[ids[i]].present) {
            log_error("tokenizer: decode: id %u at position %zu is not in the vocabulary (size %u)",
                      ids[i], i, tok->n_tokens);
            return BT_ERR_INVALID;
        }
        total += tok->tokens[ids[i]].len;
    }
    char *out = malloc(total + 1);
    if (!out) return BT_ERR_NOMEM;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        const tok_token_t *t = &tok->tokens[ids[i]];
        if (t->fallback_byte && tok->dec_byte_fallback) { /* "<0xXX>" is its byte */
            out[o++] = (char)(t->fallback_byte - 1);
        } else if (tok->sp && tok->dec_repl) { /* sp: the replacement is a space again */
            /* never longer than the token: a replacement is at least one byte */
            o += tok_replace_into((uint8_t *)out + o, t->bytes, t->len, tok->dec_repl,
                                  tok->dec_repl_len, (const uint8_t *)" ", 1);
        } else {
            memcpy(out + o, t->bytes, t->len);
            o += t->len;
        }
    }
    size_t strip = 0;
    while (strip < (size_t)tok->dec_strip && strip < o && out[strip] == ' ') strip++;
    if (strip) memmove(out, out + strip, o - strip);
    o -= strip;
    out[o] = '\0';
    *text = out;
    *len = o;
    return BT_OK;
}

const uint8_t *tok_token_bytes(const tok_t *tok, uint32_t id, size_t *len)
{
    if (id >= tok->n_tokens || !tok->tokens[id].present) return NULL;
    *len = tok->tokens[id].len;
    return tok->tokens[id].bytes;
}

/* A pattern splits "x\nA" into "...x\n" | "A..." whatever surrounds it when
 * it has branches taking letters, numbers, other symbols and whitespace
 * (every character is then in some match: no gap piece can span the cut),
 * none of them lets a letter follow a newline, and the lookahead of
 * \s+(?!\S) sees the same single "\n" either way. */
static int tok_pattern_covers(const tok_pattern_t *p)
{
    unsigned have = 0;
    for (size_t k = 0; k < p->n; k++) {
        switch (p->br[k].kind) {
        case BR_OPTSPACE_LETTERS: case BR_PREFIX_LETTERS: have |= 1; break;
        case BR_OPTSPACE_NUMBERS: case BR_NUMBERS: have |= 2; break;
        case BR_OPTSPACE_OTHER: case BR_OPTSPACE_OTHER_NL: have |= 4; break;
        case BR_WS: have |= 8; break;
        case BR_WS_NEWLINES: case BR_WS_NOT_BEFORE_NONWS: break;
        case BR_LITERAL: case BR_LITERALS_CI:
            for (size_t j = 0; j < p->br[k].n_lits; j++)
                if (memchr(p->br[k].lits[j], '\n', p->br[k].lit_lens[j])) return 0;
            break;
        }
    }
    return have == 15;
}

size_t tok_safe_cut(const tok_t *tok, const char *text, size_t len, size_t want)
{
    /* SentencePiece style: a prepended replacement starts every segment */
    if (tok->sp) return len;
    int covered = 0;
    for (size_t i = 0; i < tok->n_pre; i++) {
        const tok_pre_t *p = &tok->pre[i];
        if ((p->kind == PRE_SPLIT || (p->kind == PRE_BYTELEVEL && p->use_regex)) &&
            tok_pattern_covers(&p->pat))
            covered = 1;
        if (p->kind == PRE_BYTELEVEL && p->add_prefix_space) return len;
    }
    if (!covered) return len;
    /* an added token that spans the cut or strips the newline away */
    for (size_t i = 0; i < tok->n_added; i++) {
        const tok_added_t *a = &tok->added[i];
        if (memchr(a->content, '\n', a->len) || a->lstrip) return len;
    }
    const uint8_t *s = (const uint8_t *)text;
    for (size_t i = want < 2 ? 2 : want; i < len; i++)
        if (s[i - 1] == '\n' && s[i - 2] > ' ' && s[i - 2] < 0x7f && ((s[i] | 0x20) >= 'a' &&
            (s[i] | 0x20) <= 'z'))
            return i;
    return len;
}

tok_special_t tok_special(const tok_t *tok) { return tok->special; }
uint32_t tok_vocab_size(const tok_t *tok) { return tok->n_tokens; }
uint64_t tok_hash(const tok_t *tok) { return tok->file_hash; }

/* ---------- loading ---------- */

void tok_free(tok_t *tok)
{
    if (!tok) return;
    for (uint32_t i = 0; i < tok->n_tokens; i++) free(tok->tokens[i].bytes);
    free(tok->tokens);
    free(tok->vocab.slots);
    free(tok->merges.slots);
    for (size_t i = 0; i < tok->n_added; i++) free(tok->added[i].content);
    free(tok->added);
    for (int b = 0; b < 256; b++) free(tok->added_by_byte[b]);
    for (size_t i = 0; i < tok->n_pre; i++) {
        tok_pattern_free(&tok->pre[i].pat);
        free(tok->pre[i].repl);
    }
    for (size_t i = 0; i < tok->n_norm; i++) {
        free(tok->norm[i].a);
        free(tok->norm[i].b);
    }
    free(tok->norm);
    free(tok->dec_repl);
    free(tok->pre);
    free(tok->cache.slots);
    free(tok->cache.keys);
    free(tok->cache.ids);
    free(tok);
}

static const char *tok_json_type(json_t *o)
{
    const char *t = json_string_value(json_object_get(o, "type"));
    return t ? t : "(no type)";
}

static int tok_json_true(json_t *o, const char *key, int dflt)
{
    json_t *v = json_object_get(o, key);
    return v && json_is_boolean(v) ? json_is_true(v) : dflt;
}

static bt_status_t tok_norm_add(tok_t *tok, tok_norm_kind_t kind, const char *a, const char *b)
{
    tok_norm_t *v = realloc(tok->norm, (tok->n_norm + 1) * sizeof *v);
    if (!v) return BT_ERR_NOMEM;
    tok->norm = v;
    tok_norm_t q = {.kind = kind};
    q.la = a ? strlen(a) : 0;
    q.lb = b ? strlen(b) : 0;
    q.a = a ? (uint8_t *)strdup(a) : NULL;
    q.b = b ? (uint8_t *)strdup(b) : NULL;
    if ((a && !q.a) || (b && !q.b)) {
        free(q.a);
        free(q.b);
        return BT_ERR_NOMEM;
    }
    tok->norm[tok->n_norm++] = q;
    return BT_OK;
}

static bt_status_t tok_load_normalizer(tok_t *tok, json_t *norm, const char *path)
{
    if (!norm || json_is_null(norm)) return BT_OK;
    const char *t = tok_json_type(norm);
    if (!strcmp(t, "NFC")) return tok_norm_add(tok, NORM_NFC, NULL, NULL);
    if (!strcmp(t, "Prepend")) {
        const char *a = json_string_value(json_object_get(norm, "prepend"));
        if (!a) {
            log_error("%s: Prepend normalizer without a 'prepend' string", path);
            return BT_ERR_INVALID;
        }
        return tok_norm_add(tok, NORM_PREPEND, a, NULL);
    }
    if (!strcmp(t, "Replace")) {
        json_t *pat = json_object_get(norm, "pattern");
        const char *a = json_string_value(json_object_get(pat, "String"));
        const char *b = json_string_value(json_object_get(norm, "content"));
        if (!a || !*a || !b) {
            log_error("%s: Replace normalizer: only a non-empty String pattern and a content "
                      "string are supported (no Regex)", path);
            return BT_ERR_UNSUPPORTED;
        }
        return tok_norm_add(tok, NORM_REPLACE, a, b);
    }
    if (!strcmp(t, "Sequence")) {
        json_t *list = json_object_get(norm, "normalizers");
        size_t i;
        json_t *v;
        json_array_foreach(list, i, v) {
            bt_status_t st = tok_load_normalizer(tok, v, path);
            if (st != BT_OK) return st;
        }
        return BT_OK;
    }
    log_error("%s: normalizer '%s' is not supported (supported: none, NFC, Prepend, Replace of a "
              "String, Sequence of these)", path, t);
    return BT_ERR_UNSUPPORTED;
}

/* A Metaspace pre-tokenizer's or decoder's prepend_scheme, or the older
 * add_prefix_space (true: always). */
static bt_status_t tok_prepend_scheme(json_t *o, const char *path, tok_prepend_t *out)
{
    const char *scheme = json_string_value(json_object_get(o, "prepend_scheme"));
    if (!scheme) *out = tok_json_true(o, "add_prefix_space", 1) ? PREPEND_ALWAYS : PREPEND_NEVER;
    else if (!strcmp(scheme, "always")) *out = PREPEND_ALWAYS;
    else if (!strcmp(scheme, "first")) *out = PREPEND_FIRST;
    else if (!strcmp(scheme, "never")) *out = PREPEND_NEVER;
    else {
        log_error("%s: Metaspace prepend_scheme '%s' is not supported (always, first, never)",
                  path, scheme);
        return BT_ERR_UNSUPPORTED;
    }
    return BT_OK;
}

static bt_status_t tok_pre_add(tok_t *tok, tok_pre_t p)
{
    tok_pre_t *v = realloc(tok->pre, (tok->n_pre + 1) * sizeof *v);
    if (!v) return BT_ERR_NOMEM;
    tok->pre = v;
    tok->pre[tok->n_pre++] = p;
    return BT_OK;
}

static bt_status_t tok_load_pre(tok_t *tok, json_t *pre, const char *path)
{
    if (!pre || json_is_null(pre)) return BT_OK;
    const char *t = tok_json_type(pre);
    bt_status_t st;
    if (!strcmp(t, "Sequence")) {
        json_t *list = json_object_get(pre, "pretokenizers");
        size_t i;
        json_t *v;
        json_array_foreach(list, i, v) {
            st = tok_load_pre(tok, v, path);
            if (st != BT_OK) return st;
        }
        return BT_OK;
    }
    tok_pre_t p = {0};
    if (!strcmp(t, "ByteLevel")) {
        p.kind = PRE_BYTELEVEL;
        p.add_prefix_space = tok_json_true(pre, "add_prefix_space", 1);
        p.use_regex = tok_json_true(pre, "use_regex", 1);
        if (p.use_regex && (st = tok_pattern_compile(tok_gpt2_pattern, &p.pat)) != BT_OK) return st;
    } else if (!strcmp(t, "Metaspace")) {
        if (!tok->sp) {
            log_error("%s: a Metaspace pre-tokenizer needs its decoder (Metaspace, or Replace / "
                      "ByteFallback / Fuse / Strip)", path);
            return BT_ERR_UNSUPPORTED;
        }
        const char *r = json_string_value(json_object_get(pre, "replacement"));
        p.kind = PRE_METASPACE;
        p.split = tok_json_true(pre, "split", 1);
        if ((st = tok_prepend_scheme(pre, path, &p.prepend)) != BT_OK) return st;
        if (!r || !*r) {
            log_error("%s: Metaspace pre-tokenizer without a replacement", path);
            return BT_ERR_INVALID;
        }
        p.repl = (uint8_t *)strdup(r);
        if (!p.repl) return BT_ERR_NOMEM;
        p.repl_len = strlen(r);
    } else if (!strcmp(t, "Digits")) {
        p.kind = PRE_DIGITS;
        p.individual = tok_json_true(pre, "individual_digits", 0);
    } else if (!strcmp(t, "Split")) {
        const char *behavior = json_string_value(json_object_get(pre, "behavior"));
        if (!behavior || strcmp(behavior, "Isolated") || tok_json_true(pre, "invert", 0)) {
            log_error("%s: Split pre-tokenizer with behavior '%s'%s is not supported "
                      "(only Isolated, not inverted)", path, behavior ? behavior : "?",
                      tok_json_true(pre, "invert", 0) ? " and invert" : "");
            return BT_ERR_UNSUPPORTED;
        }
        json_t *pat = json_object_get(pre, "pattern");
        const char *re = json_string_value(json_object_get(pat, "Regex"));
        const char *lit = json_string_value(json_object_get(pat, "String"));
        p.kind = PRE_SPLIT;
        if (re) {
            st = tok_pattern_compile(re, &p.pat);
            if (st != BT_OK) return st;
        } else if (lit && *lit) {
            p.pat.br = calloc(1, sizeof *p.pat.br);
            if (!p.pat.br) return BT_ERR_NOMEM;
            p.pat.n = 1;
            p.pat.br[0].kind = BR_LITERAL;
            size_t ln = strlen(lit);
            st = tok_branch_add_literals(&p.pat.br[0], &lit, &ln, 1, 0);
            if (st != BT_OK) {
                tok_pattern_free(&p.pat);
                return st;
            }
        } else {
            log_error("%s: Split pre-tokenizer without a Regex or String pattern", path);
            return BT_ERR_INVALID;
        }
    } else {
        log_error("%s: pre-tokenizer '%s' is not supported (supported: ByteLevel, Split, Digits, "
                  "Metaspace, Sequence)", path, t);
        return BT_ERR_UNSUPPORTED;
    }
    st = tok_pre_add(tok, p);
    if (st != BT_OK) {
        tok_pattern_free(&p.pat);
        free(p.repl);
    }
    return st;
}

static bt_status_t tok_set_token(tok_t *tok, uint32_t id, const uint8_t *b, size_t n)
{
    tok_token_t *t = &tok->tokens[id];
    if (t->present) return BT_OK; /* model vocab first; an added token of the same id agrees */
    t->bytes = malloc(n ? n : 1);
    if (!t->bytes) return BT_ERR_NOMEM;
    memcpy(t->bytes, b, n);
    t->len = (uint32_t)n;
    t->present = 1;
    return BT_OK;
}

static int tok_added_cmp_len(const void *a, const void *b, void *ctx)
{
    const tok_t *tok = ctx;
    size_t la = tok->added[*(const uint32_t *)a].len, lb = tok->added[*(const uint32_t *)b].len;
    return la < lb ? 1 : la > lb ? -1 : 0;
}

static int64_t tok_lookup_text(const tok_t *tok, const char *s)
{
    for (size_t i = 0; i < tok->n_added; i++)
        if (tok->added[i].len == strlen(s) && !memcmp(tok->added[i].content, s, strlen(s)))
            return tok->added[i].id;
    return -1;
}

static const char *tok_config_token(json_t *cfg, const char *key)
{
    json_t *v = json_object_get(cfg, key);
    if (json_is_string(v)) return json_string_value(v);
    return json_string_value(json_object_get(v, "content"));
}

/* json_path: the file, for its tokenizer_config.json neighbour; NULL: none. */
static void tok_find_special(tok_t *tok, json_t *root, const char *json_path)
{
    tok->special.bos = tok->special.eos = -1;
    /* 1. tokenizer_config.json beside the file */
    json_t *cfg = NULL;
    if (json_path) {
        char cfg_path[4096];
        const char *slash = strrchr(json_path, '/');
        int dl = slash ? (int)(slash - json_path) : 1;
        snprintf(cfg_path, sizeof cfg_path, "%.*s/tokenizer_config.json", dl,
                 slash ? json_path : ".");
        cfg = json_load_file(cfg_path, 0, NULL);
    }
    if (cfg) {
        const char *b = tok_config_token(cfg, "bos_token"), *e = tok_config_token(cfg, "eos_token");
        if (b) tok->special.bos = tok_lookup_text(tok, b);
        if (e) tok->special.eos = tok_lookup_text(tok, e);
        json_decref(cfg);
    }
    /* 2. a post-processor template that starts with a special token = BOS */
    json_t *pp = json_object_get(root, "post_processor");
    if (pp && !strcmp(tok_json_type(pp), "Sequence")) { /* Llama-3.1: [ByteLevel, Template] */
        size_t k;
        json_t *sub;
        json_array_foreach(json_object_get(pp, "processors"), k, sub)
            if (!strcmp(tok_json_type(sub), "TemplateProcessing")) pp = sub;
    }
    if (tok->special.bos < 0 && pp && !strcmp(tok_json_type(pp), "TemplateProcessing")) {
        json_t *first = json_array_get(json_object_get(pp, "single"), 0);
        const char *name = json_string_value(
            json_object_get(json_object_get(first, "SpecialToken"), "id"));
        if (name) tok->special.bos = tok_lookup_text(tok, name);
    }
    /* 3. well-known names among the added special tokens */
    static const char *const eos_names[] = {"<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>"};
    static const char *const bos_names[] = {"<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>"};
    for (size_t i = 0; tok->special.eos < 0 && i < sizeof eos_names / sizeof eos_names[0]; i++)
        tok->special.eos = tok_lookup_text(tok, eos_names[i]);
    for (size_t i = 0; tok->special.bos < 0 && i < sizeof bos_names / sizeof bos_names[0]; i++)
        tok->special.bos = tok_lookup_text(tok, bos_names[i]);
}

/* An upper-case hexadecimal digit's value, else -1. */
static int tok_hex_upper(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static bt_status_t tok_load_model(tok_t *tok, json_t *model, const char *path)
{
    const char *type = json_string_value(json_object_get(model, "type"));
    if (type && strcmp(type, "BPE")) {
        log_error("%s: model '%s' is not supported (only BPE)", path, type);
        return BT_ERR_UNSUPPORTED;
    }
    json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout) && json_number_value(dropout) != 0.0) {
        log_error("%s: BPE dropout is not supported", path);
        return BT_ERR_UNSUPPORTED;
    }
    static const char *const unsupported_str[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t i = 0; i < 2; i++) {
        const char *v = json_string_value(json_object_get(model, unsupported_str[i]));
        if (v && *v) {
            log_error("%s: BPE %s '%s' is not supported", path, unsupported_str[i], v);
            return BT_ERR_UNSUPPORTED;
        }
    }
    tok->byte_fallback = tok_json_true(model, "byte_fallback", 0);
    if (tok->byte_fallback && !tok->sp) {
        log_error("%s: BPE byte_fallback with a byte-level decoder is not supported (it belongs "
                  "to SentencePiece-style tokenizers: a Metaspace or Replace/ByteFallback decoder)",
                  path);
        return BT_ERR_UNSUPPORTED;
    }
    tok->ignore_merges = tok_json_true(model, "ignore_merges", 0);
    tok->fuse_unk = tok_json_true(model, "fuse_unk", 0);
    json_t *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges");
    if (!json_is_object(vocab) || !json_is_array(merges)) {
        log_error("%s: model has no vocab object or merges array", path);
        return BT_ERR_INVALID;
    }
    uint32_t byte_to_cp[256];
    int16_t cp_to_byte[324];
    tok_bytelevel_table(byte_to_cp, cp_to_byte);
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v) {
        json_int_t id = json_integer_value(v);
        if (!json_is_integer(v) || id < 0 || id >= (json_int_t)tok->n_tokens) {
            log_error("%s: vocab entry '%s' has a bad id", path, key);
            return BT_ERR_INVALID;
        }
        size_t kl = strlen(key), bl;
        if (tok->sp) { /* the vocab string as it stands; "<0xXX>" also stands for its byte */
            bt_status_t st = tok_set_token(tok, (uint32_t)id, (const uint8_t *)key, kl);
            if (st != BT_OK) return st;
            /* HF spells them "<0x%02X>": upper-case hex only */
            int hi = kl == 6 ? tok_hex_upper(key[3]) : -1;
            int lo = kl == 6 ? tok_hex_upper(key[4]) : -1;
            if (hi >= 0 && lo >= 0 && !strncmp(key, "<0x", 3) && key[5] == '>')
                tok->tokens[id].fallback_byte = hi * 16 + lo + 1;
            continue;
        }
        uint8_t *buf = malloc(kl + 1);
        if (!buf) return BT_ERR_NOMEM;
        int mapped = tok_unmap_bytes(key, kl, cp_to_byte, buf, &bl);
        bt_status_t st = mapped ? tok_set_token(tok, (uint32_t)id, buf, bl)
                                : tok_set_token(tok, (uint32_t)id, (const uint8_t *)key, kl);
        free(buf);
        if (st == BT_OK && !mapped) tok->tokens[id].raw = 1;
        if (st != BT_OK) return st;
    }
    /* raw entries stay out of the map: HF looks pieces up by their byte-level
     * spelling, which a raw entry's UTF-8 bytes could collide with */
    for (uint32_t id = 0; id < tok->n_tokens; id++)
        if (tok->tokens[id].present && !tok->tokens[id].raw) tok_vocab_insert(tok, id);
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        int64_t id = tok_vocab_find(tok, &c, 1);
        tok->byte_id[b] = (int32_t)id;
        tok->fallback_id[b] = -1;
    }
    for (uint32_t id = 0; id < tok->n_tokens; id++) {
        int fb = tok->tokens[id].fallback_byte - 1;
        if (fb >= 0 && tok->fallback_id[fb] < 0) tok->fallback_id[fb] = (int32_t)id;
    }
    const char *unk = json_string_value(json_object_get(model, "unk_token"));
    tok->unk = -1;
    if (unk) {
        json_t *u = json_object_get(vocab, unk);
        tok->unk = u ? json_integer_value(u) : -1;
    }
    size_t nm = json_array_size(merges);
    tok->merges.cap = tok_pow2_at_least(nm * 2 + 16);
    tok->merges.slots = calloc(tok->merges.cap, sizeof *tok->merges.slots);
    if (!tok->merges.slots) return BT_ERR_NOMEM;
    for (size_t r = 0; r < nm; r++) {
        json_t *m = json_array_get(merges, r);
        const char *a, *b;
        size_t la, lb;
        char *dup = NULL;
        if (json_is_string(m)) {
            dup = strdup(json_string_value(m));
            if (!dup) return BT_ERR_NOMEM;
            char *sp = strchr(dup, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                log_error("%s: merge %zu '%s' is not two tokens separated by one space", path, r, dup);
                free(dup);
                return BT_ERR_INVALID;
            }
            *sp = '\0';
            a = dup;
            b = sp + 1;
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
        } else {
            log_error("%s: merge %zu is neither \"a b\" nor [a, b]", path, r);
            return BT_ERR_INVALID;
        }
        la = strlen(a);
        lb = strlen(b);
        json_t *ia = json_object_get(vocab, a), *ib = json_object_get(vocab, b);
        char *cat = malloc(la + lb + 1);
        if (!cat) {
            free(dup);
            return BT_ERR_NOMEM;
        }
        memcpy(cat, a, la);
        memcpy(cat + la, b, lb);
        cat[la + lb] = '\0';
        json_t *ic = json_object_get(vocab, cat);
        if (!ia || !ib || !ic) {
            log_error("%s: merge %zu ('%s' + '%s') uses a token missing from the vocab", path, r, a, b);
            free(cat);
            free(dup);
            return BT_ERR_INVALID;
        }
        tok_merge_insert(tok, (uint32_t)json_integer_value(ia), (uint32_t)json_integer_value(ib),
                         (uint32_t)r, (uint32_t)json_integer_value(ic));
        free(cat);
        free(dup);
    }
    return BT_OK;
}

static bt_status_t tok_load_added(tok_t *tok, json_t *added, const char *path)
{
    size_t na = json_array_size(added);
    tok->added = calloc(na ? na : 1, sizeof *tok->added);
    if (!tok->added) return BT_ERR_NOMEM;
    size_t i;
    json_t *a;
    json_array_foreach(added, i, a) {
        const char *content = json_string_value(json_object_get(a, "content"));
        json_t *idv = json_object_get(a, "id");
        if (!content || !*content || !json_is_integer(idv) || json_integer_value(idv) < 0 ||
            json_integer_value(idv) >= (json_int_t)tok->n_tokens) {
            log_error("%s: added_tokens[%zu] lacks a content or a valid id", path, i);
            return BT_ERR_INVALID;
        }
        if (tok_json_true(a, "single_word", 0)) {
            log_error("%s: added token '%s' has single_word=true, which is not supported", path,
                      content);
            return BT_ERR_UNSUPPORTED;
        }
        tok_added_t *t = &tok->added[tok->n_added];
        t->len = strlen(content);
        t->content = (uint8_t *)strdup(content);
        if (!t->content) return BT_ERR_NOMEM;
        tok->n_added++;
        t->id = (uint32_t)json_integer_value(idv);
        t->lstrip = tok_json_true(a, "lstrip", 0);
        t->rstrip = tok_json_true(a, "rstrip", 0);
        t->special = tok_json_true(a, "special", 0);
        t->normalized = tok_json_true(a, "normalized", !t->special);
        bt_status_t st = tok_set_token(tok, t->id, t->content, t->len);
        if (st != BT_OK) return st;
        uint8_t b0 = t->content[0];
        uint32_t *v = realloc(tok->added_by_byte[b0], (tok->n_added_by_byte[b0] + 1) * sizeof *v);
        if (!v) return BT_ERR_NOMEM;
        tok->added_by_byte[b0] = v;
        v[tok->n_added_by_byte[b0]++] = (uint32_t)(tok->n_added - 1);
    }
    for (int b = 0; b < 256; b++)
        if (tok->n_added_by_byte[b] > 1)
            qsort_r(tok->added_by_byte[b], tok->n_added_by_byte[b], sizeof(uint32_t),
                    tok_added_cmp_len, tok);
    return BT_OK;
}

/* Normalized added tokens are matched on normalized text, so their content
 * is normalized too, as HF does; the per-byte index follows the new first
 * bytes. Decoding keeps the token's original text. */
static bt_status_t tok_normalize_added(tok_t *tok)
{
    if (!tok->n_norm) return BT_OK;
    for (size_t i = 0; i < tok->n_added; i++) {
        tok_added_t *t = &tok->added[i];
        if (!t->normalized) continue;
        uint8_t *norm;
        size_t nn;
        if (tok_normalize(tok, t->content, t->len, &norm, &nn)) return BT_ERR_NOMEM;
        if (nn == t->len && !memcmp(norm, t->content, nn)) {
            free(norm);
            continue;
        }
        free(t->content);
        t->content = norm;
        t->len = nn;
    }
    for (int b = 0; b < 256; b++) tok->n_added_by_byte[b] = 0;
    for (size_t i = 0; i < tok->n_added; i++) {
        uint8_t b0 = tok->added[i].content[0];
        uint32_t *v = realloc(tok->added_by_byte[b0], (tok->n_added_by_byte[b0] + 1) * sizeof *v);
        if (!v) return BT_ERR_NOMEM;
        tok->added_by_byte[b0] = v;
        v[tok->n_added_by_byte[b0]++] = (uint32_t)i;
    }
    for (int b = 0; b < 256; b++)
        if (tok->n_added_by_byte[b] > 1)
            qsort_r(tok->added_by_byte[b], tok->n_added_by_byte[b], sizeof(uint32_t),
                    tok_added_cmp_len, tok);
    return BT_OK;
}

static bt_status_t tok_dec_repl(tok_t *tok, const char *r, const char *path)
{
    if (!r || !*r) {
        log_error("%s: decoder without a replacement string", path);
        return BT_ERR_INVALID;
    }
    if (tok->dec_repl && strcmp((const char *)tok->dec_repl, r)) {
        log_error("%s: decoder replaces both '%s' and '%s'", path, (const char *)tok->dec_repl, r);
        return BT_ERR_UNSUPPORTED;
    }
    free(tok->dec_repl);
    tok->dec_repl = (uint8_t *)strdup(r);
    if (!tok->dec_repl) return BT_ERR_NOMEM;
    tok->dec_repl_len = strlen(r);
    return BT_OK;
}

/* The decoder, which also says how vocab strings read: ByteLevel (or none)
 * for byte-level BPE; Metaspace, or a Sequence of Replace(String -> " "),
 * ByteFallback, Fuse and Strip(" ", n, 0), for SentencePiece-style BPE
 * (tok->sp, set here before the model loads). */
static bt_status_t tok_load_decoder(tok_t *tok, json_t *dec, const char *path)
{
    if (!dec || json_is_null(dec)) return BT_OK;
    const char *t = tok_json_type(dec);
    if (!strcmp(t, "ByteLevel")) {
        if (tok->sp) {
            log_error("%s: a ByteLevel decoder beside SentencePiece-style ones", path);
            return BT_ERR_UNSUPPORTED;
        }
        return BT_OK;
    }
    if (!strcmp(t, "Metaspace")) {
        tok->sp = 1;
        tok_prepend_t front;
        bt_status_t st = tok_prepend_scheme(dec, path, &front);
        if (st != BT_OK) return st;
        if (front != PREPEND_NEVER) tok->dec_strip = 1;
        return tok_dec_repl(tok, json_string_value(json_object_get(dec, "replacement")), path);
    }
    if (!strcmp(t, "Sequence")) {
        json_t *list = json_object_get(dec, "decoders");
        size_t i;
        json_t *v;
        json_array_foreach(list, i, v) {
            const char *k = tok_json_type(v);
            bt_status_t st = BT_OK;
            if (!strcmp(k, "Replace")) {
                json_t *pat = json_object_get(v, "pattern");
                const char *a = json_string_value(json_object_get(pat, "String"));
                const char *b = json_string_value(json_object_get(v, "content"));
                if (!b || strcmp(b, " ")) {
                    log_error("%s: Replace decoder to '%s' is not supported (only to a space)",
                              path, b ? b : "?");
                    return BT_ERR_UNSUPPORTED;
                }
                tok->sp = 1;
                st = tok_dec_repl(tok, a, path);
            } else if (!strcmp(k, "Strip")) {
                const char *c = json_string_value(json_object_get(v, "content"));
                json_int_t start = json_integer_value(json_object_get(v, "start"));
                json_int_t stop = json_integer_value(json_object_get(v, "stop"));
                if (!c || strcmp(c, " ") || stop != 0 || start < 0 || start > 8) {
                    log_error("%s: Strip decoder: only spaces from the start are supported", path);
                    return BT_ERR_UNSUPPORTED;
                }
                tok->dec_strip = (int)start;
                tok->sp = 1;
            } else if (!strcmp(k, "ByteFallback") || !strcmp(k, "Fuse")) {
                if (!strcmp(k, "ByteFallback")) tok->dec_byte_fallback = 1;
                tok->sp = 1;
            } else {
                log_error("%s: decoder '%s' in a Sequence is not supported (Replace, ByteFallback, "
                          "Fuse, Strip)", path, k);
                return BT_ERR_UNSUPPORTED;
            }
            if (st != BT_OK) return st;
        }
        return BT_OK;
    }
    log_error("%s: decoder '%s' is not supported (ByteLevel, Metaspace, or a Sequence of Replace, "
              "ByteFallback, Fuse and Strip)", path, t);
    return BT_ERR_UNSUPPORTED;
}

/* json_path names the source in errors; with a real path, a
 * tokenizer_config.json beside it is consulted for BOS/EOS. */
static bt_status_t tok_load_buffer(const char *buf, size_t len, const char *json_path,
                                   int beside_config, tok_t **out)
{
    static int class_ready;
    if (!class_ready) {
        tok_ascii_class_init();
        class_ready = 1;
    }
    bt_status_t st;
    json_error_t jerr;
    json_t *root = json_loadb(buf, len, 0, &jerr);
    if (!root) {
        log_error("%s:%d:%d: not valid JSON: %s", json_path, jerr.line, jerr.column, jerr.text);
        return BT_ERR_INVALID;
    }
    tok_t *tok = calloc(1, sizeof *tok);
    if (!tok) {
        st = BT_ERR_NOMEM;
        goto fail_root;
    }
    tok->file_hash = XXH64(buf, len, 0);
    json_t *model = json_object_get(root, "model");
    json_t *vocab = json_object_get(model, "vocab");
    json_t *added = json_object_get(root, "added_tokens");
    /* ids are dense in practice; size the table by the largest one */
    json_int_t max_id = -1;
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v)
        if (json_integer_value(v) > max_id) max_id = json_integer_value(v);
    size_t i;
    json_array_foreach(added, i, v) {
        json_int_t id = json_integer_value(json_object_get(v, "id"));
        if (id > max_id) max_id = id;
    }
    if (max_id < 0 || max_id >= (json_int_t)1 << 31) {
        log_error("%s: no vocabulary (or ids out of range)", json_path);
        st = BT_ERR_INVALID;
        goto fail_tok;
    }
    /* The tables are indexed by id, so a few entries with a huge id would
     * allocate gigabytes (the fuzzer found 188 tokens with id 120113197:
     * 2.9 GB). Real vocabularies are dense; allow as many holes as ids. */
    size_t n_entries = json_object_size(vocab) + json_array_size(added);
    if ((uint64_t)max_id >= 2 * (uint64_t)n_entries + 1024) {
        log_error("%s: token ids are sparse: the largest is %lld for %zu tokens (ids must be "
                  "nearly dense: below twice the number of tokens + 1024)", json_path,
                  (long long)max_id, n_entries);
        st = BT_ERR_INVALID;
        goto fail_tok;
    }
    tok->n_tokens = (uint32_t)max_id + 1;
    tok->tokens = calloc(tok->n_tokens, sizeof *tok->tokens);
    tok->vocab.cap = tok_pow2_at_least((size_t)tok->n_tokens * 2);
    tok->vocab.slots = calloc(tok->vocab.cap, sizeof *tok->vocab.slots);
    tok->cache.slots = calloc(TOK_CACHE_SLOTS, sizeof *tok->cache.slots);
    if (!tok->tokens || !tok->vocab.slots || !tok->cache.slots) {
        st = BT_ERR_NOMEM;
        goto fail_tok;
    }
    if ((st = tok_load_decoder(tok, json_object_get(root, "decoder"), json_path)) != BT_OK)
        goto fail_tok;
    if ((st = tok_load_model(tok, model, json_path)) != BT_OK) goto fail_tok;
    if ((st = tok_load_added(tok, added, json_path)) != BT_OK) goto fail_tok;
    if ((st = tok_load_normalizer(tok, json_object_get(root, "normalizer"), json_path)) != BT_OK)
        goto fail_tok;
    if ((st = tok_load_pre(tok, json_object_get(root, "pre_tokenizer"), json_path)) != BT_OK)
        goto fail_tok;
    if ((st = tok_normalize_added(tok)) != BT_OK) goto fail_tok;
    tok_find_special(tok, root, beside_config ? json_path : NULL);
    json_decref(root);
    *out = tok;
    return BT_OK;

fail_tok:
    if (st == BT_ERR_NOMEM) log_error("%s: out of memory loading the tokenizer", json_path);
    tok_free(tok);
fail_root:
    json_decref(root);
    return st;
}

bt_status_t tok_load_json(const char *json, size_t len, tok_t **out)
{
    return tok_load_buffer(json, len, "(tokenizer json)", 0, out);
}

bt_status_t tok_load(const char *path, tok_t **out)
{
    char json_path[4096];
    struct stat sb;
    if (!stat(path, &sb) && S_ISDIR(sb.st_mode))
        snprintf(json_path, sizeof json_path, "%s/tokenizer.json", path);
    else
        snprintf(json_path, sizeof json_path, "%s", path);
    char *buf;
    size_t len;
    bt_status_t st = base_file_read(json_path, 0, &buf, &len);
    if (st != BT_OK) return st;
    st = tok_load_buffer(buf, len, json_path, 1, out);
    free(buf);
    return st;
}
