/* pipeline.h - pipeline-parallel training for C trainers.   v0.1.0   public domain / MIT (see end)

   Do this in exactly one C or C++ file, before any other include:

       #define PIPELINE_IMPLEMENTATION
       #include "pipeline.h"

   Every other file includes "pipeline.h" without the define. Link with -lpthread (-pthread).

   WHAT IT DOES
   You declare your model as a typed list of layers, write plain forward/backward functions over
   flat buffers, and pick a schedule (GPipe, 1F1B, interleaved 1F1B). The library splits the layers
   into stages, generates each rank's ordered action list {op, micro-batch, chunk}, proves it free
   of deadlock with a simulator, and walks it: receiving activations, calling your functions,
   stashing what backward needs, sending results, accumulating gradients over micro-batches.
   Tensors move through a transport: threads in one process (here), CUDA streams
   (pipeline_cuda.h), NCCL processes (pipeline_nccl.h).

   USAGE (20 lines; examples/mlp_cpu.c is the full version)

       // X(layer name, parameter struct, forward, backward, describe, count)
       #define MLP_LAYERS(X)                                          \
           X(dense, dense_params, dense_fwd, dense_bwd, dense_desc, 7) \
           X(loss,  loss_params,  loss_fwd,  loss_bwd,  loss_desc,  1)
       PP_MODEL(mlp, MLP_LAYERS)      // mlp_model struct, mlp_model_desc(), mlp_N_LAYERS

       int dense_fwd(const dense_params* w, pp_layer_io* io);           // io->in[0] -> io->out[0]
       int dense_bwd(const dense_params* w, dense_params* g, pp_layer_io* io); // g += ..., d_in = ...
       void dense_desc(const dense_params* w, const pp_microbatch* mb,
                       const pp_tensor* in, int n_in, pp_layer_desc* d);   // output shapes

       pp_model model = mlp_model_desc();
       int first[4 + 1];                       // stage s owns layers [first[s], first[s+1])
       pp_partition_uniform(model.n_layers, 4, first, &err);
       pp_action acts[4 * 2 * 8]; pp_schedule sched;
       pp_schedule_make(PP_SCHED_1F1B, 4, 1, 8, acts, 4 * 2 * 8, &sched, &err);
       // per rank (a thread here, a process with MPI/NCCL):
       pp_stage_desc d = {0};
       d.model = model; d.weights = &w; d.grads = &g; d.schedule = &sched;
       d.partition = first; d.rank = rank; d.transport = pp_threads_transport(world, rank);
       pp_stage* st; pp_stage_create(&d, &st, &err);
       pp_stage_step(st, &batch, &stats);   // stats.loss on the rank owning the last stage

   LAYERS
   A layer is a forward, a backward and a describe function, all typed on the layer's own
   parameter struct P (a wrong signature is a compile error: PP_MODEL calls them directly).
   - describe(w, mb, in, n_in, d): from the micro-batch and the input tensor shapes (data NULL),
     fill d->n_out and d->out[i] (rows, cols, dtype), d->saved_bytes (private scratch kept from
     forward to backward), d->cost (relative time, for partitioning) and d->n_params. It must not
     read weight data: every rank describes every layer to learn the shapes it will receive.
   - forward(w, io): read io->in[], write io->out[] (and io->saved). The last layer is the loss:
     it has no outputs, reads its targets from io->mb->targets and sets io->loss.
   - backward(w, g, io): read io->in[], io->out[], io->d_out[] and io->saved; ADD parameter
     gradients into g (+=, accumulation across micro-batches); write or add the input gradient
     into io->d_in[] (zeroed before the call; data is NULL where no gradient is wanted: integer
     tensors, and the model input). The loss layer scales its gradient by io->mb->loss_scale.
   One model implementation serves the sequential reference (pp_sequential_step) and every
   pipelined run: results are bit-identical when the accumulation order is the same, which it is
   for every built-in schedule (each stage runs backward in ascending micro-batch order).

   CONFIGURATION (define before including, in the implementation file)
       PP_MALLOC(sz) / PP_FREE(p)   allocator (default malloc/free); define both or neither
       PP_ASSERT(c)                 internal invariants only, never user errors (default assert)
       PP_MAX_TENSORS               tensors crossing one layer boundary (default 4)
       PP_MAX_RANKS                 ranks in one pipeline (default 256)
       PP_DEFAULT_TIMEOUT_S         deadline of every wait when the desc says 0 (default 300)

   MEMORY
   Schedule generation writes into the caller's array (pp_schedule_size tells how large). The
   simulator and partitioner take scratch from PP_MALLOC and free it before returning. A stage
   allocates at create time and keeps a pool of stash blocks that grows to the schedule's peak
   live activations and is reused, so the steady state does not allocate.

   ERRORS
   Every function that can fail returns pp_result (PP_OK == 0). Pure functions take an optional
   pp_error* that receives a message; a stage keeps its last message (pp_stage_error). Bad input
   never crashes, hangs or corrupts; every wait has a deadline and names who waited for whom.
   Library code never calls exit() or abort().

   TRANSPORTS
   threads (this header)      each rank a thread in one process: pp_threads_*
   cuda    (pipeline_cuda.h)  stages as CUDA streams, one or several GPUs
   nccl    (pipeline_nccl.h)  one process per GPU

   SECTIONS  (search for ">>name")
   >>config >>result >>tensor >>model >>partition >>schedule >>sim >>trace >>transport
   >>threads >>batch >>stage >>impl

   REVISIONS
   0.1.0  first release: layer list, partitioner, GPipe/1F1B/interleaved, simulator, pictures,
          executor, threads transport.
*/
#ifndef PIPELINE_H
#define PIPELINE_H

#define PP_VERSION_MAJOR 0
#define PP_VERSION_MINOR 1
#define PP_VERSION_PATCH 0
#define PP_VERSION (PP_VERSION_MAJOR * 10000 + PP_VERSION_MINOR * 100 + PP_VERSION_PATCH)

#if defined(PIPELINE_IMPLEMENTATION) && !defined(_POSIX_C_SOURCE) && !defined(__cplusplus)
#define _POSIX_C_SOURCE 200809L /* clock_gettime, pthreads under -std=c99 */
#endif

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* >>config ------------------------------------------------------------------------------------ */
#ifndef PP_MAX_TENSORS
#define PP_MAX_TENSORS 4
#endif
#ifndef PP_MAX_RANKS
#define PP_MAX_RANKS 256
#endif
#ifndef PP_DEFAULT_TIMEOUT_S
#define PP_DEFAULT_TIMEOUT_S 300.0
#endif

/* >>result ------------------------------------------------------------------------------------ */
#define PP_RESULT_LIST(X)                                                       \
    X(PP_OK, "ok")                                                              \
    X(PP_ERR_INVALID, "invalid argument")                                       \
    X(PP_ERR_NOMEM, "out of memory")                                            \
    X(PP_ERR_SIZE, "size mismatch")                                             \
    X(PP_ERR_SCHEDULE, "invalid schedule")                                      \
    X(PP_ERR_DEADLOCK, "schedule deadlocks")                                    \
    X(PP_ERR_TIMEOUT, "wait timed out")                                         \
    X(PP_ERR_TRANSPORT, "transport error")                                      \
    X(PP_ERR_LAYER, "layer callback failed")                                    \
    X(PP_ERR_ABORTED, "aborted by another rank")                                \
    X(PP_ERR_UNSUPPORTED, "unsupported")

#define _PP_RESULT_ENUM(name, str) name,
typedef enum pp_result { PP_RESULT_LIST(_PP_RESULT_ENUM) PP_RESULT_COUNT } pp_result;
#undef _PP_RESULT_ENUM

/* A message for a failed call. Pass NULL where you do not want it. */
typedef struct pp_error {
    pp_result code;
    char msg[512];
} pp_error;

const char* pp_result_str(pp_result r);

/* >>tensor ------------------------------------------------------------------------------------ */
typedef enum pp_dtype {
    PP_F32 = 0, PP_F64, PP_F16, PP_BF16, PP_I32, PP_I64, PP_U8, PP_DTYPE_COUNT
} pp_dtype;

/* A 2-D tensor: rows x cols, row-major, contiguous. Packed variable-length activations are
   [total_tokens, hidden]; a padded batch flattens (B, T, C) to [B*T, C]. */
typedef struct pp_tensor {
    void* data;
    int64_t rows;
    int64_t cols;
    pp_dtype dtype;
} pp_tensor;

size_t pp_dtype_size(pp_dtype t);      /* 0 for an unknown dtype */
int pp_dtype_is_float(pp_dtype t);     /* float tensors carry gradients; integer ones do not */
const char* pp_dtype_name(pp_dtype t);
size_t pp_tensor_bytes(const pp_tensor* t);

/* >>model ------------------------------------------------------------------------------------- */
/* One micro-batch as the layers see it. */
typedef struct pp_microbatch {
    int index;                  /* 0 .. count-1 */
    int count;                  /* micro-batches in this step (m) */
    int64_t row0;               /* first row of this micro-batch in the global batch */
    int64_t rows;               /* rows (tokens when packed) */
    const int32_t* cu_seqlens;  /* packed layout: n_seqs+1 offsets rebased to 0, or NULL */
    int n_seqs;
    int max_seqlen;
    const void* targets;        /* this micro-batch's targets (rank of the last stage) */
    float loss_scale;           /* d(step loss)/d(micro-batch loss): 1/m by default */
} pp_microbatch;

/* What one layer call sees. Forward: in -> out. Backward: also d_out -> d_in. */
typedef struct pp_layer_io {
    const pp_microbatch* mb;
    int layer;                          /* global layer index */
    int n_in, n_out;
    pp_tensor in[PP_MAX_TENSORS];
    pp_tensor out[PP_MAX_TENSORS];
    pp_tensor d_in[PP_MAX_TENSORS];     /* backward: zeroed; data NULL where no gradient */
    pp_tensor d_out[PP_MAX_TENSORS];    /* backward: gradient of out (NULL data for int) */
    void* saved;                        /* saved_bytes of scratch kept from forward to backward */
    size_t saved_bytes;
    float loss;                         /* loss layer forward: this micro-batch's loss */
} pp_layer_io;

/* What describe() returns for one layer on one micro-batch. */
typedef struct pp_layer_desc {
    int n_out;
    pp_tensor out[PP_MAX_TENSORS];      /* shapes and dtypes; data ignored */
    size_t saved_bytes;
    double cost;                        /* relative forward+backward time (0 counts as 1) */
    int64_t n_params;
} pp_layer_desc;

/* A model as the library sees it: PP_MODEL fills one for you (NAME_model_desc()). */
typedef struct pp_model {
    const char* name;
    int n_layers;
    int (*forward)(const void* weights, int layer, pp_layer_io* io);
    int (*backward)(const void* weights, void* grads, int layer, pp_layer_io* io);
    void (*describe)(const void* weights, int layer, const pp_microbatch* mb,
                     const pp_tensor* in, int n_in, pp_layer_desc* d);
    const char* (*layer_name)(int layer);
} pp_model;

/* PP_MODEL(name, LIST): LIST is an X-macro whose entries are
       X(layer, P, forward, backward, describe, count)
   It generates, all static inline:
       struct name_model { P layer[count]; ... };   one typed field per layer kind
       enum { name_N_LAYERS };                        total layer count
       name_forward / name_backward / name_describe   dispatch on a global layer index
       name_layer_name(l), name_model_desc()          names and the pp_model for the library
   Each callback is called with its own P, so the compiler checks every signature. */
#define _PP_MODEL_FIELD(lname, P, fwd, bwd, desc, count) P lname[count];
#define _PP_MODEL_COUNT(lname, P, fwd, bwd, desc, count) + (count)
#define _PP_MODEL_ENUM(lname, P, fwd, bwd, desc, count) \
    _pp_first_##lname, _pp_last_##lname = _pp_first_##lname + (count) - 1,
#define _PP_MODEL_IN(lname) (l >= _pp_first_##lname && l <= _pp_last_##lname)
#define _PP_MODEL_FWD(lname, P, fwd, bwd, desc, count) \
    if (_PP_MODEL_IN(lname)) return fwd(&w->lname[l - _pp_first_##lname], io);
#define _PP_MODEL_BWD(lname, P, fwd, bwd, desc, count) \
    if (_PP_MODEL_IN(lname)) return bwd(&w->lname[l - _pp_first_##lname], &g->lname[l - _pp_first_##lname], io);
#define _PP_MODEL_DESC(lname, P, fwd, bwd, desc, count) \
    if (_PP_MODEL_IN(lname)) { desc(&w->lname[l - _pp_first_##lname], mb, in, n_in, d); return; }
#define _PP_MODEL_NAME(lname, P, fwd, bwd, desc, count) \
    if (_PP_MODEL_IN(lname)) return #lname;

#define PP_MODEL(mname, LIST)                                                                    \
    typedef struct mname##_model { LIST(_PP_MODEL_FIELD) } mname##_model;                         \
    enum { mname##_N_LAYERS = 0 LIST(_PP_MODEL_COUNT) };                                         \
    static inline int mname##_forward(const void* w_, int l, pp_layer_io* io) {                  \
        enum { LIST(_PP_MODEL_ENUM) _pp_end };                                                  \
        const mname##_model* w = (const mname##_model*)w_;                                        \
        LIST(_PP_MODEL_FWD)                                                                     \
        return -1;                                                                              \
    }                                                                                           \
    static inline int mname##_backward(const void* w_, void* g_, int l, pp_layer_io* io) {       \
        enum { LIST(_PP_MODEL_ENUM) _pp_end };                                                  \
        const mname##_model* w = (const mname##_model*)w_;                                        \
        mname##_model* g = (mname##_model*)g_;                                                    \
        LIST(_PP_MODEL_BWD)                                                                     \
        return -1;                                                                              \
    }                                                                                           \
    static inline void mname##_describe(const void* w_, int l, const pp_microbatch* mb,          \
                                       const pp_tensor* in, int n_in, pp_layer_desc* d) {       \
        enum { LIST(_PP_MODEL_ENUM) _pp_end };                                                  \
        const mname##_model* w = (const mname##_model*)w_;                                        \
        LIST(_PP_MODEL_DESC)                                                                    \
    }                                                                                           \
    static inline const char* mname##_layer_name(int l) {                                        \
        enum { LIST(_PP_MODEL_ENUM) _pp_end };                                                  \
        LIST(_PP_MODEL_NAME)                                                                    \
        return "?";                                                                             \
    }                                                                                           \
    static inline pp_model mname##_model_desc(void) {                                            \
        pp_model m;                                                                             \
        m.name = #mname;                                                                         \
        m.n_layers = mname##_N_LAYERS;                                                           \
        m.forward = mname##_forward;                                                             \
        m.backward = mname##_backward;                                                           \
        m.describe = mname##_describe;                                                           \
        m.layer_name = mname##_layer_name;                                                       \
        return m;                                                                               \
    }

/* Checks a pp_model (non-NULL callbacks, n_layers > 0). */
pp_result pp_model_check(const pp_model* m, pp_error* err);

/* Per-layer cost and parameter count from describe(), for a sample micro-batch of `rows` rows
   whose input is `input` (data may be NULL). Either output array may be NULL. */
pp_result pp_model_layer_costs(const pp_model* m, const void* weights, const pp_tensor* input,
                               double* cost, int64_t* n_params, pp_error* err);

/* >>partition --------------------------------------------------------------------------------- */
/* A partition of L layers into S stages is an array first[S+1]: stage s owns layers
   [first[s], first[s+1]), first[0] = 0, first[S] = L, every stage at least one layer.
   With p ranks and v chunks per rank, S = p*v; the schedule maps stages to ranks. */
typedef enum pp_partition_policy {
    PP_PARTITION_UNIFORM = 0,   /* equal layer counts (the first L%S stages get one more) */
    PP_PARTITION_COST,          /* minimise the most expensive stage, by describe()'s cost */
    PP_PARTITION_PARAMS,        /* minimise the largest stage, by parameter count */
    PP_PARTITION_EXPLICIT       /* the caller's boundaries, checked */
} pp_partition_policy;

pp_result pp_partition_uniform(int n_layers, int n_stages, int* first, pp_error* err);
/* Contiguous split minimising the maximum stage weight (exact, O(S*L^2) worst case). */
pp_result pp_partition_balanced(const double* weight, int n_layers, int n_stages, int* first,
                                pp_error* err);
pp_result pp_partition_check(const int* first, int n_layers, int n_stages, pp_error* err);
/* max stage weight / mean stage weight (1.0 is perfect); weight NULL counts layers. */
double pp_partition_imbalance(const double* weight, int n_layers, const int* first, int n_stages);

typedef struct pp_partition_desc {
    pp_partition_policy policy;
    int n_stages;
    const int* explicit_first;  /* PP_PARTITION_EXPLICIT: n_stages+1 entries */
    const pp_tensor* sample;    /* COST/PARAMS: sample input of one micro-batch (shape only) */
} pp_partition_desc;

/* Partition a model by a policy; *imbalance (may be NULL) is reported on the policy's weight. */
pp_result pp_partition_model(const pp_model* m, const void* weights, const pp_partition_desc* d,
                             int* first, double* imbalance, pp_error* err);

/* Print the partition, one line per stage: layers, names, weight. */
void pp_partition_print(FILE* f, const pp_model* m, const int* first, int n_stages,
                        const double* weight);

/* >>schedule ---------------------------------------------------------------------------------- */
typedef enum pp_schedule_kind {
    PP_SCHED_GPIPE = 0,         /* all forwards, then all backwards */
    PP_SCHED_1F1B,              /* warm-up forwards, then one forward one backward */
    PP_SCHED_INTERLEAVED,       /* 1F1B over v chunks per rank, stage s on rank s % p */
    PP_SCHED_KIND_COUNT
} pp_schedule_kind;

typedef enum pp_op { PP_OP_F = 0, PP_OP_B = 1, PP_OP_W = 2 } pp_op;

/* One step of one rank's list. The sends and receives it implies are spelled out: an F
   receives the stage's input from recv_rank (if >= 0) and sends its output to send_rank (if
   >= 0); a B receives the output gradient from send_rank and sends the input gradient to
   recv_rank. Both are -1 at the ends of the pipeline. */
typedef struct pp_action {
    int8_t op;                  /* pp_op */
    int8_t chunk;               /* model chunk on this rank, 0 .. v-1 */
    int16_t stage;              /* global stage index, 0 .. p*v-1 */
    int32_t mb;                 /* micro-batch */
    int16_t prev_rank;          /* rank of stage-1, or -1 */
    int16_t next_rank;          /* rank of stage+1, or -1 */
} pp_action;

typedef struct pp_schedule {
    pp_schedule_kind kind;
    int p, v, m;
    int n_stages;               /* p*v */
    int per_rank;               /* actions per rank */
    pp_action* actions;         /* rank r's list is actions[r*per_rank .. (r+1)*per_rank) */
} pp_schedule;

const char* pp_schedule_name(pp_schedule_kind k);                 /* "gpipe", "1f1b", ... */
pp_result pp_schedule_kind_parse(const char* s, pp_schedule_kind* k);
/* Number of pp_action the caller must provide for (kind, p, v, m); 0 if invalid. */
size_t pp_schedule_size(pp_schedule_kind k, int p, int v, int m);
/* Generate every rank's list into out[cap]. GPipe and 1F1B need v == 1; interleaved v >= 2
   (any m >= 1). Fills *s, whose actions point into out. */
pp_result pp_schedule_make(pp_schedule_kind k, int p, int v, int m, pp_action* out, size_t cap,
                           pp_schedule* s, pp_error* err);
/* Rank and chunk of a global stage under this schedule's mapping. */
void pp_schedule_stage_rank(const pp_schedule* s, int stage, int* rank, int* chunk);
/* Global stage of (rank, chunk), or -1. */
int pp_schedule_stage(const pp_schedule* s, int rank, int chunk);
/* Rank r's list. */
const pp_action* pp_schedule_rank(const pp_schedule* s, int rank);

/* >>sim --------------------------------------------------------------------------------------- */
/* Cost model. Times in arbitrary units. f/b/w: per action of one chunk (0 counts as 1 for f,
   2 for b, 0 for w); per-stage arrays override them where non-NULL; comm is added to every
   transfer between two ranks. */
typedef struct pp_sim_cost {
    double f, b, w, comm;
    const double* f_stage;      /* n_stages entries or NULL */
    const double* b_stage;
} pp_sim_cost;

/* One executed (or simulated) action on a timeline. */
typedef struct pp_event {
    int rank;
    pp_action a;
    double start, end;          /* seconds for measured runs, cost units for simulation */
} pp_event;

typedef struct pp_sim_result {
    double makespan;
    double bubble;              /* 1 - busy / (p * makespan) */
    double busy[PP_MAX_RANKS];  /* compute time per rank */
    int peak_live[PP_MAX_RANKS];/* peak stashed activations (F done, B not yet) per rank */
    int deadlock;               /* 1 if the lists cannot all complete */
    char report[1024];          /* deadlock: who waits for whom; else empty */
} pp_sim_result;

/* Run all ranks' lists against the cost model. Also checks that every (micro-batch, stage)
   has exactly one F and one B, on the right rank, B after F. Returns PP_ERR_SCHEDULE for a
   malformed list, PP_ERR_DEADLOCK (with res->report) when ranks wait on each other forever.
   events (may be NULL) receives p*per_rank entries in rank-major order. */
pp_result pp_simulate(const pp_schedule* s, const pp_sim_cost* cost, pp_sim_result* res,
                      pp_event* events, pp_error* err);

/* >>trace ------------------------------------------------------------------------------------- */
/* ASCII timeline, one row per rank, `width` columns (0 = 100) spanning the makespan. */
void pp_timeline_ascii(FILE* f, const pp_event* ev, size_t n, int p, int width);
/* Chrome trace JSON (chrome://tracing, ui.perfetto.dev): one track per rank.
   time_scale converts event times to microseconds (1e6 for seconds, e.g. 1000 for sim units). */
void pp_timeline_chrome(FILE* f, const pp_event* ev, size_t n, double time_scale);

/* >>transport --------------------------------------------------------------------------------- */
/* An outstanding send or receive; its contents belong to the transport. */
typedef struct pp_request {
    void* impl;
    int64_t id;
    int done;
} pp_request;

/* Byte transport between ranks. A send's buffer must stay untouched until its wait returns.
   Messages are matched on (peer, tag), never on arrival order alone. */
typedef struct pp_transport {
    void* self;
    int rank, size;
    pp_result (*isend)(void* self, int peer, int tag, const void* buf, size_t bytes,
                       pp_request* req);
    pp_result (*irecv)(void* self, int peer, int tag, void* buf, size_t bytes, pp_request* req);
    pp_result (*wait)(void* self, pp_request* req, double timeout_s, pp_error* err);
    /* Sets *done without blocking. May be NULL: finished sends are then reaped at step end. */
    pp_result (*test)(void* self, pp_request* req, int* done);
    pp_result (*group_start)(void* self);                   /* may be NULL */
    pp_result (*group_end)(void* self);                     /* may be NULL */
    /* Sum count elements of buf over ranks[0..n) (this rank among them), in place. */
    pp_result (*allreduce_sum)(void* self, void* buf, size_t count, pp_dtype dtype,
                               const int* ranks, int n_ranks, double timeout_s, pp_error* err);
    /* Tell every rank to stop waiting: their waits return PP_ERR_ABORTED. May be NULL. */
    void (*abort)(void* self, pp_result why, const char* msg);
} pp_transport;

/* >>threads ----------------------------------------------------------------------------------- */
typedef struct pp_threads pp_threads;

pp_result pp_threads_create(int n_ranks, pp_threads** out, pp_error* err);
void pp_threads_destroy(pp_threads* t);
pp_transport pp_threads_transport(pp_threads* t, int rank);
/* Clears an abort so the world can be used for another step. */
void pp_threads_reset(pp_threads* t);
/* Bytes and messages rank has sent (cumulative). */
void pp_threads_counters(pp_threads* t, int rank, uint64_t* bytes, uint64_t* msgs);

/* Runs fn(rank, user) on n threads and joins them; returns the first non-OK result. */
typedef pp_result (*pp_rank_fn)(int rank, void* user);
pp_result pp_threads_run(int n, pp_rank_fn fn, void* user, pp_error* err);

/* >>batch ------------------------------------------------------------------------------------- */
typedef enum pp_loss_reduction {
    PP_LOSS_MEAN_MICROBATCH = 0,    /* step loss = mean of micro-batch losses (scale 1/m) */
    PP_LOSS_MEAN_ROWS               /* weighted by rows: scale rows_mb / rows_total */
} pp_loss_reduction;

/* One step's global batch. Ranks that do not own the first stage may leave input.data NULL
   (the shape must still be set); ranks without the last stage may leave targets NULL. */
typedef struct pp_batch {
    int m;                          /* micro-batches */
    pp_tensor input;                /* [rows, cols] */
    const void* targets;            /* row-major, target_row_bytes per row */
    size_t target_row_bytes;
    const int32_t* cu_seqlens;      /* optional packed layout: n_seqs+1 entries, last == rows */
    int n_seqs;
    pp_loss_reduction loss;
} pp_batch;

/* Split a batch into micro-batches (contiguous rows; whole sequences when packed). mbs[m] and
   cu (n_seqs + m entries when packed, else may be NULL) are the caller's. */
pp_result pp_batch_split(const pp_batch* b, pp_microbatch* mbs, int32_t* cu, pp_error* err);

/* Sequential reference: every micro-batch forward then backward through all layers on this
   thread, gradients accumulated into grads. *loss gets the step loss. */
pp_result pp_sequential_step(const pp_model* m, const void* weights, void* grads,
                             const pp_batch* b, float* loss, pp_error* err);

/* >>stage ------------------------------------------------------------------------------------- */
typedef struct pp_stage pp_stage;

typedef struct pp_stage_desc {
    pp_model model;
    const void* weights;
    void* grads;
    const pp_schedule* schedule;
    const int* partition;       /* first[n_stages+1] */
    int rank;
    pp_transport transport;
    double timeout_s;           /* deadline of each wait; 0 = PP_DEFAULT_TIMEOUT_S */
    int record_timeline;        /* keep per-action events of the last step */
} pp_stage_desc;

typedef struct pp_step_stats {
    float loss;                 /* step loss, on the rank that owns the last stage; else 0 */
    int has_loss;
    double t_total;             /* wall time of the step on this rank (s) */
    double t_forward, t_backward;
    double t_wait;              /* blocked on receives */
    uint64_t bytes_sent, bytes_recv;
    uint64_t msgs_sent;
    int peak_live;              /* most stashes alive at once */
    size_t peak_stash_bytes;
    int n_actions;
} pp_step_stats;

pp_result pp_stage_create(const pp_stage_desc* d, pp_stage** out, pp_error* err);
void pp_stage_destroy(pp_stage* st);
/* Run one training step (forward and backward of all micro-batches); grads accumulate. */
pp_result pp_stage_step(pp_stage* st, const pp_batch* b, pp_step_stats* stats);
const char* pp_stage_error(const pp_stage* st);
/* Events of the last step when record_timeline is set (times in seconds from step start). */
const pp_event* pp_stage_timeline(const pp_stage* st, size_t* n);

#ifdef __cplusplus
}
#endif
#endif /* PIPELINE_H */

/* >>impl ============================================================================================ */
#ifdef PIPELINE_IMPLEMENTATION
#ifndef PIPELINE_IMPLEMENTATION_DONE
#define PIPELINE_IMPLEMENTATION_DONE

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>
#include <errno.h>
#include <pthread.h>

#if defined(PP_MALLOC) != defined(PP_FREE)
#error "pipeline.h: define both PP_MALLOC and PP_FREE, or neither"
#endif
#ifndef PP_MALLOC
#define PP_MALLOC(sz) malloc(sz)
#define PP_FREE(p) free(p)
#endif
#ifndef PP_ASSERT
#include <assert.h>
#define PP_ASSERT(c) assert(c)
#endif

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) || defined(__clang__)
#define _PP_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define _PP_PRINTF(a, b)
#endif

/* >>impl-result */
const char* pp_result_str(pp_result r) {
    switch (r) {
#define _PP_RESULT_STR(name, str) case name: return str;
        PP_RESULT_LIST(_PP_RESULT_STR)
#undef _PP_RESULT_STR
    default: return "unknown result";
    }
}

/* Records code and message in err (if any) and returns code: `return _pp_fail(err, ...)`. */
static pp_result _pp_fail(pp_error* err, pp_result code, const char* fmt, ...) _PP_PRINTF(3, 4);
static pp_result _pp_fail(pp_error* err, pp_result code, const char* fmt, ...) {
    if (err) {
        va_list ap;
        int n = snprintf(err->msg, sizeof err->msg, "%s: ", pp_result_str(code));
        if (n < 0 || (size_t)n >= sizeof err->msg) n = 0;
        va_start(ap, fmt);
        vsnprintf(err->msg + n, sizeof err->msg - (size_t)n, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

static void* _pp_calloc(size_t n, size_t size) {
    void* p;
    size_t bytes;
    if (size && n > (size_t)-1 / size) return NULL;
    bytes = n * size;
    p = PP_MALLOC(bytes > 0 ? bytes : 1);
    if (p) memset(p, 0, bytes);
    return p;
}

static double _pp_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#include "wip/core_impl.inc"
#include "wip/schedule_impl.inc"
#include "wip/exec_impl.inc"

#ifdef __cplusplus
}
#endif
#endif /* PIPELINE_IMPLEMENTATION_DONE */
#endif /* PIPELINE_IMPLEMENTATION */

/*
------------------------------------------------------------------------------
This software is available under 2 licenses -- choose whichever you prefer.
ALTERNATIVE A - MIT License
Copyright (c) 2026 the pipeline.h authors
Permission is hereby granted, free of charge, to any person obtaining a copy of this software
and associated documentation files (the "Software"), to deal in the Software without
restriction, including without limitation the rights to use, copy, modify, merge, publish,
distribute, sublicense, and/or sell copies of the Software, and to permit persons to whom the
Software is furnished to do so, subject to the following conditions: The above copyright notice
and this permission notice shall be included in all copies or substantial portions of the
Software. THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED.
ALTERNATIVE B - Public Domain (www.unlicense.org)
Anyone is free to copy, modify, publish, use, compile, sell, or distribute this software, either
in source code form or as a compiled binary, for any purpose, commercial or non-commercial, and
by any means.
------------------------------------------------------------------------------
*/
