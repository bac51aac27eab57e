/* examples/gpt_data.h - a byte-level corpus for examples/gpt.h: text split into documents of
   variable length, and packing of a step's documents into one global batch without padding.
   What to copy: gpt_pack, which turns documents into tokens, targets and cu_seqlens.

     gpt_corpus c;
     gpt_corpus_load(&c, "README.md", 128, seed)      any text file; or
     gpt_corpus_from_text(&c, text, n, 128, seed)     text in memory; or
     gpt_corpus_generate(&c, 4000, 128, seed)         a built-in task (below)
     T = gpt_pack(&c, &rng, n_seqs, tokens, targets, cu);   buffers of n_seqs * c.max_len
     gpt_corpus_hold_out(&c, 10, &val)                every 10th document set aside (validation)
     T = gpt_pack_docs(&val, first, n_seqs, tokens, targets, cu);   documents in order
     gpt_corpus_free(&c);

   Tokens are bytes (vocabulary 256). A file is split at blank lines (paragraphs); a paragraph
   longer than max_len is cut into pieces of random, long-tailed length. The generated corpus is a
   copy task: a key of 3..8 letters drawn from a fixed Markov chain, '=', then the key repeated
   until the document ends; its lengths are long-tailed too. Once a model has seen the key, the
   rest of the document is predictable, so the loss can fall well below the letters' entropy.
   Include after gpt.h (it uses its generator). Everything is static inline. */
#ifndef PP_EXAMPLE_GPT_DATA_H
#define PP_EXAMPLE_GPT_DATA_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GPT_DATA_VOCAB 256

typedef struct gpt_corpus {
    unsigned char* text;    /* (n_bytes) every byte a token */
    size_t n_bytes;
    int64_t* doc_start;     /* (n_docs) offset of each document in text */
    int32_t* doc_len;       /* (n_docs) each 2 .. max_len */
    int n_docs, cap_docs;
    int max_len;
    char source[160];       /* where the text came from, for printing */
} gpt_corpus;

static inline void gpt_corpus_free(gpt_corpus* c) {
    free(c->text);
    free(c->doc_start);
    free(c->doc_len);
    memset(c, 0, sizeof *c);
}

/* A long-tailed length: Pareto with minimum lo and shape 1.2, capped at hi. */
static inline int gpt_data_long_tail(uint64_t* rng, int lo, int hi) {
    double u = 1.0 - (double)gpt_rng_uniform(rng); /* (0, 1] */
    double L = (double)lo * pow(u, -1.0 / 1.2);
    return L >= (double)hi ? hi : (int)L;
}

static inline int gpt_corpus_add_doc(gpt_corpus* c, int64_t start, int32_t len) {
    if (len < 2) return 0; /* a one-token document has no target */
    if (c->n_docs == c->cap_docs) {
        int cap = c->cap_docs ? 2 * c->cap_docs : 256;
        int64_t* s = (int64_t*)realloc(c->doc_start, sizeof(int64_t) * (size_t)cap);
        int32_t* l;
        if (!s) return -1;
        c->doc_start = s;
        l = (int32_t*)realloc(c->doc_len, sizeof(int32_t) * (size_t)cap);
        if (!l) return -1;
        c->doc_len = l;
        c->cap_docs = cap;
    }
    c->doc_start[c->n_docs] = start;
    c->doc_len[c->n_docs] = len;
    c->n_docs++;
    return 0;
}

/* Splits c->text into documents at blank lines; long paragraphs into long-tailed pieces. */
static inline int gpt_corpus_split(gpt_corpus* c, uint64_t seed) {
    const unsigned char* t = c->text;
    size_t i = 0, n = c->n_bytes;
    while (i < n) {
        size_t a, b;
        while (i < n && (t[i] == '\n' || t[i] == '\r')) i++; /* blank lines between paragraphs */
        a = i;
        /* the paragraph ends after a newline that a blank line follows, or at the end */
        while (i < n && !(t[i] == '\n' && i + 1 < n && (t[i + 1] == '\n' || (t[i + 1] == '\r' && i + 2 < n && t[i + 2] == '\n'))))
            i++;
        b = i < n ? i + 1 : n; /* keep the paragraph's final newline */
        while (a < b) {
            int len;
            if (b - a <= (size_t)c->max_len) {
                len = (int)(b - a); /* the (rest of the) paragraph fits */
            } else {
                len = gpt_data_long_tail(&seed, 16, c->max_len);
            }
            if (gpt_corpus_add_doc(c, (int64_t)a, len)) return -1;
            a += (size_t)len;
        }
        i = b;
    }
    return c->n_docs > 0 ? 0 : -1;
}

/* Copies n bytes of text and splits them. 0, or -1 (no memory, or no document of >= 2 bytes). */
static inline int gpt_corpus_from_text(gpt_corpus* c, const void* text, size_t n, int max_len, uint64_t seed) {
    memset(c, 0, sizeof *c);
    c->max_len = max_len;
    if (max_len < 2 || n == 0 || !(c->text = (unsigned char*)malloc(n))) return -1;
    memcpy(c->text, text, n);
    c->n_bytes = n;
    snprintf(c->source, sizeof c->source, "%zu bytes of text", n);
    if (gpt_corpus_split(c, seed)) {
        gpt_corpus_free(c);
        return -1;
    }
    return 0;
}

/* Reads a text file and splits it. 0, or -1 (errno tells why; or no document of >= 2 bytes). */
static inline int gpt_corpus_load(gpt_corpus* c, const char* path, int max_len, uint64_t seed) {
    FILE* f;
    long sz;
    void* buf;
    int rc;
    memset(c, 0, sizeof *c);
    if (!(f = fopen(path, "rb"))) return -1;
    if (fseek(f, 0, SEEK_END) != 0 || (sz = ftell(f)) <= 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return -1;
    }
    buf = malloc((size_t)sz);
    if (!buf || fread(buf, 1, (size_t)sz, f) != (size_t)sz) {
        fclose(f);
        free(buf);
        return -1;
    }
    fclose(f);
    rc = gpt_corpus_from_text(c, buf, (size_t)sz, max_len, seed);
    free(buf);
    if (rc == 0) snprintf(c->source, sizeof c->source, "%s", path);
    return rc;
}

/* The built-in copy task: n_docs documents "key=keykeyke..." (see the top of the file). */
static inline int gpt_corpus_generate(gpt_corpus* c, int n_docs, int max_len, uint64_t seed) {
    unsigned char next[26][4];  /* the Markov chain: each letter has 4 possible successors */
    size_t off = 0;
    int d, a, k;
    memset(c, 0, sizeof *c);
    c->max_len = max_len;
    if (max_len < 12 || n_docs < 1) return -1;
    c->text = (unsigned char*)malloc((size_t)n_docs * (size_t)max_len);
    if (!c->text) return -1;
    for (a = 0; a < 26; a++)
        for (k = 0; k < 4; k++) next[a][k] = (unsigned char)(gpt_rng_next(&seed) % 26);
    for (d = 0; d < n_docs; d++) {
        unsigned char* t = c->text + off;
        int keylen = 3 + (int)(gpt_rng_next(&seed) % 6), len = gpt_data_long_tail(&seed, 8, max_len), i;
        if (len < keylen + 2) len = keylen + 2;
        t[0] = (unsigned char)(gpt_rng_next(&seed) % 26);
        for (i = 1; i < keylen; i++) t[i] = next[t[i - 1]][gpt_rng_next(&seed) % 4];
        for (i = 0; i < keylen; i++) t[i] = (unsigned char)('a' + t[i]);
        t[keylen] = '=';
        for (i = keylen + 1; i < len; i++) t[i] = t[(i - keylen - 1) % keylen];
        if (gpt_corpus_add_doc(c, (int64_t)off, len)) {
            gpt_corpus_free(c);
            return -1;
        }
        off += (size_t)len;
    }
    c->n_bytes = off;
    snprintf(c->source, sizeof c->source, "generated copy task (%d documents)", n_docs);
    return 0;
}

/* Document d's tokens (its bytes) and next-token targets (-1 on its last token) into tokens and
   targets; returns its length. */
static inline int gpt_pack_doc(const gpt_corpus* c, int d, int32_t* tokens, int32_t* targets) {
    const unsigned char* t = c->text + c->doc_start[d];
    const int L = c->doc_len[d];
    int i;
    for (i = 0; i < L; i++) {
        tokens[i] = t[i];
        targets[i] = i + 1 < L ? t[i + 1] : -1;
    }
    return L;
}

/* Packs n_seqs documents drawn at random (with replacement, from *rng) back to back:
   tokens (T) int32 byte values; targets (T) the next token inside the same document, -1 on each
   document's last token; cu (n_seqs + 1) document offsets. Buffers hold n_seqs * max_len.
   Returns T, the total tokens: nothing is padded. */
static inline int gpt_pack(const gpt_corpus* c, uint64_t* rng, int n_seqs, int32_t* tokens, int32_t* targets,
                           int32_t* cu) {
    int s, T = 0;
    cu[0] = 0;
    for (s = 0; s < n_seqs; s++) {
        int d = (int)(gpt_rng_next(rng) % (uint64_t)c->n_docs);
        T += gpt_pack_doc(c, d, tokens + T, targets + T);
        cu[s + 1] = T;
    }
    return T;
}

/* Packs documents first .. first + n_seqs - 1 in order (a fixed batch, e.g. a validation
   set's): the same tokens, targets and cu as gpt_pack. Returns T. */
static inline int gpt_pack_docs(const gpt_corpus* c, int first, int n_seqs, int32_t* tokens, int32_t* targets,
                                int32_t* cu) {
    int s, T = 0;
    cu[0] = 0;
    for (s = 0; s < n_seqs; s++) {
        T += gpt_pack_doc(c, first + s, tokens + T, targets + T);
        cu[s + 1] = T;
    }
    return T;
}

/* Per-row tables of a packed batch (cu: n_seqs + 1 offsets), for layers that look a row's
   sequence up by its row (examples/gpt_cuda.h): pos, the row's position inside its sequence;
   sst and sen, the sequence's first row and one past its last. */
static inline void gpt_row_tables(const int32_t* cu, int n_seqs, int32_t* pos, int32_t* sst, int32_t* sen) {
    int s, r;
    for (s = 0; s < n_seqs; s++)
        for (r = cu[s]; r < cu[s + 1]; r++) {
            pos[r] = r - cu[s];
            sst[r] = cu[s];
            sen[r] = cu[s + 1];
        }
}

/* A held-out split: documents every-1, 2*every-1, ... (every 10th with every = 10, in the
   text's order, so the same documents whatever the seed of the batches) move from c into
   held, which gets a copy of their bytes; c keeps the others, and gpt_pack never draws the
   moved ones. 0 (held is empty where c has fewer than every documents), or -1 (every < 2, or
   no memory; c is then unchanged). */
static inline int gpt_corpus_hold_out(gpt_corpus* c, int every, gpt_corpus* held) {
    size_t bytes = 0;
    int d, kept = 0, n = every >= 2 ? c->n_docs / every : 0;
    memset(held, 0, sizeof *held);
    held->max_len = c->max_len;
    if (n == 0) return every >= 2 ? 0 : -1;
    for (d = every - 1; d < c->n_docs; d += every) bytes += (size_t)c->doc_len[d];
    held->text = (unsigned char*)malloc(bytes);
    held->doc_start = (int64_t*)malloc(sizeof(int64_t) * (size_t)n);
    held->doc_len = (int32_t*)malloc(sizeof(int32_t) * (size_t)n);
    if (!held->text || !held->doc_start || !held->doc_len) {
        gpt_corpus_free(held);
        return -1;
    }
    held->cap_docs = n;
    for (d = 0; d < c->n_docs; d++) {
        if (d % every == every - 1) {
            memcpy(held->text + held->n_bytes, c->text + c->doc_start[d], (size_t)c->doc_len[d]);
            held->doc_start[held->n_docs] = (int64_t)held->n_bytes;
            held->doc_len[held->n_docs++] = c->doc_len[d];
            held->n_bytes += (size_t)c->doc_len[d];
        } else {
            c->doc_start[kept] = c->doc_start[d];
            c->doc_len[kept++] = c->doc_len[d];
        }
    }
    c->n_docs = kept;
    snprintf(held->source, sizeof held->source, "every %dth document of %.120s", every, c->source);
    return 0;
}

/* Mean document length, and E[L^2] / E[L]: the length a token's attention sees on average
   (a sample sequence of this length weighs attention against the matmuls as the corpus does). */
static inline void gpt_corpus_lengths(const gpt_corpus* c, double* mean, double* attn_len) {
    double s1 = 0, s2 = 0;
    int d;
    for (d = 0; d < c->n_docs; d++) {
        s1 += c->doc_len[d];
        s2 += (double)c->doc_len[d] * c->doc_len[d];
    }
    if (mean) *mean = c->n_docs ? s1 / c->n_docs : 0;
    if (attn_len) *attn_len = s1 > 0 ? s2 / s1 : 0;
}

#endif
