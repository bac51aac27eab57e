/* examples/gpt_cpu.c - train a tiny GPT through a pipeline of CPU threads, on packed
   variable-length sequences (no padding).

   What to copy: a batch of packed sequences (cu_seqlens, pp_batch.loss = PP_LOSS_MEAN_ROWS so
   that micro-batches weigh by tokens), a model whose depth is chosen at run time
   (gpt_model_desc_depth: PP_MODEL counts), a partition by describe()'s cost on a sample, the
   step's Chrome trace (pp_pipeline_timeline), and a check of every layer's gradient against
   pp_sequential_step. Start from mlp_cpu.c if you have not; gpt_mpi.c is this program with one
   process per rank.

   Each step draws --seqs-per-step documents, packs them back to back (token ids, next-token
   targets, cu_seqlens) and hands the batch to the pipeline, which splits it into m micro-batches
   of whole sequences; every layer sees its micro-batch's rebased cu_seqlens in io->mb.

     build/gpt_cpu [--schedule gpipe|1f1b|interleaved|zb-h1|zb-v] [-p 4] [-v 2] [-m 8] [--steps 60]
                   [--text FILE | --generated] [--seqs-per-step 32] [--max-len 128]
                   [--dim 64] [--heads 4] [--layers 4] [--lr 3e-3] [--optim adam|sgd]
                   [--split seqs|tokens|cost] [--trace FILE.json] [--check]

   --layers counts transformer blocks (default 4, or p*v - 2 when the stages need more layers).
   The text is FILE, else README.md in the current directory if there is one, else a generated
   copy task (examples/gpt_data.h). Per step it prints the loss, tokens/s, the tokens that
   packing saved against padding every micro-batch to its longest sequence, and how evenly the
   split spread tokens over micro-batches (max / mean; --split seqs, equal sequence counts, shows
   how uneven a count-based split of long-tailed lengths is; the default balances tokens).
   --check runs pp_sequential_step on the first batch and requires the pipelined loss and
   every layer's gradient to equal it bit for bit (exit 1 if not). */
#define PIPELINE_IMPLEMENTATION
#include "../pipeline.h"
#include "gpt.h"
#include "gpt_data.h"
#include "gpt_train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* --check: layers whose gradient differs from the sequential reference's. */
static int check_layers(const pp_model* m, const gpt_model* w, const gpt_config* gc, const float* wbuf, const float* g,
                        const float* gref) {
    int l, bad = 0;
    for (l = 0; l < m->n_layers; l++) {
        size_t n, off = (size_t)(gpt_layer_params(w, gc, l, &n) - wbuf);
        if (memcmp(g + off, gref + off, n * sizeof(float)) != 0) {
            fprintf(stderr, "check: layer %d (%s): gradient differs from the reference\n", l, pp_model_layer_name(m, l));
            bad++;
        }
    }
    return bad;
}

int main(int argc, char** argv) {
    gpt_opts c;
    gpt_config gc;
    gpt_corpus corpus;
    gpt_model w, g, gref;
    gpt_step* steps = NULL;
    float *wbuf = NULL, *gbuf = NULL, *grefbuf = NULL, *m1 = NULL, *m2 = NULL, *loss = NULL, ref_loss = 0;
    double mean_len = 0, attn_len = 0, t0, wall;
    size_t n_params;
    int step, rc = 1, bad = 0;
    pp_pipeline_desc d = {0};
    pp_pipeline* pl = NULL;
    pp_tensor sample = {0};
    pp_step_stats st;
    pp_error err;
    if (gpt_opts_parse(argc, argv, &c) || gpt_opts_check(&c)) {
        gpt_opts_usage("gpt_cpu");
        return 2;
    }
    if (gpt_opts_corpus(&c, &corpus)) return 2;
    gpt_corpus_lengths(&corpus, &mean_len, &attn_len);
    gc.vocab = GPT_DATA_VOCAB;
    gc.max_T = c.max_len;
    gc.C = c.dim;
    gc.n_head = c.heads;
    gc.n_block = c.layers;
    n_params = gpt_param_count(&gc);
    wbuf = gpt_init(&w, &g, &gc, 1234, &gbuf);
    m1 = (float*)calloc(n_params, sizeof(float));
    m2 = (float*)calloc(n_params, sizeof(float));
    loss = (float*)calloc((size_t)c.steps, sizeof(float));
    if (!wbuf || !m1 || !m2 || !loss || !(steps = gpt_steps_make(&c, &corpus))) {
        fprintf(stderr, "out of memory\n");
        goto cleanup;
    }

    /* the pipeline; stages partitioned by describe()'s cost on one sequence of the corpus'
       attention length */
    sample.rows = attn_len > 1 ? (int64_t)(attn_len + 0.5) : 1;
    sample.cols = 1;
    sample.dtype = PP_I32;
    d.model = gpt_model_desc_depth(c.layers);
    d.weights = &w;
    d.grads = &g;
    d.schedule = c.kind;
    d.p = c.p;
    d.v = c.v;
    d.m = c.m;
    d.partition.policy = PP_PARTITION_COST;
    d.partition.sample = &sample;
    d.stage.record_timeline = c.trace != NULL;
    if (pp_pipeline_create(&d, &pl, &err) != PP_OK) {
        fprintf(stderr, "%s\n", err.msg);
        goto cleanup;
    }
    printf("gpt: %d layers (embed, %d blocks, head), C=%d, %d heads, vocab %d, %zu parameters\n", d.model.n_layers,
           c.layers, c.dim, c.heads, gc.vocab, n_params);
    printf("text: %s, %d documents of mean length %.1f (max %d)\n", corpus.source, corpus.n_docs, mean_len, c.max_len);
    printf("%s p=%d v=%d m=%d, %d sequences per step split by %s, %s lr %g\n", pp_schedule_name(c.kind), c.p, c.v, c.m,
           c.seqs, c.split == PP_SPLIT_SEQS ? "count" : c.split == PP_SPLIT_TOKENS ? "tokens" : "cost",
           c.sgd ? "sgd+momentum" : "adam", (double)c.lr);
    pp_partition_print(stdout, &d.model, pp_pipeline_partition(pl), pp_pipeline_schedule(pl)->n_stages, NULL);

    t0 = gpt_now();
    for (step = 0; step < c.steps; step++) {
        pp_batch b = gpt_step_batch(&c, &steps[step]);
        if (pp_pipeline_step(pl, &b, &st) != PP_OK) {
            fprintf(stderr, "step %d: %s\n", step, pp_pipeline_error(pl));
            goto cleanup;
        }
        if (c.check && step == 0) {
            /* the sequential reference on the same batch, before any update */
            if (!(grefbuf = (float*)calloc(n_params, sizeof(float)))) goto cleanup;
            gpt_bind(&gref, &gc, grefbuf);
            if (pp_sequential_step(&d.model, &w, &gref, &b, &ref_loss, &err) != PP_OK) {
                fprintf(stderr, "reference: %s\n", err.msg);
                goto cleanup;
            }
            bad = check_layers(&d.model, &w, &gc, wbuf, gbuf, grefbuf);
        }
        gpt_optimize(&c, wbuf, gbuf, m1, m2, n_params, step); /* zeroes the gradients */
        loss[step] = st.loss;
        gpt_step_print(step, st.loss, &steps[step], st.t_total);
    }
    wall = gpt_now() - t0;
    gpt_report(&c, steps, loss, wall);
    if (c.trace) {
        FILE* f = fopen(c.trace, "w");
        size_t n = 0;
        const pp_event* ev = pp_pipeline_timeline(pl, &n);
        if (f) {
            pp_timeline_chrome(f, ev, n, 1e6);
            fclose(f);
            printf("timeline of the last step: %s, %zu actions (open in ui.perfetto.dev)\n", c.trace, n);
        }
    }
    rc = 0;
    if (c.check) {
        int same = memcmp(&ref_loss, &loss[0], sizeof(float)) == 0;
        printf("check: step 0 loss  sequential %.9g  pipelined %.9g  %s; gradients: %d layers differ\n", (double)ref_loss,
               (double)loss[0], same ? "bit-identical" : "DIFFERENT", bad);
        if (!same || bad) rc = 1;
    }
cleanup:
    pp_pipeline_destroy(pl);
    gpt_steps_free(steps, c.steps);
    free(wbuf);
    free(gbuf);
    free(grefbuf);
    free(m1);
    free(m2);
    free(loss);
    gpt_corpus_free(&corpus);
    return rc;
}
