/* pipeline.h - pipeline-parallel training for C trainers.   v0.1.0   public domain / MIT (see end)

   Do this in exactly one C or C++ file, before any other include:

       #define PIPELINE_IMPLEMENTATION
       #include "pipeline.h"

   Every other file includes "pipeline.h" without the define. Link with -lpthread (-pthread).

   WHAT IT DOES
   You declare your model as a typed list of layers, write plain forward/backward functions over
   flat buffers, and pick a schedule (GPipe, 1F1B, interleaved 1F1B, zero-bubble ZB-H1 and ZB-V,
   or your own as a text table). The library splits the layers
   into stages, generates each rank's ordered action list {op, micro-batch, chunk}, proves it free
   of deadlock with a simulator, and walks it: receiving activations, calling your functions,
   stashing what backward needs, sending results, accumulating gradients over micro-batches.
   Tensors move through a transport: threads in one process (here), CUDA streams
   (pipeline_cuda.h), NCCL processes (pipeline_nccl.h).

   USAGE (examples/mlp_cpu.c is the full program)

       // X(layer name, parameter struct, forward, backward, describe, count)
       #define MLP_LAYERS(X)                                          \
           X(dense, dense_params, dense_fwd, dense_bwd, dense_desc, 7) \
           X(loss,  loss_params,  loss_fwd,  loss_bwd,  loss_desc,  1)
       PP_MODEL(mlp, MLP_LAYERS)      // mlp_model struct, mlp_model_desc(), mlp_N_LAYERS

       int dense_fwd(const dense_params* w, pp_layer_io* io);           // io->in[0] -> io->out[0]
       int dense_bwd(const dense_params* w, dense_params* g, pp_layer_io* io); // g += ..., d_in = ...
       void dense_desc(const dense_params* w, const pp_microbatch* mb,
                       const pp_tensor* in, int n_in, pp_layer_desc* d);   // output shapes

       pp_pipeline_desc d = {0};               // zero is a default everywhere
       d.model = mlp_model_desc();
       d.weights = &w; d.grads = &g;           // mlp_model structs
       d.schedule = PP_SCHED_1F1B; d.p = 4; d.m = 8;
       pp_pipeline* pl; pp_pipeline_create(&d, &pl, &err);   // 4 threads, a stage each
       for (;;) {
           pp_batch b = {0};                   // one step: x a pp_tensor [rows, cols], y its targets
           b.input = x; b.targets = y; b.target_row_bytes = 4;
           pp_pipeline_step(pl, &b, &stats);   // stats.loss; gradients accumulate into g
           // your optimizer on w; zero g
       }
       pp_pipeline_eval(pl, &val, &out, &stats); // forward only: stats.loss, logits into out
                                                 // (pp_eval_out, NULL: none); no gradient
       pp_pipeline_destroy(pl);
   That is the one-process layer (>>pipeline; pipeline_cuda.h's pp_cuda_pipeline_create puts
   every rank on a CUDA stream). It runs the per-rank API (>>stage) for you: one process per
   rank (MPI, NCCL), or a program that drives every rank itself, fills a pp_stage_desc per rank
   and calls pp_stage_step on each (examples/gpt_mpi.c).

   LAYERS
   A layer is a forward, a backward and a describe function, all typed on the layer's own
   parameter struct P (a wrong signature is a compile error: PP_MODEL calls them directly).
   - describe(w, mb, in, n_in, d): from the micro-batch and the input tensor shapes (data NULL),
     fill d->n_out and d->out[i] (rows, cols, dtype), d->saved_bytes (private scratch kept from
     forward to backward), d->cost (relative time, for partitioning) and d->n_params. It may read
     the sizes in its parameter struct w, never the data w points to: every rank describes every
     layer to learn the shapes it will receive, and a rank may hold only its own layers' arrays.
   - forward(w, io): read io->in[], write io->out[] (and io->saved).
   - backward(w, g, io): read io->in[], io->out[], io->d_out[] and io->saved; ADD parameter
     gradients into g (+=, accumulation across micro-batches); write or add the input gradient
     into io->d_in[] (zeroed before the call; data is NULL where no gradient is wanted: integer
     tensors, and the model input).
   - THE LOSS LAYER is the last: no outputs (d->n_out = 0), its targets at io->mb->targets
     (pp_batch.target_row_bytes per row). Forward sets io->loss to the MEAN over the micro-batch's
     rows (tokens) of the per-row loss; backward writes that mean's gradient TIMES
     io->mb->loss_scale into io->d_in: d_in = loss_scale / rows * d(row loss)/d(input).
     loss_scale is the step's reduction weight (PP_LOSS_MEAN_MICROBATCH: 1 / m; PP_LOSS_MEAN_ROWS:
     rows_mb / rows_total, the mean over the batch's rows) times pp_batch.loss_scale (a loss
     scaler's); the step loss is the sum of the micro-batch losses times their weights.
   ORDER. Layers run in the list's order (every entry's count, entry after entry) unless
   PP_MODEL_ORDER(name, OLIST) gives another: X(dense) X(tanh) X(dense) X(tanh) ... runs
   name_model's dense[0], tanh[0], dense[1], tanh[1], ... (name_model_desc_order()).
   PARAMETERS. PP_MODEL_PARAMS(name, LIST) names each kind's buffers once (pp_param): checkpoints
   read it over the weights, and pp_pipeline_grad_bufs / pp_stage_grad_bufs over the gradients
   give the lists the norm, clipping, the loss scaler and pp_dp_overlap take (>>grad).
   One model implementation serves the sequential reference (pp_sequential_step) and every
   pipelined run: results are bit-identical when the accumulation order is the same, which it is
   for every built-in schedule (each stage runs backward in ascending micro-batch order).

   RUNTIME COUNTS AND CONTEXT
   A list entry's count is a capacity: mlp_counts n = {0}; n.dense = 5; mlp_model_desc_counts(n)
   is the model with 5 dense layers in use (0 keeps an entry's count), numbered over the layers
   in use. pp_model.ctx is yours: every layer call reaches it, as io->model->ctx in forward,
   backward and weight_grad, and as d->model->ctx in describe (the library sets d->model before
   the call). io->ctx is something else: the rank's pp_stage_desc.layer_ctx (its CUDA stream).

   SPLIT BACKWARD (zero-bubble schedules)
   PP_MODEL_SPLIT(name, LIST) takes X(layer, P, forward, backward, weight_grad, describe, count):
   backward(w, g, io) then writes only io->d_in (B: the input gradient the previous stage waits
   for) and weight_grad(w, g, io) adds the parameter gradient (W: nobody waits, a schedule may
   defer it). It sees the io backward saw; the executor keeps stash and gradients alive until W.
   A layer without the split names PP_NO_WGRAD there and does both in backward. Any model runs on
   any schedule: without W actions W runs inside B; without weight_grad a W action is a no-op.
   The W share: scratch that backward needs and weight_grad does not goes in d->b_saved_bytes
   (io->b_saved in forward and backward, NULL in weight_grad); B frees it while the stash waits
   for W. pp_step_stats.peak_mem counts it as the simulator's pp_sim_cost.b_free does.

   ACTIVATION RECOMPUTATION
   pp_stage_desc.recompute (one flag per layer; NULL: none) keeps a flagged layer's scratch, and a
   boundary between two flagged layers, out of the stash: right before the B (B and W of a split
   layer) the stage runs those forwards again from what it kept. Bit-identical on every schedule
   and transport (forwards must be deterministic); the loss is not written twice. The simulator
   counts it (pp_sim_cost.r_f: B's extra time, r_mem: the share dropped); pp_plan_recompute picks
   the schedule, the partition and the flags together for the shortest step under a memory cap
   (pp-sched rank --recompute).

   SCHEDULES AS TEXT
       schedule p=2 v=1 m=2            # map=loop (default) or map=v
       r0: F0 F1 B0 W0 B1 W1
       r1: F0 B0 F1 B1 W0 W1
   pp_schedule_parse(text, len, out, cap, &need, &sched, &err) checks it (errors name line and
   column), proves it with the simulator and fills sched; pp_schedule_write prints one. Each
   stage's B's and W's must go in ascending micro-batch order (bit-identical gradients); a table
   that breaks that is refused unless its header says order=any.
   AUTO-PARTITION: pp_profile_layers measures each layer's F, B, W; pp_partition_balanced or
   pp_partition_capped (under a memory cap per stage) splits on the measured times.

   THE LOOP AROUND THE STEP (>>grad)
   pp_dp_overlap: each stage's data-parallel reduction from its gradients-final hook
   (pp_stage_desc.grads_final), while the pipeline drains; one wait after the step does the rest.
   pp_stage_grad_norm (per rank), pp_pipeline_grad_norm (one process) and pp_grad_norm (any group
   of ranks): the L2 norm of all the model's gradients, tied parameters once, from the arrays each
   rank lists (pp_grad_buf, or pp_*_grad_bufs from the params hook); the same bits on every rank and for every p, v, schedule and
   partition as the sequential model's. The _clip variants and pp_grad_clip scale by
   min(1, max_norm / (norm + 1e-6)). Tensor parallelism: pp_grad_norm_tp and pp_stage_grad_*_tp
   take the TP group (pp_grad_buf.tp_sharded: a shard). pp_loss_scaler: dynamic loss scaling for f16 through
   pp_batch.loss_scale; an Inf on any rank skips the step on every rank. pp_grad_allreduce and
   pp_tied_sum_grads take f16/bf16 gradients (summed in f32).
   CHECKPOINTS (>>ckpt)
   pp_ckpt_save_file / pp_ckpt_load_file (and _mem, and pp_ckpt_save / _load over your own I/O)
   keep a model's parameters and an optimizer's state (model structs bound like the weights)
   layer by layer, checksummed, in a file that depends on no p, v, schedule or partition: each
   rank saves and loads the layers it owns. The model names a layer's buffers through
   pp_model.params (PP_MODEL_PARAMS(name, LIST) makes it). A load checks the whole file against
   the model before it writes into your buffers. Tensor-parallel slices (pp_ckpt_desc.tp, shards)
   are saved whole: the file is the one a tp = 1 run writes, and loads at any tp.

   CONFIGURATION (define before every include of this header, the same in every file; the four
   that size public structs - PP_MAX_TENSORS, PP_MAX_LAYER_KINDS, PP_MAX_RANKS, PP_FLIGHT_LEN -
   are part of the link names of every function that takes such a struct (>>config), so files
   that disagree fail to link)
       PP_MALLOC(sz) / PP_FREE(p)   allocator (default malloc/free); define both or neither
       PP_ASSERT(c)                 internal invariants only, never user errors (default assert)
       PP_MAX_TENSORS               tensors crossing one layer boundary (default 4)
       PP_MAX_LAYER_KINDS           PP_MODEL entries whose count can change at run time (16)
       PP_MAX_RANKS                 ranks in one pipeline (default 256)
       PP_DEFAULT_TIMEOUT_S         deadline of every wait when the desc says 0 (default 300)
       PP_FLIGHT_LEN                entries in each rank's flight record (default 32)
       PP_THREADS_SPIN_US           threads transport: how long a wait spins before sleeping (50)
       PP_NO_VALIDATE               leave out the validation layer (guards after the buffers a layer
                                    writes, see ERRORS) and the executor's debug checks of its own
                                    ordering (both also left out under NDEBUG)

   MEMORY
   Schedule generation writes into the caller's array (pp_schedule_size tells how large). The
   simulator and partitioner take scratch from PP_MALLOC and free it before returning. A stage
   allocates at create time and keeps a pool of stash blocks that grows to the schedule's peak
   live activations and is reused, so the steady state does not allocate. pp_stage_desc.device
   (pp_device_ops) moves the pool elsewhere, e.g. GPU memory (pipeline_cuda.h); NULL is host.
   The validation layer adds 64 to 127 bytes after each buffer in a host block (none on a device).

   ERRORS
   Every function that can fail returns pp_result (PP_OK == 0). Pure functions take an optional
   pp_error* that receives a message; a stage keeps its last message (pp_stage_error). Bad input
   never crashes, hangs or corrupts; every wait has a deadline and names who waited for whom.
   Library code never calls exit() or abort().
   The validation layer (on unless NDEBUG or PP_NO_VALIDATE; >>impl-validate): every buffer a layer
   call may write in host memory - outputs, saved, b_saved, input gradients - has a guard after
   its declared end, filled before each forward, backward and weight_grad call and read after it.
   A layer that wrote past what its describe declared fails the call with PP_ERR_LAYER: "layer 4
   (dense) backward (B) on micro-batch 1 wrote 64 bytes past its input gradient d_in[0] [6 x 9
   f32, 216 bytes] as describe declared it" (pp_sequential_step and pp_profile_layers check too).
   Under AddressSanitizer the guards are poisoned during the call: the sanitizer stops at the
   writing line. Blocks in device memory (pp_stage_desc.device) have no guards.
   A step that fails on one rank (layer error, timeout, rejected batch, a NaN/Inf loss, and with
   pp_stage_desc.check_finite a NaN/Inf anywhere: PP_ERR_NONFINITE) aborts it on every rank: the
   others return PP_ERR_ABORTED. The loss check is on by default (allow_nonfinite_loss = 1 turns
   it off); check_finite = 1 names the layer that first wrote the NaN/Inf. pp_threads_reset
   drops what the broken step left queued; the next step then runs as if nothing happened. A
   timeout message names this rank, the action (op, micro-batch, chunk), the peer it waited for
   and the last action each rank completed, from the ranks' flight records (>>flight;
   pp_threads_flight_print prints them on demand, and pp_threads_flight_print_fd from a signal
   handler: it takes no lock).

   TRANSPORTS
   threads (this header)      each rank a thread in one process: pp_threads_*
   cuda    (pipeline_cuda.h)  stages as CUDA streams, one or several GPUs
   nccl    (pipeline_nccl.h)  one process per GPU
   mpi     (pipeline_mpi.h)   one process per rank over MPI (CPU clusters, tests without GPUs)
   Several processes share >>grid (and >>impl-grid): launcher environment, pp x dp (x tp) grid,
   data-parallel and tied-layer gradient sums, written once over pp_transport; >>tp (and
   >>impl-tp) the collectives of a layer split over a tensor-parallel group.

   SECTIONS  (search for ">>name"; every marker in the file, in file order)
   declarations: >>config >>result >>tensor >>model >>partition >>schedule >>sim >>trace
                 >>flight >>transport >>threads >>batch >>stage >>pipeline >>grid >>grad >>ckpt
                 >>tp >>deprecated
   definitions:  >>impl >>impl-result >>impl-tensor >>impl-model >>impl-partition >>impl-batch
                 >>impl-validate (the guards) >>impl-profile (pp_profile_layers) >>impl-schedule
                 >>impl-sim >>impl-trace >>impl-flight >>impl-threads >>impl-grid >>impl-tp >>impl-stage
                 >>impl-stage-flight >>impl-stage-finite >>impl-stage-map >>impl-stage-agree
                 >>impl-stage-exec >>impl-pipeline >>impl-grad >>impl-ckpt

   VERSION
   PP_VERSION_MAJOR, _MINOR, _PATCH, PP_VERSION (major * 10000 + minor * 100 + patch) and
   PP_VERSION_STRING ("0.1.0"). pipeline_cuda.h, pipeline_nccl.h and pipeline_mpi.h each name the
   release they belong to (PP_CUDA_VERSION, PP_NCCL_VERSION, PP_MPI_VERSION) and fail to compile
   against a pipeline.h of another, with a message naming both versions.

   REVISIONS
   0.1.0  first release: layer list, partitioner, GPipe/1F1B/interleaved (any m), simulator,
          pictures, executor, threads transport, packed variable-length micro-batches
          (cu_seqlens, split policies, LOCAL/BROADCAST/PER_MESSAGE/AUTO shape policies),
          several tensors per stage boundary.
          Then: split backward (PP_MODEL_SPLIT, W actions), ZB-H1 and ZB-V (V stage map),
          schedules as text tables, measured and memory-capped partitions.
          Reliability: flight records and timeout messages naming each rank's last action,
          abort on any failure with cancelled receives (pp_transport.cancel), NaN/Inf check
          (PP_ERR_NONFINITE), shape-overflow and desc validation.
          Then: the one-process layer (pp_pipeline_*, pp_cuda_pipeline_create), PP_MODEL
          counts chosen at run time (NAME_model_desc_counts), a model context (pp_model.ctx).
          Then: the global gradient norm and clipping, f16/bf16 gradient sums, a dynamic loss
          scaler (>>grad), pp_batch.loss_scale, pp_device_ops.copy.
          Then: checkpoints independent of the pipeline's shape (pp_ckpt_*, pp_model.params,
          PP_MODEL_PARAMS, file format version 1), PP_ERR_CORRUPT and PP_ERR_IO.
          Then: evaluation (pp_stage_eval, pp_pipeline_eval, pp_sequential_eval; forward-only
          lists, pp_schedule_make_eval).
          Then: PP_VERSION_STRING, companion headers that refuse a pipeline.h of another
          release; NVTX ranges per action (PP_NVTX, pipeline_cuda.h); make install, pkg-config
          and CMake packages (README); make install writes the CMake package too.
          Then: V-Min's stash cap 2 round(min(p, m) / 3) + 2 chunks, the authors' list's peak
          (one chunk less where min(p, m) % 3 == 1, e.g. 4 at p = 4).
          Then: gradients final per stage (pp_stage_desc.grads_final, pp_step_stats
          .t_grads_final) and the data-parallel reduction overlapped with the cool-down
          (pp_dp_overlap, >>grad); pipeline_nccl.h starts it too (iallreduce_sum on the dp
          transport's own stream), the MPI grid example uses it by default.
          Then (examples only, the library unchanged): the GPT trainers' --dtype bf16, bf16
          activations and their gradients between stages (examples/gpt.h, gpt_cuda.h).
          Then: activation recomputation (pp_stage_desc.recompute; pp_sim_cost.r_f, r_mem,
          mem_stage) and plans that choose it with the schedule under a memory cap (pp_plan_try,
          pp_plan_recompute); pp_step_stats.peak_stash_bytes counts bytes asked for.
          Then (examples only): gpt_cuda and gpt_nccl train with AdamW, --clip, warm-up and
          cosine, --eval-every and --save/--resume like gpt_cpu (examples/gpt_loop.h).
          Then: tensor parallelism's foundation: a pp x dp x tp grid (pp_grid_make_tp) and
          deterministic TP collectives over any transport (>>tp: pp_tp_allreduce, _reducescatter,
          _allgather).
          Then: layers in any order of kinds (PP_MODEL_ORDER, pp_model.order); the gradient
          lists from the params hook (pp_model_grad_bufs, pp_stage_grad_bufs,
          pp_pipeline_grad_bufs; pp_param.tp_sharded, pp_param_shard); PP_DESCRIBE_SAME and
          PP_DESCRIBE_LOSS; the loss layer's contract written under LAYERS.
          Then: the one-process pipeline takes dp and tp (pp_pipeline_desc.dp, .tp, .dp_scale:
          p x dp x tp threads, the dp sum inside the step); a layer's TP group as io->tp
          (pp_stage_desc.tp, pp_group_rank, pp_group_size).
          Then: boundaries split across the TP group (pp_stage_desc.tp, pp_layer_desc.out_tp):
          1/tp of the bytes between stages, all-gathered on arrival.
*/
#ifndef PIPELINE_H
#define PIPELINE_H

#define PP_VERSION_MAJOR 0
#define PP_VERSION_MINOR 1
#define PP_VERSION_PATCH 0
#define PP_VERSION (PP_VERSION_MAJOR * 10000 + PP_VERSION_MINOR * 100 + PP_VERSION_PATCH)
#define PP_VERSION_STRING "0.1.0"

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
#ifndef PP_FLIGHT_LEN
#define PP_FLIGHT_LEN 32
#endif
#ifndef PP_MAX_LAYER_KINDS
#define PP_MAX_LAYER_KINDS 16       /* entries of a PP_MODEL list whose count can change at run time */
#endif
/* PP_MAX_TENSORS, PP_MAX_RANKS, PP_FLIGHT_LEN and PP_MAX_LAYER_KINDS size public structs, so
   they are part of the link: every function that takes or fills such a struct, or calls your
   layers with one (pp_layer_io, pp_layer_desc, pp_model, pp_sim_result, pp_flight, pp_grid, the
   descs that hold a pp_model), is linked under a name that carries them. A file that includes
   this header with other values than the implementation file fails to link (undefined
   pp_stage_create_abi_t8_r256_f32_k16_define_PIPELINE_IMPLEMENTATION_in_one_file, say) instead
   of corrupting memory. Give them as plain integers. The name's tail is the hint for the
   commoner cause of that link error, no file with the implementation at all. */
#define _PP_ABI_CAT2(name, t, r, f, k) pp_##name##_abi_t##t##_r##r##_f##f##_k##k##_define_PIPELINE_IMPLEMENTATION_in_one_file
#define _PP_ABI_CAT(name, t, r, f, k) _PP_ABI_CAT2(name, t, r, f, k)
#ifdef __CPPCHECK__ /* make lint: its whole-program checks took the renamed functions for one another */
#define _PP_ABI(name) pp_##name
#else
#define _PP_ABI(name) _PP_ABI_CAT(name, PP_MAX_TENSORS, PP_MAX_RANKS, PP_FLIGHT_LEN, PP_MAX_LAYER_KINDS)
#endif
#define pp_stage_create _PP_ABI(stage_create)             /* pp_stage_desc: pp_model, layers */
#define pp_pipeline_create _PP_ABI(pipeline_create)       /* pp_pipeline_desc: pp_model, layers */
#define pp_model_check _PP_ABI(model_check)               /* pp_model */
#define pp_model_layer_name _PP_ABI(model_layer_name)
#define pp_model_layer_costs _PP_ABI(model_layer_costs)   /* pp_model, pp_layer_desc via describe */
#define pp_partition_model _PP_ABI(partition_model)
#define pp_partition_print _PP_ABI(partition_print)
#define pp_sequential_step _PP_ABI(sequential_step)       /* pp_model, pp_layer_io via the layers */
#define pp_sequential_eval _PP_ABI(sequential_eval)       /* pp_model, pp_eval_out */
#define pp_stage_eval _PP_ABI(stage_eval)                 /* pp_eval_out */
#define pp_pipeline_eval _PP_ABI(pipeline_eval)           /* pp_eval_out */
#define pp_profile_layers _PP_ABI(profile_layers)
#define pp_simulate _PP_ABI(simulate)                     /* pp_sim_result */
#define pp_flight_last _PP_ABI(flight_last)               /* pp_flight */
#define pp_flight_print _PP_ABI(flight_print)
#define pp_flight_print_fd _PP_ABI(flight_print_fd)
#define pp_threads_flight _PP_ABI(threads_flight)
#define pp_threads_transport _PP_ABI(threads_transport)   /* its flight_get fills a pp_flight */
#define pp_stage_flight _PP_ABI(stage_flight)
#define pp_grid_make _PP_ABI(grid_make)                   /* pp_grid */
#define pp_grid_rank _PP_ABI(grid_rank)
#define pp_grid_pipe_split _PP_ABI(grid_pipe_split)
#define pp_grid_dp_split _PP_ABI(grid_dp_split)
#define pp_grid_tied_split _PP_ABI(grid_tied_split)
#define pp_grid_make_tp _PP_ABI(grid_make_tp)
#define pp_grid_rank_tp _PP_ABI(grid_rank_tp)
#define pp_grid_tp_split _PP_ABI(grid_tp_split)
#define pp_ckpt_size _PP_ABI(ckpt_size)                   /* pp_ckpt_desc: pp_model */
#define pp_ckpt_save _PP_ABI(ckpt_save)
#define pp_ckpt_load _PP_ABI(ckpt_load)
#define pp_ckpt_save_file _PP_ABI(ckpt_save_file)
#define pp_ckpt_load_file _PP_ABI(ckpt_load_file)
#define pp_ckpt_save_mem _PP_ABI(ckpt_save_mem)
#define pp_ckpt_load_mem _PP_ABI(ckpt_load_mem)

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
    X(PP_ERR_NONFINITE, "non-finite value (NaN or Inf)")                        \
    X(PP_ERR_UNSUPPORTED, "unsupported")                                        \
    X(PP_ERR_CORRUPT, "corrupt data")                                           \
    X(PP_ERR_IO, "file input/output failed")

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
/* IEEE half (f16) and bfloat16 to and from f32, as stored (uint16_t bits). Widening is exact;
   narrowing rounds to nearest, ties to even, overflows to Inf and keeps a NaN a NaN. */
float pp_f16_to_f32(uint16_t h);
uint16_t pp_f32_to_f16(float f);
float pp_bf16_to_f32(uint16_t h);
uint16_t pp_f32_to_bf16(float f);

/* >>model ------------------------------------------------------------------------------------- */
struct pp_model; /* below: what every layer call can reach through io->model and d->model */

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
    void* ctx;                          /* pp_stage_desc.layer_ctx (e.g. the rank's CUDA stream);
                                           NULL under pp_sequential_step */
    const struct pp_model* model;       /* the model being run: model->ctx is your context */
    void* b_saved;                      /* b_saved_bytes of scratch kept from forward to backward
                                           only: NULL in weight_grad (freed at B, before W) */
    size_t b_saved_bytes;
    const struct pp_group* tp;          /* the rank's tensor-parallel group (pp_stage_desc.tp; the
                                           one-process pipeline's tp > 1 sets it) for pp_tp_allreduce
                                           and friends; pp_group_rank / pp_group_size say where the
                                           rank is in it. NULL: tp = 1 (the pp_tp_* calls then copy) */
} pp_layer_io;

/* How a boundary tensor lies across the tensor-parallel group (pp_stage_desc.tp). REPLICATED,
   the default: every TP rank holds the whole tensor; with a TP group set the pipeline sends each
   TP rank's rows pp_tp_block(rows, tp, tp_rank) to the same TP rank of the next stage, which
   all-gathers them (gradients likewise, backward). SHARDED: each TP rank holds its own part
   (sequence parallelism); it goes whole to the same TP rank of the next stage, no gather. */
typedef enum pp_tp_layout { PP_TP_REPLICATED = 0, PP_TP_SHARDED = 1 } pp_tp_layout;

/* What describe() returns for one layer on one micro-batch. */
typedef struct pp_layer_desc {
    int n_out;
    pp_tensor out[PP_MAX_TENSORS];      /* shapes and dtypes; data ignored */
    size_t saved_bytes;
    double cost;                        /* relative forward+backward time (0 counts as 1) */
    int64_t n_params;
    const struct pp_model* model;       /* set before the call: the model (model->ctx is yours) */
    /* The W share: scratch that backward reads and weight_grad does not (a split model's
       intermediates the input gradient needs and the weight gradient does not). Kept from forward
       to backward only: a schedule with W actions frees it at B, while the stash (activations and
       saved_bytes) waits for W. 0: none. */
    size_t b_saved_bytes;
    pp_tp_layout out_tp[PP_MAX_TENSORS]; /* each output across TP (above; 0: replicated) */
} pp_layer_desc;

#ifndef PP_MAX_LAYER_KINDS
#define PP_MAX_LAYER_KINDS 16       /* entries of a PP_MODEL list whose count can change at run time */
#endif

/* One entry of a PP_MODEL list: its name and its count, which is the most layers of that kind
   the model can hold (the typed model struct has that many); fewer may be in use. */
typedef struct pp_layer_kind {
    const char* name;
    int count;
} pp_layer_kind;

/* One parameter buffer of a layer, as the checkpoint functions (>>ckpt) and the gradient lists
   derived from the model (pp_model_grad_bufs, >>grad) see it: count elements of dtype at data,
   contiguous. data may be NULL where this process does not hold the layer (the sizes must still
   be right). pp_param_of(data, count, dtype) makes one; pp_param_shard(...) the same with
   tp_sharded = 1. */
typedef struct pp_param {
    void* data;
    int64_t count;
    pp_dtype dtype;
    /* Tensor parallelism: 1 where data is this rank's shard of a parameter split over the TP
       group; copied into pp_grad_buf.tp_sharded by the derived gradient lists (the norm adds the
       shards' squares). Checkpoints do not read it (their shards are pp_ckpt_desc.shards). */
    int tp_sharded;
} pp_param;

static inline pp_param pp_param_of(void* data, int64_t count, pp_dtype dtype) {
    pp_param p;
    p.data = data;
    p.count = count;
    p.dtype = dtype;
    p.tp_sharded = 0;
    return p;
}
static inline pp_param pp_param_shard(void* data, int64_t count, pp_dtype dtype) {
    pp_param p = pp_param_of(data, count, dtype);
    p.tp_sharded = 1;
    return p;
}

/* A model as the library sees it: PP_MODEL fills one for you (NAME_model_desc()). */
typedef struct pp_model {
    const char* name;
    int n_layers;               /* layers in use */
    int (*forward)(const void* weights, int layer, pp_layer_io* io);
    int (*backward)(const void* weights, void* grads, int layer, pp_layer_io* io);
    void (*describe)(const void* weights, int layer, const pp_microbatch* mb,
                     const pp_tensor* in, int n_in, pp_layer_desc* d);
    const char* (*layer_name)(int layer);
    /* Optional (NULL: none). When set, backward computes only the input gradient (B) and
       weight_grad adds the parameter gradient (W), possibly much later: zero-bubble schedules
       defer W to fill the pipeline's idle time. PP_MODEL_SPLIT fills it. */
    int (*weight_grad)(const void* weights, void* grads, int layer, pp_layer_io* io);
    /* Yours (NULL by default): every layer call can reach it, as io->model->ctx in forward,
       backward and weight_grad, and as d->model->ctx in describe. The library never reads it. */
    void* ctx;
    /* PP_MODEL fills these (a model made by hand leaves them zero): the list's entries, and how
       many layers of each are in use. NAME_model_desc_counts sets in_use and n_layers together;
       pp_model_check refuses an in_use above the entry's count or a sum other than n_layers. */
    int n_kinds;
    const pp_layer_kind* kinds;
    int in_use[PP_MAX_LAYER_KINDS];
    /* Optional (NULL: none; the checkpoint functions need it): names layer `layer`'s parameter
       buffers in `weights`, a model struct - the weights, or anything bound like them (the
       gradients, an optimizer's moments). Fills out[0 .. min(n, cap)) and returns n, the layer's
       buffer count (0: no parameters; out may be NULL when cap is 0), or -1 for a layer it does
       not know. Like describe it reads sizes from the struct and must give them on every rank,
       also where the arrays are not allocated (data NULL there). m is the model being used (its
       counts). PP_MODEL_PARAMS makes one from a function per layer kind. */
    int (*params)(const struct pp_model* m, const void* weights, int layer, pp_param* out, int cap);
    /* Optional (NULL: the list's order): the kind of every layer in use, order[0 .. n_layers),
       an index into kinds; a layer's index within its kind counts that kind's earlier layers,
       so dense, tanh, dense, tanh is four layers of two kinds. in_use[k] must be the number
       of k's in it. PP_MODEL_ORDER makes one (name_model_desc_order()). */
    const int* order;
} pp_model;

/* PP_MODEL(name, LIST): LIST is an X-macro whose entries are
       X(layer, P, forward, backward, describe, count)
   It generates, all static inline:
       struct name_model { P layer[count]; ... };   one typed field per layer kind
       enum { name_N_LAYERS };                        total layer count of the full list
       struct name_counts { int layer; ... };        layers in use per entry (0 = its count)
       name_forward / name_backward / name_describe   dispatch on a global layer index
       name_layer_name(l)                             names, numbered as in the full list
       name_model_desc()                              the pp_model of the full list
       name_model_desc_counts(n)                      the pp_model using n.layer of each entry
       name_kinds() / name_n_kinds()                  the list's entries and their number
   Each callback is called with its own P, so the compiler checks every signature.

   RUNTIME COUNTS. An entry's count is a capacity: name_model has that many P, and a model may
   use fewer. name_counts n = {0}; n.block = 6; m = name_model_desc_counts(n) uses 6 blocks
   (entries left 0 keep their count): layers are numbered over the layers in use, in list
   order, and m.n_layers is their sum. The dispatchers find a layer's entry and index through
   io->model (d->model in describe), which the library sets on every call; a caller that runs
   name_forward itself sets io.model = &m (NULL numbers layers as the full list). A wrapper
   model starts from a copy of m and replaces callbacks, so that it keeps m's counts. */
#define _PP_MODEL_FIELD(lname, P, fwd, bwd, desc, count) P lname[count];
#define _PP_MODEL_COUNT(lname, P, fwd, bwd, desc, count) + (count)
#define _PP_MODEL_KIND(lname, P, fwd, bwd, desc, count) _pp_kind_##lname,
#define _PP_MODEL_KINIT(lname, P, fwd, bwd, desc, count) {#lname, (count)},
#define _PP_MODEL_CNT(lname, P, fwd, bwd, desc, count) int lname;
#define _PP_MODEL_USE(lname, P, fwd, bwd, desc, count) _pp_model_use(&m, _pp_kind_##lname, n.lname);
#define _PP_MODEL_ZERO(lname, P, fwd, bwd, desc, count) n.lname = 0;
#define _PP_MODEL_FWD(lname, P, fwd, bwd, desc, count) \
    case _pp_kind_##lname: return fwd(&w->lname[i], io);
#define _PP_MODEL_BWD(lname, P, fwd, bwd, desc, count) \
    case _pp_kind_##lname: return bwd(&w->lname[i], &g->lname[i], io);
#define _PP_MODEL_DESC(lname, P, fwd, bwd, desc, count) \
    case _pp_kind_##lname: desc(&w->lname[i], mb, in, n_in, d); return;

#if defined(__GNUC__) || defined(__clang__)
#define _PP_UNUSED __attribute__((unused)) /* a program may use only one of the two model_desc */
#else
#define _PP_UNUSED
#endif

/* The entry of layer l and its index inside the entry (*index), or -1. Counts come from m when
   m is a model of this list (NULL, or another model: the list's full counts). */
static inline int _pp_kinds_same(const pp_layer_kind* a, const pp_layer_kind* b, int n) {
    int k;
    if (a == b) return 1;
    if (!a || !b) return 0;
    for (k = 0; k < n; k++) {
        const char *x = a[k].name, *y = b[k].name;
        if (a[k].count != b[k].count || !x || !y) return 0;
        while (*x && *x == *y) x++, y++;
        if (*x != *y) return 0;
    }
    return 1;
}
static inline int _pp_model_locate(const struct pp_model* m, const pp_layer_kind* kinds, int n_kinds, int l, int* index) {
    int k, own = m && m->n_kinds == n_kinds && _pp_kinds_same(m->kinds, kinds, n_kinds);
    if (own && m->order) { /* an explicit order: the kind from it, the index by counting */
        int j, i = 0;
        if (l < 0 || l >= m->n_layers) return -1;
        k = m->order[l];
#ifndef PP_TEST_ORDER_NO_INDEX /* negative control (build/model-controls): every layer index 0 of its kind */
        for (j = 0; j < l; j++) i += m->order[j] == k;
#else
        (void)j;
#endif
        if (k < 0 || k >= n_kinds || i >= kinds[k].count) return -1;
        *index = i;
        return k;
    }
    for (k = 0; k < n_kinds && l >= 0; k++) {
        int n = own && k < PP_MAX_LAYER_KINDS ? m->in_use[k] : kinds[k].count;
        if (n < 0 || n > kinds[k].count) return -1; /* pp_model_check names it */
        if (l < n) {
            *index = l;
            return k;
        }
        l -= n;
    }
    return -1;
}
/* The pp_model of a list at its full counts. */
static inline void _pp_model_init(pp_model* m, const char* name, const pp_layer_kind* kinds, int n_kinds) {
    int k;
    m->name = name;
    m->n_layers = 0;
    m->forward = NULL;
    m->backward = NULL;
    m->describe = NULL;
    m->layer_name = NULL;
    m->weight_grad = NULL;
    m->ctx = NULL;
    m->params = NULL;
    m->order = NULL;
    m->n_kinds = n_kinds;
    m->kinds = kinds;
    for (k = 0; k < PP_MAX_LAYER_KINDS; k++) m->in_use[k] = k < n_kinds ? kinds[k].count : 0;
    for (k = 0; k < n_kinds; k++) m->n_layers += kinds[k].count;
}
/* Entry k uses n layers (0 keeps its count); n_layers follows. */
static inline void _pp_model_use(pp_model* m, int k, int n) {
    if (n == 0) return;
    if (k >= PP_MAX_LAYER_KINDS) {
        m->n_layers = -1; /* pp_model_check: "define PP_MAX_LAYER_KINDS larger" */
        return;
    }
    m->n_layers += n - m->in_use[k];
    m->in_use[k] = n;
}

/* A (w, g, l, io) dispatcher over the list, name_fname: backward, and PP_MODEL_SPLIT's weight_grad. */
#define _PP_MODEL_GRAD_FN(mname, fname, LIST, KIND, ENTRY)                                       \
    static inline int mname##_##fname(const void* w_, void* g_, int l, pp_layer_io* io) {       \
        enum { LIST(KIND) _pp_kinds };                                                          \
        const mname##_model* w = (const mname##_model*)w_;                                        \
        mname##_model* g = (mname##_model*)g_;                                                    \
        int i = 0;                                                                              \
        switch (_pp_model_locate(io->model, mname##_kinds(), _pp_kinds, l, &i)) {                \
            LIST(ENTRY)                                                                         \
        default: break;                                                                         \
        }                                                                                       \
        return -1;                                                                              \
    }

/* The parts PP_MODEL and PP_MODEL_SPLIT share, over the entry macros of their list arity. */
#define _PP_MODEL_COMMON(mname, LIST, FIELD, COUNT, KIND, KINIT, CNT, FWD, BWD, DESC)             \
    typedef struct mname##_model { LIST(FIELD) } mname##_model;                                   \
    typedef struct mname##_counts { LIST(CNT) } mname##_counts;                                   \
    enum { mname##_N_LAYERS = 0 LIST(COUNT) };                                                   \
    static inline const pp_layer_kind* mname##_kinds(void) {                                     \
        static const pp_layer_kind k[] = {LIST(KINIT)};                                          \
        return k;                                                                               \
    }                                                                                           \
    static inline _PP_UNUSED int mname##_n_kinds(void) {                                         \
        enum { LIST(KIND) _pp_kinds };                                                          \
        return _pp_kinds;                                                                       \
    }                                                                                           \
    static inline int mname##_forward(const void* w_, int l, pp_layer_io* io) {                  \
        enum { LIST(KIND) _pp_kinds };                                                          \
        const mname##_model* w = (const mname##_model*)w_;                                        \
        int i = 0;                                                                              \
        switch (_pp_model_locate(io->model, mname##_kinds(), _pp_kinds, l, &i)) {                \
            LIST(FWD)                                                                           \
        default: break;                                                                         \
        }                                                                                       \
        return -1;                                                                              \
    }                                                                                           \
    _PP_MODEL_GRAD_FN(mname, backward, LIST, KIND, BWD)                                          \
    static inline void mname##_describe(const void* w_, int l, const pp_microbatch* mb,          \
                                       const pp_tensor* in, int n_in, pp_layer_desc* d) {       \
        enum { LIST(KIND) _pp_kinds };                                                          \
        const mname##_model* w = (const mname##_model*)w_;                                        \
        int i = 0;                                                                              \
        switch (_pp_model_locate(d->model, mname##_kinds(), _pp_kinds, l, &i)) {                 \
            LIST(DESC)                                                                          \
        default: break;                                                                         \
        }                                                                                       \
    }                                                                                           \
    static inline const char* mname##_layer_name(int l) {                                        \
        enum { LIST(KIND) _pp_kinds };                                                          \
        int i = 0, k = _pp_model_locate(NULL, mname##_kinds(), _pp_kinds, l, &i);                \
        return k >= 0 ? mname##_kinds()[k].name : "?";                                          \
    }

#define _PP_MODEL_DESC_FN(mname, LIST, KIND, USE, ZERO, wgrad)                                   \
    static inline _PP_UNUSED pp_model mname##_model_desc_counts(mname##_counts n) {              \
        enum { LIST(KIND) _pp_kinds };                                                          \
        pp_model m;                                                                             \
        _pp_model_init(&m, #mname, mname##_kinds(), _pp_kinds);                                  \
        m.forward = mname##_forward;                                                             \
        m.backward = mname##_backward;                                                           \
        m.describe = mname##_describe;                                                           \
        m.layer_name = mname##_layer_name;                                                       \
        m.weight_grad = wgrad;                                                                  \
        LIST(USE)                                                                               \
        return m;                                                                               \
    }                                                                                           \
    static inline _PP_UNUSED pp_model mname##_model_desc(void) {                                 \
        mname##_counts n;                                                                       \
        LIST(ZERO)                                                                              \
        return mname##_model_desc_counts(n);                                                     \
    }

#define PP_MODEL(mname, LIST)                                                                    \
    _PP_MODEL_COMMON(mname, LIST, _PP_MODEL_FIELD, _PP_MODEL_COUNT, _PP_MODEL_KIND, _PP_MODEL_KINIT,  \
                     _PP_MODEL_CNT, _PP_MODEL_FWD, _PP_MODEL_BWD, _PP_MODEL_DESC)                \
    _PP_MODEL_DESC_FN(mname, LIST, _PP_MODEL_KIND, _PP_MODEL_USE, _PP_MODEL_ZERO, NULL)

/* PP_MODEL_SPLIT(name, LIST): the same, for layers whose backward comes in two halves. Entries
       X(layer, P, forward, backward, weight_grad, describe, count)
   backward(w, g, io) then writes only io->d_in (the input gradient, on the critical path) and
   weight_grad(w, g, io) adds the parameter gradient into g; it sees the same io as backward
   (in, out, d_out, d_in, saved), and the library keeps all of it alive until weight_grad ran.
   A layer without the split names PP_NO_WGRAD: its backward does both, as under PP_MODEL.
   Generates everything PP_MODEL does plus name_weight_grad, and sets pp_model.weight_grad.
   Every schedule runs either kind of model: without W actions (GPipe, 1F1B, interleaved) the
   library calls weight_grad right after backward. */
static inline int _pp_no_wgrad(const void* w, void* g, pp_layer_io* io) {
    (void)w;
    (void)g;
    (void)io;
    return 0;
}
#define PP_NO_WGRAD _pp_no_wgrad
#define _PP_MODELW_FIELD(lname, P, fwd, bwd, wg, desc, count) P lname[count];
#define _PP_MODELW_COUNT(lname, P, fwd, bwd, wg, desc, count) + (count)
#define _PP_MODELW_KIND(lname, P, fwd, bwd, wg, desc, count) _pp_kind_##lname,
#define _PP_MODELW_KINIT(lname, P, fwd, bwd, wg, desc, count) _PP_MODEL_KINIT(lname, P, fwd, bwd, desc, count)
#define _PP_MODELW_CNT(lname, P, fwd, bwd, wg, desc, count) int lname;
#define _PP_MODELW_USE(lname, P, fwd, bwd, wg, desc, count) _PP_MODEL_USE(lname, P, fwd, bwd, desc, count)
#define _PP_MODELW_ZERO(lname, P, fwd, bwd, wg, desc, count) n.lname = 0;
#define _PP_MODELW_FWD(lname, P, fwd, bwd, wg, desc, count) _PP_MODEL_FWD(lname, P, fwd, bwd, desc, count)
#define _PP_MODELW_BWD(lname, P, fwd, bwd, wg, desc, count) _PP_MODEL_BWD(lname, P, fwd, bwd, desc, count)
#define _PP_MODELW_WG(lname, P, fwd, bwd, wg, desc, count) _PP_MODEL_BWD(lname, P, fwd, wg, desc, count)
#define _PP_MODELW_DESC(lname, P, fwd, bwd, wg, desc, count) _PP_MODEL_DESC(lname, P, fwd, bwd, desc, count)

#define PP_MODEL_SPLIT(mname, LIST)                                                              \
    _PP_MODEL_COMMON(mname, LIST, _PP_MODELW_FIELD, _PP_MODELW_COUNT, _PP_MODELW_KIND, _PP_MODELW_KINIT, \
                     _PP_MODELW_CNT, _PP_MODELW_FWD, _PP_MODELW_BWD, _PP_MODELW_DESC)            \
    _PP_MODEL_GRAD_FN(mname, weight_grad, LIST, _PP_MODELW_KIND, _PP_MODELW_WG)                  \
    _PP_MODEL_DESC_FN(mname, LIST, _PP_MODELW_KIND, _PP_MODELW_USE, _PP_MODELW_ZERO, mname##_weight_grad)

/* PP_MODEL_PARAMS(name, PLIST): the pp_model.params hook of a PP_MODEL or PP_MODEL_SPLIT model
   `name`, from one function per layer kind that has parameters. PLIST's entries are
       X(layer, fn)      int fn(const P* w, pp_param* out, int cap)
   fn fills out[0 .. min(n, cap)) with the layer's n buffers (pp_param_of) and returns n; a kind
   not in PLIST has none (a loss layer). Generates name_params; set it yourself:
       #define MLP_PARAMS(X) X(dense, dense_param_list)
       PP_MODEL_PARAMS(mlp, MLP_PARAMS)
       pp_model m = mlp_model_desc(); m.params = mlp_params;
   Kinds are matched by name, so PLIST may list them in any order; a layer name that is not in
   the model's list is a compile error (name_model has no such field). */
static inline int _pp_name_is(const char* a, const char* b) {
    if (!a || !b) return 0;
    while (*a && *a == *b) a++, b++;
    return *a == *b;
}
#define _PP_MODEL_PARAMS_CASE(lname, fn) \
    if (_pp_name_is(kind, #lname)) return fn(&w->lname[i], out, cap);
#define PP_MODEL_PARAMS(mname, PLIST)                                                             \
    static inline _PP_UNUSED int mname##_params(const pp_model* m, const void* w_, int l, pp_param* out, int cap) { \
        const mname##_model* w = (const mname##_model*)w_;                                       \
        int i = 0, k = _pp_model_locate(m, mname##_kinds(), mname##_n_kinds(), l, &i);            \
        const char* kind;                                                                       \
        if (k < 0) return -1;                                                                   \
        kind = mname##_kinds()[k].name;                                                         \
        PLIST(_PP_MODEL_PARAMS_CASE)                                                            \
        return 0;                                                                               \
    }

/* Describe functions for the two commonest layers, defined as static functions named fn over
   parameter struct P (what X(..., describe, ...) names):
       PP_DESCRIBE_SAME(tanh_desc, tanh_p)   one output shaped as the first input (elementwise)
       PP_DESCRIBE_LOSS(xent_desc, xent_p)   a loss layer: no outputs
   Neither keeps scratch or counts parameters; write your own where a layer does. */
#define PP_DESCRIBE_SAME(fn, P)                                                                    \
    static void fn(const P* w, const pp_microbatch* mb, const pp_tensor* in, int n_in, pp_layer_desc* d) { \
        (void)w;                                                                                   \
        (void)mb;                                                                                  \
        d->n_out = n_in > 0 ? 1 : 0;                                                               \
        if (n_in > 0) d->out[0] = in[0], d->out[0].data = NULL;                                    \
    }
#define PP_DESCRIBE_LOSS(fn, P)                                                                    \
    static void fn(const P* w, const pp_microbatch* mb, const pp_tensor* in, int n_in, pp_layer_desc* d) { \
        (void)w;                                                                                   \
        (void)mb;                                                                                  \
        (void)in;                                                                                  \
        (void)n_in;                                                                                \
        d->n_out = 0;                                                                              \
    }

/* PP_MODEL_ORDER(name, OLIST): the layers of a PP_MODEL or PP_MODEL_SPLIT model `name` in any
   order of its kinds. OLIST's entries are X(layer), one per layer in use, first to last:
       #define NET_LAYERS(X)                                         \
           X(dense, dense_params, dense_fwd, dense_bwd, dense_desc, 4) \
           X(tanh,  tanh_params,  tanh_fwd,  tanh_bwd,  tanh_desc,  3) \
           X(xent,  xent_params,  xent_fwd,  xent_bwd,  xent_desc,  1)
       PP_MODEL(net, NET_LAYERS)
       #define NET_ORDER(X) X(dense) X(tanh) X(dense) X(tanh) X(dense) X(tanh) X(dense) X(xent)
       PP_MODEL_ORDER(net, NET_ORDER)     // net_model_desc_order(): 8 layers in that order
   The k-th layer of a kind in OLIST is element k of that kind's array in name_model (the second
   dense is w.dense[1]); a kind may appear up to its count times. A name not in the list is a
   compile error. Layers are numbered in OLIST's order by everything: partitions, schedules,
   pp_grad_buf.layer, checkpoints (a checkpoint names each layer's kind; the file format is the
   same). Without PP_MODEL_ORDER the order is the list's, as before. */
#ifdef PP_TEST_ORDER_LIST_ORDER /* negative control (build/model-controls): the order ignored */
#define _PP_MODEL_ORDER_SET(m, o) (void)(o)
#else
#define _PP_MODEL_ORDER_SET(m, o) (m).order = (o)
#endif
#define _PP_MODEL_ORDER_ID(lname) (int)(offsetof(_pp_cnt, lname) / sizeof(int)),
#define _PP_MODEL_ORDER_N(lname) +1
#define PP_MODEL_ORDER(mname, OLIST)                                                               \
    static inline _PP_UNUSED pp_model mname##_model_desc_order(void) {                            \
        typedef mname##_counts _pp_cnt; /* one int per kind, in list order: offset / int = kind */ \
        static const int order[] = {OLIST(_PP_MODEL_ORDER_ID)};                                   \
        pp_model m = mname##_model_desc();                                                        \
        int l, k;                                                                                 \
        for (k = 0; k < m.n_kinds && k < PP_MAX_LAYER_KINDS; k++) m.in_use[k] = 0;                \
        m.n_layers = 0 OLIST(_PP_MODEL_ORDER_N);                                                  \
        for (l = 0; l < m.n_layers; l++)                                                          \
            if (order[l] < PP_MAX_LAYER_KINDS) m.in_use[order[l]]++;                              \
        _PP_MODEL_ORDER_SET(m, order);                                                            \
        return m;                                                                                 \
    }

/* Checks a pp_model: non-NULL callbacks, n_layers > 0, and with PP_MODEL's fields, every entry's
   layers in use within its count and adding up to n_layers. */
pp_result pp_model_check(const pp_model* m, pp_error* err);
/* Name of layer l, numbered over the layers in use (pp_model.layer_name numbers the full list). */
const char* pp_model_layer_name(const pp_model* m, int l);

/* Per-layer cost and parameter count from describe(), for a sample micro-batch of `rows` rows
   whose input is `input` (data may be NULL). Either output array may be NULL. weights is the
   model struct (describe reads its sizes); the arrays it points to may be unallocated. */
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
    PP_PARTITION_EXPLICIT,      /* the caller's boundaries, checked */
    PP_PARTITION_WEIGHTS        /* minimise the heaviest stage by the caller's per-layer weight[]
                                   (measured: pp_profile_layers), as pp_partition_balanced */
} pp_partition_policy;

pp_result pp_partition_uniform(int n_layers, int n_stages, int* first, pp_error* err);
/* Contiguous split minimising the maximum stage weight (exact, O(S*L)). */
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
    const double* weight;       /* PP_PARTITION_WEIGHTS: one weight per layer */
    /* Optional with COST, PARAMS and WEIGHTS: mem (one entry per layer) and mem_cap > 0 keep
       every stage's sum(mem) <= mem_cap, as pp_partition_capped (PP_ERR_SIZE if none fits). */
    const double* mem;
    double mem_cap;
    /* Optional with COST, PARAMS and WEIGHTS: the schedule the stages run on. Where it gives a
       rank several stages (interleaved, the V kinds), the split then balances the ranks' sums
       first (each rank runs all its stages' work every step), then the largest stage: every split
       where there are at most 1e5, else boundaries moved from the min-max split while that lowers
       the largest rank's sum (never above the min-max split's). pp_pipeline_create sets it. */
    const struct pp_schedule* schedule;
} pp_partition_desc;

/* Partition a model by a policy: the one entry point for a model (pp_pipeline_desc.partition runs
   it); the array functions above are what it calls. *imbalance (may be NULL) is reported on the
   policy's weight. UNIFORM, EXPLICIT and WEIGHTS ignore weights (NULL is fine); COST and PARAMS
   call describe, so they need the model struct, though not its arrays: partition before
   allocating them. Every array the desc points to is read during the call only. */
pp_result pp_partition_model(const pp_model* m, const void* weights, const pp_partition_desc* d,
                             int* first, double* imbalance, pp_error* err);

/* Min-max split under a memory cap: minimise the largest stage weight among the contiguous
   partitions whose every stage has sum(mem) <= mem_cap (mem: e.g. a layer's parameters plus the
   activations the schedule keeps of it). Exact, O(S*L^2) time, O(S*L) scratch. PP_ERR_SIZE when
   no partition fits (the message says which layer or stage count is the obstacle). */
pp_result pp_partition_capped(const double* weight, const double* mem, double mem_cap, int n_layers, int n_stages,
                              int* first, pp_error* err);

/* Print the partition, one line per stage: layers, names, weight. */
void pp_partition_print(FILE* f, const pp_model* m, const int* first, int n_stages,
                        const double* weight);

/* >>schedule ---------------------------------------------------------------------------------- */
typedef enum pp_schedule_kind {
    PP_SCHED_GPIPE = 0,         /* all forwards, then all backwards */
    PP_SCHED_1F1B,              /* warm-up forwards, then one forward one backward */
    PP_SCHED_INTERLEAVED,       /* 1F1B over v chunks per rank, stage s on rank s % p */
    PP_SCHED_ZB_H1,             /* zero bubble H1: 1F1B's memory, W deferred into the bubble */
    PP_SCHED_ZB_V,              /* zero bubble V: v = 2, rank r holds stages r and 2p-1-r */
    PP_SCHED_ZB_H2,             /* zero bubble H2: v = 1, twice 1F1B's memory, W fills the bubble */
    PP_SCHED_V_HALF,            /* V map, v = 2, half of 1F1B's activation memory (+ one stage) */
    PP_SCHED_V_MIN,             /* V map, v = 2, a third of 1F1B's activation memory (+ one stage) */
    PP_SCHED_INTERLEAVED_MEM,   /* interleaved whose peak for any m is at most the next multiple of p's */
    PP_SCHED_DUALPIPE_V,        /* DeepSeek's DualPipeV: V map, F&B pairs back to back, 2p + 1 chunks */
    PP_SCHED_KIND_COUNT,
    PP_SCHED_CUSTOM = 100       /* parsed from a text table (pp_schedule_parse) */
} pp_schedule_kind;

/* Which rank holds which stage. LOOP: stage s is chunk s / p of rank s % p (GPipe, 1F1B,
   interleaved, interleaved-mem, ZB-H1, ZB-H2). V (ZB-V, V-Half, V-Min, DualPipeV): rank r holds
   stage r as chunk 0 and stage 2p-1-r as chunk 1, so the first and the last stage (embedding and
   loss) share rank 0 and the turn of the V crosses no link: rank p-1 hands stage p-1's output to
   stage p (and the gradient back) in its own blocks, no message and no copy (>>impl-stage). */
typedef enum pp_stage_map { PP_MAP_LOOP = 0, PP_MAP_V = 1 } pp_stage_map;

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
    int per_rank;               /* actions per rank: 2*m*v, or 3*m*v with W actions */
    pp_action* actions;         /* rank r's list is actions[r*per_rank .. (r+1)*per_rank) */
    pp_stage_map map;           /* stage -> rank; zero (LOOP) for every kind but ZB-V */
    /* 0 (what pp_schedule_make and a table without order= give): every stage runs its B's, and
       its W's, in ascending micro-batch order, so its weight gradients add up in the order of
       pp_sequential_step (bit-identical); pp_schedule_parse and pp_stage_create refuse a list
       that does not (PP_ERR_SCHEDULE naming the stage and the two micro-batches). 1 (a table's
       order=any): such a list runs, its gradients equal the reference's only to rounding. */
    int any_order;
    /* 0: a training list (every (micro-batch, stage) has its F and its B, and its W where the
       lists have W's). 1: a forward-only list (evaluation): an F for every (micro-batch, stage)
       and nothing else, per_rank = m*v; pp_schedule_make_eval makes one from a training list and
       pp_stage_eval runs it (pp_stage_create makes its own). A table's header says eval=1. */
    int forward_only;
} pp_schedule;

typedef struct pp_sim_cost pp_sim_cost; /* the cost model (>>sim) */

const char* pp_schedule_name(pp_schedule_kind k);                 /* "gpipe", "1f1b", ... */
pp_result pp_schedule_kind_parse(const char* s, pp_schedule_kind* k);
/* The chunks per rank (v) a kind runs with: 2 for the V-shaped kinds (zb-v, v-half, v-min,
   dualpipev), `v` (at least 1) for interleaved and interleaved-mem, 1 for the rest. */
int pp_schedule_kind_v(pp_schedule_kind k, int v);
/* Number of pp_action the caller must provide for (kind, p, v, m); 0 if invalid. */
size_t pp_schedule_size(pp_schedule_kind k, int p, int v, int m);
/* Generate every rank's list into out[cap]. GPipe, 1F1B, ZB-H1 and ZB-H2 need v == 1;
   interleaved and interleaved-mem v >= 2; ZB-V, V-Half, V-Min and DualPipeV v == 2 (any m >= 1 for
   all). The zero-bubble kinds (ZB-H1, ZB-H2, ZB-V, V-Half, V-Min, DualPipeV) have W actions
   (3*m*v per rank). Every stage runs its F, B and W actions in ascending micro-batch order.
   Fills *s, whose actions point into out.
   Interleaved keeps its bubble formula (p-1)/(v m + p-1) for every m >= p, but when p does not
   divide m it stashes more than at the next multiple of p (p=8, v=4: 60 chunks at m=15, 39 at
   m=16). Interleaved-mem never does (on its busiest rank): the same lists where their peak fits,
   else the lists of the next multiple m' with m'-m micro-batches left out (spread over the
   groups; no scratch), and with pp_schedule_make_cost the shorter of those and lists played out
   in time for the costs as the zero-bubble kinds' are (usually interleaved's bubble; scratch from
   PP_MALLOC; like theirs, such lists are not proven against NCCL's rendezvous here, which
   pp_stage_create on NCCL checks).
   DualPipeV (DeepSeek-V3's DualPipe cut in half onto the V map) is its reference order for
   m >= 2p: each overlapped F&B pair runs as an F and a B back to back (the B's W right behind
   it, as DualPipe does outside its zero-bubble phases); below m = 2p, where DualPipe has no
   order, it is list-scheduled under the same memory.
   pp_schedule_make generates for unit costs (F = B = W = 1 per chunk, comm 0); its ZB-V is
   generated for them (the greedy unit-cost list of earlier versions is one candidate). */
pp_result pp_schedule_make(pp_schedule_kind k, int p, int v, int m, pp_action* out, size_t cap,
                           pp_schedule* s, pp_error* err);
/* The same for a cost model (pp_sim_cost: per-chunk f, b, w and comm, or per-stage arrays, as
   pp_simulate reads them; NULL is unit costs). ZB-H2, ZB-V, V-Half and V-Min are generated for
   these costs: several list-scheduling variants are played out in time and pp_simulate picks the
   shortest under the kind's stash cap (pp_schedule_stash_cap); so is interleaved-mem (cost not
   NULL) where p does not divide m and interleaved's lists do not fit its cap; DualPipeV's
   reference order is polished for them (adjacent swaps pp_simulate accepts, under its cap); the
   other kinds are fixed patterns and ignore the costs. With cost NULL (what pp_schedule_make
   does) the costs are F = B = W = 1, and DualPipeV (m >= 2p) is the reference order itself.
   Takes scratch from PP_MALLOC and frees it before returning. */
pp_result pp_schedule_make_cost(pp_schedule_kind k, int p, int v, int m, const pp_sim_cost* cost, pp_action* out,
                                size_t cap, pp_schedule* s, pp_error* err);
/* The most activations (F done, B or W not yet; in chunks) a rank of kind k stashes at once:
   GPipe m; 1F1B and ZB-H1 min(p, m); ZB-H2 2 min(p, m); ZB-V 2 min(p, m) chunks (a chunk is half
   a stage: 1F1B's memory); V-Half min(p, m) + 2 chunks (half of it, + 2); V-Min
   2 floor((min(p, m) + 1) / 3) + 2 (a third, rounded to whole stages, + 2: the peak of the
   authors' V-Min lists, Qi et al., at every p run, 1 to 10, 12 and 16, m >= p; 4 at p = 2 to 4,
   8 at p = 8); DualPipeV min(2p + 1, 2m) (1F1B's and one chunk: DualPipe's PP + 1);
   interleaved-mem min(2(p-1) + (v-1)p + 1, v m'), m' the next multiple of p >= m
   (interleaved's peak at m'). 0 for interleaved (no fixed cap: see pp_simulate's peak_live) and
   invalid input. */
int pp_schedule_stash_cap(pp_schedule_kind k, int p, int v, int m);
/* stage -> (rank, chunk): the rank that runs a global stage under this schedule's mapping, and
   which of its chunks it is (rank or chunk may be NULL). Was pp_schedule_stage_rank. */
void pp_schedule_stage_to_rank(const pp_schedule* s, int stage, int* rank, int* chunk);
/* (rank, chunk) -> global stage, or -1 when the rank has no such chunk. Was pp_schedule_stage. */
int pp_schedule_rank_to_stage(const pp_schedule* s, int rank, int chunk);
/* The rank that owns `layer` when the layers are split into stages by `first` (a partition of
   s->n_stages stages), or -1: e.g. the two ranks of a tied embedding and head. */
int pp_schedule_layer_rank(const pp_schedule* s, const int* first, int layer);
/* Rank r's list. */
const pp_action* pp_schedule_rank(const pp_schedule* s, int rank);
/* Forward-only lists (evaluation). From a training schedule s (any kind, a table too), every
   rank's list of F actions alone, on the same stage map (each stage runs on the rank, and as the
   chunk, it trains on), into out[cap] (cap >= pp_schedule_eval_size(s) = p*v*m); fills *eval
   (kind, p, v, m, map of s; forward_only = 1) and proves it with pp_simulate. The lists are
   played out in time for unit costs: at every tick each rank runs, of its F's whose input is
   there, the one of its highest chunk, so a stage fed by its own rank (the turn of the V map;
   every boundary at p = 1) runs right after the F that feeds it, and a rank drains what is in
   flight before it takes in more: it holds at most two stashes at once, and one where no stage of
   the rank feeds another (pp_simulate's peak_live). Each stage runs its F's in ascending
   micro-batch order. Takes scratch from PP_MALLOC. */
size_t pp_schedule_eval_size(const pp_schedule* s);
pp_result pp_schedule_make_eval(const pp_schedule* s, pp_action* out, size_t cap, pp_schedule* eval, pp_error* err);
/* 1 if the schedule has W actions (weight gradients deferred from B). */
int pp_schedule_has_w(const pp_schedule* s);

/* Schedules as text. A table is comment lines (# to the end of a line), a header line, and one
   line per rank in rank order:
       # my hand-tuned schedule
       schedule p=2 v=1 m=2 map=loop
       r0: F0 F1 B0 W0 B1 W1
       r1: F0 B0 F1 B1 W0 W1
   Keys: p, v, m (required), map = loop | v (default loop), order = mb | any (default mb),
   eval = 0 | 1 (default 0; 1: a forward-only list, F actions only, m*v per rank). An
   action is F, B or W, the micro-batch, and optionally .chunk (default 0): F3.1 is the forward
   of micro-batch 3 on the rank's chunk 1. W actions are optional, but all or none. The stage of
   (rank, chunk) comes from the map, the send/receive peers from the stages.
   The ordering rule: a layer adds its weight gradients into grads in its B (or W), so each
   stage must run its B's, and its W's, in ascending micro-batch order (F's may go in any order)
   for the gradients to be bit-identical to pp_sequential_step's, which adds micro-batch 0, 1,
   ... m-1. A table that breaks it (r0: F0 F1 B1 B0) is refused with PP_ERR_SCHEDULE naming the
   stage and the two micro-batches, unless its header says order=any (pp_schedule.any_order).
   pp_schedule_parse reads len bytes of text (no terminator needed), checks the syntax (errors
   name line and column), every action's rank and range, each rank's action count (2 m v, or
   3 m v with W, or m v with eval=1; the same on every rank: PP_ERR_SCHEDULE, as a missing
   action), then proves the whole table with pp_simulate (coverage, order, deadlock; the message
   names rank and action) and checks the ordering rule. *need receives the
   number of actions (may be NULL); with out NULL or cap < *need it returns PP_ERR_SIZE having
   checked the syntax only, so: call once with out NULL, allocate, call again. On success *s
   describes the table (kind PP_SCHED_CUSTOM) and points into out. Takes scratch from PP_MALLOC
   (the simulator's), frees it before returning. */
pp_result pp_schedule_parse(const char* text, size_t len, pp_action* out, size_t cap, size_t* need,
                            pp_schedule* s, pp_error* err);
/* Writes s as a table pp_schedule_parse reads back (header, then one line per rank). */
void pp_schedule_write(FILE* f, const pp_schedule* s);

/* >>sim --------------------------------------------------------------------------------------- */
/* Cost model. Times in arbitrary units. f/b/w: per action of one chunk (0 counts as 1 for f,
   2 for b, 0 for w); per-stage arrays override them where non-NULL; comm is added to every
   transfer between two ranks. b is the input gradient and w the weight gradient: a schedule
   without W actions does both in its B, which then costs b + w. */
struct pp_sim_cost {
    double f, b, w, comm;
    const double* f_stage;      /* n_stages entries or NULL */
    const double* b_stage;
    const double* w_stage;
    /* Memory with a W share: the fraction of a stash its B frees (0 .. 1; 0, the default, keeps
       it whole until W). W needs only what the weight gradient reads (the layer's input and its
       output gradient); the rest of a layer's saved bytes can go at B. Per stage where non-NULL.
       The executor frees the same way what a layer declares as B-only scratch
       (pp_layer_desc.b_saved_bytes): with b_free per stage set to that scratch's share of the
       stash's bytes, pp_step_stats.peak_mem equals peak_mem here. */
    double b_free;
    const double* b_free_stage;
    /* Recomputation (pp_stage_desc.recompute): r_f, the time of the forward a stage runs again
       before each B (its B costs b + r_f), and r_mem, the share of a stash it drops (0 .. 1): a
       stash counts 1 during its F, 1 - r_mem from then until the recompute at the start of its B,
       then 1 again until its B (or W) frees it. Per stage where non-NULL. With r_mem per stage the
       recompute blocks' share of the stash's bytes (their second copies of kept outputs left out),
       and b_free counting the recomputed layers' b_saved_bytes too (B frees them, with the rest of
       the B-only scratch), pp_step_stats.peak_mem equals peak_mem here. */
    double r_f, r_mem;
    const double* r_f_stage;
    const double* r_mem_stage;
    /* The size of one stash of each stage (NULL: 1, every stash alike): peak_mem is then in these
       units, e.g. bytes, where stages keep different amounts (pp_plan_recompute sets it). */
    const double* mem_stage;
    /* Boundaries split across a TP group (pp_stage_desc.tp): with tp > 1 a transfer between ranks
       costs comm / tp (each TP rank's slice; comm is the whole tensor's) plus tp_gather, the
       receiving TP group's all-gather of the slices. tp 0 or 1: comm alone. */
    int tp;
    double tp_gather;
};

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
    int peak_live[PP_MAX_RANKS];/* peak stashed activations (F done, B, or W if any, not yet) */
    int deadlock;               /* 1 if the lists cannot all complete */
    char report[1024];          /* deadlock: who waits for whom; else empty */
    double peak_mem[PP_MAX_RANKS]; /* peak stash memory, in stashes, with the W share (cost b_free):
                                  peak_live when b_free is 0 */
} pp_sim_result;

/* Run all ranks' lists against the cost model. Also checks that every (micro-batch, stage)
   has exactly one F and one B, on the right rank, B after F. Returns PP_ERR_SCHEDULE for a
   malformed list, PP_ERR_DEADLOCK (with res->report) when ranks wait on each other forever.
   A forward-only list (pp_schedule.forward_only) must have exactly one F per (micro-batch,
   stage) and nothing else; its stash lives for its F, or until the next stage's F where that
   stage is on the same rank (it reads its input in place): peak_live counts that.
   events (may be NULL) receives p*per_rank entries in rank-major order; after a deadlock the
   actions that never ran have start = end = -1. */
pp_result pp_simulate(const pp_schedule* s, const pp_sim_cost* cost, pp_sim_result* res,
                      pp_event* events, pp_error* err);

/* Planning: the schedule, the partition and the layers to recompute (pp_stage_desc.recompute),
   chosen together for the shortest simulated step under a cap on each rank's activation memory.
   A layer's cost for one micro-batch: f, b, w its forward, input gradient and weight gradient
   times; mem the bytes a stash keeps of it (its output and its scratch, saved_bytes and
   b_saved_bytes), out the part of mem that is its output (the next layer's input), bonly the
   part only B reads (b_saved_bytes: where W is deferred, B frees it; 0 by default). Recomputing
   it drops mem - out, and its output too where the next layer is recomputed as well; its B takes
   f more. */
typedef struct pp_layer_cost {
    double f, b, w, mem, out;
    double bonly;
} pp_layer_cost;

typedef struct pp_plan_desc {
    const pp_layer_cost* layers;
    int n_layers;
    int p, m;
    double comm;                /* added to every transfer between ranks */
    int tp;                     /* boundaries split over tp ranks: as pp_sim_cost.tp, tp_gather */
    double tp_gather;
    double mem_cap;             /* most stash bytes a rank may hold at once (0: no cap) */
    /* The kinds to try, with their v (NULL: every built-in kind, interleaved and interleaved-mem
       at v = 2 and 4); n_kinds entries each. */
    const pp_schedule_kind* kinds;
    const int* kinds_v;
    int n_kinds;
    int no_recompute;           /* 1: choose the schedule alone (nothing recomputed) */
} pp_plan_desc;

typedef struct pp_plan {
    pp_schedule_kind kind;
    int v;
    int fits;                   /* peak_mem <= mem_cap (1 without a cap) */
    int n_recompute;            /* layers recomputed */
    double makespan, bubble;    /* simulated, in the costs' units */
    double peak_mem;            /* the largest rank's peak stash bytes (pp_simulate's peak_mem) */
    int tried;                  /* pp_plan_recompute: plans simulated */
} pp_plan;

/* One plan: kind at v, recompute (n_layers flags; NULL: none), the layers split by
   pp_partition_balanced on each layer's time (f + b + w, and f again where recomputed) into
   first[p*v + 1] (may be NULL), the list generated for the stages' costs
   (pp_schedule_make_cost), simulated with their memory (pp_sim_cost.mem_stage, r_mem, r_f, and
   b_free from bonly; a stage's input counts where the previous stage is on another rank).
   Scratch from PP_MALLOC. */
pp_result pp_plan_try(const pp_plan_desc* d, pp_schedule_kind kind, int v, const unsigned char* recompute,
                      pp_plan* out, int* first, pp_error* err);
/* The best plan: for every kind, nothing recomputed, every layer, every other layer, and the
   greedy plan that recomputes, one at a time, the layer of the rank over the cap whose memory
   saved per unit of time added is largest, until it fits; of those that fit the cap, the
   shortest step (then the least memory), else the least memory. Fills out, first (p * v + 1
   entries for the largest v tried: p*4 + 1 with the built-in list) and recompute (n_layers
   flags). No plan fits: PP_OK with out->fits 0 (the plan of least memory). */
pp_result pp_plan_recompute(const pp_plan_desc* d, pp_plan* out, int* first, unsigned char* recompute, pp_error* err);

/* >>trace ------------------------------------------------------------------------------------- */
/* ASCII timeline, one row per rank, `width` columns (0 = 100) spanning the makespan. */
void pp_timeline_ascii(FILE* f, const pp_event* ev, size_t n, int p, int width);
/* Chrome trace JSON (chrome://tracing, ui.perfetto.dev): one track per rank.
   time_scale converts event times to microseconds (1e6 for seconds, e.g. 1000 for sim units). */
void pp_timeline_chrome(FILE* f, const pp_event* ev, size_t n, double time_scale);

/* >>flight ------------------------------------------------------------------------------------ */
/* A flight record: the last PP_FLIGHT_LEN things one rank's executor did, with timestamps, so a
   hang or a failure can say what every rank was doing. A stage always keeps its own record
   (pp_stage_flight); a transport that sees every rank (threads) keeps all of them, and a timeout
   message then names the last action each rank completed. A multi-process transport leaves
   flight_note/flight_get NULL: the message names this rank's last action and what it last heard
   from the peer (decoded from the last message that peer sent it). */
#ifndef PP_FLIGHT_LEN
#define PP_FLIGHT_LEN 32
#endif

typedef enum pp_flight_state {
    PP_FLIGHT_START = 0,        /* the action began (its receives are awaited) */
    PP_FLIGHT_DONE,             /* the action completed */
    PP_FLIGHT_FAILED,           /* the action returned an error */
    PP_FLIGHT_HEARD             /* a message arrived from `peer`: a is the peer's action that sent it */
} pp_flight_state;

typedef struct pp_flight_entry {
    pp_action a;
    int8_t state;               /* pp_flight_state */
    int16_t peer;               /* HEARD: the sender; START: the rank awaited (-1 none) */
    int32_t step;               /* this rank's step count (1 = first pp_stage_step) */
    double t;                   /* seconds, monotonic clock */
} pp_flight_entry;

typedef struct pp_flight {
    int rank;
    uint64_t n;                 /* entries ever written; entry i is ring[i % PP_FLIGHT_LEN] */
    pp_flight_entry ring[PP_FLIGHT_LEN];
    pp_flight_entry heard[2];   /* last message from the previous [0] / next [1] stage's rank */
    double now;                 /* when this copy was taken (ages are printed against it) */
} pp_flight;

/* The most recent entry in `state` (or any state when state < 0); NULL if none. */
const pp_flight_entry* pp_flight_last(const pp_flight* f, int state);
/* One line per entry, oldest first, with ages in seconds; then what was last heard.
   pp_flight_print_fd writes the same to a file descriptor with write(2), taking no lock and
   allocating nothing: it is async-signal-safe. pp_flight_print goes through stdio, which is not. */
void pp_flight_print(FILE* out, const pp_flight* f);
void pp_flight_print_fd(int fd, const pp_flight* f);

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
    /* Withdraw a receive that will never be waited for (after a failed step), so no stale
       posting can swallow a later message. May be NULL. */
    pp_result (*cancel)(void* self, pp_request* req);
    /* Flight record (>>flight). May be NULL. note: append one entry to this rank's record.
       get: copy rank `peer`'s record into *out; returns 0 where the transport cannot see it. */
    void (*flight_note)(void* self, const pp_flight_entry* e);
    int (*flight_get)(void* self, int peer, pp_flight* out);
    /* After an abort: why (the failing rank's message) into buf; 0 when not aborted or not
       known. Lets a rank that learns of the abort from a send, which carries no message, say
       the root cause. May be NULL. */
    int (*abort_reason)(void* self, char* buf, size_t n);
    /* Proves the schedule can run over this transport (pp_stage_create calls it after
       pp_simulate): pipeline_nccl.h refuses a message order NCCL cannot match and a call order
       that would wait in a cycle under rendezvous sends. May be NULL. */
    pp_result (*check_schedule)(void* self, const pp_schedule* s, pp_error* err);
    /* 1 when abort reaches only this process (pipeline_nccl.h: ncclCommAbort), so a peer waiting
       for this rank would wait until its deadline. A stage whose layer fails then drains the
       step instead of aborting: it runs the rest of its list without computing, sends zeros
       where it would have sent results, and every rank learns of the failure at the step's
       end, with the transport intact (docs/errors.md). */
    int abort_local;
    /* A block of the stage's pool, [ptr, ptr + bytes), is free again: every use of it the stage
       made (its layers' reads and writes, enqueued on their stream, and its sends, done) came
       before this call; bytes 0: the block left the pool or its sends may not be done (the
       transport forgets it); ptr NULL: forget every block (after a failed step). A receive
       later posted into a free block needs nothing ordered after those uses but what the
       transport already ordered: until then the stage enqueues nothing on the bytes it receives
       into (pipeline_nccl.h then skips a stream wait). May be NULL. */
    void (*released)(void* self, const void* ptr, size_t bytes);
    /* Optional: starts what allreduce_sum does (the same bits), completed by wait (req); buf
       stays untouched until then. PP_ERR_UNSUPPORTED where it cannot (a dtype, a group other
       than the whole transport, an ordered sum): the caller then calls allreduce_sum. Every rank
       of the group starts its collectives in the same order. pp_dp_overlap starts its buckets
       with it from the gradients-final hook (pipeline_mpi.h: MPI_Iallreduce; pipeline_nccl.h:
       ncclAllReduce on the transport's own stream after the compute stream). May be NULL. */
    pp_result (*iallreduce_sum)(void* self, void* buf, size_t count, pp_dtype dtype, const int* ranks, int n_ranks,
                                pp_request* req);
} pp_transport;

/* >>threads ----------------------------------------------------------------------------------- */
typedef struct pp_threads pp_threads;

pp_result pp_threads_create(int n_ranks, pp_threads** out, pp_error* err);
void pp_threads_destroy(pp_threads* t);
pp_transport pp_threads_transport(pp_threads* t, int rank);
/* Clears an abort so the world can be used for another step. */
void pp_threads_reset(pp_threads* t);
/* Messages and posted receives still queued in every mailbox (0 between clean steps). */
size_t pp_threads_pending(pp_threads* t);
/* Rank's flight record, or every rank's printed, on demand: from a watchdog thread, or from a
   signal handler with pp_threads_flight_print_fd (async-signal-safe: no lock, no allocation, no
   stdio, write(2) only; it may run while the interrupted thread is writing its record, and then
   skips the entry being written). pp_threads_flight and pp_threads_flight_print take no lock
   either, but stdio makes the _print one unsafe in a handler. */
pp_result pp_threads_flight(pp_threads* t, int rank, pp_flight* out);
void pp_threads_flight_print(FILE* out, pp_threads* t);
void pp_threads_flight_print_fd(int fd, pp_threads* t);

/* Runs fn(rank, user) on n threads and joins them; returns the first non-OK result. A plain
   thread runner: it knows no pp_threads world (pass yours through user); pp_pipeline_create
   does all of this for you. */
typedef pp_result (*pp_rank_fn)(int rank, void* user);
pp_result pp_threads_run(int n, pp_rank_fn fn, void* user, pp_error* err);

/* >>batch ------------------------------------------------------------------------------------- */
typedef enum pp_loss_reduction {
    PP_LOSS_MEAN_MICROBATCH = 0,    /* step loss = mean of micro-batch losses (scale 1/m) */
    PP_LOSS_MEAN_ROWS               /* weighted by rows: scale rows_mb / rows_total */
} pp_loss_reduction;

/* How a packed batch (cu_seqlens) is cut into micro-batches of whole, contiguous sequences.
   Without cu_seqlens the rows are split evenly whatever the policy. */
typedef enum pp_split_policy {
    PP_SPLIT_SEQS = 0,              /* equal sequence counts (Megatron's way) */
    PP_SPLIT_TOKENS,                /* minimise the largest micro-batch's token count */
    PP_SPLIT_COST                   /* minimise the largest a*tokens + b*sum(len^2) (attention) */
} pp_split_policy;

/* One step's global batch. Ranks that do not own the first stage may leave input.data NULL
   (the shape must still be set, except under PP_SHAPES_BROADCAST); ranks without the last
   stage may leave targets NULL.
   Packed sequences: cu_seqlens[0] = 0, strictly increasing (no empty sequence: a micro-batch
   of zero tokens is rejected, never sent), cu_seqlens[n_seqs] = input.rows, n_seqs >= m. */
typedef struct pp_batch {
    int m;                          /* micro-batches */
    pp_tensor input;                /* [rows, cols] */
    const void* targets;            /* row-major, target_row_bytes per row */
    size_t target_row_bytes;
    const int32_t* cu_seqlens;      /* optional packed layout: n_seqs+1 entries, last == rows */
    int n_seqs;
    pp_loss_reduction loss;
    pp_split_policy split;
    double split_a, split_b;        /* PP_SPLIT_COST weights; both 0 means a = 1, b = 1/64 */
    /* Multiplies every micro-batch's loss_scale, the factor the loss layer scales its gradient
       by, and not the step loss reported: a loss scaler's scale (pp_loss_scaler.scale) goes
       here. 0 means 1. The rank of the last stage reads its own batch's. */
    float loss_scale;
} pp_batch;

/* Split a batch into micro-batches (contiguous rows; whole sequences when packed). mbs[m] and
   cu (n_seqs + m entries when packed, else may be NULL) are the caller's. The balanced
   policies take O(m * n_seqs) scratch from PP_MALLOC. */
pp_result pp_batch_split(const pp_batch* b, pp_microbatch* mbs, int32_t* cu, pp_error* err);
/* max / mean micro-batch cost of a split under the batch's policy (tokens for SEQS/TOKENS). */
double pp_batch_split_imbalance(const pp_batch* b, const pp_microbatch* mbs);

/* Sequential reference: every micro-batch forward then backward through all layers on this
   thread, gradients accumulated into grads. *loss gets the step loss. */
pp_result pp_sequential_step(const pp_model* m, const void* weights, void* grads,
                             const pp_batch* b, float* loss, pp_error* err);

/* What an evaluation (a forward-only step: pp_stage_eval, pp_pipeline_eval, pp_sequential_eval)
   hands back besides the loss: the last stage's outputs, i.e. the tensors the last layer (the
   loss) reads, e.g. the logits, for metrics or sampling. On rank `rank` (every rank of a step
   passes the same) tensor k of micro-batch 0, 1, ..., m-1 lands in data[k], one after another
   (micro-batches are contiguous rows of the batch: a [rows, cols] tensor per micro-batch gives
   the batch's [rows, cols] in its row order). data[k] NULL: not wanted. The other ranks'
   data and cap are not read. */
typedef struct pp_eval_out {
    int rank;                       /* the rank that gets the outputs (zero: rank 0) */
    void* data[PP_MAX_TENSORS];     /* on that rank, host or (with device blocks) device memory */
    size_t cap[PP_MAX_TENSORS];     /* bytes data[k] holds; too few: PP_ERR_SIZE, nothing written */
    /* filled on that rank when the step returns PP_OK */
    int n;                          /* tensors the last layer reads */
    pp_tensor t[PP_MAX_TENSORS];    /* tensor k over the batch: data[k], rows summed over the
                                       micro-batches, cols and dtype of micro-batch 0's */
    size_t bytes[PP_MAX_TENSORS];   /* bytes written to data[k] (0 where it is NULL) */
} pp_eval_out;

/* Sequential reference of an evaluation: every micro-batch forward through all layers on this
   thread, nothing else (no gradient). *loss (may be NULL) gets the step loss, reduced as
   pp_sequential_step's; out (may be NULL; its rank is not read) the last layer's inputs.
   pp_stage_eval and pp_pipeline_eval give the same bits. */
pp_result pp_sequential_eval(const pp_model* m, const void* weights, const pp_batch* b, float* loss, pp_eval_out* out,
                             pp_error* err);

/* Measured per-layer times (auto-partition by measurement). Runs one untimed warm-up step and
   `steps` timed steps of the sequential reference on this thread, and stores each layer's mean
   wall time per step (all micro-batches of b together, seconds) of forward in t_f, backward in
   t_b and weight_grad in t_w (t_w may be NULL; 0 without weight_grad, whose time is then in
   t_b). grads receives steps+1 steps of gradients: pass scratch. CPU clock: layers that launch
   asynchronous device work must synchronise in their callbacks for the times to mean anything
   (CUDA events are for the CUDA transport). Feed t_f+t_b+t_w to pp_partition_balanced (or
   _capped), and the per-stage sums to pp_simulate for a predicted step time. */
pp_result pp_profile_layers(const pp_model* m, const void* weights, void* grads, const pp_batch* b, int steps,
                            double* t_f, double* t_b, double* t_w, pp_error* err);

/* >>stage ------------------------------------------------------------------------------------- */
typedef struct pp_stage pp_stage;

/* How a rank learns the size of each tensor before it receives it.
   LOCAL       every rank builds the step plan from its own copy of the batch metadata (rows,
               cu_seqlens) and describe(): zero shape messages. The default.
   BROADCAST   only the first stage's rank has the metadata; it sends it to every other rank
               once per step (one message per rank per step, max_seqs bounds its size).
   PER_MESSAGE a shape header travels before every activation transfer and the receiver
               re-describes its own layers from it: for sizes that only the sender knows at
               run time (data-dependent outputs). Gradients need none: their shapes are the
               activations'. Receives of data cannot be posted early.
   AUTO        shapes learned on the first transfer of each (micro-batch, boundary) and reused;
               a 16-byte trailer rides on every activation message, and when the sender's shape
               changes (a last, partial batch) it sends one resize notice and a header, then
               the data. Zero extra messages while shapes stay the same. */
typedef enum pp_shape_policy {
    PP_SHAPES_LOCAL = 0,
    PP_SHAPES_BROADCAST,
    PP_SHAPES_PER_MESSAGE,
    PP_SHAPES_AUTO
} pp_shape_policy;

/* Where a stage keeps its blocks (stashes, received activations, gradient workspaces).
   All NULL, the default: host memory from PP_MALLOC, zeroed with memset. Set alloc, free and
   zero (all three) to keep them elsewhere, e.g. in GPU memory (pipeline_cuda.h's
   pp_cuda_device_ops): the library then never touches block bytes itself, it only hands
   pointers to the layers and the transport. Blocks are pooled and reused across steps, so
   alloc runs only while the pool grows (the first step, or a step with larger micro-batches).
   Blocks outside host memory need PP_SHAPES_LOCAL or PP_SHAPES_BROADCAST: AUTO and PER_MESSAGE
   write shape trailers into blocks on the host, and pp_stage_create refuses them with
   PP_ERR_UNSUPPORTED. */
typedef struct pp_device_ops {
    void* (*alloc)(void* user, size_t bytes);               /* NULL when out of memory */
    void (*free)(void* user, void* ptr);
    pp_result (*zero)(void* user, void* ptr, size_t bytes); /* a gradient workspace, before its B */
    /* Optional: called around the layer calls of every action, phase 0 before and 1 after;
       idx is the action's index in this rank's list (pipeline_cuda.h records timing events). */
    void (*mark)(void* user, const pp_action* a, int idx, int phase);
    /* Optional: a pooled block [ptr, ptr + bytes) is about to be used again, before anything is
       enqueued on it (pipeline_cuda.h makes the stream wait for copies still reading it). */
    void (*reuse)(void* user, void* ptr, size_t bytes);
    void* user;
    /* Optional: copies bytes between this memory and the host, after the work already enqueued
       on it, and returns when the copy is done: to_host 1 reads src (this memory) into dst
       (host), 0 writes src (host) to dst. The stage never calls it; the gradient norm, clipping
       and the loss scaler (>>grad) read and write gradients in this memory through it
       (pp_grad_buf.device), and pp_stage_eval hands out the last stage's outputs through it
       (NULL with device blocks: an evaluation that asks for outputs fails with
       PP_ERR_UNSUPPORTED). pipeline_cuda.h's copies on the rank's stream and waits for it. */
    pp_result (*copy)(void* user, void* dst, const void* src, size_t bytes, int to_host);
} pp_device_ops;

/* A rank's stage. pp_stage_create copies the desc itself but borrows what it points to: the
   schedule, the partition (first[]), the weights and grads, the model's ctx, the transport's
   world (a pp_threads, a pp_cuda, a communicator) and what device and layer_ctx point to must
   all outlive the stage (until pp_stage_destroy returns). */
struct pp_group; /* >>grad */
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
    pp_shape_policy shapes;     /* default PP_SHAPES_LOCAL */
    int max_seqs;               /* BROADCAST: most sequences in one step (0 = 4096) */
    int check_finite;           /* 1: after every F check the input and each layer's outputs
                                   (naming the first layer that wrote a NaN/Inf) and the loss,
                                   after every B each layer's input gradients: PP_ERR_NONFINITE
                                   here, PP_ERR_ABORTED on the other ranks */
    int allow_nonfinite_loss;   /* 0 (default): the last stage checks every micro-batch's loss
                                   (one float: io->loss, on the host) and fails the step with
                                   PP_ERR_NONFINITE naming the micro-batch when it is NaN or Inf;
                                   1: let it pass (check_finite = 1 checks it anyway, so the two
                                   together are refused) */
    pp_device_ops device;       /* block memory; all NULL = host memory (see pp_device_ops) */
    void* layer_ctx;            /* handed to every layer call as io->ctx */
    /* Optional: gradients final. Called on the stepping thread right after the action after which
       stage `stage` (one of this rank's chunks) has its gradients of the step complete: the
       stage's last B in this rank's list, or its last W where W is deferred (a split model on a
       schedule with W). Once per stage and training step (never in pp_stage_eval), in list order,
       so at the same points on every replica of the pipeline; also while a failed step drains
       (pp_transport.abort_local), so collectives started here stay matched. Start the stage's
       data-parallel reduction here (pp_dp_overlap_hook does it in buckets); a result other than
       PP_OK fails the step. The time it takes counts in pp_step_stats.t_grads_hook. */
    pp_result (*grads_final)(void* user, int rank, int stage);
    void* grads_final_user;
    /* Activation recomputation (NULL: none): model.n_layers entries, 1 where the layer's forward
       runs again right before its B instead of keeping its scratch (saved_bytes, b_saved_bytes)
       from F to B; a boundary between two such layers is not kept either. The stash keeps the
       stage's input and output and every input a kept layer reads; the recomputed part lives
       from the recompute to B (where W is deferred, what W reads - the recomputed boundaries and
       saved - until W). Results are bit-identical (the forward
       must be deterministic); B costs one forward of those layers more. pp_plan_recompute picks
       the layers with the schedule. Copied at create. */
    const unsigned char* recompute;
    /* Tensor parallelism (NULL, or a group of one: none): this rank's TP group (>>tp), the ranks
       holding the same stage of the same replica, TP rank i at ranks[i] (borrowed, like
       layer_ctx). Every layer call gets it as io->tp. The boundaries between ranks go split
       (pp_tp_layout): each replicated tensor's 1/tp of rows to the same TP rank of the next stage
       (gradients: of the previous), gathered there over the group before the layers read it;
       every TP rank of the group runs the same schedule and partition. PP_SHAPES_LOCAL or
       _BROADCAST only (else PP_ERR_UNSUPPORTED at create). With device blocks the group's
       transport moves device memory (pipeline_nccl.h's, the grid's g.tp). A gather that fails
       fails the step. A step (or evaluation) is PP_OK only where it was in every pipeline of the
       group: after its pipeline agrees, the rank exchanges its outcome with the group (one int32
       pair each way). pp_pipeline: its tp > 1 sets it for every rank
       (NULL in the template), and stops its whole grid itself. */
    const struct pp_group* tp;
    /* 1: with tp set, every boundary goes whole (each TP rank sends its counterpart the whole
       tensor, no gather; any shape policy), while the group is still io->tp and the step's
       outcome is still agreed over it. Layers whose TP collectives run over a group the stage
       is not told of (tp NULL, the group in model.ctx) leave each pipeline's outcome its own:
       a layer failing on one TP rank after its last collective returns PP_OK on the others. */
    int tp_whole;
} pp_stage_desc;

typedef struct pp_step_stats {
    float loss;                 /* step loss, on the rank that owns the last stage; else 0 */
    int has_loss;
    double t_total;             /* wall time of the step on this rank (s) */
    double t_forward, t_backward;
    double t_wait;              /* blocked on receives */
    uint64_t bytes_sent, bytes_recv;
    uint64_t msgs_sent;
    uint64_t meta_bytes_sent;   /* of bytes_sent: shape metadata (headers, broadcast, trailers) */
    uint64_t meta_msgs_sent;    /* of msgs_sent: messages that carried only metadata */
    int peak_live;              /* most stashes alive at once */
    size_t peak_stash_bytes;    /* most bytes the live stashes, their B-only scratch and recompute blocks
                                   and the workspaces kept for W asked for at once (not the pooled
                                   blocks' capacity) */
    int n_actions;
    /* The plan check and the agreement on the step's outcome (every rank returns the same):
       messages and bytes this rank sent for them (also in msgs_sent and bytes_sent, not in
       meta_*), and the time they took (s). */
    uint64_t agree_msgs, agree_bytes;
    double t_agree;
    size_t pool_bytes;          /* the block pool's memory at the end of the step (device or host) */
    size_t pool_need;           /* the most bytes the step's blocks asked for at once */
    int pool_allocs, pool_frees;/* blocks the pool allocated and gave back during the step */
    /* Peak stash memory in stashes, as pp_sim_result.peak_mem counts it: a stash counts 1 from its
       F; with W deferred, its B frees the B-only scratch (pp_layer_desc.b_saved_bytes), that
       scratch's share of the stash's bytes, and its W the rest. peak_live without B-only scratch. */
    double peak_mem;
    /* Gradients final (pp_stage_desc.grads_final): when the last of this rank's stages had its
       gradients of the step complete (s from the step's start; the time left until the step
       returns is where a data-parallel reduction hides), and the time spent in the hook. */
    double t_grads_final;
    double t_grads_hook;
    /* pp_stage_desc.tp: bytes this rank sent over the TP group's transport gathering the split
       boundaries it received (not in bytes_sent), and the time those gathers took (s). */
    uint64_t tp_gather_bytes;
    double t_tp_gather;
} pp_step_stats;

pp_result pp_stage_create(const pp_stage_desc* d, pp_stage** out, pp_error* err);
void pp_stage_destroy(pp_stage* st);
/* Run one training step (forward and backward of all micro-batches); grads accumulate. One
   step at a time per stage: a call from another thread while a step runs returns
   PP_ERR_INVALID at once and touches nothing (not even pp_stage_error). */
pp_result pp_stage_step(pp_stage* st, const pp_batch* b, pp_step_stats* stats);
/* Run one evaluation: the forward of every micro-batch, nothing else (no gradient is touched),
   over the forward-only list pp_stage_create made from the schedule (pp_schedule_make_eval),
   with the same micro-batch count m. Every rank of the pipeline calls it for the same step, as
   for pp_stage_step: it is a step for the transports (the step's identity, the plan check and
   the agreement; a training step after it runs as if it had not happened, bit for bit). Each
   stash goes back once the F's output left (at the turn of the V, once the next stage's F read
   it): stats->peak_live is at most 2, and 1 on a rank none of whose stages feeds another.
   stats->loss, on the rank of the last stage, is the step loss as pp_stage_step reduces it.
   out (NULL: the loss only) asks for the last stage's outputs on out->rank; every rank passes
   the same out->rank and whether out is NULL (rank 0 sends both with the step's identity; a rank
   that disagrees, or whose out->rank is outside 0 .. p-1, fails the step on every rank at once,
   PP_ERR_INVALID on that rank). From the last stage's rank to another they
   travel after both ranks' lists (one message per tensor and micro-batch): under LOCAL or
   BROADCAST shapes only (PP_ERR_UNSUPPORTED otherwise); with device blocks
   (pp_stage_desc.device) the copies go through device.copy, enqueued on the rank's stream.
   Where the transport refused the forward-only list at create (a hand-written table whose list
   pipeline_nccl.h cannot run), or m x stages leave no tags for it, every call returns that
   refusal at once (PP_ERR_UNSUPPORTED or the check's code, the reason in pp_stage_error). */
pp_result pp_stage_eval(pp_stage* st, const pp_batch* b, pp_eval_out* out, pp_step_stats* stats);
const char* pp_stage_error(const pp_stage* st);
/* Events of the last step when record_timeline is set (times in seconds from step start). */
const pp_event* pp_stage_timeline(const pp_stage* st, size_t* n);
/* This rank's flight record (>>flight); pp_flight_print / pp_flight_print_fd print it. */
pp_result pp_stage_flight(const pp_stage* st, pp_flight* out);

/* >>pipeline ---------------------------------------------------------------------------------- */
/* A whole pipeline in one process: every rank a thread here (pp_pipeline_create), or a CUDA
   stream (pipeline_cuda.h's pp_cuda_pipeline_create). It is the per-rank API above run for
   you: it makes the schedule and the partition, one pp_stage per rank on one transport, and
   runs every rank's pp_stage_step for each batch. MPI and NCCL (one process per rank) and
   programs that drive every rank themselves use the per-rank API directly. With dp and tp
   (below) it is a whole pp x dp x tp grid in one process: replicas, their gradient sum, and
   each layer's TP group (io->tp), without grid code (docs/training.md, "pp x dp in one process").
       pp_pipeline_desc d = {0};                       // zero is a default everywhere
       d.model = mlp_model_desc(); d.weights = &w; d.grads = &g;
       d.schedule = PP_SCHED_1F1B; d.p = 4; d.m = 8;
       pp_pipeline* pl; pp_pipeline_create(&d, &pl, &err);
       pp_pipeline_step(pl, &batch, &stats);           // every rank, gradients accumulate
       pp_pipeline_destroy(pl);
   Defaults are resolved once, at create. Everything the desc points to is read at create only
   (custom and the partition's arrays are copied: the pipeline owns its schedule, partition and
   world), except weights, grads (and their per-rank arrays' targets), the model's ctx and what
   the stage template's device and layer_ctx point to: those must live until pp_pipeline_destroy. */
typedef struct pp_pipeline pp_pipeline;

typedef struct pp_pipeline_desc {
    pp_model model;
    /* Parameters. Every rank reads weights, or rank_weights[r] (p entries: a copy per rank, e.g.
       one per GPU). Gradients go to grads, one struct for all (each rank adds only into the
       layers it owns, so they share it safely), or to rank_grads[r] (p entries, each rank its
       own). Set exactly one of weights / rank_weights and one of grads / rank_grads. */
    const void* weights;
    void* grads;
    const void* const* rank_weights;
    void* const* rank_grads;
    /* The schedule: its kind (zero: PP_SCHED_GPIPE), p ranks (0: 1), v chunks per rank (0: what
       the kind needs: 1, or 2 for interleaved and ZB-V), m micro-batches per step (0: 4 * p).
       Or custom: a schedule you made or parsed, copied at create; p, v and m are then its own
       (set ones must agree) and schedule is ignored. */
    pp_schedule_kind schedule;
    int p, v, m;
    const pp_schedule* custom;
    /* Layers into p*v stages (n_stages is set for you). Zero: PP_PARTITION_UNIFORM; COST and
       PARAMS need sample (one micro-batch's input shape), EXPLICIT explicit_first. */
    pp_partition_desc partition;
    /* What every rank's pp_stage_desc starts from: timeout_s, record_timeline, shapes, max_seqs,
       check_finite, allow_nonfinite_loss, device, layer_ctx, recompute. Its model, weights, grads,
       schedule, partition, rank and transport belong to the pipeline: leave them zero. */
    pp_stage_desc stage;
    /* Optional: called at create for every rank in rank order, once its desc is filled, before
       its stage is made. Change what you like: wrap d->transport (fault injection), give the
       rank its own layer_ctx or device ops. A result other than PP_OK fails the create. A wrapper
       replaces transport.self, so every function it keeps must be its own: forward abort and
       cancel (a failed step needs them) and set the ones it does not forward to NULL. */
    pp_result (*rank_setup)(void* user, int rank, pp_stage_desc* d);
    void* user;
    /* Data and tensor parallelism in this process (0 or 1: none, the pipeline above). The
       pipeline runs p * dp * tp ranks, a thread each, world rank r placed as pp_grid_make_tp(
       p * dp * tp, r, p, tp, PP_GRID_DP_INNER) places it: r = (pp_rank * dp + dp_rank) * tp +
       tp_rank (tp innermost); a replica is dp_rank's tp pipelines. Every rank-indexed thing
       counts world ranks: rank_weights and rank_grads (p * dp * tp entries; grads must be
       rank_grads, no two pipelines sharing a struct), rank_setup, pp_pipeline_stage,
       pp_pipeline_rank_result. pp_pipeline_step takes dp batches, replica i's in b[i]. dp > 1:
       after every rank's backward the step sums each rank's gradients over its data-parallel
       group (the dp ranks of one (pp_rank, tp_rank)) with pp_grad_allreduce over a threads
       transport of its own: in dp rank order, the same bits every run and on every replica, then
       times dp_scale (0: 1 / dp, the mean, as pp_dp_overlap; 1: the sum). It finds the buffers
       through model.params (PP_MODEL_PARAMS: needed with dp > 1) on rank_grads[r], the layers the
       rank owns. tp > 1: every rank's layers get its TP group as io->tp (pp_tp_allreduce and
       friends; pp_group_rank(io->tp) is the TP rank), over another threads transport; the
       pipeline moves every boundary tensor whole between the same TP ranks of neighbouring
       stages. The threads pipeline only (pp_cuda_pipeline_create refuses dp or tp > 1). */
    int dp, tp;
    double dp_scale;
} pp_pipeline_desc;

pp_result pp_pipeline_create(const pp_pipeline_desc* d, pp_pipeline** out, pp_error* err);
void pp_pipeline_destroy(pp_pipeline* pl);
/* One training step on every rank, one thread each; gradients accumulate across steps (zero
   them yourself). b->m is 0 (the pipeline's m) or the pipeline's m. With dp > 1, b points to dp
   batches, b[i] replica i's (each its own micro-batches; the data-parallel sum follows the
   backward, inside the step). stats (may be NULL) covers
   all ranks: loss from the rank that owns the last stage (dp > 1: the replicas' losses added in
   replica order, divided by dp); t_total and peak_live the largest
   rank's; the times, bytes, messages, stash bytes and actions summed over ranks. When a rank
   fails, every rank stops (with dp or tp, every pipeline of the process: the failing rank
   aborts all of them, and every rank's pp_pipeline_rank_result is then an error), the result is
   the first failure's (never PP_ERR_ABORTED when a
   cause is known), pp_pipeline_error names its rank, and the pipeline is ready for the next
   step (the gradients then hold part of the step: zero them), provided every rank's transport
   can withdraw the receives the step left posted (pp_transport.cancel); where one cannot, later
   steps return PP_ERR_UNSUPPORTED, saying to create the pipeline again. One step at a time. */
pp_result pp_pipeline_step(pp_pipeline* pl, const pp_batch* b, pp_step_stats* stats);
/* (One step at a time: a call from another thread while a step runs returns PP_ERR_INVALID at
   once, without a message, and leaves that step alone.) */
/* One evaluation on every rank (pp_stage_eval): the loss in stats->loss, bit-identical to
   pp_sequential_eval's, no gradient touched; out (may be NULL) gets the last stage's outputs on
   out->rank (the threads pipeline: host memory; the CUDA pipeline: host or device memory, in
   place when the call returns; dp or tp > 1: replica 0's TP rank 0's pipeline, out->rank its
   stage rank). b->m as for pp_pipeline_step (dp batches with dp > 1; stats->loss as there).
   Failures as pp_pipeline_step's. */
pp_result pp_pipeline_eval(pp_pipeline* pl, const pp_batch* b, pp_eval_out* out, pp_step_stats* stats);
/* The last failure ("" if none): which rank failed first, and its message. */
const char* pp_pipeline_error(const pp_pipeline* pl);
/* Rank r's result of the last step (PP_ERR_ABORTED where another rank failed first; the step's
   own result where the rank did not run: a step refused, or its thread not started), and its
   stats (may be NULL). */
pp_result pp_pipeline_rank_result(const pp_pipeline* pl, int rank, pp_step_stats* stats);
/* Every rank's actions of the last step, rank-major, times in seconds from each rank's step
   start (needs stage.record_timeline; else n = 0). Valid until the next step. */
const pp_event* pp_pipeline_timeline(pp_pipeline* pl, size_t* n);
/* What create resolved: the schedule, and the partition first[n_stages + 1]. */
const pp_schedule* pp_pipeline_schedule(const pp_pipeline* pl);
const int* pp_pipeline_partition(const pp_pipeline* pl);
/* Rank r's stage (its error, flight record, timeline), and the threads world (pending
   messages, flight records; NULL when the ranks are CUDA streams; with dp or tp > 1 the
   pipeline of replica 0's TP rank 0). */
pp_stage* pp_pipeline_stage(pp_pipeline* pl, int rank);
pp_threads* pp_pipeline_threads(pp_pipeline* pl);

/* >>grid -------------------------------------------------------------------------------------- */
/* Several processes: who am I, and which groups am I in. Shared by every multi-process transport
   (pipeline_mpi.h, pipeline_nccl.h); all of it is plain arithmetic over a pp_transport.

   The launcher tells each process its rank. pp_launch_from_env reads, in this order:
       OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK       mpirun (Open MPI)
       PMI_RANK / PMI_SIZE (+ MPI_LOCALRANKID)          mpiexec (MPICH, Intel MPI)
       SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID      srun
       RANK / WORLD_SIZE / LOCAL_RANK                   torchrun and friends
   and fails with PP_ERR_INVALID, naming the variables, when none is set or one is malformed.
   A missing local rank counts as 0. */
typedef struct pp_launch {
    int rank, world, local_rank;
    const char* source;         /* "ompi", "pmi", "slurm", "torchrun" */
} pp_launch;

pp_result pp_launch_from_env(pp_launch* out, pp_error* err);

/* A pipeline x data-parallel grid: world = pp * dp processes, each one stage rank (pp_rank) of
   one pipeline replica (dp_rank). PP_GRID_DP_INNER (the default) numbers world ranks
   pp_rank * dp + dp_rank, so the replicas of a stage are neighbours (one node holds a stage's
   data-parallel group, where the gradient all-reduce moves the most bytes); PP_GRID_PP_INNER
   numbers them dp_rank * pp + pp_rank (one node holds a whole pipeline).

   With tensor parallelism (pp_grid_make_tp): world = pp * dp * tp, each process also one tensor
   rank (tp_rank) of its stage's tensor-parallel group, the tp processes that split each layer of
   that stage between them. The two orders above keep tp innermost (world rank = (their rank as
   above) * tp + tp_rank): a TP group is tp neighbouring ranks, on one node, where its layers'
   collectives (several per layer, in the critical path) are fastest. The other orders name the
   three dimensions outermost first (PP_GRID_PP_TP_DP: rank = (pp_rank * tp + tp_rank) * dp +
   dp_rank). With tp = 1 every order is one of the two above. The groups: a pipeline is the pp
   ranks of one (dp_rank, tp_rank), a data-parallel group the dp ranks of one (pp_rank,
   tp_rank), a TP group the tp ranks of one (pp_rank, dp_rank); the tied pair is per (dp_rank,
   tp_rank) (a tied layer split over TP ties shard by shard). */
typedef enum pp_grid_order {
    PP_GRID_DP_INNER = 0, /* pp, dp, tp from outermost to innermost (= PP_GRID_PP_DP_TP) */
    PP_GRID_PP_INNER = 1, /* dp, pp, tp (= PP_GRID_DP_PP_TP) */
    PP_GRID_PP_DP_TP = 0, /* the orders by name, outermost first */
    PP_GRID_DP_PP_TP = 1,
    PP_GRID_PP_TP_DP = 2,
    PP_GRID_DP_TP_PP = 3,
    PP_GRID_TP_PP_DP = 4,
    PP_GRID_TP_DP_PP = 5
} pp_grid_order;

typedef struct pp_grid {
    int world, rank;            /* world size, this process's world rank */
    int pp, dp;                 /* world = pp * dp * tp */
    pp_grid_order order;
    int pp_rank, dp_rank;       /* this process's place: stage rank, replica */
    int pipe[PP_MAX_RANKS];     /* world ranks of this replica's pipeline, by pp rank */
    int dp_group[PP_MAX_RANKS]; /* world ranks holding this stage rank, by dp rank */
    int tied[2];                /* world ranks of this pipeline's first and last stage rank */
    int tp, tp_rank;            /* tensor-parallel size (1 from pp_grid_make) and this rank's place */
    int tp_group[PP_MAX_RANKS]; /* world ranks of this rank's TP group, by tp rank */
} pp_grid;

/* world = pp * dp (tp = 1): pp_grid_make_tp(world, rank, pp, 1, order, g, err). */
pp_result pp_grid_make(int world, int rank, int pp, pp_grid_order order, pp_grid* g, pp_error* err);
/* world = pp * dp * tp; pp, dp and tp each 1..PP_MAX_RANKS; PP_ERR_INVALID with a message for a
   world that is not a multiple of pp * tp, a rank outside it, an unknown order. */
pp_result pp_grid_make_tp(int world, int rank, int pp, int tp, pp_grid_order order, pp_grid* g, pp_error* err);
/* World rank of (pp_rank, dp_rank) with this process's tp_rank (tp = 1: the only one), or -1
   when outside the grid. */
int pp_grid_rank(const pp_grid* g, int pp_rank, int dp_rank);
/* World rank of (pp_rank, dp_rank, tp_rank), or -1 when outside the grid. */
int pp_grid_rank_tp(const pp_grid* g, int pp_rank, int dp_rank, int tp_rank);
/* Colours and keys for MPI_Comm_split / ncclCommSplit: the pipeline group (ranks ordered by pp
   rank), the data-parallel group (by dp rank), the tied pair (first and last stage rank of
   a pipeline, key 0 and 1; -1 (MPI_UNDEFINED / NCCL_SPLIT_NOCOLOR) where this rank has none) and
   the TP group (by tp rank). Colours are dp_rank * tp + tp_rank (pipe, tied), pp_rank * tp +
   tp_rank (dp) and pp_rank * dp + dp_rank (TP): with tp = 1 the first three are as before. */
void pp_grid_pipe_split(const pp_grid* g, int* color, int* key);
void pp_grid_dp_split(const pp_grid* g, int* color, int* key);
void pp_grid_tied_split(const pp_grid* g, int* color, int* key);
void pp_grid_tp_split(const pp_grid* g, int* color, int* key);

/* Users sum gradients with pp_grad_allreduce (below); this is for transport writers: an
   allreduce_sum over any transport built from its own isend/irecv/wait: ranks[0] sums the others'
   buffers into its own in the order of ranks[] and sends the result back, so every member ends
   with the same bits, and the same bits every run. f32 or f64. */
pp_result pp_allreduce_p2p(const pp_transport* t, void* buf, size_t count, pp_dtype dtype, const int* ranks,
                           int n_ranks, double timeout_s, pp_error* err);

/* Data-parallel gradients: buf (count elements) summed over the transport's ranks 0..size-1
   (or over ranks[0..n_ranks) when ranks is non-NULL) with the transport's allreduce_sum, then
   multiplied by scale (1/dp gives the mean; a power of two keeps it exact). Call it after the
   tied sum below, on every parameter buffer this rank owns, in the same order on every rank.
   f32, f64, f16 or bf16: f16 and bf16 (host memory) are widened to f32, summed in f32 by the
   transport (256Ki elements at a time), scaled in f32 and rounded back once, so every rank
   ends with the same bits (deterministic where the transport's f32 sum is: pp_allreduce_p2p,
   the threads transport, pp_mpi_set_ordered_sum). */
pp_result pp_grad_allreduce(const pp_transport* t, const int* ranks, int n_ranks, void* buf, size_t count,
                            pp_dtype dtype, double scale, double timeout_s, pp_error* err);
/* A step's outcome agreed over the data-parallel group, for a loop that reduces after the step
   (pp_grad_allreduce; pp_dp_overlap_wait votes by itself). Every member calls it after every
   step, whatever its step returned, with its step count and that result (after its pipeline's
   own agreement, so the same on every rank of a replica): PP_OK on every member where every
   member's was PP_OK, else an error on every member naming the first failed one, so no replica
   sums gradients with one whose step failed (its drained zeros) and reports PP_OK. Members at
   different step counts fail it too. One all-reduce of n_ranks + 4 doubles (t's allreduce_sum,
   else pp_allreduce_p2p). Where it fails, skip the reduction and the update on this rank. */
pp_result pp_dp_agree(const pp_transport* t, const int* ranks, int n_ranks, int64_t step, pp_result own, double timeout_s,
                      pp_error* err);

/* Tied layers (an embedding on the first stage whose matrix the last stage's head reuses).
   Each of the two ranks pair[0] (copy a) and pair[1] (copy b) keeps its own copy.
   pp_tied_sync_weights: copy a's bytes replace copy b's (before training: both start identical).
   pp_tied_sum_grads: both gradients become grad_a + grad_b (in that order, so both ranks hold
   the same bits and an optimizer keeps the copies bit-identical). A rank owning both (pp = 1)
   passes both pointers and the sum is local; a rank owning one passes NULL for the other; a
   rank in neither returns at once. pair[] are ranks of transport t (normally the pipeline's:
   {rank of the first stage, rank of the last stage}). Sum tied gradients before the
   data-parallel all-reduce. f16 and bf16 gradients (host memory) are added in f32 and rounded
   back once, the same bits on both ranks. */
pp_result pp_tied_sync_weights(const pp_transport* t, const int pair[2], void* w_a, void* w_b, size_t bytes,
                               double timeout_s, pp_error* err);
pp_result pp_tied_sum_grads(const pp_transport* t, const int pair[2], void* grad_a, void* grad_b, size_t count,
                            pp_dtype dtype, double timeout_s, pp_error* err);

/* >>grad ------------------------------------------------------------------------------------- */
/* The global gradient norm, clipping by it, and a dynamic loss scaler for f16 training: the loop
   around the step (docs/api.md, "Gradient norm, clipping and mixed precision").

   The library does not know where a layer keeps its parameters, so you list them: one pp_grad_buf
   per gradient array, tagged with its global layer index. Each rank lists the layers it owns.

   THE NORM IS THE SAME BITS EVERYWHERE. sqrt(sum of squares) over every element of the model,
   computed as: per layer, the squares of its buffers' elements added in f64 (each element
   widened to f64, so the square of an f32 is exact), buffer by buffer in the order you list them
   and element by element; then the per-layer sums added in layer index order, in f64; then the
   square root. Every rank contributes the sums of its own layers to a vector of one slot per
   layer, zeros elsewhere; an all-reduce of that vector is exact (each slot has one non-zero
   term), so every rank adds the same list in the same order. Whatever p, v, schedule or
   partition, the norm is the bits of the sequential model's, given its gradients' bits (which
   the library keeps): a pipelined run clips exactly as the sequential one.
   - Tied parameters count once: after pp_tied_sum_grads both copies hold the sum; list the
     second copy (the head's) with tied_copy = 1: the norm skips it, clipping and unscaling
     scale it, so the copies stay equal. An entry whose data is that of an earlier entry is
     skipped for everything (a truly tied, shared buffer, pp = 1).
   - Data parallelism: call it after pp_grad_allreduce, over one pipeline's ranks (the stage's
     transport, or pp_grid.pipe): every replica then holds the same gradients and computes the
     same norm, without a message between replicas. A layer listed by two ranks of the group
     (the group spans replicas) is refused on every rank, PP_ERR_INVALID.
   - Where the gradients live: host memory (device NULL), or memory whose pp_device_ops have a
     copy (pipeline_cuda.h: pp_cuda_device_ops(c, rank)): read and written back 64Ki elements at
     a time through a host buffer, without a kernel (a device-to-host copy of the gradients per
     call: fine for a norm per step, not free).
   - dtypes: f32, f64, f16, bf16 (f16 and bf16 widened exactly). */
typedef struct pp_grad_buf {
    int layer;                      /* global layer index the parameter belongs to */
    void* data;                     /* count elements of dtype */
    size_t count;
    pp_dtype dtype;                 /* PP_F32, PP_F64, PP_F16 or PP_BF16 */
    int tied_copy;                  /* 1: a tied parameter's second copy: not counted, but scaled */
    const pp_device_ops* device;    /* NULL: host memory; else its copy reaches data */
    int tp_sharded;                 /* tensor parallelism (pp_grad_norm_tp): 1: this rank's shard of a
                                       parameter split over the TP group (the shards' squares add up);
                                       0: a parameter every TP rank holds whole (counted once) */
} pp_grad_buf;

/* The ranks that take part in a collective: transport t's ranks[0..n_ranks) (ranks NULL: all of
   t's ranks), with a deadline for each wait (0: PP_DEFAULT_TIMEOUT_S). A NULL group, or t NULL:
   this process alone, no message. */
typedef struct pp_group {
    const pp_transport* t;
    const int* ranks;
    int n_ranks;
    double timeout_s;
} pp_group;

/* The norm (above) of the model's n_layers layers over group g; *norm is the same on every rank
   of g. Every rank of g must call it (one all-reduce of 2 * n_layers doubles, over
   allreduce_sum or, where the transport has none, pp_allreduce_p2p). */
pp_result pp_grad_norm(const pp_group* g, int n_layers, const pp_grad_buf* bufs, int n_bufs, double* norm,
                       pp_error* err);
/* The norm with tensor parallelism: g is this rank's pipeline (the ranks of its TP coordinate, as
   for pp_grad_norm), tp its tensor-parallel group (NULL or one rank: pp_grad_norm's bits). Every
   rank of tp lists the same layers. Per layer, the sum of squares is formed in one order whatever
   p, v, schedule or partition: the replicated buffers' squares (tp_sharded 0, in listing order)
   as tp's first rank (tp->ranks[0]) holds them, then each TP rank's sharded buffers' squares (in
   listing order), added in tp's rank order; one exact all-reduce over tp (one slot per TP rank
   and layer) then pp_grad_norm's over g. The norm is bit-identical on every rank of the grid and
   run to run, and equals the norm of the gathered (tp = 1) gradients up to the summation order.
   Every rank of g and of tp calls it. */
pp_result pp_grad_norm_tp(const pp_group* g, const pp_group* tp, int n_layers, const pp_grad_buf* bufs, int n_bufs,
                          double* norm, pp_error* err);
/* Clipping as torch.nn.utils.clip_grad_norm_ does it: every listed gradient (tied copies
   included, shared buffers once) is multiplied by coef = max_norm / (norm + 1e-6) when that is
   below 1, else left alone; *coef (may be NULL) gets min(1, coef). norm is the global norm from
   pp_grad_norm: every rank passes the same and scales by the same factor (f32 by (float)coef,
   f64 by coef, f16/bf16 through f32 with one rounding). A NaN or Inf norm leaves the gradients
   untouched and returns PP_ERR_NONFINITE; max_norm must be finite and > 0. */
pp_result pp_grad_clip(const pp_grad_buf* bufs, int n_bufs, double max_norm, double norm, double* coef,
                       pp_error* err);
/* The same for one rank of a pipeline: over the stage's transport (every rank of it), the model's
   layers and the stage's timeout; every buffer must belong to a layer this rank owns. Every
   rank of the pipeline calls it, between steps (a call while a step runs on the stage returns
   PP_ERR_INVALID). _clip: the norm, then pp_grad_clip with it (*norm gets the norm before). */
pp_result pp_stage_grad_norm(pp_stage* st, const pp_grad_buf* bufs, int n_bufs, double* norm, pp_error* err);
pp_result pp_stage_grad_clip(pp_stage* st, const pp_grad_buf* bufs, int n_bufs, double max_norm, double* norm,
                             pp_error* err);
/* The same with tensor parallelism: the stage's pipeline and tp (pp_grad_norm_tp); every rank of
   the pipeline and of tp calls it; every rank of the grid clips by the same coefficient. */
pp_result pp_stage_grad_norm_tp(pp_stage* st, const pp_group* tp, const pp_grad_buf* bufs, int n_bufs, double* norm,
                                pp_error* err);
pp_result pp_stage_grad_clip_tp(pp_stage* st, const pp_group* tp, const pp_grad_buf* bufs, int n_bufs, double max_norm,
                                double* norm, pp_error* err);
/* The same for a one-process pipeline (threads or CUDA streams): every layer's buffers, from
   whichever rank's gradients hold them; no message. Between steps. With dp > 1 (pp_pipeline_desc)
   list one replica's buffers (after the step every replica holds the same sum) and clip the
   other replicas' by the same norm with pp_grad_clip; with tp > 1 list every TP rank's shard of
   a split parameter and one copy of a parameter every TP rank holds whole. */
pp_result pp_pipeline_grad_norm(pp_pipeline* pl, const pp_grad_buf* bufs, int n_bufs, double* norm, pp_error* err);
pp_result pp_pipeline_grad_clip(pp_pipeline* pl, const pp_grad_buf* bufs, int n_bufs, double max_norm, double* norm,
                                pp_error* err);

/* THE LISTS FROM THE MODEL. The buffers the checkpoints save (pp_model.params, PP_MODEL_PARAMS)
   are the ones the norm, clipping, the loss scaler and pp_dp_overlap read: applied to the grads
   struct (bound like the weights), the params hook gives the gradient lists, so one description
   drives them all. Each call fills out[0 .. *n) with one pp_grad_buf per buffer the hook names,
   layer by layer in ascending index, the hook's order within a layer (the order a list by hand
   would take: the same norm bits), tp_sharded from pp_param.tp_sharded, tied_copy 0, device
   NULL (set it, and list a tied parameter's second copy, yourself). *n is the count in any case;
   out NULL (cap 0) asks only for it; more than cap buffers is PP_ERR_INVALID. A layer owned here
   whose hook gives data NULL (with count > 0) is PP_ERR_INVALID, as is a model without params.
   The list borrows the grads' arrays: make it once, after they are allocated.
   pp_model_grad_bufs: model m's layers l where own[l] (own NULL: every layer) in grads.
   pp_stage_grad_bufs: the layers this rank owns, in its pp_stage_desc.grads (for
   pp_stage_grad_*, pp_loss_scaler_check and pp_dp_overlap_desc.bufs).
   pp_pipeline_grad_bufs: every layer, each in the grads of the rank that owns it (grads, or
   rank_grads[r]): for pp_pipeline_grad_norm / _clip. With dp > 1, replica 0's (after the step
   every replica holds the same sum); with tp > 1 PP_ERR_UNSUPPORTED: each TP rank holds its own
   shards, list each rank's with pp_stage_grad_bufs(pp_pipeline_stage(pl, r)). */
pp_result pp_model_grad_bufs(const pp_model* m, void* grads, const unsigned char* own, pp_grad_buf* out, int cap,
                             int* n, pp_error* err);
pp_result pp_stage_grad_bufs(pp_stage* st, pp_grad_buf* out, int cap, int* n, pp_error* err);
pp_result pp_pipeline_grad_bufs(pp_pipeline* pl, pp_grad_buf* out, int cap, int* n, pp_error* err);

/* Dynamic loss scaling for f16 (torch.cuda.amp.GradScaler's rule). Each step: set
   pp_batch.loss_scale = s.scale (the loss layer's gradient, and so every gradient, is scaled
   by it; the reported loss is not); after the tied sum and the data-parallel all-reduce,
   pp_loss_scaler_check(&s, ...). It looks for a NaN or Inf in this rank's listed gradients and
   agrees on the answer with every other rank through an all-reduce of the found flag over each
   group in turn, so that a NaN anywhere, on any pipe or data-parallel rank, gives the same
   verdict everywhere: *skip = 1, the gradients are left as they are (zero them, and skip the
   optimizer step), scale *= backoff_factor (not below min_scale). Otherwise *skip = 0, every
   listed gradient is multiplied by 1 / scale (exact for the default powers of two), and after
   growth_interval such steps in a row scale *= growth_factor. Then clip and step. */
typedef struct pp_loss_scaler_desc {
    float init_scale;               /* 0: 65536 (2^16) */
    float growth_factor;            /* 0: 2 */
    float backoff_factor;           /* 0: 0.5 */
    int growth_interval;            /* 0: 2000 clean steps in a row before the scale grows */
    float min_scale;                /* 0: 1; the scale never backs off below it */
} pp_loss_scaler_desc;

typedef struct pp_loss_scaler {
    pp_loss_scaler_desc d;          /* defaults resolved at init */
    float scale;                    /* this step's loss scale: pp_batch.loss_scale */
    int good_steps;                 /* clean steps since the scale last changed */
    int64_t steps, skipped;         /* checks so far, and how many skipped the step */
} pp_loss_scaler;

/* d may be NULL (every default). Refuses factors that would not move the scale the right way. */
pp_result pp_loss_scaler_init(pp_loss_scaler* s, const pp_loss_scaler_desc* d, pp_error* err);
/* groups[0..n_groups): the ranks to agree with, one all-reduce each, in order, the same on every
   rank: the whole world in one group (an MPI world, a threads world), or the pipeline then the
   data-parallel group (pp_nccl_grid's pipe and dp: together they reach every rank; with tensor
   parallelism the TP group too, e.g. pipe, dp, tp: a NaN on one TP rank skips every rank). n_groups 0:
   this process alone (pp_pipeline, pp_sequential_step). On an error the scaler is unchanged. */
pp_result pp_loss_scaler_check(pp_loss_scaler* s, const pp_group* groups, int n_groups, const pp_grad_buf* bufs,
                               int n_bufs, int* skip, pp_error* err);

/* DATA-PARALLEL REDUCTION OVERLAPPED WITH THE COOL-DOWN. A stage's gradients of a step are final
   after its last B (or W): for all but the rank that finishes last that is well before
   pp_stage_step returns (the cool-down, then the step's agreement). A pp_dp_overlap reduces each
   stage's gradients over the data-parallel group from the stage's gradients-final hook
   (pp_stage_desc.grads_final = pp_dp_overlap_hook, grads_final_user = the overlap), inside the
   step, so only the last stage's reduction is left after it. The step ends with one call:
       pp_dp_overlap_desc od = {0};
       od.dp = (pp_group){&dp_transport, NULL, 0, 30};   // its own transport / communicator
       od.bufs = bufs; od.n_bufs = n;                    // this rank's gradients (pp_grad_buf)
       od.partition = first; od.n_stages = S;            // which stage a buffer's layer is in
       od.tied = &pipe; od.tied_pair[0] = r0; od.tied_pair[1] = r1;
       od.tied_layers[0] = 0; od.tied_layers[1] = L - 1; // embedding and head
       pp_dp_overlap_create(&od, &ov, &err);
       sd.grads_final = pp_dp_overlap_hook; sd.grads_final_user = ov;   // then pp_stage_create
       for (;;) { pp_stage_step(st, &b, &stats); pp_dp_overlap_wait(ov, &os, &err); ... }
   (the wait after every step, whatever the step returned: it is the grid's verdict, PP_OK on
   every rank or an error on every rank; docs/errors.md has the recovery)
   The gradients end with exactly the bits of pp_tied_sum_grads then pp_grad_allreduce(dp,
   scale) over each buffer after the step: the sums are per element, so cutting a buffer into
   buckets changes no bit (where an element's terms are added in an order its offset does not
   decide: not MPI's or NCCL's own algorithms over more than two replicas), and tied layers wait: their buffers are reduced in
   pp_dp_overlap_wait, after the tied sum (pp_tied_sum_grads over tied / tied_pair of the first
   buffer listed for tied_layers[0] and for tied_layers[1]; Megatron #844). Where dp's transport
   can start an all-reduce (pp_transport.iallreduce_sum: pipeline_mpi.h's MPI_Iallreduce,
   pipeline_nccl.h's ncclAllReduce on the dp transport's own stream; f32 and f64 over the whole
   communicator) the hook starts each bucket and returns; the wait completes them (and scales,
   on the host: device gradients want scale = 1, then a kernel). Elsewhere (the threads
   transport, f16, a subset of ranks, the ordered sum) each bucket is a blocking pp_grad_allreduce issued from the hook:
   it costs the stage's own thread that time, hidden where the rank has nothing left to run
   (GPipe and 1F1B: a rank's last B is its last action; with several chunks per rank or deferred
   W's, it delays the rank's later actions by its length). No deadlock: replicas run the same list,
   so the hooks come at the same points on every member of a dp group, and dp's transport is not
   the pipeline's (threads: another world or other ranks; MPI and NCCL: the grid's dp
   communicator). Every buffer must be listed in the same order on every member of a dp group. */
typedef struct pp_dp_overlap_desc {
    pp_group dp;                    /* the data-parallel group (its transport must not be the
                                       pipeline's: ranks of another world or communicator; the
                                       pp_transport structs here and in tied are copied at
                                       create, the worlds they point to must live on) */
    double scale;                   /* applied after the sum; 0: 1 / the group's size (the mean) */
    size_t bucket_bytes;            /* most bytes one all-reduce carries; 0: 4 MiB */
    const pp_grad_buf* bufs;        /* this rank's gradients (copied at create; data borrowed) */
    int n_bufs;
    const int* partition;           /* first[n_stages + 1]: the stage of each buffer's layer */
    int n_stages;
    const pp_transport* tied;       /* NULL: no tied layers; else the pipeline's transport (or
                                       the grid's tied pair) for pp_tied_sum_grads */
    int tied_pair[2];               /* tied's ranks holding copy a and copy b */
    int tied_layers[2];             /* the layers of copy a and copy b (global indices) */
    int coalesce;                   /* 1: buffers listed one after the other that follow one
                                       another in memory (one stage, one dtype, not tied) go as
                                       one: fewer, larger all-reduces, the same sums. Only where
                                       every member of the dp group lays its buffers out alike
                                       (one arena at the same offsets): members that merge
                                       differently issue different collectives and hang */
} pp_dp_overlap_desc;

typedef struct pp_dp_overlap pp_dp_overlap;

/* What pp_dp_overlap_wait found since the last wait: the reduction done in the hooks (hidden
   where the rank had nothing left to run) and in the wait (exposed: after the step). */
typedef struct pp_dp_overlap_stats {
    double t_hook, t_wait;          /* seconds in the hooks, and in the wait */
    int buckets_hook, buckets_wait; /* all-reduces issued in each */
    int buckets_started;            /* of buckets_hook: started in the hook (dp's iallreduce_sum),
                                       completed in the wait; the others ran to the end there */
} pp_dp_overlap_stats;

pp_result pp_dp_overlap_create(const pp_dp_overlap_desc* d, pp_dp_overlap** out, pp_error* err);
void pp_dp_overlap_destroy(pp_dp_overlap* o);
/* pp_stage_desc.grads_final with grads_final_user = the overlap: reduces stage `stage`'s
   buffers (tied layers' excepted), once per step. */
pp_result pp_dp_overlap_hook(void* user, int rank, int stage);
/* The end of every step, on every rank of the grid, whatever pp_stage_step returned: where the
   step went well on this rank, the reductions the hooks did not do (all of them, where no hook
   ran), then the tied sum and the tied layers' reductions; then the grid agrees on the step's
   outcome (a vote over the dp group, then over the pipeline of the stage whose grads_final is
   this overlap's hook): PP_OK on every rank of the grid, or an error on every rank (the update
   is applied where it returned PP_OK, nowhere else). The overlap is then ready for the next
   step. stats may be NULL. Every member of the dp group (and of the tied pair) calls it. */
pp_result pp_dp_overlap_wait(pp_dp_overlap* o, pp_dp_overlap_stats* stats, pp_error* err);
/* pp_dp_overlap_wait where the stage's grads_final is not pp_dp_overlap_hook itself (a hook of
   yours that calls it) or no stage runs the hooks: step_rc is what pp_stage_step returned on
   this rank, st its stage (its pipeline takes part in the vote; NULL: the dp group alone). */
pp_result pp_dp_overlap_end(pp_dp_overlap* o, pp_stage* st, pp_result step_rc, pp_dp_overlap_stats* stats,
                            pp_error* err);
/* After a failed wait (the gradients hold part of the step: zero them): forgets what the hooks
   did and ends the step (once: a reset after a failed wait ends that same step). Never after a
   step whose wait returned PP_OK. The blocking buckets' messages carry the step's identity
   (the stage's step count, told to the hook), so nothing a failed step left on dp's transport is
   taken later: dp's world needs no reset (docs/errors.md, the recovery for a grid). */
void pp_dp_overlap_reset(pp_dp_overlap* o);
/* The last failure's message ("" if none), e.g. of a hook that failed a step. */
const char* pp_dp_overlap_error(const pp_dp_overlap* o);
/* >>ckpt -------------------------------------------------------------------------------------- */
/* Checkpoints that do not depend on the pipeline's shape. A file holds a model's parameters, and
   optionally an optimizer's state, layer by layer: saved from any p, v, schedule or partition,
   loaded at any other, because a rank reads and writes the layers it owns by layer index. The
   model names its buffers through pp_model.params (PP_MODEL_PARAMS); an optimizer's state is
   given as model structs bound like the weights (Adam's m and v: the same struct type, pointing
   into other buffers), each saved as a named "state".
       pp_ckpt_desc c = {0};
       c.model = m;                            // with m.params set
       c.weights = &w;
       const void* st[2] = {&adam_m, &adam_v}; const char* names[2] = {"m", "v"};
       c.n_state = 2; c.state = st; c.state_names = names; c.step = step;
       pp_ckpt_save_file(&c, "run.ckpt", &err);
       ...
       pp_ckpt_load_file(&c, "run.ckpt", &info, &err);   // info.step: where to go on
   Every offset in the file follows from the layers' sizes, which every rank knows (params gives
   them without the data), so ranks of one pipeline can write one file together: each writes
   its own layers' records (own: a flag per layer, e.g. l where pp_schedule_layer_rank(s,
   first, l) == rank), one of them also the header (records_only = 0, the others 1; it must
   create the file before the others open it: a barrier between). A rank loads its own layers
   the same way, whatever partition saved them. The memory variants and pp_ckpt_io let you move
   the bytes yourself (MPI-IO, a gather, a socket).
   Loading checks everything before it writes a byte into your buffers: the header's and every
   record's checksum, the model's name, its layer count and each layer's kind, buffer count,
   dtypes and sizes (every layer, owned or not), the states asked for, and the file's length.
   Errors: PP_ERR_CORRUPT (not a checkpoint, truncated, a checksum that does not match),
   PP_ERR_INVALID (another model's name or layer kinds, a state the file lacks, a bad desc),
   PP_ERR_SIZE (another layer count, buffer count, dtype or size), PP_ERR_UNSUPPORTED (a newer
   version, the other byte order), PP_ERR_IO (a file that cannot be opened or written; a read
   that comes back short is a truncation); the message names the layer, the buffer and both
   sides. A load needs scratch of the bytes it reads (its layers' records) from PP_MALLOC; a
   save, the header's bytes (and with copy set, the largest layer's). Saving or loading from
   memory takes about 1.3 ns a byte, mostly the checksum (FNV-1a, a byte at a time): 1.3 s a GB
   (26 MB of a GPT, -O2, this project's 2-core test machine).

   FILE FORMAT, version 1. Integers little-endian; payloads in the saving machine's byte order
   (the header says which; another order is refused). FNV-1a 64 is the checksum: basis
   0xcbf29ce484222325, prime 0x100000001b3, over bytes.
       offset  bytes  field
       0       8      magic "PPCKPT\r\n"
       8       4      version (1)
       12      4      payload byte order: 1 little-endian, 2 big-endian
       16      8      H: header bytes (this table, slot names, layer and buffer tables)
       24      8      file bytes (all of it: a shorter file is truncated)
       32      4      L: layers
       36      4      S: slots (1 + states: slot 0 is "weights")
       40      4      B: buffers (over all layers, of one slot)
       44      4      0
       48      8      step (the caller's, e.g. the optimizer's step count)
       56      8      U: user bytes (the caller's blob, after the header)
       64      8      FNV-1a 64 of the user bytes
       72      8      FNV-1a 64 of bytes [0, H) with these 8 bytes read as 0
       80      48     model name, NUL-padded (the first 47 bytes are kept and compared)
       128     16 S   slot names, NUL-padded (15 bytes kept): "weights", then the states'
       ..      48 L   per layer: kind name (32, NUL-padded, 31 kept), first buffer (4),
                      buffer count (4), payload bytes of one slot (8)
       ..      16 B   per buffer: dtype (4, a pp_dtype), 0 (4), element count (8)
       H       U      user bytes, then zeros to a multiple of 8
       then records, layer 0 .. L-1, and inside a layer slot 0 .. S-1; a record is
       +0      4      0x31434552 ("REC1")
       +4      4      layer
       +8      4      slot
       +12     4      buffer count
       +16     8      P: payload bytes
       +24     8      FNV-1a 64 of the record's bytes [0, 24), then of its payload
       +32     P      the layer's buffers of that slot back to back, then zeros to a multiple of 8
   so a layer's records are contiguous, and record (l, s) lies at H + pad8(U) + the sizes of
   every record before it. */
typedef struct pp_ckpt_io {
    /* Writes n bytes at offset; returns the bytes written (n when all went). Save only. */
    size_t (*write)(void* ctx, uint64_t offset, const void* data, size_t n);
    /* Reads n bytes at offset; returns the bytes read (fewer where the data ends). Load only. */
    size_t (*read)(void* ctx, uint64_t offset, void* data, size_t n);
    void* ctx;
} pp_ckpt_io;

/* Tensor parallelism: a parameter split over a TP group (pp_ckpt_desc.tp). The params hook gives
   this rank's slice (its count); the file holds the parameter whole, the bytes a tp = 1 save
   writes. The slices: N units (ROWS: the rows of a row-major count / cols x cols matrix; COLS: its
   columns; FLAT: its count elements), chunk = ceil(N / n) for n TP ranks, rank k (its place in
   tp's ranks) holds units [min(N, k chunk), min(N, (k + 1) chunk)): torch.chunk's rule, so the
   last slices may be smaller, or empty. A ROWS or FLAT slice is contiguous; a COLS slice is its
   rows x width columns, row-major. Optimizer states are split like the weights. */
typedef enum pp_shard_axis {
    PP_SHARD_FLAT = 0,              /* count elements, contiguous */
    PP_SHARD_ROWS = 1,              /* rows of a 2-D row-major weight */
    PP_SHARD_COLS = 2               /* columns of a 2-D row-major weight */
} pp_shard_axis;

typedef struct pp_ckpt_shard {
    int layer;                      /* global layer index */
    int buffer;                     /* the buffer's index among the layer's params */
    pp_shard_axis axis;
    int64_t count;                  /* the whole parameter's elements */
    int64_t cols;                   /* ROWS and COLS: its columns (count a multiple of it) */
} pp_ckpt_shard;

typedef struct pp_ckpt_desc {
    pp_model model;                 /* its params hook names every layer's buffers */
    const void* weights;            /* model struct: the parameters (slot "weights") */
    int n_state;                    /* optimizer state sets, 0 .. 63 */
    const void* const* state;       /* n_state model structs bound like weights (Adam's m, v) */
    const char* const* state_names; /* n_state names, 1 .. 15 bytes, unique (NULL: "state0", ...) */
    const char* name;               /* the model's name in the file (NULL: model.name); set the
                                       same one where two models share a layout (gpt and gptz) */
    const unsigned char* own;       /* model.n_layers flags: the layers this call saves or loads
                                       (NULL: all). Every rank still describes every layer. */
    int records_only;               /* save: write only the owned layers' records, not the header
                                       (the ranks other than the header's writer) */
    int64_t step;                   /* save: stored in the header (load: see pp_ckpt_info) */
    void* user;                     /* save: user_bytes stored after the header; load: when not
                                       NULL, receives them (the file's must be user_bytes long) */
    size_t user_bytes;
    /* Optional: copies between the host and where the buffers live (device memory), e.g. with
       cudaMemcpy(dst, src, bytes, cudaMemcpyDefault); 0 on success. NULL: memcpy. */
    int (*copy)(void* user, void* dst, const void* src, size_t bytes);
    void* copy_user;
    /* Tensor parallelism (NULL / 0: none). Every rank of tp calls the save or load with the same
       own flags and shards. A save gathers the slices over tp's transport (isend/irecv) to tp's
       first rank, which alone writes (header and records, as records_only says); the others send
       and write nothing (pp_ckpt_save's io may be NULL there; pp_ckpt_save_file and _mem touch
       neither file nor buffer); the first rank then sends them its outcome, so a save that fails
       there (a write, the disk) fails on every TP rank. Each wait has tp's deadline. A load: each rank reads the
       records and takes its slices. */
    const pp_group* tp;
    const pp_ckpt_shard* shards;    /* n_shards buffers split over tp, at most one entry a buffer */
    int n_shards;
} pp_ckpt_desc;

/* What a checkpoint's header says. */
typedef struct pp_ckpt_info {
    uint32_t version;
    int n_layers;
    int n_state;                    /* slots other than the weights */
    int64_t step;
    uint64_t file_bytes;
    uint64_t user_bytes;
    char name[48];                  /* the model's name */
} pp_ckpt_info;

/* The file's size in bytes (every rank can compute it: the layers' sizes suffice). */
pp_result pp_ckpt_size(const pp_ckpt_desc* d, uint64_t* bytes, pp_error* err);
/* Save the header (unless records_only) and the owned layers' records through io (with tp: on
   tp's first rank; io may be NULL on the others). */
pp_result pp_ckpt_save(const pp_ckpt_desc* d, const pp_ckpt_io* io, pp_error* err);
/* Load the owned layers' buffers of the weights and of each state d names (a file may hold more
   states: the others are skipped), after checking all of it. info may be NULL. */
pp_result pp_ckpt_load(const pp_ckpt_desc* d, const pp_ckpt_io* io, pp_ckpt_info* info, pp_error* err);
/* The header alone (checked against its checksum), for a tool or to choose a model. */
pp_result pp_ckpt_read_info(const pp_ckpt_io* io, pp_ckpt_info* info, pp_error* err);
/* Files (stdio; offsets up to LONG_MAX). Save with records_only = 0 checks everything, writes a
   new file beside path (path.tmp-PID-N), flushes and syncs it and renames it over path: a save
   that is refused, fails or is killed leaves the previous file whole (a failed one removes its
   new file, a killed one leaves it). With records_only = 1 it opens an existing file and writes
   into it in place: where ranks write one file together, write to a new name and rename it when
   every rank is done, so that a crash keeps the last good checkpoint. */
pp_result pp_ckpt_save_file(const pp_ckpt_desc* d, const char* path, pp_error* err);
pp_result pp_ckpt_load_file(const pp_ckpt_desc* d, const char* path, pp_ckpt_info* info, pp_error* err);
/* Memory: the file's image in buf (cap at least pp_ckpt_size; bytes outside the call's own
   records and header are left as they are), or read from bytes bytes of buf. */
pp_result pp_ckpt_save_mem(const pp_ckpt_desc* d, void* buf, size_t cap, pp_error* err);
pp_result pp_ckpt_load_mem(const pp_ckpt_desc* d, const void* buf, size_t bytes, pp_ckpt_info* info, pp_error* err);

/* >>tp ---------------------------------------------------------------------------------------- */
/* Tensor parallelism: the collectives of a layer split over a TP group (pp_grid.tp_group: the tp
   ranks of one stage of one replica, pp_grid_make_tp). Every member calls the same collective
   with the same count and dtype, in the same order; a TP group is a pp_group (>>grad): a
   transport, the group's ranks on it (ranks[i] is TP rank i; ranks NULL: all of the
   transport's ranks) and a deadline for each wait. A NULL group, or one whose t is NULL, is this
   process alone (tp = 1): the calls copy and return.

   DETERMINISTIC. A sum is done once per element, by one rank, in TP rank order (x_0 + x_1 + ...
   + x_{n-1}, left to right, starting from x_0) and sent to the others as bits: every member ends
   with the same bits, every run, and they are the bits of that sequential sum. f32 sums in f32,
   f64 in f64, f16 and bf16 are widened to f32, summed in f32 and rounded once.

   UNEVEN SPLITS. Reduce-scatter and all-gather split count elements into n blocks as
   pp_tp_block says: block i starts at i * (count / n) + min(i, count % n) and holds count / n
   elements, one more for the first count % n blocks (numpy's array_split; blocks may be empty).

   HOW A LAYER REACHES ITS GROUP. io->tp: pp_stage_desc.tp, the rank's group, which every layer
   call gets (the one-process pipeline with tp > 1 sets it for every rank; pp_group_rank(io->tp)
   is the layer's TP rank; tests/test_pipeline.c, "grid"). Or through pp_stage_desc.layer_ctx
   (io->ctx): a struct of yours holding the group, one per rank (tests/test_tp.c, "layer").

   BOUNDARIES. With pp_stage_desc.tp set to the same group, the stage sends each replicated
   boundary tensor (pp_layer_desc.out_tp, pp_tp_layout) as this TP rank's rows, pp_tp_block(rows,
   tp, tp_rank), to the same TP rank of the next stage and all-gathers what it receives over the
   group before its layers read it (gradients likewise, backward); a SHARDED
   tensor goes as it is. 1/tp of the bytes between stages (pp_tp_boundary_bytes), plus the
   gather's inside the group (pp_step_stats.tp_gather_bytes); tests/test_tp.c, "boundary".

   THE WIRE. This version builds every collective from the transport's isend/irecv/wait (inside
   group_start/group_end where the transport has them): a reduce-scatter sends each block
   straight to its owner, which sums; an all-gather sends each rank's block to every other; an
   all-reduce is a reduce-scatter then an all-gather (2 (n - 1) / n of the buffer out of each
   rank). So it runs over the threads transport, pipeline_mpi.h's and pipeline_nccl.h's (host
   memory: staged through the GPU). Buffers are host memory: the sums run on the CPU. NCCL's
   stream-ordered native collectives over device memory are a later step. On a failed wait the
   call cancels its other receives (where the transport can) and returns the error.

   STEP IDENTITY. Called on the thread running pp_stage_step (or pp_stage_eval: its layers, its
   hooks), a collective's messages, and the boundary gathers', carry the stage's step count, the
   same on every rank that calls the same steps: what a failed step left in a TP transport (a
   block sent to a member that had stopped) is never taken by a later step, reset or not. So
   every member calls a collective from inside a step, or every member from outside (fixed tags).
   After a failed step reset a threads TP world too (pp_threads_reset): the identity wraps. */

/* Where this process is in group g: its index in g->ranks (its transport's rank where ranks is
   NULL; -1 where it is not a member), and the group's size. A NULL group, or one whose t is NULL,
   is this process alone: rank 0 of 1. A layer asks pp_group_rank(io->tp) for its TP rank. */
int pp_group_rank(const pp_group* g);
int pp_group_size(const pp_group* g);
/* Block i of count elements split n ways: its offset and length (above). */
void pp_tp_block(size_t count, int n, int i, size_t* off, size_t* len);
/* A replicated boundary tensor of rows x row_bytes split over tp (pp_stage_desc.tp): the bytes TP
   rank tp_rank sends to the next stage (its rows' pp_tp_block) and, receiving it, sends to the
   other tp - 1 members in the gather. tp <= 1: the whole tensor, no gather. Either may be NULL. */
void pp_tp_boundary_bytes(int64_t rows, size_t row_bytes, int tp, int tp_rank, size_t* sent, size_t* gather_sent);
/* buf (count elements of dtype: PP_F32, PP_F64, PP_F16 or PP_BF16) summed over the group, in
   place: every member ends with the same bits. */
pp_result pp_tp_allreduce(const pp_group* g, void* buf, size_t count, pp_dtype dtype, pp_error* err);
/* send (count elements, the whole tensor) summed over the group; this member's block of the sum
   (pp_tp_block(count, n, its TP rank)) into recv. recv may be send's own block. */
pp_result pp_tp_reducescatter(const pp_group* g, const void* send, void* recv, size_t count, pp_dtype dtype,
                              pp_error* err);
/* Every member's block (send: pp_tp_block(count, n, its TP rank) elements) into recv (count
   elements, the whole tensor), block by block in TP rank order. send may be recv's own block. */
pp_result pp_tp_allgather(const pp_group* g, const void* send, void* recv, size_t count, pp_dtype dtype,
                          pp_error* err);
/* >>deprecated -------------------------------------------------------------------------------- */
/* Names of earlier versions that keep working (docs/api.md lists the current API by task; the
   CHANGELOG says when each was replaced). Renamed functions are macros for their new names;
   the others keep their definitions, and each says what replaces it. */
#define pp_schedule_stage_rank pp_schedule_stage_to_rank   /* deprecated: the name hid the direction */
#define pp_schedule_stage pp_schedule_rank_to_stage        /* deprecated: the name hid the direction */
/* Deprecated: pp_stage_flight, then pp_flight_print (what this does). */
void pp_stage_flight_print(FILE* out, const pp_stage* st);
/* Deprecated: the bytes and messages rank has sent (cumulative) repeat pp_step_stats'
   bytes_sent and msgs_sent, which every transport fills per step: add those up. */
void pp_threads_counters(pp_threads* t, int rank, uint64_t* bytes, uint64_t* msgs);

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
#include <limits.h>
#include <float.h>
#include <pthread.h>

/* A header included before this one under -std=c99 (<stdio.h>, say) fixed the library's feature
   set without POSIX, so <time.h> declared no clock_gettime: declare the two clocks used here
   (glibc: pthread.h brought struct timespec, bits/types.h __clockid_t; the Linux clock ids). */
#if defined(__linux__) && defined(__GLIBC__) && !defined(CLOCK_MONOTONIC) && !defined(__cplusplus)
extern int clock_gettime(__clockid_t clock, struct timespec* ts);
extern int nanosleep(const struct timespec* req, struct timespec* rem); /* pipeline_mpi.h, _nccl.h */
#define CLOCK_REALTIME 0
#define CLOCK_MONOTONIC 1
#endif

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

/* The validation layer (>>impl-validate) and the executor's debug checks: on unless NDEBUG or
   PP_NO_VALIDATE. Under AddressSanitizer the guards are also poisoned during each layer call. */
#if !defined(NDEBUG) && !defined(PP_NO_VALIDATE)
#define _PP_VALIDATE 1
#else
#define _PP_VALIDATE 0
#endif
#if defined(__SANITIZE_ADDRESS__)
#define _PP_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define _PP_ASAN 1
#endif
#endif
#if defined(_PP_ASAN) && _PP_VALIDATE
#include <sanitizer/asan_interface.h>
#define _PP_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define _PP_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define _PP_POISON(p, n) ((void)(p), (void)(n))
#define _PP_UNPOISON(p, n) ((void)(p), (void)(n))
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

/* msg without a leading "<code's string>: ": a message quoted inside another of the same code
   says its code once. */
static const char* _pp_strip_code(const char* msg, pp_result code) {
    size_t k = strlen(pp_result_str(code));
    return strncmp(msg, pp_result_str(code), k) == 0 && msg[k] == ':' && msg[k + 1] == ' ' ? msg + k + 2 : msg;
}

/* Length of a leading "rank R" in msg (followed by ':' or ' '), else 0. */
static size_t _pp_names_rank(const char* msg, int rank) {
    char head[24];
    size_t k = (size_t)snprintf(head, sizeof head, "rank %d", rank);
    return strncmp(msg, head, k) == 0 && (msg[k] == ':' || msg[k] == ' ') ? k : 0;
}

/* What a transport keeps and passes on when rank `rank` aborts a step: the rank's own message,
   which names it already ("layer callback failed: rank 2 at F0.0 (stage 2): ..."), with one
   code prefix; a message that does not name the rank gets "rank R: " after the code. */
static void _pp_abort_text(char* out, size_t n, int rank, pp_result why, const char* msg) {
    const char* body = msg && msg[0] ? _pp_strip_code(msg, why) : "gave no message";
    if (_pp_names_rank(body, rank))
        snprintf(out, n, "%s: %s", pp_result_str(why), body);
    else
        snprintf(out, n, "%s: rank %d: %s", pp_result_str(why), rank, body);
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

/* >>impl-tensor */
size_t pp_dtype_size(pp_dtype t) {
    switch (t) {
    case PP_F32: return 4;
    case PP_F64: return 8;
    case PP_F16: return 2;
    case PP_BF16: return 2;
    case PP_I32: return 4;
    case PP_I64: return 8;
    case PP_U8: return 1;
    default: return 0;
    }
}

int pp_dtype_is_float(pp_dtype t) {
    return t == PP_F32 || t == PP_F64 || t == PP_F16 || t == PP_BF16;
}

const char* pp_dtype_name(pp_dtype t) {
    static const char* const names[PP_DTYPE_COUNT] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8"};
    return (t >= 0 && t < PP_DTYPE_COUNT) ? names[t] : "?";
}

size_t pp_tensor_bytes(const pp_tensor* t) {
    if (!t || t->rows < 0 || t->cols < 0) return 0;
    return (size_t)t->rows * (size_t)t->cols * pp_dtype_size(t->dtype);
}

float pp_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (uint32_t)(h >> 10) & 0x1fu, m = (uint32_t)h & 0x3ffu, u;
    float f;
    if (e == 0x1fu) {
        u = sign | 0x7f800000u | (m << 13); /* Inf, or a NaN with its payload */
    } else if (e) {
        u = sign | ((e + 112u) << 23) | (m << 13); /* exponent bias 15 -> 127 */
    } else {
        f = (float)m * 5.9604644775390625e-8f; /* zero or subnormal: m * 2^-24, exact */
        memcpy(&u, &f, 4);
        u |= sign;
    }
    memcpy(&f, &u, 4);
    return f;
}

uint16_t pp_f32_to_f16(float f) {
    uint32_t u, a, sign, shift, mant, q, rem, half;
    memcpy(&u, &f, 4);
    sign = (u >> 16) & 0x8000u;
    a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x1ffu)); /* a quiet NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 (and Inf): Inf */
    if (a >= 0x38800000u) { /* a normal half (>= 2^-14): rebias, round the 13 bits dropped */
        a -= 0x38000000u;
        a += 0xfffu + ((a >> 13) & 1u);
        return (uint16_t)(sign | (a >> 13));
    }
    if (a < 0x33000000u) return (uint16_t)sign; /* below 2^-25 (or exactly it: the tie goes to 0) */
    shift = 126u - (a >> 23); /* a subnormal half: m = round(value * 2^24) */
    mant = (a & 0x7fffffu) | 0x800000u;
    q = mant >> shift;
    rem = mant & ((1u << shift) - 1u);
    half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++; /* 0x400 when it rounds up to the smallest normal */
    return (uint16_t)(sign | q);
}

float pp_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t pp_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* a quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* A shape whose byte count can be computed and allocated: rows, cols >= 0, a known dtype, and
   rows * cols * size below 2^48 bytes (no size_t overflow can turn a huge shape into a small
   buffer that a layer then overruns). */
#define _PP_MAX_TENSOR_BYTES ((double)(1ull << 48))
static int _pp_shape_ok(int64_t rows, int64_t cols, pp_dtype dt) {
    size_t es = pp_dtype_size(dt);
    if (rows < 0 || cols < 0 || es == 0) return 0;
    return (double)rows * (double)cols * (double)es < _PP_MAX_TENSOR_BYTES;
}

/* >>impl-model */
pp_result pp_model_check(const pp_model* m, pp_error* err) {
    const char* name;
    int k, sum = 0;
    if (!m) return _pp_fail(err, PP_ERR_INVALID, "model is NULL");
    name = m->name ? m->name : "?";
    if (m->n_kinds < 0 || (m->n_kinds > 0 && !m->kinds))
        return _pp_fail(err, PP_ERR_INVALID, "model '%s': n_kinds = %d with kinds %s", name, m->n_kinds,
                        m->kinds ? "set" : "NULL");
    if (m->n_layers <= 0 && m->n_kinds > PP_MAX_LAYER_KINDS)
        return _pp_fail(err, PP_ERR_INVALID,
                        "model '%s': its list has %d entries and only the first PP_MAX_LAYER_KINDS = %d can change "
                        "their count: define PP_MAX_LAYER_KINDS larger",
                        name, m->n_kinds, PP_MAX_LAYER_KINDS);
    if (m->order && m->n_kinds <= 0)
        return _pp_fail(err, PP_ERR_INVALID, "model '%s': an order without the list's kinds (n_kinds 0)", name);
    for (k = 0; m->order && k < m->n_layers; k++)
        if (m->order[k] < 0 || m->order[k] >= m->n_kinds)
            return _pp_fail(err, PP_ERR_INVALID, "model '%s': order[%d] = %d is not a kind (0 .. %d)", name, k,
                            m->order[k], m->n_kinds - 1);
    for (k = 0; k < m->n_kinds; k++) {
        int n = k < PP_MAX_LAYER_KINDS ? m->in_use[k] : m->kinds[k].count;
        if (m->order) { /* the order decides: n is how often kind k appears in it */
            int l, c = 0;
            for (l = 0; l < m->n_layers; l++) c += m->order[l] == k;
            if (k < PP_MAX_LAYER_KINDS && c != n)
                return _pp_fail(err, PP_ERR_INVALID, "model '%s': the order has %d '%s' layers, in_use says %d", name, c,
                                m->kinds[k].name ? m->kinds[k].name : "?", n);
            n = c;
        }
        if (n < 0 || n > m->kinds[k].count)
            return _pp_fail(err, PP_ERR_INVALID, "model '%s': %d '%s' layers in use, the list holds %d (0 .. %d allowed)",
                            name, n, m->kinds[k].name ? m->kinds[k].name : "?", m->kinds[k].count, m->kinds[k].count);
        sum += n;
    }
    if (m->n_kinds > 0 && sum != m->n_layers)
        return _pp_fail(err, PP_ERR_INVALID,
                        "model '%s': n_layers = %d but its entries use %d layers (change counts with %s_model_desc_counts)",
                        name, m->n_layers, sum, name);
    if (m->n_layers <= 0) return _pp_fail(err, PP_ERR_INVALID, "model '%s' has %d layers", name, m->n_layers);
    if (!m->forward || !m->backward || !m->describe)
        return _pp_fail(err, PP_ERR_INVALID, "model '%s': forward, backward and describe must all be set", name);
    return PP_OK;
}

const char* pp_model_layer_name(const pp_model* m, int l) {
    int i = 0, k;
    if (!m) return "?";
    if (m->n_kinds > 0 && m->kinds) {
        k = _pp_model_locate(m, m->kinds, m->n_kinds, l, &i);
        return k >= 0 && m->kinds[k].name ? m->kinds[k].name : "?";
    }
    return m->layer_name ? m->layer_name(l) : "layer";
}

static const char* _pp_layer_name(const pp_model* m, int l) { return pp_model_layer_name(m, l); }

/* Shapes crossing one layer boundary (data NULL). */
typedef struct _pp_bnd {
    int n;
    pp_tensor t[PP_MAX_TENSORS];
    unsigned char tp[PP_MAX_TENSORS]; /* pp_tp_layout of each (describe's out_tp) */
} _pp_bnd;

/* Runs describe() for layer l and checks what it returned. */
static pp_result _pp_describe(const pp_model* m, const void* w, int l, const pp_microbatch* mb,
                              const _pp_bnd* in, _pp_bnd* out, pp_layer_desc* d, pp_error* err) {
    int k;
    memset(d, 0, sizeof *d);
    d->model = m;
    m->describe(w, l, mb, in->t, in->n, d);
    if (d->n_out < 0 || d->n_out > PP_MAX_TENSORS)
        return _pp_fail(err, PP_ERR_INVALID, "layer %d (%s): describe gave n_out=%d (0..%d allowed)", l,
                        _pp_layer_name(m, l), d->n_out, PP_MAX_TENSORS);
    if (l < m->n_layers - 1 && d->n_out == 0)
        return _pp_fail(err, PP_ERR_INVALID,
                        "layer %d (%s) has no outputs but is not the last layer (only the loss layer may)", l,
                        _pp_layer_name(m, l));
    if (l == m->n_layers - 1 && d->n_out != 0)
        return _pp_fail(err, PP_ERR_INVALID,
                        "last layer %d (%s) must be the loss layer (n_out = 0), describe gave %d outputs", l,
                        _pp_layer_name(m, l), d->n_out);
    out->n = d->n_out;
    for (k = 0; k < d->n_out; k++) {
        const pp_tensor* t = &d->out[k];
        if (!_pp_shape_ok(t->rows, t->cols, t->dtype))
            return _pp_fail(err, PP_ERR_INVALID, "layer %d (%s): output %d has shape [%lld, %lld] dtype %d", l,
                            _pp_layer_name(m, l), k, (long long)t->rows, (long long)t->cols, (int)t->dtype);
        if (d->out_tp[k] != PP_TP_REPLICATED && d->out_tp[k] != PP_TP_SHARDED)
            return _pp_fail(err, PP_ERR_INVALID, "layer %d (%s): output %d has out_tp = %d (PP_TP_REPLICATED or PP_TP_SHARDED)",
                            l, _pp_layer_name(m, l), k, (int)d->out_tp[k]);
        out->t[k] = *t;
        out->t[k].data = NULL;
        out->tp[k] = (unsigned char)d->out_tp[k];
    }
    return PP_OK;
}

pp_result pp_model_layer_costs(const pp_model* m, const void* weights, const pp_tensor* input, double* cost,
                               int64_t* n_params, pp_error* err) {
    pp_microbatch mb;
    _pp_bnd a, b;
    pp_layer_desc d;
    pp_result rc;
    int l;
    if ((rc = pp_model_check(m, err)) != PP_OK) return rc;
    if (!weights)
        return _pp_fail(err, PP_ERR_INVALID,
                        "weights is NULL: describe reads each layer's parameter struct (its sizes, not its data); "
                        "pass the model struct, its arrays may be unallocated");
    if (!input || input->rows <= 0 || input->cols <= 0 || pp_dtype_size(input->dtype) == 0)
        return _pp_fail(err, PP_ERR_INVALID, "sample input must have rows > 0, cols > 0 and a valid dtype");
    memset(&mb, 0, sizeof mb);
    mb.count = 1;
    mb.rows = input->rows;
    mb.loss_scale = 1.0f;
    a.n = 1;
    a.t[0] = *input;
    a.t[0].data = NULL;
    for (l = 0; l < m->n_layers; l++) {
        if ((rc = _pp_describe(m, weights, l, &mb, &a, &b, &d, err)) != PP_OK) return rc;
        if (cost) cost[l] = d.cost > 0 ? d.cost : 1.0;
        if (n_params) n_params[l] = d.n_params;
        a = b;
    }
    return PP_OK;
}

/* >>impl-partition */
pp_result pp_partition_check(const int* first, int n_layers, int n_stages, pp_error* err) {
    int s;
    if (!first) return _pp_fail(err, PP_ERR_INVALID, "partition is NULL");
    if (n_stages <= 0) return _pp_fail(err, PP_ERR_INVALID, "partition needs n_stages > 0 (got %d)", n_stages);
    if (n_layers < n_stages)
        return _pp_fail(err, PP_ERR_INVALID, "%d stages need at least %d layers, the model has %d", n_stages,
                        n_stages, n_layers);
    if (first[0] != 0) return _pp_fail(err, PP_ERR_INVALID, "partition must start at layer 0 (first[0] = %d)", first[0]);
    if (first[n_stages] != n_layers)
        return _pp_fail(err, PP_ERR_INVALID, "partition must end at layer %d (first[%d] = %d): layers would be dropped",
                        n_layers, n_stages, first[n_stages]);
    for (s = 0; s < n_stages; s++)
        if (first[s + 1] <= first[s])
            return _pp_fail(err, PP_ERR_INVALID, "stage %d is empty or reversed (layers [%d, %d))", s, first[s],
                            first[s + 1]);
    return PP_OK;
}

pp_result pp_partition_uniform(int n_layers, int n_stages, int* first, pp_error* err) {
    int s;
    if (!first) return _pp_fail(err, PP_ERR_INVALID, "partition output is NULL");
    if (n_stages <= 0) return _pp_fail(err, PP_ERR_INVALID, "partition needs n_stages > 0 (got %d)", n_stages);
    if (n_layers < n_stages)
        return _pp_fail(err, PP_ERR_INVALID, "cannot split %d layers into %d stages (more stages than layers)",
                        n_layers, n_stages);
    first[0] = 0;
    for (s = 0; s < n_stages; s++) first[s + 1] = first[s] + n_layers / n_stages + (s < n_layers % n_stages);
    return PP_OK;
}

pp_result pp_partition_balanced(const double* weight, int n_layers, int n_stages, int* first, pp_error* err) {
    /* best[s*(L+1)+l]: smallest possible maximum stage weight covering layers [0,l) with s stages. */
    double *pre = NULL, *best = NULL;
    int *cut = NULL, s, l, j, L = n_layers;
    pp_result rc = PP_OK;
    if (!weight || !first) return _pp_fail(err, PP_ERR_INVALID, "weights and partition output must be non-NULL");
    if (n_stages <= 0) return _pp_fail(err, PP_ERR_INVALID, "partition needs n_stages > 0 (got %d)", n_stages);
    if (n_layers < n_stages)
        return _pp_fail(err, PP_ERR_INVALID, "cannot split %d layers into %d stages (more stages than layers)",
                        n_layers, n_stages);
    for (l = 0; l < L; l++)
        if (!(weight[l] >= 0) || weight[l] > 1e300)
            return _pp_fail(err, PP_ERR_INVALID, "layer %d has weight %g (must be finite and >= 0)", l, weight[l]);
    pre = (double*)_pp_calloc((size_t)L + 1, sizeof *pre);
    best = (double*)_pp_calloc((size_t)(n_stages + 1) * (size_t)(L + 1), sizeof *best);
    cut = (int*)_pp_calloc((size_t)(n_stages + 1) * (size_t)(L + 1), sizeof *cut);
    if (!pre || !best || !cut) {
        rc = _pp_fail(err, PP_ERR_NOMEM, "partition scratch for %d layers x %d stages", L, n_stages);
        goto cleanup;
    }
    for (l = 0; l < L; l++) pre[l + 1] = pre[l] + weight[l];
    for (l = 1; l <= L; l++) best[1 * (L + 1) + l] = pre[l];
    /* cost(j) = max(best[s-1][j], pre[l] - pre[j]) is the maximum of a non-decreasing and a
       non-increasing function of j, so it falls then rises: walk j forward while it does not
       rise. The best j never moves left as l grows (every stage weight is >= 0), so one pointer
       per s suffices: O(S*L) in all. */
    for (s = 2; s <= n_stages; s++) {
        j = s - 1;
        for (l = s; l <= L - (n_stages - s); l++) {
            const double* prev = &best[(s - 1) * (L + 1)];
#define _PP_SPLIT_COST(jj) (prev[jj] > pre[l] - pre[jj] ? prev[jj] : pre[l] - pre[jj])
            while (j + 1 < l && _PP_SPLIT_COST(j + 1) <= _PP_SPLIT_COST(j)) j++;
            best[s * (L + 1) + l] = _PP_SPLIT_COST(j);
#undef _PP_SPLIT_COST
            cut[s * (L + 1) + l] = j;
        }
    }
    first[n_stages] = L;
    for (s = n_stages; s >= 2; s--) first[s - 1] = cut[s * (L + 1) + first[s]];
    first[0] = 0;
    rc = pp_partition_check(first, L, n_stages, err);
cleanup:
    PP_FREE(pre);
    PP_FREE(best);
    PP_FREE(cut);
    return rc;
}

double pp_partition_imbalance(const double* weight, int n_layers, const int* first, int n_stages) {
    double total = 0, worst = 0;
    int s, l;
    if (!first || n_stages <= 0 || n_layers <= 0) return 0;
    for (s = 0; s < n_stages; s++) {
        double w = 0;
        for (l = first[s]; l < first[s + 1]; l++) w += weight ? weight[l] : 1.0;
        total += w;
        if (w > worst) worst = w;
    }
    return total > 0 ? worst / (total / n_stages) : 1.0;
}

static int _pp_sched_map_rank(pp_stage_map map, int p, int stage);

/* The ranks' loads of a split: sums of their stages' weights (prefix sums pw), largest rank's and
   largest stage's; 0 if a stage is empty or over the memory cap (mem, cap > 0). */
static int _pp_partition_loads(const double* pw, const double* pm, double cap, const pp_schedule* s, const int* first,
                               double* rank_max, double* stage_max) {
    double load[PP_MAX_RANKS];
    int st, r;
    for (r = 0; r < s->p; r++) load[r] = 0;
    *stage_max = 0;
    for (st = 0; st < s->n_stages; st++)
        if (first[st + 1] <= first[st]) return 0; /* first[0] = 0 and first[S] = L: all within [0, L] */
    for (st = 0; st < s->n_stages; st++) {
        double x = pw[first[st + 1]] - pw[first[st]];
        if (pm && cap > 0 && pm[first[st + 1]] - pm[first[st]] > cap) return 0;
        r = _pp_sched_map_rank(s->map, s->p, st); /* the map's helper: this runs for every split tried */
        load[r] += x;
        if (x > *stage_max) *stage_max = x;
    }
    *rank_max = 0;
    for (r = 0; r < s->p; r++)
        if (load[r] > *rank_max) *rank_max = load[r];
    return 1;
}

/* How many contiguous splits of L layers into S non-empty stages there are: C(L-1, S-1). */
static double _pp_partition_splits(int L, int S) {
    double c = 1;
    int i;
    for (i = 1; i < S; i++) c = c * (double)(L - S + i) / (double)i;
    return c;
}

/* 1 if (r, st) beats (best_r, best_s): a smaller largest rank, then a smaller largest stage. */
static int _pp_partition_better(double r, double st, double best_r, double best_s) {
    return r < best_r * (1 - 1e-12) || (r <= best_r * (1 + 1e-12) && st < best_s * (1 - 1e-12));
}

/* pp_partition_desc.schedule: the split with the smallest largest rank's sum (then the smallest
   largest stage's) under the memory cap, starting from the min-max split in first. Every split
   where there are at most 1e5 of them; else moves from the min-max split (one boundary, or a run
   of them together, by any number of layers) while one improves. */
static void _pp_partition_ranks(const double* w, const double* mem, double cap, int L, const pp_schedule* s, int* first) {
    double *pw = (double*)_pp_calloc((size_t)L + 1, sizeof *pw), *pm = mem ? (double*)_pp_calloc((size_t)L + 1, sizeof *pm) : NULL;
    double best_r, best_s;
    int l, b, d, e, improved = 1, rounds = 0;
    if (!pw || (mem && !pm) || s->p < 1 || s->p > PP_MAX_RANKS) { /* no memory or no ranks: the min-max split stays */
        PP_FREE(pw);
        PP_FREE(pm);
        return;
    }
    for (l = 0; l < L; l++) {
        pw[l + 1] = pw[l] + w[l];
        if (pm) pm[l + 1] = pm[l] + mem[l];
    }
    if (!_pp_partition_loads(pw, pm, cap, s, first, &best_r, &best_s)) improved = 0;
    if (improved && _pp_partition_splits(L, s->n_stages) <= 1e5) {
        int S = s->n_stages, k, *c = (int*)_pp_calloc((size_t)S + 1, sizeof *c);
        if (c) {
            for (c[0] = 0, c[S] = L, k = 1; k < S; k++) c[k] = k;
            for (;;) {
                double r_max, s_max;
                if (_pp_partition_loads(pw, pm, cap, s, c, &r_max, &s_max) &&
                    _pp_partition_better(r_max, s_max, best_r, best_s)) {
                    best_r = r_max;
                    best_s = s_max;
                    memcpy(first, c, sizeof *c * (size_t)(S + 1));
                }
                for (k = S - 1; k >= 1 && c[k] == L - (S - k); k--) {
                }
                if (k < 1) break;
                c[k]++;
                for (k = k + 1; k < S; k++) c[k] = c[k - 1] + 1;
            }
            PP_FREE(c);
            improved = 0; /* every split was tried */
        }
    }
    /* moves: one boundary, or a run of them together (a block of stages shifted), by any number
       of layers that keeps every stage non-empty */
    while (improved && rounds++ < 4LL * L * s->n_stages) {
        improved = 0;
        for (b = 1; b < s->n_stages; b++)
            for (e = b; e < s->n_stages; e++)
                for (d = -L; d <= L; d++) {
                    double r_max, s_max;
                    int k;
                    if (!d) continue;
                    for (k = b; k <= e; k++) first[k] += d;
                    if (_pp_partition_loads(pw, pm, cap, s, first, &r_max, &s_max) &&
                        _pp_partition_better(r_max, s_max, best_r, best_s)) {
                        best_r = r_max;
                        best_s = s_max;
                        improved = 1;
                    } else {
                        for (k = b; k <= e; k++) first[k] -= d;
                    }
                }
    }
    PP_FREE(pw);
    PP_FREE(pm);
}

pp_result pp_partition_model(const pp_model* m, const void* weights, const pp_partition_desc* d, int* first,
                             double* imbalance, pp_error* err) {
    double* w = NULL;
    int64_t* np = NULL;
    pp_result rc;
    int l;
    if (!d) return _pp_fail(err, PP_ERR_INVALID, "partition desc is NULL");
    if ((rc = pp_model_check(m, err)) != PP_OK) return rc;
    if ((d->mem || d->mem_cap > 0) && (d->policy == PP_PARTITION_UNIFORM || d->policy == PP_PARTITION_EXPLICIT))
        return _pp_fail(err, PP_ERR_INVALID, "a memory cap applies to the COST, PARAMS and WEIGHTS policies");
    switch (d->policy) {
    case PP_PARTITION_UNIFORM:
        rc = pp_partition_uniform(m->n_layers, d->n_stages, first, err);
        if (rc == PP_OK && imbalance) *imbalance = pp_partition_imbalance(NULL, m->n_layers, first, d->n_stages);
        return rc;
    case PP_PARTITION_EXPLICIT:
        if (!d->explicit_first) return _pp_fail(err, PP_ERR_INVALID, "explicit partition without boundaries");
        if ((rc = pp_partition_check(d->explicit_first, m->n_layers, d->n_stages, err)) != PP_OK) return rc;
        if (!first) return _pp_fail(err, PP_ERR_INVALID, "partition output is NULL");
        memcpy(first, d->explicit_first, sizeof(int) * (size_t)(d->n_stages + 1));
        if (imbalance) *imbalance = pp_partition_imbalance(NULL, m->n_layers, first, d->n_stages);
        return PP_OK;
    case PP_PARTITION_COST:
    case PP_PARTITION_PARAMS:
    case PP_PARTITION_WEIGHTS:
        break;
    default:
        return _pp_fail(err, PP_ERR_INVALID, "unknown partition policy %d", (int)d->policy);
    }
    if (d->policy == PP_PARTITION_WEIGHTS && !d->weight)
        return _pp_fail(err, PP_ERR_INVALID, "weights partition without weight[] (one per layer)");
    if (d->policy != PP_PARTITION_WEIGHTS && !d->sample)
        return _pp_fail(err, PP_ERR_INVALID, "cost/params partition needs a sample input shape");
    w = (double*)_pp_calloc((size_t)m->n_layers, sizeof *w);
    np = (int64_t*)_pp_calloc((size_t)m->n_layers, sizeof *np);
    if (!w || !np) {
        rc = _pp_fail(err, PP_ERR_NOMEM, "partition weights");
        goto cleanup;
    }
    if (d->policy == PP_PARTITION_WEIGHTS) memcpy(w, d->weight, sizeof *w * (size_t)m->n_layers);
    else if ((rc = pp_model_layer_costs(m, weights, d->sample, w, np, err)) != PP_OK) goto cleanup;
    if (d->policy == PP_PARTITION_PARAMS)
        for (l = 0; l < m->n_layers; l++) w[l] = (double)np[l];
    if (d->mem_cap > 0 || d->mem) {
        if (!d->mem || !(d->mem_cap > 0)) rc = _pp_fail(err, PP_ERR_INVALID, "a memory cap needs both mem[] and mem_cap > 0");
        else rc = pp_partition_capped(w, d->mem, d->mem_cap, m->n_layers, d->n_stages, first, err);
    } else {
        rc = pp_partition_balanced(w, m->n_layers, d->n_stages, first, err);
    }
    if (rc == PP_OK && d->schedule && d->schedule->v > 1) {
        if (d->schedule->n_stages != d->n_stages)
            rc = _pp_fail(err, PP_ERR_INVALID, "partition of %d stages for a schedule of %d", d->n_stages,
                          d->schedule->n_stages);
        else if (d->schedule->p < 1 || d->schedule->p > PP_MAX_RANKS)
            rc = _pp_fail(err, PP_ERR_INVALID, "the partition's schedule has p = %d ranks (1 .. %d)", d->schedule->p,
                          PP_MAX_RANKS);
        else
            _pp_partition_ranks(w, d->mem, d->mem_cap, m->n_layers, d->schedule, first);
    }
    if (rc == PP_OK && imbalance) *imbalance = pp_partition_imbalance(w, m->n_layers, first, d->n_stages);
cleanup:
    PP_FREE(w);
    PP_FREE(np);
    return rc;
}

pp_result pp_partition_capped(const double* weight, const double* mem, double mem_cap, int n_layers, int n_stages,
                              int* first, pp_error* err) {
    /* best[s*(L+1)+l]: smallest maximum stage weight covering [0, l) with s stages that all fit */
    double *pw = NULL, *pm = NULL, *best = NULL;
    int *cut = NULL, s, l, j, L = n_layers;
    const double inf = 1e308;
    pp_result rc = PP_OK;
    if (!weight || !mem || !first) return _pp_fail(err, PP_ERR_INVALID, "weights, memory and partition output must be non-NULL");
    if (n_stages <= 0) return _pp_fail(err, PP_ERR_INVALID, "partition needs n_stages > 0 (got %d)", n_stages);
    if (n_layers < n_stages)
        return _pp_fail(err, PP_ERR_INVALID, "cannot split %d layers into %d stages (more stages than layers)", n_layers,
                        n_stages);
    if (!(mem_cap >= 0) || mem_cap > 1e300) return _pp_fail(err, PP_ERR_INVALID, "memory cap %g must be finite and >= 0", mem_cap);
    for (l = 0; l < L; l++) {
        if (!(weight[l] >= 0) || weight[l] > 1e300 || !(mem[l] >= 0) || mem[l] > 1e300)
            return _pp_fail(err, PP_ERR_INVALID, "layer %d has weight %g, memory %g (must be finite and >= 0)", l, weight[l],
                            mem[l]);
        if (mem[l] > mem_cap)
            return _pp_fail(err, PP_ERR_SIZE, "layer %d alone needs memory %g, over the cap %g", l, mem[l], mem_cap);
    }
    pw = (double*)_pp_calloc((size_t)L + 1, sizeof *pw);
    pm = (double*)_pp_calloc((size_t)L + 1, sizeof *pm);
    best = (double*)_pp_calloc((size_t)(n_stages + 1) * (size_t)(L + 1), sizeof *best);
    cut = (int*)_pp_calloc((size_t)(n_stages + 1) * (size_t)(L + 1), sizeof *cut);
    if (!pw || !pm || !best || !cut) {
        rc = _pp_fail(err, PP_ERR_NOMEM, "capped partition scratch for %d layers x %d stages", L, n_stages);
        goto cleanup;
    }
    for (l = 0; l < L; l++) {
        pw[l + 1] = pw[l] + weight[l];
        pm[l + 1] = pm[l] + mem[l];
    }
    for (s = 0; s <= n_stages; s++)
        for (l = 0; l <= L; l++) best[s * (L + 1) + l] = inf;
    best[0] = 0;
    for (s = 1; s <= n_stages; s++)
        for (l = s; l <= L - (n_stages - s); l++)
            for (j = l - 1; j >= s - 1; j--) {
                double prev = best[(s - 1) * (L + 1) + j], w = pw[l] - pw[j], c;
                if (pm[l] - pm[j] > mem_cap) break; /* longer stages only need more */
                if (prev >= inf) continue;
                c = prev > w ? prev : w;
                if (c < best[s * (L + 1) + l]) {
                    best[s * (L + 1) + l] = c;
                    cut[s * (L + 1) + l] = j;
                }
            }
    if (best[n_stages * (L + 1) + L] >= inf) {
        rc = _pp_fail(err, PP_ERR_SIZE, "no split of %d layers into %d stages keeps every stage's memory under %g "
                      "(total %g: use more stages or raise the cap)", L, n_stages, mem_cap, pm[L]);
        goto cleanup;
    }
    first[n_stages] = L;
    for (s = n_stages; s >= 1; s--) first[s - 1] = cut[s * (L + 1) + first[s]];
    rc = pp_partition_check(first, L, n_stages, err);
cleanup:
    PP_FREE(pw);
    PP_FREE(pm);
    PP_FREE(best);
    PP_FREE(cut);
    return rc;
}

void pp_partition_print(FILE* f, const pp_model* m, const int* first, int n_stages, const double* weight) {
    int s;
    for (s = 0; s < n_stages; s++) {
        double w = 0;
        int l;
        for (l = first[s]; l < first[s + 1]; l++) w += weight ? weight[l] : 1.0;
        fprintf(f, "stage %2d: layers [%3d, %3d) %-10s .. %-10s weight %.4g\n", s, first[s], first[s + 1],
                m ? _pp_layer_name(m, first[s]) : "", m ? _pp_layer_name(m, first[s + 1] - 1) : "", w);
    }
}

/* >>impl-batch */
static pp_result _pp_batch_check(const pp_batch* b, pp_error* err) {
    int i;
    if (!b) return _pp_fail(err, PP_ERR_INVALID, "batch is NULL");
    if (b->m <= 0) return _pp_fail(err, PP_ERR_INVALID, "batch needs m > 0 micro-batches (got %d)", b->m);
    if (b->input.rows <= 0 || b->input.cols <= 0 || !_pp_shape_ok(b->input.rows, b->input.cols, b->input.dtype))
        return _pp_fail(err, PP_ERR_INVALID, "batch input must be [rows > 0, cols > 0] of a valid dtype (got [%lld, %lld] dtype %d)",
                        (long long)b->input.rows, (long long)b->input.cols, (int)b->input.dtype);
    if (b->loss != PP_LOSS_MEAN_MICROBATCH && b->loss != PP_LOSS_MEAN_ROWS)
        return _pp_fail(err, PP_ERR_INVALID, "unknown loss reduction %d", (int)b->loss);
    if (b->split != PP_SPLIT_SEQS && b->split != PP_SPLIT_TOKENS && b->split != PP_SPLIT_COST)
        return _pp_fail(err, PP_ERR_INVALID, "unknown split policy %d", (int)b->split);
    if (!(b->split_a >= 0 && b->split_b >= 0 && b->split_a < 1e300 && b->split_b < 1e300))
        return _pp_fail(err, PP_ERR_INVALID, "split cost weights must be finite and >= 0 (a = %g, b = %g)", b->split_a,
                        b->split_b);
    if (b->targets && b->target_row_bytes == 0)
        return _pp_fail(err, PP_ERR_INVALID, "targets given with target_row_bytes = 0");
    if (!(b->loss_scale >= 0 && b->loss_scale <= 3.4e38f))
        return _pp_fail(err, PP_ERR_INVALID, "loss_scale must be finite and >= 0 (0 means 1; got %g)", (double)b->loss_scale);
    if (!b->cu_seqlens) {
        if (b->n_seqs != 0) return _pp_fail(err, PP_ERR_INVALID, "n_seqs = %d without cu_seqlens", b->n_seqs);
        if (b->input.rows < b->m)
            return _pp_fail(err, PP_ERR_INVALID, "%lld rows cannot fill %d micro-batches (each needs at least one row)",
                            (long long)b->input.rows, b->m);
        return PP_OK;
    }
    if (b->n_seqs <= 0) return _pp_fail(err, PP_ERR_INVALID, "cu_seqlens given with n_seqs = %d", b->n_seqs);
    if ((int64_t)b->n_seqs > b->input.rows) /* every sequence has a row: bounds the scan below */
        return _pp_fail(err, PP_ERR_INVALID, "n_seqs = %d sequences cannot fit %lld rows", b->n_seqs,
                        (long long)b->input.rows);
    if (b->cu_seqlens[0] != 0) return _pp_fail(err, PP_ERR_INVALID, "cu_seqlens[0] = %d, must be 0", b->cu_seqlens[0]);
    for (i = 0; i < b->n_seqs; i++)
        if (b->cu_seqlens[i + 1] <= b->cu_seqlens[i])
            return _pp_fail(err, PP_ERR_INVALID, "cu_seqlens not increasing at %d (%d then %d): sequence %d is empty or negative",
                            i, b->cu_seqlens[i], b->cu_seqlens[i + 1], i);
    if ((int64_t)b->cu_seqlens[b->n_seqs] != b->input.rows)
        return _pp_fail(err, PP_ERR_INVALID, "cu_seqlens ends at %d but the input has %lld rows", b->cu_seqlens[b->n_seqs],
                        (long long)b->input.rows);
    if (b->n_seqs < b->m)
        return _pp_fail(err, PP_ERR_INVALID, "%d sequences cannot fill %d micro-batches", b->n_seqs, b->m);
    return PP_OK;
}

/* Cost of one sequence of len tokens under the batch's split policy. */
static double _pp_seq_cost(const pp_batch* b, double len) {
    double a = b->split_a, q = b->split_b;
    if (b->split != PP_SPLIT_COST) return len;
    if (a == 0 && q == 0) {
        a = 1.0;
        q = 1.0 / 64;
    }
    return a * len + q * len * len;
}

pp_result pp_batch_split(const pp_batch* b, pp_microbatch* mbs, int32_t* cu, pp_error* err) {
    pp_result rc;
    int *first = NULL, i;
    if ((rc = _pp_batch_check(b, err)) != PP_OK) return rc;
    if (!mbs || (b->cu_seqlens && !cu)) return _pp_fail(err, PP_ERR_INVALID, "split outputs are NULL");
    if (b->cu_seqlens) {
        /* first[i]: micro-batch i's first sequence */
        first = (int*)_pp_calloc((size_t)b->m + 1, sizeof *first);
        if (!first) return _pp_fail(err, PP_ERR_NOMEM, "split of %d sequences", b->n_seqs);
        if (b->split == PP_SPLIT_SEQS) {
            for (i = 0; i <= b->m; i++)
                first[i] = i * (b->n_seqs / b->m) + (i < b->n_seqs % b->m ? i : b->n_seqs % b->m);
        } else {
            double* w = (double*)_pp_calloc((size_t)b->n_seqs, sizeof *w);
            if (!w) {
                PP_FREE(first);
                return _pp_fail(err, PP_ERR_NOMEM, "split weights of %d sequences", b->n_seqs);
            }
            for (i = 0; i < b->n_seqs; i++) w[i] = _pp_seq_cost(b, (double)(b->cu_seqlens[i + 1] - b->cu_seqlens[i]));
            rc = pp_partition_balanced(w, b->n_seqs, b->m, first, err);
            PP_FREE(w);
            if (rc != PP_OK) {
                PP_FREE(first);
                return rc;
            }
        }
    }
    for (i = 0; i < b->m; i++) {
        pp_microbatch* mb = &mbs[i];
        memset(mb, 0, sizeof *mb);
        mb->index = i;
        mb->count = b->m;
        if (b->cu_seqlens) {
            int s0 = first[i], n = first[i + 1] - first[i], j;
            int32_t* c = cu + s0 + i; /* micro-batch i's n+1 offsets follow i earlier micro-batches' */
            for (j = 0; j <= n; j++) {
                c[j] = b->cu_seqlens[s0 + j] - b->cu_seqlens[s0];
                if (j > 0 && c[j] - c[j - 1] > mb->max_seqlen) mb->max_seqlen = c[j] - c[j - 1];
            }
            mb->row0 = b->cu_seqlens[s0];
            mb->rows = c[n];
            mb->cu_seqlens = c;
            mb->n_seqs = n;
        } else {
            int64_t q = b->input.rows / b->m, r = b->input.rows % b->m;
            mb->row0 = i * q + (i < r ? i : r);
            mb->rows = q + (i < r);
        }
        mb->targets = b->targets ? (const void*)((const unsigned char*)b->targets + (size_t)mb->row0 * b->target_row_bytes)
                                 : NULL;
        mb->loss_scale = b->loss == PP_LOSS_MEAN_ROWS ? (float)((double)mb->rows / (double)b->input.rows)
                                                      : (float)(1.0 / b->m);
        if (b->loss_scale != 0) mb->loss_scale *= b->loss_scale; /* a loss scaler's (exact for powers of two) */
    }
    PP_FREE(first);
    return PP_OK;
}

double pp_batch_split_imbalance(const pp_batch* b, const pp_microbatch* mbs) {
    double worst = 0, total = 0;
    int i, j;
    if (!b || !mbs || b->m <= 0) return 0;
    for (i = 0; i < b->m; i++) {
        double c = 0;
        if (mbs[i].cu_seqlens)
            for (j = 0; j < mbs[i].n_seqs; j++) c += _pp_seq_cost(b, (double)(mbs[i].cu_seqlens[j + 1] - mbs[i].cu_seqlens[j]));
        else
            c = (double)mbs[i].rows;
        total += c;
        if (c > worst) worst = c;
    }
    return total > 0 ? worst / (total / b->m) : 1.0;
}

/* A step's plan: micro-batches, and the shapes at every layer boundary of every micro-batch.
   Every rank builds the same plan from the same batch metadata, so receives are posted with
   exact sizes and no shape message travels. */
typedef struct _pp_plan {
    int m, L, m_cap, cu_cap;
    size_t pad;                 /* bytes kept free after every activation (AUTO's trailer) */
    size_t guard;               /* the validation layer's guard after every buffer a layer writes
                                   (_PP_GUARD, 0 when compiled out or the blocks are on a device) */
    pp_microbatch* mbs;         /* [m] */
    double loss_mult;           /* the batch's loss_scale (1 for 0): mbs' loss_scale include it, the step loss not */
    int32_t* cu;                /* rebased cu_seqlens of all micro-batches */
    _pp_bnd* bnd;               /* [m][L+1]: boundary l is the input of layer l */
    size_t* saved;              /* [m][L] */
    size_t* bsaved;             /* [m][L]: the B-only scratch (pp_layer_desc.b_saved_bytes) */
    const unsigned char* rc;    /* [L] layers recomputed before their B (pp_stage_desc.recompute), or
                                   NULL: the carves leave their dropped parts out of the stash */
} _pp_plan;

static void _pp_plan_free(_pp_plan* p) {
    PP_FREE(p->mbs);
    PP_FREE(p->cu);
    PP_FREE(p->bnd);
    PP_FREE(p->saved);
    PP_FREE(p->bsaved);
    memset(p, 0, sizeof *p);
}

static pp_result _pp_plan_build(_pp_plan* p, const pp_model* model, const void* w, const pp_batch* b, pp_error* err) {
    pp_result rc;
    int i, l, L = model->n_layers, cu_need;
    if ((rc = _pp_batch_check(b, err)) != PP_OK) return rc;
    if (b->cu_seqlens && (long long)b->n_seqs + b->m > INT32_MAX)
        return _pp_fail(err, PP_ERR_INVALID, "%d sequences in %d micro-batches is too many", b->n_seqs, b->m);
    cu_need = b->cu_seqlens ? b->n_seqs + b->m : 1;
    if (b->m > p->m_cap || L != p->L) {
        PP_FREE(p->mbs);
        PP_FREE(p->bnd);
        PP_FREE(p->saved);
        PP_FREE(p->bsaved);
        p->mbs = (pp_microbatch*)_pp_calloc((size_t)b->m, sizeof *p->mbs);
        p->bnd = (_pp_bnd*)_pp_calloc((size_t)b->m * (size_t)(L + 1), sizeof *p->bnd);
        p->saved = (size_t*)_pp_calloc((size_t)b->m * (size_t)L, sizeof *p->saved);
        p->bsaved = (size_t*)_pp_calloc((size_t)b->m * (size_t)L, sizeof *p->bsaved);
        p->m_cap = b->m;
        p->L = L;
        if (!p->mbs || !p->bnd || !p->saved || !p->bsaved) {
            p->m_cap = 0;
            return _pp_fail(err, PP_ERR_NOMEM, "step plan for %d micro-batches x %d layers", b->m, L);
        }
    }
    if (cu_need > p->cu_cap) {
        PP_FREE(p->cu);
        p->cu = (int32_t*)_pp_calloc((size_t)cu_need, sizeof *p->cu);
        p->cu_cap = p->cu ? cu_need : 0;
        if (!p->cu) return _pp_fail(err, PP_ERR_NOMEM, "step plan cu_seqlens (%d entries)", cu_need);
    }
    p->m = b->m;
    p->loss_mult = b->loss_scale != 0 ? (double)b->loss_scale : 1.0;
    if ((rc = pp_batch_split(b, p->mbs, p->cu, err)) != PP_OK) return rc;
    for (i = 0; i < b->m; i++) {
        _pp_bnd* bd = &p->bnd[(size_t)i * (L + 1)];
        pp_layer_desc d;
        bd[0].n = 1;
        bd[0].t[0] = b->input;
        bd[0].t[0].data = NULL;
        bd[0].t[0].rows = p->mbs[i].rows;
        for (l = 0; l < L; l++) {
            if ((rc = _pp_describe(model, w, l, &p->mbs[i], &bd[l], &bd[l + 1], &d, err)) != PP_OK) return rc;
            p->saved[(size_t)i * L + l] = d.saved_bytes;
            p->bsaved[(size_t)i * L + l] = d.b_saved_bytes;
        }
    }
    return PP_OK;
}

static const _pp_bnd* _pp_plan_bnd(const _pp_plan* p, int mb, int l) { return &p->bnd[(size_t)mb * (p->L + 1) + l]; }

#define _PP_ALIGN(x) (((x) + 63) & ~(size_t)63)

/* The bytes a buffer of n bytes takes in a block: n, then `pad` kept free (an activation's AUTO
   trailer), then the guard (>>impl-validate), up to the next 64-byte boundary. A scratch of 0
   bytes takes none (its pointer is NULL). */
static size_t _pp_slice(const _pp_plan* p, size_t n, size_t pad) { return _PP_ALIGN(n + pad + p->guard); }
static size_t _pp_scratch_slice(const _pp_plan* p, size_t n) { return n ? _pp_slice(p, n, 0) : 0; }

/* Recomputation (pp_stage_desc.recompute, the plan's rc): of layers [a, b), a recomputed layer's
   scratch (saved and b_saved) is dropped from the stash, and so is boundary j (a < j < b) between
   two recomputed layers. The B runs the recomputed layers' forwards again first, in a recompute
   block (_pp_rc_carve) that holds what was dropped. The stage's input and output, and every
   boundary a kept layer reads, stay in the stash. */
static int _pp_rc_layer(const _pp_plan* p, int l) { return p->rc && p->rc[l]; }
static int _pp_rc_dropped(const _pp_plan* p, int a, int b, int j) {
    return j > a && j < b && _pp_rc_layer(p, j - 1) && _pp_rc_layer(p, j);
}

/* Carves one micro-batch's stash for layers [a, b) out of base (NULL: only measure).
   Layout: boundary a (only if own_input), boundaries a+1..b, then each layer's saved scratch,
   less what recomputation drops (data NULL there; _pp_rc_carve places it).
   act[(l-a)*PP_MAX_TENSORS + k] and nact[l-a] describe boundary l; saved[l-a] the scratch. */
static size_t _pp_stash_carve(const _pp_plan* p, int mb, int a, int b, int own_input, unsigned char* base,
                              pp_tensor* act, int* nact, void** saved) {
    size_t off = 0;
    int l, k;
    for (l = a; l <= b; l++) {
        const _pp_bnd* bd = _pp_plan_bnd(p, mb, l);
        int drop = _pp_rc_dropped(p, a, b, l);
        if (nact) nact[l - a] = bd->n;
        for (k = 0; k < bd->n; k++) {
            if (act) act[(l - a) * PP_MAX_TENSORS + k] = bd->t[k];
            if ((l == a && !own_input) || drop) {
                if (act && drop) act[(l - a) * PP_MAX_TENSORS + k].data = NULL;
                continue;
            }
            if (act) act[(l - a) * PP_MAX_TENSORS + k].data = base ? base + off : NULL;
            off += _pp_slice(p, pp_tensor_bytes(&bd->t[k]), p->pad);
        }
    }
    for (l = a; l < b; l++) {
        size_t sb = _pp_rc_layer(p, l) ? 0 : p->saved[(size_t)mb * p->L + l];
        if (saved) saved[l - a] = (base && sb) ? base + off : NULL;
        off += _pp_scratch_slice(p, sb);
    }
    return off;
}

/* The recompute block of layers [a, b) (NULL base: only measure): the boundaries and scratch the
   stash dropped (act, saved and bsaved entries there get their data; others are left alone), then
   with `shadow` a second place for the stage's output where its last layer is recomputed (its
   act entries are pointed there: the forward run again must not write over bytes a send or the
   next stage may still read; it writes the same bits; a kept boundary inside the stage only this
   stage reads, in order, so it is written again in place). The block is sized for the shadow
   either way. shadow_bytes (may be NULL) gets the shadows' part. It comes in two parts, two
   blocks: part 1 what W reads too (the dropped boundaries, the recomputed layers' saved), part 2
   what only B reads (the shadows, their b_saved), which B gives back while part 1 waits for W. */
static size_t _pp_rc_carve(const _pp_plan* p, int mb, int a, int b, int part, int shadow, unsigned char* base,
                           pp_tensor* act, void** saved, void** bsaved, size_t* shadow_bytes) {
    size_t off = 0, sh = 0;
    int l, k, pass;
    for (pass = part - 1; pass < 2 * part - 1; pass++) /* the dropped boundaries (part 1), the shadows (2) */
        for (l = a + 1; l <= b; l++) {
            const _pp_bnd* bd = _pp_plan_bnd(p, mb, l);
            int drop = _pp_rc_dropped(p, a, b, l);
            if (pass == 0 ? !drop : (l < b || !_pp_rc_layer(p, l - 1))) continue;
            for (k = 0; k < bd->n; k++) {
                size_t n = _pp_slice(p, pp_tensor_bytes(&bd->t[k]), p->pad);
                if (act && base && (pass == 0 || shadow)) act[(l - a) * PP_MAX_TENSORS + k].data = base + off;
                off += n;
                if (pass) sh += n;
            }
        }
    for (l = a; l < b; l++) {
        size_t n = _pp_rc_layer(p, l) ? (part == 1 ? p->saved : p->bsaved)[(size_t)mb * p->L + l] : 0;
        void** x = part == 1 ? saved : bsaved;
        if (x && _pp_rc_layer(p, l)) x[l - a] = (base && n) ? base + off : NULL;
        off += _pp_scratch_slice(p, n);
    }
    if (shadow_bytes) *shadow_bytes = sh;
    return off;
}

/* Carves the B-only scratch of layers [a, b) (pp_layer_desc.b_saved_bytes) out of base (NULL:
   only measure): bsaved[l-a], NULL where a layer has none. Apart from the stash, so that B can
   give it back while the stash waits for W. */
static size_t _pp_bsaved_carve(const _pp_plan* p, int mb, int a, int b, unsigned char* base, void** bsaved) {
    size_t off = 0;
    int l;
    for (l = a; l < b; l++) {
        size_t n = _pp_rc_layer(p, l) ? 0 : p->bsaved[(size_t)mb * p->L + l];
        if (bsaved) bsaved[l - a] = (base && n) ? base + off : NULL;
        off += _pp_scratch_slice(p, n);
    }
    return off;
}

/* Carves the gradient workspace of layers [a, b): boundary b first (it is received; only if
   own_out), then b-1 down to a+1, then a if need_in. Integer tensors get no gradient (data NULL),
   nor does boundary b without own_out (its caller points it elsewhere). */
static size_t _pp_grad_carve(const _pp_plan* p, int mb, int a, int b, int need_in, int own_out, unsigned char* base,
                             pp_tensor* dact) {
    size_t off = 0;
    int l, k;
    for (l = b; l >= a; l--) {
        const _pp_bnd* bd = _pp_plan_bnd(p, mb, l);
        for (k = 0; k < bd->n; k++) {
            pp_tensor* t = dact ? &dact[(l - a) * PP_MAX_TENSORS + k] : NULL;
            int has = pp_dtype_is_float(bd->t[k].dtype) && (l > a || need_in) && (l < b || own_out);
            if (t) {
                *t = bd->t[k];
                t->data = (has && base) ? base + off : NULL;
            }
            if (has) off += _pp_slice(p, pp_tensor_bytes(&bd->t[k]), 0);
        }
    }
    return off;
}

/* >>impl-validate: the validation layer. Every buffer a layer call may write - forward: its
   outputs, saved and b_saved; backward: its input gradients, saved and b_saved; weight_grad: its
   input gradients and saved - is followed in its block by a guard of _PP_GUARD bytes or more (to
   the next 64-byte boundary; an activation's AUTO trailer room included). Before each call the
   guards are filled with _PP_GUARD_BYTE, after it they are read: a changed byte fails the call with
   PP_ERR_LAYER naming the layer, the call, the micro-batch, the buffer, its declared shape and how
   far past its end it was written. Under AddressSanitizer they are poisoned during the call, so the
   sanitizer stops at the writing line itself. Only where the blocks are host memory
   (_pp_plan.guard is 0 with pp_stage_desc.device). A write past the guard may have reached the
   next buffer (or, from a block's last one, the heap): it is reported all the same, "at least". */
#if _PP_VALIDATE
#define _PP_GUARD 64
#else
#define _PP_GUARD 0
#endif
#define _PP_GUARD_BYTE 0xA5

typedef struct _pp_guard {
    unsigned char* end;             /* the declared end of the buffer: the guard starts here */
    size_t len;                     /* guard bytes */
    size_t bytes;                   /* the buffer's declared bytes */
    int kind, k;                    /* 0 output k, 1 input gradient k, 2 saved, 3 b_saved */
    const pp_tensor* t;             /* kinds 0 and 1: the declared shape */
} _pp_guard;
#define _PP_MAX_GUARDS (PP_MAX_TENSORS + 2)

static void _pp_guard_add(_pp_guard* g, int* n, void* data, size_t bytes, size_t slice, int kind, int k, const pp_tensor* t) {
    _pp_guard* x;
    if (!data) return;
    x = &g[(*n)++];
    x->end = (unsigned char*)data + bytes;
    x->len = slice - bytes;
    x->bytes = bytes;
    x->kind = kind;
    x->k = k;
    x->t = t;
    memset(x->end, _PP_GUARD_BYTE, x->len);
    _PP_POISON(x->end, x->len);
}

/* Fills (and poisons) the guards of what call op (0 forward, 1 backward, 2 weight_grad) may write
   through io; returns how many. */
static int _pp_guards_set(const _pp_plan* p, int op, const pp_layer_io* io, _pp_guard* g) {
    int n = 0, k;
    if (!p->guard) return 0;
    for (k = 0; op == 0 && k < io->n_out; k++) {
        size_t b = pp_tensor_bytes(&io->out[k]);
        _pp_guard_add(g, &n, io->out[k].data, b, _pp_slice(p, b, p->pad), 0, k, &io->out[k]);
    }
    for (k = 0; op > 0 && k < io->n_in; k++) {
        size_t b = pp_tensor_bytes(&io->d_in[k]);
        _pp_guard_add(g, &n, io->d_in[k].data, b, _pp_slice(p, b, 0), 1, k, &io->d_in[k]);
    }
    _pp_guard_add(g, &n, io->saved, io->saved_bytes, _pp_scratch_slice(p, io->saved_bytes), 2, 0, NULL);
    _pp_guard_add(g, &n, io->b_saved, io->b_saved_bytes, _pp_scratch_slice(p, io->b_saved_bytes), 3, 0, NULL);
    return n;
}

/* How far past its end a guard's buffer was written: the last changed byte's distance, 0 if none. */
static size_t _pp_guard_past(const _pp_guard* g) {
    const uint64_t pat = 0x0101010101010101ull * _PP_GUARD_BYTE;
    uint64_t diff = 0, w;
    size_t i, n = g->len;
    _PP_UNPOISON(g->end, g->len);
    for (i = 0; i + 8 <= n; i += 8) { /* intact: one pass, 8 bytes a word, no branch */
        memcpy(&w, g->end + i, 8);
        diff |= w ^ pat;
    }
    for (; i < n; i++) diff |= (uint64_t)(g->end[i] ^ _PP_GUARD_BYTE);
    if (!diff) return 0;
    while (n > 0 && g->end[n - 1] == _PP_GUARD_BYTE) n--;
    return n;
}

/* Unpoisons and reads the n guards of a call; a breach fails it (rc: what the layer returned). */
static pp_result _pp_guards_check(const pp_model* m, int l, int op, const pp_microbatch* mb, _pp_guard* g, int n, int rc,
                                  pp_error* err) {
    static const char* const call[3] = {"forward (F)", "backward (B)", "weight_grad (W)"};
    size_t past = 0, p;
    int i, hit = -1, more = 0;
    char what[160], also[64];
    for (i = 0; i < n; i++)
        if ((p = _pp_guard_past(&g[i])) != 0) {
            if (hit < 0) {
                hit = i;
                past = p;
            } else {
                more++;
            }
        }
    if (hit < 0) return PP_OK;
    if (g[hit].kind < 2) {
        const pp_tensor* t = g[hit].t;
        snprintf(what, sizeof what, "%s[%d] [%lld x %lld %s, %zu bytes]", g[hit].kind ? "input gradient d_in" : "output out",
                 g[hit].k, (long long)t->rows, (long long)t->cols, pp_dtype_name(t->dtype), g[hit].bytes);
    } else {
        snprintf(what, sizeof what, "%s scratch [%zu bytes]", g[hit].kind == 2 ? "saved" : "b_saved", g[hit].bytes);
    }
    also[0] = 0;
    if (more) snprintf(also, sizeof also, "; past %d more buffer%s too", more, more > 1 ? "s" : "");
    if (rc) snprintf(also + strlen(also), sizeof also - strlen(also), "; it returned %d", rc);
    return _pp_fail(err, PP_ERR_LAYER, "layer %d (%s) %s on micro-batch %d wrote %s%zu bytes past its %s as describe "
                    "declared it%s%s", l, _pp_layer_name(m, l), call[op], mb->index, past == g[hit].len ? "at least " : "",
                    past, what, past == g[hit].len ? " (the whole guard: what follows it may be overwritten too)" : "",
                    also);
}

/* Input tensor of micro-batch mb: a view into the batch's rows. */
static pp_tensor _pp_input_view(const pp_batch* b, const pp_microbatch* mb) {
    pp_tensor t = b->input;
    t.rows = mb->rows;
    t.data = b->input.data ? (void*)((unsigned char*)b->input.data +
                                     (size_t)mb->row0 * (size_t)b->input.cols * pp_dtype_size(b->input.dtype))
                           : NULL;
    return t;
}

/* ": <what a TP collective of the layer call refused>" on this thread's stage step, or "" (>>impl-tp). */
static const char* _pp_tp_why(void);
static pp_result _pp_forward_range(const pp_model* m, const void* w, const pp_microbatch* mb, int a, int b,
                                   const pp_tensor* act, const int* nact, void* const* saved, const size_t* saved_bytes,
                                   void* const* bsaved, const size_t* bsaved_bytes, float* loss, void* ctx,
                                   const struct pp_group* tp, const _pp_plan* plan, pp_error* err) {
    pp_layer_io io;
    _pp_guard g[_PP_MAX_GUARDS];
    int l, rc, ng;
    pp_result v;
    for (l = a; l < b; l++) {
        memset(&io, 0, sizeof io);
        io.mb = mb;
        io.layer = l;
        io.n_in = nact[l - a];
        io.n_out = nact[l - a + 1];
        memcpy(io.in, &act[(l - a) * PP_MAX_TENSORS], sizeof io.in);
        memcpy(io.out, &act[(l - a + 1) * PP_MAX_TENSORS], sizeof io.out);
        io.saved = saved[l - a];
        io.saved_bytes = saved_bytes[l];
        io.b_saved = bsaved[l - a];
        io.b_saved_bytes = io.b_saved ? bsaved_bytes[l] : 0;
        io.ctx = ctx;
        io.tp = tp;
        io.model = m;
        ng = _pp_guards_set(plan, 0, &io, g);
        rc = m->forward(w, l, &io);
        if (ng && (v = _pp_guards_check(m, l, 0, mb, g, ng, rc, err)) != PP_OK) return v;
        if (rc != 0)
            return _pp_fail(err, PP_ERR_LAYER, "layer %d (%s) forward returned %d on micro-batch %d%s", l,
                            _pp_layer_name(m, l), rc, mb->index, _pp_tp_why());
        if (l == m->n_layers - 1 && loss) *loss = io.loss;
    }
    return PP_OK;
}

/* B (weight_half 0: backward) or W (weight_half 1: weight_grad, model->weight_grad set) of layers
   [a, b), last layer first; W sees the same io that B saw but the B-only scratch (b_saved NULL,
   whether or not W is deferred: a layer that reads it in W fails on every schedule alike). */
static pp_result _pp_grad_range(int weight_half, const pp_model* m, const void* w, void* g, const pp_microbatch* mb,
                                int a, int b, const pp_tensor* act, const int* nact, const pp_tensor* dact,
                                void* const* saved, const size_t* saved_bytes, void* const* bsaved,
                                const size_t* bsaved_bytes, void* ctx, const struct pp_group* tp, const _pp_plan* plan,
                                pp_error* err) {
    pp_layer_io io;
    _pp_guard gd[_PP_MAX_GUARDS];
    int l, rc, ng;
    pp_result v;
    for (l = b - 1; l >= a; l--) {
        memset(&io, 0, sizeof io);
        io.mb = mb;
        io.layer = l;
        io.n_in = nact[l - a];
        io.n_out = nact[l - a + 1];
        memcpy(io.in, &act[(l - a) * PP_MAX_TENSORS], sizeof io.in);
        memcpy(io.out, &act[(l - a + 1) * PP_MAX_TENSORS], sizeof io.out);
        memcpy(io.d_in, &dact[(l - a) * PP_MAX_TENSORS], sizeof io.d_in);
        memcpy(io.d_out, &dact[(l - a + 1) * PP_MAX_TENSORS], sizeof io.d_out);
        io.saved = saved[l - a];
        io.saved_bytes = saved_bytes[l];
        if (!weight_half) {
            io.b_saved = bsaved[l - a];
            io.b_saved_bytes = io.b_saved ? bsaved_bytes[l] : 0;
        }
        io.ctx = ctx;
        io.tp = tp;
        io.model = m;
        ng = _pp_guards_set(plan, weight_half ? 2 : 1, &io, gd);
        rc = weight_half ? m->weight_grad(w, g, l, &io) : m->backward(w, g, l, &io);
        if (ng && (v = _pp_guards_check(m, l, weight_half ? 2 : 1, mb, gd, ng, rc, err)) != PP_OK) return v;
        if (rc != 0)
            return _pp_fail(err, PP_ERR_LAYER, "layer %d (%s) %s returned %d on micro-batch %d%s", l,
                            _pp_layer_name(m, l), weight_half ? "weight_grad" : "backward", rc, mb->index, _pp_tp_why());
    }
    return PP_OK;
}

/* Step loss from micro-batch losses, always in ascending micro-batch order. */
static float _pp_step_loss(const _pp_plan* p, const float* mb_loss) {
    double acc = 0;
    int i;
    for (i = 0; i < p->m; i++) acc += (double)p->mbs[i].loss_scale / p->loss_mult * (double)mb_loss[i];
    return (float)acc;
}

/* Micro-batch i's buffers for a run of all L layers on one thread (pp_sequential_step,
   pp_profile_layers): the stash with its B-only scratch after it, and a zeroed gradient
   workspace, carved into act, nact, saved (saved[0..L) the stash's scratch, saved[L..2L) the
   B-only one) and dact. 0 when memory ran out (*stash and *gws, set either way, are the
   caller's to free); need gets the two sizes. */
static int _pp_seq_buffers(const _pp_plan* plan, const pp_batch* b, int i, unsigned char** stash, unsigned char** gws,
                           size_t need[2], pp_tensor* act, int* nact, void** saved, pp_tensor* dact) {
    int L = plan->L;
    size_t sb = _pp_stash_carve(plan, i, 0, L, 0, NULL, NULL, NULL, NULL);
    need[0] = sb + _pp_bsaved_carve(plan, i, 0, L, NULL, NULL);
    need[1] = _pp_grad_carve(plan, i, 0, L, 0, 1, NULL, NULL);
    *stash = (unsigned char*)PP_MALLOC(need[0] ? need[0] : 1);
    *gws = (unsigned char*)_pp_calloc(need[1] ? need[1] : 1, 1);
    if (!*stash || !*gws) return 0;
    _pp_stash_carve(plan, i, 0, L, 0, *stash, act, nact, saved);
    _pp_bsaved_carve(plan, i, 0, L, *stash + sb, saved + L);
    act[0] = _pp_input_view(b, &plan->mbs[i]);
    _pp_grad_carve(plan, i, 0, L, 0, 1, *gws, dact);
    return 1;
}

pp_result pp_sequential_step(const pp_model* m, const void* weights, void* grads, const pp_batch* b, float* loss,
                             pp_error* err) {
    _pp_plan plan;
    pp_tensor *act = NULL, *dact = NULL;
    int* nact = NULL;
    void **saved = NULL, **bsaved = NULL;
    unsigned char *stash = NULL, *gws = NULL;
    float* mb_loss = NULL;
    pp_result rc;
    int i, L;
    memset(&plan, 0, sizeof plan);
    plan.guard = _PP_GUARD;
    if ((rc = pp_model_check(m, err)) != PP_OK) return rc;
    if (!grads || !weights) return _pp_fail(err, PP_ERR_INVALID, "%s is NULL", grads ? "weights" : "grads");
    if (!b || !b->input.data || !b->targets)
        return _pp_fail(err, PP_ERR_INVALID, "sequential step needs the batch input data and targets");
    L = m->n_layers;
    if ((rc = _pp_plan_build(&plan, m, weights, b, err)) != PP_OK) goto cleanup;
    act = (pp_tensor*)_pp_calloc((size_t)(L + 1) * PP_MAX_TENSORS, sizeof *act);
    dact = (pp_tensor*)_pp_calloc((size_t)(L + 1) * PP_MAX_TENSORS, sizeof *dact);
    nact = (int*)_pp_calloc((size_t)L + 1, sizeof *nact);
    saved = (void**)_pp_calloc((size_t)L * 2, sizeof *saved);
    bsaved = saved ? saved + L : NULL;
    mb_loss = (float*)_pp_calloc((size_t)b->m, sizeof *mb_loss);
    if (!act || !dact || !nact || !saved || !mb_loss) {
        rc = _pp_fail(err, PP_ERR_NOMEM, "sequential step scratch");
        goto cleanup;
    }
    for (i = 0; i < b->m; i++) {
        const size_t *sb_l = &plan.saved[(size_t)i * L], *bb_l = &plan.bsaved[(size_t)i * L];
        size_t need[2];
        if (!_pp_seq_buffers(&plan, b, i, &stash, &gws, need, act, nact, saved, dact)) {
            rc = _pp_fail(err, PP_ERR_NOMEM, "sequential stash of micro-batch %d (%zu + %zu bytes)", i, need[0], need[1]);
            goto cleanup;
        }
        if ((rc = _pp_forward_range(m, weights, &plan.mbs[i], 0, L, act, nact, saved, sb_l, bsaved, bb_l, &mb_loss[i],
                                    NULL, NULL, &plan, err)) != PP_OK)
            goto cleanup;
        if ((rc = _pp_grad_range(0, m, weights, grads, &plan.mbs[i], 0, L, act, nact, dact, saved, sb_l, bsaved, bb_l,
                                 NULL, NULL, &plan, err)) != PP_OK)
            goto cleanup;
        /* split backward: the weight gradients of this micro-batch after all its input gradients */
        if (m->weight_grad && (rc = _pp_grad_range(1, m, weights, grads, &plan.mbs[i], 0, L, act, nact, dact, saved,
                                                    sb_l, bsaved, bb_l, NULL, NULL, &plan, err)) != PP_OK)
            goto cleanup;
        PP_FREE(stash);
        PP_FREE(gws);
        stash = gws = NULL;
    }
    if (loss) *loss = _pp_step_loss(&plan, mb_loss);
cleanup:
    PP_FREE(stash);
    PP_FREE(gws);
    PP_FREE(act);
    PP_FREE(dact);
    PP_FREE(nact);
    PP_FREE(saved);
    PP_FREE(mb_loss);
    _pp_plan_free(&plan);
    return rc;
}
/* An evaluation's outputs (pp_eval_out): the last layer's inputs, boundary L-1 of every
   micro-batch. Tensor k of micro-batch mb lands at _pp_eval_off(plan, mb, k) in data[k]. */
static size_t _pp_eval_off(const _pp_plan* plan, int mb, int k) {
    size_t off = 0;
    int i;
    for (i = 0; i < mb; i++) {
        const _pp_bnd* bd = _pp_plan_bnd(plan, i, plan->L - 1);
        if (k < bd->n) off += pp_tensor_bytes(&bd->t[k]);
    }
    return off;
}

/* The whole step's outputs into out->n, t[] and bytes[] (data[k] NULL: 0 bytes); PP_ERR_SIZE
   where a buffer is too small (err names it). */
static pp_result _pp_eval_out_fill(const _pp_plan* plan, pp_eval_out* out, pp_error* err) {
    const _pp_bnd* b0 = _pp_plan_bnd(plan, 0, plan->L - 1);
    int k;
    out->n = b0->n;
    for (k = 0; k < PP_MAX_TENSORS; k++) {
        size_t need = _pp_eval_off(plan, plan->m, k);
        memset(&out->t[k], 0, sizeof out->t[k]);
        out->bytes[k] = 0;
        if (k >= b0->n) continue;
        out->t[k] = b0->t[k];
        out->t[k].data = out->data[k];
        out->t[k].rows = 0;
        {
            int i;
            for (i = 0; i < plan->m; i++) {
                const _pp_bnd* bd = _pp_plan_bnd(plan, i, plan->L - 1);
                if (k < bd->n) out->t[k].rows += bd->t[k].rows;
            }
        }
        if (!out->data[k]) continue;
        if (out->cap[k] < need)
            return _pp_fail(err, PP_ERR_SIZE, "the evaluation's output %d (the last layer's input %d) takes %zu bytes, "
                            "pp_eval_out.cap[%d] is %zu", k, k, need, k, out->cap[k]);
        out->bytes[k] = need;
    }
    return PP_OK;
}

pp_result pp_sequential_eval(const pp_model* m, const void* weights, const pp_batch* b, float* loss, pp_eval_out* out,
                             pp_error* err) {
    _pp_plan plan;
    pp_tensor* act = NULL;
    int* nact = NULL;
    void** saved = NULL;
    unsigned char* stash = NULL;
    float* mb_loss = NULL;
    pp_result rc;
    int i, k, L;
    memset(&plan, 0, sizeof plan);
    plan.guard = _PP_GUARD;
    if ((rc = pp_model_check(m, err)) != PP_OK) return rc;
    if (!weights) return _pp_fail(err, PP_ERR_INVALID, "weights is NULL");
    if (!b || !b->input.data || !b->targets)
        return _pp_fail(err, PP_ERR_INVALID, "sequential evaluation needs the batch input data and targets");
    L = m->n_layers;
    if ((rc = _pp_plan_build(&plan, m, weights, b, err)) != PP_OK) goto cleanup;
    if (out && (rc = _pp_eval_out_fill(&plan, out, err)) != PP_OK) goto cleanup;
    act = (pp_tensor*)_pp_calloc((size_t)(L + 1) * PP_MAX_TENSORS, sizeof *act);
    nact = (int*)_pp_calloc((size_t)L + 1, sizeof *nact);
    saved = (void**)_pp_calloc((size_t)L * 2, sizeof *saved);
    mb_loss = (float*)_pp_calloc((size_t)b->m, sizeof *mb_loss);
    if (!act || !nact || !saved || !mb_loss) {
        rc = _pp_fail(err, PP_ERR_NOMEM, "sequential evaluation scratch");
        goto cleanup;
    }
    for (i = 0; i < b->m; i++) {
        size_t sb = _pp_stash_carve(&plan, i, 0, L, 0, NULL, NULL, NULL, NULL);
        size_t need = sb + _pp_bsaved_carve(&plan, i, 0, L, NULL, NULL);
        if (!(stash = (unsigned char*)PP_MALLOC(need ? need : 1))) {
            rc = _pp_fail(err, PP_ERR_NOMEM, "sequential stash of micro-batch %d (%zu bytes)", i, need);
            goto cleanup;
        }
        _pp_stash_carve(&plan, i, 0, L, 0, stash, act, nact, saved);
        _pp_bsaved_carve(&plan, i, 0, L, stash + sb, saved + L);
        act[0] = _pp_input_view(b, &plan.mbs[i]);
        if ((rc = _pp_forward_range(m, weights, &plan.mbs[i], 0, L, act, nact, saved, &plan.saved[(size_t)i * L], saved + L,
                                    &plan.bsaved[(size_t)i * L], &mb_loss[i], NULL, NULL, &plan, err)) != PP_OK)
            goto cleanup;
        for (k = 0; out && k < nact[L - 1] && k < PP_MAX_TENSORS; k++)
            if (out->data[k])
                memcpy((unsigned char*)out->data[k] + _pp_eval_off(&plan, i, k), act[(L - 1) * PP_MAX_TENSORS + k].data,
                       pp_tensor_bytes(&act[(L - 1) * PP_MAX_TENSORS + k]));
        PP_FREE(stash);
        stash = NULL;
    }
    if (loss) *loss = _pp_step_loss(&plan, mb_loss);
cleanup:
    PP_FREE(stash);
    PP_FREE(act);
    PP_FREE(nact);
    PP_FREE(saved);
    PP_FREE(mb_loss);
    _pp_plan_free(&plan);
    return rc;
}

/* >>impl-profile: per-layer wall times for auto-partitioning (pp_profile_layers) */
pp_result pp_profile_layers(const pp_model* m, const void* weights, void* grads, const pp_batch* b, int steps,
                            double* t_f, double* t_b, double* t_w, pp_error* err) {
    _pp_plan plan;
    pp_tensor *act = NULL, *dact = NULL;
    int* nact = NULL;
    void **saved = NULL, **bsaved = NULL;
    unsigned char *stash = NULL, *gws = NULL;
    float loss = 0;
    pp_result rc;
    int i, l, L, step;
    memset(&plan, 0, sizeof plan);
    plan.guard = _PP_GUARD;
    if ((rc = pp_model_check(m, err)) != PP_OK) return rc;
    if (!grads || !t_f || !t_b) return _pp_fail(err, PP_ERR_INVALID, "pp_profile_layers: grads, t_f and t_b must be non-NULL");
    if (steps < 1 || steps > 1000000) return _pp_fail(err, PP_ERR_INVALID, "pp_profile_layers: steps = %d (1 .. 1e6)", steps);
    if (!b || !b->input.data || !b->targets)
        return _pp_fail(err, PP_ERR_INVALID, "pp_profile_layers needs the batch input data and targets");
    L = m->n_layers;
    for (l = 0; l < L; l++) {
        t_f[l] = t_b[l] = 0;
        if (t_w) t_w[l] = 0;
    }
    if ((rc = _pp_plan_build(&plan, m, weights, b, err)) != PP_OK) goto cleanup;
    act = (pp_tensor*)_pp_calloc((size_t)(L + 1) * PP_MAX_TENSORS, sizeof *act);
    dact = (pp_tensor*)_pp_calloc((size_t)(L + 1) * PP_MAX_TENSORS, sizeof *dact);
    nact = (int*)_pp_calloc((size_t)L + 1, sizeof *nact);
    saved = (void**)_pp_calloc((size_t)L * 2, sizeof *saved);
    bsaved = saved ? saved + L : NULL;
    if (!act || !dact || !nact || !saved) {
        rc = _pp_fail(err, PP_ERR_NOMEM, "profile scratch");
        goto cleanup;
    }
    for (step = 0; step <= steps; step++) {
        for (i = 0; i < b->m; i++) {
            const size_t *sb = &plan.saved[(size_t)i * L], *bb = &plan.bsaved[(size_t)i * L];
            size_t need[2];
            if (!_pp_seq_buffers(&plan, b, i, &stash, &gws, need, act, nact, saved, dact)) {
                rc = _pp_fail(err, PP_ERR_NOMEM, "profile stash of micro-batch %d", i);
                goto cleanup;
            }
            /* one layer at a time: the range helpers index act/nact/saved from their first layer */
            for (l = 0; l < L; l++) {
                double t0 = _pp_now();
                rc = _pp_forward_range(m, weights, &plan.mbs[i], l, l + 1, act + (size_t)l * PP_MAX_TENSORS, nact + l,
                                       saved + l, sb, bsaved + l, bb, &loss, NULL, NULL, &plan, err);
                if (rc != PP_OK) goto cleanup;
                if (step > 0) t_f[l] += _pp_now() - t0;
            }
            for (l = L - 1; l >= 0; l--) {
                double t0 = _pp_now();
                rc = _pp_grad_range(0, m, weights, grads, &plan.mbs[i], l, l + 1, act + (size_t)l * PP_MAX_TENSORS, nact + l,
                                        dact + (size_t)l * PP_MAX_TENSORS, saved + l, sb, bsaved + l, bb, NULL, NULL, &plan, err);
                if (rc != PP_OK) goto cleanup;
                if (step > 0) t_b[l] += _pp_now() - t0;
            }
            for (l = L - 1; m->weight_grad && l >= 0; l--) {
                double t0 = _pp_now();
                rc = _pp_grad_range(1, m, weights, grads, &plan.mbs[i], l, l + 1, act + (size_t)l * PP_MAX_TENSORS, nact + l,
                                     dact + (size_t)l * PP_MAX_TENSORS, saved + l, sb, bsaved + l, bb, NULL, NULL, &plan, err);
                if (rc != PP_OK) goto cleanup;
                if (step > 0 && t_w) t_w[l] += _pp_now() - t0;
            }
            PP_FREE(stash);
            PP_FREE(gws);
            stash = gws = NULL;
        }
    }
    for (l = 0; l < L; l++) {
        t_f[l] /= steps;
        t_b[l] /= steps;
        if (t_w) t_w[l] /= steps;
    }
cleanup:
    PP_FREE(stash);
    PP_FREE(gws);
    PP_FREE(act);
    PP_FREE(dact);
    PP_FREE(nact);
    PP_FREE(saved);
    _pp_plan_free(&plan);
    return rc;
}

/* wip/schedule_impl.inc - schedules, simulator and timeline printers of pipeline.h.
   Included by pipeline.h inside its implementation section (after stdlib, string, math, stdio,
   inside extern "C"). Uses _pp_fail, _pp_calloc, PP_MALLOC and PP_FREE from there.
   Every private name here starts with _pp_sched_, _pp_sim_ or _pp_tl_ so it cannot collide with
   helpers added elsewhere in the header. */

/* >>impl-schedule ----------------------------------------------------------------------------- */

static const char* const _pp_sched_names[PP_SCHED_KIND_COUNT] = {"gpipe", "1f1b",  "interleaved", "zb-h1",
                                                                  "zb-v",  "zb-h2", "v-half",      "v-min",
                                                                  "interleaved-mem", "dualpipev"};

const char* pp_schedule_name(pp_schedule_kind k) {
    if (k == PP_SCHED_CUSTOM) return "custom";
    if ((int)k < 0 || (int)k >= PP_SCHED_KIND_COUNT) return "unknown";
    return _pp_sched_names[k];
}

/* ASCII-only case folding: locale-independent, so "GPipe" parses the same everywhere. */
static int _pp_sched_streq_nocase(const char* a, const char* b) {
    for (;; a++, b++) {
        char ca = *a, cb = *b;
        if (ca >= 'A' && ca <= 'Z') ca = (char)(ca - 'A' + 'a');
        if (cb >= 'A' && cb <= 'Z') cb = (char)(cb - 'A' + 'a');
        if (ca != cb) return 0;
        if (ca == 0) return 1;
    }
}

pp_result pp_schedule_kind_parse(const char* s, pp_schedule_kind* k) {
    int i;
    if (!s || !k) return PP_ERR_INVALID;
    for (i = 0; i < PP_SCHED_KIND_COUNT; i++) {
        if (_pp_sched_streq_nocase(s, _pp_sched_names[i])) {
            *k = (pp_schedule_kind)i;
            return PP_OK;
        }
    }
    return PP_ERR_INVALID;
}

/* The stage map of a kind: V for the V-shaped kinds, else LOOP. */
static pp_stage_map _pp_sched_kind_map(pp_schedule_kind k) {
    return k == PP_SCHED_ZB_V || k == PP_SCHED_V_HALF || k == PP_SCHED_V_MIN || k == PP_SCHED_DUALPIPE_V ? PP_MAP_V
                                                                                                          : PP_MAP_LOOP;
}

int pp_schedule_kind_v(pp_schedule_kind k, int v) {
    if (_pp_sched_kind_map(k) == PP_MAP_V) return 2;
    if (k == PP_SCHED_INTERLEAVED || k == PP_SCHED_INTERLEAVED_MEM) return v < 1 ? 1 : v;
    return 1;
}

/* One place that decides whether (kind, p, v, m) describes a schedule we can build. The limits
   come from pp_action's field widths (chunk int8, stage and ranks int16, mb int32) and from the
   simulator indexing all p*2*m*v actions with an int. */
static pp_result _pp_sched_check_args(pp_schedule_kind k, int p, int v, int m, pp_error* err) {
    if ((int)k < 0 || (int)k >= PP_SCHED_KIND_COUNT)
        return _pp_fail(err, PP_ERR_INVALID,
                        "schedule kind %d is not one of gpipe, 1f1b, interleaved, zb-h1, zb-v, zb-h2, v-half, v-min, "
                        "interleaved-mem, dualpipev", (int)k);
    if (p < 1) return _pp_fail(err, PP_ERR_INVALID, "%s: p (ranks) = %d, need p >= 1",
                               pp_schedule_name(k), p);
    if (v < 1) return _pp_fail(err, PP_ERR_INVALID, "%s: v (chunks per rank) = %d, need v >= 1",
                               pp_schedule_name(k), v);
    if (m < 1) return _pp_fail(err, PP_ERR_INVALID, "%s: m (micro-batches) = %d, need m >= 1",
                               pp_schedule_name(k), m);
    if (p > PP_MAX_RANKS || p > INT16_MAX)
        return _pp_fail(err, PP_ERR_INVALID, "%s: p = %d ranks exceeds PP_MAX_RANKS (%d)",
                        pp_schedule_name(k), p, (int)PP_MAX_RANKS);
    if (_pp_sched_kind_map(k) == PP_MAP_V && v != 2)
        return _pp_fail(err, PP_ERR_INVALID, "%s needs v = 2 chunks per rank (the two arms of the V), got v = %d",
                        pp_schedule_name(k), v);
    if ((k == PP_SCHED_GPIPE || k == PP_SCHED_1F1B || k == PP_SCHED_ZB_H1 || k == PP_SCHED_ZB_H2) && v != 1)
        return _pp_fail(err, PP_ERR_INVALID,
                        "%s needs v = 1 chunk per rank (got v = %d); use interleaved for v >= 2",
                        pp_schedule_name(k), v);
    if ((k == PP_SCHED_INTERLEAVED || k == PP_SCHED_INTERLEAVED_MEM) && v < 2)
        return _pp_fail(err, PP_ERR_INVALID, "%s needs v >= 2 chunks per rank (got v = %d); use 1f1b for v = 1",
                        pp_schedule_name(k), v);
    if (v > INT8_MAX || (long long)p * v > INT16_MAX)
        return _pp_fail(err, PP_ERR_INVALID, "%s: p*v = %d*%d stages do not fit a pp_action (max %d, v <= %d)",
                        pp_schedule_name(k), p, v, (int)INT16_MAX, (int)INT8_MAX);
    if ((long long)p * 3 * v * m > INT32_MAX)
        return _pp_fail(err, PP_ERR_INVALID, "%s: p*3*v*m = %d*3*%d*%d actions is too many",
                        pp_schedule_name(k), p, v, m);
    return PP_OK;
}

/* Actions per micro-batch and chunk: F and B, plus W for the zero-bubble kinds. */
static int _pp_sched_ops(pp_schedule_kind k) {
    return k == PP_SCHED_GPIPE || k == PP_SCHED_1F1B || k == PP_SCHED_INTERLEAVED || k == PP_SCHED_INTERLEAVED_MEM ? 2
                                                                                                              : 3;
}

size_t pp_schedule_size(pp_schedule_kind k, int p, int v, int m) {
    if (_pp_sched_check_args(k, p, v, m, NULL) != PP_OK) return 0;
    return (size_t)p * (size_t)_pp_sched_ops(k) * (size_t)v * (size_t)m;
}

/* Work units. Every rank walks the same order of forward units k = 0 .. m*v-1 and the same
   order of backward units, each a (micro-batch, chunk); ranks differ only in how they interleave
   the two (the warm-up).
   Micro-batches go in groups of consecutive mbs. Inside a group, forwards run chunk 0 for every
   mb of the group, then chunk 1, ...; backwards run the chunks in reverse (v-1 first). Each chunk
   thus sees its mbs in ascending order in both directions: a stage accumulates gradients in the
   same order as the sequential reference, which makes pipelined results bit-identical.
   Group sizes. Megatron uses groups of p and a short last group when p does not divide m. In
   the 1F1B steady state a rank runs one forward per (f + b), so a forward of chunk c+1 on rank 0
   finds chunk c's output from rank p-1 ready only if the group is at least p long; a short group
   slows the whole steady state (simulated: p=16 v=4 m=29 has bubble 0.64 against the ideal
   0.11; p=64 v=4 m=1000 has 0.43 against 0.016). So we spread the remainder: m / p groups (at
   least one), sizes differing by at most one, the larger ones last, every group >= p when m >= p.
   With the warm-up below, the simulated bubble is then exactly (p-1)/(v*m+p-1) for every m >= p
   (checked for p <= 32, v <= 6, m <= 200 with b = f, and p <= 16, v <= 4, m <= 96 with b = 2f),
   not only when p divides m.
   With m % p == 0 all groups have p mbs: Megatron's order. With m < p there is one group of m.
   With v = 1 all of this degenerates to mb = k, chunk = 0 (GPipe and 1F1B). */
typedef struct _pp_sched_units {
    int p, v;
    int n_a, s_a;   /* first n_a groups of s_a micro-batches */
    int n_b, s_b;   /* then n_b groups of s_b = s_a + 1 (n_b may be 0) */
    int skip;       /* interleaved-mem: micro-batches of the padded layout left out (0: none) */
} _pp_sched_units;

/* The largest group. */
static int _pp_sched_gmax(const _pp_sched_units* u) { return u->n_b > 0 ? u->s_b : u->s_a; }

/* Interleaved-mem. Groups of more than p micro-batches cost (v-1) stashes per extra one on rank
   0 (the warm-up below), so where that would exceed the next multiple m' of p's peak, the units
   are those of m' (ceil(m/p) groups of p) and skip = m'-m of the padded micro-batches are left
   out: each group leaves out skip / groups of them (the first groups one more), spaced evenly
   inside it. A left-out unit is walked like any other (it waits for what it would wait for) but
   appends nothing, so the lists are m''s lists without those micro-batches: every rank's stash
   count is at most m''s at every point of its list, and the lists keep their order, so they
   cannot deadlock. Simulated against the other places to leave them out (the first or the last
   micro-batches, one per group at its start or end), spaced evenly had the lowest bubble or tied
   in nearly every case (p = 4, 8; v = 2, 4; m < 4p). Where the spread groups fit m''s peak (always
   for m < p, and when v m is small), they are kept: their bubble is lower. Generated for costs
   (pp_schedule_make_cost), these lists compete with list-scheduled ones under the same cap
   (_pp_sched_build_ls), which reach interleaved's own bubble in most cases where the holes of
   left-out micro-batches cost more; pp_schedule_make keeps these: as parts of interleaved's m'
   lists they pass NCCL's rendezvous check as those do (tests/test_nccl_pipeline.c), which the
   list-scheduled ones do not always. */
static int _pp_sched_skipped(const _pp_sched_units* u, int mb, int* real) {
    int g = mb / u->p, i = mb % u->p, q = u->skip / u->n_a, e = u->skip % u->n_a, k = q + (g < e);
    *real = mb - g * q - (g < e ? g : e) - i * k / u->p;
    return k > 0 && i * k / u->p != (i + 1) * k / u->p;
}

static void _pp_sched_layout(_pp_sched_units* u, pp_schedule_kind k, int p, int v, int m) {
    int groups = m / p > 0 ? m / p : 1;
    u->p = p;
    u->v = v;
    u->n_b = m % groups;
    u->n_a = groups - u->n_b;
    u->s_a = m / groups;
    u->s_b = u->s_a + 1;
    u->skip = 0;
    if (k == PP_SCHED_INTERLEAVED_MEM && m % p != 0) {
        /* rank 0's peak, the largest: warm-up + 1 (see _pp_sched_warmup), at most all units */
        int mp = (m + p - 1) / p * p, spread = 2 * (p - 1) + (v - 1) * _pp_sched_gmax(u) + 1,
            cap = 2 * (p - 1) + (v - 1) * p + 1;
        if (spread > m * v) spread = m * v;
        if (cap > mp * v) cap = mp * v;
        if (spread > cap) {
            u->n_a = mp / p, u->s_a = p, u->n_b = 0, u->s_b = p + 1;
            u->skip = mp - m;
        }
    }
}

/* k-th unit -> (mb, chunk); backward units visit the chunks of a group in reverse. */
static void _pp_sched_unit(const _pp_sched_units* u, int k, int backward, int* mb, int* chunk) {
    int span_a = u->n_a * u->s_a * u->v, mb0, size, off;
    if (k < span_a) {
        mb0 = k / (u->s_a * u->v) * u->s_a;
        size = u->s_a;
        off = k % (u->s_a * u->v);
    } else {
        k -= span_a;
        mb0 = u->n_a * u->s_a + k / (u->s_b * u->v) * u->s_b;
        size = u->s_b;
        off = k % (u->s_b * u->v);
    }
    *mb = mb0 + off % size;
    *chunk = backward ? u->v - 1 - off / size : off / size;
}

/* (mb, chunk) -> unit index, the inverse of _pp_sched_unit. */
static int _pp_sched_index(const _pp_sched_units* u, int mb, int chunk, int backward) {
    int c = backward ? u->v - 1 - chunk : chunk, mb_a = u->n_a * u->s_a, g;
    if (mb < mb_a) {
        g = mb / u->s_a;
        return g * u->s_a * u->v + c * u->s_a + (mb - g * u->s_a);
    }
    g = (mb - mb_a) / u->s_b;
    return mb_a * u->v + g * u->s_b * u->v + c * u->s_b + (mb - mb_a - g * u->s_b);
}

/* Forwards rank r runs before its first backward.
   - GPipe: all of them.
   - 1F1B: p-r-1, so that rank r's first backward (mb 0) arrives just as its forward pipe is
     full; this caps rank r's stash at p-r.
   - interleaved (Megatron's count, for groups of G = p): the first backward of a group (its first
     mb, last chunk) needs that mb's last-chunk forward, which comes (v-1)*G forwards after the
     group starts, plus 2 per downstream rank for the round trip of that forward to the end of
     the pipe and its backward back to r. We use the largest group for G, so every group's
     backwards find their forwards done: (v-1)*(G_max-p) more stashes than Megatron's count, zero
     when p divides m, v-1 once m >= p*p.
   Capped at the total. The builder below adds warm-up where a count would deadlock (never needed
   by these counts over p <= 32, v <= 6, m <= 200, but it makes the lists correct by
   construction for every input). */
static int _pp_sched_warmup(pp_schedule_kind k, const _pp_sched_units* u, int r) {
    int p = u->p, v = u->v, total = (u->n_a * u->s_a + u->n_b * u->s_b) * v, w;
    switch (k) {
    case PP_SCHED_GPIPE: w = total; break;
    case PP_SCHED_1F1B: w = p - r - 1; break;
    default: w = (p - r - 1) * 2 + (v - 1) * _pp_sched_gmax(u); break;
    }
    return w < total ? w : total;
}

/* Has rank r's next forward (next_f, a unit index) got its input? Forward of stage s needs
   forward of stage s-1: the same unit on rank r-1, or for chunk c > 0 on rank 0, chunk c-1 of
   the same mb on rank p-1. n_f[x] counts the forwards rank x has already been given. */
static int _pp_sched_f_ready(const _pp_sched_units* u, const int* n_f, int r, int next_f) {
    int mb, chunk;
    _pp_sched_unit(u, next_f, 0, &mb, &chunk);
    if (r > 0) return n_f[r - 1] > next_f;
    if (chunk == 0) return 1;
    return n_f[u->p - 1] > _pp_sched_index(u, mb, chunk - 1, 0);
}

/* Same for rank r's next backward: backward of stage s needs backward of stage s+1 (same unit
   on rank r+1, or chunk c+1 on rank 0 for the last rank), and the last stage its own forward. */
static int _pp_sched_b_ready(const _pp_sched_units* u, const int* n_f, const int* n_b, int r,
                             int next_b) {
    int mb, chunk;
    _pp_sched_unit(u, next_b, 1, &mb, &chunk);
    if (r < u->p - 1) return n_b[r + 1] > next_b;
    if (chunk == u->v - 1) return n_f[r] > _pp_sched_index(u, mb, chunk, 0);
    return n_b[0] > _pp_sched_index(u, mb, chunk + 1, 1);
}

/* The stage map, the one place that knows it: (rank, chunk) <-> stage. */
static int _pp_sched_map_rank(pp_stage_map map, int p, int stage) {
    if (map == PP_MAP_V) return stage < p ? stage : 2 * p - 1 - stage;
    return stage % p;                       /* Megatron's interleaved mapping: s = chunk*p + rank */
}

static int _pp_sched_map_chunk(pp_stage_map map, int p, int stage) {
    if (map == PP_MAP_V) return stage < p ? 0 : 1;
    return stage / p;
}

static int _pp_sched_map_stage(pp_stage_map map, int p, int r, int chunk) {
    if (map == PP_MAP_V) return chunk == 0 ? r : 2 * p - 1 - r;
    return chunk * p + r;
}

static void _pp_sched_set_map(pp_action* a, int op, pp_stage_map map, int p, int n_stages, int r, int mb, int chunk) {
    int stage = _pp_sched_map_stage(map, p, r, chunk);
    a->op = (int8_t)op;
    a->chunk = (int8_t)chunk;
    a->stage = (int16_t)stage;
    a->mb = (int32_t)mb;
    a->prev_rank = (int16_t)(stage > 0 ? _pp_sched_map_rank(map, p, stage - 1) : -1);
    a->next_rank = (int16_t)(stage < n_stages - 1 ? _pp_sched_map_rank(map, p, stage + 1) : -1);
}

static void _pp_sched_set(pp_action* a, int op, int p, int n_stages, int r, int mb, int chunk) {
    _pp_sched_set_map(a, op, PP_MAP_LOOP, p, n_stages, r, mb, chunk);
}

/* ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023). 1F1B's lists with the backward
   split: rank r runs min(p-r-1, m) warm-up forwards, then for j = 0 .. m-1 "F(next) B(j)" and
   the weight gradient W(j - r), r of them deferred; the deferred ones run after the last B. The
   input gradients travel up the pipe as soon as they can, and each rank fills the time it would
   wait in 1F1B's cool-down with its deferred W's. Rank r holds at most p-r-1 + 1 + r = p
   stashes (F done, W not yet): 1F1B's peak (rank 0's). With unit F = B = W the makespan is
   3m + p - 1 against 1F1B's 3(m + p - 1): bubble (p-1)/(3m+p-1), a third of 1F1B's idle time
   (checked by the simulator in tests/test_zb.c). Lists are deadlock-free for the same reason
   1F1B's are: W's depend only on their own rank's B. */
static void _pp_sched_build_zbh1(int p, int m, pp_action* out) {
    int r, j, k, per = 3 * m;
    for (r = 0; r < p; r++) {
        pp_action* list = out + (size_t)r * (size_t)per;
        int warm = p - r - 1 < m ? p - r - 1 : m, n = 0, nf = 0, nw = 0;
        for (k = 0; k < warm; k++) _pp_sched_set(&list[n++], PP_OP_F, p, p, r, nf++, 0);
        for (j = 0; j < m; j++) {
            if (nf < m) _pp_sched_set(&list[n++], PP_OP_F, p, p, r, nf++, 0);
            _pp_sched_set(&list[n++], PP_OP_B, p, p, r, j, 0);
            if (j - r >= 0) _pp_sched_set(&list[n++], PP_OP_W, p, p, r, nw++, 0);
        }
        while (nw < m) _pp_sched_set(&list[n++], PP_OP_W, p, p, r, nw++, 0);
        PP_ASSERT(n == per);
    }
}

/* ZB-V (the V-shape of Qi et al., "Pipeline Parallelism with Controllable Memory", 2024, and
   the map of DeepSeek's DualPipeV): 2p stages, rank r holds stage r and stage 2p-1-r, so a
   micro-batch goes down the ranks on chunk 0 and back up on chunk 1, and rank 0 holds both ends.
   The lists come from a greedy list scheduler run with unit costs F = B = W: at every tick each
   rank takes, in this order of preference,
     1. the B that is ready (its output gradient arrived), the older micro-batch first;
     2. the F of chunk 1 that is ready (its stash slot was reserved when chunk 0 ran);
     3. the F of chunk 0 that is ready, if the rank's stashes (F done, W not yet) plus the slots
        reserved for chunk 1 leave room for it and its reservation under a cap of 2p;
     4. the oldest pending W.
   Every stage takes its micro-batches in ascending order in F, B and W alike (one counter per
   stage and op), which keeps pipelined gradients bit-identical to the sequential reference.
   The peak is at most 2p stashes of a chunk, i.e. p stashes of a whole 1F1B stage (a chunk is
   half a stage): 1F1B's memory. A chunk-1 F never waits for memory (its slot is reserved), so
   the forwards always drain and the scheduler never sticks. The lists are an order in which a
   real (unit-cost) run executed, every dependency finishing a tick before its consumer starts,
   so the lists are deadlock-free under any costs. The state is a few counters per stage and
   rank, on the stack: generation allocates nothing. */
static pp_result _pp_sched_build_zbv(int p, int m, pp_action* out, pp_error* err) {
    /* zeroed whole (not only [0, S)): cppcheck cannot see that S = 2p >= 2 */
    int f_done[2 * PP_MAX_RANKS] = {0}, b_done[2 * PP_MAX_RANKS] = {0}, w_done[2 * PP_MAX_RANKS] = {0};
    int n_app[PP_MAX_RANKS], pick_op[PP_MAX_RANKS], pick_st[PP_MAX_RANKS];
    int S = 2 * p, per = 6 * m, left = p * per, cap = 2 * p, r, st;
    for (r = 0; r < p; r++) n_app[r] = 0;
    while (left > 0) {
        int progress = 0;
        for (r = 0; r < p; r++) {
            int c0 = r, c1 = S - 1 - r, op = -1, at = -1, best = m;
            int live = f_done[c0] - w_done[c0] + f_done[c1] - w_done[c1];
            int reserved = f_done[c0] - f_done[c1];
            /* 1. a ready B, older micro-batch first */
            if (b_done[c1] < m && (c1 == S - 1 ? f_done[c1] : b_done[c1 + 1]) > b_done[c1]) {
                op = PP_OP_B, at = c1, best = b_done[c1];
            }
            if (b_done[c0] < m && b_done[c0 + 1] > b_done[c0] && b_done[c0] < best) op = PP_OP_B, at = c0;
            /* 2. F of chunk 1; 3. F of chunk 0 within the cap */
            if (op < 0 && f_done[c1] < m && f_done[c1 - 1] > f_done[c1]) op = PP_OP_F, at = c1;
            if (op < 0 && f_done[c0] < m && (c0 == 0 || f_done[c0 - 1] > f_done[c0]) && live + reserved + 2 <= cap)
                op = PP_OP_F, at = c0;
            /* 4. the oldest W */
            if (op < 0) {
                if (b_done[c1] > w_done[c1]) op = PP_OP_W, at = c1;
                if (b_done[c0] > w_done[c0] && (op < 0 || w_done[c0] < w_done[c1])) op = PP_OP_W, at = c0;
            }
            pick_op[r] = op;
            pick_st[r] = at;
        }
        /* commit the tick: what ran now is visible from the next tick on */
        for (r = 0; r < p; r++) {
            int* cnt;
            if (pick_op[r] < 0) continue;
            st = pick_st[r];
            cnt = pick_op[r] == PP_OP_F ? &f_done[st] : pick_op[r] == PP_OP_B ? &b_done[st] : &w_done[st];
            _pp_sched_set_map(&out[(size_t)r * (size_t)per + (size_t)n_app[r]++], pick_op[r], PP_MAP_V, p, S, r, *cnt,
                              st == r ? 0 : 1);
            (*cnt)++;
            left--;
            progress = 1;
        }
        if (!progress) /* cannot happen (see above); an error beats an endless loop */
            return _pp_fail(err, PP_ERR_SCHEDULE, "zb-v p=%d m=%d: schedule builder stuck", p, m);
    }
    return PP_OK;
}

/* DualPipeV (DeepSeek-AI, DeepSeek-V3 Technical Report, 2024; the V form is Sea AI Lab's
   "cut-in-half" of DualPipe, as in github deepseek-ai/DualPipe), for m >= 2p. Phase c of rank r is
   chunk c (stage r going down, 2p-1-r coming back up). F(c): the next forward of chunk c; B(c):
   the next backward with its W right behind, or with `zb` its W queued; W: the oldest queued W.
   Rank r runs, in eight steps:
     1. 2(p-r-1) x F(0)                         warm-up, chunk 0 only
     2. (r+1) x F(0) F(1)
     3. (p-r-1) x B(1, zb) W F(1)               the zero-bubble step: the W fills the wait for F(1)
     4. (m-2p+r+1) x F(0) B(1) F(1) B(0)        the main step: two overlapped F&B pairs
     5. (p-r-1) x B(1) F(1) B(0)
     6. (r+1) x B(1) B(0), their W's queued from the middle on (rank parity decides which B first)
     7. (p-r-1) x W B(0, zb)
     8. (r+1) x W
   Every stage sees its F's, B's and W's in ascending micro-batch order (the queue is FIFO and
   holds only B's later than every W already run). A rank holds 2p chunk stashes after step 2 and
   2p + 1 inside each pair of step 4: DualPipe's "PP + 1" (PP = 2p stages). The queue never holds
   more than 2p + 2 W's (at most r + 1 B's of each chunk in step 6). */
static void _pp_sched_build_dualpipev(int p, int m, pp_action* out) {
    int r, i, per = 6 * m;
    for (r = 0; r < p; r++) {
        pp_action* list = out + (size_t)r * (size_t)per;
        int n = 0, nf[2] = {0, 0}, nb[2] = {0, 0}, qh = 0, qt = 0, zb = 0;
        int qmb[2 * PP_MAX_RANKS + 4], qc[2 * PP_MAX_RANKS + 4]; /* the W queue: (mb, chunk) */
        const int Q = 2 * PP_MAX_RANKS + 4, s6 = r + 1;
#define _PP_DPV_F(c) _pp_sched_set_map(&list[n++], PP_OP_F, PP_MAP_V, p, 2 * p, r, nf[c]++, c)
#define _PP_DPV_B(c, q)                                                                                             \
    do {                                                                                                             \
        _pp_sched_set_map(&list[n++], PP_OP_B, PP_MAP_V, p, 2 * p, r, nb[c], c);                                     \
        if (q) qmb[qt % Q] = nb[c], qc[qt % Q] = c, qt++;                                                            \
        else _pp_sched_set_map(&list[n++], PP_OP_W, PP_MAP_V, p, 2 * p, r, nb[c], c);                                \
        nb[c]++;                                                                                                     \
    } while (0)
#define _PP_DPV_W() (_pp_sched_set_map(&list[n++], PP_OP_W, PP_MAP_V, p, 2 * p, r, qmb[qh % Q], qc[qh % Q]), qh++)
        for (i = 0; i < 2 * (p - r - 1); i++) _PP_DPV_F(0);
        for (i = 0; i < r + 1; i++) _PP_DPV_F(0), _PP_DPV_F(1);
        for (i = 0; i < p - r - 1; i++) {
            _PP_DPV_B(1, 1);
            _PP_DPV_W();
            _PP_DPV_F(1);
        }
        for (i = 0; i < m - 2 * p + r + 1; i++) {
            _PP_DPV_F(0);
            _PP_DPV_B(1, 0);
            _PP_DPV_F(1);
            _PP_DPV_B(0, 0);
        }
        for (i = 0; i < p - r - 1; i++) {
            _PP_DPV_B(1, 0);
            _PP_DPV_F(1);
            _PP_DPV_B(0, 0);
        }
        for (i = 0; i < s6; i++) {
            if (i == s6 / 2 && r % 2 == 1) zb = 1;
            _PP_DPV_B(1, zb);
            if (i == s6 / 2 && r % 2 == 0) zb = 1;
            _PP_DPV_B(0, zb);
        }
        for (i = 0; i < p - r - 1; i++) {
            _PP_DPV_W();
            _PP_DPV_B(0, 1);
        }
        while (qh < qt) _PP_DPV_W();
#undef _PP_DPV_F
#undef _PP_DPV_B
#undef _PP_DPV_W
        PP_ASSERT(n == per && qh == qt);
    }
}

/* Rank r's stash count at its busiest slot, the W's taking the free slots oldest B first as
   below, or each right behind its B with w_eager (F: +1, W: -1): what the compaction may not
   raise. diff: scratch of L ints (+1 for an F
   in the slot, -1 for a B, 0 free; a slot holds at most one pass here). */
static int _pp_vblock_peak(const int* slot, int m, int L, int w_eager, int* diff) {
    int t, j, s, live = 0, pending = 0, peak = 0;
    for (s = 0; s < L; s++) diff[s] = 0;
    for (t = 0; t < 4; t++)
        for (j = 0; j < m; j++) diff[slot[t * m + j]] = t < 2 ? 1 : -1;
    for (s = 0; s < L; s++) {
        if (diff[s] > 0) live++;
        else if (diff[s] < 0) pending++, live -= w_eager, pending -= w_eager;
        else if (pending > 0) pending--, live--;
        if (live > peak) peak = live;
    }
    return peak;
}

/* V-Half and V-Min as repeating building blocks (Qi et al., "Pipeline Parallelism with
   Controllable Memory", 2024). Time is cut into unit slots; micro-batch j's four passes on rank r
   (F of chunk 0, F of chunk 1, B of chunk 1, B of chunk 0: t = 0 .. 3) sit at slot base + 6j, so
   every rank repeats the same 6-slot block: four F/B slots and two free ones, which the W's take,
   oldest B first. The bases follow the V with each hop one slot after the pass it waits for,
   except that the slow arms take two slots per hop; which arms are slow sets the memory:
     V-Min:  F0 at r, F1 at 2p-1-r, B1 at 2p+r, B0 at 4p-1-r (every hop one slot): chunk 0 of
             rank 0 lives about 4p slots, 4p/6 micro-batches in flight: a third of 1F1B's 2p chunks;
     V-Half: F0 at 2r, F1 at 3p-2-r, B1 at 3p-1+2r, B0 at 6p-2-r (F0 and B1 two slots a hop):
             about 6p slots, p chunks: half of 1F1B's.
   Where two bases of one rank coincide modulo 6 (V-Min with p % 3 == 0, V-Half with p even), the B
   bases move later by 2 (V-Min) or 3 (V-Half) slots, which parts them.
   With `w_chunk1` a free slot takes the oldest chunk-1 W first (else the oldest W of either).
   With `compact`, every pass then moves to the first free slot after what it waits for (the pass
   before it on the V, and its own stage's previous micro-batch), if that does not raise its rank's
   peak count: the warm-up and the cool-down fill their empty slots. With `w_eager` each W follows
   its B at once. The order of the slots is the list; the real times come from the costs
   (pp_simulate squeezes out the empty slots). Scratch: slot (4*p*m ints), occ (p*L bytes), diff
   (L + 4p ints), L = 6m + 6p + 8. */
static void _pp_sched_build_vblock(pp_schedule_kind k, int p, int m, int w_eager, int w_chunk1, int compact, int* slot_all,
                                   unsigned char* occ_all, int* diff, pp_action* out) {
    int per = 6 * m, L = 6 * m + 6 * p + 8, r, t, j, s;
    for (r = 0; r < p; r++) {
        int base[4], *slot = slot_all + (size_t)r * 4 * (size_t)m;
        unsigned char* occ = occ_all + (size_t)r * (size_t)L;
        if (k == PP_SCHED_V_MIN) {
            int gap = p % 3 == 0 ? 2 : 0;
            base[0] = r, base[1] = 2 * p - 1 - r, base[2] = 2 * p + gap + r, base[3] = 4 * p + gap - 1 - r;
        } else {
            int gap = p % 2 == 0 ? 3 : 0;
            base[0] = 2 * r, base[1] = 3 * p - 2 - r, base[2] = 3 * p - 1 + gap + 2 * r, base[3] = 6 * p + gap - 2 - r;
        }
        memset(occ, 0, (size_t)L);
        for (t = 0; t < 4; t++)
            for (j = 0; j < m; j++) slot[t * m + j] = base[t] + 6 * j, occ[base[t] + 6 * j] = 1;
    }
    if (compact) {
        int peak = 0;
        for (r = 0; r < p; r++) {
            int x = _pp_vblock_peak(slot_all + (size_t)r * 4 * (size_t)m, m, L, w_eager, diff);
            if (x > peak) peak = x;
        }
        /* in slot order, so that what a pass waits for has moved already; the steady state (from
           rank 0's first chunk-0 B to its last F) keeps its block */
        int warm_end = slot_all[3 * m], cool = slot_all[m - 1], *at = diff + L; /* at: next j per (r, t) */
        for (r = 0; r < 4 * p; r++) at[r] = 0;
        for (s = 0; s < L; s++)
            for (r = 0; r < p; r++)
                for (t = 0; t < 4; t++) {
                    /* each (rank, pass) sequence ascends, and only its unvisited part still sits at
                       its first slot: the next one is the only one that can be due at s */
                    int* slot = slot_all + (size_t)r * 4 * (size_t)m, dep = -1, f, j = at[r * 4 + t];
                    unsigned char* occ = occ_all + (size_t)r * (size_t)L;
                    if (j >= m || slot[t * m + j] != s) continue;
                    at[r * 4 + t]++;
                    if (s >= warm_end && s <= cool) continue;
                    /* the pass before it on the V (+ 1 slot), and its stage's previous one */
                    if (t == 0 && r > 0) dep = slot_all[(size_t)(r - 1) * 4 * m + 0 * m + j];
                    if (t == 1) dep = r < p - 1 ? slot_all[(size_t)(r + 1) * 4 * m + 1 * m + j] : slot[0 * m + j];
                    if (t == 2) dep = r > 0 ? slot_all[(size_t)(r - 1) * 4 * m + 2 * m + j] : slot[1 * m + j];
                    if (t == 3) dep = r < p - 1 ? slot_all[(size_t)(r + 1) * 4 * m + 3 * m + j] : slot[2 * m + j];
                    if (j > 0 && slot[t * m + j - 1] > dep) dep = slot[t * m + j - 1];
                    for (f = dep + 1; f < s; f++) { /* the first free slot where the count holds */
                        if (occ[f]) continue;
                        slot[t * m + j] = f;
                        if (_pp_vblock_peak(slot, m, L, w_eager, diff) <= peak) break;
                    }
                    if (f >= s) {
                        slot[t * m + j] = s;
                        continue;
                    }
                    occ[s] = 0, occ[f] = 1;
                }
    }
    for (r = 0; r < p; r++) {
        pp_action* list = out + (size_t)r * (size_t)per;
        const int* slot = slot_all + (size_t)r * 4 * (size_t)m;
        int n = 0, next[4] = {0, 0, 0, 0}, wi = 0, nw = 0, wc[2] = {0, 0};
        for (s = 0; s < L; s++) {
            int used = 0;
            for (t = 0; t < 4; t++) /* the passes due in this slot (more than one only at a collision) */
                if (next[t] < m && slot[t * m + next[t]] == s) {
                    _pp_sched_set_map(&list[n++], t < 2 ? PP_OP_F : PP_OP_B, PP_MAP_V, p, 2 * p, r, next[t],
                                      t == 0 || t == 3 ? 0 : 1);
                    if (t >= 2 && w_eager) { /* the W right behind its B: the stash goes at once */
                        _pp_sched_set_map(&list[n++], PP_OP_W, PP_MAP_V, p, 2 * p, r, next[t], t == 3 ? 0 : 1);
                        nw++, wc[t == 3 ? 0 : 1]++;
                    }
                    next[t]++;
                    used = 1;
                }
            if (used || w_eager || nw == 2 * m) continue;
            if (w_chunk1) { /* a free slot: the oldest chunk-1 W, else the oldest chunk-0 W */
                int c = wc[1] < next[2] ? 1 : wc[0] < next[3] ? 0 : -1;
                if (c >= 0) _pp_sched_set_map(&list[n++], PP_OP_W, PP_MAP_V, p, 2 * p, r, wc[c]++, c), nw++;
                continue;
            }
            while (wi < n && list[wi].op != PP_OP_B) wi++;
            if (wi < n) { /* a free slot: the W of the oldest B not yet W'd */
                _pp_sched_set_map(&list[n++], PP_OP_W, PP_MAP_V, p, 2 * p, r, list[wi].mb, list[wi].chunk);
                wi++, nw++;
            }
        }
        if (w_chunk1) /* the W's left after the last B */
            for (t = 1; t >= 0; t--)
                while (wc[t] < m) _pp_sched_set_map(&list[n++], PP_OP_W, PP_MAP_V, p, 2 * p, r, wc[t]++, t), nw++;
        for (; nw < 2 * m; wi++)
            if (list[wi].op == PP_OP_B) {
                _pp_sched_set_map(&list[n++], PP_OP_W, PP_MAP_V, p, 2 * p, r, list[wi].mb, list[wi].chunk);
                nw++;
            }
        PP_ASSERT(n == per);
    }
}

/* Cost-aware list scheduling (ZB-H2, ZB-V, V-Half, V-Min; DualPipeV below m = 2p; interleaved-mem
   for costs). One run plays the whole step forward in time with the given costs: whenever a rank
   falls idle, it picks one of the actions that are ready on it at that moment (their input or
   output gradient has arrived, + comm from another rank) by a policy, and the order in which the
   ranks picked is their list. A list is thus the order of a run that happened, every dependency
   finished before its consumer started, so it cannot deadlock under any costs. Each stage runs F, B
   and W in ascending micro-batch order (one counter per stage and op): pipelined gradients stay
   bit-identical to the sequential reference.
   Memory. A rank holds a stash from the F of a (micro-batch, chunk) to its W (with a W share,
   pp_sim_cost.b_free of it only to its B). A new micro-batch enters a rank (its chunk-0 F) only
   while its stashes leave room for all v of its chunks under the cap, and a later chunk's F only
   while one slot is free; with `reserve`, instead, every micro-batch that entered keeps slots for
   its later chunks, which then never wait. Either way a rank's stashes belong to micro-batches no
   older than the oldest one in flight once the older ones drained (their B's and W's need no
   memory), so the oldest can always move and, with cap >= v, a run never sticks. With `tight` a
   new micro-batch needs one free slot, and one more only while a micro-batch on the rank still
   waits for a later chunk's F: the rank fills its last slot with a new micro-batch's chunk 0 when
   no chunk 1 is due, and a W makes room for that micro-batch's chunk 1 later (room for both at
   once held the last micro-batches back on V-Half's lower ranks: p = 8, m = 8, F,B,W =
   0.5,0.6,0.4 took 37, 35.8 with it). For v = 2 the oldest waiting chunk-1 F takes the slot kept
   (a stage's F's run in micro-batch order), so the argument above holds; for v > 2 a run may
   stick, and then just loses.
   Policy (the knobs the variants turn):
   - cap: the stash cap used for admitting (<= the kind's cap; a smaller one is a shorter warm-up);
   - w_mode: when a W runs if no F or B is ready: 0 always; 1 only if it ends before the next F or
     B could arrive; 2 only when memory holds back an F or nothing but W's is left; 3 like 0, and
     right after every B; 4 and 5 like 0 and 1 until the rank's last F, then like 2. A W whose
     cost is 0 runs at once, and one runs when memory holds back the F the policy wants next;
   - fb: B before F when both are ready (0, 1F1B's steady state), F first (1), or alternate (2);
   - late_first: among ready B's the later stage first (else the older micro-batch);
   - new_first: among ready F's the newer micro-batch first (else the older);
   - tight: the admission above (else room for all v chunks, or `reserve`);
   - seed: a jitter that turns one decision in 32 of each kind (F/B order, W or wait, B order,
     F order) the other way, deterministic for a seed.
   pp_simulate judges the candidates; the best makespan wins (then the lower peak). */
typedef struct _pp_ls_policy {
    int cap, w_mode, fb, late_first, reserve, new_first, tight;
    unsigned long long seed;    /* 0: none; else the seed of the jitter */
} _pp_ls_policy;

typedef struct _pp_ls {
    int p, v, m, S;
    pp_stage_map map;
    double comm;
    const double *df, *db, *dw;   /* per stage durations, S each */
    const double* bf;             /* per stage share of a stash B frees (pp_sim_cost.b_free) */
    double *f_end, *b_end;        /* (stage, mb) -> end time, S*m each */
    int *nf, *nb, *nw;            /* per stage: actions appended so far */
} _pp_ls;

static int _pp_ls_stage(const _pp_ls* g, int r, int c) { return _pp_sched_map_stage(g->map, g->p, r, c); }
static int _pp_ls_rank(const _pp_ls* g, int st) { return _pp_sched_map_rank(g->map, g->p, st); }

/* When the input of rank r's next action of (op, stage st) arrives: a finished dependency's end
   (+ comm from another rank), or, not yet scheduled, an optimistic guess (its rank starts it next).
   *known says which. */
static double _pp_ls_arrival(const _pp_ls* g, const double* t, int r, int op, int st, double now, int* known) {
    int mb = op == PP_OP_F ? g->nf[st] : g->nb[st], dst, x;
    double d;
    *known = 1;
    if (op == PP_OP_F) {
        if (st == 0) return now;
        dst = st - 1;
        if (g->nf[dst] > mb) return g->f_end[(size_t)dst * (size_t)g->m + (size_t)mb] + (_pp_ls_rank(g, dst) != r ? g->comm : 0);
        d = g->df[dst];
    } else if (st == g->S - 1) {
        if (g->nf[st] > mb) return g->f_end[(size_t)st * (size_t)g->m + (size_t)mb];
        *known = 0;
        return now + g->df[st];
    } else {
        dst = st + 1;
        if (g->nb[dst] > mb) return g->b_end[(size_t)dst * (size_t)g->m + (size_t)mb] + (_pp_ls_rank(g, dst) != r ? g->comm : 0);
        d = g->db[dst];
    }
    *known = 0;
    x = _pp_ls_rank(g, dst);
    return (t[x] > now ? t[x] : now) + d + (x != r ? g->comm : 0);
}

/* One run under policy pol into out (p lists of 3*m*v). Returns 0, or -1 if it stuck (cannot
   happen with cap >= v; checked rather than trusted). */
static int _pp_ls_run(_pp_ls* g, const _pp_ls_policy* pol, pp_action* out) {
    int p = g->p, v = g->v, m = g->m, S = g->S, per = 3 * m * v, r, c, left = p * per;
    int n_app[PP_MAX_RANKS], wait[PP_MAX_RANKS], last[PP_MAX_RANKS], last_b[PP_MAX_RANKS];
    double t[PP_MAX_RANKS], inf = 1e300;
    unsigned long long rng = pol->seed;
    for (c = 0; c < S; c++) g->nf[c] = g->nb[c] = g->nw[c] = 0;
    for (r = 0; r < p; r++) t[r] = 0, n_app[r] = 0, wait[r] = 0, last[r] = PP_OP_B, last_b[r] = 0;
    while (left > 0) {
        int op = -1, at = -1, b_at = -1, f_at = -1, w_at = -1, f_held = 0, only_w = 1, resv = 0, known, want_b, wm, f_left = 0,
            jit = -1;
        double now, next = inf, guess = inf, end, live = 0;
        r = -1;
        for (c = 0; c < p; c++)
            if (n_app[c] < per && (r < 0 || t[c] < t[r])) r = c;
        if (r < 0 || t[r] >= inf) return -1;
        now = t[r];
        if (pol->seed) { /* jitter: one decision in 32 of each kind goes the other way */
            rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
            jit = (int)(rng >> 59);
        }
        for (c = 0; c < v; c++) {
            int st = _pp_ls_stage(g, r, c);
            live += g->nf[st] - g->bf[st] * g->nb[st] - (1 - g->bf[st]) * g->nw[st]; /* the W share */
            if (c + 1 < v) resv += g->nf[st] - g->nf[_pp_ls_stage(g, r, c + 1)];
        }
        /* ready B's and F's: the oldest micro-batch first (B's: the later stage first with
           late_first), B before F unless f_first */
        for (c = 0; c < v; c++) {
            int st = _pp_ls_stage(g, r, c);
            double a;
            if (g->nb[st] < m) only_w = 0;
            if (g->nf[st] < m) f_left = 1;
            if (g->nb[st] < g->nf[st]) {
                a = _pp_ls_arrival(g, t, r, PP_OP_B, st, now, &known);
                if (known && a <= now) {
                    if (b_at < 0 || (pol->late_first != (jit == 2) ? st > b_at : g->nb[st] < g->nb[b_at])) b_at = st;
                } else {
                    if (known && a < next) next = a;
                    if (a < guess) guess = a;
                }
            }
            if (g->nf[st] < m) {
                a = _pp_ls_arrival(g, t, r, PP_OP_F, st, now, &known);
                if (known && a <= now) {
                    int first = _pp_ls_stage(g, r, 0) == st;
                    if (pol->tight     ? live + 1 + (first && resv > 0) > pol->cap + 1e-9
                        : pol->reserve ? first && live + resv + v > pol->cap + 1e-9
                                       : live + (first ? v : 1) > pol->cap + 1e-9)
                        f_held = 1;
                    else if (f_at < 0 || (pol->new_first != (jit == 3) ? g->nf[st] > g->nf[f_at] : g->nf[st] < g->nf[f_at])) f_at = st;
                } else {
                    if (known && a < next) next = a;
                    if (a < guess) guess = a;
                }
            }
            if (g->nw[st] < g->nb[st] && (w_at < 0 || g->nw[st] < g->nw[w_at])) w_at = st;
        }
        want_b = (pol->fb == 0 || (pol->fb == 2 && last[r] != PP_OP_B)) != (jit == 0);
        /* modes 4 and 5 are 0 and 1 until the rank's last F, then 2 (the cool-down's W's wait) */
        wm = pol->w_mode < 4 ? pol->w_mode : f_left ? pol->w_mode - 4 : 2;
        if (w_at >= 0 && (g->dw[w_at] <= 0 || (f_held && (b_at < 0 || !want_b)) || (pol->w_mode == 3 && last_b[r])))
            op = PP_OP_W, at = w_at;
        else if (b_at >= 0 && (f_at < 0 || want_b)) op = PP_OP_B, at = b_at;
        else if (f_at >= 0) op = PP_OP_F, at = f_at;
        else if (w_at >= 0 && (only_w || ((wm == 0 || (wm == 1 && now + g->dw[w_at] <= guess)) != (jit == 1 && next < inf))))
            op = PP_OP_W, at = w_at;
        if (op < 0) { /* idle until something arrives (or another rank schedules) */
            t[r] = next;
            wait[r] = 1;
            continue;
        }
        {
            int* cnt = op == PP_OP_F ? &g->nf[at] : op == PP_OP_B ? &g->nb[at] : &g->nw[at];
            double dur = op == PP_OP_F ? g->df[at] : op == PP_OP_B ? g->db[at] : g->dw[at];
            int chunk = _pp_sched_map_chunk(g->map, p, at);
            _pp_sched_set_map(&out[(size_t)r * (size_t)per + (size_t)n_app[r]++], op, g->map, p, S, r, *cnt, chunk);
            end = now + dur;
            if (op == PP_OP_F) g->f_end[(size_t)at * (size_t)m + (size_t)*cnt] = end;
            if (op == PP_OP_B) g->b_end[(size_t)at * (size_t)m + (size_t)*cnt] = end;
            (*cnt)++;
            t[r] = end;
            wait[r] = 0;
            if (op != PP_OP_W) last[r] = op;
            last_b[r] = op == PP_OP_B;
            left--;
            /* a waiting rank looks again when this action ends */
            for (c = 0; c < p; c++)
                if (wait[c] && t[c] > end) t[c] = end;
        }
    }
    return 0;
}

/* The builder. Rank r's pattern is: warm[r] forwards, then one forward one backward, then the
   remaining backwards (so backward j is preceded by min(warm[r] + j + 1, total) forwards).
   Instead of writing each pattern out blindly, we append actions to the ranks' lists in sweeps,
   and an action is appended only once the action it depends on has been appended (on its own
   rank or another). The order of appends is then a topological order of the whole dependency
   graph (data edges plus list order), so the lists cannot deadlock, whatever the costs, with
   eager sends. When the patterns can be followed (GPipe, 1F1B, and interleaved with the counts
   above in every case we checked), the lists are exactly the patterns.
   A sweep that appends nothing means the patterns as given would deadlock (too short a warm-up:
   Megatron's count with a short last group does, e.g. p=4 v=3 m=5).
   Then some rank whose pattern says "backward" can run a forward instead. Proof: among the ranks
   with forwards left, take the one whose next forward has the smallest unit index k (lowest rank
   on ties). Its input comes from unit k on rank r-1 (which, k being smallest, has passed k) or,
   on rank 0, from an earlier unit on rank p-1 (passed too): it is ready. Its rank did not run it
   in the sweep, so its pattern says "backward". We give such a rank one more warm-up forward
   (warm[r] += 1; it stays 1F1B afterwards with one more stash) and sweep on: every stuck sweep
   is followed by at least one append, so the builder finishes. Once all forwards are appended,
   the same argument on backward unit indices (smallest index, highest rank on ties) shows the
   sweep never gets stuck.
   Interleaved-mem's left-out units (u.skip) take part in all of this but append nothing.
   State is three counters per rank (on the stack): generation allocates nothing. */
static pp_result _pp_sched_build(pp_schedule_kind k, int p, int v, int m, pp_action* out,
                                 pp_error* err) {
    int n_f[PP_MAX_RANKS], n_b[PP_MAX_RANKS], warm[PP_MAX_RANKS], n_app[PP_MAX_RANKS];
    int total, per_rank = 2 * m * v, n_stages = p * v, r, left;
    _pp_sched_units u;
    _pp_sched_layout(&u, k, p, v, m);
    total = (u.n_a * u.s_a + u.n_b * u.s_b) * v; /* units: m * v, or m' * v with skipped ones */
    left = 2 * p * total;
    for (r = 0; r < p; r++) {
        n_f[r] = n_b[r] = n_app[r] = 0;
        warm[r] = _pp_sched_warmup(k, &u, r);
    }
    while (left > 0) {
        int progress = 0, pick = -1;
        for (r = 0; r < p; r++) {
            pp_action* list = out + (size_t)r * (size_t)per_rank;
            for (;;) {
                int mb, chunk, real;
                int want_f = n_f[r] < total && n_f[r] < warm[r] + n_b[r] + 1;
                if (n_b[r] == total) break;
                if (want_f) {
                    if (!_pp_sched_f_ready(&u, n_f, r, n_f[r])) break;
                    _pp_sched_unit(&u, n_f[r], 0, &mb, &chunk);
                    n_f[r]++;
                } else {
                    if (!_pp_sched_b_ready(&u, n_f, n_b, r, n_b[r])) break;
                    _pp_sched_unit(&u, n_b[r], 1, &mb, &chunk);
                    n_b[r]++;
                }
                real = mb;
                if (!u.skip || !_pp_sched_skipped(&u, mb, &real))
                    _pp_sched_set(&list[n_app[r]++], want_f ? PP_OP_F : PP_OP_B, p, n_stages, r, real, chunk);
                left--;
                progress = 1;
            }
        }
        if (progress) continue;
        /* Stuck: one more warm-up forward on a rank that waits at a backward although its next
           forward is ready (the argument above says one exists). Any such rank works; with
           Megatron's groups (where this fires often) the lowest gave slightly smaller bubbles
           than the highest. */
        for (r = 0; r < p && pick < 0; r++)
            if (n_f[r] < total && _pp_sched_f_ready(&u, n_f, r, n_f[r])) pick = r;
        if (pick < 0) /* cannot happen; an error beats an endless loop if it ever did */
            return _pp_fail(err, PP_ERR_SCHEDULE, "%s p=%d v=%d m=%d: schedule builder stuck",
                            pp_schedule_name(k), p, v, m);
        warm[pick] = n_f[pick] - n_b[pick];
    }
    return PP_OK;
}

int pp_schedule_stash_cap(pp_schedule_kind k, int p, int v, int m) {
    int mm = p < m ? p : m;
    if (_pp_sched_check_args(k, p, v, m, NULL) != PP_OK) return 0;
    switch (k) {
    case PP_SCHED_GPIPE: return m;
    case PP_SCHED_1F1B: case PP_SCHED_ZB_H1: return mm;
    case PP_SCHED_ZB_H2: case PP_SCHED_ZB_V: return 2 * mm;
    case PP_SCHED_V_HALF: return mm + 2;
#ifdef PP_TEST_OLD_VMIN_CAP /* negative control (build/zb-controls): the cap before 2026-11-28, a chunk
                               more where min(p, m) % 3 == 1 (5 at p = 4, over the authors' 4) */
    case PP_SCHED_V_MIN: return (2 * mm + 2) / 3 + 2;
#else
    case PP_SCHED_V_MIN: return 2 * ((mm + 1) / 3) + 2;
#endif
    case PP_SCHED_DUALPIPE_V: return 2 * p + 1 < 2 * m ? 2 * p + 1 : 2 * m;
    case PP_SCHED_INTERLEAVED_MEM: {
        int mp = (m + p - 1) / p * p, c = 2 * (p - 1) + (v - 1) * p + 1;
        return c < mp * v ? c : mp * v;
    }
    default: return 0;
    }
}

static double _pp_sim_def(double x, double def);
static double _pp_sim_comm(const pp_sim_cost* c);
static double _pp_sim_bfree(const pp_sim_cost* c, int st);
static double _pp_sim_rf(const pp_sim_cost* c, int st);

/* Sum over the ranks of the time each finishes (its last action's end). */
static double _pp_sched_finish_sum(const pp_schedule* s, const pp_event* ev) {
    int r;
    double sum = 0;
    for (r = 0; r < s->p; r++) sum += ev[(size_t)r * (size_t)s->per_rank + (size_t)s->per_rank - 1].end;
    return sum;
}

#ifndef _PP_LS_POLISH
#define _PP_LS_POLISH 1000 /* simulations the polish may spend */
#endif
#ifndef _PP_LS_WORK
#define _PP_LS_WORK 3e7 /* action-steps one generation may spend (about 0.2 s) */
#endif
#ifndef _PP_LS_JITTER
#define _PP_LS_JITTER 128 /* jittered runs around the best policy */
#endif
#ifndef _PP_LS_TIGHT_JITTER
#define _PP_LS_TIGHT_JITTER 64 /* jittered runs around the best tight policy (V-Half, V-Min) */
#endif

/* How far a simulated schedule is over the stash cap (peak_mem: with the W share): the sum over
   ranks of the excess. */
static double _pp_sched_excess(const pp_sim_result* res, int p, int cap) {
    int r;
    double x = 0;
    for (r = 0; r < p; r++) x += res->peak_mem[r] > cap + 1e-9 ? res->peak_mem[r] - cap : 0;
    return x;
}

/* Polish: adjacent swaps on one rank's list, kept when pp_simulate says the schedule got better:
   less over the stash cap, else a shorter step, else as short with the ranks finishing earlier in
   sum (slack for later swaps); the lists must still run. A swap of two actions of one stage and op
   would break the ascending order, and a B cannot pass its own F (nor a W its B): those are not
   tried. At most `budget` simulations. Returns the excess left (0: under the cap). */
static double _pp_sched_polish(pp_schedule* s, const pp_sim_cost* c, int cap, pp_sim_result* res, pp_event* ev,
                               long budget) {
    int p = s->p, per = s->per_rank, r, i, improved = 1;
    double best, best_sum, best_x;
    if (pp_simulate(s, c, res, ev, NULL) != PP_OK) return 1;
    best = res->makespan;
    best_sum = _pp_sched_finish_sum(s, ev);
    best_x = _pp_sched_excess(res, p, cap);
    while (improved && budget > 0) {
        improved = 0;
        for (r = 0; r < p && budget > 0; r++) {
            pp_action* a = s->actions + (size_t)r * (size_t)per;
            for (i = 0; i + 1 < per && budget > 0; i++) {
                pp_action t;
                int ok = 0, j = i + 1;
                if (a[i].stage == a[j].stage && (a[i].op == a[j].op || a[i].mb == a[j].mb)) continue;
                t = a[i], a[i] = a[j], a[j] = t;
                budget--;
                if (pp_simulate(s, c, res, ev, NULL) == PP_OK) {
                    double x = _pp_sched_excess(res, p, cap);
                    double sum = _pp_sched_finish_sum(s, ev);
                    ok = x < best_x - 1e-9 || (x <= best_x + 1e-9 && (res->makespan < best - 1e-9 ||
                                                        (res->makespan <= best + 1e-9 && sum < best_sum - 1e-9)));
                    if (ok) best = res->makespan, best_sum = sum, best_x = x, improved = 1;
                }
                if (!ok) t = a[i], a[i] = a[j], a[j] = t;
            }
        }
    }
    return best_x;
}

/* The best list of one family of candidates (_pp_sched_build_ls): the shortest within the cap
   (then the lowest peak) in out, and the policy of the shortest deterministic one (the jitter's
   base). mk and det are -1 while there is none. */
typedef struct _pp_ls_best {
    double mk, peak, det;
    _pp_ls_policy pol;
    pp_action* out;
} _pp_ls_best;

/* A candidate within the cap: kept where it beats b (det: a deterministic policy's run). */
static void _pp_ls_keep(_pp_ls_best* b, int det, const _pp_ls_policy* pol, double mk, double peak, const pp_action* acts,
                        size_t n) {
    if (det && (b->det < 0 || mk < b->det - 1e-9)) b->det = mk, b->pol = *pol;
    if (b->mk < 0 || mk < b->mk - 1e-9 || (mk <= b->mk + 1e-9 && peak < b->peak - 1e-9)) {
        b->mk = mk;
        b->peak = peak;
        memcpy(b->out, acts, n * sizeof *acts);
    }
}

/* Policies per cap level: w_mode x fb x late_first. reserve and new_first are not crossed with
   them: they follow the level (i / 36: reserve at odd levels below the cap, new_first at levels
   2 and 3 mod 4), so each level below the cap tries one of their four pairings. */
#define _PP_LS_VARIANTS 36

/* The cost-aware kinds: every policy variant is played out, pp_simulate judges, the best list
   (shortest makespan, then lowest peak) goes to out. For ZB-V the unit-cost greedy lists above
   compete too; DualPipeV (m >= 2p) is its own order alone, polished. V-Half and V-Min, whose caps
   hold the warm-up back, also play the policies at their cap with the tight admission and jittered
   runs around the best of those, after all the rest; the best of these is kept apart and, where it
   beats the rest, polished too: the shorter polished list wins (a polish from another start can end
   longer, so the rest's is never lost). Scratch: the variant's lists, the end times and the
   simulator's. */
static pp_result _pp_sched_build_ls(pp_schedule_kind k, int p, int v, int m, const pp_sim_cost* cost, pp_action* out,
                                    pp_error* err) {
    _pp_ls g;
    _pp_ls_policy pol;
    _pp_ls_best rest, tight; /* the policies and lists before the tight admission, and with it */
    pp_sim_cost c;
    pp_schedule cand;
    pp_sim_result* res = NULL;
    pp_action *acts = NULL, *dst = out, *best3 = NULL, *tbest = NULL;
    pp_event* ev = NULL;
    int *vb_slot = NULL, *vb_diff = NULL;
    unsigned char* vb_occ = NULL;
    double *dur = NULL, *ends = NULL;
    int *cnt = NULL, S = p * v, per = 3 * m * v, cap = pp_schedule_stash_cap(k, p, v, m), lo, i, n_det, n_jit, n_tdet, n_tjit,
        n_rest;
    int two = _pp_sched_ops(k) == 2; /* interleaved-mem: no W actions in out (see below) */
    size_t n = (size_t)p * (size_t)per;
    long units, ls_cost, polish;
    pp_result rc = PP_OK;
    memset(&c, 0, sizeof c);
    if (cost) c = *cost;
    memset(&g, 0, sizeof g);
    g.p = p, g.v = v, g.m = m, g.S = S, g.map = _pp_sched_kind_map(k);
    g.comm = _pp_sim_comm(&c);
    if (!cost) c.f = c.b = c.w = 1.0; /* unit costs */
    dur = (double*)_pp_calloc(4 * (size_t)S, sizeof *dur);
    ends = (double*)_pp_calloc(2 * (size_t)S * (size_t)m, sizeof *ends);
    cnt = (int*)_pp_calloc(3 * (size_t)S, sizeof *cnt);
    acts = (pp_action*)_pp_calloc(n, sizeof *acts);
    res = (pp_sim_result*)_pp_calloc(1, sizeof *res);
    ev = (pp_event*)_pp_calloc(n, sizeof *ev);
    if (two) dst = best3 = (pp_action*)_pp_calloc(n, sizeof *best3);
    if (k == PP_SCHED_V_HALF || k == PP_SCHED_V_MIN) { /* the blocks' scratch; without it they sit out */
        size_t L = 6 * (size_t)m + 6 * (size_t)p + 8;
        vb_slot = (int*)_pp_calloc(4 * (size_t)p * (size_t)m, sizeof *vb_slot);
        vb_occ = (unsigned char*)_pp_calloc((size_t)p * L, 1);
        vb_diff = (int*)_pp_calloc(L + 4 * (size_t)p, sizeof *vb_diff);
        if (vb_slot && (!vb_occ || !vb_diff)) {
            PP_FREE(vb_slot);
            vb_slot = NULL;
        }
    }
    if (!dur || !ends || !cnt || !acts || !res || !ev || (two && !best3)) {
        rc = _pp_fail(err, PP_ERR_NOMEM, "%s p=%d m=%d: no memory for the schedule builder", pp_schedule_name(k), p, m);
        goto cleanup;
    }
    for (i = 0; i < S; i++) {
        dur[i] = c.f_stage ? c.f_stage[i] : _pp_sim_def(c.f, 1.0);
        dur[S + i] = (c.b_stage ? c.b_stage[i] : _pp_sim_def(c.b, 2.0)) + _pp_sim_rf(&c, i); /* the recompute */
        dur[2 * S + i] = c.w_stage ? c.w_stage[i] : _pp_sim_def(c.w, 0.0);
        dur[3 * S + i] = _pp_sim_bfree(&c, i);
        if (!(dur[i] >= 0 && dur[S + i] >= 0 && dur[2 * S + i] >= 0 && dur[i] + dur[S + i] + dur[2 * S + i] < 1e300) ||
            g.comm < 0 || dur[3 * S + i] < 0) {
            rc = _pp_fail(err, PP_ERR_INVALID, "%s: costs must be finite and >= 0 (stage %d: f=%g b=%g w=%g, comm=%g)",
                          pp_schedule_name(k), i, dur[i], dur[S + i], dur[2 * S + i], c.comm);
            goto cleanup;
        }
    }
    if (two) { /* a kind without W runs b + w in its B: the candidates get W's of cost 0 right behind
                  their B's (so a stash counts until B), which the end strips */
        for (i = 0; i < S; i++) dur[S + i] += dur[2 * S + i], dur[2 * S + i] = 0, dur[3 * S + i] = 0;
        c.f_stage = dur, c.b_stage = dur + S, c.w_stage = dur + 2 * S, c.b_free = 0, c.b_free_stage = NULL;
        c.r_f = 0, c.r_f_stage = NULL; /* in dur's B now */
    }
    g.df = dur, g.db = dur + S, g.dw = dur + 2 * S, g.bf = dur + 3 * S;
    g.f_end = ends, g.b_end = ends + (size_t)S * (size_t)m;
    g.nf = cnt, g.nb = cnt + S, g.nw = cnt + 2 * S;
    memset(&cand, 0, sizeof cand);
    cand.kind = k, cand.p = p, cand.v = v, cand.m = m, cand.n_stages = S, cand.per_rank = per;
    cand.actions = acts, cand.map = g.map;
    /* the variants: every cap from the kind's down to v (a shorter warm-up), fewer on big inputs */
    /* The effort, in runs over all n actions (a list-scheduling run costs about 1 + p/8 of them, a
       simulation one): the caps cap, cap-1, cap-2 with every policy, then jittered runs, then the
       polish, each within its share of _PP_LS_WORK / n runs, so big inputs take about as long as
       small ones (p=8, m=32: all of it; p=32, m=128: the caps and a short polish). */
    units = (long)(_PP_LS_WORK / (double)n) + 1;
    ls_cost = 1 + p / 8;
    lo = cap - 2;
    while (lo < cap && (long)_PP_LS_VARIANTS * (cap - lo + 1) * ls_cost > units / 2) lo++;
    if (lo < v) lo = v;
    n_det = _PP_LS_VARIANTS * (cap - lo + 1);
    if ((long)n_det * ls_cost > units) n_det = units / ls_cost > 1 ? (int)(units / ls_cost) : 1;
    n_jit = units / 4 / ls_cost < _PP_LS_JITTER ? (int)(units / 4 / ls_cost) : _PP_LS_JITTER;
    polish = units / 4 < _PP_LS_POLISH ? units / 4 : _PP_LS_POLISH;
    if (k == PP_SCHED_DUALPIPE_V && m >= 2 * p) n_det = n_jit = 0; /* its own order, polished */
    /* the tight admission (V-Half, V-Min): its policies at the cap, its jitter and a second polish,
       where what the rest left of the effort covers them (p=8, m=32: yes; p=32, m=128: no) */
    n_rest = n_det + n_jit;
    n_tdet = n_tjit = 0;
    if ((k == PP_SCHED_V_HALF || k == PP_SCHED_V_MIN) &&
        (long)(n_rest + _PP_LS_VARIANTS + _PP_LS_TIGHT_JITTER) * ls_cost + 2 * polish <= units)
        n_tdet = _PP_LS_VARIANTS, n_tjit = _PP_LS_TIGHT_JITTER;
    if (n_tdet && !(tbest = (pp_action*)_pp_calloc(n, sizeof *tbest))) n_tdet = n_tjit = 0; /* it just sits out */
    memset(&rest, 0, sizeof rest);
    rest.mk = rest.det = -1;
    tight = rest;
    rest.out = dst;
    tight.out = tbest;
    for (i = -8; i < n_rest + n_tdet + n_tjit; i++) {
        pp_result sr;
        if (i < 0) {
            if (k == PP_SCHED_ZB_V && i == -1) {
                /* the unit-cost greedy list of earlier versions: one candidate among the rest */
                if ((rc = _pp_sched_build_zbv(p, m, acts, err)) != PP_OK) goto cleanup;
            } else if (two && i == -1) { /* interleaved-mem's left-out layout, a W behind each B */
                int r, j, d, per2 = 2 * m * v;
                if ((rc = _pp_sched_build(k, p, v, m, acts, err)) != PP_OK) goto cleanup;
                for (r = p - 1; r >= 0; r--) /* in place, from the end: a write never passes a read */
                    for (j = per2 - 1, d = per - 1; j >= 0; j--) {
                        pp_action a = acts[(size_t)r * (size_t)per2 + (size_t)j], w = a;
                        w.op = PP_OP_W;
                        if (a.op == PP_OP_B) acts[(size_t)r * (size_t)per + (size_t)d--] = w;
                        acts[(size_t)r * (size_t)per + (size_t)d--] = a;
                    }
            } else if (k == PP_SCHED_DUALPIPE_V && i == -1 && m >= 2 * p) {
                _pp_sched_build_dualpipev(p, m, acts);
                if (!cost) { /* pp_schedule_make: DualPipeV's order as it is */
                    memcpy(out, acts, n * sizeof *acts);
                    goto cleanup;
                }
            } else if ((k == PP_SCHED_V_HALF || k == PP_SCHED_V_MIN) && vb_slot) {
                int x = -1 - i; /* 0 .. 7: W right behind its B, chunk-1 W's first, compacted */
                /* compaction costs up to 4pm stash counts of O(m + p) each: big inputs skip it */
                if ((x >> 2 & 1) && (double)p * m * (m + p) > 5e6) continue;
                _pp_sched_build_vblock(k, p, m, x & 1, x >> 1 & 1, x >> 2 & 1, vb_slot, vb_occ, vb_diff, acts);
            } else {
                continue;
            }
        } else if (i >= n_rest + n_tdet) { /* around the best tight policy, with jitter */
            if (tight.det < 0) break;
            pol = tight.pol;
            pol.seed = (unsigned long long)(i - n_rest - n_tdet) + 1;
            if (_pp_ls_run(&g, &pol, acts) != 0) continue;
        } else if (i >= n_rest) { /* the tight admission at the kind's cap */
            int x = i - n_rest;
            memset(&pol, 0, sizeof pol);
            pol.cap = cap;
            pol.tight = 1;
            pol.w_mode = x % 6;
            pol.fb = x / 6 % 3;
            pol.late_first = x / 18 % 2;
            if (_pp_ls_run(&g, &pol, acts) != 0) continue; /* cannot happen for v = 2; it just loses */
        } else if (i >= n_det) { /* around the best policy, with jitter */
            pol = rest.pol;
            pol.seed = (unsigned long long)i;
            if (_pp_ls_run(&g, &pol, acts) != 0) continue; /* a jittered run may stick: it just loses */
        } else {
            pol.seed = 0;
            pol.cap = cap - i / _PP_LS_VARIANTS;
            pol.w_mode = i % 6;
            pol.fb = i / 6 % 3;
            pol.late_first = i / 18 % 2;
            pol.reserve = i / 36 % 2;
            pol.new_first = i / 72 % 2;
            pol.tight = 0;
            if (_pp_ls_run(&g, &pol, acts) != 0) continue; /* cannot happen; a stuck variant just loses */
        }
        if (i == 0) rest.pol = pol;
        sr = pp_simulate(&cand, &c, res, NULL, NULL);
        /* a block over the cap: the polish may swap it under */
        if (sr == PP_OK && i < 0 && _pp_sched_excess(res, p, cap) > 0 &&
            (_pp_sched_polish(&cand, &c, cap, res, ev, polish) > 0 || pp_simulate(&cand, &c, res, NULL, NULL) != PP_OK))
            continue;
        if (sr == PP_OK) {
            int r;
            double peak = 0;
            for (r = 0; r < p; r++)
                if (res->peak_mem[r] > peak) peak = res->peak_mem[r];
            /* the jitter goes around the best policy, even where a block or layout beat it; the
               tight ones are kept apart */
            if (peak <= cap + 1e-9 && i >= n_rest)
                _pp_ls_keep(&tight, i < n_rest + n_tdet, &pol, res->makespan, peak, acts, n);
            else if (peak <= cap + 1e-9)
                _pp_ls_keep(&rest, i >= 0 && i < n_det, &pol, res->makespan, peak, acts, n);
        }
    }
    if (rest.mk < 0) {
        rc = _pp_fail(err, PP_ERR_SCHEDULE, "%s p=%d m=%d: schedule builder stuck", pp_schedule_name(k), p, m);
    } else {
        int r, j, q;
        cand.actions = dst;
        _pp_sched_polish(&cand, &c, cap, res, ev, polish);
        if (tight.mk >= 0 && tight.mk < rest.mk - 1e-9) { /* the tight one beat the rest: polished too, the shorter wins */
            double rest_mk = pp_simulate(&cand, &c, res, NULL, NULL) == PP_OK ? res->makespan : -1;
            cand.actions = tbest;
            if (_pp_sched_polish(&cand, &c, cap, res, ev, polish) <= 0 && pp_simulate(&cand, &c, res, NULL, NULL) == PP_OK &&
                (rest_mk < 0 || res->makespan < rest_mk - 1e-9))
                memcpy(dst, tbest, n * sizeof *dst);
            cand.actions = dst;
        }
        for (r = 0; two && r < p; r++) /* interleaved-mem: out gets the lists without their W's */
            for (j = q = 0; j < per; j++)
                if (dst[(size_t)r * (size_t)per + (size_t)j].op != PP_OP_W)
                    out[(size_t)r * 2 * (size_t)m * (size_t)v + (size_t)q++] = dst[(size_t)r * (size_t)per + (size_t)j];
    }
cleanup:
    if (best3) PP_FREE(best3);
    if (tbest) PP_FREE(tbest);
    if (dur) PP_FREE(dur);
    if (ends) PP_FREE(ends);
    if (cnt) PP_FREE(cnt);
    if (acts) PP_FREE(acts);
    if (res) PP_FREE(res);
    if (ev) PP_FREE(ev);
    if (vb_slot) PP_FREE(vb_slot);
    if (vb_occ) PP_FREE(vb_occ);
    if (vb_diff) PP_FREE(vb_diff);
    return rc;
}

pp_result pp_schedule_make(pp_schedule_kind k, int p, int v, int m, pp_action* out, size_t cap,
                           pp_schedule* s, pp_error* err) {
    return pp_schedule_make_cost(k, p, v, m, NULL, out, cap, s, err);
}

pp_result pp_schedule_make_cost(pp_schedule_kind k, int p, int v, int m, const pp_sim_cost* cost, pp_action* out,
                                size_t cap, pp_schedule* s, pp_error* err) {
    pp_result rc;
    size_t need;
    _pp_sched_units u;
    u.skip = 0;
    if (!out || !s) return _pp_fail(err, PP_ERR_INVALID, "pp_schedule_make: %s is NULL",
                                    !out ? "out (action array)" : "s (schedule)");
    rc = _pp_sched_check_args(k, p, v, m, err);
    if (rc != PP_OK) return rc;
    need = pp_schedule_size(k, p, v, m);
    if (cap < need)
        return _pp_fail(err, PP_ERR_SIZE, "%s p=%d v=%d m=%d needs %lu actions, cap is %lu",
                        pp_schedule_name(k), p, v, m, (unsigned long)need, (unsigned long)cap);
    if (k == PP_SCHED_INTERLEAVED_MEM) _pp_sched_layout(&u, k, p, v, m);
    if (k == PP_SCHED_ZB_H1) _pp_sched_build_zbh1(p, m, out);
    else if (_pp_sched_ops(k) == 3 || (k == PP_SCHED_INTERLEAVED_MEM && u.skip && cost))
        rc = _pp_sched_build_ls(k, p, v, m, cost, out, err);
    else rc = _pp_sched_build(k, p, v, m, out, err);
    if (rc != PP_OK) return rc;
    s->kind = k;
    s->p = p;
    s->v = v;
    s->m = m;
    s->n_stages = p * v;
    s->per_rank = _pp_sched_ops(k) * m * v;
    s->actions = out;
    s->map = _pp_sched_kind_map(k);
    s->any_order = 0;
    s->forward_only = 0;
    return PP_OK;
}

void pp_schedule_stage_to_rank(const pp_schedule* s, int stage, int* rank, int* chunk) {
    int r = -1, c = -1;
    if (s && s->p > 0 && s->p <= PP_MAX_RANKS && stage >= 0 && stage < s->n_stages) { /* 2p - 1 - stage fits */
        r = _pp_sched_map_rank(s->map, s->p, stage);
        c = _pp_sched_map_chunk(s->map, s->p, stage);
    }
    if (rank) *rank = r;
    if (chunk) *chunk = c;
}

/* The stage of first[0..n_stages] that holds layer, or n_stages when none does. */
static int _pp_layer_stage(const int* first, int n_stages, int layer) {
    int st;
    for (st = 0; st < n_stages && !(layer >= first[st] && layer < first[st + 1]); st++) {}
    return st;
}

int pp_schedule_layer_rank(const pp_schedule* s, const int* first, int layer) {
    int st, r;
    if (!s || !first || (st = _pp_layer_stage(first, s->n_stages, layer)) == s->n_stages) return -1;
    pp_schedule_stage_to_rank(s, st, &r, NULL);
    return r;
}

int pp_schedule_has_w(const pp_schedule* s) {
    return s && s->p > 0 && s->m > 0 && s->v > 0 && s->v <= INT8_MAX && s->per_rank == 3LL * s->m * s->v;
}

size_t pp_schedule_eval_size(const pp_schedule* s) {
    if (!s || s->p < 1 || s->p > PP_MAX_RANKS || s->v < 1 || s->m < 1 || s->n_stages != s->p * s->v ||
        (s->map != PP_MAP_LOOP && s->map != PP_MAP_V) || (s->map == PP_MAP_V && s->v != 2) ||
        (long long)s->p * s->v * s->m > INT32_MAX)
        return 0;
    return (size_t)s->p * (size_t)s->v * (size_t)s->m;
}

/* The forward-only lists (pp_schedule_make_eval), played out in time for unit costs (an F takes
   one tick, a message none): at every tick each rank runs, of its F's whose input is there, the
   one of its highest chunk (each chunk's F's in ascending micro-batch order), and appends it to
   its list. The F a stage feeds on its own rank (the turn of the V; every boundary at p = 1) is
   then ready at once and of a higher chunk: it runs next, and the stash it reads goes. Each list
   is in the order its rank ran, every F after the F it waits for: no list waits in a cycle. The
   highest chunk first drains what is in flight before it takes in more (a rank holds one stash
   at a time), and a rank's messages to a neighbour go in the order of time on both sides: over
   NCCL's in-order matching and rendezvous sends the lists pass where their training lists do
   (checked for p 2..8, m 1..24: tests/test_nccl_pipeline.c). */
pp_result pp_schedule_make_eval(const pp_schedule* s, pp_action* out, size_t cap, pp_schedule* eval, pp_error* err) {
    size_t need = pp_schedule_eval_size(s);
    pp_sim_result* res;
    pp_schedule e;
    pp_result rc;
    int *next = NULL, *fin = NULL, *len = NULL;
    int r, c, p, v, m, S, t, done = 0;
    if (!s || !out || !eval)
        return _pp_fail(err, PP_ERR_INVALID, "pp_schedule_make_eval: %s is NULL",
                        !s ? "s (schedule)" : !out ? "out (action array)" : "eval (schedule)");
    if (!need)
        return _pp_fail(err, PP_ERR_INVALID, "pp_schedule_make_eval: not a schedule (p=%d v=%d m=%d n_stages=%d map=%d)", s->p,
                        s->v, s->m, s->n_stages, (int)s->map);
    if (cap < need)
        return _pp_fail(err, PP_ERR_SIZE, "pp_schedule_make_eval: p=%d v=%d m=%d needs %lu actions, cap is %lu", s->p, s->v,
                        s->m, (unsigned long)need, (unsigned long)cap);
    p = s->p, v = s->v, m = s->m, S = s->n_stages;
    next = (int*)_pp_calloc((size_t)p * (size_t)v, sizeof *next);  /* [r][c]: the next micro-batch */
    fin = (int*)_pp_calloc((size_t)S * (size_t)m, sizeof *fin);    /* [stage][mb]: 1 + the tick it ran, 0: not yet */
    len = (int*)_pp_calloc((size_t)p, sizeof *len);
    if (!next || !fin || !len) {
        PP_FREE(next);
        PP_FREE(fin);
        PP_FREE(len);
        return _pp_fail(err, PP_ERR_NOMEM, "pp_schedule_make_eval: scratch for %d x %d F's", S, m);
    }
    for (t = 0; done < p * v * m; t++) {
        int ran = 0;
        for (r = 0; r < p; r++)
            for (c = v - 1; c >= 0; c--) {
                int mb = next[r * v + c], st = _pp_sched_map_stage(s->map, p, r, c);
                /* ready: stage 0, or the previous stage's F ran at an earlier tick */
                if (mb >= m || (st > 0 && (fin[(st - 1) * m + mb] == 0 || fin[(st - 1) * m + mb] > t))) continue;
                _pp_sched_set_map(&out[(size_t)r * (size_t)v * (size_t)m + (size_t)len[r]++], PP_OP_F, s->map, p, S, r, mb, c);
                fin[st * m + mb] = t + 1;
                next[r * v + c]++;
                done++;
                ran = 1;
                break;
            }
        if (!ran) break; /* never: the lowest stage with an F left has its input (or is stage 0) */
    }
    PP_FREE(next);
    PP_FREE(fin);
    PP_FREE(len);
    if (done < p * v * m) return _pp_fail(err, PP_ERR_SCHEDULE, "pp_schedule_make_eval: %d of %d F's placed", done, p * v * m);
    memset(&e, 0, sizeof e);
    e.kind = s->kind;
    e.p = p;
    e.v = v;
    e.m = m;
    e.n_stages = S;
    e.per_rank = m * v;
    e.actions = out;
    e.map = s->map;
    e.forward_only = 1;
    res = (pp_sim_result*)_pp_calloc(1, sizeof *res);
    if (!res) return _pp_fail(err, PP_ERR_NOMEM, "pp_schedule_make_eval: simulator result");
    rc = pp_simulate(&e, NULL, res, NULL, err);
    PP_FREE(res);
    if (rc != PP_OK) return rc;
    *eval = e;
    return PP_OK;
}

/* Text tables (pp_schedule_parse, pp_schedule_write). The parser reads its input once per pass
   through a cursor that knows its line and column, so every message can say where. Pass one
   (out NULL) checks the syntax and counts; pass two writes the actions. */
typedef struct _pp_tab {
    const char* t;
    size_t n, i;
    int line, col;                  /* of t[i], both from 1 */
} _pp_tab;

static int _pp_tab_peek(const _pp_tab* c) { return c->i < c->n ? (unsigned char)c->t[c->i] : -1; }

static void _pp_tab_next(_pp_tab* c) {
    if (c->i >= c->n) return;
    if (c->t[c->i] == '\n') {
        c->line++;
        c->col = 1;
    } else {
        c->col++;
    }
    c->i++;
}

/* Skips blanks and a comment, stopping at the end of the line (or text). */
static void _pp_tab_blank(_pp_tab* c) {
    int ch;
    while ((ch = _pp_tab_peek(c)) == ' ' || ch == '\t' || ch == '\r') _pp_tab_next(c);
    if (ch == '#')
        while ((ch = _pp_tab_peek(c)) >= 0 && ch != '\n') _pp_tab_next(c);
}

static int _pp_tab_eol(const _pp_tab* c) { return _pp_tab_peek(c) < 0 || _pp_tab_peek(c) == '\n'; }

/* A decimal number < 2^31; 0 with a message when there is none or it is too large. */
static int _pp_tab_int(_pp_tab* c, long* out, const char* what, pp_error* err) {
    long v = 0;
    int line = c->line, col = c->col, ch;
    if ((ch = _pp_tab_peek(c)) < '0' || ch > '9') {
        if (ch < 0 || ch == '\n' || ch == '\r')
            _pp_fail(err, PP_ERR_INVALID, "schedule table line %d, column %d: expected %s (a number), got the end of the line",
                     line, col, what);
        else if (ch > 32 && ch < 127)
            _pp_fail(err, PP_ERR_INVALID, "schedule table line %d, column %d: expected %s (a number), got '%c'", line, col,
                     what, (char)ch);
        else
            _pp_fail(err, PP_ERR_INVALID, "schedule table line %d, column %d: expected %s (a number), got byte 0x%02x", line,
                     col, what, ch);
        return 0;
    }
    while ((ch = _pp_tab_peek(c)) >= '0' && ch <= '9') {
        v = v * 10 + (ch - '0');
        if (v > INT32_MAX) {
            _pp_fail(err, PP_ERR_INVALID, "schedule table line %d, column %d: %s is too large", line, col, what);
            return 0;
        }
        _pp_tab_next(c);
    }
    *out = v;
    return 1;
}

/* Does the text at the cursor start with word, followed by a non-letter? */
static int _pp_tab_word(const _pp_tab* c, const char* word) {
    size_t k = 0;
    while (word[k]) {
        if (c->i + k >= c->n || c->t[c->i + k] != word[k]) return 0;
        k++;
    }
    return 1;
}

static void _pp_tab_skip(_pp_tab* c, size_t k) {
    while (k--) _pp_tab_next(c);
}

/* Goes to the next line that has something on it; 0 at the end of the text. */
static int _pp_tab_content(_pp_tab* c) {
    for (;;) {
        _pp_tab_blank(c);
        if (_pp_tab_peek(c) < 0) return 0;
        if (_pp_tab_peek(c) != '\n') return 1;
        _pp_tab_next(c);
    }
}

#define _PP_TAB_FAIL(...) (_pp_fail(err, PP_ERR_INVALID, __VA_ARGS__), PP_ERR_INVALID)
/* A rank's action count is the table's structure, not its syntax (a missing W, say): the code the
   simulator gives a missing action. */
#define _PP_TAB_FAIL_COUNT(...) (_pp_fail(err, PP_ERR_SCHEDULE, __VA_ARGS__), PP_ERR_SCHEDULE)

/* One pass. hdr receives p, v, m, map, per_rank. out NULL: check and count; else write, with the
   per-rank count per_in that the counting pass found. */
static pp_result _pp_tab_pass(const char* text, size_t len, pp_action* out, int per_in, pp_schedule* hdr,
                              pp_error* err) {
    _pp_tab c;
    long p = -1, v = -1, m = -1, x;
    int map = PP_MAP_LOOP, any_order = 0, fo = 0, r, per = out ? per_in : -1, S;
    c.t = text;
    c.n = len;
    c.i = 0;
    c.line = c.col = 1;
    /* header */
    if (!_pp_tab_content(&c)) return _PP_TAB_FAIL("schedule table is empty (want a 'schedule p=.. v=.. m=..' line)");
    if (!_pp_tab_word(&c, "schedule"))
        return _PP_TAB_FAIL("schedule table line %d, column %d: expected the header 'schedule p=P v=V m=M [map=loop|v]'",
                            c.line, c.col);
    _pp_tab_skip(&c, 8);
    for (;;) {
        long* key = NULL;
        int line = c.line, col = c.col;
        _pp_tab_blank(&c);
        if (_pp_tab_eol(&c)) break;
        if (c.col == col) return _PP_TAB_FAIL("schedule table line %d, column %d: expected a space", line, col);
        line = c.line, col = c.col;
        if (_pp_tab_word(&c, "p=")) key = &p;
        else if (_pp_tab_word(&c, "v=")) key = &v;
        else if (_pp_tab_word(&c, "m=")) key = &m;
        if (key) {
            _pp_tab_skip(&c, 2);
            if (!_pp_tab_int(&c, key, key == &p ? "p" : key == &v ? "v" : "m", err)) return PP_ERR_INVALID;
        } else if (_pp_tab_word(&c, "map=loop")) {
            _pp_tab_skip(&c, 8);
            map = PP_MAP_LOOP;
        } else if (_pp_tab_word(&c, "map=v")) {
            _pp_tab_skip(&c, 5);
            map = PP_MAP_V;
        } else if (_pp_tab_word(&c, "order=mb")) {
            _pp_tab_skip(&c, 8);
            any_order = 0;
        } else if (_pp_tab_word(&c, "order=any")) {
            _pp_tab_skip(&c, 9);
            any_order = 1;
        } else if (_pp_tab_word(&c, "eval=0") || _pp_tab_word(&c, "eval=1")) {
            fo = _pp_tab_word(&c, "eval=1");
            _pp_tab_skip(&c, 6);
        } else {
            return _PP_TAB_FAIL("schedule table line %d, column %d: unknown header field (p=, v=, m=, map=loop or map=v, "
                                "order=mb or order=any, eval=0 or eval=1)", line, col);
        }
    }
    if (p < 0 || v < 0 || m < 0)
        return _PP_TAB_FAIL("schedule table line %d: the header lacks %s", c.line, p < 0 ? "p=" : v < 0 ? "v=" : "m=");
    if (p < 1 || p > PP_MAX_RANKS || v < 1 || v > INT8_MAX || m < 1 || p * v > INT16_MAX ||
        (long long)p * 3 * v * m > INT32_MAX)
        return _PP_TAB_FAIL("schedule table line %d: p=%ld v=%ld m=%ld out of range (1 <= p <= %d, 1 <= v <= %d, m >= 1)",
                            c.line, p, v, m, (int)PP_MAX_RANKS, (int)INT8_MAX);
    if (map == PP_MAP_V && v != 2) return _PP_TAB_FAIL("schedule table line %d: map=v needs v=2 (got v=%ld)", c.line, v);
    S = (int)(p * v);
    memset(hdr, 0, sizeof *hdr);
    hdr->kind = PP_SCHED_CUSTOM;
    hdr->p = (int)p;
    hdr->v = (int)v;
    hdr->m = (int)m;
    hdr->n_stages = S;
    hdr->map = (pp_stage_map)map;
    hdr->any_order = any_order;
    hdr->forward_only = fo;
    /* rank lines */
    for (r = 0; r < p; r++) {
        int n = 0, line;
        if (!_pp_tab_content(&c))
            return _PP_TAB_FAIL("schedule table has %d rank line%s, the header says p=%ld", r, r == 1 ? "" : "s", p);
        line = c.line;
        if (_pp_tab_peek(&c) != 'r')
            return _PP_TAB_FAIL("schedule table line %d, column %d: expected 'r%d:'", c.line, c.col, r);
        _pp_tab_next(&c);
        {
            int col = c.col;
            if (!_pp_tab_int(&c, &x, "a rank", err)) return PP_ERR_INVALID;
            if (x != r)
                return _PP_TAB_FAIL("schedule table line %d, column %d: rank %ld where rank %d comes (one line per rank, in order)",
                                    line, col, x, r);
        }
        if (_pp_tab_peek(&c) != ':') return _PP_TAB_FAIL("schedule table line %d, column %d: expected ':'", c.line, c.col);
        _pp_tab_next(&c);
        for (;;) {
            int op, col, ch;
            long mb, chunk = 0;
            int before = c.col;
            _pp_tab_blank(&c);
            if (_pp_tab_eol(&c)) break;
            if (n > 0 && c.col == before)
                return _PP_TAB_FAIL("schedule table line %d, column %d: expected a space between actions", c.line, c.col);
            col = c.col;
            ch = _pp_tab_peek(&c);
            if (ch == 'F') op = PP_OP_F;
            else if (ch == 'B') op = PP_OP_B;
            else if (ch == 'W') op = PP_OP_W;
            else if (ch > 32 && ch < 127)
                return _PP_TAB_FAIL("schedule table line %d, column %d: expected an action F, B or W, got '%c'", c.line, col,
                                    (char)ch);
            else
                return _PP_TAB_FAIL("schedule table line %d, column %d: expected an action F, B or W, got byte 0x%02x", c.line,
                                    col, ch);
            _pp_tab_next(&c);
            if (!_pp_tab_int(&c, &mb, "a micro-batch", err)) return PP_ERR_INVALID;
            if (_pp_tab_peek(&c) == '.') {
                _pp_tab_next(&c);
                if (!_pp_tab_int(&c, &chunk, "a chunk", err)) return PP_ERR_INVALID;
            }
            if (mb >= m)
                return _PP_TAB_FAIL("schedule table line %d, column %d: micro-batch %ld, but m=%ld", c.line, col, mb, m);
            if (chunk >= v)
                return _PP_TAB_FAIL("schedule table line %d, column %d: chunk %ld, but v=%ld", c.line, col, chunk, v);
            if (per >= 0 && n >= per)
                return _PP_TAB_FAIL_COUNT("schedule table line %d, column %d: rank %d has more than the %d actions of rank 0", c.line,
                                    col, r, per);
            if (out) _pp_sched_set_map(&out[(size_t)r * (size_t)per + (size_t)n], op, (pp_stage_map)map, (int)p, S, r, (int)mb,
                                       (int)chunk);
            n++;
        }
        if (per < 0) {
            if (fo && n != m * v)
                return _PP_TAB_FAIL_COUNT("schedule table line %d: rank 0 has %d actions; eval=1 with m=%ld v=%ld needs %ld (an F "
                                    "each)", line, n, m, v, m * v);
            if (!fo && n == m * v)
                return _PP_TAB_FAIL_COUNT("schedule table line %d: rank 0 has %d actions; m=%ld v=%ld needs %ld (F and B) or %ld "
                                    "(F, B and W), or the header's eval=1 for a forward-only list", line, n, m, v, 2 * m * v,
                                    3 * m * v);
            if (!fo && n != 2 * m * v && n != 3 * m * v)
                return _PP_TAB_FAIL_COUNT("schedule table line %d: rank 0 has %d actions; m=%ld v=%ld needs %ld (F and B) or %ld "
                                    "(F, B and W)", line, n, m, v, 2 * m * v, 3 * m * v);
            per = n;
        } else if (n != per) {
            return _PP_TAB_FAIL_COUNT("schedule table line %d: rank %d has %d actions, rank 0 has %d", line, r, n, per);
        }
    }
    if (_pp_tab_content(&c))
        return _PP_TAB_FAIL("schedule table line %d, column %d: more than p=%ld rank lines", c.line, c.col, p);
    hdr->per_rank = per;
    return PP_OK;
}

/* The ordering rule (pp_schedule.any_order): a layer adds its weight gradients into grads in
   its B, or in its W on a schedule with W actions (a layer without the split: in B there too), so
   each stage's B's and W's must each go in ascending micro-batch order for the sum to be
   pp_sequential_step's, bit for bit. F's may go in any order (a micro-batch's forward adds into
   nothing shared). Run after pp_simulate (actions in range, each once). */
static pp_result _pp_sched_order_check(const pp_schedule* s, pp_error* err) {
    int last[2][INT8_MAX + 1]; /* per chunk: the last B's and the last W's micro-batch */
    int r, i, c;
#ifdef PP_TEST_NO_ORDER_CHECK /* negative control (tests/test_convenience.c): out-of-order tables run */
    return PP_OK;
#endif
    if (s->any_order) return PP_OK;
    for (r = 0; r < s->p; r++) {
        const pp_action* a = pp_schedule_rank(s, r);
        for (c = 0; c < s->v && c <= INT8_MAX; c++) last[0][c] = last[1][c] = -1;
        for (i = 0; i < s->per_rank; i++) {
            int k = a[i].op == PP_OP_B ? 0 : a[i].op == PP_OP_W ? 1 : -1;
            if (k < 0 || a[i].chunk < 0 || a[i].chunk >= s->v) continue;
            if (a[i].mb < last[k][a[i].chunk])
                return _pp_fail(err, PP_ERR_SCHEDULE,
                                "stage %d (rank %d, chunk %d) runs %c%d after %c%d: its weight gradients would add up in "
                                "another order than the sequential run's (micro-batch 0, 1, ...), not bit-identical; run "
                                "each stage's %c's in ascending micro-batch order, or accept it with order=any in the "
                                "table (pp_schedule.any_order = 1)",
                                (int)a[i].stage, r, (int)a[i].chunk, k ? 'W' : 'B', (int)a[i].mb, k ? 'W' : 'B',
                                last[k][a[i].chunk], k ? 'W' : 'B');
            last[k][a[i].chunk] = a[i].mb;
        }
    }
    return PP_OK;
}

pp_result pp_schedule_parse(const char* text, size_t len, pp_action* out, size_t cap, size_t* need, pp_schedule* s,
                            pp_error* err) {
    pp_schedule hdr;
    pp_sim_result* res;
    pp_result rc;
    size_t n;
    if (need) *need = 0;
    if (!text && len > 0) return _pp_fail(err, PP_ERR_INVALID, "pp_schedule_parse: text is NULL");
    if (!s) return _pp_fail(err, PP_ERR_INVALID, "pp_schedule_parse: s (schedule) is NULL");
    if ((rc = _pp_tab_pass(text, len, NULL, -1, &hdr, err)) != PP_OK) return rc;
    n = (size_t)hdr.p * (size_t)hdr.per_rank;
    if (need) *need = n;
    if (!out || cap < n)
        return _pp_fail(err, PP_ERR_SIZE, "schedule table has %lu actions, cap is %lu", (unsigned long)n,
                        (unsigned long)(out ? cap : 0));
    if ((rc = _pp_tab_pass(text, len, out, hdr.per_rank, &hdr, err)) != PP_OK) return rc;
    hdr.actions = out;
    /* coverage, order, peers and deadlock: the simulator's proof */
    res = (pp_sim_result*)_pp_calloc(1, sizeof *res);
    if (!res) return _pp_fail(err, PP_ERR_NOMEM, "pp_schedule_parse: simulator result");
    rc = pp_simulate(&hdr, NULL, res, NULL, err);
    PP_FREE(res);
    if (rc == PP_OK) rc = _pp_sched_order_check(&hdr, err);
    if (rc != PP_OK) {
        char tmp[sizeof err->msg];
        if (err) {
            memcpy(tmp, err->msg, sizeof tmp);
            tmp[sizeof tmp - 1] = 0;
            _pp_fail(err, rc, "schedule table rejected (rank r is the line 'rN:'): %s", _pp_strip_code(tmp, rc));
        }
        return rc;
    }
    *s = hdr;
    return PP_OK;
}

void pp_schedule_write(FILE* f, const pp_schedule* s) {
    int r, i;
    if (!f || !s || !s->actions) return;
    fprintf(f, "# %s: %d stages, %d actions per rank\n", pp_schedule_name(s->kind), s->n_stages, s->per_rank);
    fprintf(f, "schedule p=%d v=%d m=%d map=%s%s%s\n", s->p, s->v, s->m, s->map == PP_MAP_V ? "v" : "loop",
            s->any_order ? " order=any" : "", s->forward_only ? " eval=1" : "");
    for (r = 0; r < s->p; r++) {
        const pp_action* a = pp_schedule_rank(s, r);
        fprintf(f, "r%d:", r);
        for (i = 0; i < s->per_rank; i++)
            fprintf(f, " %c%d.%d", a[i].op == PP_OP_F ? 'F' : a[i].op == PP_OP_B ? 'B' : 'W', (int)a[i].mb, (int)a[i].chunk);
        fprintf(f, "\n");
    }
}

const pp_action* pp_schedule_rank(const pp_schedule* s, int rank) {
    if (!s || !s->actions || rank < 0 || rank >= s->p || s->per_rank < 0) return NULL;
    return s->actions + (size_t)rank * (size_t)s->per_rank;
}

/* >>impl-sim ---------------------------------------------------------------------------------- */

static char _pp_sched_op_char(int op) {
    return op == PP_OP_F ? 'F' : op == PP_OP_B ? 'B' : op == PP_OP_W ? 'W' : '?';
}

static int _pp_sim_finite(double x) { return x == x && x - x == 0.0; }

/* "0 counts as the default" for the scalar costs; negative or NaN is an error (returns -1). */
static double _pp_sim_def(double x, double def) {
    if (!_pp_sim_finite(x) || x < 0) return -1;
    return x == 0 ? def : x;
}

/* A transfer's time between ranks: comm, or with boundaries split over tp > 1 ranks comm / tp
   plus the receiving TP group's gather (pp_sim_cost.tp); -1 for bad costs. */
static double _pp_sim_comm(const pp_sim_cost* c) {
    double comm = _pp_sim_def(c->comm, 0.0), g = _pp_sim_def(c->tp_gather, 0.0);
    if (comm < 0 || g < 0 || c->tp < 0) return -1;
    return c->tp > 1 ? comm / c->tp + g : comm;
}

/* The share of stage st's stash that its B frees (cost b_free), or -1 if out of 0 .. 1. */
static double _pp_sim_bfree(const pp_sim_cost* c, int st) {
    double x = c->b_free_stage ? c->b_free_stage[st] : c->b_free;
    return x >= 0 && x <= 1 ? x : -1;
}
/* Recomputation's share of stage st's stash (r_mem), or -1 if out of 0 .. 1; its time (r_f); the
   size of one stash (mem_stage, 1 without it). */
static double _pp_sim_rmem(const pp_sim_cost* c, int st) {
    double x = c->r_mem_stage ? c->r_mem_stage[st] : c->r_mem;
    return x >= 0 && x <= 1 ? x : -1;
}
static double _pp_sim_rf(const pp_sim_cost* c, int st) { return c->r_f_stage ? c->r_f_stage[st] : c->r_f; }
static double _pp_sim_ms(const pp_sim_cost* c, int st) { return c->mem_stage ? c->mem_stage[st] : 1.0; }

/* Appends to a fixed report buffer; once full, later text is dropped and "..." marks the cut. */
static void _pp_sim_append(char* buf, size_t cap, const char* fmt, ...) _PP_PRINTF(3, 4);
static void _pp_sim_append(char* buf, size_t cap, const char* fmt, ...) {
    size_t len = strlen(buf);
    va_list ap;
    int n;
    if (len + 1 >= cap) return;
    va_start(ap, fmt);
    n = vsnprintf(buf + len, cap - len, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n >= cap - len && cap >= 4) memcpy(buf + cap - 4, "...", 4);
}

/* Simulation. Sends are eager (buffered), so an action can start as soon as its rank has finished
   the previous action in its list and the one action it depends on has finished (+ comm when that
   action ran on another rank):
       F(i, s)    needs F(i, s-1)                      (nothing for s = 0)
       B(i, s)    needs B(i, s+1), or F(i, S-1) for the last stage
       W(i, s)    needs B(i, s)                        (same rank, earlier in the list)
   Start times are therefore the longest-path times of the DAG formed by these edges plus each
   rank's list order. We compute them by sweeping the ranks and advancing each one while its next
   action's dependency is done; the result equals an event-by-event simulation because no start
   time depends on the order in which ready actions are discovered. If a sweep advances nobody and
   some list is unfinished, the graph has a cycle: a deadlock, whatever the costs.
   Validation comes first, so the sweep only ever looks up dependencies that exist.
   Activations: a (mb, chunk) is live from the end of its F to the end of its B, or of its W when
   the schedule has W actions (the weight gradient still needs the stashed input). */
pp_result pp_simulate(const pp_schedule* s, const pp_sim_cost* cost, pp_sim_result* res,
                      pp_event* events, pp_error* err) {
    pp_sim_result local;
    pp_sim_cost c;
    pp_result rc = PP_OK;
    int p, S, m, per, r, i, n_total, has_w = 0, fo;
    size_t n_slots = 0;
    int* slot = NULL;       /* [op][mb*S + stage] -> 1 + global action index, 0 = not seen */
    double* fin = NULL;     /* end time of each global action index (r*per + i) */
    int pos[PP_MAX_RANKS];  /* next action of each rank */
    double t_free[PP_MAX_RANKS];
    int live[PP_MAX_RANKS];
    double mem[PP_MAX_RANKS];
    double f_def, b_def, w_def, comm, ms, rm;

    if (!res) res = &local;
    memset(res, 0, sizeof *res);
    if (!s || !s->actions)
        return _pp_fail(err, PP_ERR_INVALID, "pp_simulate: %s is NULL", !s ? "schedule" : "schedule actions");
    p = s->p;
    m = s->m;
    S = s->n_stages;
    per = s->per_rank;
    /* v bounded before p * v (int): pp_action's chunk is an int8 and its stage an int16 */
    if (p < 1 || p > PP_MAX_RANKS || s->v < 1 || m < 1 || per < 0 ||
#ifndef PP_TEST_NO_HEADER_BOUNDS /* negative control (build/errors-controls): p * v overflows */
        s->v > INT8_MAX ||
#endif
        S != p * s->v)
        return _pp_fail(err, PP_ERR_INVALID,
                        "pp_simulate: bad schedule header p=%d v=%d m=%d n_stages=%d per_rank=%d", p,
                        s->v, m, S, per);
    if ((s->map != PP_MAP_LOOP && s->map != PP_MAP_V) || (s->map == PP_MAP_V && s->v != 2))
        return _pp_fail(err, PP_ERR_INVALID, "pp_simulate: stage map %d with v=%d (the V map needs v = 2)",
                        (int)s->map, s->v);
    if ((long long)p * per > INT32_MAX - 1)
        return _pp_fail(err, PP_ERR_INVALID, "pp_simulate: %d ranks x %d actions is too many", p, per);
    if (s->forward_only != 0 && s->forward_only != 1)
        return _pp_fail(err, PP_ERR_INVALID,
                        "pp_simulate: forward_only = %d (0 or 1; zero the struct before filling it by hand)", s->forward_only);
    fo = s->forward_only;
    n_total = p * per;

    memset(&c, 0, sizeof c);
    if (cost) c = *cost;
    f_def = _pp_sim_def(c.f, 1.0);
    b_def = _pp_sim_def(c.b, 2.0);
    w_def = _pp_sim_def(c.w, 0.0);
    comm = _pp_sim_comm(&c);
    if (f_def < 0 || b_def < 0 || w_def < 0 || comm < 0)
        return _pp_fail(err, PP_ERR_INVALID, "pp_simulate: costs must be finite and >= 0 (f=%g b=%g w=%g comm=%g tp=%d "
                        "tp_gather=%g)", c.f, c.b, c.w, c.comm, c.tp, c.tp_gather);
    for (i = 0; i < S; i++) {
        if ((c.f_stage && (!_pp_sim_finite(c.f_stage[i]) || c.f_stage[i] < 0)) ||
            (c.b_stage && (!_pp_sim_finite(c.b_stage[i]) || c.b_stage[i] < 0)) ||
            (c.w_stage && (!_pp_sim_finite(c.w_stage[i]) || c.w_stage[i] < 0)))
            return _pp_fail(err, PP_ERR_INVALID, "pp_simulate: stage %d cost must be finite and >= 0", i);
        if (_pp_sim_bfree(&c, i) < 0)
            return _pp_fail(err, PP_ERR_INVALID, "pp_simulate: b_free%s = %g, want 0 .. 1 (the share of a stash B frees)",
                            c.b_free_stage ? " of a stage" : "", c.b_free_stage ? c.b_free_stage[i] : c.b_free);
        if (_pp_sim_rmem(&c, i) < 0 || !_pp_sim_finite(_pp_sim_rf(&c, i)) || _pp_sim_rf(&c, i) < 0 ||
            !_pp_sim_finite(_pp_sim_ms(&c, i)) || _pp_sim_ms(&c, i) < 0)
            return _pp_fail(err, PP_ERR_INVALID, "pp_simulate: stage %d: r_mem = %g (want 0 .. 1), r_f = %g, mem_stage = %g "
                            "(want finite, >= 0)", i, c.r_mem_stage ? c.r_mem_stage[i] : c.r_mem, _pp_sim_rf(&c, i),
                            _pp_sim_ms(&c, i));
    }

    /* (mb, stage) pairs are indexed with an int, like pp_schedule_make's limit on actions */
    if ((long long)m * S > INT32_MAX / 3)
        return _pp_fail(err, PP_ERR_INVALID, "pp_simulate: m*stages = %d*%d is too many", m, S);
    /* every (micro-batch, stage) needs its F and its B: a header that promises more than the
       lists hold is refused before its tables are allocated (m = 700M with 2 actions took 8 GB) */
    if ((long long)n_total < (fo ? 1LL : 2LL) * m * S)
        return _pp_fail(err, PP_ERR_SCHEDULE, "pp_simulate: %d actions cannot cover m=%d micro-batches x %d stages (%s)",
                        n_total, m, S, fo ? "an F each" : "F and B each");
    n_slots = (size_t)m * (size_t)S;
    slot = (int*)_pp_calloc(3 * n_slots, sizeof(int));
    fin = (double*)_pp_calloc((size_t)n_total, sizeof(double));
    if (!slot || !fin) {
        rc = _pp_fail(err, PP_ERR_NOMEM, "pp_simulate: no memory for %lu actions",
                      (unsigned long)n_total);
        goto cleanup;
    }

    /* 1. Every action well-formed, on the rank its stage maps to, and not a duplicate. */
    for (r = 0; r < p; r++) {
        const pp_action* list = s->actions + (size_t)r * (size_t)per;
        for (i = 0; i < per; i++) {
            const pp_action* a = &list[i];
            int want_rank, want_chunk, *sl;
            if (a->op != PP_OP_F && a->op != PP_OP_B && a->op != PP_OP_W) {
                rc = _pp_fail(err, PP_ERR_SCHEDULE, "rank %d action #%d: op %d is not F, B or W", r, i,
                              (int)a->op);
                goto cleanup;
            }
            if (fo && a->op != PP_OP_F) {
                rc = _pp_fail(err, PP_ERR_SCHEDULE, "rank %d action #%d: %c%d.%d in a forward-only list (F actions only)", r, i,
                              _pp_sched_op_char(a->op), (int)a->mb, (int)a->chunk);
                goto cleanup;
            }
            if (a->stage < 0 || a->stage >= S || a->mb < 0 || a->mb >= m) {
                rc = _pp_fail(err, PP_ERR_SCHEDULE,
                              "rank %d action #%d: %c%d stage %d out of range (m=%d, stages=%d)", r, i,
                              _pp_sched_op_char(a->op), (int)a->mb, (int)a->stage, m, S);
                goto cleanup;
            }
            /* the map's helpers, not pp_schedule_stage_to_rank: the header is checked, and this
               runs for every action of every candidate the generators judge */
            want_rank = _pp_sched_map_rank(s->map, p, a->stage);
            want_chunk = _pp_sched_map_chunk(s->map, p, a->stage);
            if (want_rank != r || want_chunk != a->chunk) {
                rc = _pp_fail(err, PP_ERR_SCHEDULE,
                              "rank %d action #%d: %c%d.%d names stage %d, which is chunk %d of rank %d",
                              r, i, _pp_sched_op_char(a->op), (int)a->mb, (int)a->chunk, (int)a->stage,
                              want_chunk, want_rank);
                goto cleanup;
            }
            {
                int want_prev = -1, want_next = -1;
                if (a->stage > 0) want_prev = _pp_sched_map_rank(s->map, p, a->stage - 1);
                if (a->stage < S - 1) want_next = _pp_sched_map_rank(s->map, p, a->stage + 1);
                if (a->prev_rank != want_prev || a->next_rank != want_next) {
                    rc = _pp_fail(err, PP_ERR_SCHEDULE,
                                  "rank %d action #%d: %c%d.%d has prev_rank %d next_rank %d, stage %d needs %d and %d",
                                  r, i, _pp_sched_op_char(a->op), (int)a->mb, (int)a->chunk, (int)a->prev_rank,
                                  (int)a->next_rank, (int)a->stage, want_prev, want_next);
                    goto cleanup;
                }
            }
            sl = &slot[(size_t)a->op * n_slots + (size_t)a->mb * (size_t)S + (size_t)a->stage];
            if (*sl) {
                int first = *sl - 1;
                rc = _pp_fail(err, PP_ERR_SCHEDULE,
                              "rank %d action #%d: duplicate %c%d.%d (stage %d), already at rank %d #%d",
                              r, i, _pp_sched_op_char(a->op), (int)a->mb, (int)a->chunk,
                              (int)a->stage, first / per, first % per);
                goto cleanup;
            }
            *sl = r * per + i + 1;
            if (a->op == PP_OP_W) has_w = 1;
        }
    }

    /* 2. Nothing missing, and on each rank B after its F (W after its B). */
    for (i = 0; i < (int)n_slots; i++) {
        int fi = slot[i] - 1, bi = slot[n_slots + i] - 1, wi = slot[2 * n_slots + i] - 1;
        int mb = i / S, st = i % S, want_rank = _pp_sched_map_rank(s->map, p, st),
            want_chunk = _pp_sched_map_chunk(s->map, p, st);
        if (fo && fi >= 0) continue; /* a forward-only list: its F is all there is */
        if (fi < 0 || bi < 0 || (has_w && wi < 0)) {
            rc = _pp_fail(err, PP_ERR_SCHEDULE, "rank %d has no %c%d.%d (mb %d, stage %d)", want_rank,
                          fi < 0 ? 'F' : bi < 0 ? 'B' : 'W', mb, want_chunk, mb, st);
            goto cleanup;
        }
        if (bi < fi) {
            rc = _pp_fail(err, PP_ERR_SCHEDULE,
                          "rank %d action #%d: B%d.%d comes before its forward F%d.%d at #%d",
                          want_rank, bi % per, mb, want_chunk, mb, want_chunk, fi % per);
            goto cleanup;
        }
        if (has_w && wi < bi) {
            rc = _pp_fail(err, PP_ERR_SCHEDULE,
                          "rank %d action #%d: W%d.%d comes before its backward B%d.%d at #%d",
                          want_rank, wi % per, mb, want_chunk, mb, want_chunk, bi % per);
            goto cleanup;
        }
    }

    /* 3. Sweep: advance every rank while its next action is ready. */
    for (r = 0; r < p; r++) {
        pos[r] = 0;
        t_free[r] = 0;
        live[r] = 0;
        mem[r] = 0;
    }
    for (;;) {
        int progress = 0, all_done = 1;
        for (r = 0; r < p; r++) {
            const pp_action* list = s->actions + (size_t)r * (size_t)per;
            while (pos[r] < per) {
                const pp_action* a = &list[pos[r]];
                size_t key = (size_t)a->mb * (size_t)S + (size_t)a->stage;
                int dep = -1, gi = r * per + pos[r];
                double start = t_free[r], dur;
                if (a->op == PP_OP_F && a->stage > 0) dep = slot[key - 1] - 1;
                else if (a->op == PP_OP_B && a->stage < S - 1) dep = slot[n_slots + key + 1] - 1;
                else if (a->op == PP_OP_B) dep = slot[key] - 1;
                else if (a->op == PP_OP_W) dep = slot[n_slots + key] - 1;
                if (dep >= 0) {
                    int dep_rank = dep / per;
                    double ready;
                    /* done iff the owning rank has moved past it */
                    if (pos[dep_rank] <= dep % per) break;
                    ready = fin[dep] + (dep_rank != r ? comm : 0.0);
                    if (ready > start) start = ready;
                }
                if (a->op == PP_OP_F) dur = c.f_stage ? c.f_stage[a->stage] : f_def;
                else if (a->op == PP_OP_B) dur = c.b_stage ? c.b_stage[a->stage] : b_def;
                else dur = c.w_stage ? c.w_stage[a->stage] : w_def;
                /* no W actions: the B does the weight gradient too */
                if (a->op == PP_OP_B && !has_w) dur += c.w_stage ? c.w_stage[a->stage] : w_def;
                if (a->op == PP_OP_B) dur += _pp_sim_rf(&c, a->stage); /* the recompute */
                fin[gi] = start + dur;
                t_free[r] = start + dur;
                res->busy[r] += dur;
                if (a->op == PP_OP_F) live[r]++;
                else if (a->op == (has_w ? PP_OP_W : PP_OP_B)) live[r]--;
                if (live[r] > res->peak_live[r]) res->peak_live[r] = live[r];
                /* the W share: B frees b_free of the stash, W the rest (no W actions: B all);
                   recomputation's share goes after the F and comes back at the B's start */
                ms = _pp_sim_ms(&c, a->stage);
                rm = _pp_sim_rmem(&c, a->stage);
                if (a->op == PP_OP_B) mem[r] += ms * rm;
                if (a->op == PP_OP_F) mem[r] += ms;
                if (mem[r] > res->peak_mem[r]) res->peak_mem[r] = mem[r];
                if (a->op == PP_OP_F) mem[r] -= ms * rm;
                else if (a->op == PP_OP_B) mem[r] -= ms * (has_w ? _pp_sim_bfree(&c, a->stage) : 1);
                else mem[r] -= ms * (1 - _pp_sim_bfree(&c, a->stage));
                if (fo) {
                    /* forward only: the stash goes once its F is done, unless the next stage is
                       this rank's (it reads the output in place); the F it fed frees the
                       previous stage's */
                    int keep = a->stage < S - 1 && a->next_rank == r, fed = a->stage > 0 && a->prev_rank == r;
                    live[r] -= !keep + fed;
                    mem[r] -= !keep * ms * (1 - rm) +
                              (fed ? _pp_sim_ms(&c, a->stage - 1) * (1 - _pp_sim_rmem(&c, a->stage - 1)) : 0);
                }
                if (t_free[r] > res->makespan) res->makespan = t_free[r];
                if (events) {
                    events[gi].rank = r;
                    events[gi].a = *a;
                    events[gi].start = start;
                    events[gi].end = start + dur;
                }
                pos[r]++;
                progress = 1;
            }
            if (pos[r] < per) all_done = 0;
        }
        if (all_done || !progress) break;
    }

    {
        double sum = 0;
        for (r = 0; r < p; r++) sum += res->busy[r];
        res->bubble = res->makespan > 0 ? 1.0 - sum / ((double)p * res->makespan) : 0.0;
    }

    /* 4. Deadlock report: every blocked rank, the action it is stuck at, and whom it waits for. */
    for (r = 0; r < p; r++) {
        const pp_action* a;
        int dep, dep_rank, dep_stage, dep_op;
        if (pos[r] >= per) continue;
        res->deadlock = 1;
        a = &s->actions[(size_t)r * (size_t)per + (size_t)pos[r]];
        /* only an F of stage > 0 or a B of stage < S-1 can block: the other dependencies are
           on the same rank, earlier in its list (checked in step 2) */
        if (a->op == PP_OP_F) dep_op = PP_OP_F, dep_stage = a->stage - 1;
        else dep_op = PP_OP_B, dep_stage = a->stage + 1;
        PP_ASSERT(dep_stage >= 0 && dep_stage < S);
        dep = slot[(size_t)dep_op * n_slots + (size_t)a->mb * (size_t)S + (size_t)dep_stage] - 1;
        dep_rank = dep / per;
        _pp_sim_append(res->report, sizeof res->report,
                       "%srank %d waits at #%d %c%d.%d for rank %d (%c%d of stage %d, its #%d)",
                       res->report[0] ? "; " : "", r, pos[r], _pp_sched_op_char(a->op), (int)a->mb,
                       (int)a->chunk, dep_rank, _pp_sched_op_char(dep_op), (int)a->mb, dep_stage,
                       dep % per);
    }
    if (res->deadlock) {
        rc = _pp_fail(err, PP_ERR_DEADLOCK, "%s", res->report);
        /* unexecuted actions get start = end = -1 so printers can skip them */
        if (events) {
            for (r = 0; r < p; r++) {
                for (i = pos[r]; i < per; i++) {
                    pp_event* e = &events[r * per + i];
                    e->rank = r;
                    e->a = s->actions[(size_t)r * (size_t)per + (size_t)i];
                    e->start = e->end = -1;
                }
            }
        }
    }

cleanup:
    if (slot) PP_FREE(slot);
    if (fin) PP_FREE(fin);
    return rc;
}

/* Planning (pp_plan_try, pp_plan_recompute): stage st's stash of layers [a, b) as the executor
   lays it out (_pp_stash_carve, _pp_rc_carve; alignment, guards and the recompute block's
   shadows left out): what it holds whole, and the share recomputation drops. */
static double _pp_plan_stage_mem(const pp_layer_cost* lc, int a, int b, int own_input, const unsigned char* rc,
                                 double* rshare, double* bshare) {
    double all = own_input && a > 0 ? lc[a - 1].out : 0, drop = 0, bonly = 0;
    int l;
    for (l = a; l < b; l++) {
        int r = rc && rc[l], out_drop = r && l + 1 < b && rc[l + 1];
        all += lc[l].mem;
        drop += (r ? lc[l].mem - lc[l].out : 0) + (out_drop ? lc[l].out : 0);
        bonly += lc[l].bonly; /* B frees it, recomputed or not (the executor's b_free) */
    }
    *rshare = all > 0 ? drop / all : 0;
    if (bshare) *bshare = all > 0 ? bonly / all : 0;
    return all;
}

/* pp_plan_try's work, with the simulator's result (res) and scratch from the caller: first
   [S + 1], dbl [7 S + L], acts [n]. */
static pp_result _pp_plan_run(const pp_plan_desc* d, pp_schedule_kind kind, int v, const unsigned char* rc, pp_plan* out,
                              int* first, double* dbl, pp_action* acts, size_t n, pp_sim_result* res, pp_error* err) {
    int L = d->n_layers, S = d->p * v, st, l, r;
    double *fs = dbl, *bs = fs + S, *ws = bs + S, *rf = ws + S, *ms = rf + S, *rm = ms + S, *bf = rm + S, *wt = bf + S;
    pp_sim_cost c;
    pp_schedule s;
    pp_result rc_;
    memset(out, 0, sizeof *out);
    out->kind = kind;
    out->v = v;
    for (l = 0; l < L; l++) {
        wt[l] = d->layers[l].f + d->layers[l].b + d->layers[l].w + (rc && rc[l] ? d->layers[l].f : 0);
        out->n_recompute += rc && rc[l];
    }
    if ((rc_ = pp_partition_balanced(wt, L, S, first, err)) != PP_OK) return rc_;
    memset(&c, 0, sizeof c);
    c.f_stage = fs, c.b_stage = bs, c.w_stage = ws, c.r_f_stage = rf, c.b_free_stage = bf, c.comm = d->comm;
    c.tp = d->tp, c.tp_gather = d->tp_gather;
    for (st = 0; st < S; st++) { /* the B-only share's stage map is the schedule's: set below, 0 for generation */
        fs[st] = bs[st] = ws[st] = rf[st] = bf[st] = 0;
        for (l = first[st]; l < first[st + 1]; l++) {
            fs[st] += d->layers[l].f;
            bs[st] += d->layers[l].b;
            ws[st] += d->layers[l].w;
            rf[st] += rc && rc[l] ? d->layers[l].f : 0;
        }
    }
    if ((rc_ = pp_schedule_make_cost(kind, d->p, v, d->m, &c, acts, n, &s, err)) != PP_OK) return rc_;
    for (st = 0; st < S; st++) {
        int ra = -1, rb;
        if (st > 0) pp_schedule_stage_to_rank(&s, st - 1, &ra, NULL);
        pp_schedule_stage_to_rank(&s, st, &rb, NULL);
        ms[st] = _pp_plan_stage_mem(d->layers, first[st], first[st + 1], ra != rb, rc, &rm[st], &bf[st]);
    }
    c.mem_stage = ms, c.r_mem_stage = rm;
    if ((rc_ = pp_simulate(&s, &c, res, NULL, err)) != PP_OK) return rc_;
    out->makespan = res->makespan;
    out->bubble = res->bubble;
    for (r = 0; r < d->p; r++)
        if (res->peak_mem[r] > out->peak_mem) out->peak_mem = res->peak_mem[r];
    out->fits = d->mem_cap <= 0 || out->peak_mem <= d->mem_cap * (1 + 1e-12);
    out->tried = 1;
    return PP_OK;
}

static pp_result _pp_plan_check(const pp_plan_desc* d, pp_error* err) {
    int l, k;
    if (!d || !d->layers || d->n_layers < 1 || d->p < 1 || d->p > PP_MAX_RANKS || d->m < 1)
        return _pp_fail(err, PP_ERR_INVALID, "plan: need layers (n_layers >= 1), 1 <= p <= %d and m >= 1", PP_MAX_RANKS);
#ifdef PP_TEST_OLD_PLAN_BOUNDS /* negative control (build/failpath-controls): a finite cap above 1e300 refused */
    if (!(d->mem_cap >= 0 && d->mem_cap < 1e300))
#else
    if (!(d->mem_cap >= 0 && d->mem_cap <= DBL_MAX)) /* a cap is only compared with: any finite one */
#endif
        return _pp_fail(err, PP_ERR_INVALID, "plan: mem_cap = %g must be finite and >= 0 (0: no cap)", d->mem_cap);
    if (!(d->comm >= 0 && d->comm <= 1e300)) /* added to the costs: bounded like them */
        return _pp_fail(err, PP_ERR_INVALID, "plan: comm = %g must be >= 0 and at most 1e300", d->comm);
    if (d->tp < 0 || !(d->tp_gather >= 0 && d->tp_gather <= 1e300))
        return _pp_fail(err, PP_ERR_INVALID, "plan: tp = %d must be >= 0 and tp_gather = %g >= 0 and at most 1e300", d->tp,
                        d->tp_gather);
    if (d->n_kinds < 0 || (d->n_kinds > 0 && (!d->kinds || !d->kinds_v)))
        return _pp_fail(err, PP_ERR_INVALID, "plan: n_kinds = %d with kinds %s and kinds_v %s (both given with n_kinds > 0)",
                        d->n_kinds, d->kinds ? "given" : "NULL", d->kinds_v ? "given" : "NULL");
#ifndef PP_TEST_OLD_PLAN_BOUNDS
    /* every kind given makes a schedule at this p and m (v in range: p * v computed after this) */
    for (k = 0; k < d->n_kinds; k++) {
        pp_error e;
        if (_pp_sched_check_args(d->kinds[k], d->p, pp_schedule_kind_v(d->kinds[k], d->kinds_v[k]), d->m, &e) != PP_OK)
            return _pp_fail(err, PP_ERR_INVALID, "plan: kinds[%d] (v = %d): %s", k, d->kinds_v[k], _pp_strip_code(e.msg, PP_ERR_INVALID));
    }
#else
    (void)k;
#endif
    for (l = 0; l < d->n_layers; l++) {
        const pp_layer_cost* x = &d->layers[l];
        if (!(x->f >= 0 && x->b >= 0 && x->w >= 0 && x->out >= 0 && x->bonly >= 0 && x->mem >= x->out + x->bonly &&
              x->f + x->b + x->w + x->mem < 1e300))
            return _pp_fail(err, PP_ERR_INVALID,
                            "plan: layer %d: f=%g b=%g w=%g mem=%g out=%g bonly=%g (finite, >= 0, out + bonly <= mem)", l, x->f,
                            x->b, x->w, x->mem, x->out, x->bonly);
    }
    return PP_OK;
}

pp_result pp_plan_try(const pp_plan_desc* d, pp_schedule_kind kind, int v, const unsigned char* recompute,
                      pp_plan* out, int* first, pp_error* err) {
    pp_result rc;
    size_t n;
    int S, *fst = NULL;
    double* dbl = NULL;
    pp_action* acts = NULL;
    pp_sim_result* res = NULL;
    pp_plan local;
    if ((rc = _pp_plan_check(d, err)) != PP_OK) return rc;
    if (!out) out = &local;
    v = pp_schedule_kind_v(kind, v);
#ifndef PP_TEST_OLD_PLAN_BOUNDS
    { /* refused before p * v is computed (v up to INT_MAX) */
        pp_error e;
        if (_pp_sched_check_args(kind, d->p, v, d->m, &e) != PP_OK)
            return _pp_fail(err, PP_ERR_INVALID, "plan: %s", _pp_strip_code(e.msg, PP_ERR_INVALID));
    }
#endif
    n = pp_schedule_size(kind, d->p, v, d->m);
    S = d->p * v;
    if (!n) return _pp_fail(err, PP_ERR_INVALID, "plan: %s at p=%d v=%d m=%d is no schedule", pp_schedule_name(kind), d->p, v, d->m);
    if (S > d->n_layers)
        return _pp_fail(err, PP_ERR_INVALID, "plan: %s at p=%d v=%d needs %d stages, the model has %d layers",
                        pp_schedule_name(kind), d->p, v, S, d->n_layers);
    fst = (int*)_pp_calloc((size_t)S + 1, sizeof *fst);
    dbl = (double*)_pp_calloc(7 * (size_t)S + (size_t)d->n_layers, sizeof *dbl);
    acts = (pp_action*)_pp_calloc(n, sizeof *acts);
    res = (pp_sim_result*)_pp_calloc(1, sizeof *res);
    if (!fst || !dbl || !acts || !res) rc = _pp_fail(err, PP_ERR_NOMEM, "plan: scratch for %zu actions", n);
    else rc = _pp_plan_run(d, kind, v, recompute, out, fst, dbl, acts, n, res, err);
    if (rc == PP_OK && first) memcpy(first, fst, sizeof *fst * ((size_t)S + 1));
    PP_FREE(fst);
    PP_FREE(dbl);
    PP_FREE(acts);
    PP_FREE(res);
    return rc;
}

/* a before b: fits first, then the shorter step, then the less memory */
static int _pp_plan_better(const pp_plan* a, const pp_plan* b) {
    if (!b->tried) return a->tried;
    if (!a->tried) return 0;
    if (a->fits != b->fits) return a->fits;
    if (!a->fits) return a->peak_mem < b->peak_mem;
    if (a->makespan != b->makespan) return a->makespan < b->makespan;
    return a->peak_mem < b->peak_mem;
}

pp_result pp_plan_recompute(const pp_plan_desc* d, pp_plan* out, int* first, unsigned char* recompute, pp_error* err) {
    static const pp_schedule_kind all_k[] = {PP_SCHED_GPIPE, PP_SCHED_1F1B, PP_SCHED_INTERLEAVED, PP_SCHED_INTERLEAVED,
                                             PP_SCHED_INTERLEAVED_MEM, PP_SCHED_INTERLEAVED_MEM, PP_SCHED_ZB_H1,
                                             PP_SCHED_ZB_H2, PP_SCHED_ZB_V, PP_SCHED_V_HALF, PP_SCHED_V_MIN,
                                             PP_SCHED_DUALPIPE_V};
    static const int all_v[] = {1, 1, 2, 4, 2, 4, 1, 1, 2, 2, 2, 2};
    const pp_schedule_kind* kinds = d && d->kinds ? d->kinds : all_k;
    const int* kv = d && d->kinds ? d->kinds_v : all_v;
    int nk = d && d->kinds ? d->n_kinds : (int)(sizeof all_k / sizeof all_k[0]);
    int L, k, pol, l, r, tried = 0, max_s = 0, *fst = NULL;
    size_t n_max = 0;
    unsigned char *rc = NULL, *best_rc = NULL;
    double* dbl = NULL;
    pp_action* acts = NULL;
    pp_sim_result* res = NULL;
    pp_plan best, cur;
    pp_schedule map;
    pp_result ret = PP_OK;
    if ((ret = _pp_plan_check(d, err)) != PP_OK) return ret;
    if (!out || !first || !recompute) return _pp_fail(err, PP_ERR_INVALID, "plan: out, first and recompute are needed");
    L = d->n_layers;
    for (k = 0; k < nk; k++) {
        int v = pp_schedule_kind_v(kinds[k], kv[k]);
        size_t n = pp_schedule_size(kinds[k], d->p, v, d->m);
        if (!n) continue; /* no such schedule (and p * v may not fit an int) */
        if (n > n_max) n_max = n;
        if (d->p * v > max_s) max_s = d->p * v;
    }
    memset(&best, 0, sizeof best);
    fst = (int*)_pp_calloc((size_t)max_s + 1, sizeof *fst);
    dbl = (double*)_pp_calloc(7 * (size_t)max_s + (size_t)L, sizeof *dbl);
    acts = (pp_action*)_pp_calloc(n_max ? n_max : 1, sizeof *acts);
    res = (pp_sim_result*)_pp_calloc(1, sizeof *res);
    rc = (unsigned char*)_pp_calloc(2 * (size_t)L, 1);
    if (!fst || !dbl || !acts || !res || !rc) {
        ret = _pp_fail(err, PP_ERR_NOMEM, "plan: scratch for %zu actions", n_max);
        goto done;
    }
    best_rc = rc + L;
    for (k = 0; k < nk; k++) {
        int v = pp_schedule_kind_v(kinds[k], kv[k]), S;
        size_t n = pp_schedule_size(kinds[k], d->p, v, d->m);
        if (!n) continue;  /* no such schedule */
        S = d->p * v;
        if (S > L) continue; /* fewer layers than stages */
        memset(&map, 0, sizeof map); /* the kind's stage map alone, for pp_schedule_stage_to_rank */
        map.p = d->p, map.v = v, map.n_stages = S, map.map = _pp_sched_kind_map(kinds[k]);
        for (pol = 0; pol < (d->no_recompute ? 1 : 4); pol++) {
            int steps = 0;
            /* 0 nothing, 1 every layer, 2 every other layer, 3 greedy from nothing */
            for (l = 0; l < L; l++) rc[l] = (unsigned char)(pol == 1 || (pol == 2 && l % 2 == 1));
            for (;;) {
                pp_error e;
                int worst = 0, pick = -1, st;
                double pick_score = -1;
                if (_pp_plan_run(d, kinds[k], v, rc, &cur, fst, dbl, acts, n, res, &e) != PP_OK) break;
                tried++;
                if (_pp_plan_better(&cur, &best)) {
                    best = cur;
                    memcpy(best_rc, rc, (size_t)L);
                    memcpy(first, fst, sizeof *fst * ((size_t)S + 1));
                }
                if (pol != 3 || cur.fits || ++steps > L) break;
                /* greedy: on the rank with the highest peak, the layer whose recompute drops the most
                   bytes per unit of forward time */
                for (r = 1; r < d->p; r++)
                    if (res->peak_mem[r] > res->peak_mem[worst]) worst = r;
                for (st = 0; st < S; st++) {
                    int sr, a = fst[st], b = fst[st + 1];
                    pp_schedule_stage_to_rank(&map, st, &sr, NULL);
                    if (sr != worst) continue;
                    for (l = a; l < b; l++) {
                        double r0, r1, all, score;
                        if (rc[l]) continue;
                        all = _pp_plan_stage_mem(d->layers, a, b, 0, rc, &r0, NULL);
                        rc[l] = 1;
                        _pp_plan_stage_mem(d->layers, a, b, 0, rc, &r1, NULL);
                        rc[l] = 0;
                        score = (r1 - r0) * all / (d->layers[l].f > 0 ? d->layers[l].f : 1e-300);
                        if ((r1 - r0) * all > 0 && score > pick_score) pick_score = score, pick = l;
                    }
                }
                if (pick < 0) break;
                rc[pick] = 1;
            }
        }
    }
    best.tried = tried;
    *out = best;
    memcpy(recompute, best_rc, (size_t)L);
    if (!tried) ret = _pp_fail(err, PP_ERR_INVALID, "plan: no kind makes a schedule of %d layers at p=%d m=%d", L, d->p, d->m);
done:
    PP_FREE(fst);
    PP_FREE(dbl);
    PP_FREE(acts);
    PP_FREE(res);
    PP_FREE(rc);
    return ret;
}

/* >>impl-trace -------------------------------------------------------------------------------- */

/* An event the printers can draw: executed (deadlocked simulations mark the rest with -1). */
static int _pp_tl_valid(const pp_event* e) {
    return _pp_sim_finite(e->start) && _pp_sim_finite(e->end) && e->start >= 0 && e->end >= e->start;
}

/* ASCII timeline. Each row is one rank, each column width-th of the time span.
   An action occupies the columns its [start, end) rounds to (at least one) and is drawn as its
   label padded with its lowercase op letter, e.g. "F12ff" (forward of mb 12) or "B3.1b"
   (backward of mb 3, chunk 1). The label is "<OP><mb>" plus ".<chunk>" when the events have more
   than one chunk; when it does not fit, the chunk is dropped, then the mb, so a one-column action
   is just its op letter ("F", "B", "W"): widen the picture to read the micro-batches. '.' is idle.
   Labels never get truncated to a different-looking number ("F1" for mb 12). */
void pp_timeline_ascii(FILE* f, const pp_event* ev, size_t n, int p, int width) {
    double t0 = 0, t1 = 0, scale;
    size_t k;
    int r, any = 0, chunks = 0, has_w = 0, label_w = 1;
    char* row;
    if (!f) return;
    if (width <= 0) width = 100;
    if (width > 100000) width = 100000;
    for (k = 0; ev && k < n; k++) {
        if (!_pp_tl_valid(&ev[k])) continue;
        if (!any || ev[k].start < t0) t0 = ev[k].start;
        if (!any || ev[k].end > t1) t1 = ev[k].end;
        if (ev[k].a.chunk > 0) chunks = 1;
        if (ev[k].a.op == PP_OP_W) has_w = 1;
        any = 1;
    }
    if (p <= 0) {
        for (k = 0; ev && k < n; k++)
            if (_pp_tl_valid(&ev[k]) && ev[k].rank + 1 > p) p = ev[k].rank + 1;
    }
    if (!any || p <= 0) {
        fprintf(f, "(no events)\n");
        return;
    }
    for (r = p - 1; r >= 10; r /= 10) label_w++;
    scale = t1 > t0 ? (double)width / (t1 - t0) : 1.0;
    row = (char*)PP_MALLOC((size_t)width + 1);
    if (!row) {
        fprintf(f, "(timeline: out of memory)\n");
        return;
    }
    for (r = 0; r < p; r++) {
        memset(row, '.', (size_t)width);
        row[width] = 0;
        for (k = 0; k < n; k++) {
            const pp_event* e = &ev[k];
            char label[40], pad;
            int c0, c1, cells, len, j;
            if (e->rank != r || !_pp_tl_valid(e)) continue;
            /* round both ends the same way so adjacent actions abut exactly */
            c0 = (int)((e->start - t0) * scale + 0.5);
            c1 = (int)((e->end - t0) * scale + 0.5);
            if (c0 > width - 1) c0 = width - 1;
            if (c1 > width) c1 = width;
            if (c1 <= c0) c1 = c0 + 1;
            cells = c1 - c0;
            pad = (char)(_pp_sched_op_char(e->a.op) - 'A' + 'a');
            if (pad < 'a' || pad > 'z') pad = '?';
            len = snprintf(label, sizeof label, "%c%d.%d", _pp_sched_op_char(e->a.op), (int)e->a.mb,
                           (int)e->a.chunk);
            if (!chunks || len > cells)
                len = snprintf(label, sizeof label, "%c%d", _pp_sched_op_char(e->a.op), (int)e->a.mb);
            if (len > cells) len = 1;
            for (j = 0; j < cells; j++) row[c0 + j] = j < len ? label[j] : pad;
        }
        fprintf(f, "r%-*d |%s|\n", label_w, r, row);
    }
    PP_FREE(row);
    fprintf(f, "%*s  one column = %g time units, %g .. %g\n", label_w, "", (t1 - t0) / width, t0, t1);
    fprintf(f, "%*s  legend: F<mb>%s forward, B<mb> backward%s; %s continue an action; '.' idle\n",
            label_w, "", chunks ? "[.<chunk>]" : "", has_w ? ", W<mb> weight grad" : "",
            has_w ? "f/b/w" : "f/b");
}

void pp_timeline_chrome(FILE* f, const pp_event* ev, size_t n, double time_scale) {
    unsigned char seen[PP_MAX_RANKS];
    size_t k;
    int r, first = 1;
    if (!f) return;
    if (!_pp_sim_finite(time_scale) || time_scale <= 0) time_scale = 1.0;
    memset(seen, 0, sizeof seen);
    for (k = 0; ev && k < n; k++)
        if (_pp_tl_valid(&ev[k]) && ev[k].rank >= 0 && ev[k].rank < PP_MAX_RANKS) seen[ev[k].rank] = 1;
    fprintf(f, "{\"traceEvents\":[");
    /* name the tracks first, so viewers label them "rank r" and sort them by rank */
    for (r = 0; r < PP_MAX_RANKS; r++) {
        if (!seen[r]) continue;
        fprintf(f, "%s\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,"
                   "\"args\":{\"name\":\"rank %d\"}}",
                first ? "" : ",", r, r);
        fprintf(f, ",\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,"
                   "\"args\":{\"sort_index\":%d}}",
                r, r);
        first = 0;
    }
    for (k = 0; ev && k < n; k++) {
        const pp_event* e = &ev[k];
        char op = _pp_sched_op_char(e->a.op);
        if (!_pp_tl_valid(e)) continue;
        fprintf(f, "%s\n{\"name\":\"%c%d.%d\",\"cat\":\"%c\",\"ph\":\"X\",\"pid\":0,\"tid\":%d,"
                   "\"ts\":%.3f,\"dur\":%.3f,"
                   "\"args\":{\"mb\":%d,\"chunk\":%d,\"stage\":%d}}",
                first ? "" : ",", op, (int)e->a.mb, (int)e->a.chunk, op, e->rank,
                e->start * time_scale, (e->end - e->start) * time_scale, (int)e->a.mb,
                (int)e->a.chunk, (int)e->a.stage);
        first = 0;
    }
    fprintf(f, "\n],\"displayTimeUnit\":\"ms\"}\n");
}
/* >>impl-flight
   Entries go into a ring; HEARD entries go into heard[] instead (the ring keeps this rank's own
   actions only), indexed by direction: an activation came from the previous stage's rank, a
   gradient from the next one's. */
static void _pp_flight_add(pp_flight* f, const pp_flight_entry* e) {
    if (e->state == PP_FLIGHT_HEARD) {
        f->heard[e->a.op == PP_OP_F ? 0 : 1] = *e;
        return;
    }
    f->ring[f->n % PP_FLIGHT_LEN] = *e;
    f->n++;
}

const pp_flight_entry* pp_flight_last(const pp_flight* f, int state) {
    uint64_t i, lo;
    if (!f || f->n == 0) return NULL;
    lo = f->n > PP_FLIGHT_LEN ? f->n - PP_FLIGHT_LEN : 0;
    for (i = f->n; i > lo; i--) {
        const pp_flight_entry* e = &f->ring[(i - 1) % PP_FLIGHT_LEN];
        if (state < 0 || e->state == state) return e;
    }
    return NULL;
}

static const char* _pp_flight_state_name(int st) {
    switch (st) {
    case PP_FLIGHT_START: return "start";
    case PP_FLIGHT_DONE: return "done";
    case PP_FLIGHT_FAILED: return "FAILED";
    case PP_FLIGHT_HEARD: return "heard";
    default: return "?";
    }
}

/* "F3.0 (stage 1)" into buf. */
static const char* _pp_flight_act(char* buf, size_t n, const pp_action* a) {
    snprintf(buf, n, "%c%d.%d (stage %d)", "FBW"[a->op % 3], (int)a->mb, (int)a->chunk, (int)a->stage);
    return buf;
}

#include <unistd.h> /* write(2) */

/* Printing a flight record is meant for signal handlers and watchdogs, so it is
   async-signal-safe: each line is formatted here, without stdio, locale or allocation, into a
   buffer on the stack, then goes out whole with write(2) (or fputs for the FILE* versions, which
   stdio's locks make unsafe in a handler). */
typedef struct _pp_line {
    char b[200];
    size_t n;
} _pp_line;

static void _pp_line_str(_pp_line* l, const char* s) {
    while (*s && l->n < sizeof l->b - 1) l->b[l->n++] = *s++;
}

/* s, left-justified in `width` columns (printf's %-6s) */
static void _pp_line_pad(_pp_line* l, const char* s, size_t width) {
    size_t start = l->n;
    _pp_line_str(l, s);
    while (l->n - start < width && l->n < sizeof l->b - 1) l->b[l->n++] = ' ';
}

static void _pp_line_u64(_pp_line* l, uint64_t v) {
    char d[24];
    int k = 0;
    do d[k++] = (char)('0' + (int)(v % 10)); while ((v /= 10) > 0);
    while (k > 0 && l->n < sizeof l->b - 1) l->b[l->n++] = d[--k];
}

static void _pp_line_int(_pp_line* l, long long v) {
    if (v < 0) _pp_line_str(l, "-");
    _pp_line_u64(l, v < 0 ? 0 - (uint64_t)v : (uint64_t)v);
}

/* seconds with six decimals (%.6f), "?" beyond a million years or for NaN */
static void _pp_line_sec(_pp_line* l, double s) {
    uint64_t us, frac;
    int k;
    if (s < 0) _pp_line_str(l, "-"), s = -s;
    if (!(s < 3e13)) {
        _pp_line_str(l, "?");
        return;
    }
    us = (uint64_t)(s * 1e6 + 0.5);
    _pp_line_u64(l, us / 1000000);
    _pp_line_str(l, ".");
    frac = us % 1000000;
    for (k = 100000; k > 0; k /= 10) {
        char c[2];
        c[0] = (char)('0' + (int)(frac / (uint64_t)k % 10));
        c[1] = 0;
        _pp_line_str(l, c);
    }
}

static void _pp_line_act(_pp_line* l, const pp_action* a) {
    char op[2];
    op[0] = "FBW"[a->op % 3];
    op[1] = 0;
    _pp_line_str(l, op);
    _pp_line_int(l, a->mb);
    _pp_line_str(l, ".");
    _pp_line_int(l, a->chunk);
    _pp_line_str(l, " (stage ");
    _pp_line_int(l, a->stage);
    _pp_line_str(l, ")");
}

/* Where the lines go: a FILE (fd < 0) or a file descriptor. */
typedef struct _pp_sink {
    FILE* f;
    int fd;
} _pp_sink;

static void _pp_line_put(const _pp_sink* o, _pp_line* l) {
    size_t off = 0;
    l->b[l->n] = 0;
    if (o->fd < 0) {
        fputs(l->b, o->f);
        return;
    }
    while (off < l->n) {
        ssize_t k = write(o->fd, l->b + off, l->n - off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return;
        off += (size_t)k;
    }
}

/* Reads entry i (0-based, of all ever written) of a record into *e; 0 when it is gone. */
typedef int (*_pp_flight_get_fn)(const void* src, uint64_t i, pp_flight_entry* e);
/* Reads heard[k] into *e; 0 when there is none. */
typedef int (*_pp_flight_heard_fn)(const void* src, int k, pp_flight_entry* e);

/* The record of `rank` with n entries ever written, one line each, oldest first, ages against
   now; then what was last heard. Entries are fetched one at a time, so a reader needs no copy of
   the whole record (a signal handler's stack may be small). */
static void _pp_flight_emit(const _pp_sink* o, int rank, uint64_t n, double now, _pp_flight_get_fn get,
                            _pp_flight_heard_fn heard, const void* src) {
    uint64_t i, lo = n > PP_FLIGHT_LEN ? n - PP_FLIGHT_LEN : 0;
    pp_flight_entry e;
    _pp_line l;
    int k;
    l.n = 0;
    _pp_line_str(&l, "rank ");
    _pp_line_int(&l, rank);
    _pp_line_str(&l, ": flight record, last ");
    _pp_line_u64(&l, n - lo);
    _pp_line_str(&l, " of ");
    _pp_line_u64(&l, n);
    _pp_line_str(&l, " entries\n");
    _pp_line_put(o, &l);
    for (i = lo; i < n; i++) {
        l.n = 0;
        if (!get(src, i, &e)) {
            _pp_line_str(&l, "  (entry overwritten while read)\n");
            _pp_line_put(o, &l);
            continue;
        }
        _pp_line_str(&l, "  step ");
        _pp_line_int(&l, e.step);
        _pp_line_str(&l, "  ");
        _pp_line_pad(&l, _pp_flight_state_name(e.state), 6);
        _pp_line_str(&l, " ");
        _pp_line_act(&l, &e.a);
        if (e.state == PP_FLIGHT_START && e.peer >= 0) {
            _pp_line_str(&l, " awaiting rank ");
            _pp_line_int(&l, e.peer);
        }
        _pp_line_str(&l, "  ");
        _pp_line_sec(&l, now - e.t);
        _pp_line_str(&l, " s ago\n");
        _pp_line_put(o, &l);
    }
    for (k = 0; k < 2; k++) {
        if (!heard(src, k, &e) || e.t <= 0) continue;
        l.n = 0;
        _pp_line_str(&l, "  last heard from rank ");
        _pp_line_int(&l, e.peer);
        _pp_line_str(&l, k == 0 ? " (previous stage): its " : " (next stage): its ");
        _pp_line_act(&l, &e.a);
        _pp_line_str(&l, ", step ");
        _pp_line_int(&l, e.step);
        _pp_line_str(&l, ", ");
        _pp_line_sec(&l, now - e.t);
        _pp_line_str(&l, " s ago\n");
        _pp_line_put(o, &l);
    }
}

static int _pp_flight_copy_get(const void* src, uint64_t i, pp_flight_entry* e) {
    *e = ((const pp_flight*)src)->ring[i % PP_FLIGHT_LEN];
    return 1;
}

static int _pp_flight_copy_heard(const void* src, int k, pp_flight_entry* e) {
    *e = ((const pp_flight*)src)->heard[k];
    return 1;
}

static void _pp_flight_print_to(const _pp_sink* o, const pp_flight* f) {
    if (f) _pp_flight_emit(o, f->rank, f->n, f->now, _pp_flight_copy_get, _pp_flight_copy_heard, f);
}

void pp_flight_print(FILE* out, const pp_flight* f) {
    _pp_sink o;
    if (!out) return;
    o.f = out;
    o.fd = -1;
    _pp_flight_print_to(&o, f);
}

void pp_flight_print_fd(int fd, const pp_flight* f) {
    _pp_sink o;
    if (fd < 0) return;
    o.f = NULL;
    o.fd = fd;
    _pp_flight_print_to(&o, f);
}

/* >>impl-threads
   Each rank has a mailbox. A send first looks for a matching posted receive and copies straight
   into it; otherwise it copies the bytes into an unexpected message the receive will find later.
   Either way a send completes at once, so the sender's buffer is free when isend returns.
   Matching is on (source, tag); among equal pairs, first in first out. */
typedef struct _pp_msg {
    struct _pp_msg* next;
    int src, tag;
    size_t bytes;
    unsigned char* data;
} _pp_msg;

typedef struct _pp_post {
    struct _pp_post* next;
    int src, tag;
    void* buf;
    size_t bytes;
    int done;
    pp_result rc;
    size_t got;             /* bytes the sender offered, for a size-mismatch message */
} _pp_post;

typedef struct _pp_box {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _pp_msg *unexpected, *unexpected_tail;
    _pp_post *posted, *posted_tail;
    uint64_t bytes_sent, msgs_sent;
} _pp_box;

typedef struct _pp_tport {
    pp_threads* world;
    int rank;
} _pp_tport;

/* One rank's flight record in the threads world, readable without a lock: a timeout message
   reads every rank's, and pp_threads_flight_print_fd may run in a signal handler that interrupted
   the very thread writing it. Each entry is a cell with a sequence word (a seqlock per entry):
   ring entry i is written with seq = 2i+1, then its words, then seq = 2i+2; a reader that finds
   2i+2 before and after copying the words has entry i whole, and anything else means the entry
   is being written or was overwritten by a newer one, so the reader skips it and never waits.
   heard[] cells count up by 2 per write the same way. n (entries completed) is stored last. The
   words are copied with relaxed atomic loads and stores, so there is no data race for a
   sanitizer to see. Writers of one rank take mu among themselves; readers never do. */
#define _PP_FWORDS ((sizeof(pp_flight_entry) + 7) / 8)
typedef struct _pp_fcell {
    uint64_t seq;
    uint64_t w[_PP_FWORDS];
} _pp_fcell;

typedef struct _pp_fslot {
    pthread_mutex_t mu;
    uint64_t n;
    _pp_fcell ring[PP_FLIGHT_LEN];
    _pp_fcell heard[2];
} _pp_fslot;

struct pp_threads {
    int n;
    _pp_box* box;
    _pp_tport* ports;
    _pp_fslot* flight;      /* [n] every rank's flight record, for timeout messages */
    pthread_mutex_t abort_mu;
    int aborted;
    pp_result abort_code;
    char abort_msg[512];
};

/* Waking a thread asleep on a condition variable costs a futex wake and a reschedule (~5 us
   here), paid on nearly every hand-off in a busy pipeline. So a wait first watches its posted
   receive for up to PP_THREADS_SPIN_US microseconds (0 disables it), yielding the core between
   looks so that more ranks than cores still make progress, and only then sleeps. `done` is
   written with a release store (under the box lock, as before) and read here with an acquire
   load, so the received bytes are visible once it reads 1. Compilers without the __atomic
   builtins skip the spin. */
#ifndef PP_THREADS_SPIN_US
#define PP_THREADS_SPIN_US 50
#endif
#if defined(__GNUC__) || defined(__clang__)
#include <sched.h>
#define _PP_POST_DONE_LOAD(p) __atomic_load_n(&(p)->done, __ATOMIC_ACQUIRE)
#define _PP_POST_DONE_SET(p) __atomic_store_n(&(p)->done, 1, __ATOMIC_RELEASE)
#define _PP_THREADS_CAN_SPIN 1
#else
#define _PP_POST_DONE_LOAD(p) 0
#define _PP_POST_DONE_SET(p) ((p)->done = 1)
#define _PP_THREADS_CAN_SPIN 0
#endif

/* 1 if the receive completed within the spin window, 0 if the caller must block. */
static int _pp_threads_spin(_pp_post* p) {
    double limit, t0;
    int i;
    if (!_PP_THREADS_CAN_SPIN || PP_THREADS_SPIN_US <= 0) return 0;
    limit = (double)PP_THREADS_SPIN_US * 1e-6;
    t0 = _pp_now();
    for (i = 0;; i++) {
        if (_PP_POST_DONE_LOAD(p)) return 1;
        if ((i & 7) == 7) {
            if (_pp_now() - t0 > limit) return 0;
#if _PP_THREADS_CAN_SPIN
            sched_yield();
#endif
        }
    }
}

static int _pp_threads_aborted(pp_threads* w) {
    int a;
    pthread_mutex_lock(&w->abort_mu);
    a = w->aborted;
    pthread_mutex_unlock(&w->abort_mu);
    return a;
}

static pp_result _pp_threads_isend(void* self, int peer, int tag, const void* buf, size_t bytes, pp_request* req) {
    _pp_tport* tp = (_pp_tport*)self;
    pp_threads* w = tp->world;
    _pp_box* box;
    _pp_post* p;
    _pp_post* prev = NULL;
    pp_result rc = PP_OK;
    if (!req || peer < 0 || peer >= w->n || (bytes && !buf)) return PP_ERR_INVALID;
    memset(req, 0, sizeof *req);
    /* after an abort nothing new is queued: what a stopped step sends would be stale */
    if (_pp_threads_aborted(w)) return PP_ERR_ABORTED;
    box = &w->box[peer];
    pthread_mutex_lock(&box->mu);
    for (p = box->posted; p; prev = p, p = p->next)
        if (p->src == tp->rank && p->tag == tag) break;
    if (p) {
        if (prev) prev->next = p->next; else box->posted = p->next;
        if (box->posted_tail == p) box->posted_tail = prev;
        p->next = NULL;
        if (p->bytes != bytes) {
            p->rc = rc = PP_ERR_SIZE;
            p->got = bytes;
        } else if (bytes) {
            memcpy(p->buf, buf, bytes);
        }
        _PP_POST_DONE_SET(p);
        pthread_cond_broadcast(&box->cv);
    } else {
        _pp_msg* msg = (_pp_msg*)PP_MALLOC(sizeof *msg + (bytes ? bytes : 1));
        if (!msg) {
            pthread_mutex_unlock(&box->mu);
            return PP_ERR_NOMEM;
        }
        msg->next = NULL;
        msg->src = tp->rank;
        msg->tag = tag;
        msg->bytes = bytes;
        msg->data = (unsigned char*)(msg + 1);
        if (bytes) memcpy(msg->data, buf, bytes);
        if (box->unexpected_tail) box->unexpected_tail->next = msg; else box->unexpected = msg;
        box->unexpected_tail = msg;
        pthread_cond_broadcast(&box->cv);
    }
    pthread_mutex_unlock(&box->mu);
    pthread_mutex_lock(&w->box[tp->rank].mu);
    w->box[tp->rank].bytes_sent += bytes;
    w->box[tp->rank].msgs_sent += 1;
    pthread_mutex_unlock(&w->box[tp->rank].mu);
    req->done = 1;
    return rc;
}

static pp_result _pp_threads_irecv(void* self, int peer, int tag, void* buf, size_t bytes, pp_request* req) {
    _pp_tport* tp = (_pp_tport*)self;
    pp_threads* w = tp->world;
    _pp_box* box = &w->box[tp->rank];
    _pp_msg *m, *prev = NULL;
    if (!req || peer < 0 || peer >= w->n || (bytes && !buf)) return PP_ERR_INVALID;
    memset(req, 0, sizeof *req);
    pthread_mutex_lock(&box->mu);
    for (m = box->unexpected; m; prev = m, m = m->next)
        if (m->src == peer && m->tag == tag) break;
    if (m) {
        pp_result rc = PP_OK;
        if (prev) prev->next = m->next; else box->unexpected = m->next;
        if (box->unexpected_tail == m) box->unexpected_tail = prev;
        pthread_mutex_unlock(&box->mu);
        if (m->bytes != bytes) {
            rc = PP_ERR_SIZE;
            req->id = (int64_t)m->bytes;
        } else if (bytes) {
            memcpy(buf, m->data, bytes);
        }
        PP_FREE(m);
        req->done = 1;
        req->impl = NULL;
        if (rc != PP_OK) req->done = -1; /* completed with a size error, reported by wait */
        return PP_OK;
    } else {
        _pp_post* p = (_pp_post*)_pp_calloc(1, sizeof *p);
        if (!p) {
            pthread_mutex_unlock(&box->mu);
            return PP_ERR_NOMEM;
        }
        p->src = peer;
        p->tag = tag;
        p->buf = buf;
        p->bytes = bytes;
        if (box->posted_tail) box->posted_tail->next = p; else box->posted = p;
        box->posted_tail = p;
        req->impl = p;
        req->id = tag;
    }
    pthread_mutex_unlock(&box->mu);
    return PP_OK;
}

static void _pp_threads_unpost(_pp_box* box, _pp_post* p) {
    _pp_post *q, *prev = NULL;
    for (q = box->posted; q; prev = q, q = q->next)
        if (q == p) {
            if (prev) prev->next = q->next; else box->posted = q->next;
            if (box->posted_tail == q) box->posted_tail = prev;
            return;
        }
}

static pp_result _pp_threads_wait(void* self, pp_request* req, double timeout_s, pp_error* err) {
    _pp_tport* tp = (_pp_tport*)self;
    pp_threads* w = tp->world;
    _pp_box* box = &w->box[tp->rank];
    _pp_post* p = (_pp_post*)req->impl;
    struct timespec dl, now;
    double dt = timeout_s > 0 ? timeout_s : PP_DEFAULT_TIMEOUT_S;
    if (dt > 1e9) dt = 1e9; /* keeps the deadline inside time_t */
    pp_result rc = PP_OK;
    if (req->done == -1) {
        req->done = 1;
        return _pp_fail(err, PP_ERR_SIZE, "rank %d: message is %lld bytes, the receive expected another size",
                        tp->rank, (long long)req->id);
    }
    if (req->done || !p) return PP_OK;
    /* pthread_cond_timedwait measures against CLOCK_REALTIME. */
    clock_gettime(CLOCK_REALTIME, &now);
    dl.tv_sec = now.tv_sec + (time_t)dt;
    dl.tv_nsec = now.tv_nsec + (long)((dt - (double)(time_t)dt) * 1e9);
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec += 1;
        dl.tv_nsec -= 1000000000L;
    }
    _pp_threads_spin(p); /* when it returns 1 the loop below does not sleep */
    pthread_mutex_lock(&box->mu);
    while (!p->done) {
        int e;
        if (_pp_threads_aborted(w)) {
            int src = p->src;
            _pp_threads_unpost(box, p);
            pthread_mutex_unlock(&box->mu);
            PP_FREE(p);
            req->impl = NULL;
            pthread_mutex_lock(&w->abort_mu);
            rc = _pp_fail(err, PP_ERR_ABORTED, "rank %d stopped waiting for rank %d: %s", tp->rank, src, w->abort_msg);
            pthread_mutex_unlock(&w->abort_mu);
            return rc;
        }
        e = pthread_cond_timedwait(&box->cv, &box->mu, &dl);
        if (e == ETIMEDOUT && !p->done) {
            int src = p->src;
            _pp_threads_unpost(box, p);
            pthread_mutex_unlock(&box->mu);
            PP_FREE(p);
            req->impl = NULL;
            return _pp_fail(err, PP_ERR_TIMEOUT, "rank %d waited %.3g s for rank %d and got nothing", tp->rank,
                            timeout_s > 0 ? timeout_s : PP_DEFAULT_TIMEOUT_S, src);
        }
    }
    pthread_mutex_unlock(&box->mu);
    rc = p->rc;
    if (rc == PP_ERR_SIZE)
        _pp_fail(err, PP_ERR_SIZE, "rank %d expected %zu bytes from rank %d, the sender sent %zu", tp->rank, p->bytes,
                 p->src, p->got);
    PP_FREE(p);
    req->impl = NULL;
    req->done = 1;
    return rc;
}

static pp_result _pp_threads_test(void* self, pp_request* req, int* done) {
    _pp_tport* tp = (_pp_tport*)self;
    _pp_post* p = (_pp_post*)req->impl;
    if (req->done || !p) {
        *done = 1;
        return PP_OK;
    }
    pthread_mutex_lock(&tp->world->box[tp->rank].mu);
    *done = p->done;
    pthread_mutex_unlock(&tp->world->box[tp->rank].mu);
    return PP_OK;
}

/* Withdraws a receive nobody will wait for; a message it already took is dropped with it. */
static pp_result _pp_threads_cancel(void* self, pp_request* req) {
    _pp_tport* tp = (_pp_tport*)self;
    _pp_box* box = &tp->world->box[tp->rank];
    _pp_post* p = (_pp_post*)req->impl;
    if (!p) return PP_OK;
    pthread_mutex_lock(&box->mu);
    _pp_threads_unpost(box, p);
    pthread_mutex_unlock(&box->mu);
    PP_FREE(p);
    req->impl = NULL;
    req->done = 1;
    return PP_OK;
}

#if defined(__GNUC__) || defined(__clang__)
#define _PP_LOAD_ACQ(p) __atomic_load_n(p, __ATOMIC_ACQUIRE)
#define _PP_LOAD_RLX(p) __atomic_load_n(p, __ATOMIC_RELAXED)
#define _PP_STORE_REL(p, v) __atomic_store_n(p, v, __ATOMIC_RELEASE)
#define _PP_STORE_RLX(p, v) __atomic_store_n(p, v, __ATOMIC_RELAXED)
#define _PP_FENCE_ACQ() __atomic_thread_fence(__ATOMIC_ACQUIRE)
#define _PP_FENCE_REL() __atomic_thread_fence(__ATOMIC_RELEASE)
#else /* no ordering guarantees: a reader may see a torn entry, never a lock */
#define _PP_LOAD_ACQ(p) (*(volatile uint64_t*)(p))
#define _PP_LOAD_RLX(p) (*(volatile uint64_t*)(p))
#define _PP_STORE_REL(p, v) (*(volatile uint64_t*)(p) = (v))
#define _PP_STORE_RLX(p, v) (*(volatile uint64_t*)(p) = (v))
#define _PP_FENCE_ACQ() ((void)0)
#define _PP_FENCE_REL() ((void)0)
#endif

/* Writes e into cell c under sequence numbers seq (odd, while writing) and seq + 1 (whole). */
static void _pp_fcell_write(_pp_fcell* c, uint64_t seq, const pp_flight_entry* e) {
    uint64_t w[_PP_FWORDS];
    size_t k;
    memset(w, 0, sizeof w);
    memcpy(w, e, sizeof *e);
    _PP_STORE_RLX(&c->seq, seq);
    _PP_FENCE_REL();
    for (k = 0; k < _PP_FWORDS; k++) _PP_STORE_RLX(&c->w[k], w[k]);
    _PP_STORE_REL(&c->seq, seq + 1);
}

/* Copies cell c into *e; returns its sequence number, or 0 when it changed while copied (or
   was being written: odd). */
static uint64_t _pp_fcell_read(const _pp_fcell* c, pp_flight_entry* e) {
    uint64_t w[_PP_FWORDS], s1, s2;
    size_t k;
    s1 = _PP_LOAD_ACQ(&c->seq);
    if (s1 & 1) return 0;
    for (k = 0; k < _PP_FWORDS; k++) w[k] = _PP_LOAD_RLX(&c->w[k]);
    _PP_FENCE_ACQ();
    s2 = _PP_LOAD_RLX(&c->seq);
    if (s1 != s2) return 0;
    memcpy(e, w, sizeof *e);
    return s1;
}

static void _pp_threads_flight_note(void* self, const pp_flight_entry* e) {
    _pp_tport* tp = (_pp_tport*)self;
    _pp_fslot* fs = &tp->world->flight[tp->rank];
    pthread_mutex_lock(&fs->mu);
    if (e->state == PP_FLIGHT_HEARD) {
        _pp_fcell* c = &fs->heard[e->a.op == PP_OP_F ? 0 : 1];
        _pp_fcell_write(c, _PP_LOAD_RLX(&c->seq) + 1, e);
    } else {
        uint64_t i = _PP_LOAD_RLX(&fs->n);
        _pp_fcell_write(&fs->ring[i % PP_FLIGHT_LEN], 2 * i + 1, e);
        _PP_STORE_REL(&fs->n, i + 1);
    }
    pthread_mutex_unlock(&fs->mu);
}

static int _pp_fslot_get(const void* src, uint64_t i, pp_flight_entry* e) {
    const _pp_fslot* fs = (const _pp_fslot*)src;
    return _pp_fcell_read(&fs->ring[i % PP_FLIGHT_LEN], e) == 2 * i + 2;
}

/* heard[k], retried a few times while its writer is busy; 0 if never written */
static int _pp_fslot_heard(const void* src, int k, pp_flight_entry* e) {
    const _pp_fslot* fs = (const _pp_fslot*)src;
    int tries;
    for (tries = 0; tries < 4; tries++)
        if (_pp_fcell_read(&fs->heard[k], e) != 0) return 1;
    return 0;
}

pp_result pp_threads_flight(pp_threads* w, int rank, pp_flight* out) {
    const _pp_fslot* fs;
    uint64_t i, lo;
    int k;
    if (!w || !out || rank < 0 || rank >= w->n) return PP_ERR_INVALID;
    fs = &w->flight[rank];
    memset(out, 0, sizeof *out);
    out->n = _PP_LOAD_ACQ(&fs->n);
    lo = out->n > PP_FLIGHT_LEN ? out->n - PP_FLIGHT_LEN : 0;
    for (i = lo; i < out->n; i++) {
        pp_flight_entry* e = &out->ring[i % PP_FLIGHT_LEN];
        if (!_pp_fslot_get(fs, i, e)) { /* overwritten since n was read: the oldest ones */
            memset(e, 0, sizeof *e);
            e->state = -1;
            e->peer = -1;
        }
    }
    for (k = 0; k < 2; k++)
        if (!_pp_fslot_heard(fs, k, &out->heard[k])) memset(&out->heard[k], 0, sizeof out->heard[k]);
    out->rank = rank;
    out->now = _pp_now();
    return PP_OK;
}

static int _pp_threads_flight_get(void* self, int peer, pp_flight* out) {
    _pp_tport* tp = (_pp_tport*)self;
    return pp_threads_flight(tp->world, peer, out) == PP_OK;
}

static void _pp_threads_flight_print_to(const _pp_sink* o, pp_threads* w) {
    double now = _pp_now();
    int r;
    for (r = 0; r < w->n; r++) {
        const _pp_fslot* fs = &w->flight[r];
        _pp_flight_emit(o, r, _PP_LOAD_ACQ(&fs->n), now, _pp_fslot_get, _pp_fslot_heard, fs);
    }
}

void pp_threads_flight_print(FILE* out, pp_threads* w) {
    _pp_sink o;
    if (!out || !w) return;
    o.f = out;
    o.fd = -1;
    _pp_threads_flight_print_to(&o, w);
}

void pp_threads_flight_print_fd(int fd, pp_threads* w) {
    _pp_sink o;
    if (fd < 0 || !w) return;
    o.f = NULL;
    o.fd = fd;
    _pp_threads_flight_print_to(&o, w);
}

size_t pp_threads_pending(pp_threads* w) {
    size_t n = 0;
    int r;
    if (!w) return 0;
    for (r = 0; r < w->n; r++) {
        _pp_msg* m;
        _pp_post* p;
        pthread_mutex_lock(&w->box[r].mu);
        for (m = w->box[r].unexpected; m; m = m->next) n++;
        for (p = w->box[r].posted; p; p = p->next) n++;
        pthread_mutex_unlock(&w->box[r].mu);
    }
    return n;
}

static void _pp_threads_abort(void* self, pp_result why, const char* msg) {
    _pp_tport* tp = (_pp_tport*)self;
    pp_threads* w = tp->world;
    int r;
    pthread_mutex_lock(&w->abort_mu);
    if (!w->aborted) {
        w->aborted = 1;
        w->abort_code = why;
        _pp_abort_text(w->abort_msg, sizeof w->abort_msg, tp->rank, why, msg);
    }
    pthread_mutex_unlock(&w->abort_mu);
    for (r = 0; r < w->n; r++) {
        pthread_mutex_lock(&w->box[r].mu);
        pthread_cond_broadcast(&w->box[r].cv);
        pthread_mutex_unlock(&w->box[r].mu);
    }
}

static int _pp_threads_abort_reason(void* self, char* buf, size_t n) {
    pp_threads* w = ((_pp_tport*)self)->world;
    int a;
    if (!buf || n == 0) return 0;
    pthread_mutex_lock(&w->abort_mu);
    a = w->aborted;
    if (a) snprintf(buf, n, "%s", w->abort_msg);
    pthread_mutex_unlock(&w->abort_mu);
    return a;
}

/* 1 when ranks[0..n) is the whole transport of size ranks 0, 1, .., size - 1 in order (what a
   transport's own collective over its communicator covers; pipeline_mpi.h and pipeline_nccl.h). */
static _PP_UNUSED int _pp_ranks_whole(const int* ranks, int n, int size) {
    int i;
    if (!ranks || n != size) return 0;
    for (i = 0; i < n; i++)
        if (ranks[i] != i) return 0;
    return 1;
}

/* All-reduce built from point-to-point messages: everyone sends to ranks[0], which sums in the
   order of ranks[] (so every run gives the same bits) and sends the result back. Works over any
   transport with isend/irecv/wait. Its messages go on tags tag (to ranks[0]) and tag + 1 (the sum
   back): _PP_TAG_ALLREDUCE, or pp_dp_overlap's, which carry the step's identity. */
#define _PP_TAG_ALLREDUCE 0x7ffffff0
static pp_result _pp_allreduce_p2p(const pp_transport* t, void* buf, size_t count, pp_dtype dtype, const int* ranks,
                                   int n_ranks, double timeout_s, pp_error* err, int tag) {
    size_t es = pp_dtype_size(dtype), bytes = count * es, j;
    pp_request rq;
    pp_result rc = PP_OK;
    void* tmp = NULL;
    int i, me = -1;
    if (!buf || !ranks || n_ranks <= 0 || !pp_dtype_is_float(dtype) || dtype == PP_F16 || dtype == PP_BF16)
        return _pp_fail(err, PP_ERR_INVALID, "all-reduce needs a buffer, ranks and an f32/f64 dtype");
    for (i = 0; i < n_ranks; i++)
        if (ranks[i] == t->rank) me = i;
    if (me < 0) return _pp_fail(err, PP_ERR_INVALID, "rank %d is not in the all-reduce group", t->rank);
    if (n_ranks == 1 || count == 0) return PP_OK;
    if (me != 0) {
        if ((rc = t->isend(t->self, ranks[0], tag, buf, bytes, &rq)) != PP_OK)
            return _pp_fail(err, rc, "rank %d: all-reduce send to rank %d", t->rank, ranks[0]);
        if ((rc = t->wait(t->self, &rq, timeout_s, err)) != PP_OK) return rc;
        if ((rc = t->irecv(t->self, ranks[0], tag + 1, buf, bytes, &rq)) != PP_OK)
            return _pp_fail(err, rc, "rank %d: all-reduce receive from rank %d", t->rank, ranks[0]);
        return t->wait(t->self, &rq, timeout_s, err);
    }
    tmp = PP_MALLOC(bytes);
    if (!tmp) return _pp_fail(err, PP_ERR_NOMEM, "all-reduce buffer of %zu bytes", bytes);
    for (i = 1; i < n_ranks && rc == PP_OK; i++) {
        if ((rc = t->irecv(t->self, ranks[i], tag, tmp, bytes, &rq)) != PP_OK) break;
        if ((rc = t->wait(t->self, &rq, timeout_s, err)) != PP_OK) break;
        if (dtype == PP_F32)
            for (j = 0; j < count; j++) ((float*)buf)[j] += ((const float*)tmp)[j];
        else
            for (j = 0; j < count; j++) ((double*)buf)[j] += ((const double*)tmp)[j];
    }
    for (i = 1; i < n_ranks && rc == PP_OK; i++) {
        if ((rc = t->isend(t->self, ranks[i], tag + 1, buf, bytes, &rq)) != PP_OK) break;
        rc = t->wait(t->self, &rq, timeout_s, err);
    }
    PP_FREE(tmp);
    return rc;
}

static pp_result _pp_threads_allreduce(void* self, void* buf, size_t count, pp_dtype dtype, const int* ranks,
                                       int n_ranks, double timeout_s, pp_error* err) {
    _pp_tport* tp = (_pp_tport*)self;
    pp_transport t = pp_threads_transport(tp->world, tp->rank);
    return _pp_allreduce_p2p(&t, buf, count, dtype, ranks, n_ranks, timeout_s, err, _PP_TAG_ALLREDUCE);
}

pp_result pp_threads_create(int n_ranks, pp_threads** out, pp_error* err) {
    pp_threads* w;
    int r;
    if (!out) return _pp_fail(err, PP_ERR_INVALID, "output pointer is NULL");
    *out = NULL;
    if (n_ranks <= 0 || n_ranks > PP_MAX_RANKS)
        return _pp_fail(err, PP_ERR_INVALID, "threads transport needs 1..%d ranks (got %d)", PP_MAX_RANKS, n_ranks);
    w = (pp_threads*)_pp_calloc(1, sizeof *w);
    if (!w) return _pp_fail(err, PP_ERR_NOMEM, "threads transport");
    w->box = (_pp_box*)_pp_calloc((size_t)n_ranks, sizeof *w->box);
    w->ports = (_pp_tport*)_pp_calloc((size_t)n_ranks, sizeof *w->ports);
    w->flight = (_pp_fslot*)_pp_calloc((size_t)n_ranks, sizeof *w->flight);
    if (!w->box || !w->ports || !w->flight) {
        PP_FREE(w->box);
        PP_FREE(w->ports);
        PP_FREE(w->flight);
        PP_FREE(w);
        return _pp_fail(err, PP_ERR_NOMEM, "threads transport mailboxes");
    }
    w->n = n_ranks;
    pthread_mutex_init(&w->abort_mu, NULL);
    for (r = 0; r < n_ranks; r++) {
        pthread_mutex_init(&w->box[r].mu, NULL);
        pthread_cond_init(&w->box[r].cv, NULL);
        w->ports[r].world = w;
        w->ports[r].rank = r;
        pthread_mutex_init(&w->flight[r].mu, NULL);
    }
    *out = w;
    return PP_OK;
}

/* Drops every message and posted receive still queued (stale after an aborted step). A stage
   cancels its own receives when a step fails; a posting left here belongs to a request nobody
   will wait for (waiting for it after a reset is the caller's bug), so it is freed too. */
static void _pp_threads_drain(pp_threads* w) {
    int r;
    for (r = 0; r < w->n; r++) {
        _pp_box* b = &w->box[r];
        _pp_msg* m;
        _pp_post* p;
        pthread_mutex_lock(&b->mu);
        m = b->unexpected;
        while (m) {
            _pp_msg* nx = m->next;
            PP_FREE(m);
            m = nx;
        }
        b->unexpected = b->unexpected_tail = NULL;
        p = b->posted;
        while (p) {
            _pp_post* nx = p->next;
            PP_FREE(p);
            p = nx;
        }
        b->posted = b->posted_tail = NULL;
        pthread_mutex_unlock(&b->mu);
    }
}

void pp_threads_reset(pp_threads* w) {
    if (!w) return;
    _pp_threads_drain(w);
    pthread_mutex_lock(&w->abort_mu);
    w->aborted = 0;
    w->abort_code = PP_OK;
    w->abort_msg[0] = 0;
    pthread_mutex_unlock(&w->abort_mu);
}

void pp_threads_destroy(pp_threads* w) {
    int r;
    if (!w) return;
    _pp_threads_drain(w);
    for (r = 0; r < w->n; r++) {
        pthread_mutex_destroy(&w->box[r].mu);
        pthread_cond_destroy(&w->box[r].cv);
        pthread_mutex_destroy(&w->flight[r].mu);
    }
    pthread_mutex_destroy(&w->abort_mu);
    PP_FREE(w->flight);
    PP_FREE(w->box);
    PP_FREE(w->ports);
    PP_FREE(w);
}

/* Every transport constructor's last step (threads here, CUDA, MPI, NCCL): ops's functions with
   self, rank and size set; all NULL where self is NULL (pp_stage_create rejects it). */
static pp_transport _pp_transport_of(const pp_transport* ops, void* self, int rank, int size) {
    pp_transport t;
    memset(&t, 0, sizeof t);
    if (!self) return t;
    t = *ops;
    t.self = self;
    t.rank = rank;
    t.size = size;
    return t;
}

pp_transport pp_threads_transport(pp_threads* w, int rank) {
    /* self, rank, size; isend, irecv, wait, test; group_start, group_end; allreduce_sum, abort,
       cancel; flight_note, flight_get; abort_reason, check_schedule; abort_local; released;
       iallreduce_sum */
    static const pp_transport ops = {NULL, 0, 0, _pp_threads_isend, _pp_threads_irecv, _pp_threads_wait, _pp_threads_test,
                                     NULL, NULL, _pp_threads_allreduce, _pp_threads_abort, _pp_threads_cancel,
                                     _pp_threads_flight_note, _pp_threads_flight_get, _pp_threads_abort_reason, NULL, 0, NULL,
                                     NULL};
    int ok = w && rank >= 0 && rank < w->n;
    return _pp_transport_of(&ops, ok ? &w->ports[rank] : NULL, rank, ok ? w->n : 0);
}

void pp_threads_counters(pp_threads* w, int rank, uint64_t* bytes, uint64_t* msgs) {
    if (!w || rank < 0 || rank >= w->n) return;
    pthread_mutex_lock(&w->box[rank].mu);
    if (bytes) *bytes = w->box[rank].bytes_sent;
    if (msgs) *msgs = w->box[rank].msgs_sent;
    pthread_mutex_unlock(&w->box[rank].mu);
}

typedef struct _pp_thread_arg {
    pp_rank_fn fn;
    void* user;
    int rank;
    pp_result rc;
} _pp_thread_arg;

static void* _pp_thread_main(void* p) {
    _pp_thread_arg* a = (_pp_thread_arg*)p;
    a->rc = a->fn(a->rank, a->user);
    return NULL;
}

pp_result pp_threads_run(int n, pp_rank_fn fn, void* user, pp_error* err) {
    pthread_t* th;
    _pp_thread_arg* args;
    pp_result rc = PP_OK;
    int r, started = 0;
    if (n <= 0 || !fn) return _pp_fail(err, PP_ERR_INVALID, "pp_threads_run needs n > 0 and a function");
    th = (pthread_t*)_pp_calloc((size_t)n, sizeof *th);
    args = (_pp_thread_arg*)_pp_calloc((size_t)n, sizeof *args);
    if (!th || !args) {
        PP_FREE(th);
        PP_FREE(args);
        return _pp_fail(err, PP_ERR_NOMEM, "threads for %d ranks", n);
    }
    for (r = 0; r < n; r++) {
        args[r].fn = fn;
        args[r].user = user;
        args[r].rank = r;
        if (pthread_create(&th[r], NULL, _pp_thread_main, &args[r]) != 0) {
            rc = _pp_fail(err, PP_ERR_NOMEM, "could not start thread for rank %d", r);
            break;
        }
        started++;
    }
    for (r = 0; r < started; r++) pthread_join(th[r], NULL);
    for (r = 0; r < started && rc == PP_OK; r++)
        if (args[r].rc != PP_OK) rc = _pp_fail(err, args[r].rc, "rank %d returned %s", r, pp_result_str(args[r].rc));
    PP_FREE(th);
    PP_FREE(args);
    return rc;
}

int pp_schedule_rank_to_stage(const pp_schedule* sc, int rank, int chunk) {
    int st, r, c;
    if (!sc) return -1;
    for (st = 0; st < sc->n_stages; st++) {
        pp_schedule_stage_to_rank(sc, st, &r, &c);
        if (r == rank && c == chunk) return st;
    }
    return -1;
}

/* >>impl-grid --------------------------------------------------------------------------------- */
/* Parses a non-negative decimal int; 0 on success. */
static int _pp_env_int(const char* name, int* out) {
    const char* v = getenv(name);
    char* end = NULL;
    long x;
    if (!v || !*v) return 1;
    errno = 0;
    x = strtol(v, &end, 10);
    if (errno || !end || *end || x < 0 || x > 1000000000L) return 2;
    *out = (int)x;
    return 0;
}

pp_result pp_launch_from_env(pp_launch* out, pp_error* err) {
    static const char* const names[4][4] = {
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "ompi"},
        {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "pmi"},
        {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "slurm"},
        {"RANK", "WORLD_SIZE", "LOCAL_RANK", "torchrun"}};
    int i;
    if (!out) return _pp_fail(err, PP_ERR_INVALID, "output pointer is NULL");
    memset(out, 0, sizeof *out);
    for (i = 0; i < 4; i++) {
        int r = 0, n = 0, lr = 0, er, en, el;
        er = _pp_env_int(names[i][0], &r);
        en = _pp_env_int(names[i][1], &n);
        if (er == 1 && en == 1) continue; /* this launcher did not start us */
        if (er || en || n < 1 || r >= n)
            return _pp_fail(err, PP_ERR_INVALID, "launcher environment is malformed: %s=%s %s=%s (want 0 <= rank < size)",
                            names[i][0], getenv(names[i][0]) ? getenv(names[i][0]) : "(unset)", names[i][1],
                            getenv(names[i][1]) ? getenv(names[i][1]) : "(unset)");
        el = _pp_env_int(names[i][2], &lr);
        if (el == 2)
            return _pp_fail(err, PP_ERR_INVALID, "launcher environment is malformed: %s=%s", names[i][2], getenv(names[i][2]));
        out->rank = r;
        out->world = n;
        out->local_rank = el ? 0 : lr;
        out->source = names[i][3];
        return PP_OK;
    }
    return _pp_fail(err, PP_ERR_INVALID,
                    "no launcher environment: set OMPI_COMM_WORLD_RANK/SIZE (mpirun), PMI_RANK/SIZE (mpiexec), "
                    "SLURM_PROCID/NTASKS (srun) or RANK/WORLD_SIZE (torchrun)");
}

/* tp 0 (a pp_grid filled by hand before tp existed) counts as 1. */
static int _pp_grid_tp(const pp_grid* g) { return g->tp > 1 ? g->tp : 1; }

/* The grid's dimensions, outermost first, for each order: 0 pp, 1 dp, 2 tp. */
static const signed char _pp_grid_dims[6][3] = {{0, 1, 2}, {1, 0, 2}, {0, 2, 1}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};

/* Each dimension's stride in world ranks (the innermost 1). */
static void _pp_grid_strides(const pp_grid* g, int stride[3]) {
    const signed char* d = _pp_grid_dims[(int)g->order];
    int size[3];
    size[0] = g->pp;
    size[1] = g->dp;
    size[2] = _pp_grid_tp(g);
    stride[d[2]] = 1;
    stride[d[1]] = size[d[2]];
    stride[d[0]] = size[d[2]] * size[d[1]];
}

int pp_grid_rank_tp(const pp_grid* g, int pp_rank, int dp_rank, int tp_rank) {
    int st[3];
    if (!g || (int)g->order < 0 || (int)g->order > 5 || pp_rank < 0 || pp_rank >= g->pp || dp_rank < 0 ||
        dp_rank >= g->dp || tp_rank < 0 || tp_rank >= _pp_grid_tp(g))
        return -1;
    _pp_grid_strides(g, st);
    return pp_rank * st[0] + dp_rank * st[1] + tp_rank * st[2];
}

int pp_grid_rank(const pp_grid* g, int pp_rank, int dp_rank) {
    if (!g) return -1;
    return pp_grid_rank_tp(g, pp_rank, dp_rank, g->tp > 1 ? g->tp_rank : 0);
}

pp_result pp_grid_make_tp(int world, int rank, int pp, int tp, pp_grid_order order, pp_grid* g, pp_error* err) {
    int i, st[3];
    if (!g) return _pp_fail(err, PP_ERR_INVALID, "output pointer is NULL");
    memset(g, 0, sizeof *g);
    if ((int)order < 0 || (int)order > 5) return _pp_fail(err, PP_ERR_INVALID, "unknown grid order %d", (int)order);
    if (pp < 1 || tp < 1)
        return _pp_fail(err, PP_ERR_INVALID, "pp = %d, tp = %d: each must be at least 1", pp, tp);
    if (world < 1 || pp > world || tp > world || world % pp != 0 || (world / pp) % tp != 0)
        return _pp_fail(err, PP_ERR_INVALID, "world of %d processes is not a multiple of pp * tp = %d * %d", world, pp,
                        tp);
    if (pp > PP_MAX_RANKS || world / pp / tp > PP_MAX_RANKS || tp > PP_MAX_RANKS)
        return _pp_fail(err, PP_ERR_INVALID, "pp = %d, dp = %d, tp = %d: each at most PP_MAX_RANKS = %d", pp,
                        world / pp / tp, tp, PP_MAX_RANKS);
    if (rank < 0 || rank >= world) return _pp_fail(err, PP_ERR_INVALID, "rank %d is outside a world of %d", rank, world);
    g->world = world;
    g->rank = rank;
    g->pp = pp;
    g->tp = tp;
    g->dp = world / pp / tp;
    g->order = order;
    _pp_grid_strides(g, st);
    g->pp_rank = rank / st[0] % pp;
    g->dp_rank = rank / st[1] % g->dp;
    g->tp_rank = rank / st[2] % tp;
    for (i = 0; i < pp; i++) g->pipe[i] = pp_grid_rank_tp(g, i, g->dp_rank, g->tp_rank);
    for (i = 0; i < g->dp; i++) g->dp_group[i] = pp_grid_rank_tp(g, g->pp_rank, i, g->tp_rank);
    for (i = 0; i < tp; i++) g->tp_group[i] = pp_grid_rank_tp(g, g->pp_rank, g->dp_rank, i);
    g->tied[0] = g->pipe[0];
    g->tied[1] = g->pipe[pp - 1];
    return PP_OK;
}

pp_result pp_grid_make(int world, int rank, int pp, pp_grid_order order, pp_grid* g, pp_error* err) {
    return pp_grid_make_tp(world, rank, pp, 1, order, g, err);
}

void pp_grid_pipe_split(const pp_grid* g, int* color, int* key) {
    *color = g->dp_rank * _pp_grid_tp(g) + g->tp_rank;
    *key = g->pp_rank;
}

void pp_grid_dp_split(const pp_grid* g, int* color, int* key) {
    *color = g->pp_rank * _pp_grid_tp(g) + g->tp_rank;
    *key = g->dp_rank;
}

void pp_grid_tied_split(const pp_grid* g, int* color, int* key) {
    int first = g->pp_rank == 0, last = g->pp_rank == g->pp - 1;
    *color = first || last ? g->dp_rank * _pp_grid_tp(g) + g->tp_rank : -1;
    *key = first ? 0 : 1;
}

void pp_grid_tp_split(const pp_grid* g, int* color, int* key) {
#ifdef PP_TEST_TP_SPLIT_NO_DP /* negative control (tests/test_tp.c grid): one colour per stage, the replicas' TP groups merged */
    *color = g->pp_rank;
#else
    *color = g->pp_rank * g->dp + g->dp_rank;
#endif
    *key = g->tp_rank;
}

/* The ranks of a collective: n of them, distinct, inside the transport, this rank among them. */
static pp_result _pp_check_group(const pp_transport* t, const int* ranks, int n, pp_error* err) {
    int i, j, me = 0;
    if (!ranks || n < 1)
        return _pp_fail(err, PP_ERR_INVALID, "a group of %d ranks (ranks %s)", n, ranks ? "given" : "NULL");
    for (i = 0; i < n; i++) { /* distinct and inside: n <= t->size follows */
        if (ranks[i] < 0 || ranks[i] >= t->size)
            return _pp_fail(err, PP_ERR_INVALID, "group rank %d (entry %d) is outside the transport's %d ranks", ranks[i], i,
                            t->size);
        for (j = 0; j < i; j++)
            if (ranks[j] == ranks[i]) return _pp_fail(err, PP_ERR_INVALID, "group rank %d appears twice", ranks[i]);
        me |= ranks[i] == t->rank;
    }
    if (!me) return _pp_fail(err, PP_ERR_INVALID, "rank %d is not in the group it reduces over", t->rank);
    return PP_OK;
}

/* *ranks NULL: all of t's ranks (into all[], PP_MAX_RANKS room); then _pp_check_group. */
static pp_result _pp_group_of(const pp_transport* t, const int** ranks, int* n_ranks, int* all, const char* what,
                              pp_error* err) {
    int i;
    if (!*ranks) {
        if (t->size < 1 || t->size > PP_MAX_RANKS) return _pp_fail(err, PP_ERR_INVALID, "%stransport has %d ranks", what, t->size);
        for (i = 0; i < t->size; i++) all[i] = i;
        *ranks = all;
        *n_ranks = t->size;
    }
    return _pp_check_group(t, *ranks, *n_ranks, err);
}

pp_result pp_allreduce_p2p(const pp_transport* t, void* buf, size_t count, pp_dtype dtype, const int* ranks,
                           int n_ranks, double timeout_s, pp_error* err) {
    pp_result rc;
    if (!t || !t->isend || !t->irecv || !t->wait)
        return _pp_fail(err, PP_ERR_INVALID, "all-reduce needs a transport with isend/irecv/wait");
    if ((rc = _pp_check_group(t, ranks, n_ranks, err)) != PP_OK) return rc;
    return _pp_allreduce_p2p(t, buf, count, dtype, ranks, n_ranks, timeout_s, err, _PP_TAG_ALLREDUCE);
}

/* f16/bf16 (uint16_t bits) to f32 and back, n elements. */
static void _pp_half_widen(float* dst, const uint16_t* src, size_t n, pp_dtype t) {
    size_t i;
    if (t == PP_F16)
        for (i = 0; i < n; i++) dst[i] = pp_f16_to_f32(src[i]);
    else
        for (i = 0; i < n; i++) dst[i] = pp_bf16_to_f32(src[i]);
}
static void _pp_half_narrow(uint16_t* dst, const float* src, size_t n, pp_dtype t) {
    size_t i;
    if (t == PP_F16)
        for (i = 0; i < n; i++) dst[i] = pp_f32_to_f16(src[i]);
    else
        for (i = 0; i < n; i++) dst[i] = pp_f32_to_bf16(src[i]);
}

/* f16/bf16 gradients summed over ranks[0..n_ranks) in f32 (the transport's f32 sum), scaled
   in f32, rounded back once: _PP_HALF_CHUNK elements at a time, the same chunks on every rank. */
#define _PP_HALF_CHUNK ((size_t)1 << 18)
/* The sum over ranks[0..n_ranks): tag < 0, the transport's allreduce_sum; else _pp_allreduce_p2p
   on tags tag and tag + 1 (pp_dp_overlap's, with the step's identity in them). */
static pp_result _pp_sum_tagged(const pp_transport* t, int tag, void* buf, size_t count, pp_dtype dtype,
                                const int* ranks, int n_ranks, double timeout_s, pp_error* err) {
    if (tag < 0) return t->allreduce_sum(t->self, buf, count, dtype, ranks, n_ranks, timeout_s, err);
    return _pp_allreduce_p2p(t, buf, count, dtype, ranks, n_ranks, timeout_s, err, tag);
}

static pp_result _pp_half_sum(const pp_transport* t, const int* ranks, int n_ranks, void* buf, size_t count,
                              pp_dtype dtype, double scale, double timeout_s, pp_error* err, int tag) {
    size_t chunk = count < _PP_HALF_CHUNK ? count : _PP_HALF_CHUNK, off, n, i;
    uint16_t* h = (uint16_t*)buf;
    pp_result rc = PP_OK;
    float* tmp;
    if (count == 0 || (n_ranks <= 1 && scale == 1.0)) return PP_OK;
    if (!(tmp = (float*)PP_MALLOC(chunk * sizeof(float))))
        return _pp_fail(err, PP_ERR_NOMEM, "f32 buffer of %zu elements for %s gradients", chunk, pp_dtype_name(dtype));
    for (off = 0; off < count; off += n) {
        n = count - off < chunk ? count - off : chunk;
        _pp_half_widen(tmp, h + off, n, dtype);
        if (n_ranks > 1 && (rc = _pp_sum_tagged(t, tag, tmp, n, PP_F32, ranks, n_ranks, timeout_s, err)) != PP_OK) break;
        if (scale != 1.0)
            for (i = 0; i < n; i++) tmp[i] *= (float)scale;
        _pp_half_narrow(h + off, tmp, n, dtype);
    }
    PP_FREE(tmp);
    return rc;
}

static void _pp_scale(void* buf, size_t count, pp_dtype dtype, double scale) {
    size_t i;
    if (scale == 1.0) return;
    if (dtype == PP_F32)
        for (i = 0; i < count; i++) ((float*)buf)[i] *= (float)scale;
    else
        for (i = 0; i < count; i++) ((double*)buf)[i] *= scale;
}

/* pp_grad_allreduce; tag >= 0: over _pp_allreduce_p2p on tags tag and tag + 1 (_pp_sum_tagged). */
static pp_result _pp_grad_allreduce(const pp_transport* t, const int* ranks, int n_ranks, void* buf, size_t count,
                                    pp_dtype dtype, double scale, double timeout_s, pp_error* err, int tag) {
    int all[PP_MAX_RANKS];
    pp_result rc;
    if (!t || (tag < 0 && !t->allreduce_sum)) return _pp_fail(err, PP_ERR_INVALID, "transport has no allreduce_sum");
    if (dtype != PP_F32 && dtype != PP_F64 && dtype != PP_F16 && dtype != PP_BF16)
        return _pp_fail(err, PP_ERR_INVALID, "gradients must be f32, f64, f16 or bf16 (got %s)", pp_dtype_name(dtype));
    if (count && !buf) return _pp_fail(err, PP_ERR_INVALID, "gradient buffer is NULL");
    if ((rc = _pp_group_of(t, &ranks, &n_ranks, all, "", err)) != PP_OK) return rc;
    if (dtype == PP_F16 || dtype == PP_BF16)
        return _pp_half_sum(t, ranks, n_ranks, buf, count, dtype, scale, timeout_s, err, tag);
    if (n_ranks > 1 && count) {
        rc = _pp_sum_tagged(t, tag, buf, count, dtype, ranks, n_ranks, timeout_s, err);
        if (rc != PP_OK) return rc;
    }
    _pp_scale(buf, count, dtype, scale);
    return PP_OK;
}

pp_result pp_grad_allreduce(const pp_transport* t, const int* ranks, int n_ranks, void* buf, size_t count,
                            pp_dtype dtype, double scale, double timeout_s, pp_error* err) {
    return _pp_grad_allreduce(t, ranks, n_ranks, buf, count, dtype, scale, timeout_s, err, -1);
}

#define _PP_TAG_TIED 0x7ffffff8
#define _PP_TAG_CKPT_TP 0x7ffffff6 /* a checkpoint's slices, to the TP group's first rank */
#define _PP_TAG_CKPT_OUT 0x7ffffff7 /* the first rank's words to every other TP rank: "send" or the outcome */
#define _PP_CKPT_SEND 0x53454e44    /* "SEND": the first rank asks for the next slice (not a pp_result) */
static pp_result _pp_tied_check(const pp_transport* t, const int pair[2], int* role, pp_error* err) {
    if (!t || !pair) return _pp_fail(err, PP_ERR_INVALID, "tied layers need a transport and a rank pair");
    if (pair[0] < 0 || pair[1] < 0 || pair[0] >= t->size || pair[1] >= t->size)
        return _pp_fail(err, PP_ERR_INVALID, "tied pair {%d, %d} is outside the transport's %d ranks", pair[0], pair[1],
                        t->size);
    *role = (t->rank == pair[0] ? 1 : 0) | (t->rank == pair[1] ? 2 : 0);
    if ((*role == 1 || *role == 2) && (!t->isend || !t->irecv || !t->wait))
        return _pp_fail(err, PP_ERR_INVALID, "tied layers across ranks need isend/irecv/wait");
    return PP_OK;
}

pp_result pp_tied_sync_weights(const pp_transport* t, const int pair[2], void* w_a, void* w_b, size_t bytes,
                               double timeout_s, pp_error* err) {
    pp_request rq;
    pp_result rc;
    int role;
    if ((rc = _pp_tied_check(t, pair, &role, err)) != PP_OK) return rc;
    if (role == 0 || bytes == 0) return PP_OK;
    if (role == 3) {
        if (!w_a || !w_b) return _pp_fail(err, PP_ERR_INVALID, "rank %d holds both tied copies: pass both", t->rank);
        if (w_a != w_b) memcpy(w_b, w_a, bytes);
        return PP_OK;
    }
    if (role == 1) {
        if (!w_a) return _pp_fail(err, PP_ERR_INVALID, "rank %d holds tied copy a, which is NULL", t->rank);
        if ((rc = t->isend(t->self, pair[1], _PP_TAG_TIED, w_a, bytes, &rq)) != PP_OK)
            return _pp_fail(err, rc, "rank %d: sending the tied weights to rank %d", t->rank, pair[1]);
    } else {
        if (!w_b) return _pp_fail(err, PP_ERR_INVALID, "rank %d holds tied copy b, which is NULL", t->rank);
        if ((rc = t->irecv(t->self, pair[0], _PP_TAG_TIED, w_b, bytes, &rq)) != PP_OK)
            return _pp_fail(err, rc, "rank %d: receiving the tied weights from rank %d", t->rank, pair[0]);
    }
    return t->wait(t->self, &rq, timeout_s, err);
}

pp_result pp_tied_sum_grads(const pp_transport* t, const int pair[2], void* grad_a, void* grad_b, size_t count,
                            pp_dtype dtype, double timeout_s, pp_error* err) {
    pp_result rc;
    int role;
    size_t i;
    if ((rc = _pp_tied_check(t, pair, &role, err)) != PP_OK) return rc;
    if (dtype != PP_F32 && dtype != PP_F64 && dtype != PP_F16 && dtype != PP_BF16)
        return _pp_fail(err, PP_ERR_INVALID, "tied gradients must be f32, f64, f16 or bf16 (got %s)", pp_dtype_name(dtype));
    if (role == 0 || count == 0) return PP_OK;
    if (role == 3) {
        if (!grad_a || !grad_b) return _pp_fail(err, PP_ERR_INVALID, "rank %d holds both tied copies: pass both", t->rank);
        if (grad_a == grad_b) return PP_OK; /* one shared buffer already holds the sum */
        if (dtype == PP_F16 || dtype == PP_BF16) { /* added in f32, rounded once */
            uint16_t *ha = (uint16_t*)grad_a, *hb = (uint16_t*)grad_b;
            for (i = 0; i < count; i++) {
                float x[2];
                uint16_t y[2];
                y[0] = ha[i];
                y[1] = hb[i];
                _pp_half_widen(x, y, 2, dtype);
                x[0] += x[1];
                _pp_half_narrow(&ha[i], x, 1, dtype);
                hb[i] = ha[i];
            }
            return PP_OK;
        }
        if (dtype == PP_F32)
            for (i = 0; i < count; i++) ((float*)grad_b)[i] = ((float*)grad_a)[i] += ((float*)grad_b)[i];
        else
            for (i = 0; i < count; i++) ((double*)grad_b)[i] = ((double*)grad_a)[i] += ((double*)grad_b)[i];
        return PP_OK;
    }
    if (!t->allreduce_sum) return _pp_fail(err, PP_ERR_INVALID, "transport has no allreduce_sum");
    if (!(role == 1 ? grad_a : grad_b))
        return _pp_fail(err, PP_ERR_INVALID, "rank %d: its tied gradient copy is NULL", t->rank);
    if (dtype == PP_F16 || dtype == PP_BF16)
        return _pp_half_sum(t, pair, 2, role == 1 ? grad_a : grad_b, count, dtype, 1.0, timeout_s, err, -1);
    return t->allreduce_sum(t->self, role == 1 ? grad_a : grad_b, count, dtype, pair, 2, timeout_s, err);
}

/* >>impl-tp: tensor-parallel collectives over a transport's isend/irecv/wait (>>tp). */
#define _PP_TAG_TP_RS 0x7ffffff2 /* reduce-scatter blocks, to their owner */
#define _PP_TAG_TP_AG 0x7ffffff3 /* all-gather blocks, to every member */
#define _PP_TAG_TP_BND 0x7ffffff5 /* a split boundary's slices, to every member (pp_stage_desc.tp) */

/* The step identity of a stage's TP messages. A failed step can leave TP messages behind (a
   member sent its block or slice to one that had stopped: its layer failed, its pipeline was
   aborted); on a TP transport nobody aborts or resets, they would meet the next step's first
   collective or gather on the same tag and be summed in silently. So inside pp_stage_step and
   pp_stage_eval (the boundary gathers, and every pp_tp_* call its layers and hooks make on the
   stage's thread) the tags carry the stage's step count, the same on every rank of the grid
   whatever failed (as pp_dp_overlap's): _PP_TAG_TP_STEP + (count mod 8192) * 3 + kind, under
   32751 (pipeline_mpi.h gives a split communicator MPI's least MPI_TAG_UB, 32767, less its 16
   reserved tags). Outside a step the fixed tags above. A leftover could only meet the step 8192
   steps later: pp_threads_reset drops them, an aborted MPI or NCCL transport is made again. */
#define _PP_TAG_TP_STEP 0x100
/* What a stage's step tells the TP collectives its layers make on its thread: the step count
   (the tags), and whether the stage was given its TP group (pp_stage_desc.tp). */
typedef struct _pp_tp_ctx {
    const int32_t* step;
    int tp_n;                       /* the stage's TP group size (1: none given) */
    char why[200];                  /* ": " and what _pp_tp_declared refused this step ("" if nothing) */
} _pp_tp_ctx;
static pthread_once_t _pp_tp_once = PTHREAD_ONCE_INIT;
static pthread_key_t _pp_tp_key;
static int _pp_tp_key_ok;
static void _pp_tp_key_make(void) { _pp_tp_key_ok = pthread_key_create(&_pp_tp_key, NULL) == 0; }

static int _pp_tp_step_tag(int fixed, int64_t id) {
#ifdef PP_TEST_TP_NO_STEP_TAG /* negative control (build/tp-controls): a failed step's TP leftovers match */
    (void)id;
    return fixed;
#else
    return _PP_TAG_TP_STEP + (int)((uint64_t)id & 0x1fffu) * 3 +
           (fixed == _PP_TAG_TP_RS ? 0 : fixed == _PP_TAG_TP_AG ? 1 : 2);
#endif
}

/* The stage step this thread runs (_pp_tp_enter), or NULL. */
static _pp_tp_ctx* _pp_tp_cur(void) {
    pthread_once(&_pp_tp_once, _pp_tp_key_make);
    return _pp_tp_key_ok ? (_pp_tp_ctx*)pthread_getspecific(_pp_tp_key) : NULL;
}

/* fixed, or its step's tag where this thread runs a stage's step (_pp_tp_enter). */
static int _pp_tp_tag(int fixed) {
    const _pp_tp_ctx* c = _pp_tp_cur();
    return c ? _pp_tp_step_tag(fixed, *c->step) : fixed;
}

/* A stage's step begins on this thread: its TP collectives carry *c->step (read at each call);
   returns what was set before, for _pp_tp_leave. */
static void* _pp_tp_enter(const _pp_tp_ctx* c) {
    void* prev;
    pthread_once(&_pp_tp_once, _pp_tp_key_make);
    if (!_pp_tp_key_ok) return NULL;
    prev = pthread_getspecific(_pp_tp_key);
    pthread_setspecific(_pp_tp_key, c); /* on failure the layers keep the fixed tags: a mismatch, not a match */
    return prev;
}

/* A layer's TP collective over n > 1 ranks inside a stage's step whose stage was given no TP
   group (pp_stage_desc.tp NULL, the group reached another way, e.g. model.ctx): refused. Such a
   stage cannot agree its step's outcome over the group, so a layer failing on one TP rank after
   its last collective left the others returning PP_OK with gradients the failed one never got.
   Every member of the group is configured alike and refuses alike, before any message. */
static pp_result _pp_tp_declared(int n, const char* what, pp_error* err) {
    _pp_tp_ctx* c;
#ifdef PP_TEST_TP_UNDECLARED_OK /* negative control (build/tp-controls): allowed, as before */
    return PP_OK;
#endif
    if (n <= 1 || !(c = _pp_tp_cur()) || c->tp_n > 1) return PP_OK;
    snprintf(c->why, sizeof c->why, ": its %s over %d ranks was refused: the stage was given no TP group (set "
             "pp_stage_desc.tp, with tp_whole for whole boundaries)", what, n);
    return _pp_fail(err, PP_ERR_INVALID, "%s over %d ranks inside a stage that was given no TP group: set "
                    "pp_stage_desc.tp (with tp_whole for whole boundaries), so the step's outcome is agreed over it", what, n);
}
static const char* _pp_tp_why(void) {
    const _pp_tp_ctx* c = _pp_tp_cur();
    return c ? c->why : "";
}
static void _pp_tp_leave(void* prev) {
    if (_pp_tp_key_ok) pthread_setspecific(_pp_tp_key, prev);
}

int pp_group_rank(const pp_group* g) {
    int i;
    if (!g || !g->t) return 0;
    if (!g->ranks) return g->t->rank;
    for (i = 0; i < g->n_ranks; i++)
        if (g->ranks[i] == g->t->rank) return i;
    return -1;
}

int pp_group_size(const pp_group* g) {
    if (!g || !g->t) return 1;
    return g->ranks ? g->n_ranks : g->t->size;
}

void pp_tp_block(size_t count, int n, int i, size_t* off, size_t* len) {
    size_t q, r, k;
    if (n < 1 || i < 0 || i >= n) {
        if (off) *off = 0;
        if (len) *len = 0;
        return;
    }
    q = count / (size_t)n;
    r = count % (size_t)n;
    k = (size_t)i;
    if (off) *off = k * q + (k < r ? k : r);
    if (len) *len = q + (k < r ? 1 : 0);
}

/* What one member sends to member i (sp, sb bytes) and receives from it (rp, rb bytes). */
typedef struct _pp_tp_msg {
    const void* sp;
    void* rp;
    size_t sb, rb;
} _pp_tp_msg;

/* The executor's probe of a retiring block waits this long for a send (>>impl-stage-exec); a
   transport keeps a send posted when a wait this short runs out. */
#ifndef _PP_RETIRE_WAIT_S
#define _PP_RETIRE_WAIT_S 1.0
#endif
/* Every receive posted, then every send, inside the transport's group where it has one; then
   every request waited for, in posting order. A failure cancels the receives not yet waited for
   (where the transport can) and waits for the sends (their buffers are the caller's): at least
   2 * _PP_RETIRE_WAIT_S, so that no transport takes the wait for a probe and keeps the send. */
static pp_result _pp_tp_xchg(const pp_transport* t, const int* ranks, int n, int me, int tag, const _pp_tp_msg* m,
                             double timeout_s, pp_error* err) {
    pp_request* rq;
    char* is_recv;
    int i, k = 0, w, in_group = 0;
    pp_result rc = PP_OK, r2;
    rq = (pp_request*)PP_MALLOC((size_t)2 * (size_t)n * (sizeof *rq + 1));
    if (!rq) return _pp_fail(err, PP_ERR_NOMEM, "%d requests of a TP collective", 2 * n);
    is_recv = (char*)(rq + 2 * n);
    if (t->group_start && t->group_end) {
        if ((rc = t->group_start(t->self)) != PP_OK) {
            PP_FREE(rq);
            return _pp_fail(err, rc, "rank %d: TP collective: group start", t->rank);
        }
        in_group = 1;
    }
    for (i = 0; i < n && rc == PP_OK; i++) {
        if (i == me || m[i].rb == 0) continue;
        memset(&rq[k], 0, sizeof rq[k]);
        if ((rc = t->irecv(t->self, ranks[i], tag, m[i].rp, m[i].rb, &rq[k])) != PP_OK)
            _pp_fail(err, rc, "rank %d: TP collective: receive from rank %d", t->rank, ranks[i]);
        else
            is_recv[k++] = 1;
    }
    for (i = 0; i < n && rc == PP_OK; i++) {
        if (i == me || m[i].sb == 0) continue;
        memset(&rq[k], 0, sizeof rq[k]);
        if ((rc = t->isend(t->self, ranks[i], tag, m[i].sp, m[i].sb, &rq[k])) != PP_OK)
            _pp_fail(err, rc, "rank %d: TP collective: send to rank %d", t->rank, ranks[i]);
        else
            is_recv[k++] = 0;
    }
    if (in_group && (r2 = t->group_end(t->self)) != PP_OK && rc == PP_OK)
        rc = _pp_fail(err, r2, "rank %d: TP collective: group end", t->rank);
    for (w = 0; w < k; w++) {
        if (rc == PP_OK) {
            rc = t->wait(t->self, &rq[w], timeout_s, err);
        } else if (is_recv[w] && t->cancel) {
            t->cancel(t->self, &rq[w]);
        } else {
            pp_error e2;
            double ts = timeout_s > 2 * _PP_RETIRE_WAIT_S ? timeout_s : 2 * _PP_RETIRE_WAIT_S;
            t->wait(t->self, &rq[w], ts, &e2); /* the first failure is the one reported */
        }
    }
    PP_FREE(rq);
    return rc;
}

/* The group's transport, ranks, size, this member's place and the deadline; *n = 1 for a NULL
   group. dtype and the buffers checked. */
static pp_result _pp_tp_setup(const pp_group* g, const void* a, const void* b, size_t count, pp_dtype dtype,
                              const char* what, int* all, const int** ranks, int* n, int* me, double* timeout_s,
                              pp_error* err) {
    const pp_transport* t = g ? g->t : NULL;
    size_t es = pp_dtype_size(dtype);
    pp_result rc;
    int i;
    *ranks = NULL;
    *n = 1;
    *me = 0;
    *timeout_s = g && g->timeout_s > 0 ? g->timeout_s : PP_DEFAULT_TIMEOUT_S;
    if (dtype != PP_F32 && dtype != PP_F64 && dtype != PP_F16 && dtype != PP_BF16)
        return _pp_fail(err, PP_ERR_INVALID, "%s: dtype %s: f32, f64, f16 or bf16 only", what,
                        (int)dtype >= 0 && dtype < PP_DTYPE_COUNT ? pp_dtype_name(dtype) : "unknown");
    if (count > (size_t)-1 / 2 / es)
        return _pp_fail(err, PP_ERR_INVALID, "%s: %zu elements of %s overflow a size", what, count, pp_dtype_name(dtype));
    if (count > 0 && (!a || !b)) return _pp_fail(err, PP_ERR_INVALID, "%s: a NULL buffer for %zu elements", what, count);
    if (!t) return PP_OK;
    if (!g->ranks) {
        if (t->size < 1 || t->size > PP_MAX_RANKS)
            return _pp_fail(err, PP_ERR_INVALID, "%s: transport has %d ranks", what, t->size);
        for (i = 0; i < t->size; i++) all[i] = i;
        *ranks = all;
        *n = t->size;
    } else {
        *ranks = g->ranks;
        *n = g->n_ranks;
    }
    if (*n > 1 && (!t->isend || !t->irecv || !t->wait))
        return _pp_fail(err, PP_ERR_INVALID, "%s: the group's transport has no isend/irecv/wait", what);
    if ((rc = _pp_check_group(t, *ranks, *n, err)) != PP_OK) return rc;
    for (i = 0; i < *n; i++)
        if ((*ranks)[i] == t->rank) *me = i;
    return PP_OK;
}

/* acc (len elements: float, or double for f64) = src's elements widened; or += them. */
static void _pp_tp_widen(void* acc, const void* src, size_t len, pp_dtype dt, int add) {
    size_t j;
    if (dt == PP_F64) {
        double* a = (double*)acc;
        const double* s = (const double*)src;
        if (add)
            for (j = 0; j < len; j++) a[j] += s[j];
        else
            for (j = 0; j < len; j++) a[j] = s[j];
    } else if (dt == PP_F32) {
        float* a = (float*)acc;
        const float* s = (const float*)src;
        if (add)
            for (j = 0; j < len; j++) a[j] += s[j];
        else
            for (j = 0; j < len; j++) a[j] = s[j];
    } else {
        float* a = (float*)acc;
        const uint16_t* s = (const uint16_t*)src;
        int f16 = dt == PP_F16;
        for (j = 0; j < len; j++) {
            float x = f16 ? pp_f16_to_f32(s[j]) : pp_bf16_to_f32(s[j]);
            a[j] = add ? a[j] + x : x;
        }
    }
}

/* dst (len elements of dt) = acc, rounded once for f16 and bf16. */
static void _pp_tp_store(void* dst, const void* acc, size_t len, pp_dtype dt) {
    if (dt == PP_F32 || dt == PP_F64)
        memcpy(dst, acc, len * pp_dtype_size(dt));
    else
        _pp_half_narrow((uint16_t*)dst, (const float*)acc, len, dt);
}

/* The sum of src[order[0]], src[order[1]], ... (each len elements) into dst. */
static pp_result _pp_tp_sum(void* dst, const void* const* src, const int* order, int n, size_t len, pp_dtype dt,
                            pp_error* err) {
    size_t as = dt == PP_F64 ? sizeof(double) : sizeof(float);
    void* acc;
    int i;
    if (len == 0) return PP_OK;
    if (!(acc = PP_MALLOC(len * as))) return _pp_fail(err, PP_ERR_NOMEM, "TP sum of %zu elements", len);
    for (i = 0; i < n; i++) _pp_tp_widen(acc, src[order ? order[i] : i], len, dt, i > 0);
    _pp_tp_store(dst, acc, len, dt);
    PP_FREE(acc);
    return PP_OK;
}

static pp_result _pp_tp_rs(const pp_transport* t, const int* ranks, int n, int me, const void* send, void* recv,
                           size_t count, pp_dtype dt, double timeout_s, pp_error* err) {
    size_t es = pp_dtype_size(dt), off, len, o, l;
    _pp_tp_msg* m;
    const void** src;
    char* tmp;
    pp_result rc;
    int i;
    pp_tp_block(count, n, me, &off, &len);
    m = (_pp_tp_msg*)PP_MALLOC((size_t)n * (sizeof *m + sizeof *src) + (size_t)n * len * es);
    if (!m) return _pp_fail(err, PP_ERR_NOMEM, "TP reduce-scatter: %d blocks of %zu elements", n, len);
    src = (const void**)(m + n);
    tmp = (char*)(src + n);
    for (i = 0; i < n; i++) {
        pp_tp_block(count, n, i, &o, &l);
        m[i].sp = (const char*)send + o * es;
        m[i].sb = l * es;
        m[i].rp = tmp + (size_t)i * len * es;
        m[i].rb = len * es;
        src[i] = i == me ? (const void*)((const char*)send + off * es) : (const void*)m[i].rp;
    }
    rc = _pp_tp_xchg(t, ranks, n, me, _pp_tp_tag(_PP_TAG_TP_RS), m, timeout_s, err);
    if (rc == PP_OK) rc = _pp_tp_sum(recv, src, NULL, n, len, dt, err);
    PP_FREE(m);
    return rc;
}

/* The all-gather of count units of es bytes (an element, or a boundary's row), on tag. */
static pp_result _pp_tp_ag_units(const pp_transport* t, const int* ranks, int n, int me, const void* send, void* recv,
                                 size_t count, size_t es, int tag, double timeout_s, pp_error* err) {
    size_t off, len, o, l;
    _pp_tp_msg* m;
    pp_result rc;
    int i;
    pp_tp_block(count, n, me, &off, &len);
    /* in place (a boundary's gather: its rows already there, host or device memory) moves nothing */
    if (len && (const char*)recv + off * es != (const char*)send) memmove((char*)recv + off * es, send, len * es);
    if (n == 1) return PP_OK;
    if (!(m = (_pp_tp_msg*)PP_MALLOC((size_t)n * sizeof *m)))
        return _pp_fail(err, PP_ERR_NOMEM, "TP all-gather: %d blocks", n);
    for (i = 0; i < n; i++) {
        pp_tp_block(count, n, i, &o, &l);
        m[i].sp = (const char*)recv + off * es;
        m[i].sb = len * es;
        m[i].rp = (char*)recv + o * es;
        m[i].rb = l * es;
    }
    rc = _pp_tp_xchg(t, ranks, n, me, tag, m, timeout_s, err);
    PP_FREE(m);
    return rc;
}

static pp_result _pp_tp_ag(const pp_transport* t, const int* ranks, int n, int me, const void* send, void* recv,
                           size_t count, pp_dtype dt, double timeout_s, pp_error* err) {
    return _pp_tp_ag_units(t, ranks, n, me, send, recv, count, pp_dtype_size(dt), _pp_tp_tag(_PP_TAG_TP_AG), timeout_s, err);
}

void pp_tp_boundary_bytes(int64_t rows, size_t row_bytes, int tp, int tp_rank, size_t* sent, size_t* gather_sent) {
    size_t len = rows > 0 ? (size_t)rows : 0;
    if (tp > 1) pp_tp_block(len, tp, tp_rank, NULL, &len);
    if (sent) *sent = len * row_bytes;
    if (gather_sent) *gather_sent = tp > 1 ? len * row_bytes * (size_t)(tp - 1) : 0;
}

pp_result pp_tp_reducescatter(const pp_group* g, const void* send, void* recv, size_t count, pp_dtype dtype,
                              pp_error* err) {
    int all[PP_MAX_RANKS], n, me;
    const int* ranks;
    double to;
    pp_result rc = _pp_tp_setup(g, send, recv, count, dtype, "TP reduce-scatter", all, &ranks, &n, &me, &to, err);
    if (rc == PP_OK) rc = _pp_tp_declared(n, "TP reduce-scatter", err);
    if (rc != PP_OK) return rc;
    if (n == 1) {
        if (count) memmove(recv, send, count * pp_dtype_size(dtype));
        return PP_OK;
    }
    return _pp_tp_rs(g->t, ranks, n, me, send, recv, count, dtype, to, err);
}

pp_result pp_tp_allgather(const pp_group* g, const void* send, void* recv, size_t count, pp_dtype dtype,
                          pp_error* err) {
    int all[PP_MAX_RANKS], n, me;
    const int* ranks;
    double to;
    pp_result rc = _pp_tp_setup(g, send, recv, count, dtype, "TP all-gather", all, &ranks, &n, &me, &to, err);
    if (rc == PP_OK) rc = _pp_tp_declared(n, "TP all-gather", err);
    if (rc != PP_OK) return rc;
    return _pp_tp_ag(n > 1 ? g->t : NULL, ranks, n, me, send, recv, count, dtype, to, err);
}

pp_result pp_tp_allreduce(const pp_group* g, void* buf, size_t count, pp_dtype dtype, pp_error* err) {
    int all[PP_MAX_RANKS], n, me;
    const int* ranks;
    double to;
    size_t es = pp_dtype_size(dtype), len;
    void* blk;
    pp_result rc = _pp_tp_setup(g, buf, buf, count, dtype, "TP all-reduce", all, &ranks, &n, &me, &to, err);
    if (rc == PP_OK) rc = _pp_tp_declared(n, "TP all-reduce", err);
    if (rc != PP_OK || n == 1 || count == 0) return rc;
#ifdef PP_TEST_TP_UNORDERED /* negative control (tests/test_tp.c): each member sums every copy itself, its own first */
    {
        _pp_tp_msg* m = (_pp_tp_msg*)PP_MALLOC((size_t)n * (sizeof *m + sizeof(void*) + sizeof(int) + count * es));
        const void** src;
        int* order;
        char* tmp;
        int i;
        if (!m) return _pp_fail(err, PP_ERR_NOMEM, "TP all-reduce");
        src = (const void**)(m + n);
        order = (int*)(src + n);
        tmp = (char*)(order + n);
        for (i = 0; i < n; i++) {
            m[i].sp = buf;
            m[i].sb = m[i].rb = count * es;
            m[i].rp = tmp + (size_t)i * count * es;
            src[i] = i == me ? (const void*)buf : (const void*)m[i].rp;
            order[i] = (me + i) % n;
        }
        rc = _pp_tp_xchg(g->t, ranks, n, me, _pp_tp_tag(_PP_TAG_TP_RS), m, to, err);
        if (rc == PP_OK) rc = _pp_tp_sum(buf, src, order, n, count, dtype, err);
        PP_FREE(m);
        (void)len;
        (void)blk;
        return rc;
    }
#else
    pp_tp_block(count, n, me, NULL, &len);
    if (!(blk = PP_MALLOC(len ? len * es : 1))) return _pp_fail(err, PP_ERR_NOMEM, "TP all-reduce block of %zu elements", len);
    rc = _pp_tp_rs(g->t, ranks, n, me, buf, blk, count, dtype, to, err);
    if (rc == PP_OK) rc = _pp_tp_ag(g->t, ranks, n, me, blk, buf, count, dtype, to, err);
    PP_FREE(blk);
    return rc;
#endif
}

/* >>impl-stage
   The executor. Memory comes in blocks from a per-stage pool: a stash per (micro-batch, chunk)
   from its F to its B, and a gradient workspace for the length of one B; when W is deferred (the
   schedule has W actions and the model a weight_grad) both live on until that W. A block whose sends
   are still in flight retires until the transport says they completed, then returns to the
   pool. Receives of the next action are posted before the current one computes. Where two
   consecutive stages share a rank (the turn of the V map) nothing is sent: the later stage reads
   its input in the earlier one's stash and the earlier one its output gradient in the later
   one's workspace, each block referenced (refs) until the reader lets go (_pp_turn). */
/* A shape header: what PER_MESSAGE sends before every activation transfer, and AUTO when
   a shape is new or changed. Fixed size, so it can always be received. */
typedef struct _pp_hdr {
    int64_t n;
    int64_t t[PP_MAX_TENSORS][3];   /* rows, cols, dtype */
    int64_t mb_rows, mb_seqs;       /* the sender's micro-batch: the receiver's must be the same */
    uint64_t mb_sig;
} _pp_hdr;

/* AUTO's trailer, after the first tensor of every activation message. */
#define _PP_TRAILER 16
#define _PP_TRAILER_MAGIC 0x50505452u /* "PPTR" */
enum { _PP_TRAILER_OK = 1, _PP_TRAILER_RESIZE = 2 };

#define _PP_MAX_REQ (PP_MAX_TENSORS + 2)

typedef struct _pp_block {
    struct _pp_block* next;
    size_t cap;
    size_t want;                    /* bytes its user asked for; 0 while in the pool */
    int idle;                       /* steps ended in the pool without being taken */
    int refs;                       /* hand-overs at the turn of the V that still read it */
    int put;                        /* its holder let go while refs > 0: the last release pools it */
    int n_req;
    pp_request req[_PP_MAX_REQ];
    _pp_hdr hdr;                    /* a header this block's sends carry */
    unsigned char* data;
} _pp_block;

/* An action whose block is taken and whose receives are posted. */
/* A neighbour for the plan check: a rank this one exchanges boundary tensors with. */
typedef struct _pp_nb {
    int rank;
    int n_rec;                      /* records: shared boundaries x micro-batches */
    size_t off;                     /* into fp_mine / fp_theirs, in int64 words */
    int state;                      /* 0: nothing posted, 1: posted, 2: checked */
    pp_request sreq, rreq;
} _pp_nb;

/* Where one action's layers find their tensors: boundaries la..lb (PP_MAX_TENSORS slots each) and
   their gradients, each layer's scratch. A view is a handle on arrays the stage keeps per prepared
   action (pp_stage.pv[idx & 1]): the action being run and the next one being prepared never share
   them. */
typedef struct _pp_view {
    pp_tensor *act, *dact;          /* [(max_layers+1)*PP_MAX_TENSORS] */
    int* nact;                      /* [max_layers+1] */
    void **saved, **bsaved;         /* [max_layers] the scratch kept to W (or B), the B-only one */
} _pp_view;

typedef struct _pp_prep {
    int idx;                        /* action index, -1 when empty */
    _pp_block* blk;
    int n_req;
    pp_request req[_PP_MAX_REQ];
    size_t req_bytes[_PP_MAX_REQ];
    int want_hdr;                   /* the first thing to receive is a shape header */
    int auto_first;                 /* AUTO: only tensor 0 (+ trailer) is posted */
    _pp_hdr hdr;
} _pp_prep;

struct pp_stage {
    pp_stage_desc d;
    /* pp_stage_desc.tp resolved: tp_n > 1 splits the replicated boundaries (unless tp_whole) */
    const pp_transport* tp_t;
    int* tp_ranks;                  /* [tp_n] the group's ranks on tp_t, TP rank order */
    int tp_n, tp_me;
    double tp_to;
    int tp_agree_off;               /* pp_pipeline's stages: it stops its whole grid itself (_pp_tp_agree) */
    int tp_split;                   /* boundaries split over the TP group (pp_stage_desc.tp without tp_whole) */
    double t_fail;                  /* when this step first failed on this rank (_pp_now; 0: it has not) */
    _pp_tp_ctx tp_ctx;              /* for the TP collectives of its layers (_pp_tp_enter) */
    const pp_action* list;
    int n_list, p, v, S, L, max_layers;
    pp_error err;
    _pp_plan plan;
    const pp_batch* batch;
    _pp_block** live;               /* [m*v] stash of (mb, chunk) between F and B (or W); with the
                                       four below, one allocation */
    _pp_block** blive;              /* [m*v] its B-only scratch, between F and B */
    _pp_block** rlive;              /* [m*v] its recompute block (_pp_rc_carve part 1): through F, and
                                       from the recompute before B to B (or W) */
    _pp_block** rblive;             /* [m*v] part 2 (what only B reads): through F, and from the
                                       recompute to B */
    double* smem;                   /* [m*v] the stash's share in live_mem, until its release */
    unsigned char* rc;              /* [L] the stage's copy of pp_stage_desc.recompute, or NULL */
    _pp_block** wlive;              /* [m*v] B's gradient workspace, kept for a deferred W */
    _pp_block** src;                /* [m*v] a stage fed by this rank: the stash holding its input */
    _pp_block** gin;                /* [m*v] a stage feeding this rank: the workspace holding its
                                       output gradient (the next stage's input gradient) */
    int live_cap;
    int defer_w;                    /* schedule has W actions and the model a weight_grad */
    int* gfinal;                    /* [v] list index after which chunk k's gradients are final */
    int draining;                   /* a layer failed this step: the rest runs without computing */
    int drained;                    /* the step's failure was drained: no abort */
    pp_result drain_rc;             /* that failure */
    float* mb_loss;
    _pp_block *pool, *retiring;
    size_t pool_held, pool_used, pool_need_max; /* bytes allocated, asked for now, most asked for in a step */
    size_t pool_want_max;           /* the largest block asked for */
    uint64_t pool_sig, pool_sig_last; /* the sizes asked for this step and last step, hashed */
    _pp_view pv[2];                 /* the views' arrays of prep[0] and prep[1]'s actions */
    unsigned char* turn;            /* [S+1] 1 where stages b-1 and b are both this rank's (_pp_turn) */
    _pp_prep prep[2];
    pp_event* events;
    size_t n_events;
    pp_step_stats st;
    int n_live;
    size_t live_bytes;
    double live_mem;                /* stashes alive, the W share counted (pp_step_stats.peak_mem) */
    /* AUTO: shapes last received / sent per (micro-batch, chunk); n < 0 until learned */
    _pp_bnd *learned_in, *learned_out;
    int learned_cap;
    /* BROADCAST: this rank's copy of the step metadata */
    pp_batch bc_batch;
    int32_t* bc_cu;
    int64_t* bc_msg;
    size_t bc_bytes;
    /* >>flight: this rank's record, and pp_stage_step calls so far */
    pp_flight flight;
    int32_t n_steps;
    /* >>impl-stage-agree: failed steps so far (the same on every rank; part of every tag), data
       messages this step per peer, the plan check's neighbours and buffers, the agreement's */
    int32_t gen;
    int32_t *n_sent, *n_recv;       /* [p] */
    int n_nb;
    _pp_nb* nb;                     /* [n_nb] */
    int64_t *fp_mine, *fp_theirs;
    unsigned char* ag_buf;          /* rank 0: [p] records, others: [2] (status, verdict) */
    size_t ag_rec;
    pp_request* ag_req;             /* [p] */
    /* the step's identity from rank 0 (_pp_go): magic, step, generation, the step's kind (1: an
       evaluation), 1 + the rank that gets the evaluation's outputs (0: none); rank 0's sends of it */
    int64_t go[5];
    /* evaluations (pp_stage_eval): the forward-only list made at create (this rank's actions in
       eacts; esched's actions are gone after the proofs), or why there is none (eval_rc,
       eval_why); the step under way is one (eval), its outputs' rank (-1: none) and the caller's
       struct; the last stage's rank; eout[mb] the outputs kept for (or received from) that rank */
    pp_schedule esched;
    pp_action* eacts;
    const pp_action* tlist;         /* the training list while an evaluation runs its own */
    pp_eval_out* ev_out;
    _pp_block** eout;               /* [m], in the live table's allocation */
    int go_sent;
    pp_result eval_rc;
    int n_tlist, eval, ev_rank, last_rank;
    int ev_bad, ev_bad_rank;        /* this evaluation's pp_eval_out.rank is outside the pipeline */
    char eval_why[256];
    pthread_mutex_t step_mu;        /* held by the step under way: a second caller is refused */
    int step_mu_ok;
};

/* A stage's message: "<code>: rank R[ at F0.0 (stage 2)] <what>", one prefix each. `text` may
   be a message recorded before (its own code prefix and "rank R" are dropped, not repeated);
   "rank R at ..." and "rank R stopped waiting ..." read as one phrase. An abort learnt without
   a message (a send refused) gets the failing rank's message from the transport. */
static pp_result _pp_stage_say(pp_stage* s, pp_result code, const pp_action* a, const char* text) {
    char where[64], why[sizeof s->err.msg], own[sizeof s->err.msg];
    const char* body = _pp_strip_code(text, code);
    const char* sep = ": ";
    const char* c = pp_result_str(code);
    char* q;
    size_t k;
    if (s->t_fail == 0) s->t_fail = _pp_now();
    /* a message of this code quoted inside ("...: wait timed out: rank 1 waited ..."): its code
       and this rank go, the rest stays */
    snprintf(own, sizeof own, "%s", body);
    body = own;
    for (q = own; (q = strstr(q, c)) != NULL;) {
        char* rest = q + strlen(c) + 2;
        if (q - own < 2 || q[-2] != ':' || q[-1] != ' ' || rest[-2] != ':' || rest[-1] != ' ') {
            q++;
            continue;
        }
        if ((k = _pp_names_rank(rest, s->d.rank)) != 0) rest += k + (rest[k] == ':' ? 2 : 1);
        memmove(q, rest, strlen(rest) + 1);
    }
    k = _pp_names_rank(body, s->d.rank);
    if (k) {
        body += k;
        if (*body == ':') body++;
        else sep = " ";
        if (*body == ' ') body++;
    } else if (!a && strncmp(body, "at ", 3) == 0) {
        sep = " ";
    }
    where[0] = 0;
    if (a) snprintf(where, sizeof where, " at %c%d.%d (stage %d)", "FBW"[a->op % 3], a->mb, a->chunk, a->stage);
    why[0] = 0;
    if (code == PP_ERR_ABORTED && s->d.transport.abort_reason &&
        !s->d.transport.abort_reason(s->d.transport.self, why, sizeof why))
        why[0] = 0;
    if (why[0] && strstr(body, why)) why[0] = 0; /* said already */
    return _pp_fail(&s->err, code, "rank %d%s%s%s%s%s", s->d.rank, where, sep, body, why[0] ? ": " : "", why);
}

static pp_result _pp_stage_fail(pp_stage* s, pp_result code, const char* fmt, ...) _PP_PRINTF(3, 4);
static pp_result _pp_stage_fail(pp_stage* s, pp_result code, const char* fmt, ...) {
    char tmp[sizeof s->err.msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    return _pp_stage_say(s, code, NULL, tmp);
}

/* Prefix an error someone else recorded in s->err with rank and action context. */
static pp_result _pp_stage_wrap(pp_stage* s, pp_result code, const pp_action* a) {
    char tmp[sizeof s->err.msg];
    memcpy(tmp, s->err.msg, sizeof tmp);
    tmp[sizeof tmp - 1] = 0;
    return _pp_stage_say(s, code, a, tmp);
}

/* >>impl-stage-flight: what the executor records, and what a timeout message says. */
static void _pp_stage_note(pp_stage* s, const pp_action* a, int state, int peer) {
    pp_flight_entry e;
    memset(&e, 0, sizeof e);
    e.a = *a;
    e.state = (int8_t)state;
    e.peer = (int16_t)peer;
    e.step = s->n_steps;
    e.t = _pp_now();
    _pp_flight_add(&s->flight, &e);
    if (s->d.transport.flight_note) s->d.transport.flight_note(s->d.transport.self, &e);
}

/* The rank an action waits for before it can compute (-1: none). */
static int _pp_awaited(const pp_stage* s, const pp_action* a) {
    if (a->op == PP_OP_F) return a->stage > 0 ? a->prev_rank : -1;
    if (a->op == PP_OP_B) return a->stage < s->S - 1 ? a->next_rank : -1;
    return -1;
}

/* The received data of action a came from the peer's action: note it as heard. */
static void _pp_stage_heard(pp_stage* s, const pp_action* a) {
    pp_action pa;
    int r, c, peer = _pp_awaited(s, a);
    if (peer < 0) return;
    memset(&pa, 0, sizeof pa);
    pa.op = a->op;
    pa.mb = a->mb;
    pa.stage = (int16_t)(a->op == PP_OP_F ? a->stage - 1 : a->stage + 1);
    pp_schedule_stage_to_rank(s->d.schedule, pa.stage, &r, &c);
    pa.chunk = (int8_t)c;
    pa.prev_rank = pa.next_rank = -1;
    _pp_stage_note(s, &pa, PP_FLIGHT_HEARD, peer);
}

/* One "rank r: <last done> <age> ago" item for the timeout message. */
static void _pp_explain_rank(char* buf, size_t n, const pp_flight* f, int rank, int step, double now) {
    const pp_flight_entry* e = pp_flight_last(f, PP_FLIGHT_DONE);
    char act[48];
    if (!e)
        snprintf(buf, n, "rank %d: nothing yet", rank);
    else if (e->step != step)
        snprintf(buf, n, "rank %d: %s of step %d, %.3g s ago", rank, _pp_flight_act(act, sizeof act, &e->a),
                 (int)e->step, now - e->t);
    else
        snprintf(buf, n, "rank %d: %s %.3g s ago", rank, _pp_flight_act(act, sizeof act, &e->a), now - e->t);
}

/* Appends to a timeout message the last action each rank completed, the awaited peer first.
   Where the transport cannot show other ranks' records, says what this rank last did and last
   heard from the peer. */
static void _pp_stage_explain(pp_stage* s, int peer) {
    pp_flight* f = (pp_flight*)PP_MALLOC(sizeof *f);
    size_t len = strlen(s->err.msg), cap = sizeof s->err.msg;
    double now = _pp_now();
    char item[160], act[48];
    int i, r;
    if (!f) return;
    if (s->d.transport.flight_get && peer >= 0 && s->d.transport.flight_get(s->d.transport.self, peer, f)) {
        snprintf(s->err.msg + len, cap - len, "; last completed: ");
        for (i = -1; i < s->p; i++) {
            r = i < 0 ? peer : i;
            if (i >= 0 && r == peer) continue;
            if (i >= 0 && !s->d.transport.flight_get(s->d.transport.self, r, f)) continue;
            _pp_explain_rank(item, sizeof item, f, r, s->n_steps, now);
            len = strlen(s->err.msg);
            snprintf(s->err.msg + len, cap - len, "%s%s", i < 0 ? "" : ", ", item);
        }
    } else {
        const pp_flight_entry* h = NULL;
        _pp_explain_rank(item, sizeof item, &s->flight, s->d.rank, s->n_steps, now);
        len = strlen(s->err.msg);
        snprintf(s->err.msg + len, cap - len, "; last completed: %s", item);
        for (i = 0; i < 2; i++)
            if (s->flight.heard[i].t > 0 && s->flight.heard[i].peer == peer) h = &s->flight.heard[i];
        len = strlen(s->err.msg);
        if (h)
            snprintf(s->err.msg + len, cap - len, "; last heard from rank %d: its %s, step %d, %.3g s ago", peer,
                     _pp_flight_act(act, sizeof act, &h->a), (int)h->step, now - h->t);
        else if (peer >= 0)
            snprintf(s->err.msg + len, cap - len, "; nothing heard from rank %d yet", peer);
    }
    PP_FREE(f);
}

pp_result pp_stage_flight(const pp_stage* s, pp_flight* out) {
    if (!s || !out) return PP_ERR_INVALID;
    *out = s->flight;
    out->rank = s->d.rank;
    out->now = _pp_now();
    return PP_OK;
}

void pp_stage_flight_print(FILE* out, const pp_stage* s) {
    pp_flight* f;
    if (!out || !s) return;
    f = (pp_flight*)PP_MALLOC(sizeof *f);
    if (!f) return;
    pp_stage_flight(s, f);
    pp_flight_print(out, f);
    PP_FREE(f);
}

/* >>impl-stage-finite: the NaN/Inf checks: every micro-batch's loss, on by default
   (pp_stage_desc.allow_nonfinite_loss), and with check_finite every tensor a layer wrote. */
static int _pp_nonfinite_at(const pp_tensor* t, int64_t* at) {
    int64_t i, n = t->rows * t->cols;
    if (!t->data) return 0;
    switch (t->dtype) {
    case PP_F32:
        for (i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, (const unsigned char*)t->data + 4 * i, 4);
            if ((u & 0x7f800000u) == 0x7f800000u) { *at = i; return 1; }
        }
        return 0;
    case PP_F64:
        for (i = 0; i < n; i++) {
            uint64_t u;
            memcpy(&u, (const unsigned char*)t->data + 8 * i, 8);
            if ((u & 0x7ff0000000000000ull) == 0x7ff0000000000000ull) { *at = i; return 1; }
        }
        return 0;
    case PP_F16:
    case PP_BF16: {
        uint16_t mask = t->dtype == PP_F16 ? 0x7c00u : 0x7f80u;
        for (i = 0; i < n; i++) {
            uint16_t u;
            memcpy(&u, (const unsigned char*)t->data + 2 * i, 2);
            if ((u & mask) == mask) { *at = i; return 1; }
        }
        return 0;
    }
    default: return 0;
    }
}

/* The first of n tensors with a NaN or Inf: its index (the element's in *at), or -1. */
static int _pp_nonfinite_first(const pp_tensor* ts, int n, int64_t* at) {
    int k;
    for (k = 0; k < n; k++)
        if (_pp_nonfinite_at(&ts[k], at)) return k;
    return -1;
}

/* what: "input", "output", ...; head says whose tensor it is and ends with ':'. */
static pp_result _pp_nonfinite_fail(pp_stage* s, const pp_action* a, const char* head, const char* what, int k,
                                    const pp_tensor* t, int64_t at) {
    char act[48];
    int64_t cols = t->cols ? t->cols : 1;
    return _pp_stage_fail(s, PP_ERR_NONFINITE, "at %s: %s %s %d [%lld x %lld] %s, row %lld, col %lld, micro-batch %d",
                          _pp_flight_act(act, sizeof act, a), head, what, k, (long long)t->rows, (long long)t->cols,
                          pp_dtype_name(t->dtype), (long long)(at / cols), (long long)(at % cols), (int)a->mb);
}

/* The loss of the action's micro-batch (the last stage's F). scanned: check_finite found every
   tensor of the stage finite, so the loss layer made the NaN/Inf itself. */
static pp_result _pp_check_loss(pp_stage* s, const pp_action* a, const float* loss, int scanned) {
    char act[48];
    uint32_t u;
#ifdef PP_TEST_NO_LOSS_CHECK /* negative control (tests/test_reliability.c): a NaN loss passes by default */
    if (!scanned) return PP_OK;
#endif
    memcpy(&u, loss, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) return PP_OK;
    if (scanned)
        return _pp_stage_fail(s, PP_ERR_NONFINITE,
                              "at %s: the loss of micro-batch %d is %g: layer %d (%s) made it from finite inputs",
                              _pp_flight_act(act, sizeof act, a), (int)a->mb, (double)*loss, s->L - 1,
                              _pp_layer_name(&s->d.model, s->L - 1));
    return _pp_stage_fail(s, PP_ERR_NONFINITE,
                          "at %s: the loss of micro-batch %d is %g (pp_stage_desc.check_finite = 1 names the layer that "
                          "made it; allow_nonfinite_loss = 1 lets it pass)",
                          _pp_flight_act(act, sizeof act, a), (int)a->mb, (double)*loss);
}

/* check_finite after F: the stage's input, then each layer's outputs in layer order (the first
   layer that wrote a NaN/Inf is named, not the stage's last), then the loss on the last stage. */
static pp_result _pp_check_finite_f(pp_stage* s, const pp_action* a, int la, int lb, const pp_tensor* act,
                                    const int* nact) {
    char head[160];
    int64_t at = 0;
    int l = la, k;
    if ((k = _pp_nonfinite_first(act, nact[0], &at)) >= 0) {
        if (a->stage == 0) snprintf(head, sizeof head, "the batch's input has a NaN or Inf:");
        else snprintf(head, sizeof head, "the input from stage %d (layer %d's output) has a NaN or Inf:", a->stage - 1, l - 1);
        return _pp_nonfinite_fail(s, a, head, "input", k, &act[k], at);
    }
#ifdef PP_TEST_NO_LAYER_SCAN /* negative control (tests/test_reliability.c): only the stage's output */
    l = lb - 1;
#endif
    for (; l < lb; l++) {
        const pp_tensor* out = &act[(l + 1 - la) * PP_MAX_TENSORS];
        if ((k = _pp_nonfinite_first(out, nact[l + 1 - la], &at)) >= 0) {
            snprintf(head, sizeof head, "layer %d (%s) forward wrote a NaN or Inf:", l, _pp_layer_name(&s->d.model, l));
            return _pp_nonfinite_fail(s, a, head, "output", k, &out[k], at);
        }
    }
    return a->stage == s->S - 1 ? _pp_check_loss(s, a, &s->mb_loss[a->mb], 1) : PP_OK;
}

/* check_finite after B: the output gradient it received, then each layer's input gradients from
   the last layer down (the order backward wrote them). */
static pp_result _pp_check_finite_b(pp_stage* s, const pp_action* a, int la, int lb, const pp_tensor* dact,
                                    const int* nact) {
    char head[160];
    int64_t at = 0;
    int l = lb - 1, k;
    const pp_tensor* d = &dact[(lb - la) * PP_MAX_TENSORS];
    if ((k = _pp_nonfinite_first(d, nact[lb - la], &at)) >= 0) {
        snprintf(head, sizeof head, "the output gradient from stage %d has a NaN or Inf:", a->stage + 1);
        return _pp_nonfinite_fail(s, a, head, "output gradient", k, &d[k], at);
    }
#ifdef PP_TEST_NO_LAYER_SCAN /* only the input gradient the stage sends */
    l = la;
#endif
    for (; l >= la; l--) {
        d = &dact[(l - la) * PP_MAX_TENSORS];
        if ((k = _pp_nonfinite_first(d, nact[l - la], &at)) >= 0) {
            snprintf(head, sizeof head, "layer %d (%s) backward wrote a NaN or Inf:", l, _pp_layer_name(&s->d.model, l));
            return _pp_nonfinite_fail(s, a, head, "input gradient", k, &d[k], at);
        }
    }
    return PP_OK;
}

/* >>impl-stage-map: message tags, the stage's blocks (stashes, workspaces, receive buffers)
   pooled across steps, stages and slots, the turn of the V, shapes from headers. */

/* Every message of a step has its own tag: (direction, micro-batch, boundary, tensor) and the
   step's generation (failed steps so far, mod 8), so nothing a failed step left in a transport
   matches a later step's receive. The tensor slot PP_MAX_TENSORS is the boundary's shape
   header. pp_stage_create checks that the largest tag stays below the reserved ones (for an
   evaluation's too, else pp_stage_eval is refused). An evaluation sends no gradient: its
   outputs to another rank than the last stage's (_pp_eval_exchange) travel as gradients into
   stage 0, which no step sends. */
#define _PP_GEN_BITS 3
static int _pp_tag(const pp_stage* s, int dir, int mb, int boundary_stage, int k) {
    /* an evaluation's messages are those of micro-batches m .. 2m-1: no training message has
       their tags, and pipeline_nccl.h's table of the training list's messages (_ppn_key) does
       not reach them */
    if (s->eval) mb += s->d.schedule->m;
#ifdef PP_TEST_NO_GEN /* negative control (tests/test_agree.c): a failed step's leftovers match */
    return (((mb * s->S + boundary_stage) * (PP_MAX_TENSORS + 1) + k) * 2 + dir) << _PP_GEN_BITS;
#else
    return ((((mb * s->S + boundary_stage) * (PP_MAX_TENSORS + 1) + k) * 2 + dir) << _PP_GEN_BITS) |
           (int)(s->gen & ((1 << _PP_GEN_BITS) - 1));
#endif
}
#define _PP_TAG_RESERVED 0x7ffffff0 /* the library's own tags (all-reduce, tied, ...) from here */
#define _PP_TAG_BROADCAST 0x7ffffff4
#define _PP_TAG_PLAN 0x7ffffffa     /* the plan check between neighbours */
#define _PP_TAG_AGREE 0x7ffffffb    /* a rank's outcome, to rank 0 */
#define _PP_TAG_VERDICT 0x7ffffffc  /* rank 0's verdict, to every rank */
#define _PP_TAG_GO 0x7ffffffd       /* rank 0's step identity, to every rank at step start */

/* A block whose data lives where pp_stage_desc.device says (its header stays on the host). */
static _pp_block* _pp_block_new_dev(pp_stage* s, size_t bytes) {
    _pp_block* b = (_pp_block*)PP_MALLOC(sizeof(_pp_block));
    if (!b) return NULL;
    memset(b, 0, sizeof *b);
    b->cap = bytes;
    b->data = (unsigned char*)s->d.device.alloc(s->d.device.user, bytes ? bytes : 1);
    if (!b->data) {
        PP_FREE(b);
        return NULL;
    }
    return b;
}

/* pp_transport.released, where the transport has it */
static void _pp_released(pp_stage* s, const void* ptr, size_t bytes) {
    if (s->d.transport.released) s->d.transport.released(s->d.transport.self, ptr, bytes);
}

static void _pp_block_free(pp_stage* s, _pp_block* b) {
    if (!b) return;
    if (b->data) _pp_released(s, b->data, 0);
    if (s->d.device.free && b->data) s->d.device.free(s->d.device.user, b->data);
    s->pool_held -= b->cap;
    PP_FREE(b);
}

/* A block that is in the pool no longer counts as asked for; one still sending does. */
static void _pp_block_unuse(pp_stage* s, _pp_block* b) {
    s->pool_used -= b->want;
    b->want = 0;
}
/* ... and a block whose uses are all enqueued and whose sends are done is free: the transport
   hears of it (pp_transport.released). */
static void _pp_block_freed(pp_stage* s, _pp_block* b) {
    _pp_block_unuse(s, b);
    _pp_released(s, b->data, b->cap);
}

/* The device pool under shapes that change every step (varlen batches repacked): blocks of
   the exact size asked for pile up, one for each new size, and a request larger than every free
   block allocates again at any step. So a new device block is made for the largest request the
   stage has seen, plus _PP_POOL_HEADROOM percent, rounded up to one of _PP_POOL_CLASSES sizes
   per power of two; a block too small for that largest request leaves the pool (the largest
   such free block when a request misses; at the end of a step, every one when the sizes asked
   for differ from the last step's, else those the step did not take), so the pool converges
   on as many blocks as the stage holds at once, each large enough for any request like those
   seen (with shapes that stay the same, blocks made for the first step stay: no allocation
   after it). It allocates again only when a request exceeds the largest so far by more than
   the headroom, or the stage holds more blocks at once than ever. And at the end of a step, while
   the pool holds more than _PP_POOL_SLACK times the most the stage's blocks (sending ones
   included) asked for at once in any step, blocks not taken for _PP_POOL_IDLE_STEPS steps go
   back to the device allocator. tests/test_cuda_pipeline.c: 1000 steps of random lengths. */
#ifndef _PP_POOL_CLASSES
#define _PP_POOL_CLASSES 8
#endif
#ifndef _PP_POOL_HEADROOM
#define _PP_POOL_HEADROOM 40
#endif
#ifndef _PP_POOL_SLACK
#define _PP_POOL_SLACK 2
#endif
#ifndef _PP_POOL_WARM_STEPS
#define _PP_POOL_WARM_STEPS 4
#endif
#ifndef _PP_POOL_IDLE_STEPS
#define _PP_POOL_IDLE_STEPS 50
#endif
static size_t _pp_block_class(size_t bytes) {
    size_t top = 256, q;
    if (bytes <= top) return top;
    while (top <= bytes / 2) top *= 2; /* top <= bytes < 2 top */
    q = top / _PP_POOL_CLASSES;
    return (bytes + q - 1) / q * q;
}

/* Unlinks *bp from its list and gives the block back to the device allocator. */
static void _pp_pool_release(pp_stage* s, _pp_block** bp) {
    _pp_block* b = *bp;
    *bp = b->next;
    _pp_block_free(s, b);
    s->st.pool_frees++;
}

/* The size of a new device block for a request of `bytes`; a free block too small for it goes. */
static size_t _pp_pool_grow(pp_stage* s, size_t bytes) {
    _pp_block *b, **bp, **small = NULL;
#ifdef PP_TEST_POOL_EXACT /* the negative control of the varlen pool test: exact sizes, nothing freed */
    return bytes;
#endif
    for (bp = &s->pool; (b = *bp) != NULL; bp = &b->next)
        if (b->cap < bytes && (!small || b->cap > (*small)->cap)) small = bp;
    if (small) _pp_pool_release(s, small);
    if (bytes < s->pool_want_max) bytes = s->pool_want_max;
    return _pp_block_class(bytes + bytes / 100 * _PP_POOL_HEADROOM);
}

/* Device blocks: a transport whose sends complete only once the receiver took the data
   (pipeline_cuda.h, pipeline_nccl.h) leaves blocks retiring for as long as the receiver takes to
   get there, a race between host threads. So the best fit is chosen among free AND retiring
   blocks, as if every send had completed at once (what the host path sees), and a retiring choice
   is waited for (up to _PP_RETIRE_WAIT_S) when no free block fits: after its warm-up (below) the
   pool then grows the same way every step instead of with the timing. A timeout only means the
   pool grows; the wait is bounded, so it cannot deadlock. In the first _PP_POOL_WARM_STEPS steps
   the pool grows instead of waiting: it then also holds the blocks the machine's timing keeps in
   flight, and the later steps' hosts rarely wait for a send (over NCCL in the imitation, queries
   that poll such waits went from 1.8 to 0.4 per transfer). When a free block fits (limit > 0), a
   retiring block whose sends are not all done yet is passed over without waiting: two ranks can
   each wait here for the other to post the receive of its send (interleaved on an H200: 1 s lost
   per such wait, every step). Returns the retiring block if it fits better than `limit` (the best
   free block's cap, 0 if none), else NULL. Among blocks of the same size the one freed longest ago
   whose sends are done now wins (the list runs oldest first), else the one freed longest ago is
   waited for: its receiver has most likely taken the data already, so a GPU transport need not
   copy it early (pipeline_cuda.h, _ppc_side_copy). */
/* 1 while a send of the block may still read it (the transport is asked, never waited for). */
static int _pp_block_busy(pp_stage* s, _pp_block* b) {
    int i;
    for (i = 0; i < b->n_req; i++) {
        int done = b->req[i].done;
        if (!done && s->d.transport.test) s->d.transport.test(s->d.transport.self, &b->req[i], &done);
        if (!done) return 1;
        b->req[i].done = 1;
    }
    return 0;
}

static _pp_block* _pp_block_wait_retiring(pp_stage* s, size_t bytes, size_t limit) {
    _pp_block **bp, **bestp = NULL, *b;
    int i;
    for (bp = &s->retiring; (b = *bp) != NULL; bp = &b->next)
        if (b->cap >= bytes && (!limit || b->cap < limit) && (!bestp || b->cap < (*bestp)->cap)) bestp = bp;
    if (!bestp) return NULL;
    /* the oldest block of that size whose sends are done now; else the oldest one, waited for */
    for (bp = bestp; (b = *bp) != NULL; bp = &b->next)
        if (b->cap == (*bestp)->cap && !_pp_block_busy(s, b)) break;
    if (b) {
        bestp = bp;
    } else if (limit || s->n_steps < _PP_POOL_WARM_STEPS) { /* a free block fits, or still warming up: grow */
        return NULL;
    } else {
        b = *bestp;
        for (i = 0; i < b->n_req; i++)
            if (!b->req[i].done) {
                pp_error scratch;
                if (s->d.transport.wait(s->d.transport.self, &b->req[i], _PP_RETIRE_WAIT_S, &scratch) != PP_OK) return NULL;
                b->req[i].done = 1;
            }
    }
    /* the wait may have unlinked nothing, but list order is unchanged: bestp is still valid */
    _pp_block_freed(s, b);
    *bestp = b->next;
    b->next = NULL;
    b->n_req = 0;
    return b;
}

static _pp_block* _pp_block_take(pp_stage* s, size_t bytes) {
    _pp_block *b, *best = NULL, **bp, **bestp = NULL;
    for (bp = &s->pool; (b = *bp) != NULL; bp = &b->next)
        if (b->cap >= bytes && (!best || b->cap <= best->cap)) {
            best = b;
            bestp = bp;
        }
    if (s->d.device.alloc && (b = _pp_block_wait_retiring(s, bytes, best ? best->cap : 0)) != NULL) {
        if (s->d.device.reuse) s->d.device.reuse(s->d.device.user, b->data, b->cap);
        return b;
    }
    if (best) {
        *bestp = best->next;
        best->next = NULL;
        best->n_req = 0;
        if (s->d.device.reuse) s->d.device.reuse(s->d.device.user, best->data, best->cap);
        return best;
    }
    if (s->d.device.alloc) {
        b = _pp_block_new_dev(s, _pp_pool_grow(s, bytes));
    } else {
        b = (_pp_block*)PP_MALLOC(sizeof(_pp_block) + 64 + (bytes ? bytes : 1));
        if (!b) return NULL;
        memset(b, 0, sizeof *b);
        b->cap = bytes;
        b->data = (unsigned char*)(((uintptr_t)(b + 1) + 63) & ~(uintptr_t)63);
    }
    if (b) {
        s->pool_held += b->cap;
        s->st.pool_allocs++;
    }
    return b;
}

/* A block of at least `bytes` for the step (pool accounting around _pp_block_take). */
static _pp_block* _pp_block_get(pp_stage* s, size_t bytes) {
    _pp_block* b = _pp_block_take(s, bytes);
    if (!b) return NULL;
    b->want = bytes ? bytes : 1;
    b->idle = 0;
    s->pool_sig = s->pool_sig * 1099511628211ull + b->want;
    if (b->want > s->pool_want_max) s->pool_want_max = b->want;
    s->pool_used += b->want;
    if (s->pool_used > s->st.pool_need) s->st.pool_need = s->pool_used;
    return b;
}

/* A block goes back when its holder puts it, unless a hand-over still reads it (refs > 0): then
   it is only marked, and the last _pp_block_unref puts it (nothing else frees or trims it: it is
   on neither the pool's nor the retiring list until then). */
static void _pp_block_put(pp_stage* s, _pp_block* b) {
    if (!b) return;
    if (b->refs > 0) {
        b->put = 1;
        return;
    }
    if (_pp_block_busy(s, b)) { /* at the end: the retiring list runs oldest first */
        _pp_block** bp = &s->retiring;
        while (*bp) bp = &(*bp)->next;
        b->next = NULL;
        *bp = b;
    } else {
        _pp_block_freed(s, b);
        b->next = s->pool;
        s->pool = b;
    }
}

/* The turn of the V: a stage reads a block that another stage of this rank holds. */
static _pp_block* _pp_block_ref(_pp_block* b) {
    b->refs++;
    return b;
}

/* Drops the reference *bp (if any) and clears it; the last one puts a block its holder let go. */
static void _pp_block_unref(pp_stage* s, _pp_block** bp) {
    _pp_block* b = *bp;
    *bp = NULL;
    if (!b || --b->refs > 0 || !b->put) return;
    b->put = 0;
    _pp_block_put(s, b);
}

/* The end of a step's pool work (see _pp_pool_grow): statistics, then device blocks too small
   for the largest request go, and idle ones while the pool is over its slack. */
static void _pp_pool_trim(pp_stage* s) {
    _pp_block *b, **bp, **worst;
    /* the shapes change from step to step (an evaluation's differ from training's: it neither
       judges nor sets the signature, so evaluations between training steps trim nothing more) */
    int changed = !s->eval && s->n_steps > 1 && s->pool_sig != s->pool_sig_last;
    if (!s->eval) s->pool_sig_last = s->pool_sig;
    s->pool_sig = 0;
    if (s->st.pool_need > s->pool_need_max) s->pool_need_max = s->st.pool_need;
    for (b = s->pool; b; b = b->next) b->idle++;
    for (bp = &s->pool; s->d.device.alloc && (b = *bp) != NULL;) {
#ifndef PP_TEST_POOL_EXACT
        if (b->cap < s->pool_want_max && (b->idle > 1 || changed)) {
            _pp_pool_release(s, bp);
            continue;
        }
#endif
        bp = &b->next;
    }
    while (s->d.device.alloc && s->pool_held > _PP_POOL_SLACK * s->pool_need_max) {
        worst = NULL;
        for (bp = &s->pool; (b = *bp) != NULL; bp = &b->next)
            if (b->idle > _PP_POOL_IDLE_STEPS &&
                (!worst || b->idle > (*worst)->idle || (b->idle == (*worst)->idle && b->cap > (*worst)->cap)))
                worst = bp;
#ifdef PP_TEST_POOL_EXACT
        worst = NULL;
#endif
        if (!worst) break;
        _pp_pool_release(s, worst);
    }
    s->st.pool_bytes = s->pool_held;
}

/* Moves retired blocks whose sends completed back to the pool, oldest first (a transport that
   knows its sends complete in order answers the later ones from the first one still running);
   with wait_all, waits for them, newest first (a transport that knows that answers the older
   ones from the newest without asking the device again). */
static pp_result _pp_reap(pp_stage* s, int wait_all) {
    _pp_block **bp = &s->retiring, *b;
    pp_result rc = PP_OK;
    if (wait_all) { /* the list runs oldest first: turn it around */
        _pp_block* rev = NULL;
        while ((b = s->retiring) != NULL) {
            s->retiring = b->next;
            b->next = rev;
            rev = b;
        }
        s->retiring = rev;
    }
    while ((b = *bp) != NULL) {
        int failed = 0;
        if (wait_all) {
            int i;
            for (i = 0; i < b->n_req; i++)
                if (!b->req[i].done) {
                    pp_result r = s->d.transport.wait(s->d.transport.self, &b->req[i], s->d.timeout_s, &s->err);
                    if (r != PP_OK && rc == PP_OK) rc = r;
                    failed |= r != PP_OK;
                    b->req[i].done = 1;
                }
        }
        if (wait_all || !_pp_block_busy(s, b)) {
            *bp = b->next;
            if (!failed) {
                _pp_block_freed(s, b);
            } else { /* its send may still read it: the transport forgets the block */
                _pp_block_unuse(s, b);
                _pp_released(s, b->data, 0);
            }
            b->next = s->pool;
            s->pool = b;
        } else {
            bp = &b->next;
        }
    }
    if (wait_all) _pp_pool_trim(s);
    return rc;
}

static void _pp_free_blocks(pp_stage* s, _pp_block* b) {
    while (b) {
        _pp_block* nx = b->next;
        _pp_block_free(s, b);
        b = nx;
    }
}

static void _pp_stage_layers(const pp_stage* s, int stage, int* a, int* b) {
    *a = s->d.partition[stage];
    *b = s->d.partition[stage + 1];
}

/* Boundary b (stage b-1 to stage b) has both stages on this rank: the turn of the V map, every
   boundary of a one-rank schedule. Nothing travels: stage b's F reads stage b-1's output in
   place, in that F's stash, and stage b-1's B its output gradient in stage b's workspace (each
   block referenced, _pp_block_ref, until the stage that borrowed it lets go). */
static int _pp_turn(const pp_stage* s, int b) { return b > 0 && b < s->S && s->turn[b]; }

/* The table _pp_turn reads, made once at pp_stage_create (the executor asks several times an
   action). */
static void _pp_turn_table(pp_stage* s) {
    int b, ra, rb;
    for (b = 1; b < s->S; b++) {
        pp_schedule_stage_to_rank(s->d.schedule, b - 1, &ra, NULL);
        pp_schedule_stage_to_rank(s->d.schedule, b, &rb, NULL);
        s->turn[b] = ra == s->d.rank && rb == s->d.rank;
#ifdef PP_TEST_NO_HANDOVER /* negative control (tests/test_zb.c): the turn is a message to self */
        s->turn[b] = 0;
#endif
    }
}

/* The (micro-batch, chunk) slot of micro-batch mb in stage `stage` of this rank. */
static int _pp_slot(const pp_stage* s, int mb, int stage) {
    int c;
    pp_schedule_stage_to_rank(s->d.schedule, stage, NULL, &c);
    return mb * s->v + c;
}

/* Sets boundary `stage`'s input shapes of this micro-batch to `in` and describes this stage's
   layers again from them (PER_MESSAGE / AUTO: the sender's shapes win over the local plan). */
static pp_result _pp_apply_shapes(pp_stage* s, const pp_action* a, const _pp_bnd* in) {
    _pp_plan* p = &s->plan;
    _pp_bnd* bd = &p->bnd[(size_t)a->mb * (p->L + 1)];
    pp_layer_desc d;
    pp_result rc;
    int la = s->d.partition[a->stage], lb = s->d.partition[a->stage + 1], l;
    bd[la] = *in;
    for (l = la; l < lb; l++) {
        if ((rc = _pp_describe(&s->d.model, s->d.weights, l, &p->mbs[a->mb], &bd[l], &bd[l + 1], &d, &s->err)) != PP_OK)
            return _pp_stage_wrap(s, rc, a);
        p->saved[(size_t)a->mb * p->L + l] = d.saved_bytes;
        p->bsaved[(size_t)a->mb * p->L + l] = d.b_saved_bytes;
    }
    return PP_OK;
}

static pp_result _pp_hdr_to_bnd(pp_stage* s, const pp_action* a, const _pp_hdr* h, _pp_bnd* out) {
    int k;
    if (h->n < 1 || h->n > PP_MAX_TENSORS)
        return _pp_stage_fail(s, PP_ERR_TRANSPORT, "F%d.%d: shape header from rank %d has %lld tensors", a->mb, a->chunk,
                              a->prev_rank, (long long)h->n);
    memset(out, 0, sizeof *out);
    out->n = (int)h->n;
    for (k = 0; k < out->n; k++) {
        out->t[k].rows = h->t[k][0];
        out->t[k].cols = h->t[k][1];
        out->t[k].dtype = (pp_dtype)h->t[k][2];
        if (h->t[k][2] < 0 || h->t[k][2] >= PP_DTYPE_COUNT || !_pp_shape_ok(h->t[k][0], h->t[k][1], out->t[k].dtype))
            return _pp_stage_fail(s, PP_ERR_TRANSPORT, "F%d.%d: shape header from rank %d is corrupt (tensor %d)", a->mb,
                                  a->chunk, a->prev_rank, k);
    }
    return PP_OK;
}

/* A micro-batch's layout (rows, sequences, offsets) as one number: the two sides of a boundary
   must see the same micro-batch (PER_MESSAGE and AUTO carry it; LOCAL and BROADCAST check it
   with the plan). */
#define _PP_FNV_BASIS 14695981039346656037ull
/* One FNV-1a step: h with the 64-bit word x mixed in. */
static uint64_t _pp_fnv(uint64_t h, uint64_t x) { return (h ^ x) * 1099511628211ull; }

static uint64_t _pp_mb_sig(const pp_microbatch* mb) {
    uint64_t h = _pp_fnv(_PP_FNV_BASIS, (uint64_t)mb->rows);
    int i;
    h = _pp_fnv(h, (uint64_t)(mb->cu_seqlens ? mb->n_seqs : -1));
    for (i = 0; mb->cu_seqlens && i <= mb->n_seqs; i++) h = _pp_fnv(h, (uint64_t)(uint32_t)mb->cu_seqlens[i]);
    return h;
}

/* "3 sequences {0, 2, 4, 9}" (the first 8 bounds) or "no cu_seqlens". */
static void _pp_seq_describe(char* buf, size_t n, const pp_microbatch* mb) {
    int i, len;
    if (!mb->cu_seqlens) {
        snprintf(buf, n, "no cu_seqlens");
        return;
    }
    len = snprintf(buf, n, "%d sequence%s {", mb->n_seqs, mb->n_seqs == 1 ? "" : "s");
    for (i = 0; i <= mb->n_seqs && i < 8 && len > 0 && (size_t)len < n; i++)
        len += snprintf(buf + len, n - (size_t)len, "%s%d", i ? ", " : "", (int)mb->cu_seqlens[i]);
    if (len > 0 && (size_t)len < n) snprintf(buf + len, n - (size_t)len, "%s}", mb->n_seqs >= 8 ? ", ..." : "");
}

/* PER_MESSAGE / AUTO: the sender's view of micro-batch a->mb against this rank's (a layer must
   never see an io->mb that disagrees with its inputs). */
static pp_result _pp_mb_check(pp_stage* s, const pp_action* a, uint64_t sig, int64_t rows, int64_t seqs) {
    const pp_microbatch* mb = &s->plan.mbs[a->mb];
#ifdef PP_TEST_NO_MB_CHECK /* negative control (tests/test_agree.c) */
    return PP_OK;
#endif
    char theirs[64], here[96];
    if (sig == _pp_mb_sig(mb)) return PP_OK;
    /* the same counts, another layout: show this side's bounds, else both sides read alike */
    if (rows >= 0)
        snprintf(theirs, sizeof theirs, "%lld rows, %lld sequences%s", (long long)rows, (long long)seqs,
                 rows == mb->rows && mb->cu_seqlens && seqs == mb->n_seqs ? " at other bounds" : "");
    else
        snprintf(theirs, sizeof theirs, "another layout");
    if (mb->cu_seqlens) _pp_seq_describe(here, sizeof here, mb);
    else snprintf(here, sizeof here, "0 sequences");
    return _pp_stage_fail(s, PP_ERR_INVALID,
                          "micro-batch %d is %lld rows, %s here%s, rank %d sent it as %s: under PER_MESSAGE and "
                          "AUTO every rank's batch must carry the step's rows and cu_seqlens (only the first stage needs "
                          "the tokens); a rank without them needs PP_SHAPES_BROADCAST",
                          a->mb, (long long)mb->rows, here, mb->cu_seqlens ? "" : " (no cu_seqlens)", a->prev_rank, theirs);
}

static void _pp_hdr_mb(const pp_microbatch* mb, _pp_hdr* h) {
    h->mb_rows = mb->rows;
    h->mb_seqs = mb->cu_seqlens ? mb->n_seqs : 0;
    h->mb_sig = _pp_mb_sig(mb);
}

static void _pp_bnd_to_hdr(const pp_tensor* ts, int n, _pp_hdr* h) {
    int k;
    memset(h, 0, sizeof *h);
    h->n = n;
    for (k = 0; k < n; k++) {
        h->t[k][0] = ts[k].rows;
        h->t[k][1] = ts[k].cols;
        h->t[k][2] = (int64_t)ts[k].dtype;
    }
}

static int _pp_same_shapes(const _pp_bnd* x, const pp_tensor* ts, int n) {
    int k;
    if (x->n != n) return 0;
    for (k = 0; k < n; k++)
        if (x->t[k].rows != ts[k].rows || x->t[k].cols != ts[k].cols || x->t[k].dtype != ts[k].dtype) return 0;
    return 1;
}

/* >>impl-stage-agree: every rank agrees on every step.
   - The plan check (LOCAL and BROADCAST, where each rank describes every boundary itself): at
     step start each rank sends each neighbour its view of the boundaries they share, one record
     per (boundary, micro-batch), and checks the neighbour's before it first waits for data from
     it. Views that differ are PP_ERR_SIZE at once, on both sides, naming both. PER_MESSAGE and
     AUTO need no check: the receiver takes the sender's shapes (and checks its micro-batch).
   - The agreement: at step end every rank sends rank 0 its outcome and how many data messages
     it sent to and received from each rank; rank 0 answers everyone with one verdict. A failure
     anywhere, ranks at different steps, or a message sent and never received (the two sides of a
     boundary disagree) make every rank's step fail: no rank returns PP_OK for a step another
     rank failed. Costs 2 (p - 1) small messages per step (pp_step_stats.agree_msgs, t_agree).
   - The step's identity (_pp_go): at step start rank 0 sends every rank its counts of steps and
     failed steps, which they take: the ranks resynchronise at every step (p - 1 messages). It
     also says whether the step is an evaluation (pp_stage_eval, which counts as a step) and
     which rank gets its outputs: a rank that runs another kind of step fails it at once. */
#define _PP_FP_MAGIC 0x50504650 /* "PPFP" */
#define _PP_AG_MAGIC 0x50504147 /* "PPAG" */
#define _PP_FP_WORDS 7          /* per record: n, dtypes, rows and cols of tensor 0, hash of all shapes;
                                   the micro-batch's sequence count (-1: no cu_seqlens) and layout hash */
#define _PP_FP_SHAPE_WORDS 5
#define _PP_FP_HDR 4            /* magic, step, generation, records */
#define _PP_AG_WORDS 5          /* magic, step, generation, result, 1 + the rank that failed (0: none) */
#define _PP_AG_MSG 200

/* Calls fn for each boundary (stage b-1 -> b) between this rank and nb, in stage order. */
static int _pp_nb_boundary(const pp_stage* s, int b, int nb) {
    int ra, rb, c;
    pp_schedule_stage_to_rank(s->d.schedule, b - 1, &ra, &c);
    pp_schedule_stage_to_rank(s->d.schedule, b, &rb, &c);
    return ra != rb && ((ra == s->d.rank && rb == nb) || (rb == s->d.rank && ra == nb));
}

/* The neighbours and the buffers of the plan check and the agreement (pp_stage_create). */
static pp_result _pp_agree_init(pp_stage* s, pp_error* err) {
    int b, r, m = s->d.schedule->m;
    size_t words = 0;
    if (s->p < 2) return PP_OK;
    s->n_sent = (int32_t*)_pp_calloc((size_t)s->p, sizeof *s->n_sent);
    s->n_recv = (int32_t*)_pp_calloc((size_t)s->p, sizeof *s->n_recv);
    s->nb = (_pp_nb*)_pp_calloc((size_t)s->p, sizeof *s->nb);
    s->ag_rec = sizeof(int64_t) * (_PP_AG_WORDS + 2 * (size_t)s->p) + _PP_AG_MSG;
    s->ag_buf = (unsigned char*)_pp_calloc(s->d.rank == 0 ? (size_t)s->p : 2, s->ag_rec);
    s->ag_req = (pp_request*)_pp_calloc((size_t)s->p, sizeof *s->ag_req);
    if (!s->n_sent || !s->n_recv || !s->nb || !s->ag_buf || !s->ag_req)
        return _pp_fail(err, PP_ERR_NOMEM, "step agreement buffers for %d ranks", s->p);
    for (r = 0; r < s->p; r++) {
        int n = 0;
        if (r == s->d.rank) continue;
        for (b = 1; b < s->S; b++) n += _pp_nb_boundary(s, b, r);
        if (!n) continue;
        s->nb[s->n_nb].rank = r;
        s->nb[s->n_nb].n_rec = n * m;
        s->nb[s->n_nb].off = words;
        words += _PP_FP_HDR + (size_t)n * (size_t)m * _PP_FP_WORDS;
        s->n_nb++;
    }
    if (!words) return PP_OK;
    s->fp_mine = (int64_t*)_pp_calloc(words, sizeof(int64_t));
    s->fp_theirs = (int64_t*)_pp_calloc(words, sizeof(int64_t));
    if (!s->fp_mine || !s->fp_theirs) return _pp_fail(err, PP_ERR_NOMEM, "plan check buffers (%zu words)", words);
    return PP_OK;
}

static void _pp_agree_free(pp_stage* s) {
    PP_FREE(s->n_sent);
    PP_FREE(s->n_recv);
    PP_FREE(s->nb);
    PP_FREE(s->ag_buf);
    PP_FREE(s->ag_req);
    PP_FREE(s->fp_mine);
    PP_FREE(s->fp_theirs);
}

/* A receive nobody will wait for any more: finished (its message came) it is waited for, which
   frees it; else it is withdrawn (transport.cancel), or, with neither test nor cancel, waited for
   briefly (which retires it whether or not its message came); else it is left to the reset. */
static void _pp_retire_recv(pp_stage* s, pp_request* req) {
    const pp_transport* t = &s->d.transport;
    int done = 0;
    if (!req->impl || req->done) return;
    if (t->test) t->test(t->self, req, &done);
    if (done)
        t->wait(t->self, req, s->d.timeout_s, NULL);
    else if (t->cancel)
        t->cancel(t->self, req);
    else if (!t->test)
        t->wait(t->self, req, 1e-3, NULL); /* neither test nor cancel: a short wait retires it either way */
    req->done = 1;
}

/* One message of the plan check or the agreement sent: in the totals and in agree_*. */
static void _pp_agree_count(pp_stage* s, size_t bytes) {
    s->st.agree_msgs++;
    s->st.agree_bytes += bytes;
    s->st.msgs_sent++;
    s->st.bytes_sent += bytes;
}

/* One boundary view as a record: what both sides must agree on. The shapes alone miss ranks
   whose cu_seqlens differ with the same rows per micro-batch (their layers would read other
   sequence bounds): the micro-batch's layout (its own rebased cu_seqlens) goes in too. */
static void _pp_fp_record(const _pp_bnd* bd, const pp_microbatch* mb, int64_t* w) {
    uint64_t h = _PP_FNV_BASIS, dt = 0;
    int k;
    for (k = 0; k < bd->n; k++) {
        h = _pp_fnv(h, (uint64_t)bd->t[k].rows);
        h = _pp_fnv(h, (uint64_t)bd->t[k].cols);
        h = _pp_fnv(h, (uint64_t)bd->t[k].dtype);
        if (bd->tp[k]) h = _pp_fnv(h, 0x5450u + bd->tp[k]); /* a sharded tensor (pp_tp_layout) */
        if (k < 16) dt |= ((uint64_t)bd->t[k].dtype & 15u) << (4 * k);
    }
    w[0] = bd->n;
    w[1] = (int64_t)dt;
    w[2] = bd->n > 0 ? bd->t[0].rows : 0;
    w[3] = bd->n > 0 ? bd->t[0].cols : 0;
    w[4] = (int64_t)h;
    w[5] = mb->cu_seqlens ? mb->n_seqs : -1;
    w[6] = (int64_t)_pp_mb_sig(mb);
#ifdef PP_TEST_NO_SEQ_HASH /* negative control (tests/test_agree.c): the shapes only */
    w[5] = w[6] = 0;
#endif
}


/* "2 tensors f32[3 x 8] i32 ..." from a record. */
static void _pp_fp_describe(char* buf, size_t n, const int64_t* w) {
    int k, len;
    len = snprintf(buf, n, "%lld tensor%s", (long long)w[0], w[0] == 1 ? "" : "s");
    for (k = 0; k < w[0] && k < 4 && len > 0 && (size_t)len < n; k++) {
        const char* dn = pp_dtype_name((pp_dtype)(((uint64_t)w[1] >> (4 * k)) & 15u));
        if (k == 0)
            len += snprintf(buf + len, n - (size_t)len, " %s[%lld x %lld]", dn, (long long)w[2], (long long)w[3]);
        else
            len += snprintf(buf + len, n - (size_t)len, " %s", dn);
    }
}

/* The TP split in the plan check's records word (above n_rec): 0 without one (tp_whole too), else tp | tp_rank << 16. */
static int64_t _pp_fp_tp(const pp_stage* s) {
    return s->tp_n > 1 && s->tp_split ? ((int64_t)s->tp_n | ((int64_t)s->tp_me << 16)) << 32 : 0;
}

/* Step start: send each neighbour this rank's view, post the receive of theirs. */
static pp_result _pp_fp_post(pp_stage* s) {
    const pp_transport* t = &s->d.transport;
    int i, b, mb, m = s->plan.m;
    pp_result rc = PP_OK;
    if (!s->fp_mine || (s->d.shapes != PP_SHAPES_LOCAL && s->d.shapes != PP_SHAPES_BROADCAST)) return PP_OK;
#ifdef PP_TEST_NO_PLAN_CHECK /* negative control (tests/test_agree.c) */
    return PP_OK;
#endif
    if (t->group_start) t->group_start(t->self);
    for (i = 0; i < s->n_nb && rc == PP_OK; i++) {
        _pp_nb* nb = &s->nb[i];
        int64_t* w = s->fp_mine + nb->off;
        size_t bytes = sizeof(int64_t) * (_PP_FP_HDR + (size_t)nb->n_rec * _PP_FP_WORDS);
        int j = 0;
        w[0] = _PP_FP_MAGIC;
        w[1] = s->n_steps;
        w[2] = s->gen;
        w[3] = nb->n_rec | _pp_fp_tp(s);
        for (b = 1; b < s->S; b++)
            if (_pp_nb_boundary(s, b, nb->rank))
                for (mb = 0; mb < m; mb++, j++)
                    _pp_fp_record(_pp_plan_bnd(&s->plan, mb, s->d.partition[b]), &s->plan.mbs[mb],
                                  w + _PP_FP_HDR + (size_t)j * _PP_FP_WORDS);
        if ((rc = t->irecv(t->self, nb->rank, _PP_TAG_PLAN, s->fp_theirs + nb->off, bytes, &nb->rreq)) != PP_OK) {
            _pp_stage_fail(s, rc, "posting the plan check's receive from rank %d", nb->rank);
            break;
        }
        nb->state = 1;
        if ((rc = t->isend(t->self, nb->rank, _PP_TAG_PLAN, w, bytes, &nb->sreq)) != PP_OK) {
            nb->sreq.done = 1;
            _pp_stage_fail(s, rc, "sending the plan check to rank %d", nb->rank);
            break;
        }
        _pp_agree_count(s, bytes);
    }
    if (t->group_end) t->group_end(t->self);
    return rc;
}

/* Before this rank first waits for data from `peer` (and at step end): its view must be ours. */
static pp_result _pp_fp_check(pp_stage* s, int peer) {
    int64_t tp_mine, tp_theirs;
    const pp_transport* t = &s->d.transport;
    double t0 = _pp_now();
    int i, b, mb, j = 0, m = s->plan.m;
    _pp_nb* nb = NULL;
    const int64_t *mine, *theirs;
    pp_result rc;
    for (i = 0; i < s->n_nb; i++)
        if (s->nb[i].rank == peer) nb = &s->nb[i];
    if (!nb || nb->state != 1) return PP_OK;
    nb->state = 2;
    rc = t->wait(t->self, &nb->rreq, s->d.timeout_s, &s->err);
    nb->rreq.done = 1;
    if (rc == PP_OK && !nb->sreq.done) rc = t->wait(t->self, &nb->sreq, s->d.timeout_s, &s->err);
    nb->sreq.done = 1;
    s->st.t_agree += _pp_now() - t0;
    if (rc != PP_OK) return _pp_stage_fail(s, rc, "plan check with rank %d: %s", peer, s->err.msg);
    mine = s->fp_mine + nb->off;
    theirs = s->fp_theirs + nb->off;
    s->st.bytes_recv += sizeof(int64_t) * (_PP_FP_HDR + (size_t)nb->n_rec * _PP_FP_WORDS);
    if (theirs[0] != _PP_FP_MAGIC || (theirs[3] & 0xffffffff) != nb->n_rec)
        return _pp_stage_fail(s, PP_ERR_TRANSPORT, "the plan check from rank %d is corrupt", peer);
    tp_mine = mine[3] >> 32;
    tp_theirs = theirs[3] >> 32;
    if (tp_mine != tp_theirs)
        return _pp_stage_fail(s, PP_ERR_INVALID,
                              "ranks %d and %d split their boundaries differently across TP (pp_stage_desc.tp, tp_whole): "
                              "here split over %d (TP rank %d), on rank %d over %d (TP rank %d; 1: whole): neighbours must both "
                              "split, the same TP rank of groups of one size, or neither", s->d.rank, peer, tp_mine ? (int)(tp_mine & 0xffff) : 1,
                              (int)(tp_mine >> 16), peer, tp_theirs ? (int)(tp_theirs & 0xffff) : 1, (int)(tp_theirs >> 16));
    if (theirs[1] != mine[1] || theirs[2] != mine[2])
        return _pp_stage_fail(s, PP_ERR_TRANSPORT,
                              "rank %d is at its step %lld (after %lld failed), this rank at step %lld (after %lld failed): "
                              "every rank must call pp_stage_step for every step",
                              peer, (long long)theirs[1], (long long)theirs[2], (long long)mine[1], (long long)mine[2]);
    for (b = 1; b < s->S; b++) {
        if (!_pp_nb_boundary(s, b, peer)) continue;
        for (mb = 0; mb < m; mb++, j++) {
            const int64_t* x = mine + _PP_FP_HDR + (size_t)j * _PP_FP_WORDS;
            const int64_t* y = theirs + _PP_FP_HDR + (size_t)j * _PP_FP_WORDS;
            char vx[96], vy[96];
            if (!memcmp(x, y, sizeof(int64_t) * _PP_FP_WORDS)) continue;
            if (!memcmp(x, y, sizeof(int64_t) * _PP_FP_SHAPE_WORDS)) { /* the same shapes, other sequences */
                _pp_seq_describe(vx, sizeof vx, &s->plan.mbs[mb]);
                if (y[5] < 0) snprintf(vy, sizeof vy, "no cu_seqlens");
                else snprintf(vy, sizeof vy, "%lld sequence%s%s", (long long)y[5], y[5] == 1 ? "" : "s",
                              y[5] == x[5] ? " at other bounds" : "");
                return _pp_stage_fail(s, PP_ERR_INVALID,
                                      "ranks %d and %d disagree on the sequence bounds of micro-batch %d (the same %lld rows): "
                                      "here %s, on rank %d %s; every rank's batch must carry the step's cu_seqlens "
                                      "(or use PP_SHAPES_BROADCAST)",
                                      s->d.rank, peer, mb, (long long)s->plan.mbs[mb].rows, vx, peer, vy);
            }
            _pp_fp_describe(vx, sizeof vx, x);
            _pp_fp_describe(vy, sizeof vy, y);
            return _pp_stage_fail(s, PP_ERR_SIZE,
                                  "ranks %d and %d describe the tensors from stage %d to stage %d (layer %d's input) of "
                                  "micro-batch %d differently: here %s%s, on rank %d %s%s; every rank's describe must "
                                  "give the same shapes (or use PP_SHAPES_PER_MESSAGE)",
                                  s->d.rank, peer, b - 1, b, s->d.partition[b], mb, vx,
                                  !strcmp(vx, vy) ? " (other shapes)" : "", peer, vy, !strcmp(vx, vy) ? " (other shapes)" : "");
        }
    }
    return PP_OK;
}

/* Slot r of the agreement's buffer (rank 0: rank r's record; others: 0 status, 1 verdict), its
   words and its message. */
static unsigned char* _pp_ag_slot(const pp_stage* s, int r) { return s->ag_buf + (size_t)r * s->ag_rec; }
static const int64_t* _pp_ag_words(const pp_stage* s, int r) { return (const int64_t*)(void*)_pp_ag_slot(s, r); }
static const char* _pp_ag_msg(const pp_stage* s, int r) { return (const char*)(_pp_ag_slot(s, r) + s->ag_rec - _PP_AG_MSG); }

/* A rank's outcome record: result, step, generation, messages per peer, message. */
static void _pp_ag_write(const pp_stage* s, unsigned char* rec, pp_result rc, int who, const char* msg) {
    int64_t* w = (int64_t*)(void*)rec;
    int r;
    memset(rec, 0, s->ag_rec);
    w[0] = _PP_AG_MAGIC;
    w[1] = s->n_steps;
    w[2] = s->gen;
    w[3] = rc;
    w[4] = who + 1; /* 0: no rank */
    for (r = 0; r < s->p; r++) {
        w[_PP_AG_WORDS + r] = s->n_sent[r];
        w[_PP_AG_WORDS + s->p + r] = s->n_recv[r];
    }
    if (msg) snprintf((char*)(rec + s->ag_rec - _PP_AG_MSG), _PP_AG_MSG, "%s", msg);
}

/* Rank 0: the verdict from every rank's record (slot r holds rank r's). */
static pp_result _pp_ag_judge(pp_stage* s, char* msg, size_t n, int* who) {
    int r, q;
    const int64_t* w0 = _pp_ag_words(s, 0);
    for (r = 0; r < s->p; r++) {
        const int64_t* w = _pp_ag_words(s, r);
        if (w[3] != PP_OK) {
            *who = r;
            snprintf(msg, n, "%s", _pp_ag_msg(s, r));
            return (pp_result)w[3];
        }
    }
    *who = -1; /* from here on the verdict is rank 0's finding, the same for every rank */
    for (r = 1; r < s->p; r++) {
        const int64_t* w = _pp_ag_words(s, r);
        if (w[1] != w0[1] || w[2] != w0[2]) {
            snprintf(msg, n, "rank %d is at its step %lld (after %lld failed), rank 0 at step %lld (after %lld failed): "
                     "every rank must call pp_stage_step for every step",
                     r, (long long)w[1], (long long)w[2], (long long)w0[1], (long long)w0[2]);
            return PP_ERR_TRANSPORT;
        }
    }
    for (r = 0; r < s->p; r++)
        for (q = 0; q < s->p; q++) {
            const int64_t *wr = _pp_ag_words(s, r), *wq = _pp_ag_words(s, q);
            if (wr[_PP_AG_WORDS + q] == wq[_PP_AG_WORDS + s->p + r]) continue;
            snprintf(msg, n, "rank %d sent rank %d %lld messages this step, rank %d received %lld: the two sides of a "
                     "boundary disagree on its tensors (count or types); the rest stay queued and are dropped",
                     r, q, (long long)wr[_PP_AG_WORDS + q], q, (long long)wq[_PP_AG_WORDS + s->p + r]);
            return PP_ERR_SIZE;
        }
    msg[0] = 0;
    return PP_OK;
}


/* A failed verdict on a rank whose own step went well: a rank's failure (who >= 0) is
   PP_ERR_ABORTED here with that rank's message; rank 0's finding (who < 0) is its own code. */
static pp_result _pp_agree_fail(pp_stage* s, pp_result v, int who, const char* msg) {
    if (who >= 0)
        return _pp_fail(&s->err, PP_ERR_ABORTED, "rank %d: the step failed elsewhere: %.*s", s->d.rank, _PP_AG_MSG - 1, msg);
    return _pp_fail(&s->err, v, "rank %d: %.*s", s->d.rank, _PP_AG_MSG - 1, msg);
}

/* A failure inside the agreement itself (a post, a send, a wait): the other ranks must not wait
   for this rank's part into their deadlines. Where abort reaches them (threads, MPI) it stops
   them; where it is local (NCCL) they learn it from the verdict or their own waits. */
static void _pp_agree_abort(pp_stage* s, pp_result why, const char* msg) {
    const pp_transport* t = &s->d.transport;
#ifdef PP_TEST_NO_AGREE_ABORT /* negative control (tests/test_agree.c fault): the others wait it out */
    return;
#endif
    if (t->abort && !t->abort_local) t->abort(t->self, why, msg);
}

/* Step start: rank 0 sends every rank the step's identity (its count of steps and of failed
   ones), the others take it as theirs. So the ranks resynchronise at every step: one that missed
   a step (its caller skipped it), or that took another outcome of a failed step than rank 0 (its
   verdict lost, or its own wait failed), runs the next step with the same identity and tags as
   every other rank. Never stale: rank 0 sends one per call, every other rank takes one per call
   before anything else of its step; what a failed step left queued (the identity for a rank that
   did not call) goes with the transport's reset (pp_threads_reset; an aborted MPI or NCCL
   transport is made again). Rank 0 waits for its sends at the agreement. */
#define _PP_GO_MAGIC 0x5050474f /* "PPGO" */
/* "a training step", "an evaluation with outputs to rank 2" (out1: 1 + that rank, 0: none) */
static void _pp_step_kind(char* buf, size_t n, int eval, int out1) {
    if (!eval) snprintf(buf, n, "a training step");
    else if (out1 <= 0) snprintf(buf, n, "an evaluation without outputs");
    else snprintf(buf, n, "an evaluation with outputs to rank %d", out1 - 1);
}
static pp_result _pp_go(pp_stage* s) {
    const pp_transport* t = &s->d.transport;
    pp_request rq;
    pp_error e;
    pp_result rc = PP_OK;
    int r, bad = -1;
    s->go_sent = 0;
    if (s->p < 2 || !s->ag_req) return PP_OK;
#ifdef PP_TEST_NO_GO /* negative control (tests/test_agree.c): every rank keeps its own count */
    return PP_OK;
#endif
    if (s->d.rank == 0) {
        s->go[0] = _PP_GO_MAGIC;
        s->go[1] = s->n_steps;
        s->go[2] = s->gen;
        s->go[3] = s->eval;
        s->go[4] = s->eval ? s->ev_rank + 1 : 0;
        if (t->group_start) t->group_start(t->self);
        for (r = 1; r < s->p; r++) {
            memset(&s->ag_req[r], 0, sizeof s->ag_req[r]);
            if (bad < 0 && (rc = t->isend(t->self, r, _PP_TAG_GO, s->go, sizeof s->go, &s->ag_req[r])) != PP_OK) bad = r;
            if (bad >= 0) s->ag_req[r].done = 1;
            else _pp_agree_count(s, sizeof s->go);
        }
        if (t->group_end) t->group_end(t->self);
        s->go_sent = 1;
        if (bad >= 0) return _pp_stage_fail(s, rc, "sending the step's identity to rank %d", bad);
        return PP_OK;
    }
    memset(&rq, 0, sizeof rq);
    e.msg[0] = 0;
    if ((rc = t->irecv(t->self, 0, _PP_TAG_GO, s->go, sizeof s->go, &rq)) != PP_OK)
        return _pp_stage_fail(s, rc, "posting the receive of the step's identity from rank 0");
    if ((rc = t->wait(t->self, &rq, s->d.timeout_s, &e)) != PP_OK) {
        _pp_retire_recv(s, &rq);
        _pp_stage_fail(s, rc, "waiting for the step's identity from rank 0: %s", e.msg);
        if (rc == PP_ERR_TIMEOUT) _pp_stage_explain(s, 0);
        return rc;
    }
    s->st.bytes_recv += sizeof s->go;
    if (s->go[0] != _PP_GO_MAGIC || s->go[1] < 0 || s->go[1] > INT32_MAX || s->go[2] < 0 || s->go[2] > INT32_MAX)
        return _pp_stage_fail(s, PP_ERR_TRANSPORT, "the step identity from rank 0 is corrupt");
    s->n_steps = (int32_t)s->go[1];
    s->gen = (int32_t)s->go[2];
#ifdef PP_TEST_NO_EVAL_SYNC /* negative control (tests/test_eval.c): a step and an evaluation meet */
    (void)_pp_step_kind;
#else
    if (s->go[3] != s->eval || (s->eval && s->go[4] != s->ev_rank + 1)) {
        char mine[64], theirs[64];
        _pp_step_kind(mine, sizeof mine, s->eval, s->eval ? s->ev_rank + 1 : 0);
        _pp_step_kind(theirs, sizeof theirs, s->go[3] != 0, (int)s->go[4]);
        return _pp_stage_fail(s, PP_ERR_INVALID,
                              "rank 0 runs %s, this rank %s: every rank calls pp_stage_step, or every rank pp_stage_eval "
                              "with the same pp_eval_out.rank (or every rank NULL), for the same step",
                              theirs, mine);
    }
#endif
    return PP_OK;
}

/* The end of every step on every rank: returns rc, or, where rc is PP_OK, the verdict. Needs no
   memory of its own (the records live in ag_buf since create), and each rank posts the receive of
   its verdict before it sends its record, so rank 0's verdict meets a posted receive: with the
   threads transport, whose sends allocate only where nothing is posted, the verdict cannot fail
   for want of memory once rank 0 has every record. Any failure of the agreement's own messages
   fails this rank's step with what failed, and aborts the transport (_pp_agree_abort), so no
   rank waits into its deadline for a part that will not come. */
static pp_result _pp_agree(pp_stage* s, pp_result rc) {
    const pp_transport* t = &s->d.transport;
    double t0 = _pp_now();
    pp_result v = PP_OK, w;
    pp_error e; /* the agreement's own waits: s->err keeps this rank's failure */
    char vmsg[_PP_AG_MSG];
    int r, who = -1, unsent = 0;
    if (s->p < 2 || !s->ag_buf) return rc;
#ifdef PP_TEST_NO_AGREE /* negative control (tests/test_agree.c) */
    (void)t, (void)t0, (void)v, (void)w, (void)e, (void)vmsg, (void)r, (void)who, (void)unsent;
    return rc;
#endif
    vmsg[0] = 0;
    e.msg[0] = 0;
    if (s->d.rank != 0) {
        unsigned char* vrec = _pp_ag_slot(s, 1);
        const int64_t* vw = _pp_ag_words(s, 1);
        const char* what = "posting the receive of the verdict";
        pp_request rq[2];
        memset(rq, 0, sizeof rq);
        _pp_ag_write(s, s->ag_buf, rc, s->d.rank, s->err.msg);
        if (t->group_start) t->group_start(t->self);
        w = t->irecv(t->self, 0, _PP_TAG_VERDICT, vrec, s->ag_rec, &rq[1]);
        if (w == PP_OK) {
            what = "sending this rank's outcome";
            if ((w = t->isend(t->self, 0, _PP_TAG_AGREE, s->ag_buf, s->ag_rec, &rq[0])) != PP_OK) rq[0].done = 1;
        }
        if (t->group_end) t->group_end(t->self);
        if (w == PP_OK) {
            _pp_agree_count(s, s->ag_rec);
            what = "waiting for the step's outcome";
            w = t->wait(t->self, &rq[0], s->d.timeout_s, &e);
            if (w == PP_OK) w = t->wait(t->self, &rq[1], s->d.timeout_s, &e);
            if (w == PP_OK) s->st.bytes_recv += s->ag_rec;
        }
        if (w != PP_OK) {
            _pp_retire_recv(s, &rq[1]);
            if (!e.msg[0] && w == PP_ERR_ABORTED && t->abort_reason) t->abort_reason(t->self, e.msg, sizeof e.msg);
            if (!e.msg[0]) snprintf(e.msg, sizeof e.msg, "%s", pp_result_str(w));
            if (w != PP_ERR_ABORTED) _pp_agree_abort(s, w, "a rank could not take part in the step's agreement");
        }
        s->st.t_agree += _pp_now() - t0;
        if (rc != PP_OK) return rc;
        if (w != PP_OK) return _pp_stage_fail(s, w, "%s (rank 0): %s", what, e.msg);
        if (vw[0] != _PP_AG_MAGIC || vw[1] != s->n_steps || vw[2] != s->gen)
            return _pp_stage_fail(s, PP_ERR_TRANSPORT, "rank 0's verdict is for its step %lld (after %lld failed), this "
                                  "rank is at step %lld (after %lld failed)", (long long)vw[1], (long long)vw[2],
                                  (long long)s->n_steps, (long long)s->gen);
        if (vw[3] == PP_OK) return PP_OK;
        return _pp_agree_fail(s, (pp_result)vw[3], (int)vw[4] - 1, _pp_ag_msg(s, 1));
    }
    /* rank 0: its sends of the step's identity (_pp_go) are done by now on any rank that is here */
    for (r = 1; r < s->p && s->go_sent; r++)
        if (!s->ag_req[r].done && (w = t->wait(t->self, &s->ag_req[r], s->d.timeout_s, &e)) != PP_OK) {
            snprintf(vmsg, sizeof vmsg, "rank %d did not take the step's identity: %.120s", r, e.msg);
            if (rc == PP_OK) rc = _pp_stage_fail(s, w, "%s", vmsg);
        }
    s->go_sent = 0;
    /* every record, then the verdict to everyone */
    if (t->group_start) t->group_start(t->self);
    for (r = 1; r < s->p; r++) {
        memset(&s->ag_req[r], 0, sizeof s->ag_req[r]);
        if ((w = t->irecv(t->self, r, _PP_TAG_AGREE, _pp_ag_slot(s, r), s->ag_rec, &s->ag_req[r])) != PP_OK) {
            memset(&s->ag_req[r], 0, sizeof s->ag_req[r]);
            _pp_ag_write(s, _pp_ag_slot(s, r), w, r, "rank 0 could not post the receive of its outcome");
            _pp_agree_abort(s, w, "rank 0 could not post the receive of a rank's outcome");
        }
    }
    if (t->group_end) t->group_end(t->self);
    for (r = 1; r < s->p; r++) {
        if (!s->ag_req[r].impl && !s->ag_req[r].done) continue; /* its post failed: recorded above */
        if ((w = t->wait(t->self, &s->ag_req[r], s->d.timeout_s, &e)) != PP_OK) {
            _pp_retire_recv(s, &s->ag_req[r]);
            if (w == PP_ERR_ABORTED && t->abort_reason) t->abort_reason(t->self, e.msg, sizeof e.msg);
            _pp_ag_write(s, _pp_ag_slot(s, r), w, r, e.msg);
            if (w != PP_ERR_ABORTED) _pp_agree_abort(s, w, "rank 0 did not get a rank's outcome");
        } else if (_pp_ag_words(s, r)[0] != _PP_AG_MAGIC) {
            _pp_ag_write(s, _pp_ag_slot(s, r), PP_ERR_TRANSPORT, r, "its outcome record is corrupt");
        } else {
            s->st.bytes_recv += s->ag_rec;
        }
        s->ag_req[r].done = 1;
    }
    /* rank 0's own record last: a failure of its own sends above is in rc */
    _pp_ag_write(s, s->ag_buf, rc, 0, s->err.msg);
    v = _pp_ag_judge(s, vmsg, sizeof vmsg, &who);
    /* the verdict goes out in slot 0 (rank 0's own record is no longer needed) */
    _pp_ag_write(s, s->ag_buf, v, who, vmsg);
    /* A verdict that cannot be sent (a post failing; the verdict meets a posted receive, so the
       threads transport cannot fail here for memory): that rank and the ones after it get none
       and fail by the abort, and so does rank 0; ranks told before keep their verdict (the step
       was right where it was PP_OK: an error too many, never a wrong result), and the next
       step's identity brings every rank together again. */
    if (t->group_start) t->group_start(t->self);
    for (r = 1; r < s->p; r++) {
        memset(&s->ag_req[r], 0, sizeof s->ag_req[r]);
        if (unsent) {
            s->ag_req[r].done = 1;
            continue;
        }
        if ((w = t->isend(t->self, r, _PP_TAG_VERDICT, s->ag_buf, s->ag_rec, &s->ag_req[r])) != PP_OK) {
            s->ag_req[r].done = 1;
            unsent = 1;
            v = w;
            who = 0;
            snprintf(vmsg, sizeof vmsg, "rank 0 could not send rank %d the step's outcome (%s)", r, pp_result_str(w));
            _pp_agree_abort(s, w, vmsg);
            continue;
        }
        _pp_agree_count(s, s->ag_rec);
    }
    if (t->group_end) t->group_end(t->self);
    for (r = 1; r < s->p; r++)
        if (!s->ag_req[r].done) t->wait(t->self, &s->ag_req[r], s->d.timeout_s, NULL);
    s->st.t_agree += _pp_now() - t0;
    if (rc != PP_OK || v == PP_OK) return rc;
    if (who == 0) return _pp_stage_fail(s, v, "%s", vmsg);
    return _pp_agree_fail(s, v, who, vmsg);
}

/* >>impl-stage-exec: the executor: receives posted one action ahead, F, B and W, the step, the
   stage's life (create, reset, destroy). */

/* The part of boundary tensor x (pp_tp_layout `layout`) that travels between ranks: with a TP
   group (pp_stage_desc.tp), a replicated tensor's rows pp_tp_block(rows, tp, tp_rank); else all
   of it. Byte offset and length. */
static void _pp_tp_cut(const pp_stage* s, const pp_tensor* x, int layout, size_t* off, size_t* len) {
    size_t rb = (size_t)x->cols * pp_dtype_size(x->dtype), o, l;
    if (s->tp_n <= 1 || !s->tp_split || layout != PP_TP_REPLICATED) {
        *off = 0;
        *len = pp_tensor_bytes(x);
        return;
    }
#ifdef PP_TEST_TP_EVEN_SLICE /* negative control (build/tp-controls): rows / tp each, the remainder dropped */
    o = (size_t)x->rows / (size_t)s->tp_n * (size_t)s->tp_me;
    l = (size_t)x->rows / (size_t)s->tp_n;
#else
    pp_tp_block((size_t)x->rows, s->tp_n, s->tp_me, &o, &l);
#endif
    *off = o * rb;
    *len = l * rb;
}

/* Posts the receives of the stage input's tensors [from, upto) into the prepared block. */
static pp_result _pp_post_range(pp_stage* s, const pp_action* a, _pp_prep* pr, int from, int upto) {
    const pp_transport* t = &s->d.transport;
    int la = s->d.partition[a->stage], k, n_in;
    size_t extra = s->d.shapes == PP_SHAPES_AUTO ? _PP_TRAILER : 0;
    const _pp_bnd* bd = _pp_plan_bnd(&s->plan, a->mb, la);
    pp_tensor in[PP_MAX_TENSORS];
    /* the input boundary alone, where the stash layout puts it (first) */
    _pp_stash_carve(&s->plan, a->mb, la, la, 1, pr->blk->data, in, &n_in, NULL);
    if (t->group_start) t->group_start(t->self);
    for (k = from; k < n_in && k < upto; k++) {
        pp_tensor* x = &in[k];
        size_t n, o;
        pp_result rc;
        _pp_tp_cut(s, x, bd->tp[k], &o, &n);
        n += k == 0 ? extra : 0;
        if (pr->n_req >= _PP_MAX_REQ) return _pp_stage_fail(s, PP_ERR_INVALID, "too many receives for one action");
        rc = t->irecv(t->self, a->prev_rank, _pp_tag(s, 0, a->mb, a->stage, k), (unsigned char*)x->data + o, n,
                      &pr->req[pr->n_req]);
        if (rc != PP_OK) return _pp_stage_fail(s, rc, "posting receive F%d.%d from rank %d", a->mb, a->chunk, a->prev_rank);
        pr->req_bytes[pr->n_req++] = n;
    }
    if (t->group_end) t->group_end(t->self);
    return PP_OK;
}

/* Posts the receive of the stage input's shape header (PER_MESSAGE, or AUTO learning a shape). */
static pp_result _pp_post_hdr(pp_stage* s, const pp_action* a, _pp_prep* pr) {
    const pp_transport* t = &s->d.transport;
    pp_result rc = t->irecv(t->self, a->prev_rank, _pp_tag(s, 0, a->mb, a->stage, PP_MAX_TENSORS), &pr->hdr,
                            sizeof pr->hdr, &pr->req[0]);
    if (rc != PP_OK)
        return _pp_stage_fail(s, rc, "posting header receive F%d.%d from rank %d", a->mb, a->chunk, a->prev_rank);
    pr->req_bytes[0] = sizeof pr->hdr;
    pr->n_req = 1;
    pr->want_hdr = 1;
    return PP_OK;
}

/* Takes the action's block and posts its receives. */
static pp_result _pp_prepare(pp_stage* s, int idx) {
    _pp_prep* pr = &s->prep[idx & 1];
    const pp_action* a = &s->list[idx];
    const pp_transport* t = &s->d.transport;
    int la, lb, k;
    size_t bytes;
    if (pr->idx == idx) return PP_OK;
    PP_ASSERT(pr->idx < 0);
    memset(pr, 0, sizeof *pr);
    pr->idx = idx;
    if (a->op == PP_OP_W) return PP_OK; /* receives nothing, works in B's blocks */
    /* an F fed by this rank receives nothing; its stash is taken once the F before it ran (under
       PER_MESSAGE and AUTO that F may change the shapes it hands over) */
    if (a->op == PP_OP_F && _pp_turn(s, a->stage)) return PP_OK;
    _pp_stage_layers(s, a->stage, &la, &lb);
    if (a->op == PP_OP_F) {
        int slot = a->mb * s->v + a->chunk;
        if (a->stage > 0 && (s->d.shapes == PP_SHAPES_PER_MESSAGE ||
                             (s->d.shapes == PP_SHAPES_AUTO && s->learned_in[slot].n < 0))) {
            /* the sizes come with the data: receive the header first, take the block later */
            return _pp_post_hdr(s, a, pr);
        }
        if (a->stage > 0 && s->d.shapes == PP_SHAPES_AUTO) {
            /* expect what this (micro-batch, boundary) carried last time */
            pp_result rc = _pp_apply_shapes(s, a, &s->learned_in[slot]);
            if (rc != PP_OK) return rc;
        }
        bytes = _pp_stash_carve(&s->plan, a->mb, la, lb, a->stage > 0, NULL, NULL, NULL, NULL);
        if (!(pr->blk = _pp_block_get(s, bytes)))
            return _pp_stage_fail(s, PP_ERR_NOMEM, "stash of %zu bytes for F%d.%d", bytes, a->mb, a->chunk);
        if (a->stage > 0) {
            pp_result rc;
            pr->auto_first = s->d.shapes == PP_SHAPES_AUTO;
            if ((rc = _pp_post_range(s, a, pr, 0, pr->auto_first ? 1 : PP_MAX_TENSORS)) != PP_OK) return rc;
        }
    } else {
        int out_turn = _pp_turn(s, a->stage + 1); /* the output gradient is read in place */
        int recv = a->stage < s->S - 1 && !out_turn;
        size_t zfrom = 0;
        bytes = _pp_grad_carve(&s->plan, a->mb, la, lb, a->stage > 0, !out_turn, NULL, NULL);
        if (!(pr->blk = _pp_block_get(s, bytes)))
            return _pp_stage_fail(s, PP_ERR_NOMEM, "gradient workspace of %zu bytes for B%d.%d", bytes, a->mb, a->chunk);
        if (recv) { /* the receives below overwrite the output gradient, first in the workspace: the
                       zeros go after it, so nothing is enqueued on the received bytes between the
                       block's release and the receives (pp_transport.released) */
            const _pp_bnd* bd = _pp_plan_bnd(&s->plan, a->mb, lb);
            for (k = 0; k < bd->n; k++)
                if (pp_dtype_is_float(bd->t[k].dtype)) zfrom += _pp_slice(&s->plan, pp_tensor_bytes(&bd->t[k]), 0);
            if (zfrom > bytes) zfrom = bytes;
#ifdef PP_TEST_ZERO_RECEIVED /* negative control (build/nccl-controls): the received bytes zeroed too */
            zfrom = 0;
#endif
        }
        if (!s->d.device.zero) {
            memset(pr->blk->data + zfrom, 0, bytes - zfrom);
        } else if (bytes > zfrom && s->d.device.zero(s->d.device.user, pr->blk->data + zfrom, bytes - zfrom) != PP_OK) {
            return _pp_stage_fail(s, PP_ERR_TRANSPORT, "zeroing the gradient workspace of B%d.%d (%zu bytes)", a->mb,
                                  a->chunk, bytes);
        }
        if (recv) {
            const _pp_bnd* bd = _pp_plan_bnd(&s->plan, a->mb, lb);
            size_t off = 0;
            if (t->group_start) t->group_start(t->self);
            for (k = 0; k < bd->n; k++) {
                size_t n = pp_tensor_bytes(&bd->t[k]), co, cl;
                pp_result rc;
                if (!pp_dtype_is_float(bd->t[k].dtype)) continue;
                _pp_tp_cut(s, &bd->t[k], bd->tp[k], &co, &cl);
#if _PP_VALIDATE
                /* nothing may write a block between its take and its receive: a transport may let
                   the receive skip its wait for the compute stream (pp_transport.released) */
                if (bytes > zfrom && off < bytes && off + n > zfrom)
                    return _pp_stage_fail(s, PP_ERR_INVALID, "B%d.%d: bytes %zu to %zu of the gradient workspace were zeroed "
                                          "after the block was taken and before the receive that fills them (an ordering bug)",
                                          a->mb, a->chunk, off > zfrom ? off : zfrom, off + n);
#endif
                rc = t->irecv(t->self, a->next_rank, _pp_tag(s, 1, a->mb, a->stage + 1, k), pr->blk->data + off + co, cl,
                              &pr->req[pr->n_req]);
                if (rc != PP_OK) return _pp_stage_fail(s, rc, "posting receive B%d.%d from rank %d", a->mb, a->chunk, a->next_rank);
                pr->req_bytes[pr->n_req++] = cl;
                off += _pp_slice(&s->plan, n, 0);
            }
            if (t->group_end) t->group_end(t->self);
        }
    }
    return PP_OK;
}

static pp_result _pp_wait_prep(pp_stage* s, _pp_prep* pr, const pp_action* a) {
    int i, peer = _pp_awaited(s, a);
    double t0;
    pp_result rc0;
    if (pr->n_req > 0 && peer >= 0 && (rc0 = _pp_fp_check(s, peer)) != PP_OK) return rc0;
    t0 = _pp_now();
    for (i = 0; i < pr->n_req; i++) {
        pp_result rc = s->d.transport.wait(s->d.transport.self, &pr->req[i], s->d.timeout_s, &s->err);
        pr->req[i].done = 1;
        if (rc != PP_OK) {
            s->st.t_wait += _pp_now() - t0;
            rc = _pp_stage_wrap(s, rc, a);
            if (rc == PP_ERR_TIMEOUT) _pp_stage_explain(s, _pp_awaited(s, a));
            return rc;
        }
        s->st.bytes_recv += pr->req_bytes[i];
        if (peer >= 0 && s->n_recv) s->n_recv[peer]++;
    }
    pr->n_req = 0;
    s->st.t_wait += _pp_now() - t0;
    return PP_OK;
}

/* Reads the AUTO trailer after tensor 0 of the stage input; 0 if it is missing or corrupt. */
static int _pp_trailer_read(const pp_tensor* t0, uint64_t* mb_sig) {
    const unsigned char* p = (const unsigned char*)t0->data + pp_tensor_bytes(t0);
    uint32_t w[4];
    memcpy(w, p, sizeof w);
    if (mb_sig) *mb_sig = (uint64_t)w[2] | ((uint64_t)w[3] << 32);
    return w[0] == _PP_TRAILER_MAGIC ? (int)w[1] : 0;
}

/* magic, status, the sender's micro-batch signature (_pp_mb_sig) */
static void _pp_trailer_write(unsigned char* p, int status, uint64_t mb_sig) {
    uint32_t w[4];
    w[0] = _PP_TRAILER_MAGIC;
    w[1] = (uint32_t)status;
    w[2] = (uint32_t)mb_sig;
    w[3] = (uint32_t)(mb_sig >> 32);
    memcpy(p, w, sizeof w);
}

/* F of a stage > 0 under PER_MESSAGE/AUTO: completes the receive of the stage input once
   its shape is known, resizing the stash when the sender says the shape changed. */
static pp_result _pp_receive_input(pp_stage* s, const pp_action* a, _pp_prep* pr) {
    pp_tensor t_in[PP_MAX_TENSORS]; /* the input boundary, for the AUTO trailer */
    int n_in;
    int la = s->d.partition[a->stage], lb = s->d.partition[a->stage + 1], slot = a->mb * s->v + a->chunk, status;
    pp_result rc;
    _pp_bnd in;
    for (;;) {
        if (pr->want_hdr) {
            if ((rc = _pp_hdr_to_bnd(s, a, &pr->hdr, &in)) != PP_OK) return rc;
            if ((rc = _pp_mb_check(s, a, pr->hdr.mb_sig, pr->hdr.mb_rows, pr->hdr.mb_seqs)) != PP_OK) return rc;
            if ((rc = _pp_apply_shapes(s, a, &in)) != PP_OK) return rc;
            {
                size_t bytes = _pp_stash_carve(&s->plan, a->mb, la, lb, 1, NULL, NULL, NULL, NULL);
                if (pr->blk && pr->blk->cap < bytes) {
                    _pp_block_put(s, pr->blk);
                    pr->blk = NULL;
                }
                if (!pr->blk && !(pr->blk = _pp_block_get(s, bytes)))
                    return _pp_stage_fail(s, PP_ERR_NOMEM, "stash of %zu bytes for F%d.%d", bytes, a->mb, a->chunk);
            }
            pr->want_hdr = 0;
            pr->auto_first = 0;
            if ((rc = _pp_post_range(s, a, pr, 0, PP_MAX_TENSORS)) != PP_OK) return rc;
            if ((rc = _pp_wait_prep(s, pr, a)) != PP_OK) return rc;
        } else if (pr->auto_first) {
            /* tensor 0 arrived with its trailer: the rest may follow, or a resize notice */
            pr->auto_first = 0;
            _pp_stash_carve(&s->plan, a->mb, la, la, 1, pr->blk->data, t_in, &n_in, NULL);
            if (_pp_trailer_read(&t_in[0], NULL) == _PP_TRAILER_RESIZE) {
                if ((rc = _pp_post_hdr(s, a, pr)) != PP_OK) return rc;
                if ((rc = _pp_wait_prep(s, pr, a)) != PP_OK) return rc;
                continue; /* want_hdr is set: apply the header, then receive the data */
            }
            if ((rc = _pp_post_range(s, a, pr, 1, PP_MAX_TENSORS)) != PP_OK) return rc;
            if ((rc = _pp_wait_prep(s, pr, a)) != PP_OK) return rc;
        }
        break;
    }
    if (s->d.shapes == PP_SHAPES_AUTO) {
        uint64_t sig;
        _pp_stash_carve(&s->plan, a->mb, la, la, 1, pr->blk->data, t_in, &n_in, NULL);
        status = _pp_trailer_read(&t_in[0], &sig);
        if (status != _PP_TRAILER_OK)
            return _pp_stage_fail(s, PP_ERR_TRANSPORT, "F%d.%d: activation from rank %d lacks its trailer (%d)", a->mb,
                                  a->chunk, a->prev_rank, status);
        if ((rc = _pp_mb_check(s, a, sig, -1, -1)) != PP_OK) return rc;
        s->learned_in[slot] = *_pp_plan_bnd(&s->plan, a->mb, la);
    }
    return PP_OK;
}

/* Sends boundary bd's tensors ts[0..n) (each its part, _pp_tp_cut). */
static pp_result _pp_send_bnd(pp_stage* s, const pp_action* a, _pp_block* blk, const _pp_bnd* bd, const pp_tensor* ts,
                              int n, int peer, int dir, int bstage, size_t extra0) {
    const pp_transport* t = &s->d.transport;
    int k;
    if (t->group_start) t->group_start(t->self);
    for (k = 0; k < n; k++) {
        size_t bytes, o;
        pp_result rc;
        if (!ts[k].data) continue; /* integer tensors carry no gradient */
        _pp_tp_cut(s, &ts[k], bd->tp[k], &o, &bytes);
        bytes += k == 0 ? extra0 : 0;
        rc = t->isend(t->self, peer, _pp_tag(s, dir, a->mb, bstage, k), (const unsigned char*)ts[k].data + o, bytes,
                      &blk->req[blk->n_req]);
        if (rc != PP_OK) {
            if (t->group_end) t->group_end(t->self);
            return _pp_stage_fail(s, rc, "at %c%d.%d sending %zu bytes to rank %d", "FBW"[a->op % 3], a->mb, a->chunk,
                                  bytes, peer);
        }
        blk->n_req++;
        s->st.bytes_sent += bytes;
        s->st.msgs_sent++;
        if (s->n_sent) s->n_sent[peer]++;
    }
    if (t->group_end) t->group_end(t->self);
    return PP_OK;
}

/* One metadata message (a header or a resize notice) from blk. */
static pp_result _pp_send_meta(pp_stage* s, const pp_action* a, _pp_block* blk, const void* buf, size_t bytes, int k) {
    const pp_transport* t = &s->d.transport;
    pp_result rc;
    if (blk->n_req >= _PP_MAX_REQ) return _pp_stage_fail(s, PP_ERR_INVALID, "too many sends for one action");
    rc = t->isend(t->self, a->next_rank, _pp_tag(s, 0, a->mb, a->stage + 1, k), buf, bytes, &blk->req[blk->n_req]);
    if (rc != PP_OK) return _pp_stage_fail(s, rc, "at F%d.%d sending %zu bytes of shapes to rank %d", a->mb, a->chunk, bytes, a->next_rank);
    blk->n_req++;
    s->st.bytes_sent += bytes;
    s->st.msgs_sent++;
    s->st.meta_bytes_sent += bytes;
    s->st.meta_msgs_sent++;
    if (s->n_sent) s->n_sent[a->next_rank]++;
    return PP_OK;
}

/* Sends this stage's output (boundary lb) of an F, with the metadata the policy asks for. */
static pp_result _pp_send_output(pp_stage* s, const pp_action* a, _pp_block* blk, const _pp_view* vw, int la,
                                 int lb) {
    const pp_tensor* out = &vw->act[(lb - la) * PP_MAX_TENSORS];
    int n = vw->nact[lb - la], slot = a->mb * s->v + a->chunk;
    pp_result rc;
    size_t extra = 0;
    if (s->d.shapes == PP_SHAPES_PER_MESSAGE) {
        _pp_bnd_to_hdr(out, n, &blk->hdr);
        _pp_hdr_mb(&s->plan.mbs[a->mb], &blk->hdr);
        if ((rc = _pp_send_meta(s, a, blk, &blk->hdr, sizeof blk->hdr, PP_MAX_TENSORS)) != PP_OK) return rc;
    } else if (s->d.shapes == PP_SHAPES_AUTO) {
        _pp_bnd* known = &s->learned_out[slot];
        extra = _PP_TRAILER;
        if (known->n >= 1 && !_pp_same_shapes(known, out, n)) {
            /* the receiver has posted tensor 0 at the old size: tell it, in a message of that
               size, that a header follows */
            size_t old = pp_tensor_bytes(&known->t[0]) + _PP_TRAILER;
            _pp_block* note = _pp_block_get(s, old);
            if (!note) return _pp_stage_fail(s, PP_ERR_NOMEM, "resize notice of %zu bytes", old);
            memset(note->data, 0, old);
            _pp_trailer_write(note->data + old - _PP_TRAILER, _PP_TRAILER_RESIZE, 0);
            rc = _pp_send_meta(s, a, note, note->data, old, 0);
            _pp_block_put(s, note);
            if (rc != PP_OK) return rc;
        }
        if (known->n < 1 || !_pp_same_shapes(known, out, n)) {
            _pp_bnd_to_hdr(out, n, &blk->hdr);
            _pp_hdr_mb(&s->plan.mbs[a->mb], &blk->hdr);
            if ((rc = _pp_send_meta(s, a, blk, &blk->hdr, sizeof blk->hdr, PP_MAX_TENSORS)) != PP_OK) return rc;
            known->n = n;
            memcpy(known->t, out, sizeof(pp_tensor) * (size_t)n);
        }
        _pp_trailer_write((unsigned char*)out[0].data + pp_tensor_bytes(&out[0]), _PP_TRAILER_OK,
                          _pp_mb_sig(&s->plan.mbs[a->mb]));
        s->st.meta_bytes_sent += _PP_TRAILER;
    }
    return _pp_send_bnd(s, a, blk, _pp_plan_bnd(&s->plan, a->mb, lb), out, n, a->next_rank, 0, a->stage + 1, extra);
}

/* One action being run: its layers [la, lb), micro-batch, (micro-batch, chunk) slot, start. */
typedef struct _pp_act {
    const pp_action* a;
    const pp_microbatch* mb;
    const size_t* sb;               /* the micro-batch's saved bytes per layer */
    const size_t* bsb;              /* and its B-only scratch bytes per layer */
    int idx, la, lb, slot;
    double t0;
} _pp_act;

/* The action's views of its stash, B-only scratch and (where given) gws, the gradient workspace,
   laid out in the arrays of its prep slot. At the turn of the V the input views point into the
   previous stage's stash (s->src) and the output gradient's into the next stage's workspace
   (s->gin): the arrays lay those out first, for their addresses. */
static _pp_view _pp_views(pp_stage* s, const _pp_act* c, const _pp_block* stash, const _pp_block* gws) {
    _pp_view vw = s->pv[c->idx & 1];
    const pp_action* a = c->a;
    int in_turn = _pp_turn(s, a->stage), out_turn = gws && _pp_turn(s, a->stage + 1), k, x, y;
    void* hand[PP_MAX_TENSORS];
    if (in_turn) {
        _pp_stage_layers(s, a->stage - 1, &x, &y);
        _pp_stash_carve(&s->plan, a->mb, x, y, a->stage > 1 && !_pp_turn(s, a->stage - 1), s->src[c->slot]->data, vw.act,
                        vw.nact, vw.saved);
        for (k = 0; k < vw.nact[y - x]; k++) hand[k] = vw.act[(y - x) * PP_MAX_TENSORS + k].data;
    }
    _pp_stash_carve(&s->plan, a->mb, c->la, c->lb, a->stage > 0 && !in_turn, stash->data, vw.act, vw.nact, vw.saved);
    _pp_bsaved_carve(&s->plan, a->mb, c->la, c->lb, s->blive[c->slot] ? s->blive[c->slot]->data : NULL, vw.bsaved);
    if (s->rlive[c->slot])
        _pp_rc_carve(&s->plan, a->mb, c->la, c->lb, 1, 0, s->rlive[c->slot]->data, vw.act, vw.saved, vw.bsaved, NULL);
    if (s->rblive[c->slot])
        _pp_rc_carve(&s->plan, a->mb, c->la, c->lb, 2, 0, s->rblive[c->slot]->data, vw.act, vw.saved, vw.bsaved, NULL);
    if (a->stage == 0) vw.act[0] = _pp_input_view(s->batch, c->mb);
    for (k = 0; in_turn && k < vw.nact[0]; k++) vw.act[k].data = hand[k];
    if (!gws) return vw;
    if (out_turn) {
        _pp_stage_layers(s, a->stage + 1, &x, &y);
        _pp_grad_carve(&s->plan, a->mb, x, y, 1, !_pp_turn(s, a->stage + 2), s->gin[c->slot]->data, vw.dact);
        for (k = 0; k < vw.nact[c->lb - c->la]; k++) hand[k] = vw.dact[k].data;
    }
    _pp_grad_carve(&s->plan, a->mb, c->la, c->lb, a->stage > 0, !out_turn, gws->data, vw.dact);
    for (k = 0; out_turn && k < vw.nact[c->lb - c->la]; k++) vw.dact[(c->lb - c->la) * PP_MAX_TENSORS + k].data = hand[k];
    return vw;
}

/* Shares of c's whole stash (what it would hold without recomputation), the validation layer's
   guards and the recompute block's shadows left out: *bshare the B-only scratch (as the
   simulator's pp_sim_cost.b_free: B frees it, the rest of the stash waits for W), *rshare what
   recomputation drops (as pp_sim_cost.r_mem: gone from the F's end to the recompute). */
static void _pp_shares(const pp_stage* s, const _pp_act* c, double* bshare, double* rshare) {
    _pp_plan q = s->plan;
    size_t bb, sb, r1 = 0, r2 = 0, sh = 0, all;
    q.guard = 0;
    bb = _pp_bsaved_carve(&q, c->a->mb, c->la, c->lb, NULL, NULL);
    if (q.rc) {
        r1 = _pp_rc_carve(&q, c->a->mb, c->la, c->lb, 1, 0, NULL, NULL, NULL, NULL, NULL);
        r2 = _pp_rc_carve(&q, c->a->mb, c->la, c->lb, 2, 0, NULL, NULL, NULL, NULL, &sh) - sh;
    }
    sb = _pp_stash_carve(&q, c->a->mb, c->la, c->lb, c->a->stage > 0 && !_pp_turn(s, c->a->stage), NULL, NULL, NULL, NULL);
    all = sb + bb + r1 + r2;
    *bshare = all ? (double)(bb + r2) / (double)all : 0;
    *rshare = all ? (double)(r1 + r2) / (double)all : 0;
}

/* Gives back the B-only scratch (blk = s->blive) or a recompute block (s->rlive, s->rblive) of a slot. */
static void _pp_scratch_release(pp_stage* s, _pp_block** blk) {
    if (!*blk) return;
    s->live_bytes -= (*blk)->want;
    _pp_block_put(s, *blk);
    *blk = NULL;
}
static void _pp_bsaved_release(pp_stage* s, int slot) { _pp_scratch_release(s, &s->blive[slot]); }

/* The end of slot's stash and workspace (after B, or after W when W is deferred), with its B-only
   scratch if B did not free it, and of the blocks it borrowed at the turn of the V. */
static void _pp_slot_release(pp_stage* s, const _pp_act* c) {
    int slot = c->slot;
    _pp_block *stash = s->live[slot], *gws = s->wlive[slot];
    s->live_mem -= s->smem[slot]; /* what B (or the F) did not give back */
    s->smem[slot] = 0;
    _pp_bsaved_release(s, slot);
    _pp_scratch_release(s, &s->rlive[slot]);
    _pp_scratch_release(s, &s->rblive[slot]);
    s->live_bytes -= stash->want + (gws ? gws->want : 0);
    s->live[slot] = s->wlive[slot] = NULL;
    s->n_live--;
    _pp_block_put(s, stash);
    _pp_block_put(s, gws);
    _pp_block_unref(s, &s->src[slot]);
    _pp_block_unref(s, &s->gin[slot]);
}

static void _pp_mark(pp_stage* s, const _pp_act* c, int done) {
    if (s->d.device.mark) s->d.device.mark(s->d.device.user, c->a, c->idx, done);
}

/* A layer (or the finite check) failed with rc, its message in s->err. Over a transport whose
   abort is local, the step goes on without computing (the peers get zeros and finish), and rc
   is the step's result at its end: 1. Otherwise 0: the caller returns rc, and the stage aborts. */
static int _pp_drain(pp_stage* s, pp_result rc) {
#ifdef PP_TEST_NO_DRAIN /* negative control (tests/test_nccl_pipeline.c): abort instead */
    (void)s;
    (void)rc;
    return 0;
#else
    if (!s->d.transport.abort_local) return 0;
    if (!s->draining) {
        s->draining = 1;
        s->drain_rc = rc;
        if (s->t_fail == 0) s->t_fail = _pp_now();
    }
    return 1;
#endif
}

/* Zeros in place of what a draining rank would have computed, so its peers compute on finite
   numbers. */
static pp_result _pp_drain_zero(pp_stage* s, const pp_tensor* ts, int n) {
    int k;
    for (k = 0; k < n; k++) {
        size_t bytes = pp_tensor_bytes(&ts[k]);
        if (!ts[k].data || !bytes) continue;
        if (!s->d.device.zero) memset(ts[k].data, 0, bytes);
        else if (s->d.device.zero(s->d.device.user, ts[k].data, bytes) != PP_OK)
            return _pp_stage_fail(s, PP_ERR_TRANSPORT, "zeroing %zu bytes of a drained step's output", bytes);
    }
    return PP_OK;
}

/* F fed by this rank (the turn of the V): its input is the previous stage's output, read in that
   stage's stash, which it references until its own stash goes; its stash is taken now. */
static pp_result _pp_turn_in(pp_stage* s, const _pp_act* c, _pp_prep* pr) {
    const pp_action* a = c->a;
    int from = _pp_slot(s, a->mb, a->stage - 1);
    size_t bytes;
    pp_result rc;
    if (!s->live[from]) return _pp_stage_fail(s, PP_ERR_SCHEDULE, "F%d.%d before stage %d's F", a->mb, a->chunk, a->stage - 1);
    if (s->d.shapes == PP_SHAPES_PER_MESSAGE || s->d.shapes == PP_SHAPES_AUTO) {
        /* that F may have taken shapes from its sender: describe this stage's layers from them */
        _pp_bnd in = *_pp_plan_bnd(&s->plan, a->mb, c->la);
        if ((rc = _pp_apply_shapes(s, a, &in)) != PP_OK) return rc;
    }
    bytes = _pp_stash_carve(&s->plan, a->mb, c->la, c->lb, 0, NULL, NULL, NULL, NULL);
    if (!(pr->blk = _pp_block_get(s, bytes)))
        return _pp_stage_fail(s, PP_ERR_NOMEM, "stash of %zu bytes for F%d.%d", bytes, a->mb, a->chunk);
    s->src[c->slot] = _pp_block_ref(s->live[from]);
    return PP_OK;
}

/* An evaluation's copy of n bytes out of a block (or the batch's input) to dst: memcpy on the
   host, device.copy with device blocks (enqueued on the rank's stream). */
static pp_result _pp_copy_out(pp_stage* s, void* dst, const void* src, size_t n) {
    if (!n) return PP_OK;
    if (!s->d.device.alloc) {
        memcpy(dst, src, n);
        return PP_OK;
    }
    if (!s->d.device.copy || s->d.device.copy(s->d.device.user, dst, src, n, 1) != PP_OK)
        return _pp_stage_fail(s, s->d.device.copy ? PP_ERR_TRANSPORT : PP_ERR_UNSUPPORTED,
                              "copying %zu bytes of the evaluation's outputs%s", n,
                              s->d.device.copy ? " (device.copy failed)" : ": device blocks without device.copy");
    return PP_OK;
}

/* The bytes micro-batch mb's outputs (boundary L-1) take in one block, tensor after tensor. */
static size_t _pp_eval_block_bytes(const pp_stage* s, int mb) {
    const _pp_bnd* bd = _pp_plan_bnd(&s->plan, mb, s->L - 1);
    size_t n = 0;
    int k;
    for (k = 0; k < bd->n; k++) n += _pp_slice(&s->plan, pp_tensor_bytes(&bd->t[k]), 0);
    return n;
}

/* An evaluation's last stage, after its F: the micro-batch's outputs (the last layer's inputs, in
   c's views) go to the caller's buffers where this rank is the one that gets them, else into a
   block kept for the end of the list (_pp_eval_exchange). */
static pp_result _pp_eval_keep(pp_stage* s, const _pp_act* c, const _pp_view* vw) {
    const pp_tensor* t = &vw->act[(s->L - 1 - c->la) * PP_MAX_TENSORS];
    int n = vw->nact[s->L - 1 - c->la], k, mb = c->a->mb;
    size_t off = 0;
    pp_result rc;
    _pp_block* blk;
    if (s->ev_rank == s->d.rank) {
        pp_eval_out* o = s->ev_out;
        for (k = 0; k < n && k < PP_MAX_TENSORS; k++) {
            size_t at = _pp_eval_off(&s->plan, mb, k), bytes = pp_tensor_bytes(&t[k]);
            if (!o->data[k]) continue;
            if (at + bytes > o->cap[k])
                return _pp_stage_fail(s, PP_ERR_SIZE, "the evaluation's output %d of micro-batch %d ends at byte %zu, "
                                      "pp_eval_out.cap[%d] is %zu", k, mb, at + bytes, k, o->cap[k]);
            if ((rc = _pp_copy_out(s, (unsigned char*)o->data[k] + at, t[k].data, bytes)) != PP_OK) return rc;
        }
        return PP_OK;
    }
    if (s->eout[mb])
        return _pp_stage_fail(s, PP_ERR_SCHEDULE, "F%d.%d: the outputs of micro-batch %d twice", mb, c->a->chunk, mb);
    if (!(blk = _pp_block_get(s, _pp_eval_block_bytes(s, mb))))
        return _pp_stage_fail(s, PP_ERR_NOMEM, "a block of %zu bytes for the evaluation's outputs of micro-batch %d",
                              _pp_eval_block_bytes(s, mb), mb);
    s->eout[mb] = blk;
    for (k = 0; k < n; k++) {
        size_t bytes = pp_tensor_bytes(&t[k]);
        if ((rc = _pp_copy_out(s, blk->data + off, t[k].data, bytes)) != PP_OK) return rc;
        off += _pp_slice(&s->plan, bytes, 0);
    }
    return PP_OK;
}

/* An evaluation's F is done with its stash once its output left: the stash goes back, unless
   the next stage is this rank's and reads the output in place (the turn of the V, every
   boundary at p = 1); an F fed that way lets go of the stash it read, and the previous stage's
   stash goes back. So a rank holds one stash at a time, two at a turn. */
static void _pp_eval_release(pp_stage* s, const _pp_act* c) {
    const pp_action* a = c->a;
#ifdef PP_TEST_NO_EVAL_FREE /* negative control (tests/test_eval.c): the stashes are kept to the step's end */
    if (s->eval) return;
#endif
    if (_pp_turn(s, a->stage)) {
        pp_action fa = *a;
        _pp_act f = *c;
        int chunk;
        fa.stage = (int16_t)(a->stage - 1);
        pp_schedule_stage_to_rank(s->d.schedule, fa.stage, NULL, &chunk);
        fa.chunk = (int8_t)chunk;
        f.a = &fa;
        f.slot = _pp_slot(s, a->mb, fa.stage);
        _pp_stage_layers(s, fa.stage, &f.la, &f.lb);
        _pp_block_unref(s, &s->src[c->slot]);
        if (s->live[f.slot]) _pp_slot_release(s, &f);
    }
    if (!_pp_turn(s, a->stage + 1) && s->live[c->slot]) _pp_slot_release(s, c);
}

/* The end of an evaluation's list, where the outputs go to another rank than the last stage's:
   the last stage's rank sends every micro-batch's outputs in one group, micro-batch by
   micro-batch, tensor by tensor (tagged as gradients into stage 0, which an evaluation never
   sends), the rank that gets them receives them in the same order and copies them out. Both
   sides are past their lists: over pipeline_nccl.h, which matches in order, these messages come
   after every other message between the two in both ranks' orders, and no action waits for them. */
static pp_result _pp_eval_exchange(pp_stage* s) {
    const pp_transport* t = &s->d.transport;
    int to = s->ev_rank, from = s->last_rank, m = s->plan.m, mb, k, n_req;
    pp_result rc = PP_OK;
    if (to < 0 || to == from || (s->d.rank != to && s->d.rank != from)) return PP_OK;
    if (s->d.rank == from) {
        for (mb = 0; mb < m && rc == PP_OK; mb++) /* a drained step may lack some: zeros go instead */
            if (!s->eout[mb]) {
                size_t bytes = _pp_eval_block_bytes(s, mb);
                if (!(s->eout[mb] = _pp_block_get(s, bytes)))
                    rc = _pp_stage_fail(s, PP_ERR_NOMEM, "a block of %zu bytes for the evaluation's outputs", bytes);
                else if (!s->d.device.zero)
                    memset(s->eout[mb]->data, 0, bytes);
                else if (s->d.device.zero(s->d.device.user, s->eout[mb]->data, bytes) != PP_OK)
                    rc = _pp_stage_fail(s, PP_ERR_TRANSPORT, "zeroing %zu bytes of a drained step's outputs", bytes);
            }
        if (t->group_start) t->group_start(t->self);
        for (mb = 0; mb < m && rc == PP_OK; mb++) {
            const _pp_bnd* bd = _pp_plan_bnd(&s->plan, mb, s->L - 1);
            size_t off = 0;
            for (k = 0; k < bd->n && rc == PP_OK; k++) {
                size_t bytes = pp_tensor_bytes(&bd->t[k]);
                _pp_block* b = s->eout[mb];
                if ((rc = t->isend(t->self, to, _pp_tag(s, 1, mb, 0, k), b->data + off, bytes, &b->req[b->n_req])) != PP_OK) {
                    _pp_stage_fail(s, rc, "sending the evaluation's outputs of micro-batch %d to rank %d", mb, to);
                    break;
                }
                b->n_req++;
                s->st.bytes_sent += bytes;
                s->st.msgs_sent++;
                if (s->n_sent) s->n_sent[to]++;
                off += _pp_slice(&s->plan, bytes, 0);
            }
        }
        if (t->group_end) t->group_end(t->self);
        if (rc != PP_OK) return rc; /* the blocks go back in _pp_stage_recover */
        for (mb = 0; mb < m; mb++) {
            _pp_block_put(s, s->eout[mb]); /* retiring until its sends are done */
            s->eout[mb] = NULL;
        }
        return PP_OK;
    }
    /* the rank that gets them: a block per micro-batch, every receive posted, then waited for */
    for (mb = 0; mb < m; mb++) {
        size_t bytes = _pp_eval_block_bytes(s, mb);
        if (!(s->eout[mb] = _pp_block_get(s, bytes)))
            return _pp_stage_fail(s, PP_ERR_NOMEM, "a block of %zu bytes for the evaluation's outputs", bytes);
    }
    if (t->group_start) t->group_start(t->self);
    for (mb = 0; mb < m && rc == PP_OK; mb++) {
        const _pp_bnd* bd = _pp_plan_bnd(&s->plan, mb, s->L - 1);
        _pp_block* b = s->eout[mb];
        size_t off = 0;
        for (k = 0; k < bd->n; k++) {
            size_t bytes = pp_tensor_bytes(&bd->t[k]);
            if ((rc = t->irecv(t->self, from, _pp_tag(s, 1, mb, 0, k), b->data + off, bytes, &b->req[b->n_req])) != PP_OK) {
                _pp_stage_fail(s, rc, "posting the receive of the evaluation's outputs of micro-batch %d from rank %d", mb,
                               from);
                break;
            }
            b->n_req++;
            off += _pp_slice(&s->plan, bytes, 0);
        }
    }
    if (t->group_end) t->group_end(t->self);
    for (mb = 0; mb < m && rc == PP_OK; mb++) {
        const _pp_bnd* bd = _pp_plan_bnd(&s->plan, mb, s->L - 1);
        _pp_block* b = s->eout[mb];
        double t0 = _pp_now();
        size_t off = 0;
        for (n_req = 0; n_req < b->n_req && rc == PP_OK; n_req++) {
            rc = t->wait(t->self, &b->req[n_req], s->d.timeout_s, &s->err);
            b->req[n_req].done = 1;
            if (rc != PP_OK) {
                _pp_stage_fail(s, rc, "waiting for the evaluation's outputs of micro-batch %d from rank %d: %s", mb, from,
                               s->err.msg);
                if (rc == PP_ERR_TIMEOUT) _pp_stage_explain(s, from);
                break;
            }
            s->st.bytes_recv += pp_tensor_bytes(&bd->t[n_req]);
            if (s->n_recv) s->n_recv[from]++;
        }
        s->st.t_wait += _pp_now() - t0;
        for (k = 0; k < bd->n && rc == PP_OK; k++) {
            size_t bytes = pp_tensor_bytes(&bd->t[k]);
            if (k < PP_MAX_TENSORS && s->ev_out->data[k])
                rc = _pp_copy_out(s, (unsigned char*)s->ev_out->data[k] + _pp_eval_off(&s->plan, mb, k), b->data + off, bytes);
            off += _pp_slice(&s->plan, bytes, 0);
        }
    }
    /* the blocks go back (on failure: the receives not waited for are withdrawn first) */
    for (mb = 0; mb < m; mb++) {
        _pp_block* b = s->eout[mb];
        if (!b) continue;
        for (k = 0; k < b->n_req; k++) _pp_retire_recv(s, &b->req[k]);
        b->n_req = 0;
        _pp_block_put(s, b);
        s->eout[mb] = NULL;
    }
    return rc;
}

/* Recomputation: takes slot c's recompute block (the parts of the stash recomputation drops) for
   an F or the recompute before a B; 0 bytes (no layer of the stage recomputed) takes none. */
static pp_result _pp_rc_take(pp_stage* s, const _pp_act* c) {
    int part;
    for (part = 1; part <= 2 && s->plan.rc; part++) {
        _pp_block** blk = part == 1 ? &s->rlive[c->slot] : &s->rblive[c->slot];
        size_t bytes = _pp_rc_carve(&s->plan, c->a->mb, c->la, c->lb, part, 0, NULL, NULL, NULL, NULL, NULL);
        if (!bytes) continue;
        if (!(*blk = _pp_block_get(s, bytes)))
            return _pp_stage_fail(s, PP_ERR_NOMEM, "recompute block of %zu bytes for %c%d.%d", bytes, "FBW"[c->a->op % 3],
                                  c->a->mb, c->a->chunk);
        s->live_bytes += (*blk)->want;
    }
    if (s->live_bytes > s->st.peak_stash_bytes) s->st.peak_stash_bytes = s->live_bytes;
    return PP_OK;
}

/* Slot c's share in live_mem changes by d (pp_step_stats.peak_mem follows). */
static void _pp_mem_add(pp_stage* s, const _pp_act* c, double d) {
    s->smem[c->slot] += d;
    if ((s->live_mem += d) > s->st.peak_mem) s->st.peak_mem = s->live_mem;
}

/* Recomputation before B: the recomputed layers' forwards run again from what the stash kept,
   into the recompute blocks (the stage's output to its shadow there; the same bits). The loss
   they compute is not the step's (written once, by the F), and no check runs: the F checked
   these very bytes. The views then point at the stash again. */
static pp_result _pp_recompute(pp_stage* s, const _pp_act* c, _pp_view* vw, _pp_block* stash, _pp_block* gws) {
    pp_result rc = PP_OK;
    float loss;
    int l;
    if ((!s->rlive[c->slot] && !s->rblive[c->slot]) || s->draining) return PP_OK;
#ifdef PP_TEST_NO_RECOMPUTE /* negative control (tests/test_recompute.c): B reads stale scratch */
    return PP_OK;
#endif
    if (s->rblive[c->slot]) /* the shadows */
        _pp_rc_carve(&s->plan, c->a->mb, c->la, c->lb, 2, 1, s->rblive[c->slot]->data, vw->act, vw->saved, vw->bsaved, NULL);
    for (l = c->la; l < c->lb && rc == PP_OK; l++) {
        int i = l - c->la;
        if (!s->plan.rc[l]) continue;
        rc = _pp_forward_range(&s->d.model, s->d.weights, c->mb, l, l + 1, vw->act + i * PP_MAX_TENSORS, vw->nact + i,
                               vw->saved + i, c->sb, vw->bsaved + i, c->bsb, &loss, s->d.layer_ctx, s->d.tp, &s->plan, &s->err);
    }
    *vw = _pp_views(s, c, stash, gws);
    if (rc == PP_OK) return PP_OK;
    {
        size_t k = strlen(s->err.msg);
        snprintf(s->err.msg + k, sizeof s->err.msg - k, " (recomputed before the B)");
    }
    return _pp_stage_wrap(s, rc, c->a);
}

/* F: the stash (with the received input) stays live until B (or W); the output goes on (at the
   turn of the V it stays: the next stage reads it in this stash). With recomputation, the parts
   of the stash it drops live in the recompute block during the F only. */
static pp_result _pp_run_f(pp_stage* s, const _pp_act* c, _pp_prep* pr) {
    _pp_view vw;
    const pp_action* a = c->a;
    _pp_block* blk;
    pp_result rc;
    size_t bb;
    if (_pp_turn(s, a->stage) && (rc = _pp_turn_in(s, c, pr)) != PP_OK) return rc;
    bb = _pp_bsaved_carve(&s->plan, a->mb, c->la, c->lb, NULL, NULL); /* the shapes _pp_turn_in applied */
    blk = pr->blk;
    pr->blk = NULL;
    if (bb && !(s->blive[c->slot] = _pp_block_get(s, bb))) {
        _pp_block_put(s, blk);
        return _pp_stage_fail(s, PP_ERR_NOMEM, "B-only scratch of %zu bytes for F%d.%d", bb, a->mb, a->chunk);
    }
    if ((rc = _pp_rc_take(s, c)) != PP_OK) {
        _pp_block_put(s, blk);
        return rc;
    }
    vw = _pp_views(s, c, blk, NULL);
    s->live[c->slot] = blk;
    if (++s->n_live > s->st.peak_live) s->st.peak_live = s->n_live;
    _pp_mem_add(s, c, 1);
    s->live_bytes += blk->want + (bb ? s->blive[c->slot]->want : 0);
    if (s->live_bytes > s->st.peak_stash_bytes) s->st.peak_stash_bytes = s->live_bytes;
    if (!s->draining) {
        rc = _pp_forward_range(&s->d.model, s->d.weights, c->mb, c->la, c->lb, vw.act, vw.nact, vw.saved, c->sb,
                               vw.bsaved, c->bsb, &s->mb_loss[a->mb], s->d.layer_ctx, s->d.tp, &s->plan, &s->err);
        if (rc != PP_OK) rc = _pp_stage_wrap(s, rc, a);
        else if (s->d.check_finite)
            rc = _pp_check_finite_f(s, a, c->la, c->lb, vw.act, vw.nact);
        else if (a->stage == s->S - 1 && !s->d.allow_nonfinite_loss)
            rc = _pp_check_loss(s, a, &s->mb_loss[a->mb], 0);
        if (rc != PP_OK && !_pp_drain(s, rc)) return rc;
    }
    if (s->rlive[c->slot] || s->rblive[c->slot]) { /* the dropped parts go until the recompute before B */
        double bshare, rshare;
        _pp_shares(s, c, &bshare, &rshare);
        _pp_mem_add(s, c, -rshare);
        _pp_scratch_release(s, &s->rlive[c->slot]);
        _pp_scratch_release(s, &s->rblive[c->slot]);
    }
    _pp_mark(s, c, 1);
    if (s->draining && (rc = _pp_drain_zero(s, &vw.act[(c->lb - c->la) * PP_MAX_TENSORS], vw.nact[c->lb - c->la])) != PP_OK)
        return rc;
    s->st.t_forward += _pp_now() - c->t0;
    /* an evaluation's last stage: its outputs (a drained step's too: what the rank that gets
       them waits for must come) */
    if (s->eval && a->stage == s->S - 1 && s->ev_rank >= 0 && (rc = _pp_eval_keep(s, c, &vw)) != PP_OK && !_pp_drain(s, rc))
        return rc;
    if (a->stage < s->S - 1 && !_pp_turn(s, a->stage + 1) && (rc = _pp_send_output(s, a, blk, &vw, c->la, c->lb)) != PP_OK)
        return rc;
    if (s->eval) _pp_eval_release(s, c);
    return PP_OK;
}

/* B: the input gradient (and the weight gradients unless W is deferred) into the workspace; the
   input gradient goes back (at the turn of the V it stays: the previous stage's B reads it in this
   workspace, through s->gin); stash and workspace are freed, or kept for W. */
static pp_result _pp_run_b(pp_stage* s, const _pp_act* c, _pp_prep* pr) {
    _pp_view vw;
    const pp_action* a = c->a;
    _pp_block* stash = s->live[c->slot];
    _pp_block* gws = pr->blk;
    int in_turn = _pp_turn(s, a->stage), computed;
    pp_result rc;
    pr->blk = NULL;
    if (!stash || (_pp_turn(s, a->stage + 1) && !s->gin[c->slot])) {
        _pp_block_put(s, gws);
        return _pp_stage_fail(s, PP_ERR_SCHEDULE, "B%d.%d before its %s", a->mb, a->chunk, stash ? "next stage's B" : "F");
    }
    if ((rc = _pp_rc_take(s, c)) != PP_OK) {
        _pp_block_put(s, gws);
        return rc;
    }
    if (s->rlive[c->slot] || s->rblive[c->slot]) { /* the recomputed part is back, until B (or W) */
        double bshare, rshare;
        _pp_shares(s, c, &bshare, &rshare);
        _pp_mem_add(s, c, rshare);
    }
    vw = _pp_views(s, c, stash, gws);
    computed = !s->draining;
    if (computed && (rc = _pp_recompute(s, c, &vw, stash, gws)) != PP_OK && !_pp_drain(s, rc)) {
        _pp_block_put(s, gws);
        return rc;
    }
    rc = PP_OK;
    computed = !s->draining;
    if (computed) {
        rc = _pp_grad_range(0, &s->d.model, s->d.weights, s->d.grads, c->mb, c->la, c->lb, vw.act, vw.nact, vw.dact,
                            vw.saved, c->sb, vw.bsaved, c->bsb, s->d.layer_ctx, s->d.tp, &s->plan, &s->err);
        /* a split model on a schedule without W: the weight gradients now */
        if (rc == PP_OK && s->d.model.weight_grad && !s->defer_w)
            rc = _pp_grad_range(1, &s->d.model, s->d.weights, s->d.grads, c->mb, c->la, c->lb, vw.act, vw.nact, vw.dact,
                                vw.saved, c->sb, vw.bsaved, c->bsb, s->d.layer_ctx, s->d.tp, &s->plan, &s->err);
        if (rc != PP_OK) rc = _pp_stage_wrap(s, rc, a);
        else if (s->d.check_finite)
            rc = _pp_check_finite_b(s, a, c->la, c->lb, vw.dact, vw.nact);
        if (rc != PP_OK && _pp_drain(s, rc)) rc = PP_OK;
    }
    if (rc == PP_OK) {
        _pp_mark(s, c, 1);
        s->st.t_backward += _pp_now() - c->t0;
        /* the workspace was zeroed when it was taken, but a layer may have written before it failed
           (this action's: a later one computes nothing) */
        if (s->draining && computed && a->stage > 0) rc = _pp_drain_zero(s, vw.dact, vw.nact[0]);
    }
    /* without W the stash is done with: back to the pool before the send's group, whose record
       of the compute stream then comes after its last use (pp_transport.released) */
    if (rc == PP_OK && !s->defer_w) _pp_slot_release(s, c);
    if (rc == PP_OK && a->stage > 0 && !in_turn)
        rc = _pp_send_bnd(s, a, gws, _pp_plan_bnd(&s->plan, a->mb, c->la), vw.dact, vw.nact[0], a->prev_rank, 1, a->stage, 0);
    if (rc != PP_OK) {
        _pp_block_put(s, gws);
        return rc;
    }
    if (in_turn) s->gin[_pp_slot(s, a->mb, a->stage - 1)] = _pp_block_ref(gws);
    if (s->defer_w) {
        /* W still needs the stash (inputs) and the workspace (output gradients), not the B-only
           scratch */
        s->wlive[c->slot] = gws;
        s->live_bytes += gws->want;
        if (s->live_bytes > s->st.peak_stash_bytes) s->st.peak_stash_bytes = s->live_bytes;
#ifndef PP_TEST_NO_B_FREE /* negative control (tests/test_zb.c): the B-only scratch waits for W */
        if (s->blive[c->slot] || s->rblive[c->slot]) { /* with the recompute block's part only B reads */
            double bshare, rshare;
            _pp_shares(s, c, &bshare, &rshare);
            _pp_mem_add(s, c, -bshare);
            _pp_bsaved_release(s, c->slot);
            _pp_scratch_release(s, &s->rblive[c->slot]);
        }
#endif
    } else {
        _pp_block_put(s, gws);
    }
    return PP_OK;
}

/* W: the deferred weight gradients, in the stash and workspace B left in place (a no-op when B
   did them: the schedule has no W or the model no weight_grad). */
static pp_result _pp_run_w(pp_stage* s, const _pp_act* c) {
    _pp_view vw;
    const pp_action* a = c->a;
    _pp_block *stash = s->live[c->slot], *gws = s->wlive[c->slot];
    pp_result rc;
    if (s->defer_w) {
        if (!stash || !gws) return _pp_stage_fail(s, PP_ERR_SCHEDULE, "W%d.%d before its B", a->mb, a->chunk);
        vw = _pp_views(s, c, stash, gws);
        if (!s->draining) {
            rc = _pp_grad_range(1, &s->d.model, s->d.weights, s->d.grads, c->mb, c->la, c->lb, vw.act, vw.nact, vw.dact,
                                vw.saved, c->sb, vw.bsaved, c->bsb, s->d.layer_ctx, s->d.tp, &s->plan, &s->err);
            if (rc != PP_OK && !_pp_drain(s, rc = _pp_stage_wrap(s, rc, a))) return rc;
        }
        _pp_slot_release(s, c);
    }
    _pp_mark(s, c, 1);
    s->st.t_backward += _pp_now() - c->t0;
    return PP_OK;
}

/* Gradients final (pp_stage_desc.grads_final). For each chunk, the index of the action after which
   its gradients of a step are complete: its last W where W is deferred, else its last B (-1: a
   chunk with no backward in the list). */
static int* _pp_gfinal_table(const pp_stage* s) {
    int* g = (int*)_pp_calloc((size_t)s->v, sizeof *g);
    int i;
    if (!g) return NULL;
    for (i = 0; i < s->v; i++) g[i] = -1;
    for (i = 0; i < s->n_list; i++) {
        const pp_action* a = &s->list[i];
#ifdef PP_TEST_GRADS_FINAL_AT_B /* negative control (build/overlap-controls): W's gradients come after */
        if (a->op == PP_OP_B && a->chunk >= 0 && a->chunk < s->v) g[a->chunk] = i;
#else
        if (a->op == (s->defer_w ? PP_OP_W : PP_OP_B) && a->chunk >= 0 && a->chunk < s->v) g[a->chunk] = i;
#endif
    }
    return g;
}

static void _pp_dp_note_step(void* user, int64_t step);
static void _pp_dp_note_end(void* user, pp_stage* s, pp_result rc);

/* After action idx: the hook for every chunk whose gradients it completed. pp_dp_overlap's hook
   is first told the step's identity (the same on every rank of the grid: each pipeline's rank 0
   counts its pp_stage_step calls), which its messages carry (>>grad). */
static pp_result _pp_grads_final(pp_stage* s, int idx, double t_start) {
    int k;
    for (k = 0; k < s->v; k++) {
        pp_result rc;
        double t0;
#ifdef PP_TEST_NO_GRADS_FINAL /* negative control (build/overlap-controls): the hook never fires */
        break;
#endif
        if (s->gfinal[k] != idx) continue;
        t0 = _pp_now();
        s->st.t_grads_final = t0 - t_start;
        if (!s->d.grads_final) continue;
        if (s->d.grads_final == pp_dp_overlap_hook) _pp_dp_note_step(s->d.grads_final_user, s->n_steps);
        rc = s->d.grads_final(s->d.grads_final_user, s->d.rank, s->list[idx].stage);
        s->st.t_grads_hook += _pp_now() - t0;
        if (rc != PP_OK)
            return _pp_stage_fail(s, rc, "rank %d: the gradients-final hook of stage %d failed (%s)", s->d.rank,
                                  s->list[idx].stage, pp_result_str(rc));
    }
    return PP_OK;
}

/* pp_stage_desc.tp: reassembles the split tensors of the boundary action a just received (F: the
   stage's input; B: its output's gradient), each replicated one all-gathered by rows over the TP
   group, in place. It runs while a failed step drains too: the group's other ranks wait for it. */
static pp_result _pp_tp_gather(pp_stage* s, const pp_action* a, _pp_prep* pr) {
    pp_tensor ts[PP_MAX_TENSORS];
    const _pp_bnd* bd;
    int k, n = 0, la, lb;
    double t0;
    if (s->tp_n <= 1 || !s->tp_split || !pr->blk || a->op == PP_OP_W) return PP_OK;
    _pp_stage_layers(s, a->stage, &la, &lb);
    if (a->op == PP_OP_F) {
        if (a->stage == 0 || _pp_turn(s, a->stage)) return PP_OK;
        bd = _pp_plan_bnd(&s->plan, a->mb, la);
        _pp_stash_carve(&s->plan, a->mb, la, la, 1, pr->blk->data, ts, &n, NULL);
    } else { /* the output gradient, first in the workspace (as _pp_prepare received it) */
        size_t off = 0;
        if (a->stage >= s->S - 1 || _pp_turn(s, a->stage + 1)) return PP_OK;
        bd = _pp_plan_bnd(&s->plan, a->mb, lb);
        n = bd->n;
        for (k = 0; k < n; k++) {
            ts[k] = bd->t[k];
            ts[k].data = NULL;
            if (!pp_dtype_is_float(bd->t[k].dtype)) continue;
            ts[k].data = pr->blk->data + off;
            off += _pp_slice(&s->plan, pp_tensor_bytes(&bd->t[k]), 0);
        }
    }
    t0 = _pp_now();
    for (k = 0; k < n; k++) {
        size_t rb = (size_t)ts[k].cols * pp_dtype_size(ts[k].dtype), o, l;
        pp_error e;
        pp_result rc;
        if (!ts[k].data || bd->tp[k] != PP_TP_REPLICATED || rb == 0) continue;
        _pp_tp_cut(s, &ts[k], PP_TP_REPLICATED, &o, &l);
#ifndef PP_TEST_TP_NO_GATHER /* negative control (build/tp-controls): the other TP ranks' rows never arrive */
        rc = _pp_tp_ag_units(s->tp_t, s->tp_ranks, s->tp_n, s->tp_me, (unsigned char*)ts[k].data + o, ts[k].data,
                             (size_t)ts[k].rows, rb, _pp_tp_step_tag(_PP_TAG_TP_BND, s->n_steps), s->tp_to, &e);
#else
        rc = PP_OK;
        e.msg[0] = 0;
#endif
        if (rc != PP_OK) {
            s->st.t_tp_gather += _pp_now() - t0;
            return _pp_stage_fail(s, rc, "%c%d.%d: gathering boundary tensor %d over the TP group (TP rank %d of %d): %s",
                                  a->op == PP_OP_F ? 'F' : 'B', a->mb, a->chunk, k, s->tp_me, s->tp_n, e.msg);
        }
        s->st.tp_gather_bytes += l * (uint64_t)(s->tp_n - 1);
    }
    s->st.t_tp_gather += _pp_now() - t0;
    return PP_OK;
}

/* Action idx: wait for its receives (prepared one action ahead), run it, record it. */
static pp_result _pp_run(pp_stage* s, int idx) {
    _pp_prep* pr = &s->prep[idx & 1];
    const pp_action* a = &s->list[idx];
    _pp_act c;
    pp_result rc;
    c.a = a;
    c.idx = idx;
    c.mb = &s->plan.mbs[a->mb];
    c.sb = &s->plan.saved[(size_t)a->mb * s->L];
    c.bsb = &s->plan.bsaved[(size_t)a->mb * s->L];
    c.slot = a->mb * s->v + a->chunk;
    _pp_stage_layers(s, a->stage, &c.la, &c.lb);
    _pp_stage_note(s, a, PP_FLIGHT_START, _pp_awaited(s, a));
    if ((rc = _pp_wait_prep(s, pr, a)) != PP_OK) return rc;
    if (a->op == PP_OP_F && a->stage > 0 && (s->d.shapes == PP_SHAPES_PER_MESSAGE || s->d.shapes == PP_SHAPES_AUTO) &&
        !_pp_turn(s, a->stage) && (rc = _pp_receive_input(s, a, pr)) != PP_OK)
        return rc;
    if ((rc = _pp_tp_gather(s, a, pr)) != PP_OK) return rc;
    _pp_stage_heard(s, a);
    c.t0 = _pp_now();
    _pp_mark(s, &c, 0);
    rc = a->op == PP_OP_F ? _pp_run_f(s, &c, pr) : a->op == PP_OP_B ? _pp_run_b(s, &c, pr) : _pp_run_w(s, &c);
    if (rc != PP_OK) return rc;
    if (s->d.record_timeline && s->events) {
        pp_event* e = &s->events[s->n_events++];
        e->rank = s->d.rank;
        e->a = *a;
        e->start = c.t0;
        e->end = _pp_now();
    }
    _pp_stage_note(s, a, PP_FLIGHT_DONE, -1);
    pr->idx = -1;
    return PP_OK;
}

/* The stage's forward-only list (pp_stage_eval), proven like the training list: by the simulator
   (pp_schedule_make_eval) and by the transport (check_schedule; pipeline_nccl.h proves its
   message order and its groups under rendezvous sends). A list the transport refuses, or
   tags an evaluation cannot have, leave the stage without evaluations (eval_rc says why; the
   training steps are unaffected); only a lack of memory fails the create. */
static pp_result _pp_eval_init(pp_stage* s, pp_error* err) {
    const pp_schedule* sc = s->d.schedule;
    size_t n = pp_schedule_eval_size(sc);
    pp_error e;
    e.msg[0] = 0;
    if (!n || !(s->eacts = (pp_action*)_pp_calloc(n, sizeof *s->eacts)))
        return _pp_fail(err, PP_ERR_NOMEM, "forward-only list of %zu actions", n);
    s->eval_rc = pp_schedule_make_eval(sc, s->eacts, n, &s->esched, &e);
    if (s->eval_rc == PP_ERR_NOMEM) return _pp_fail(err, PP_ERR_NOMEM, "%s", e.msg);
    if (s->eval_rc == PP_OK && (((int64_t)2 * sc->m * s->S * (PP_MAX_TENSORS + 1) * 2) << _PP_GEN_BITS) > _PP_TAG_RESERVED) {
        s->eval_rc = PP_ERR_UNSUPPORTED;
        snprintf(e.msg, sizeof e.msg, "%d micro-batches x %d stages leave no message tags for an evaluation's", sc->m, s->S);
    }
    if (s->eval_rc == PP_OK && sc->p > 1 && s->d.transport.check_schedule)
        s->eval_rc = s->d.transport.check_schedule(s->d.transport.self, &s->esched, &e);
    if (s->eval_rc != PP_OK) {
        snprintf(s->eval_why, sizeof s->eval_why, "rank %d: no evaluation on this schedule: %s", s->d.rank,
                 _pp_strip_code(e.msg, s->eval_rc));
    } else { /* proven: this rank keeps its own list only (a pipeline's p stages would hold p copies of all) */
        pp_action* own = (pp_action*)_pp_calloc((size_t)s->esched.per_rank, sizeof *own);
        if (!own) return _pp_fail(err, PP_ERR_NOMEM, "forward-only list of %d actions", s->esched.per_rank);
        memcpy(own, pp_schedule_rank(&s->esched, s->d.rank), sizeof *own * (size_t)s->esched.per_rank);
        PP_FREE(s->eacts);
        s->eacts = own;
        s->esched.actions = NULL;
    }
    return PP_OK;
}

pp_result pp_stage_create(const pp_stage_desc* d, pp_stage** out, pp_error* err) {
    pp_stage* s = NULL;
    pp_sim_result* sim = NULL;
    pp_sim_cost cost;
    pp_result rc;
    int st, ml = 0, i, ok = 1;
    if (!out) return _pp_fail(err, PP_ERR_INVALID, "output pointer is NULL");
    *out = NULL;
    if (!d) return _pp_fail(err, PP_ERR_INVALID, "stage desc is NULL");
    if ((rc = pp_model_check(&d->model, err)) != PP_OK) return rc;
    if (!d->grads) return _pp_fail(err, PP_ERR_INVALID, "grads is NULL");
    if (!d->weights) return _pp_fail(err, PP_ERR_INVALID, "weights is NULL (describe reads the layers' parameters)");
    if (!(d->timeout_s >= 0 && d->timeout_s <= 1e9))
        return _pp_fail(err, PP_ERR_INVALID, "timeout_s = %g: must be 0 (the default, %g s) or a positive number of seconds up to 1e9",
                        d->timeout_s, (double)PP_DEFAULT_TIMEOUT_S);
    if (d->check_finite != 0 && d->check_finite != 1)
        return _pp_fail(err, PP_ERR_INVALID, "check_finite = %d (0 or 1)", d->check_finite);
    if (d->allow_nonfinite_loss != 0 && d->allow_nonfinite_loss != 1)
        return _pp_fail(err, PP_ERR_INVALID, "allow_nonfinite_loss = %d (0 or 1)", d->allow_nonfinite_loss);
    if (d->check_finite && d->allow_nonfinite_loss)
        return _pp_fail(err, PP_ERR_INVALID,
                        "check_finite = 1 checks the loss too, allow_nonfinite_loss = 1 lets it pass: set one of them");
    if (!d->schedule || !d->schedule->actions)
        return _pp_fail(err, PP_ERR_INVALID, "schedule is NULL (make one with pp_schedule_make)");
    if (d->schedule->any_order != 0 && d->schedule->any_order != 1)
        return _pp_fail(err, PP_ERR_INVALID, "schedule's any_order = %d (0 or 1; zero the struct before filling it by hand)",
                        d->schedule->any_order);
    if (d->schedule->forward_only)
        return _pp_fail(err, PP_ERR_INVALID, "the schedule is a forward-only list (forward_only = %d): give the training "
                        "schedule; the stage makes its forward-only list itself (pp_stage_eval)", d->schedule->forward_only);
    if (d->rank < 0 || d->rank >= d->schedule->p)
        return _pp_fail(err, PP_ERR_INVALID, "rank %d is outside the schedule's %d ranks", d->rank, d->schedule->p);
    if ((rc = pp_partition_check(d->partition, d->model.n_layers, d->schedule->n_stages, err)) != PP_OK) return rc;
    if (d->shapes < PP_SHAPES_LOCAL || d->shapes > PP_SHAPES_AUTO)
        return _pp_fail(err, PP_ERR_INVALID, "unknown shape policy %d", (int)d->shapes);
    if ((d->device.alloc != NULL) != (d->device.free != NULL) || (d->device.alloc != NULL) != (d->device.zero != NULL))
        return _pp_fail(err, PP_ERR_INVALID, "device ops: set alloc, free and zero together, or none of them");
    if (d->device.alloc && d->check_finite)
        return _pp_fail(err, PP_ERR_UNSUPPORTED, "check_finite reads activations on the host; device blocks cannot use it");
    if (d->device.alloc && (d->shapes == PP_SHAPES_AUTO || d->shapes == PP_SHAPES_PER_MESSAGE))
        return _pp_fail(err, PP_ERR_UNSUPPORTED,
                        "shape policy %s writes headers into blocks on the host; with device blocks use LOCAL or BROADCAST",
                        d->shapes == PP_SHAPES_AUTO ? "AUTO" : "PER_MESSAGE");
    if (d->max_seqs < 0 || d->max_seqs > (1 << 28))
        return _pp_fail(err, PP_ERR_INVALID, "max_seqs = %d (0 for the default, at most 2^28)", d->max_seqs);
    if (d->tp && d->tp->t) {
        int all[PP_MAX_RANKS], n, me;
        const int* ranks;
        double to;
        if ((rc = _pp_tp_setup(d->tp, NULL, NULL, 0, PP_F32, "stage's TP group", all, &ranks, &n, &me, &to, err)) != PP_OK)
            return rc;
        if (n > 1 && !d->tp_whole && (d->shapes == PP_SHAPES_AUTO || d->shapes == PP_SHAPES_PER_MESSAGE))
            return _pp_fail(err, PP_ERR_UNSUPPORTED, "boundaries split across TP (pp_stage_desc.tp, %d ranks) need shape "
                            "policy LOCAL or BROADCAST, not %s", n, d->shapes == PP_SHAPES_AUTO ? "AUTO" : "PER_MESSAGE");
    }
    if (d->schedule->p > 1) {
        if (!d->transport.isend || !d->transport.irecv || !d->transport.wait)
            return _pp_fail(err, PP_ERR_INVALID, "rank %d: transport lacks isend/irecv/wait (p = %d needs one)", d->rank,
                            d->schedule->p);
        if (d->transport.rank != d->rank || d->transport.size < d->schedule->p)
            return _pp_fail(err, PP_ERR_INVALID, "transport is rank %d of %d, the stage is rank %d of %d",
                            d->transport.rank, d->transport.size, d->rank, d->schedule->p);
    }
    /* Prove the schedule before running it. */
    sim = (pp_sim_result*)_pp_calloc(1, sizeof *sim);
    if (!sim) return _pp_fail(err, PP_ERR_NOMEM, "simulator result");
    memset(&cost, 0, sizeof cost);
    rc = pp_simulate(d->schedule, &cost, sim, NULL, err);
    if (rc == PP_OK) rc = _pp_sched_order_check(d->schedule, err);
    if (rc == PP_OK && d->schedule->p > 1 && d->transport.check_schedule)
        rc = d->transport.check_schedule(d->transport.self, d->schedule, err);
    if (rc != PP_OK) {
        PP_FREE(sim);
        return rc;
    }
    s = (pp_stage*)_pp_calloc(1, sizeof *s);
    if (!s) {
        PP_FREE(sim);
        return _pp_fail(err, PP_ERR_NOMEM, "stage");
    }
    PP_FREE(sim);
    s->step_mu_ok = pthread_mutex_init(&s->step_mu, NULL) == 0;
    s->d = *d;
    if (s->d.timeout_s <= 0) s->d.timeout_s = PP_DEFAULT_TIMEOUT_S;
    s->tp_n = 1;
    if (d->tp && d->tp->t) { /* checked above */
        int all[PP_MAX_RANKS], n, me;
        const int* ranks;
        double to;
        _pp_tp_setup(d->tp, NULL, NULL, 0, PP_F32, "stage's TP group", all, &ranks, &n, &me, &to, NULL);
        if (n > 1) {
            if (!(s->tp_ranks = (int*)_pp_calloc((size_t)n, sizeof *s->tp_ranks))) {
                pp_stage_destroy(s);
                return _pp_fail(err, PP_ERR_NOMEM, "TP group of %d ranks", n);
            }
            memcpy(s->tp_ranks, ranks, sizeof *ranks * (size_t)n);
            s->tp_t = d->tp->t;
            s->tp_n = n;
            s->tp_split = !d->tp_whole;
            s->tp_me = me;
            s->tp_to = to;
        }
    }
    s->tp_ctx.step = &s->n_steps;
    s->tp_ctx.tp_n = s->tp_n;
    s->p = d->schedule->p;
    s->v = d->schedule->v;
    s->S = d->schedule->n_stages;
    s->L = d->model.n_layers;
    if (d->recompute) { /* the stage's own copy: the plan's carves read it */
        for (i = 0; i < s->L && ok; i++) ok = d->recompute[i] <= 1;
        if (!ok) {
            pp_stage_destroy(s);
            return _pp_fail(err, PP_ERR_INVALID, "recompute[%d] = %d (0 or 1)", i - 1, d->recompute[i - 1]);
        }
        if (!(s->rc = (unsigned char*)_pp_calloc((size_t)s->L, 1))) {
            pp_stage_destroy(s);
            return _pp_fail(err, PP_ERR_NOMEM, "recompute flags");
        }
        memcpy(s->rc, d->recompute, (size_t)s->L);
        s->d.recompute = s->rc;
    }
    s->list = pp_schedule_rank(d->schedule, d->rank);
    s->n_list = d->schedule->per_rank;
    s->defer_w = pp_schedule_has_w(d->schedule) && d->model.weight_grad != NULL;
    if (!(s->gfinal = _pp_gfinal_table(s))) ok = 0;
    for (st = 0; st < s->S; st++)
        if (d->partition[st + 1] - d->partition[st] > ml) ml = d->partition[st + 1] - d->partition[st];
    s->max_layers = ml;
    if (!(s->turn = (unsigned char*)_pp_calloc((size_t)s->S + 1, 1))) ok = 0;
    else _pp_turn_table(s);
    for (i = 0; i < 2; i++) {
        _pp_view* vw = &s->pv[i];
        vw->act = (pp_tensor*)_pp_calloc((size_t)(ml + 1) * PP_MAX_TENSORS, sizeof *vw->act);
        vw->dact = (pp_tensor*)_pp_calloc((size_t)(ml + 1) * PP_MAX_TENSORS, sizeof *vw->dact);
        vw->nact = (int*)_pp_calloc((size_t)ml + 1, sizeof *vw->nact);
        vw->saved = (void**)_pp_calloc((size_t)ml * 2, sizeof *vw->saved);
        vw->bsaved = vw->saved ? vw->saved + ml : NULL;
        if (!vw->act || !vw->dact || !vw->nact || !vw->saved) ok = 0;
    }
    s->events = d->record_timeline ? (pp_event*)_pp_calloc((size_t)s->n_list, sizeof *s->events) : NULL;
    if (!ok || (d->record_timeline && !s->events)) {
        pp_stage_destroy(s);
        return _pp_fail(err, PP_ERR_NOMEM, "stage scratch");
    }
    if ((((int64_t)s->d.schedule->m * s->S * (PP_MAX_TENSORS + 1) * 2) << _PP_GEN_BITS) > _PP_TAG_RESERVED) {
        pp_stage_destroy(s);
        return _pp_fail(err, PP_ERR_UNSUPPORTED, "%d micro-batches x %d stages do not fit the message tags (at most %lld)",
                        d->schedule->m, d->schedule->n_stages,
                        (long long)(_PP_TAG_RESERVED >> _PP_GEN_BITS) / (2 * (PP_MAX_TENSORS + 1)));
    }
    if ((rc = _pp_agree_init(s, err)) != PP_OK) {
        pp_stage_destroy(s);
        return rc;
    }
    pp_schedule_stage_to_rank(d->schedule, s->S - 1, &s->last_rank, NULL);
    s->ev_rank = -1;
    if ((rc = _pp_eval_init(s, err)) != PP_OK) {
        pp_stage_destroy(s);
        return rc;
    }
    s->prep[0].idx = s->prep[1].idx = -1;
    s->plan.pad = d->shapes == PP_SHAPES_AUTO ? _PP_TRAILER : 0;
    s->plan.guard = d->device.alloc ? 0 : _PP_GUARD; /* read on the host: not in device memory */
    s->plan.rc = s->rc;
    s->flight.rank = d->rank;
    if (s->d.max_seqs <= 0) s->d.max_seqs = 4096;
    *out = s;
    return PP_OK;
}

void pp_stage_destroy(pp_stage* s) {
    int i;
    if (!s) return;
    if (s->step_mu_ok) pthread_mutex_destroy(&s->step_mu);
    for (i = 0; i < 2; i++) _pp_block_free(s, s->prep[i].blk);
    if (s->live)
        for (i = 0; i < s->live_cap; i++) _pp_block_free(s, s->live[i]);
    if (s->wlive)
        for (i = 0; i < s->live_cap; i++) _pp_block_free(s, s->wlive[i]);
    if (s->blive)
        for (i = 0; i < s->live_cap; i++) _pp_block_free(s, s->blive[i]);
    if (s->rlive)
        for (i = 0; i < s->live_cap; i++) _pp_block_free(s, s->rlive[i]), _pp_block_free(s, s->rblive[i]);
    PP_FREE(s->rc);
    PP_FREE(s->tp_ranks);
    PP_FREE(s->smem);
    _pp_free_blocks(s, s->pool);
    _pp_free_blocks(s, s->retiring);
    _pp_plan_free(&s->plan);
    PP_FREE(s->live);
    PP_FREE(s->mb_loss);
    PP_FREE(s->turn);
    PP_FREE(s->gfinal);
    for (i = 0; i < 2; i++) {
        PP_FREE(s->pv[i].act);
        PP_FREE(s->pv[i].dact);
        PP_FREE(s->pv[i].nact);
        PP_FREE(s->pv[i].saved);
    }
    PP_FREE(s->events);
    PP_FREE(s->learned_in);
    PP_FREE(s->learned_out);
    PP_FREE(s->bc_cu);
    PP_FREE(s->bc_msg);
    PP_FREE(s->eacts);
    _pp_agree_free(s);
    PP_FREE(s);
}

const char* pp_stage_error(const pp_stage* s) { return s ? s->err.msg : "stage is NULL"; }

const pp_event* pp_stage_timeline(const pp_stage* s, size_t* n) {
    if (n) *n = s ? s->n_events : 0;
    return s ? s->events : NULL;
}

/* After a failure: tell the other ranks, and put every block back so the stage can step again. */
static void _pp_stage_recover(pp_stage* s) {
    const pp_transport* t = &s->d.transport;
    int i, j;
    /* the hand-overs first: a block let go while referenced goes back here */
    for (i = 0; i < s->live_cap; i++) {
        _pp_block_unref(s, &s->src[i]);
        _pp_block_unref(s, &s->gin[i]);
    }
    for (i = 0; i < 2; i++) {
        /* receives posted for an action that will not run: withdraw them, or a later step's
           message with the same tag would land in a block that is back in the pool */
        for (j = 0; j < s->prep[i].n_req && s->prep[i].idx >= 0; j++)
            if (!s->prep[i].req[j].done && s->prep[i].req[j].impl && t->cancel) t->cancel(t->self, &s->prep[i].req[j]);
        s->prep[i].n_req = 0;
        if (s->prep[i].blk) {
            s->prep[i].blk->n_req = 0;
            _pp_block_put(s, s->prep[i].blk);
        }
        s->prep[i].blk = NULL;
        s->prep[i].idx = -1;
    }
    for (i = 0; i < s->live_cap; i++) {
        if (s->live[i]) {
            s->live[i]->n_req = 0;
            _pp_block_put(s, s->live[i]);
            s->live[i] = NULL;
        }
        if (s->wlive[i]) {
            s->wlive[i]->n_req = 0;
            _pp_block_put(s, s->wlive[i]);
            s->wlive[i] = NULL;
        }
        if (s->blive[i]) {
            _pp_block_put(s, s->blive[i]);
            s->blive[i] = NULL;
        }
        if (s->rlive[i]) {
            _pp_block_put(s, s->rlive[i]);
            s->rlive[i] = NULL;
        }
        if (s->rblive[i]) {
            _pp_block_put(s, s->rblive[i]);
            s->rblive[i] = NULL;
        }
        s->smem[i] = 0;
    }
    for (i = 0; s->eout && i < s->live_cap; i++)
        if (s->eout[i]) { /* an evaluation's outputs: sends (or receives, withdrawn) may still touch them */
            for (j = 0; j < s->eout[i]->n_req && s->d.rank == s->ev_rank; j++) _pp_retire_recv(s, &s->eout[i]->req[j]);
            s->eout[i]->n_req = 0;
            _pp_block_put(s, s->eout[i]);
            s->eout[i] = NULL;
        }
    while (s->retiring) {
        _pp_block* b = s->retiring;
        s->retiring = b->next;
        _pp_block_unuse(s, b);
        b->n_req = 0;
        b->next = s->pool;
        s->pool = b;
    }
    /* a broken step's receives and sends may still touch any block: the transport forgets them all */
    _pp_released(s, NULL, 0);
    /* the plan check's receives, where the step stopped before checking */
    for (i = 0; i < s->n_nb; i++)
        if (s->nb[i].state == 1) {
            _pp_retire_recv(s, &s->nb[i].rreq);
            s->nb[i].state = 2;
        }
    s->n_live = 0;
    s->live_bytes = 0;
    s->live_mem = 0;
    /* what a peer learned is unknown after a broken step: learn every shape again */
    for (i = 0; i < s->learned_cap; i++) s->learned_in[i].n = s->learned_out[i].n = -1;
}

/* BROADCAST: the first stage's rank sends the step's metadata to every other rank in one
   fixed-size message (max_seqs bounds it); the others build their plan from it. */
#define _PP_BC_WORDS 10
static pp_result _pp_broadcast_meta(pp_stage* s, const pp_batch* b, const pp_batch** use) {
    const pp_transport* t = &s->d.transport;
    size_t bytes = sizeof(int64_t) * _PP_BC_WORDS + sizeof(int32_t) * ((size_t)s->d.max_seqs + 1);
    int64_t* w;
    int root, chunk, r;
    pp_request rq;
    pp_result rc;
    pp_schedule_stage_to_rank(s->d.schedule, 0, &root, &chunk);
    if (!s->bc_msg) {
        s->bc_msg = (int64_t*)_pp_calloc(bytes / sizeof(int64_t) + 1, sizeof(int64_t));
        s->bc_cu = (int32_t*)_pp_calloc((size_t)s->d.max_seqs + 1, sizeof(int32_t));
        if (!s->bc_msg || !s->bc_cu) {
#ifndef PP_TEST_NO_BC_PAIR /* negative control (tests/test_soak.c): one kept without the other */
            /* both or neither: a later step takes bc_msg for the sign that both exist */
            PP_FREE(s->bc_msg);
            PP_FREE(s->bc_cu);
            s->bc_msg = NULL;
            s->bc_cu = NULL;
#endif
            return _pp_stage_fail(s, PP_ERR_NOMEM, "broadcast buffer of %zu bytes", bytes);
        }
        s->bc_bytes = bytes;
    }
    w = s->bc_msg;
    if (s->d.rank == root) {
        pp_result chk = _pp_batch_check(b, &s->err);
        if (chk != PP_OK) return _pp_stage_fail(s, chk, "%s", s->err.msg);
        if (b->n_seqs > s->d.max_seqs)
            return _pp_stage_fail(s, PP_ERR_SIZE, "batch has %d sequences, the broadcast holds max_seqs = %d", b->n_seqs,
                                  s->d.max_seqs);
        memset(w, 0, bytes);
        w[0] = b->m;
        w[1] = b->input.rows;
        w[2] = b->input.cols;
        w[3] = (int64_t)b->input.dtype;
        w[4] = b->cu_seqlens ? b->n_seqs : 0;
        w[5] = (int64_t)b->loss;
        w[6] = (int64_t)b->split;
        memcpy(&w[7], &b->split_a, sizeof(double));
        memcpy(&w[8], &b->split_b, sizeof(double));
        w[9] = ((int64_t)s->n_steps << 32) | (uint32_t)s->gen; /* which step: a stale one is refused */
        if (b->cu_seqlens) memcpy(&w[_PP_BC_WORDS], b->cu_seqlens, sizeof(int32_t) * ((size_t)b->n_seqs + 1));
        for (r = 0; r < s->p; r++) {
            if (r == root) continue;
            if ((rc = t->isend(t->self, r, _PP_TAG_BROADCAST, w, bytes, &rq)) != PP_OK ||
                (rc = t->wait(t->self, &rq, s->d.timeout_s, &s->err)) != PP_OK)
                return _pp_stage_fail(s, rc, "broadcasting the step metadata to rank %d", r);
            s->st.bytes_sent += bytes;
            s->st.msgs_sent++;
            s->st.meta_bytes_sent += bytes;
            s->st.meta_msgs_sent++;
        }
        *use = b;
        return PP_OK;
    }
    if ((rc = t->irecv(t->self, root, _PP_TAG_BROADCAST, w, bytes, &rq)) != PP_OK)
        return _pp_stage_fail(s, rc, "posting the metadata receive from rank %d", root);
    if ((rc = t->wait(t->self, &rq, s->d.timeout_s, &s->err)) != PP_OK) {
        _pp_stage_fail(s, rc, "waiting for the step metadata: %s", s->err.msg);
        if (rc == PP_ERR_TIMEOUT) _pp_stage_explain(s, root);
        return rc;
    }
    s->st.bytes_recv += bytes;
    if (w[9] != (((int64_t)s->n_steps << 32) | (uint32_t)s->gen))
        return _pp_stage_fail(s, PP_ERR_TRANSPORT, "the step metadata from rank %d is for its step %lld (after %lld failed), "
                              "this rank is at step %d (after %d failed): every rank must call pp_stage_step for every step",
                              root, (long long)(w[9] >> 32), (long long)(uint32_t)w[9], (int)s->n_steps, (int)s->gen);
    if (w[4] < 0 || w[4] > s->d.max_seqs)
        return _pp_stage_fail(s, PP_ERR_TRANSPORT, "step metadata from rank %d is corrupt (%lld sequences)", root,
                              (long long)w[4]);
    s->bc_batch = *b;
    s->bc_batch.m = (int)w[0];
    s->bc_batch.input.rows = w[1];
    s->bc_batch.input.cols = w[2];
    s->bc_batch.input.dtype = (pp_dtype)w[3];
    s->bc_batch.n_seqs = (int)w[4];
    s->bc_batch.loss = (pp_loss_reduction)w[5];
    s->bc_batch.split = (pp_split_policy)w[6];
    memcpy(&s->bc_batch.split_a, &w[7], sizeof(double));
    memcpy(&s->bc_batch.split_b, &w[8], sizeof(double));
    s->bc_batch.cu_seqlens = NULL;
    if (w[4] > 0) {
        memcpy(s->bc_cu, &w[_PP_BC_WORDS], sizeof(int32_t) * ((size_t)w[4] + 1));
        s->bc_batch.cu_seqlens = s->bc_cu;
    }
    *use = &s->bc_batch;
    return PP_OK;
}

/* An evaluation's outputs, before anything is sent (the plan is built): what every rank can
   refuse alone, the same way on every rank, and on the rank that gets them the sizes. */
static pp_result _pp_eval_check(pp_stage* s) {
    pp_result rc;
    if (s->ev_rank < 0) return PP_OK;
    if (s->ev_rank != s->last_rank && s->d.shapes != PP_SHAPES_LOCAL && s->d.shapes != PP_SHAPES_BROADCAST)
        return _pp_stage_fail(s, PP_ERR_UNSUPPORTED,
                              "the evaluation's outputs go from rank %d (the last stage's) to rank %d, which must know their "
                              "sizes: LOCAL or BROADCAST shapes (under %s only the last stage's rank can get them)",
                              s->last_rank, s->ev_rank, s->d.shapes == PP_SHAPES_AUTO ? "AUTO" : "PER_MESSAGE");
    if ((s->d.rank == s->ev_rank || s->d.rank == s->last_rank) && s->d.device.alloc && !s->d.device.copy)
        return _pp_stage_fail(s, PP_ERR_UNSUPPORTED,
                              "the evaluation's outputs are in device blocks and the device ops have no copy");
    if (s->d.rank == s->ev_rank && (rc = _pp_eval_out_fill(&s->plan, s->ev_out, &s->err)) != PP_OK)
        return _pp_stage_fail(s, rc, "%s", s->err.msg);
    return PP_OK;
}

/* Receives are posted one action ahead, except a B whose F has not run yet when the shapes
   travel with the data (PER_MESSAGE, AUTO): its sizes are not final until that F received. */
static int _pp_can_prepare(const pp_stage* s, int idx) {
    const pp_action* a = &s->list[idx];
    /* AUTO, an F fed by this rank itself through the transport (the turn of the V map with the
       hand-over compiled out, PP_TEST_NO_HANDOVER): posting it early would apply its learned
       input shapes to the plan before this rank's own F that produces them has run */
    if (a->op == PP_OP_F && s->d.shapes == PP_SHAPES_AUTO && a->prev_rank == s->d.rank && !_pp_turn(s, a->stage)) return 0;
    if (a->op != PP_OP_B || s->d.shapes == PP_SHAPES_LOCAL || s->d.shapes == PP_SHAPES_BROADCAST) return 1;
    return s->live[a->mb * s->v + a->chunk] != NULL;
}

static pp_result _pp_stage_step_run(pp_stage* s, const pp_batch* b, int* n_done) {
    const pp_schedule* sc = s->d.schedule;
    pp_result rc = PP_OK;
    double t_start;
    int i, need;
    *n_done = 0;
    /* refused here, not before the step: this rank still aborts the step and takes part in the
       agreement, so the others learn of it at once */
    if (s->eval && s->ev_bad)
        return _pp_stage_fail(s, PP_ERR_INVALID, "rank %d: pp_eval_out.rank = %d, the pipeline has ranks 0 .. %d", s->d.rank,
                              s->ev_bad_rank, s->p - 1);
    if (!b) return _pp_stage_fail(s, PP_ERR_INVALID, "batch is NULL");
    /* the step's identity before the first message of the step, after what this rank can check
       alone (a bad batch is refused as such, whatever the transport's state) */
    if (s->d.shapes == PP_SHAPES_BROADCAST && sc->p > 1 &&
        ((rc = _pp_go(s)) != PP_OK || (rc = _pp_broadcast_meta(s, b, &b)) != PP_OK))
        return rc;
    if (b->m != sc->m)
        return _pp_stage_fail(s, PP_ERR_INVALID, "batch has m = %d micro-batches, the schedule was made for %d", b->m, sc->m);
    if ((rc = _pp_plan_build(&s->plan, &s->d.model, s->d.weights, b, &s->err)) != PP_OK)
        return _pp_stage_fail(s, rc, "%s", s->err.msg);
    for (i = 0; i < s->v; i++) {
        int stage = pp_schedule_rank_to_stage(sc, s->d.rank, i);
        if (stage == 0 && !b->input.data)
            return _pp_stage_fail(s, PP_ERR_INVALID, "this rank owns the first stage but the batch has no input data");
        if (stage == s->S - 1 && !b->targets)
            return _pp_stage_fail(s, PP_ERR_INVALID, "this rank owns the last stage but the batch has no targets");
    }
    need = b->m * s->v;
    if (need > s->learned_cap) {
        _pp_bnd* li = (_pp_bnd*)_pp_calloc((size_t)need, sizeof *li);
        _pp_bnd* lo = (_pp_bnd*)_pp_calloc((size_t)need, sizeof *lo);
        if (!li || !lo) {
            PP_FREE(li);
            PP_FREE(lo);
            return _pp_stage_fail(s, PP_ERR_NOMEM, "shape tables for %d micro-batches", b->m);
        }
        for (i = 0; i < need; i++) li[i].n = lo[i].n = -1;
        PP_FREE(s->learned_in);
        PP_FREE(s->learned_out);
        s->learned_in = li;
        s->learned_out = lo;
        s->learned_cap = need;
    }
    if (s->eval && (rc = _pp_eval_check(s)) != PP_OK) return rc;
    if (need > s->live_cap) {
        _pp_block** nl = (_pp_block**)_pp_calloc((size_t)need * 8, sizeof *nl);
        float* nloss = (float*)_pp_calloc((size_t)b->m, sizeof *nloss);
        double* nsm = (double*)_pp_calloc((size_t)need, sizeof *nsm);
        if (!nl || !nloss || !nsm) {
            PP_FREE(nl);
            PP_FREE(nloss);
            PP_FREE(nsm);
            return _pp_stage_fail(s, PP_ERR_NOMEM, "live table for %d stashes", need);
        }
        PP_FREE(s->live);
        PP_FREE(s->mb_loss);
        PP_FREE(s->smem);
        s->smem = nsm;
        s->rblive = nl + 7 * need;
        s->live = nl; /* one allocation: live, wlive, src, gin, blive, eout, rlive, rblive */
        s->wlive = nl + need;
        s->src = nl + 2 * need;
        s->gin = nl + 3 * need;
        s->blive = nl + 4 * need;
        s->eout = nl + 5 * need;
        s->rlive = nl + 6 * need;
        s->mb_loss = nloss;
        s->live_cap = need;
    }
    if (s->d.shapes != PP_SHAPES_BROADCAST && (rc = _pp_go(s)) != PP_OK) return rc;
    s->batch = b;
    t_start = _pp_now();
    rc = _pp_fp_post(s);
    for (i = 0; i < s->n_list && rc == PP_OK; i++) {
        rc = _pp_reap(s, 0);
        if (rc == PP_OK) rc = _pp_prepare(s, i);
        if (rc == PP_OK && i + 1 < s->n_list && _pp_can_prepare(s, i + 1)) rc = _pp_prepare(s, i + 1);
        if (rc == PP_OK) rc = _pp_run(s, i);
        if (rc == PP_OK && !s->eval) rc = _pp_grads_final(s, i, t_start);
    }
    if (rc == PP_OK && s->eval) rc = _pp_eval_exchange(s);
    if (rc == PP_OK) rc = _pp_reap(s, 1);
    for (need = 0; need < s->n_nb && rc == PP_OK; need++) rc = _pp_fp_check(s, s->nb[need].rank);
    if (rc == PP_OK && s->draining) { /* every message went: the failure is the step's result */
        rc = s->drain_rc;
        s->drained = 1;
    }
    s->st.t_total = _pp_now() - t_start;
    s->st.n_actions = i;
    *n_done = i;
    if (rc == PP_OK)
        for (i = 0; i < (int)s->n_events; i++) {
            s->events[i].start -= t_start;
            s->events[i].end -= t_start;
        }
    return rc;
}

/* After the pipeline's agreement, the step's outcome over the stage's TP group (pp_stage_desc.tp),
   whose members run this stage in the other pipelines of a pp x tp grid: every member sends every
   other its verdict (the step's count and its code, two int32) on a tag of its own carrying the
   step (_PP_TAG_TP_STEP + 3 * 8192 + (step mod 4096), under MPI's least tag bound), and a member
   whose step went well keeps PP_OK only where every one's was. A member that failed takes the
   others' verdicts too and reports its own failure: over NCCL a send completes only once its
   receive runs, so a failed member that only told left its partners' sends waiting out their
   deadline and their communicator aborted (tests/test_tp_nccl_fault.c "after";
   PP_TEST_TP_VERDICT_TELL_ONLY). It waits until one deadline after its failure, no longer: a
   partner held in a TP collective it never joined answers only at its own deadline. What a
   receive that timed out receives later is a past step's: the count in it tells, and it is
   passed over. A pipeline agrees within itself first, so every rank of it hears the same
   verdicts and takes the
   same outcome. Before, a layer failing on one TP rank after its last TP message of the step (a
   backward's last collective) left the other pipelines returning PP_OK: their optimizers
   stepped, the failed one's did not, and the TP group's replicas of its weights drifted apart
   (test_tp stale; PP_TEST_NO_TP_AGREE, build/tp-controls). pp_pipeline stops its whole grid
   itself (tp_agree_off). */
#define _PP_TAG_TP_VERDICT (_PP_TAG_TP_STEP + 3 * 8192)
#ifdef PP_TEST_TP_VERDICT_MASK /* tests (build/tp-verdict-wrap): the tag repeats every step, so the next meets a leftover */
#define _PP_TP_VERDICT_MASK PP_TEST_TP_VERDICT_MASK
#else
#define _PP_TP_VERDICT_MASK 0xfffu
#endif
static pp_result _pp_tp_agree(pp_stage* s, pp_result rc) {
    const pp_transport* t = s->tp_t; /* pp_stage_desc.tp resolved at create: NULL for a group of one */
    int n = s->tp_n, me = s->tp_me, i, bad = -1, tag, tries;
    int32_t mine[2], all[PP_MAX_RANKS][2];
    _pp_tp_msg m[PP_MAX_RANKS];
    double end, to;
    pp_error e;
    pp_result xr;
#ifdef PP_TEST_NO_TP_AGREE /* negative control (build/tp-controls): each pipeline's outcome alone */
    return rc;
#endif
    if (s->tp_agree_off || !t || n <= 1 || n > PP_MAX_RANKS || !t->isend || !t->irecv || !t->wait) return rc;
    end = _pp_now() + s->tp_to;
    tag = _PP_TAG_TP_VERDICT + (int)((uint32_t)s->n_steps & _PP_TP_VERDICT_MASK);
    mine[0] = s->n_steps;
    mine[1] = (int32_t)rc;
    for (i = 0; i < n; i++) {
        all[i][0] = s->n_steps;
        all[i][1] = (int32_t)PP_OK;
        m[i].sp = mine;
        m[i].rp = all[i];
        m[i].sb = i == me ? 0 : sizeof mine;
#ifndef PP_TEST_TP_VERDICT_TELL_ONLY /* negative control (build/tp-controls): a failed member receives none */
        m[i].rb = i == me ? 0 : sizeof mine; /* a failed member takes theirs too: NCCL's sends wait for their receive */
#else
        m[i].rb = i == me || rc != PP_OK ? 0 : sizeof mine;
#endif
    }
    e.msg[0] = 0;
    to = s->tp_to;
#ifndef PP_TEST_TP_VERDICT_FULL_WAIT /* negative control (build/tp-controls): a deadline of its own */
    /* a failed member's exchange ends one deadline after its failure: a partner held on its GPU
       by a collective this member never joined cannot answer before its own deadline, and
       waiting a new deadline here made the step's failure two (tests/test_tp_nccl_fault.c) */
    if (rc != PP_OK && s->t_fail > 0) {
        double left = s->t_fail + s->tp_to - _pp_now();
        if (left < to) to = left > 0.001 ? left : 0.001;
    }
#endif
    xr = _pp_tp_xchg(t, s->tp_ranks, n, me, tag, m, to, &e);
    if (rc != PP_OK) return rc; /* its own failure is the one reported */
#ifndef PP_TEST_TP_VERDICT_NO_SKIP /* negative control (build/tp-controls): a past step's verdict taken */
    for (i = 0; i < n && xr == PP_OK; i++) /* a past step's verdict: passed over, the next one taken */
        for (tries = 0; i != me && all[i][0] != s->n_steps && xr == PP_OK && tries < 4096; tries++) {
            pp_request rq;
            memset(&rq, 0, sizeof rq);
            if ((xr = t->irecv(t->self, s->tp_ranks[i], tag, all[i], sizeof all[i], &rq)) == PP_OK)
                xr = t->wait(t->self, &rq, end - _pp_now() > 0.001 ? end - _pp_now() : 0.001, &e);
        }
#else
    (void)end, (void)tries;
#endif
    if (xr != PP_OK)
        return _pp_fail(&s->err, xr, "rank %d: the step's outcome over its TP group (TP rank %d of %d): %s", s->d.rank, me, n,
                        e.msg);
    for (i = 0; i < n && bad < 0; i++)
        if (i != me && (all[i][0] != s->n_steps || all[i][1] != (int32_t)PP_OK)) bad = i;
    if (bad < 0) return PP_OK;
    return _pp_fail(&s->err, PP_ERR_ABORTED, "rank %d: the step failed in TP rank %d's pipeline (rank %d of the TP transport): %s",
                    s->d.rank, bad, s->tp_ranks[bad], all[bad][0] != s->n_steps ? "no verdict of this step" : pp_result_str((pp_result)all[bad][1]));
}

/* Any failure, a rejected batch included, tells the other ranks (transport.abort): they stop
   waiting for this one and return PP_ERR_ABORTED instead of running into their deadlines. Then
   every rank takes part in the agreement (>>impl-stage-agree), so a step is PP_OK on every rank
   or on none, and with a TP group in the other pipelines too (_pp_tp_agree); a failed step moves
   every rank to the next generation of tags. */
static pp_result _pp_stage_step(pp_stage* s, const pp_batch* b, pp_step_stats* stats) {
    pp_result rc, own;
    int i, n_done;
    void* tp_prev;
    if (!s) return PP_ERR_INVALID;
    s->tp_ctx.why[0] = 0;
    tp_prev = _pp_tp_enter(&s->tp_ctx); /* the TP collectives of its layers carry the step (>>impl-tp) */
    memset(&s->st, 0, sizeof s->st);
    s->live_mem = 0; /* no stash outlives a step: no rounding carried over */
    s->err.msg[0] = 0;
    s->n_events = 0;
    s->n_steps++;
    if (s->n_sent) {
        memset(s->n_sent, 0, sizeof *s->n_sent * (size_t)s->p);
        memset(s->n_recv, 0, sizeof *s->n_recv * (size_t)s->p);
    }
    for (i = 0; i < s->n_nb; i++) s->nb[i].state = 0;
    s->draining = s->drained = 0;
    s->t_fail = 0;
    rc = own = _pp_stage_step_run(s, b, &n_done);
    if (rc != PP_OK) {
        if (n_done > 0) _pp_stage_note(s, &s->list[n_done - 1], PP_FLIGHT_FAILED, -1);
        if (rc != PP_ERR_ABORTED && s->d.transport.abort && !s->drained)
            s->d.transport.abort(s->d.transport.self, rc, s->err.msg);
        _pp_stage_recover(s);
    }
    rc = _pp_tp_agree(s, _pp_agree(s, rc));
    if (rc == PP_OK) {
        if (s->last_rank == s->d.rank) {
            s->st.loss = _pp_step_loss(&s->plan, s->mb_loss);
            s->st.has_loss = 1;
        }
        /* the outputs' final shapes (AUTO and PER_MESSAGE may have changed the plan's) */
        if (s->eval && s->ev_rank == s->d.rank) _pp_eval_out_fill(&s->plan, s->ev_out, NULL);
    } else {
        if (own == PP_OK) _pp_stage_recover(s); /* what peers learned (AUTO) is reset on both sides */
        s->gen++;
        s->n_events = 0;
    }
    s->batch = NULL;
    if (!s->eval && s->d.grads_final == pp_dp_overlap_hook) _pp_dp_note_end(s->d.grads_final_user, s, rc);
    if (stats) *stats = s->st;
    _pp_tp_leave(tp_prev);
    return rc;
}

/* One step at a time on a stage or pipeline: 1 when this caller holds it (release with
   _pp_step_leave), 0 when a step runs (or the mutex could not be made). */
static int _pp_step_enter(pthread_mutex_t* mu, int mu_ok) {
#ifdef PP_TEST_NO_STEP_GUARD /* negative control (build/errors-controls): two steps at once */
    (void)mu, (void)mu_ok;
    return 1;
#else
    return mu_ok && pthread_mutex_trylock(mu) == 0;
#endif
}
/* The entry of every step on a stage or pipeline (mu: its step mutex, NULL for a NULL handle):
   1 when this caller may run the step; 0, with *stats zeroed, when it may not (PP_ERR_INVALID). */
static int _pp_step_begin(pthread_mutex_t* mu, int mu_ok, pp_step_stats* stats) {
    if (mu && _pp_step_enter(mu, mu_ok)) return 1;
    if (stats) memset(stats, 0, sizeof *stats);
    return 0;
}
static void _pp_step_leave(pthread_mutex_t* mu) {
#ifdef PP_TEST_NO_STEP_GUARD
    (void)mu;
#else
    pthread_mutex_unlock(mu);
#endif
}

pp_result pp_stage_step(pp_stage* s, const pp_batch* b, pp_step_stats* stats) {
    pp_result rc;
    if (!_pp_step_begin(s ? &s->step_mu : NULL, s && s->step_mu_ok, stats)) return PP_ERR_INVALID;
    rc = _pp_stage_step(s, b, stats);
    _pp_step_leave(&s->step_mu);
    return rc;
}

pp_result pp_stage_eval(pp_stage* s, const pp_batch* b, pp_eval_out* out, pp_step_stats* stats) {
    pp_result rc;
    if (!_pp_step_begin(s ? &s->step_mu : NULL, s && s->step_mu_ok, stats)) return PP_ERR_INVALID;
    s->ev_bad = out && (out->rank < 0 || out->rank >= s->p);
#ifdef PP_TEST_EVAL_RANK_EARLY /* negative control (build/failpath-controls): refused alone, before the step */
    if (s->ev_bad && s->eval_rc == PP_OK) {
        if (stats) memset(stats, 0, sizeof *stats);
        rc = _pp_fail(&s->err, PP_ERR_INVALID, "rank %d: pp_eval_out.rank = %d", s->d.rank, out->rank);
        _pp_step_leave(&s->step_mu);
        return rc;
    }
#endif
    if (s->eval_rc != PP_OK) {
        if (stats) memset(stats, 0, sizeof *stats);
        rc = _pp_fail(&s->err, s->eval_rc, "%s", s->eval_why);
    } else {
        s->tlist = s->list;
        s->n_tlist = s->n_list;
        s->list = s->eacts; /* this rank's forward-only list (_pp_eval_init) */
        s->n_list = s->esched.per_rank;
        s->eval = 1;
        /* a bad output rank: the step runs to its first check, which refuses it (_pp_stage_step_run) */
        s->ev_bad_rank = out ? out->rank : -1;
        s->ev_out = s->ev_bad ? NULL : out;
        s->ev_rank = out && !s->ev_bad ? out->rank : -1;
        rc = _pp_stage_step(s, b, stats);
        s->list = s->tlist;
        s->n_list = s->n_tlist;
        s->eval = 0;
        s->ev_bad = 0;
        s->ev_out = NULL;
        s->ev_rank = -1;
    }
    _pp_step_leave(&s->step_mu);
    return rc;
}

/* >>impl-pipeline: one process, every rank a thread (or a CUDA stream), over the per-rank API. */
#define _PP_DEF(val, def) ((val) == 0 ? (def) : (val))

/* Where the ranks of a pipeline run: the transport of each rank, and what a step needs around
   the ranks' pp_stage_step. The threads world here; pipeline_cuda.h adds the CUDA one. */
typedef struct _pp_pl_world {
    void* self;
    void (*rank_desc)(void* self, int rank, pp_stage_desc* d);  /* transport (and device, layer_ctx) */
    pp_result (*enter)(void* self, int rank, pp_error* err);    /* rank's thread, before its step; may be NULL */
    pp_result (*begin)(void* self, pp_error* err);              /* before the ranks start; may be NULL */
    pp_result (*end)(void* self, pp_error* err);                /* after they all returned; may be NULL */
    void (*reset)(void* self);                                  /* after a failed step */
    void (*destroy)(void* self);                                /* after the stages */
    void (*abort_all)(void* self, pp_result why, const char* msg); /* grid: stop every rank */
    int grid;                                                   /* 1: runs p * dp * tp ranks */
} _pp_pl_world;

struct pp_pipeline {
    pp_pipeline_desc d;             /* defaults resolved; pointers below replace its arrays */
    pp_schedule sched;
    pp_action* acts;
    int* first;                     /* [n_stages + 1] */
    int W;                          /* ranks: p * dp * tp (the arrays below have W entries) */
    const void** weights;           /* [W] */
    void** grads;                   /* [W] */
    pp_stage** st;                  /* [W] */
    pp_transport* tr;               /* [W] each rank's transport, to abort the step */
    pp_result* rc;                  /* [W] last step */
    pp_step_stats* stats;           /* [W] last step */
    pp_error* rerr;                 /* [W] what the world's enter (or the dp sum) said */
    _pp_pl_world world;
    pp_batch* b;                    /* [dp] the step's batches, m filled in */
    /* dp or tp > 1 (W > p): rank r's place, its groups on the collectives' world, its gradient
       buffers for the dp sum, and the rank whose failure stopped every pipeline */
    int* place;                     /* [3 W]: pp_rank, dp_rank, tp_rank */
    int* granks;                    /* [W (tp + dp)]: r's TP group's world ranks, then its dp group's */
    pp_transport* ctr;              /* [W] r's transport on the collectives' world */
    pp_group* tpg;                  /* [W] */
    pp_param* pbuf;                 /* [W max_params] */
    int max_params;
    int root;                       /* the first rank that failed (not aborted), -1: none */
    pthread_mutex_t root_mu;
    int root_mu_ok;
    pp_event* events;
    size_t cap_events;
    int stuck;                      /* a step failed and some rank's transport cannot cancel */
    int eval;                       /* the step under way is an evaluation (pp_pipeline_eval) */
    pp_eval_out* ev_out;            /* its outputs: every rank's pp_stage_eval gets it */
    pp_error err;
    pthread_mutex_t step_mu;        /* held by the step under way: a second caller is refused */
    int step_mu_ok;
};

/* A message without its "<result>: " prefix, to quote it inside another. */
static const char* _pp_msg_body(const char* msg, pp_result rc) {
    size_t k = strlen(pp_result_str(rc));
    return strncmp(msg, pp_result_str(rc), k) == 0 && msg[k] == ':' && msg[k + 1] == ' ' ? msg + k + 2 : msg;
}

/* The desc with its defaults: the one place where zero reads as "the default". */
static pp_pipeline_desc _pp_pipeline_defaults(const pp_pipeline_desc* in) {
    pp_pipeline_desc d = *in;
    const pp_schedule* cs = in->custom;
    d.p = cs ? cs->p : _PP_DEF(in->p, 1);
    /* 4p only where p is in range: create refuses the others after this, and 4p must not overflow first */
    d.m = cs ? cs->m : _PP_DEF(in->m, d.p >= 1 && d.p <= PP_MAX_RANKS ? 4 * d.p : 1);
    d.v = cs ? cs->v : _PP_DEF(in->v, pp_schedule_kind_v(in->schedule, 2)); /* the kind's own v */
    d.dp = _PP_DEF(in->dp, 1);
    d.tp = _PP_DEF(in->tp, 1);
    d.dp_scale = _PP_DEF(in->dp_scale, d.dp >= 1 ? 1.0 / d.dp : 1.0);
    return d;
}

/* dp or tp > 1: every rank's place (pp_grid_make_tp), its TP and data-parallel groups, and room
   for its gradient buffers (the dp sum); two pipelines never share a gradient struct. */
static pp_result _pp_pipeline_places(pp_pipeline* pl, pp_error* err) {
    const pp_model* m = &pl->d.model;
    int p = pl->d.p, dp = pl->d.dp, tp = pl->d.tp, W = pl->W, r, q, l, n;
    pp_grid* g = (pp_grid*)_pp_calloc(1, sizeof *g);
    pp_result rc = PP_OK;
    pl->place = (int*)_pp_calloc((size_t)W * 3, sizeof *pl->place);
    pl->granks = (int*)_pp_calloc((size_t)W * (size_t)(tp + dp), sizeof *pl->granks);
    pl->ctr = (pp_transport*)_pp_calloc((size_t)W, sizeof *pl->ctr);
    pl->tpg = (pp_group*)_pp_calloc((size_t)W, sizeof *pl->tpg);
    if (!g || !pl->place || !pl->granks || !pl->ctr || !pl->tpg) {
        PP_FREE(g);
        return _pp_fail(err, PP_ERR_NOMEM, "the places of %d ranks", W);
    }
    for (r = 0; r < W && rc == PP_OK; r++) {
        if ((rc = pp_grid_make_tp(W, r, p, tp, PP_GRID_DP_INNER, g, err)) != PP_OK) break;
        pl->place[3 * r] = g->pp_rank;
        pl->place[3 * r + 1] = g->dp_rank;
        pl->place[3 * r + 2] = g->tp_rank;
        memcpy(pl->granks + (size_t)r * (size_t)(tp + dp), g->tp_group, (size_t)tp * sizeof(int));
        memcpy(pl->granks + (size_t)r * (size_t)(tp + dp) + tp, g->dp_group, (size_t)dp * sizeof(int));
    }
    PP_FREE(g);
    if (rc != PP_OK) return rc;
    for (r = 0; r < W; r++)
        for (q = 0; q < r; q++)
            if (pl->grads[r] == pl->grads[q] && (pl->place[3 * r + 1] != pl->place[3 * q + 1] ||
                                                 pl->place[3 * r + 2] != pl->place[3 * q + 2]))
                return _pp_fail(err, PP_ERR_INVALID,
                                "rank_grads[%d] and rank_grads[%d] are one struct, but ranks %d (dp %d, tp %d) and %d (dp %d, "
                                "tp %d) are in different pipelines: each pipeline adds into gradients of its own",
                                q, r, q, pl->place[3 * q + 1], pl->place[3 * q + 2], r, pl->place[3 * r + 1],
                                pl->place[3 * r + 2]);
    if (dp > 1) {
        for (l = 0; l < m->n_layers; l++) {
            if ((n = m->params(m, pl->grads[0], l, NULL, 0)) < 0)
                return _pp_fail(err, PP_ERR_INVALID, "layer %d (%s): the params hook gave %d (it does not know the layer)", l,
                                _pp_layer_name(m, l), n);
            if (n > pl->max_params) pl->max_params = n;
        }
        if (pl->max_params && !(pl->pbuf = (pp_param*)_pp_calloc((size_t)W * (size_t)pl->max_params, sizeof *pl->pbuf)))
            return _pp_fail(err, PP_ERR_NOMEM, "gradient lists of %d ranks", W);
    }
    return PP_OK;
}

/* Schedule, partition and parameter pointers; no stage yet (_pp_pipeline_start). */
static pp_result _pp_pipeline_new(const pp_pipeline_desc* in, pp_pipeline** out, pp_error* err) {
    pp_pipeline* pl;
    pp_pipeline_desc* d;
    const pp_schedule* cs = in->custom;
    pp_partition_desc pd;
    size_t n_acts;
    pp_result rc;
    int r, p, dp, tp, W;
    if ((rc = pp_model_check(&in->model, err)) != PP_OK) return rc;
    if (!in->weights == !in->rank_weights)
        return _pp_fail(err, PP_ERR_INVALID, "set one of weights and rank_weights (%s)", in->weights ? "both are set" : "neither is");
    if (!in->grads == !in->rank_grads)
        return _pp_fail(err, PP_ERR_INVALID, "set one of grads and rank_grads (%s)", in->grads ? "both are set" : "neither is");
    if (in->stage.weights || in->stage.grads || in->stage.schedule || in->stage.partition || in->stage.rank ||
        in->stage.transport.self || in->stage.transport.isend || in->stage.model.forward || in->stage.model.n_layers)
        return _pp_fail(err, PP_ERR_INVALID,
                        "stage.model, weights, grads, schedule, partition, rank and transport are the pipeline's: leave "
                        "them zero in the template (rank_setup changes a rank's desc)");
    if (in->stage.tp)
        return _pp_fail(err, PP_ERR_INVALID, "stage.tp is one rank's TP group: leave it NULL in the template and set "
                        "pp_pipeline_desc.tp (or each rank's in rank_setup)");
    if (cs && (!cs->actions || cs->p < 1 || cs->p > PP_MAX_RANKS || cs->v < 1 || cs->per_rank < 1))
        return _pp_fail(err, PP_ERR_INVALID, "custom schedule is not one (make it with pp_schedule_make or pp_schedule_parse)");
    if (cs && ((in->p && in->p != cs->p) || (in->v && in->v != cs->v) || (in->m && in->m != cs->m)))
        return _pp_fail(err, PP_ERR_INVALID, "p, v, m = %d, %d, %d disagree with the custom schedule's %d, %d, %d (leave them 0)",
                        in->p, in->v, in->m, cs->p, cs->v, cs->m);
    p = _pp_pipeline_defaults(in).p;
    if (p < 1 || p > PP_MAX_RANKS) return _pp_fail(err, PP_ERR_INVALID, "p = %d ranks (1 .. %d)", p, PP_MAX_RANKS);
    dp = _pp_pipeline_defaults(in).dp;
    tp = _pp_pipeline_defaults(in).tp;
    if (dp < 1 || tp < 1 || dp > PP_MAX_RANKS || tp > PP_MAX_RANKS || p * dp * tp > PP_MAX_RANKS)
        return _pp_fail(err, PP_ERR_INVALID, "dp = %d, tp = %d: each 0 (one) or 1 .. %d, and p * dp * tp = %lld ranks at most %d",
                        in->dp, in->tp, PP_MAX_RANKS, (long long)p * dp * tp, PP_MAX_RANKS);
    if (!(in->dp_scale >= 0) || in->dp_scale > 1e300)
        return _pp_fail(err, PP_ERR_INVALID, "dp_scale = %g (0: 1 / dp, or a finite scale > 0)", in->dp_scale);
    W = p * dp * tp;
    if (W > p && in->grads)
        return _pp_fail(err, PP_ERR_INVALID, "dp = %d, tp = %d: every pipeline adds into gradients of its own: set rank_grads "
                        "(p * dp * tp = %d entries), not grads", dp, tp, W);
    if (dp > 1 && !in->model.params)
        return _pp_fail(err, PP_ERR_INVALID, "dp = %d: the data-parallel sum finds the gradients through model.params: set it "
                        "(PP_MODEL_PARAMS makes one)", dp);
    if (!(pl = (pp_pipeline*)_pp_calloc(1, sizeof *pl))) return _pp_fail(err, PP_ERR_NOMEM, "pipeline");
    pl->step_mu_ok = pthread_mutex_init(&pl->step_mu, NULL) == 0;
    pl->root_mu_ok = pthread_mutex_init(&pl->root_mu, NULL) == 0;
    *out = pl; /* from here pp_pipeline_destroy cleans up */
    d = &pl->d;
    *d = _pp_pipeline_defaults(in);
    pl->W = W;
    pl->root = -1;
    pl->weights = (const void**)_pp_calloc((size_t)W, sizeof *pl->weights);
    pl->grads = (void**)_pp_calloc((size_t)W, sizeof *pl->grads);
    pl->st = (pp_stage**)_pp_calloc((size_t)W, sizeof *pl->st);
    pl->tr = (pp_transport*)_pp_calloc((size_t)W, sizeof *pl->tr);
    pl->rc = (pp_result*)_pp_calloc((size_t)W, sizeof *pl->rc);
    pl->stats = (pp_step_stats*)_pp_calloc((size_t)W, sizeof *pl->stats);
    pl->rerr = (pp_error*)_pp_calloc((size_t)W, sizeof *pl->rerr);
    pl->b = (pp_batch*)_pp_calloc((size_t)dp, sizeof *pl->b);
    if (!pl->weights || !pl->grads || !pl->st || !pl->tr || !pl->rc || !pl->stats || !pl->rerr || !pl->b || !pl->root_mu_ok)
        return _pp_fail(err, PP_ERR_NOMEM, "pipeline of %d ranks", W);
    for (r = 0; r < W; r++) {
        pl->weights[r] = in->weights ? in->weights : in->rank_weights[r];
        pl->grads[r] = in->grads ? in->grads : in->rank_grads[r];
        if (!pl->weights[r] || !pl->grads[r])
            return _pp_fail(err, PP_ERR_INVALID, "rank %d: rank_%s[%d] is NULL", r, pl->weights[r] ? "grads" : "weights", r);
    }
    if (W > p && (rc = _pp_pipeline_places(pl, err)) != PP_OK) return rc;
    /* the schedule: the caller's copied, or made here; a kind refused with its own constraint
       ("zb-v needs v = 2 ..."), not only the numbers it cannot run */
    if (!cs && (rc = _pp_sched_check_args(d->schedule, p, d->v, d->m, err)) != PP_OK) return rc;
    n_acts = cs ? (size_t)cs->p * (size_t)cs->per_rank : pp_schedule_size(d->schedule, p, d->v, d->m);
    if (!(pl->acts = (pp_action*)_pp_calloc(n_acts, sizeof *pl->acts)))
        return _pp_fail(err, PP_ERR_NOMEM, "schedule of %zu actions", n_acts);
    if (cs) {
        memcpy(pl->acts, cs->actions, n_acts * sizeof *pl->acts);
        pl->sched = *cs;
        pl->sched.actions = pl->acts;
    } else if ((rc = pp_schedule_make(d->schedule, p, d->v, d->m, pl->acts, n_acts, &pl->sched, err)) != PP_OK) {
        return rc;
    }
    d->custom = NULL;
    /* the partition */
    pd = d->partition;
    if (pd.n_stages && pd.n_stages != pl->sched.n_stages)
        return _pp_fail(err, PP_ERR_INVALID, "partition.n_stages = %d, the schedule has %d stages (leave it 0)", pd.n_stages,
                        pl->sched.n_stages);
    pd.n_stages = pl->sched.n_stages;
    if (!pd.schedule) pd.schedule = &pl->sched; /* balance the ranks, where one holds several stages */
    if (!(pl->first = (int*)_pp_calloc((size_t)pd.n_stages + 1, sizeof *pl->first)))
        return _pp_fail(err, PP_ERR_NOMEM, "partition of %d stages", pd.n_stages);
    if ((rc = pp_partition_model(&d->model, pl->weights[0], &pd, pl->first, NULL, err)) != PP_OK) return rc;
    d->partition.n_stages = pd.n_stages;
    d->partition.explicit_first = NULL;
    d->partition.sample = NULL;
    d->weights = d->grads = NULL;
    d->rank_weights = NULL;
    d->rank_grads = NULL;
    return PP_OK;
}

/* Takes the world (pp_pipeline_destroy destroys it from here on, even on failure) and makes
   every rank's stage. */
static pp_result _pp_pipeline_start(pp_pipeline* pl, const _pp_pl_world* w, pp_error* err) {
    pp_result rc;
    int r;
    pl->world = *w;
    if (pl->W > pl->d.p && !w->grid)
        return _pp_fail(err, PP_ERR_UNSUPPORTED, "dp = %d, tp = %d: this pipeline runs one replica of p ranks (the threads "
                        "pipeline, pp_pipeline_create, runs dp and tp; on GPUs, one process per GPU over pipeline_nccl.h's "
                        "pp_nccl_grid_create_tp, as examples/gpt_nccl.cu --tp: a layer's TP collective needs NCCL)",
                        pl->d.dp, pl->d.tp);
    for (r = 0; r < pl->W; r++) {
        pp_stage_desc sd = pl->d.stage;
        sd.model = pl->d.model;
        sd.weights = pl->weights[r];
        sd.grads = pl->grads[r];
        sd.schedule = &pl->sched;
        sd.partition = pl->first;
        sd.rank = pl->W > pl->d.p ? pl->place[3 * r] : r;
        pl->world.rank_desc(pl->world.self, r, &sd);
        if (pl->d.rank_setup && (rc = pl->d.rank_setup(pl->d.user, r, &sd)) != PP_OK)
            return _pp_fail(err, rc, "rank %d: rank_setup returned %s", r, pp_result_str(rc));
        pl->tr[r] = sd.transport;
        if ((rc = pp_stage_create(&sd, &pl->st[r], err)) != PP_OK) {
            char tmp[sizeof err->msg];
            if (!err) return rc;
            memcpy(tmp, err->msg, sizeof tmp);
            return _pp_fail(err, rc, "rank %d: %s", r, _pp_msg_body(tmp, rc));
        }
        pl->st[r]->tp_agree_off = 1; /* a failed rank stops the whole grid (_pp_pipeline_stop_all) */
    }
    return PP_OK;
}

static void _pp_plw_threads_desc(void* self, int rank, pp_stage_desc* d) {
    d->transport = pp_threads_transport((pp_threads*)self, rank);
}
static void _pp_plw_threads_reset(void* self) { pp_threads_reset((pp_threads*)self); }
static void _pp_plw_threads_destroy(void* self) { pp_threads_destroy((pp_threads*)self); }

/* dp or tp > 1: a threads world per pipeline (p ranks; pipeline q = dp_rank * tp + tp_rank) and
   one of every rank for the TP collectives and the dp sum (their groups' pairs never meet: a TP
   group's ranks share a dp rank, a dp group's a TP rank). */
typedef struct _pp_plw_grid {
    pp_threads** pipes;             /* [n_pipes] */
    int n_pipes;
    pp_threads* coll;               /* W ranks */
    const pp_pipeline* pl;
} _pp_plw_grid;

static void _pp_plw_grid_desc(void* self, int rank, pp_stage_desc* d) {
    _pp_plw_grid* g = (_pp_plw_grid*)self;
    const int* pl = g->pl->place + 3 * rank;
    d->transport = pp_threads_transport(g->pipes[pl[1] * g->pl->d.tp + pl[2]], pl[0]);
    d->tp = g->pl->d.tp > 1 ? &g->pl->tpg[rank] : NULL;
}
static void _pp_plw_grid_reset(void* self) {
    _pp_plw_grid* g = (_pp_plw_grid*)self;
    int q;
    for (q = 0; q < g->n_pipes; q++) pp_threads_reset(g->pipes[q]);
    pp_threads_reset(g->coll);
}
static void _pp_plw_grid_destroy(void* self) {
    _pp_plw_grid* g = (_pp_plw_grid*)self;
    int q;
    if (!g) return;
    for (q = 0; g->pipes && q < g->n_pipes; q++) pp_threads_destroy(g->pipes[q]);
    pp_threads_destroy(g->coll);
    PP_FREE(g->pipes);
    PP_FREE(g);
}
/* A rank failed: every pipeline's waits, and the collectives', return PP_ERR_ABORTED. */
static void _pp_plw_grid_abort(void* self, pp_result why, const char* msg) {
    _pp_plw_grid* g = (_pp_plw_grid*)self;
    pp_transport t;
    int q;
    for (q = 0; q < g->n_pipes; q++) {
        t = pp_threads_transport(g->pipes[q], 0);
        t.abort(t.self, why, msg);
    }
    t = pp_threads_transport(g->coll, 0);
    t.abort(t.self, why, msg);
}

static pp_result _pp_plw_grid_make(pp_pipeline* pl, _pp_pl_world* w, pp_error* err) {
    _pp_plw_grid* g = (_pp_plw_grid*)_pp_calloc(1, sizeof *g);
    int q, r, tp = pl->d.tp, dp = pl->d.dp;
    pp_result rc = PP_OK;
    if (!g || !(g->pipes = (pp_threads**)_pp_calloc((size_t)dp * (size_t)tp, sizeof *g->pipes))) {
        PP_FREE(g);
        return _pp_fail(err, PP_ERR_NOMEM, "%d pipelines", dp * tp);
    }
    g->n_pipes = dp * tp;
    g->pl = pl;
    for (q = 0; q < g->n_pipes && rc == PP_OK; q++) rc = pp_threads_create(pl->d.p, &g->pipes[q], err);
    if (rc == PP_OK) rc = pp_threads_create(pl->W, &g->coll, err);
    if (rc != PP_OK) {
        _pp_plw_grid_destroy(g);
        return rc;
    }
    for (r = 0; r < pl->W; r++) {
        pl->ctr[r] = pp_threads_transport(g->coll, r);
        pl->tpg[r].t = &pl->ctr[r];
        pl->tpg[r].ranks = pl->granks + (size_t)r * (size_t)(tp + dp);
        pl->tpg[r].n_ranks = tp;
#ifdef PP_TEST_PL_TP_IS_DP /* negative control (tests/test_pipeline.c "grid"): the layers get the dp group */
        pl->tpg[r].ranks += tp;
        pl->tpg[r].n_ranks = dp;
#endif
        pl->tpg[r].timeout_s = pl->d.stage.timeout_s;
    }
    memset(w, 0, sizeof *w);
    w->self = g;
    w->rank_desc = _pp_plw_grid_desc;
    w->reset = _pp_plw_grid_reset;
    w->destroy = _pp_plw_grid_destroy;
    w->abort_all = _pp_plw_grid_abort;
    w->grid = 1;
    return PP_OK;
}

pp_result pp_pipeline_create(const pp_pipeline_desc* d, pp_pipeline** out, pp_error* err) {
    _pp_pl_world w;
    pp_threads* t = NULL;
    pp_result rc;
    if (!out) return _pp_fail(err, PP_ERR_INVALID, "output pointer is NULL");
    *out = NULL;
    if (!d) return _pp_fail(err, PP_ERR_INVALID, "pipeline desc is NULL");
    if ((rc = _pp_pipeline_new(d, out, err)) == PP_OK && (*out)->W > (*out)->d.p) {
        if ((rc = _pp_plw_grid_make(*out, &w, err)) == PP_OK) rc = _pp_pipeline_start(*out, &w, err);
    } else if (rc == PP_OK && (rc = pp_threads_create((*out)->d.p, &t, err)) == PP_OK) {
        memset(&w, 0, sizeof w);
        w.self = t;
        w.rank_desc = _pp_plw_threads_desc;
        w.reset = _pp_plw_threads_reset;
        w.destroy = _pp_plw_threads_destroy;
        rc = _pp_pipeline_start(*out, &w, err);
    }
    if (rc != PP_OK) {
        pp_pipeline_destroy(*out);
        *out = NULL;
    }
    return rc;
}

void pp_pipeline_destroy(pp_pipeline* pl) {
    int r;
    if (!pl) return;
    for (r = 0; pl->st && r < pl->W; r++) pp_stage_destroy(pl->st[r]);
    if (pl->world.destroy) pl->world.destroy(pl->world.self);
    PP_FREE(pl->acts);
    PP_FREE(pl->first);
    PP_FREE((void*)pl->weights);
    PP_FREE(pl->grads);
    PP_FREE(pl->st);
    PP_FREE(pl->tr);
    PP_FREE(pl->rc);
    PP_FREE(pl->stats);
    PP_FREE(pl->rerr);
    PP_FREE(pl->events);
    PP_FREE(pl->b);
    PP_FREE(pl->place);
    PP_FREE(pl->granks);
    PP_FREE(pl->ctr);
    PP_FREE(pl->tpg);
    PP_FREE(pl->pbuf);
    if (pl->root_mu_ok) pthread_mutex_destroy(&pl->root_mu);
    if (pl->step_mu_ok) pthread_mutex_destroy(&pl->step_mu);
    PP_FREE(pl);
}

#ifdef PP_TEST_PL_NO_DP_SUM /* negative control (tests/test_pipeline.c "grid"): no data-parallel sum */
#define _PP_PL_DP_SUM 0
#else
#define _PP_PL_DP_SUM 1
#endif

/* dp > 1, after rank's backward: its layers' gradients summed over its dp group, buffer by
   buffer in layer order (the same calls on every member), times dp_scale. */
static pp_result _pp_pipeline_dp_sum(pp_pipeline* pl, int rank) {
    const pp_model* m = &pl->d.model;
    pp_param* pb = pl->pbuf + (size_t)rank * (size_t)pl->max_params;
    const int* dpr = pl->granks + (size_t)rank * (size_t)(pl->d.tp + pl->d.dp) + pl->d.tp;
    double t = pl->d.stage.timeout_s > 0 ? pl->d.stage.timeout_s : PP_DEFAULT_TIMEOUT_S;
    pp_error e;
    pp_result rc;
    int l, i, n;
    for (l = 0; l < m->n_layers && _PP_PL_DP_SUM; l++) {
        if (pp_schedule_layer_rank(&pl->sched, pl->first, l) != pl->place[3 * rank]) continue;
        n = m->params(m, pl->grads[rank], l, pb, pl->max_params);
        if (n < 0 || n > pl->max_params)
            return _pp_fail(&pl->rerr[rank], PP_ERR_INVALID,
                            "data-parallel sum: layer %d (%s): the params hook gave %d buffers (%d at create)", l,
                            _pp_layer_name(m, l), n, pl->max_params);
        for (i = 0; i < n; i++) {
            if (pb[i].count > 0 && !pb[i].data)
                return _pp_fail(&pl->rerr[rank], PP_ERR_INVALID,
                                "data-parallel sum: layer %d (%s) buffer %d: no data in rank_grads[%d]", l,
                                _pp_layer_name(m, l), i, rank);
            if (pb[i].count > 0 && (rc = pp_grad_allreduce(&pl->ctr[rank], dpr, pl->d.dp, pb[i].data, (size_t)pb[i].count,
                                                           pb[i].dtype, pl->d.dp_scale, t, &e)) != PP_OK)
                return _pp_fail(&pl->rerr[rank], rc, "data-parallel sum of layer %d (%s) buffer %d: %s", l,
                                _pp_layer_name(m, l), i, _pp_msg_body(e.msg, rc));
        }
    }
    return PP_OK;
}

/* A rank of a grid failed: the first that failed by itself (not aborted) stops every pipeline. */
static void _pp_pipeline_stop_all(pp_pipeline* pl, int rank, pp_result rc) {
    int lead;
    if (rc == PP_ERR_ABORTED || !pl->world.abort_all) return; /* its failure's own rank does it */
    pthread_mutex_lock(&pl->root_mu);
    lead = pl->root < 0;
    if (lead) pl->root = rank;
    pthread_mutex_unlock(&pl->root_mu);
    if (lead) pl->world.abort_all(pl->world.self, rc, pl->rerr[rank].msg[0] ? pl->rerr[rank].msg : pp_stage_error(pl->st[rank]));
}

static pp_result _pp_pipeline_rank(int rank, void* user) {
    pp_pipeline* pl = (pp_pipeline*)user;
    int grid = pl->W > pl->d.p;
    const pp_batch* b = &pl->b[grid ? pl->place[3 * rank + 1] : 0];
    pp_result rc = PP_OK;
    if (pl->world.enter && (rc = pl->world.enter(pl->world.self, rank, &pl->rerr[rank])) != PP_OK) {
        /* the others would wait for this rank until their deadline */
        if (pl->tr[rank].abort) pl->tr[rank].abort(pl->tr[rank].self, rc, pl->rerr[rank].msg);
    } else if (pl->eval) { /* a grid: the outputs of replica 0's TP rank 0 */
        rc = pp_stage_eval(pl->st[rank], b, grid && (pl->place[3 * rank + 1] || pl->place[3 * rank + 2]) ? NULL : pl->ev_out,
                           &pl->stats[rank]);
    } else {
        rc = pp_stage_step(pl->st[rank], b, &pl->stats[rank]);
        if (rc == PP_OK && pl->d.dp > 1) rc = _pp_pipeline_dp_sum(pl, rank);
    }
    if (rc != PP_OK && grid) _pp_pipeline_stop_all(pl, rank, rc);
    return pl->rc[rank] = rc;
}

/* Sums the ranks' stats (see pp_pipeline_step). */
static void _pp_stats_merge(const pp_step_stats* rs, int p, pp_step_stats* out) {
    int r;
    memset(out, 0, sizeof *out);
    for (r = 0; r < p; r++) {
        const pp_step_stats* a = &rs[r];
        if (a->has_loss) {
            out->loss = a->loss;
            out->has_loss = 1;
        }
        if (a->t_total > out->t_total) out->t_total = a->t_total;
        if (a->peak_live > out->peak_live) out->peak_live = a->peak_live;
        if (a->peak_mem > out->peak_mem) out->peak_mem = a->peak_mem;
        out->t_forward += a->t_forward;
        out->t_backward += a->t_backward;
        out->t_wait += a->t_wait;
        out->bytes_sent += a->bytes_sent;
        out->bytes_recv += a->bytes_recv;
        out->msgs_sent += a->msgs_sent;
        out->meta_bytes_sent += a->meta_bytes_sent;
        out->meta_msgs_sent += a->meta_msgs_sent;
        out->agree_msgs += a->agree_msgs;
        out->agree_bytes += a->agree_bytes;
        if (a->t_agree > out->t_agree) out->t_agree = a->t_agree;
        if (a->t_grads_final > out->t_grads_final) out->t_grads_final = a->t_grads_final;
        out->t_grads_hook += a->t_grads_hook;
        out->peak_stash_bytes += a->peak_stash_bytes;
        out->n_actions += a->n_actions;
        out->pool_bytes += a->pool_bytes;
        out->pool_need += a->pool_need;
        out->pool_allocs += a->pool_allocs;
        out->pool_frees += a->pool_frees;
    }
}

static pp_result _pp_pipeline_step(pp_pipeline* pl, const pp_batch* b, pp_step_stats* stats);

/* One step at a time: a second thread's call while a step is under way returns PP_ERR_INVALID at
   once and touches nothing (not even pp_pipeline_error, which the running step owns). */
pp_result pp_pipeline_step(pp_pipeline* pl, const pp_batch* b, pp_step_stats* stats) {
    pp_result rc;
    if (!_pp_step_begin(pl ? &pl->step_mu : NULL, pl && pl->step_mu_ok, stats)) return PP_ERR_INVALID;
    rc = _pp_pipeline_step(pl, b, stats);
    _pp_step_leave(&pl->step_mu);
    return rc;
}

pp_result pp_pipeline_eval(pp_pipeline* pl, const pp_batch* b, pp_eval_out* out, pp_step_stats* stats) {
    pp_result rc;
    if (!_pp_step_begin(pl ? &pl->step_mu : NULL, pl && pl->step_mu_ok, stats)) return PP_ERR_INVALID;
    pl->eval = 1;
    pl->ev_out = out;
    rc = _pp_pipeline_step(pl, b, stats);
    pl->eval = 0;
    pl->ev_out = NULL;
    _pp_step_leave(&pl->step_mu);
    return rc;
}

/* A rank's result while it has not returned: one that never runs (the step refused, its thread
   not started) takes the step's result, so pp_pipeline_rank_result never says PP_OK for it. */
#define _PP_NOT_RUN PP_RESULT_COUNT

static pp_result _pp_pipeline_step_run(pp_pipeline* pl, const pp_batch* b, pp_step_stats* stats);

static pp_result _pp_pipeline_step(pp_pipeline* pl, const pp_batch* b, pp_step_stats* stats) {
    pp_result rc;
    int r;
    if (stats) memset(stats, 0, sizeof *stats);
    pl->err.code = PP_OK;
    pl->err.msg[0] = 0;
    pl->root = -1;
    for (r = 0; r < pl->W; r++) {
        pl->rc[r] = _PP_NOT_RUN;
        pl->rerr[r].msg[0] = 0;
        memset(&pl->stats[r], 0, sizeof pl->stats[r]);
    }
    rc = _pp_pipeline_step_run(pl, b, stats);
    for (r = 0; r < pl->W; r++)
        if (pl->rc[r] == _PP_NOT_RUN) pl->rc[r] = rc;
#ifdef PP_TEST_NO_NOT_RUN /* negative control (tests/test_soak.c): ranks that did not run say PP_OK */
    for (r = 0; r < pl->W && rc != PP_OK; r++)
        if (pl->rc[r] == rc) pl->rc[r] = PP_OK;
#endif
    return rc;
}

static pp_result _pp_pipeline_step_run(pp_pipeline* pl, const pp_batch* b, pp_step_stats* stats) {
    pp_error e;
    pp_result rc, end_rc = PP_OK;
    int r, i, first = -1, not_run = 0, grid = pl->W > pl->d.p;
    if (!b) return _pp_fail(&pl->err, PP_ERR_INVALID, "batch is NULL");
    if (pl->stuck)
        return _pp_fail(&pl->err, PP_ERR_UNSUPPORTED,
                        "a failed step may have left receives posted, and rank %d's transport cannot withdraw them "
                        "(pp_transport.cancel is NULL): destroy the pipeline and create it again",
                        pl->stuck - 1);
    for (i = 0; i < pl->d.dp; i++) {
        pl->b[i] = b[i];
        if (pl->b[i].m == 0) pl->b[i].m = pl->sched.m;
        if (pl->b[i].m != pl->sched.m)
            return _pp_fail(&pl->err, PP_ERR_INVALID, "the batch%s has m = %d micro-batches, the pipeline's schedule %d (leave it 0)",
                            pl->d.dp > 1 ? (i ? " of a replica" : " of replica 0") : "", b[i].m, pl->sched.m);
    }
    if (pl->world.begin && (rc = pl->world.begin(pl->world.self, &pl->err)) != PP_OK) return rc;
    e.msg[0] = 0;
    rc = pp_threads_run(pl->W, _pp_pipeline_rank, pl, &e);
    if (pl->world.end) end_rc = pl->world.end(pl->world.self, rc == PP_OK ? &e : NULL);
    if (rc == PP_OK && end_rc != PP_OK) rc = end_rc;
    if (rc != PP_OK) {
        /* the first failure, not a rank that only heard of it; where a rank did not run (its
           thread not started), why it did not */
        for (r = 0; r < pl->W; r++) not_run += pl->rc[r] == _PP_NOT_RUN;
        if (!not_run && pl->root >= 0 && pl->rc[pl->root] != PP_OK) first = pl->root; /* a grid's: it stopped the rest */
        for (r = 0; r < pl->W && first < 0 && !not_run; r++)
            if (pl->rc[r] != PP_OK && pl->rc[r] != PP_ERR_ABORTED) first = r;
        for (r = 0; r < pl->W && first < 0 && !not_run; r++)
            if (pl->rc[r] != PP_OK) first = r;
        if (first >= 0 && grid) { /* "rank 5 of 8 (pp 1, dp 0, tp 1) failed first: ..." */
            const char* body = _pp_msg_body(pl->rerr[first].msg[0] ? pl->rerr[first].msg : pp_stage_error(pl->st[first]),
                                            pl->rc[first]);
            size_t k = _pp_names_rank(body, pl->place[3 * first]); /* its stage's "rank 1": the pp rank, said once */
            rc = _pp_fail(&pl->err, pl->rc[first], "rank %d of %d (pp %d, dp %d, tp %d) failed first%s%s", first, pl->W,
                          pl->place[3 * first], pl->place[3 * first + 1], pl->place[3 * first + 2], k ? "" : ": ", body + k);
        } else if (first >= 0) { /* "rank 2 of 4 failed first at F0.0 (stage 2): ...", the rank said once */
            const char* body = _pp_msg_body(pl->rerr[first].msg[0] ? pl->rerr[first].msg : pp_stage_error(pl->st[first]),
                                            pl->rc[first]);
            size_t k = _pp_names_rank(body, first);
            rc = _pp_fail(&pl->err, pl->rc[first], "rank %d of %d failed first%s%s", first, pl->d.p, k ? "" : ": ",
                          body + k);
        } else /* e's message has the code already: "out of memory: threads for 4 ranks" once */
            rc = _pp_fail(&pl->err, rc, "%s", e.msg[0] ? _pp_msg_body(e.msg, rc) : "no message");
        /* a grid: pipelines that finished did so for a step that failed elsewhere */
        for (r = 0; r < pl->W && grid; r++)
            if (pl->rc[r] == PP_OK) pl->rc[r] = PP_ERR_ABORTED;
        pl->world.reset(pl->world.self);
        for (r = 0; r < pl->W && !pl->stuck; r++)
            if (!pl->tr[r].cancel) pl->stuck = r + 1;
        return rc;
    }
    if (stats) _pp_stats_merge(pl->stats, pl->W, stats);
    if (stats && grid) { /* the replicas' losses in replica order, over dp */
        float loss = 0;
        int has = 0;
        for (i = 0; i < pl->d.dp; i++)
            for (r = 0; r < pl->W; r++)
                if (pl->stats[r].has_loss && pl->place[3 * r + 1] == i && pl->place[3 * r + 2] == 0) {
                    loss = has ? loss + pl->stats[r].loss : pl->stats[r].loss;
                    has = 1;
                }
        stats->loss = has ? loss / (float)pl->d.dp : 0;
        stats->has_loss = has;
    }
    return PP_OK;
}

const char* pp_pipeline_error(const pp_pipeline* pl) { return pl ? pl->err.msg : "pipeline is NULL"; }

pp_result pp_pipeline_rank_result(const pp_pipeline* pl, int rank, pp_step_stats* stats) {
    if (stats) memset(stats, 0, sizeof *stats);
    if (!pl || rank < 0 || rank >= pl->W) return PP_ERR_INVALID;
    if (stats) *stats = pl->stats[rank];
    return pl->rc[rank];
}

const pp_event* pp_pipeline_timeline(pp_pipeline* pl, size_t* n) {
    size_t need = 0, k, got;
    int r;
    if (n) *n = 0;
    if (!pl) return NULL;
    for (r = 0; r < pl->W; r++) {
        pp_stage_timeline(pl->st[r], &k);
        need += k;
    }
    if (need > pl->cap_events) {
        pp_event* ev = (pp_event*)_pp_calloc(need, sizeof *ev);
        if (!ev) return NULL;
        PP_FREE(pl->events);
        pl->events = ev;
        pl->cap_events = need;
    }
    for (got = 0, r = 0; r < pl->W; r++) {
        const pp_event* ev = pp_stage_timeline(pl->st[r], &k);
        if (ev && k) memcpy(pl->events + got, ev, k * sizeof *ev);
        got += ev ? k : 0;
    }
    if (n) *n = got;
    return pl->events;
}

const pp_schedule* pp_pipeline_schedule(const pp_pipeline* pl) { return pl ? &pl->sched : NULL; }
const int* pp_pipeline_partition(const pp_pipeline* pl) { return pl ? pl->first : NULL; }
pp_stage* pp_pipeline_stage(pp_pipeline* pl, int rank) { return pl && rank >= 0 && rank < pl->W ? pl->st[rank] : NULL; }
pp_threads* pp_pipeline_threads(pp_pipeline* pl) {
    if (pl && pl->world.destroy == _pp_plw_grid_destroy) return ((_pp_plw_grid*)pl->world.self)->pipes[0];
    return pl && pl->world.destroy == _pp_plw_threads_destroy ? (pp_threads*)pl->world.self : NULL;
}

/* >>impl-grad: the global gradient norm, clipping and the loss scaler (>>grad). */
#define _PP_GRAD_CHUNK ((size_t)1 << 16) /* elements staged at a time from device memory */

/* The listed buffers: layers inside [0, n_layers) (n_layers 0: any), a gradient dtype, data
   where count > 0, a copy where device memory is named. */
static pp_result _pp_gbufs_check(const pp_grad_buf* bufs, int n_bufs, int n_layers, pp_error* err) {
    int i;
    if (n_bufs < 0 || (n_bufs > 0 && !bufs))
        return _pp_fail(err, PP_ERR_INVALID, "%d gradient buffers (bufs %s)", n_bufs, bufs ? "given" : "NULL");
    for (i = 0; i < n_bufs; i++) {
        const pp_grad_buf* b = &bufs[i];
        pp_dtype t = b->dtype;
        if (b->layer < 0 || (n_layers > 0 && b->layer >= n_layers))
            return _pp_fail(err, PP_ERR_INVALID, "gradient buffer %d: layer %d is outside the model's %d layers", i, b->layer,
                            n_layers);
        if (t != PP_F32 && t != PP_F64 && t != PP_F16 && t != PP_BF16)
            return _pp_fail(err, PP_ERR_INVALID, "gradient buffer %d (layer %d): dtype %s (f32, f64, f16 or bf16)", i,
                            b->layer, pp_dtype_name(t));
        if (b->count && !b->data)
            return _pp_fail(err, PP_ERR_INVALID, "gradient buffer %d (layer %d): data is NULL", i, b->layer);
        if (b->tp_sharded != 0 && b->tp_sharded != 1)
            return _pp_fail(err, PP_ERR_INVALID, "gradient buffer %d (layer %d): tp_sharded = %d (0 or 1)", i, b->layer,
                            b->tp_sharded);
        if (b->count > ((size_t)1 << 60) / pp_dtype_size(t))
            return _pp_fail(err, PP_ERR_INVALID, "gradient buffer %d (layer %d): %zu elements", i, b->layer, b->count);
        if (b->device && !b->device->copy)
            return _pp_fail(err, PP_ERR_INVALID,
                            "gradient buffer %d (layer %d): its device ops have no copy (pp_cuda_device_ops has one)", i,
                            b->layer);
    }
    return PP_OK;
}

/* 1 when bufs[i]'s data is an earlier entry's: that buffer was counted and scaled already. */
static int _pp_gbuf_dup(const pp_grad_buf* bufs, int i) {
    int j;
    if (!bufs[i].count) return 1;
    for (j = 0; j < i; j++)
        if (bufs[j].count && bufs[j].data == bufs[i].data) return 1;
    return 0;
}

/* What _pp_gbuf_run does over a buffer's elements. */
enum { _PP_G_SUMSQ = 0, _PP_G_NONFINITE = 1, _PP_G_SCALE = 2 };

/* op over p[0..n) of dtype t, in element order: SUMSQ adds x*x (in f64) to *acc, NONFINITE
   sets *found on a NaN or Inf, SCALE multiplies by c (f32 by (float)c; f16/bf16 through f32,
   one rounding; f64 by c). */
static void _pp_gbuf_op(void* p, pp_dtype t, size_t n, int op, double c, double* acc, int* found) {
    size_t i;
    double a = acc ? *acc : 0;
    float fc = (float)c;
    switch (t) {
    case PP_F32: {
        float* x = (float*)p;
        if (op == _PP_G_SUMSQ)
            for (i = 0; i < n; i++) a += (double)x[i] * (double)x[i];
        else if (op == _PP_G_NONFINITE)
            for (i = 0; i < n && !*found; i++) *found = !(x[i] - x[i] == 0.0f);
        else
            for (i = 0; i < n; i++) x[i] *= fc;
        break;
    }
    case PP_F64: {
        double* x = (double*)p;
        if (op == _PP_G_SUMSQ)
            for (i = 0; i < n; i++) a += x[i] * x[i];
        else if (op == _PP_G_NONFINITE)
            for (i = 0; i < n && !*found; i++) *found = !(x[i] - x[i] == 0.0);
        else
            for (i = 0; i < n; i++) x[i] *= c;
        break;
    }
    default: { /* f16, bf16 */
        uint16_t* x = (uint16_t*)p;
        uint16_t mask = t == PP_F16 ? 0x7c00u : 0x7f80u;
        for (i = 0; i < n; i++) {
            float f;
            if (op == _PP_G_NONFINITE) {
                if ((x[i] & mask) == mask) {
                    *found = 1;
                    break;
                }
                continue;
            }
            f = t == PP_F16 ? pp_f16_to_f32(x[i]) : pp_bf16_to_f32(x[i]);
            if (op == _PP_G_SUMSQ) a += (double)f * (double)f;
            else x[i] = t == PP_F16 ? pp_f32_to_f16(f * fc) : pp_f32_to_bf16(f * fc);
        }
        break;
    }
    }
    if (acc) *acc = a;
}

/* op over one buffer: in place in host memory; through a host staging buffer (*scratch,
   _PP_GRAD_CHUNK elements of 8 bytes, allocated at first use, the caller frees it) and the
   device's copy in device memory, SCALE copying each chunk back. */
static pp_result _pp_gbuf_run(const pp_grad_buf* b, int op, double c, double* acc, int* found, unsigned char** scratch,
                              pp_error* err) {
    size_t es = pp_dtype_size(b->dtype), off, n;
    pp_result rc;
    if (!b->device) {
        _pp_gbuf_op(b->data, b->dtype, b->count, op, c, acc, found);
        return PP_OK;
    }
    if (!*scratch && !(*scratch = (unsigned char*)PP_MALLOC(_PP_GRAD_CHUNK * 8)))
        return _pp_fail(err, PP_ERR_NOMEM, "host buffer of %zu bytes for device gradients", _PP_GRAD_CHUNK * 8);
    for (off = 0; off < b->count; off += n) {
        unsigned char* src = (unsigned char*)b->data + off * es;
        n = b->count - off < _PP_GRAD_CHUNK ? b->count - off : _PP_GRAD_CHUNK;
        if ((rc = b->device->copy(b->device->user, *scratch, src, n * es, 1)) != PP_OK)
            return _pp_fail(err, rc, "layer %d: copying %zu bytes of gradients to the host", b->layer, n * es);
        _pp_gbuf_op(*scratch, b->dtype, n, op, c, acc, found);
        if (op == _PP_G_NONFINITE && *found) break;
        if (op == _PP_G_SCALE && (rc = b->device->copy(b->device->user, src, *scratch, n * es, 0)) != PP_OK)
            return _pp_fail(err, rc, "layer %d: copying %zu bytes of gradients back to the device", b->layer, n * es);
    }
    return PP_OK;
}

/* op over every listed buffer (shared ones once), tied copies included. */
static pp_result _pp_gbufs_run(const pp_grad_buf* bufs, int n_bufs, int op, double c, int* found, pp_error* err) {
    unsigned char* scratch = NULL;
    pp_result rc = PP_OK;
    int i;
    for (i = 0; i < n_bufs && rc == PP_OK; i++) {
        if (_pp_gbuf_dup(bufs, i)) continue;
        rc = _pp_gbuf_run(&bufs[i], op, c, NULL, found, &scratch, err);
        if (op == _PP_G_NONFINITE && *found) break;
    }
    PP_FREE(scratch);
    return rc;
}

/* The group's ranks (all of t's when g->ranks is NULL) into *ranks / *n, checked; *n = 1 for a
   process alone. */
static pp_result _pp_group_resolve(const pp_group* g, int* all, const int** ranks, int* n, pp_error* err) {
    const pp_transport* t = g ? g->t : NULL;
    int i;
    *ranks = NULL;
    *n = 1;
    if (!t) return PP_OK;
    if (!g->ranks) {
        if (t->size < 1 || t->size > PP_MAX_RANKS) return _pp_fail(err, PP_ERR_INVALID, "transport has %d ranks", t->size);
        for (i = 0; i < t->size; i++) all[i] = i;
        *ranks = all;
        *n = t->size;
    } else {
        *ranks = g->ranks;
        *n = g->n_ranks;
    }
    if (*n > 1 && !t->allreduce_sum && (!t->isend || !t->irecv || !t->wait))
        return _pp_fail(err, PP_ERR_INVALID, "the group's transport has neither allreduce_sum nor isend/irecv/wait");
    return _pp_check_group(t, *ranks, *n, err);
}

/* buf (count doubles) summed over the group, in place. */
static pp_result _pp_group_sum(const pp_group* g, double* buf, size_t count, pp_error* err) {
    int all[PP_MAX_RANKS], n;
    const int* ranks;
    pp_result rc = _pp_group_resolve(g, all, &ranks, &n, err);
    if (rc != PP_OK || n <= 1) return rc;
    if (g->t->allreduce_sum) return g->t->allreduce_sum(g->t->self, buf, count, PP_F64, ranks, n, g->timeout_s, err);
    return _pp_allreduce_p2p(g->t, buf, count, PP_F64, ranks, n, g->timeout_s, err, _PP_TAG_ALLREDUCE);
}

/* pp_grad_norm_tp (pp_grad_norm: tp NULL). The TP vector w, one all-reduce over tp: for TP rank k
   (its place in tp's ranks) w[k * 2L + l] its sharded sums of layer l, w[k * 2L + L + l] its
   replicated sums; w[2 * ntp * L + l] how many TP ranks listed layer l. Each slot has one
   non-zero term (the counts are small integers): exact in any order. */
static pp_result _pp_grad_norm(const pp_group* g, const pp_group* tp, int n_layers, const pp_grad_buf* bufs,
                               int n_bufs, double* norm, pp_error* err) {
    unsigned char* scratch = NULL;
    double *v, *w, total = 0;
    int tall[PP_MAX_RANKS], ntp = 1, me = 0;
    const int* tranks = NULL;
    size_t L = (size_t)n_layers, nw;
    pp_result rc;
    int i, l, k;
    if (!norm) return _pp_fail(err, PP_ERR_INVALID, "norm is NULL");
    *norm = 0;
    if (n_layers < 1) return _pp_fail(err, PP_ERR_INVALID, "a model of %d layers", n_layers);
    if ((rc = _pp_gbufs_check(bufs, n_bufs, n_layers, err)) != PP_OK) return rc;
    if (tp && (rc = _pp_group_resolve(tp, tall, &tranks, &ntp, err)) != PP_OK) return rc;
    if (ntp > 1) {
        for (me = 0; me < ntp && tranks[me] != tp->t->rank; me++) {
        }
        if (me == ntp) return _pp_fail(err, PP_ERR_INVALID, "rank %d is not in its TP group", tp->t->rank);
    } else {
        ntp = 1;
    }
    /* v[l]: layer l's sum of squares; v[L + l]: 1 where this rank (its TP group) listed layer l */
    nw = 2 * (size_t)ntp * L + L;
    if (!(v = (double*)_pp_calloc(2 * L + nw, sizeof *v)))
        return _pp_fail(err, PP_ERR_NOMEM, "norm vector of %d layers, %d TP ranks", n_layers, ntp);
    w = v + 2 * L;
    for (i = 0; i < n_bufs && rc == PP_OK; i++) {
        size_t at = (size_t)me * 2 * L + (bufs[i].tp_sharded ? 0 : L) + (size_t)bufs[i].layer;
        if (bufs[i].tied_copy || _pp_gbuf_dup(bufs, i)) continue;
        rc = _pp_gbuf_run(&bufs[i], _PP_G_SUMSQ, 0, &w[at], NULL, &scratch, err);
        w[2 * (size_t)ntp * L + (size_t)bufs[i].layer] = 1;
    }
    PP_FREE(scratch);
    if (rc == PP_OK && ntp > 1) rc = _pp_group_sum(tp, w, nw, err);
    for (l = 0; l < n_layers && rc == PP_OK; l++) {
        double c = w[2 * (size_t)ntp * L + (size_t)l];
        if (c != 0 && c != ntp)
            rc = _pp_fail(err, PP_ERR_INVALID,
                          "layer %d's gradients were listed by %.0f of the %d ranks of the TP group: every rank of a "
                          "TP group lists the same layers",
                          l, c, ntp);
#ifdef PP_TEST_TP_REPLICATED_EACH /* negative control (test_gradnorm tp): every TP rank's replicated copy counted */
        v[l] = 0;
        for (k = 0; k < ntp; k++) v[l] += w[(size_t)k * 2 * L + L + (size_t)l];
#else
        v[l] = w[L + (size_t)l]; /* the replicated buffers once: as tp's first rank holds them */
#endif
        for (k = 0; k < ntp; k++) v[l] += w[(size_t)k * 2 * L + (size_t)l]; /* the shards, in tp's rank order */
        v[L + (size_t)l] = c != 0;
    }
#ifdef PP_TEST_NO_NORM_ORDER /* negative control (test_gradnorm): this rank's layers first, then the ranks' totals */
    for (l = 0; l < n_layers; l++) total += v[l];
    if (rc == PP_OK) rc = _pp_group_sum(g, &total, 1, err);
#else
    if (rc == PP_OK) rc = _pp_group_sum(g, v, 2 * L, err);
    for (l = 0; l < n_layers && rc == PP_OK; l++) {
        if (v[L + (size_t)l] > 1)
            rc = _pp_fail(err, PP_ERR_INVALID,
                          "layer %d's gradients were listed by %.0f ranks of the group: a layer belongs to one rank "
                          "(over data-parallel replicas, pass one pipeline's ranks, after pp_grad_allreduce)",
                          l, v[L + (size_t)l]);
        total += v[l]; /* in layer order, the same list on every rank */
    }
#endif
    PP_FREE(v);
    if (rc == PP_OK) *norm = sqrt(total);
    return rc;
}

pp_result pp_grad_norm(const pp_group* g, int n_layers, const pp_grad_buf* bufs, int n_bufs, double* norm,
                       pp_error* err) {
    return _pp_grad_norm(g, NULL, n_layers, bufs, n_bufs, norm, err);
}

pp_result pp_grad_norm_tp(const pp_group* g, const pp_group* tp, int n_layers, const pp_grad_buf* bufs, int n_bufs,
                          double* norm, pp_error* err) {
    return _pp_grad_norm(g, tp, n_layers, bufs, n_bufs, norm, err);
}

pp_result pp_grad_clip(const pp_grad_buf* bufs, int n_bufs, double max_norm, double norm, double* coef,
                       pp_error* err) {
    double c;
    pp_result rc;
    int found = 0;
    if (coef) *coef = 1;
#ifdef PP_TEST_OLD_CLIP_BOUND /* negative control (build/failpath-controls): the largest doubles refused */
    if (!(max_norm > 0 && max_norm < 1e308))
#else
    if (!(max_norm > 0 && max_norm <= DBL_MAX)) /* every finite value, DBL_MAX included */
#endif
        return _pp_fail(err, PP_ERR_INVALID, "max_norm must be finite and > 0 (got %g)", max_norm);
#ifdef PP_TEST_OLD_CLIP_BOUND
    if (!(norm >= 0 && norm < 1e308))
#else
    if (!(norm >= 0 && norm <= DBL_MAX)) /* NaN, Inf or negative */
#endif
        return _pp_fail(err, norm < 0 ? PP_ERR_INVALID : PP_ERR_NONFINITE,
                        "the gradient norm is %g: the gradients are left as they are", norm);
    if ((rc = _pp_gbufs_check(bufs, n_bufs, 0, err)) != PP_OK) return rc;
    c = max_norm / (norm + 1e-6);
    if (c >= 1) return PP_OK;
    if (coef) *coef = c;
    return _pp_gbufs_run(bufs, n_bufs, _PP_G_SCALE, c, &found, err);
}

/* This rank owns every listed layer. */
static pp_result _pp_stage_owns(const pp_stage* s, const pp_grad_buf* bufs, int n_bufs, pp_error* err) {
    int i, r;
    for (i = 0; i < n_bufs; i++) {
        if (bufs[i].layer < 0 || bufs[i].layer >= s->L) continue; /* _pp_gbufs_check names it */
        r = pp_schedule_layer_rank(s->d.schedule, s->d.partition, bufs[i].layer);
        if (r != s->d.rank)
            return _pp_fail(err, PP_ERR_INVALID, "gradient buffer %d: layer %d (%s) belongs to rank %d, not to this rank (%d)",
                            i, bufs[i].layer, _pp_layer_name(&s->d.model, bufs[i].layer), r, s->d.rank);
    }
    return PP_OK;
}

static pp_result _pp_stage_grad(pp_stage* st, const pp_group* tp, const pp_grad_buf* bufs, int n_bufs, int clip,
                                double max_norm, double* norm, pp_error* err) {
    pp_group g;
    pp_result rc;
    if (norm) *norm = 0;
    if (!st) return _pp_fail(err, PP_ERR_INVALID, "stage is NULL");
    if (!_pp_step_enter(&st->step_mu, st->step_mu_ok))
        return _pp_fail(err, PP_ERR_INVALID, "rank %d: a step is running on this stage", st->d.rank);
    memset(&g, 0, sizeof g);
    g.t = &st->d.transport;
    g.timeout_s = st->d.timeout_s;
    rc = _pp_stage_owns(st, bufs, n_bufs, err);
    if (rc == PP_OK) rc = _pp_grad_norm(&g, tp, st->L, bufs, n_bufs, norm, err);
    if (rc == PP_OK && clip) rc = pp_grad_clip(bufs, n_bufs, max_norm, *norm, NULL, err);
    _pp_step_leave(&st->step_mu);
    return rc;
}

pp_result pp_stage_grad_norm(pp_stage* st, const pp_grad_buf* bufs, int n_bufs, double* norm, pp_error* err) {
    return _pp_stage_grad(st, NULL, bufs, n_bufs, 0, 0, norm, err);
}

pp_result pp_stage_grad_norm_tp(pp_stage* st, const pp_group* tp, const pp_grad_buf* bufs, int n_bufs, double* norm,
                                pp_error* err) {
    return _pp_stage_grad(st, tp, bufs, n_bufs, 0, 0, norm, err);
}

pp_result pp_stage_grad_clip_tp(pp_stage* st, const pp_group* tp, const pp_grad_buf* bufs, int n_bufs, double max_norm,
                                double* norm, pp_error* err) {
    double n;
    return _pp_stage_grad(st, tp, bufs, n_bufs, 1, max_norm, norm ? norm : &n, err);
}

pp_result pp_stage_grad_clip(pp_stage* st, const pp_grad_buf* bufs, int n_bufs, double max_norm, double* norm,
                             pp_error* err) {
    double n;
    pp_result rc = _pp_stage_grad(st, NULL, bufs, n_bufs, 1, max_norm, norm ? norm : &n, err);
    return rc;
}

static pp_result _pp_pipeline_grad(pp_pipeline* pl, const pp_grad_buf* bufs, int n_bufs, int clip, double max_norm,
                                   double* norm, pp_error* err) {
    pp_result rc;
    if (norm) *norm = 0;
    if (!pl) return _pp_fail(err, PP_ERR_INVALID, "pipeline is NULL");
    if (!_pp_step_enter(&pl->step_mu, pl->step_mu_ok))
        return _pp_fail(err, PP_ERR_INVALID, "a step is running on this pipeline");
    rc = pp_grad_norm(NULL, pl->d.model.n_layers, bufs, n_bufs, norm, err);
    if (rc == PP_OK && clip) rc = pp_grad_clip(bufs, n_bufs, max_norm, *norm, NULL, err);
    _pp_step_leave(&pl->step_mu);
    return rc;
}

pp_result pp_pipeline_grad_norm(pp_pipeline* pl, const pp_grad_buf* bufs, int n_bufs, double* norm, pp_error* err) {
    return _pp_pipeline_grad(pl, bufs, n_bufs, 0, 0, norm, err);
}

pp_result pp_pipeline_grad_clip(pp_pipeline* pl, const pp_grad_buf* bufs, int n_bufs, double max_norm, double* norm,
                                pp_error* err) {
    double n;
    return _pp_pipeline_grad(pl, bufs, n_bufs, 1, max_norm, norm ? norm : &n, err);
}

/* Layer l's buffers from m's params hook over g, appended at out[*n ..) (counted past cap). */
static pp_result _pp_layer_gbufs(const pp_model* m, void* g, int l, pp_grad_buf* out, int cap, int* n, pp_error* err) {
    pp_param small[16], *ps = small;
    int k, i;
    pp_result rc = PP_OK;
    k = m->params(m, g, l, NULL, 0);
    if (k < 0)
        return _pp_fail(err, PP_ERR_INVALID, "model '%s': its params hook does not know layer %d (%s)",
                        m->name ? m->name : "?", l, _pp_layer_name(m, l));
    if (k == 0) return PP_OK;
    if (out && *n + k <= cap) {
        if (k > 16 && !(ps = (pp_param*)PP_MALLOC((size_t)k * sizeof *ps)))
            return _pp_fail(err, PP_ERR_NOMEM, "%d parameter entries of layer %d", k, l);
        memset(ps, 0, (size_t)k * sizeof *ps);
        if (m->params(m, g, l, ps, k) != k) {
            rc = _pp_fail(err, PP_ERR_INVALID, "model '%s': the params hook of layer %d (%s) gave two counts",
                          m->name ? m->name : "?", l, _pp_layer_name(m, l));
            goto cleanup;
        }
        for (i = 0; i < k; i++) {
            pp_grad_buf* b = &out[*n + i];
            if (ps[i].count < 0 || (ps[i].count > 0 && !ps[i].data)) {
                rc = _pp_fail(err, PP_ERR_INVALID,
                              "layer %d (%s), buffer %d: %lld elements at %s (the grads struct holds no array there)", l,
                              _pp_layer_name(m, l), i, (long long)ps[i].count, ps[i].data ? "data" : "NULL");
                goto cleanup;
            }
            memset(b, 0, sizeof *b);
#ifndef PP_TEST_GBUFS_LAYER_OFF /* negative control (build/model-controls): every buffer one layer off */
            b->layer = l;
#else
            b->layer = l > 0 ? l - 1 : l;
#endif
            b->data = ps[i].data;
            b->count = (size_t)ps[i].count;
            b->dtype = ps[i].dtype;
            b->tp_sharded = ps[i].tp_sharded;
        }
    }
    *n += k;
cleanup:
    if (ps != small) PP_FREE(ps);
    return rc;
}

/* Every layer l (own NULL) or those with own[l] (or rank_of(l) == rank), each in grads[rank_of(l)] */
static pp_result _pp_model_gbufs(const pp_model* m, void* const* grads, int n_grads, const pp_schedule* sched,
                                 const int* first, int rank, const unsigned char* own, pp_grad_buf* out, int cap,
                                 int* n, pp_error* err) {
    int l, r;
    pp_result rc;
    if (n) *n = 0;
    if (!m || !n) return _pp_fail(err, PP_ERR_INVALID, "model or n is NULL");
    if (!m->params)
        return _pp_fail(err, PP_ERR_INVALID, "model '%s' has no params hook (pp_model.params: PP_MODEL_PARAMS makes one)",
                        m->name ? m->name : "?");
    if (cap < 0 || (cap > 0 && !out)) return _pp_fail(err, PP_ERR_INVALID, "cap %d with out %s", cap, out ? "set" : "NULL");
    for (l = 0; l < m->n_layers; l++) {
        r = sched ? pp_schedule_layer_rank(sched, first, l) : 0;
        if (own ? !own[l] : (sched && rank >= 0 && r != rank)) continue;
        if (r < 0 || r >= n_grads || !grads[r])
            return _pp_fail(err, PP_ERR_INVALID, "layer %d (%s): no grads struct for rank %d", l, _pp_layer_name(m, l), r);
        if ((rc = _pp_layer_gbufs(m, grads[r], l, out, cap, n, err)) != PP_OK) return rc;
    }
    if (out && *n > cap)
        return _pp_fail(err, PP_ERR_INVALID, "model '%s': %d gradient buffers, out holds %d", m->name ? m->name : "?", *n,
                        cap);
    return PP_OK;
}

pp_result pp_model_grad_bufs(const pp_model* m, void* grads, const unsigned char* own, pp_grad_buf* out, int cap,
                             int* n, pp_error* err) {
    if (!grads) return _pp_fail(err, PP_ERR_INVALID, "grads is NULL");
    return _pp_model_gbufs(m, &grads, 1, NULL, NULL, -1, own, out, cap, n, err);
}

pp_result pp_stage_grad_bufs(pp_stage* st, pp_grad_buf* out, int cap, int* n, pp_error* err) {
    void* g;
    if (!st) return _pp_fail(err, PP_ERR_INVALID, "stage is NULL");
    g = st->d.grads;
    if (!g) return _pp_fail(err, PP_ERR_INVALID, "rank %d: the stage has no grads", st->d.rank);
    if (st->d.rank < 0 || st->d.rank >= st->p) return _pp_fail(err, PP_ERR_INVALID, "rank %d", st->d.rank);
    {
        /* grads[] indexed by the owner's rank: only this rank's slot is read */
        void* gs[PP_MAX_RANKS];
        int r;
        for (r = 0; r < st->p && r < PP_MAX_RANKS; r++) gs[r] = r == st->d.rank ? g : NULL;
        return _pp_model_gbufs(&st->d.model, gs, st->p, st->d.schedule, st->d.partition, st->d.rank, NULL, out, cap,
                               n, err);
    }
}

pp_result pp_pipeline_grad_bufs(pp_pipeline* pl, pp_grad_buf* out, int cap, int* n, pp_error* err) {
    void* g[PP_MAX_RANKS];
    int r;
    if (n) *n = 0;
    if (!pl) return _pp_fail(err, PP_ERR_INVALID, "pipeline is NULL");
    if (pl->d.tp > 1)
        return _pp_fail(err, PP_ERR_UNSUPPORTED, "the pipeline has tp = %d: each TP rank holds its own shards; list each "
                        "rank's with pp_stage_grad_bufs(pp_pipeline_stage(pl, r), ...)", pl->d.tp);
    for (r = 0; r < pl->d.p; r++) g[r] = pl->grads[r * pl->d.dp]; /* replica 0 of pipeline rank r (tp 1) */
    return _pp_model_gbufs(&pl->d.model, g, pl->d.p, &pl->sched, pl->first, -1, NULL, out, cap, n, err);
}

pp_result pp_loss_scaler_init(pp_loss_scaler* s, const pp_loss_scaler_desc* d, pp_error* err) {
    pp_loss_scaler_desc r;
    if (!s) return _pp_fail(err, PP_ERR_INVALID, "scaler is NULL");
    memset(&r, 0, sizeof r);
    if (d) r = *d;
    r.init_scale = _PP_DEF(r.init_scale, 65536.0f);
    r.growth_factor = _PP_DEF(r.growth_factor, 2.0f);
    r.backoff_factor = _PP_DEF(r.backoff_factor, 0.5f);
    r.growth_interval = _PP_DEF(r.growth_interval, 2000);
    r.min_scale = _PP_DEF(r.min_scale, 1.0f);
    if (!(r.init_scale > 0 && r.init_scale < 3.4e38f) || !(r.min_scale > 0 && r.min_scale <= r.init_scale))
        return _pp_fail(err, PP_ERR_INVALID, "loss scale %g with a minimum of %g (want 0 < min_scale <= init_scale, finite)",
                        (double)r.init_scale, (double)r.min_scale);
    if (!(r.growth_factor >= 1 && r.growth_factor < 3.4e38f) || !(r.backoff_factor > 0 && r.backoff_factor < 1) ||
        r.growth_interval < 1)
        return _pp_fail(err, PP_ERR_INVALID,
                        "growth_factor %g (>= 1), backoff_factor %g (in (0, 1)), growth_interval %d (>= 1)",
                        (double)r.growth_factor, (double)r.backoff_factor, r.growth_interval);
    memset(s, 0, sizeof *s);
    s->d = r;
    s->scale = r.init_scale;
    return PP_OK;
}

pp_result pp_loss_scaler_check(pp_loss_scaler* s, const pp_group* groups, int n_groups, const pp_grad_buf* bufs,
                               int n_bufs, int* skip, pp_error* err) {
    double flag;
    pp_result rc;
    int found = 0, k;
    if (skip) *skip = 1;
    if (!s || !skip) return _pp_fail(err, PP_ERR_INVALID, "scaler or skip is NULL");
    if (!(s->scale > 0) || s->d.growth_interval < 1)
        return _pp_fail(err, PP_ERR_INVALID, "the scaler is not initialised (pp_loss_scaler_init)");
    if (n_groups < 0 || (n_groups > 0 && !groups))
        return _pp_fail(err, PP_ERR_INVALID, "%d groups (groups %s)", n_groups, groups ? "given" : "NULL");
    if ((rc = _pp_gbufs_check(bufs, n_bufs, 0, err)) != PP_OK) return rc;
    if ((rc = _pp_gbufs_run(bufs, n_bufs, _PP_G_NONFINITE, 0, &found, err)) != PP_OK) return rc;
    /* agree: the flags summed over each group in turn reach every rank, the same total */
    flag = found ? 1.0 : 0.0;
#ifndef PP_TEST_NO_SCALER_AGREE /* negative control (test_gradnorm): each rank decides alone */
    for (k = 0; k < n_groups; k++)
        if ((rc = _pp_group_sum(&groups[k], &flag, 1, err)) != PP_OK) return rc;
#else
    (void)k;
#endif
    *skip = flag > 0;
    if (!*skip && (rc = _pp_gbufs_run(bufs, n_bufs, _PP_G_SCALE, 1.0 / (double)s->scale, &found, err)) != PP_OK) {
        *skip = 1; /* what was unscaled is lost: the step cannot be taken */
        return rc;
    }
    s->steps++;
    if (*skip) {
        s->skipped++;
        s->good_steps = 0;
        s->scale = s->scale * s->d.backoff_factor < s->d.min_scale ? s->d.min_scale : s->scale * s->d.backoff_factor;
    } else if (++s->good_steps >= s->d.growth_interval) {
        s->good_steps = 0;
        if (s->scale * s->d.growth_factor < 3.4e38f) s->scale *= s->d.growth_factor;
    }
    return PP_OK;
}

/* The data-parallel reduction overlapped with the cool-down (pp_dp_overlap, >>grad). */
typedef struct _pp_dp_pending { /* a bucket started with dp's iallreduce_sum */
    pp_request req;
    int buf;
    size_t off, n;
} _pp_dp_pending;

struct pp_dp_overlap {
    pp_dp_overlap_desc d;           /* defaults resolved; bufs, dp.t and tied point at our copies */
    pp_transport dp_t, tied_t;
    _pp_dp_pending* pend;           /* started in the hooks, completed and scaled in the wait */
    int n_pend, cap_pend;
    pp_grad_buf* bufs;              /* [n_bufs]; with the two below, one allocation */
    int* stage;                     /* [n_bufs] the stage of each buffer's layer; -1: a tied layer */
    unsigned char* done;            /* [n_stages] reduced by the hook this step */
    int tied_a, tied_b;             /* the buffers of the tied copies; -1: not on this rank */
    pp_dp_overlap_stats st;         /* since the last wait */
    int tagged;                     /* 1: dp's sum is the library's own over isend/irecv (the threads
                                       transport's, or none): its tags carry the step's identity */
    int64_t step;                   /* this step's identity, told the hook by the stage; -1: none */
    int64_t ends;                   /* waits and resets so far: the identity where no hook ran */
    int wait_failed;                /* the last call was a failed wait: a reset after it ends no other step */
    pp_stage* pipe;                 /* the stage whose step this is (told at its end); NULL: none */
    pp_result step_rc;              /* that step's verdict on this rank (noted: 1) */
    int noted;
    int prev_failed;                /* this rank's last outcome was an error (its update skipped) */
    int n_dp, me_dp;                /* the dp group's size and this rank's place in it (-1: not in it) */
    double* vote;                   /* the agreement's vectors, set aside at create (>>grad, _pp_dp_vote):
                                       [3 (n_dp + _PP_VOTE_HDR)] dp's, then [PP_MAX_RANKS + _PP_VOTE_HDR]
                                       the pipeline's */
    int* pranks;                    /* [PP_MAX_RANKS] 0, 1, ...: the pipeline's ranks */
    pp_error err;
};

/* The step's identity on the dp transport's wire (threads: the tags of a blocking bucket's
   messages). A failed step leaves messages behind (a member that sent its part to one that had
   stopped waiting, a sum sent back to a member that had given up, a replica that came late);
   they carry their step's tag and are never taken by a later step. The identity is the stage's
   step count where the overlap's hook ran (pp_stage_step calls: the same on every rank of the
   grid, whatever failed), else the overlap's own count of waits and resets (each step ends with
   one: a wait after a step that went well, a reset after one that failed or whose wait failed). */
static int _pp_dp_tag(const pp_dp_overlap* o) {
    int64_t id = o->step >= 0 ? o->step : o->ends;
    return (int)(((uint64_t)id & 0xfffffu) << 1); /* below the reserved tags; tag + 1 is the sum back */
}

static void _pp_dp_note_step(void* user, int64_t step) {
    pp_dp_overlap* o = (pp_dp_overlap*)user;
    if (o) o->step = step;
}

/* Forgets what the hooks did and withdraws what they started. */
static void _pp_dp_clear(pp_dp_overlap* o) {
    int k;
    for (k = 0; k < o->n_pend; k++) /* started, never completed: withdrawn (MPI: abandoned) */
        if (o->d.dp.t->cancel) o->d.dp.t->cancel(o->d.dp.t->self, &o->pend[k].req);
    o->n_pend = 0;
    memset(o->done, 0, (size_t)o->d.n_stages);
    memset(&o->st, 0, sizeof o->st);
    o->step = -1;
    o->pipe = NULL;
    o->noted = 0;
}

/* The stage's end of a step (pp_stage_step, where grads_final is pp_dp_overlap_hook): its
   identity (also where no hook ran) and its verdict on this rank, which pp_dp_overlap_wait
   brings into the grid's agreement. */
static void _pp_dp_note_end(void* user, pp_stage* s, pp_result rc) {
    pp_dp_overlap* o = (pp_dp_overlap*)user;
    if (!o) return;
    o->step = s->n_steps;
    o->pipe = s;
    o->step_rc = rc;
    o->noted = 1;
}

/* The step's outcome, agreed by the grid. A step's outcome on a rank (the pipeline's verdict,
   then what this rank's wait found) goes into a vote: a vector of _PP_VOTE_HDR words (a magic
   number, the step's identity and its square, 1 where this rank's last outcome was an error)
   and one slot per member (its result, 0: PP_OK), summed over the group. Every member gets the
   same sum, so the same verdict: a failure anywhere fails the step everywhere (PP_ERR_ABORTED
   naming the member where this rank's own part went well); members at other steps, or that
   returned other outcomes for the previous step, fail it too, saying so. Two rounds: over the
   data-parallel group (every replica's part of it), then over the pipeline (every dp group's
   verdict): every rank of the grid ends with the same outcome. The discipline is the pipeline
   agreement's (_pp_agree): the memory is set aside at create; a member whose own part failed
   still takes part and says so, so no peer waits into its deadline for it; a failure of the
   vote's own messages fails the rank that saw it, and the peers by the vote or their deadline.
   What no protocol can settle is the last message: a member whose wait for the verdict fails
   after the root sent it returns an error where the others return PP_OK. Its next vote then
   says its last outcome differed, and that step fails on every rank, saying the weights may
   differ: never a silent divergence. */
#define _PP_VOTE_HDR 4
#define _PP_VOTE_MAGIC 20240613.0
#define _PP_DP_VOTE_TAG 0x200000 /* + _pp_dp_tag: above pp_dp_overlap's buckets, below the reserved tags */
static void _pp_vote_fill(double* v, int n, int me, int64_t id, int prev_failed, pp_result own) {
    double k = (double)(id & 0xfffff);
    memset(v, 0, sizeof(double) * ((size_t)n + _PP_VOTE_HDR));
    v[0] = _PP_VOTE_MAGIC;
    v[1] = k;
    v[2] = k * k;
    v[3] = prev_failed ? 1 : 0;
    v[_PP_VOTE_HDR + me] = (double)own;
}

/* The verdict of a summed vote over n members (member i: rank ranks[i] of `group`). */
static pp_result _pp_vote_judge_as(const double* v, int n, const int* ranks, int64_t id, const char* group, const char* ends,
                                   pp_error* err) {
    double k = (double)(id & 0xfffff);
    int i;
    for (i = 0; i < n; i++) {
        double c = v[_PP_VOTE_HDR + i];
        if (c == 0) continue;
        if (c != (double)(int)c || c < 1 || c >= PP_RESULT_COUNT) break; /* not one result: a corrupt vote */
        return _pp_fail(err, PP_ERR_ABORTED, "the step failed on member %d of the %s (rank %d): %s", i, group,
                        ranks[i], pp_result_str((pp_result)(int)c));
    }
    if (i < n || v[0] != n * _PP_VOTE_MAGIC || v[1] != n * k || v[2] != n * k * k)
        return _pp_fail(err, PP_ERR_TRANSPORT, "the members of the %s are not at the same step (this rank at %lld): "
                        "every rank ends every step with %s", group, (long long)id, ends);
    if (v[3] != 0 && v[3] != n)
        return _pp_fail(err, PP_ERR_TRANSPORT, "%d of the %d members of the %s returned an error for the previous step, "
                        "the others PP_OK (a fault in the last message of its agreement): their weights may differ; "
                        "restore them (pp_ckpt_load) before the next step", (int)v[3], n, group);
    return PP_OK;
}
static pp_result _pp_vote_judge(const double* v, int n, const int* ranks, int64_t id, const char* group, pp_error* err) {
    return _pp_vote_judge_as(v, n, ranks, id, group, "pp_dp_overlap_wait", err);
}

pp_result pp_dp_agree(const pp_transport* t, const int* ranks, int n_ranks, int64_t step, pp_result own, double timeout_s,
                      pp_error* err) {
    int all[PP_MAX_RANKS], n, me = 0, i;
    double* v;
    pp_error e;
    pp_result w;
    if (!t) return _pp_fail(err, PP_ERR_INVALID, "pp_dp_agree: transport is NULL");
    if (own < PP_OK || own >= PP_RESULT_COUNT)
        return _pp_fail(err, PP_ERR_INVALID, "pp_dp_agree: %d is not a pp_result", (int)own);
    if ((w = _pp_group_of(t, &ranks, &n_ranks, all, "pp_dp_agree: ", err)) != PP_OK) return w;
    n = n_ranks;
    for (i = 0; i < n; i++) /* in the group: _pp_group_of checked */
        if (ranks[i] == t->rank) me = i;
    if (!(v = (double*)PP_MALLOC(sizeof(double) * ((size_t)n + _PP_VOTE_HDR))))
        return _pp_fail(err, PP_ERR_NOMEM, "pp_dp_agree: %d members", n);
    e.msg[0] = 0;
    _pp_vote_fill(v, n, me, step, 0, own);
#ifndef PP_TEST_DP_AGREE_ALONE /* negative control (build/dpfault-controls): no exchange, each member its own outcome */
    w = t->allreduce_sum ? t->allreduce_sum(t->self, v, (size_t)n + _PP_VOTE_HDR, PP_F64, ranks, n, timeout_s, &e)
                         : pp_allreduce_p2p(t, v, (size_t)n + _PP_VOTE_HDR, PP_F64, ranks, n, timeout_s, &e);
#else
    w = PP_OK;
    (void)timeout_s;
    for (i = 0; i < _PP_VOTE_HDR; i++) v[i] *= n;
#endif
    if (own != PP_OK) w = _pp_fail(err, own, "rank %d: this rank's step failed (%s)", t->rank, pp_result_str(own));
    else if (w != PP_OK) w = _pp_fail(err, w, "rank %d: the data-parallel group's agreement on step %lld: %s", t->rank,
                                      (long long)step, e.msg[0] ? e.msg : pp_result_str(w));
    else w = _pp_vote_judge_as(v, n, ranks, step, "data-parallel group", "pp_dp_agree", err);
    PP_FREE(v);
    return w;
}

/* The identity the step's messages carry (_pp_dp_tag's). */
static int64_t _pp_dp_id(const pp_dp_overlap* o) { return o->step >= 0 ? o->step : o->ends; }

/* Round 1: the vote over the data-parallel group. own: this rank's outcome so far (its message
   in o->err). Over a transport with its own all-reduce (MPI, NCCL) the vote is one more
   all-reduce, in the order of the buckets'; over the library's (threads) it is the same gather
   to member 0 and answer, on tags that carry the step's identity, with the agreement's
   discipline: each member posts the receive of the verdict before it sends its part, a failed
   member still sends its part (saying so), a failed member 0 answers at once. */
static pp_result _pp_dp_vote(pp_dp_overlap* o, pp_result own) {
    const pp_transport* t = o->d.dp.t;
    int n = o->n_dp, me = o->me_dp, i, len = n + _PP_VOTE_HDR, tag, sent = 1;
    const int* ranks = o->d.dp.ranks ? o->d.dp.ranks : o->pranks;
    double *mine = o->vote, *res = mine + len, *tmp = res + len, t_end;
    size_t bytes = sizeof(double) * (size_t)len;
    int64_t id = _pp_dp_id(o);
    pp_request rq[2];
    pp_error e;
    pp_result w;
#ifdef PP_TEST_NO_DP_AGREE /* negative control (build/dpfault-controls): each rank keeps its own outcome */
    return own;
#endif
    if (n < 2 || me < 0) return own;
    e.msg[0] = 0;
    _pp_vote_fill(mine, n, me, id, o->prev_failed, own);
    if (!o->tagged) { /* the transport's own all-reduce: a collective, in stream order (MPI, NCCL) */
        if (!t->allreduce_sum) return own;
        memcpy(res, mine, bytes);
        w = t->allreduce_sum(t->self, res, (size_t)len, PP_F64, ranks, n, o->d.dp.timeout_s, &e);
        if (own != PP_OK) return own;
        if (w != PP_OK) return _pp_fail(&o->err, w, "rank %d: the data-parallel group's vote on the step: %s", t->rank, e.msg);
        return _pp_vote_judge(res, n, ranks, id, "data-parallel group", &o->err);
    }
    tag = _PP_DP_VOTE_TAG + _pp_dp_tag(o);
    memset(rq, 0, sizeof rq);
    if (me == 0) {
        memcpy(res, mine, bytes);
        t_end = _pp_now() + o->d.dp.timeout_s;
        for (i = 1; i < n && own == PP_OK; i++) { /* a failed member 0 answers at once */
            double left = t_end - _pp_now();
            int k;
            if ((w = t->irecv(t->self, ranks[i], tag, tmp, bytes, &rq[0])) == PP_OK &&
                (w = t->wait(t->self, &rq[0], left > 1e-3 ? left : 1e-3, &e)) != PP_OK && t->cancel)
                t->cancel(t->self, &rq[0]);
            if (w != PP_OK) {
                own = _pp_fail(&o->err, w, "rank %d: member %d's part of the data-parallel group's vote did not come: %s",
                               t->rank, i, e.msg[0] ? e.msg : pp_result_str(w));
                res[_PP_VOTE_HDR] = (double)own; /* what the members are told: failed here */
                break;
            }
            for (k = 0; k < len; k++) res[k] += tmp[k];
        }
        if (own != PP_OK) res[_PP_VOTE_HDR] = (double)own;
        for (i = 1; i < n; i++) {
            memset(&rq[1], 0, sizeof rq[1]);
            if ((w = t->isend(t->self, ranks[i], tag + 1, res, bytes, &rq[1])) != PP_OK) {
                if (own == PP_OK) /* member i is not told: it fails at its deadline, and so does this rank */
                    own = _pp_fail(&o->err, w, "rank %d: sending member %d the data-parallel group's verdict", t->rank, i);
                continue;
            }
            t->wait(t->self, &rq[1], o->d.dp.timeout_s, NULL); /* the verdict went: its wait decides nothing */
        }
        if (own != PP_OK) return own;
        return _pp_vote_judge(res, n, ranks, id, "data-parallel group", &o->err);
    }
    if ((w = t->irecv(t->self, ranks[0], tag + 1, res, bytes, &rq[0])) != PP_OK) {
        rq[0].done = -2; /* not posted */
        if (own == PP_OK)
            own = _pp_fail(&o->err, w, "rank %d: posting the receive of the data-parallel group's verdict", t->rank);
        mine[_PP_VOTE_HDR + me] = (double)own;
    }
    if ((w = t->isend(t->self, ranks[0], tag, mine, bytes, &rq[1])) != PP_OK) {
        sent = 0;
        if (own == PP_OK) own = _pp_fail(&o->err, w, "rank %d: sending member 0 this rank's part of the vote", t->rank);
    }
    if (sent) t->wait(t->self, &rq[1], o->d.dp.timeout_s, NULL); /* the verdict comes only if the part went */
    if (rq[0].done == -2) return own;
    if ((w = t->wait(t->self, &rq[0], o->d.dp.timeout_s, &e)) != PP_OK) {
        if (t->cancel) t->cancel(t->self, &rq[0]);
        if (own == PP_OK)
            own = _pp_fail(&o->err, w, "rank %d: waiting for the data-parallel group's verdict from member 0 (rank %d): %s",
                           t->rank, ranks[0], e.msg[0] ? e.msg : pp_result_str(w));
        return own;
    }
    if (own != PP_OK) return own;
    return _pp_vote_judge(res, n, ranks, id, "data-parallel group", &o->err);
}

/* Round 2: the vote over the pipeline of stage s (its transport's all-reduce): every dp group's
   verdict reaches every rank of the replica, so the grid ends with one outcome. */
static pp_result _pp_dp_vote_pipe(pp_dp_overlap* o, pp_stage* s, pp_result own) {
    const pp_transport* t;
    double* v = o->vote + 3 * ((size_t)o->n_dp + _PP_VOTE_HDR);
    int64_t id = _pp_dp_id(o);
    pp_error e;
    pp_result w;
#ifdef PP_TEST_NO_DP_AGREE
    return own;
#endif
    if (!s || s->p < 2 || s->p > PP_MAX_RANKS) return own;
    t = &s->d.transport;
    e.msg[0] = 0;
    _pp_vote_fill(v, s->p, s->d.rank, id, o->prev_failed, own);
    if (t->allreduce_sum)
        w = t->allreduce_sum(t->self, v, (size_t)s->p + _PP_VOTE_HDR, PP_F64, o->pranks, s->p, s->d.timeout_s, &e);
    else if (t->isend && t->irecv && t->wait)
        w = _pp_allreduce_p2p(t, v, (size_t)s->p + _PP_VOTE_HDR, PP_F64, o->pranks, s->p, s->d.timeout_s, &e, _PP_TAG_ALLREDUCE);
    else
        return own;
    if (own != PP_OK) return own;
    if (w != PP_OK) return _pp_fail(&o->err, w, "rank %d: the pipeline's vote on the step: %s", t->rank, e.msg);
    return _pp_vote_judge(v, s->p, o->pranks, id, "pipeline", &o->err);
}

/* pp_dp_overlap_desc.coalesce: buffers listed one after the other that follow one another in
   memory, in one stage, of one dtype and memory, become one (a layer's weight and bias in one
   arena, a stage's layers): fewer, larger all-reduces, each element summed as before. Tied
   layers' buffers stay apart. */
static void _pp_dp_coalesce(pp_dp_overlap* o) {
    int i, k = 0;
    for (i = 0; i < o->d.n_bufs; i++) {
        const pp_grad_buf* b = &o->bufs[i];
        if (k > 0) {
            pp_grad_buf* a = &o->bufs[k - 1];
            size_t es = pp_dtype_size(a->dtype);
#ifndef PP_TEST_NO_DP_COALESCE /* negative control (test_grid overlap): every buffer its own all-reduces */
            if (o->stage[k - 1] >= 0 && o->stage[k - 1] == o->stage[i] && a->dtype == b->dtype &&
                a->device == b->device && a->data && b->data && (char*)a->data + a->count * es == (char*)b->data) {
                a->count += b->count;
                continue;
            }
#else
            (void)a, (void)es;
#endif
        }
        if (k != i) {
            o->bufs[k] = *b;
            o->stage[k] = o->stage[i];
            if (o->tied_a == i) o->tied_a = k;
            if (o->tied_b == i) o->tied_b = k;
        }
        k++;
    }
    o->d.n_bufs = k;
}

/* Elements of dtype in one bucket (bucket_bytes resolved). */
static size_t _pp_dp_per(const pp_dp_overlap* o, pp_dtype dtype) {
    size_t es = pp_dtype_size(dtype);
    return es && o->d.bucket_bytes / es ? o->d.bucket_bytes / es : 1;
}

pp_result pp_dp_overlap_create(const pp_dp_overlap_desc* d, pp_dp_overlap** out, pp_error* err) {
    pp_dp_overlap* o;
    int i;
    if (!out) return _pp_fail(err, PP_ERR_INVALID, "output pointer is NULL");
    *out = NULL;
    if (!d || !d->dp.t || (d->n_bufs > 0 && !d->bufs) || d->n_bufs < 0 || !d->partition || d->n_stages < 1)
        return _pp_fail(err, PP_ERR_INVALID, "pp_dp_overlap_desc needs dp.t, bufs (n_bufs >= 0), partition and n_stages >= 1");
#ifndef PP_TEST_NO_DP_SCALE_CHECK /* negative control (build/dpfault-controls): NaN and Inf taken */
    if (!(d->scale >= 0 && d->scale <= 1.7976931348623157e308))
        return _pp_fail(err, PP_ERR_INVALID, "scale %g must be a finite number >= 0 (0: 1 / the group's size)", d->scale);
#else
    if (d->scale < 0) return _pp_fail(err, PP_ERR_INVALID, "scale %g is negative", d->scale);
#endif
    for (i = 0; i < d->n_bufs; i++) {
        const pp_grad_buf* b = &d->bufs[i];
        if (b->layer < d->partition[0] || b->layer >= d->partition[d->n_stages])
            return _pp_fail(err, PP_ERR_INVALID, "buffer %d: layer %d is outside the partition's layers %d .. %d", i,
                            b->layer, d->partition[0], d->partition[d->n_stages] - 1);
        if (b->count && !b->data) return _pp_fail(err, PP_ERR_INVALID, "buffer %d (layer %d) is NULL", i, b->layer);
    }
    if (!(o = (pp_dp_overlap*)_pp_calloc(1, sizeof *o))) return _pp_fail(err, PP_ERR_NOMEM, "pp_dp_overlap");
    o->d = *d;
    /* bufs, then stage, then done: the int and byte slices after the structs stay aligned */
    o->bufs = (pp_grad_buf*)_pp_calloc(1, ((size_t)d->n_bufs + 1) * (sizeof *o->bufs + sizeof *o->stage) +
                                              (size_t)d->n_stages);
    if (!o->bufs) {
        PP_FREE(o);
        return _pp_fail(err, PP_ERR_NOMEM, "pp_dp_overlap tables for %d buffers", d->n_bufs);
    }
    o->stage = (int*)(void*)(o->bufs + d->n_bufs + 1);
    o->done = (unsigned char*)(o->stage + d->n_bufs + 1);
    if (o->d.bucket_bytes == 0) o->d.bucket_bytes = (size_t)4 << 20;
    if (d->dp.t->iallreduce_sum) { /* room for every bucket of a step, started at once */
        size_t nb = 0;
        for (i = 0; i < d->n_bufs; i++) {
            size_t per = _pp_dp_per(o, d->bufs[i].dtype);
            nb += (d->bufs[i].count + per - 1) / per;
        }
        if (nb > (size_t)1 << 30 || !(o->pend = (_pp_dp_pending*)_pp_calloc(nb + 1, sizeof *o->pend))) {
            pp_dp_overlap_destroy(o);
            return _pp_fail(err, PP_ERR_NOMEM, "pp_dp_overlap: %zu pending buckets", nb);
        }
        o->cap_pend = (int)nb;
    }
    if (d->n_bufs) memcpy(o->bufs, d->bufs, (size_t)d->n_bufs * sizeof *o->bufs);
    o->d.bufs = o->bufs;
    o->dp_t = *d->dp.t; /* the structs are copied (what they point to must live on) */
    o->d.dp.t = &o->dp_t;
    if (d->tied) {
        o->tied_t = *d->tied;
        o->d.tied = &o->tied_t;
    }
    if (o->d.scale == 0) o->d.scale = 1.0 / (d->dp.ranks ? d->dp.n_ranks : d->dp.t->size);
    o->tied_a = o->tied_b = -1;
    o->step = -1;
#ifndef PP_TEST_NO_DP_STEP_ID /* negative control (build/dpfault-controls): a failed step's leftovers are taken */
    o->tagged = o->dp_t.isend && o->dp_t.irecv && o->dp_t.wait &&
                (!o->dp_t.allreduce_sum || o->dp_t.allreduce_sum == _pp_threads_allreduce);
#endif
    for (i = 0; i < d->n_bufs; i++) {
        int l = o->bufs[i].layer;
        o->stage[i] = _pp_layer_stage(d->partition, d->n_stages, l);
        if (d->tied && (l == d->tied_layers[0] || l == d->tied_layers[1])) {
            o->stage[i] = -1; /* after the tied sum, in the wait */
            if (l == d->tied_layers[0] && o->tied_a < 0) o->tied_a = i;
            else if (l == d->tied_layers[1] && o->tied_b < 0) o->tied_b = i;
        }
    }
    if (d->coalesce) _pp_dp_coalesce(o);
    /* the agreement's memory, before any step: a failed step must still be able to agree */
    o->n_dp = d->dp.ranks ? d->dp.n_ranks : d->dp.t->size;
    o->me_dp = -1;
    for (i = 0; i < o->n_dp; i++)
        if ((d->dp.ranks ? d->dp.ranks[i] : i) == d->dp.t->rank) o->me_dp = i;
    if (o->n_dp < 1 || o->n_dp > PP_MAX_RANKS ||
        !(o->vote = (double*)_pp_calloc(3 * ((size_t)o->n_dp + _PP_VOTE_HDR) + PP_MAX_RANKS + _PP_VOTE_HDR +
                                            PP_MAX_RANKS, sizeof(double)))) {
        int n = o->n_dp;
        pp_dp_overlap_destroy(o);
        return _pp_fail(err, n < 1 || n > PP_MAX_RANKS ? PP_ERR_INVALID : PP_ERR_NOMEM,
                        "pp_dp_overlap: the step agreement's buffers for a group of %d (1 .. %d)", n, PP_MAX_RANKS);
    }
    o->pranks = (int*)(void*)(o->vote + 3 * ((size_t)o->n_dp + _PP_VOTE_HDR) + PP_MAX_RANKS + _PP_VOTE_HDR);
    for (i = 0; i < PP_MAX_RANKS; i++) o->pranks[i] = i;
    *out = o;
    return PP_OK;
}

void pp_dp_overlap_destroy(pp_dp_overlap* o) {
    if (!o) return;
    _pp_dp_clear(o);
    PP_FREE(o->pend);
    PP_FREE(o->vote); /* and pranks */
    PP_FREE(o->bufs); /* and stage, done */
    PP_FREE(o);
}

/* Buffer i over the dp group, bucket by bucket: n buckets more into *buckets. start 1 (the
   hook): a bucket the transport can start (iallreduce_sum) is left pending for the wait. */
static pp_result _pp_dp_reduce(pp_dp_overlap* o, int i, int* buckets, int start) {
    const pp_grad_buf* b = &o->bufs[i];
    const pp_transport* t = o->d.dp.t;
    size_t es = pp_dtype_size(b->dtype), per = _pp_dp_per(o, b->dtype), off, n;
    int all[PP_MAX_RANKS], k, nr = o->d.dp.ranks ? o->d.dp.n_ranks : t->size;
    const int* ranks = o->d.dp.ranks;
#ifdef PP_TEST_NO_DP_START /* negative control (multiprocess.mk): every bucket blocks in the hook */
    start = 0;
#endif
    if (!ranks && start && t->size <= PP_MAX_RANKS) { /* iallreduce_sum takes the group as pp_grad_allreduce makes it */
        for (k = 0; k < t->size; k++) all[k] = k;
        ranks = all;
    }
    for (off = 0; off < b->count; off += n) {
        pp_result rc = PP_ERR_UNSUPPORTED;
        void* p;
        n = b->count - off < per ? b->count - off : per;
        p = (char*)b->data + off * es;
        if (start && o->n_pend < o->cap_pend && nr > 1 && ranks) {
            _pp_dp_pending* q = &o->pend[o->n_pend];
            rc = t->iallreduce_sum(t->self, p, n, b->dtype, ranks, nr, &q->req);
            if (rc == PP_OK) {
                q->buf = i;
                q->off = off;
                q->n = n;
                o->n_pend++;
                o->st.buckets_started++;
            } else if (rc != PP_ERR_UNSUPPORTED) {
                return _pp_fail(&o->err, rc, "rank %d: starting the all-reduce of layer %d's gradient (%zu of %zu)",
                                t->rank, b->layer, n, b->count);
            }
        }
        if (rc == PP_ERR_UNSUPPORTED) {
            rc = _pp_grad_allreduce(t, o->d.dp.ranks, o->d.dp.n_ranks, p, n, b->dtype, o->d.scale, o->d.dp.timeout_s,
                                    &o->err, o->tagged ? _pp_dp_tag(o) : -1);
            if (rc != PP_OK) return rc;
        }
        ++*buckets;
    }
    return PP_OK;
}

/* The started buckets, in the order they were started: wait, then scale as pp_grad_allreduce.
   After the first failure the rest are withdrawn, not waited for: a failed wait costs one
   deadline, not one per bucket started. */
static pp_result _pp_dp_complete(pp_dp_overlap* o) {
    const pp_transport* t = o->d.dp.t;
    pp_result rc = PP_OK;
    int k;
    for (k = 0; k < o->n_pend; k++) {
        _pp_dp_pending* q = &o->pend[k];
        const pp_grad_buf* b = &o->bufs[q->buf];
        pp_result r;
#ifndef PP_TEST_NO_DP_ONE_DEADLINE /* negative control (build/dpfault-controls): a deadline per bucket */
        if (rc != PP_OK) {
            pp_error ignored;
            if (t->cancel) t->cancel(t->self, &q->req);
            else t->wait(t->self, &q->req, 1e-3, &ignored); /* no cancel: the transport's own cleanup */
            continue;
        }
#endif
        r = t->wait(t->self, &q->req, o->d.dp.timeout_s, &o->err);
        if (r == PP_OK && rc == PP_OK) _pp_scale((char*)b->data + q->off * pp_dtype_size(b->dtype), q->n, b->dtype, o->d.scale);
        if (r != PP_OK && rc == PP_OK) rc = r;
    }
    o->n_pend = 0;
    return rc;
}

pp_result pp_dp_overlap_hook(void* user, int rank, int stage) {
    pp_dp_overlap* o = (pp_dp_overlap*)user;
    double t0 = _pp_now();
    pp_result rc = PP_OK;
    int i;
    (void)rank;
    if (!o) return PP_ERR_INVALID;
    o->wait_failed = 0;
    if (stage < 0 || stage >= o->d.n_stages)
        return _pp_fail(&o->err, PP_ERR_INVALID, "stage %d is outside the overlap's %d stages", stage, o->d.n_stages);
    if (o->done[stage]) return PP_OK;
    o->done[stage] = 1;
    for (i = 0; i < o->d.n_bufs && rc == PP_OK; i++)
        if (o->stage[i] == stage) rc = _pp_dp_reduce(o, i, &o->st.buckets_hook, 1);
    o->st.t_hook += _pp_now() - t0;
    return rc;
}

/* The step's end on this rank (pp_dp_overlap_wait, pp_dp_overlap_end): where the step went well
   here, what the hooks left, the tied sum, the tied layers; then the grid's vote (_pp_dp_vote). */
static pp_result _pp_dp_end(pp_dp_overlap* o, pp_stage* s, pp_result step_rc, pp_dp_overlap_stats* stats, pp_error* err) {
    double t0 = _pp_now();
    pp_result rc = PP_OK;
    int i, k;
    o->err.msg[0] = 0;
    o->wait_failed = 0;
    if (s && o->step < 0) o->step = s->n_steps; /* no hook was told (a wrapped hook): the same on every member */
    /* The replica's step failed. Over the library's tagged sum (threads) nothing is left to
       reduce, only to agree: what is not taken stays with its step's tags. Over a transport's
       own collectives (MPI, NCCL) there are no tags: the members meet in issue order, so this
       rank issues what a good step's wait issues (its sums thrown away), and the vote meets the
       peers' vote, not a bucket of theirs (NCCL's drained step ran every hook). */
    if (step_rc != PP_OK && o->tagged) {
        for (k = 0; k < o->n_pend; k++)
            if (o->d.dp.t->cancel) o->d.dp.t->cancel(o->d.dp.t->self, &o->pend[k].req);
        o->n_pend = 0;
        goto failed;
    }
#ifdef PP_TEST_NO_DP_SAME_ORDER /* negative control (build/nccl-grid-controls): a failed rank skips to the vote */
    if (step_rc != PP_OK) {
        for (k = 0; k < o->n_pend; k++)
            if (o->d.dp.t->cancel) o->d.dp.t->cancel(o->d.dp.t->self, &o->pend[k].req);
        o->n_pend = 0;
        goto failed;
    }
#endif
    rc = _pp_dp_complete(o);
    for (i = 0; i < o->d.n_bufs && rc == PP_OK; i++)
        if (o->stage[i] >= 0 && !o->done[o->stage[i]]) rc = _pp_dp_reduce(o, i, &o->st.buckets_wait, 0);
    if (rc == PP_OK && o->d.tied) {
        const pp_grad_buf* ba = o->tied_a >= 0 ? &o->bufs[o->tied_a] : NULL;
        const pp_grad_buf* bb = o->tied_b >= 0 ? &o->bufs[o->tied_b] : NULL;
        const pp_grad_buf* any = ba ? ba : bb;
        if (any) {
#ifndef PP_TEST_NO_TIED_FIRST /* negative control (build/overlap-controls): the tied sum after the dp sum */
            rc = pp_tied_sum_grads(o->d.tied, o->d.tied_pair, ba ? ba->data : NULL, bb ? bb->data : NULL, any->count,
                                   any->dtype, o->d.dp.timeout_s, &o->err);
#endif
        }
        for (i = 0; i < o->d.n_bufs && rc == PP_OK; i++)
            if (o->stage[i] < 0) rc = _pp_dp_reduce(o, i, &o->st.buckets_wait, 0);
#ifdef PP_TEST_NO_TIED_FIRST
        if (rc == PP_OK && any)
            rc = pp_tied_sum_grads(o->d.tied, o->d.tied_pair, ba ? ba->data : NULL, bb ? bb->data : NULL, any->count,
                                   any->dtype, o->d.dp.timeout_s, &o->err);
#endif
    }
failed:
    if (step_rc != PP_OK)
        rc = _pp_fail(&o->err, step_rc, "the step failed on this rank: %s",
                      s && s->err.msg[0] ? _pp_strip_code(s->err.msg, step_rc) : pp_result_str(step_rc));
    rc = _pp_dp_vote(o, rc);
    rc = _pp_dp_vote_pipe(o, s, rc);
    o->st.t_wait += _pp_now() - t0;
    if (stats) *stats = o->st;
    _pp_dp_clear(o);
    o->ends++;
    o->wait_failed = rc != PP_OK;
    o->prev_failed = rc != PP_OK;
    if (rc != PP_OK) return _pp_fail(err, rc, "%s", _pp_strip_code(o->err.msg, rc));
    return PP_OK;
}

pp_result pp_dp_overlap_wait(pp_dp_overlap* o, pp_dp_overlap_stats* stats, pp_error* err) {
    if (!o) return _pp_fail(err, PP_ERR_INVALID, "overlap is NULL");
    return _pp_dp_end(o, o->noted ? o->pipe : NULL, o->noted ? o->step_rc : PP_OK, stats, err);
}

pp_result pp_dp_overlap_end(pp_dp_overlap* o, pp_stage* st, pp_result step_rc, pp_dp_overlap_stats* stats, pp_error* err) {
    if (!o) return _pp_fail(err, PP_ERR_INVALID, "overlap is NULL");
    if ((int)step_rc < 0 || (int)step_rc >= PP_RESULT_COUNT)
        return _pp_fail(err, PP_ERR_INVALID, "step_rc %d is not a pp_result", (int)step_rc);
    return _pp_dp_end(o, st, step_rc, stats, err);
}

void pp_dp_overlap_reset(pp_dp_overlap* o) {
    if (!o) return;
    _pp_dp_clear(o);
    if (!o->wait_failed) o->ends++; /* a reset after a failed wait ends the same step */
    o->wait_failed = 0;
    o->prev_failed = 1; /* this rank skips the step's update */
}

const char* pp_dp_overlap_error(const pp_dp_overlap* o) { return o ? o->err.msg : ""; }

/* >>impl-ckpt: checkpoints (the format is in >>ckpt's comment). A save writes the header from
   the desc's tables and each owned record straight from the user's buffers (through a staging
   copy where d->copy is set); a load reads the header and the owned records into scratch, checks
   all of it, and only then copies into the user's buffers. */
static const unsigned char _pp_ckpt_magic[8] = {'P', 'P', 'C', 'K', 'P', 'T', '\r', '\n'};
#define _PP_CKPT_VERSION 1u
#define _PP_CKPT_HEAD 128u      /* the fixed part */
#define _PP_CKPT_NAME 48        /* model name field */
#define _PP_CKPT_SLOT 16        /* slot name field */
#define _PP_CKPT_LAYER 48u      /* layer table entry */
#define _PP_CKPT_KIND 32        /* its kind name field */
#define _PP_CKPT_BUF 16u        /* buffer table entry */
#define _PP_CKPT_REC 32u        /* record header */
#define _PP_CKPT_REC_MAGIC 0x31434552u
#define _PP_CKPT_MAX_STATE 63
#define _PP_CKPT_MAX_COUNT (1 << 22) /* layers, and buffers of one slot */
#define _PP_CKPT_MAX_BYTES ((uint64_t)1 << 56) /* payload of one slot, and user bytes: no sum overflows */
#define _PP_FNV1A_BASIS 0xcbf29ce484222325ull

static void _pp_put32(unsigned char* p, uint32_t v) {
    int i;
    for (i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void _pp_put64(unsigned char* p, uint64_t v) {
    int i;
    for (i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t _pp_get32(const unsigned char* p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t _pp_get64(const unsigned char* p) { return (uint64_t)_pp_get32(p) | (uint64_t)_pp_get32(p + 4) << 32; }
static uint64_t _pp_fnv1a(uint64_t h, const void* data, size_t n) {
    const unsigned char* p = (const unsigned char*)data;
    size_t i;
    for (i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}
static uint64_t _pp_pad8(uint64_t n) { return (n + 7) & ~(uint64_t)7; }
static uint32_t _pp_byte_order(void) {
    const uint16_t one = 1;
    return *(const unsigned char*)&one ? 1u : 2u;
}
/* A name into a NUL-padded field of n bytes (n - 1 kept). */
static void _pp_ckpt_name(char* field, size_t n, const char* s) {
    size_t k = 0;
    memset(field, 0, n);
    while (s && s[k] && k + 1 < n) {
        field[k] = s[k];
        k++;
    }
}

/* What a save or a load derives from the desc: every slot's buffers of every layer, and where
   each layer's records lie. */
typedef struct _pp_ckpt {
    const pp_ckpt_desc* d;
    int L, S, B;                /* layers, slots of the desc (1 + states), buffers of one slot */
    int file_S;                 /* slots in the file (the layout's; S when saving) */
    int* first;                 /* L + 1: layer l's buffers are [first[l], first[l + 1]) */
    pp_param* buf;              /* S * B: slot s's buffer b at buf[s * B + b] */
    uint64_t* bytes;            /* L: one slot's payload bytes of layer l */
    uint64_t* rec;              /* L + 1: offset of layer l's first record; rec[L] the file's end */
    char name[_PP_CKPT_NAME];   /* the model's name as stored */
    char slot[_PP_CKPT_MAX_STATE + 1][_PP_CKPT_SLOT];
    uint64_t head, user_bytes, file_bytes, max_bytes;
    void* mem;                  /* one block behind first, buf, bytes and rec */
    int* shard;                 /* B: buffer b's entry of d->shards, -1: whole on every rank (or NULL) */
    uint64_t max_buf;           /* the largest sharded buffer's bytes (whole) */
    int tp_k, tp_n;             /* this rank's place in d->tp, and its size (1: no TP) */
    int tp_ranks[PP_MAX_RANKS];
    int32_t* tp_last;           /* a TP rank other than the first: the first's last word, once it came
                                   (_pp_ckpt_ask; _PP_CKPT_SEND until then), or NULL */
} _pp_ckpt;

static int _pp_ckpt_owns(const _pp_ckpt* c, int l) { return !c->d->own || c->d->own[l]; }
static const void* _pp_ckpt_slot_struct(const _pp_ckpt* c, int s) { return s ? c->d->state[s - 1] : c->d->weights; }
static const char* _pp_ckpt_lname(const _pp_ckpt* c, int l) { return pp_model_layer_name(&c->d->model, l); }
static uint64_t _pp_ckpt_rec_bytes(const _pp_ckpt* c, int l) { return _PP_CKPT_REC + _pp_pad8(c->bytes[l]); }

/* Sharded buffer b's slice on TP rank k: units [*start, *start + *units), in elements *elems; *unit
   elements a unit (ROWS: cols; COLS: rows, one per row; FLAT: 1). */
static void _pp_ckpt_slice(const pp_ckpt_shard* sh, int k, int n, int64_t* start, int64_t* units, int64_t* elems) {
    int64_t N = sh->axis == PP_SHARD_ROWS ? sh->count / sh->cols : sh->axis == PP_SHARD_COLS ? sh->cols : sh->count;
    int64_t chunk = (N + n - 1) / n, a = (int64_t)k * chunk < N ? (int64_t)k * chunk : N;
    int64_t e = a + chunk < N ? a + chunk : N;
    *start = a;
    *units = e - a;
    *elems = sh->axis == PP_SHARD_FLAT ? e - a : sh->axis == PP_SHARD_ROWS ? (e - a) * sh->cols : (e - a) * (sh->count / sh->cols);
#ifdef PP_TEST_CKPT_TP_ORDER /* negative control (build/ckpt-controls): the slices laid out in reverse rank order */
    *start = N - e;
#endif
}

/* A slice (host memory, es bytes an element) into or out of the whole buffer w (out: 1 from w). */
static void _pp_ckpt_place(const pp_ckpt_shard* sh, int k, int n, size_t es, unsigned char* w, unsigned char* slice,
                           int out) {
    int64_t start, units, elems, r, rows;
    _pp_ckpt_slice(sh, k, n, &start, &units, &elems);
    if (sh->axis != PP_SHARD_COLS) {
        size_t at = (size_t)start * (sh->axis == PP_SHARD_ROWS ? (size_t)sh->cols : 1) * es;
        if (elems) memcpy(out ? slice : w + at, out ? w + at : slice, (size_t)elems * es);
        return;
    }
    rows = sh->count / sh->cols;
    for (r = 0; r < rows && units; r++) {
        unsigned char* row = w + ((size_t)r * (size_t)sh->cols + (size_t)start) * es;
        unsigned char* part = slice + (size_t)r * (size_t)units * es;
        memcpy(out ? part : row, out ? row : part, (size_t)units * es);
    }
}

/* d->tp and d->shards checked into c (after c->first): every entry names one buffer, once. */
static pp_result _pp_ckpt_prepare_tp(_pp_ckpt* c, const pp_ckpt_desc* d, pp_error* err) {
    int all[PP_MAX_RANKS], n = 1, i, k;
    const int* ranks = NULL;
    pp_result rc;
    c->tp_k = 0;
    c->tp_n = 1;
    if (d->n_shards < 0 || (d->n_shards > 0 && !d->shards))
        return _pp_fail(err, PP_ERR_INVALID, "checkpoint: n_shards = %d with shards %s", d->n_shards,
                        d->shards ? "set" : "NULL");
    if (d->tp && (rc = _pp_group_resolve(d->tp, all, &ranks, &n, err)) != PP_OK) return rc;
    if (n > 1) {
        if (!d->tp->t->isend || !d->tp->t->irecv || !d->tp->t->wait)
            return _pp_fail(err, PP_ERR_INVALID, "checkpoint: the TP group's transport needs isend/irecv/wait");
        for (k = 0; k < n && ranks[k] != d->tp->t->rank; k++) {
        }
        if (k == n) return _pp_fail(err, PP_ERR_INVALID, "checkpoint: rank %d is not in its TP group", d->tp->t->rank);
        c->tp_k = k;
        c->tp_n = n;
        for (i = 0; i < n; i++) c->tp_ranks[i] = ranks[i];
    }
    if (d->n_shards == 0) return PP_OK;
    if (!(c->shard = (int*)PP_MALLOC(sizeof(int) * ((size_t)c->B + 1))))
        return _pp_fail(err, PP_ERR_NOMEM, "checkpoint: a table of %d buffers", c->B);
    for (i = 0; i < c->B; i++) c->shard[i] = -1;
    for (i = 0; i < d->n_shards; i++) {
        const pp_ckpt_shard* sh = &d->shards[i];
        int nb;
        if (sh->layer < 0 || sh->layer >= c->L)
            return _pp_fail(err, PP_ERR_INVALID, "checkpoint: shards[%d] names layer %d of %d", i, sh->layer, c->L);
        nb = c->first[sh->layer + 1] - c->first[sh->layer];
        if (sh->buffer < 0 || sh->buffer >= nb)
            return _pp_fail(err, PP_ERR_INVALID, "checkpoint: shards[%d] names buffer %d of layer %d (%s), which has %d", i,
                            sh->buffer, sh->layer, _pp_ckpt_lname(c, sh->layer), nb);
        if ((sh->axis != PP_SHARD_FLAT && sh->axis != PP_SHARD_ROWS && sh->axis != PP_SHARD_COLS) || sh->count < 1 ||
            (sh->axis != PP_SHARD_FLAT && (sh->cols < 1 || sh->count % sh->cols != 0)))
            return _pp_fail(err, PP_ERR_INVALID,
                            "checkpoint: shards[%d] (layer %d buffer %d): axis %d, count %lld, cols %lld (FLAT, ROWS or "
                            "COLS; count >= 1, a multiple of cols for ROWS and COLS)",
                            i, sh->layer, sh->buffer, (int)sh->axis, (long long)sh->count, (long long)sh->cols);
        if (c->shard[c->first[sh->layer] + sh->buffer] >= 0)
            return _pp_fail(err, PP_ERR_INVALID, "checkpoint: shards[%d] and shards[%d] both name layer %d buffer %d",
                            c->shard[c->first[sh->layer] + sh->buffer], i, sh->layer, sh->buffer);
        c->shard[c->first[sh->layer] + sh->buffer] = i;
    }
    return PP_OK;
}


/* Checks the desc and asks the params hook for every slot's buffers of every layer. need_data:
   the layers this call owns must have their data (a save or a load; not a size). */
static pp_result _pp_ckpt_prepare(_pp_ckpt* c, const pp_ckpt_desc* d, int need_data, pp_error* err) {
    const pp_model* m;
    const char* mname;
    size_t off_buf, off_first, total;
    uint64_t sum = 0;
    pp_result rc;
    int l, s, k, b;
    memset(c, 0, sizeof *c);
    c->d = d;
    if (!d) return _pp_fail(err, PP_ERR_INVALID, "checkpoint desc is NULL");
    m = &d->model;
    if ((rc = pp_model_check(m, err)) != PP_OK) return rc;
    mname = m->name ? m->name : "?";
    if (!m->params)
        return _pp_fail(err, PP_ERR_INVALID,
                        "model '%s' has no params hook: set pp_model.params (PP_MODEL_PARAMS makes one) to name each "
                        "layer's parameter buffers",
                        mname);
    if (!d->weights) return _pp_fail(err, PP_ERR_INVALID, "checkpoint of '%s': weights is NULL", mname);
    if (d->n_state < 0 || d->n_state > _PP_CKPT_MAX_STATE || (d->n_state > 0 && !d->state))
        return _pp_fail(err, PP_ERR_INVALID, "checkpoint of '%s': n_state = %d with state %s (0 .. %d states)", mname,
                        d->n_state, d->state ? "set" : "NULL", _PP_CKPT_MAX_STATE);
    if (d->records_only != 0 && d->records_only != 1)
        return _pp_fail(err, PP_ERR_INVALID, "checkpoint of '%s': records_only = %d (0 or 1)", mname, d->records_only);
    if ((d->user_bytes > 0 && !d->user) || (uint64_t)d->user_bytes > _PP_CKPT_MAX_BYTES)
        return _pp_fail(err, PP_ERR_INVALID, "checkpoint of '%s': user_bytes = %zu with user %s", mname, d->user_bytes,
                        d->user ? "set" : "NULL");
    if (m->n_layers > _PP_CKPT_MAX_COUNT)
        return _pp_fail(err, PP_ERR_INVALID, "checkpoint of '%s': %d layers (at most %d)", mname, m->n_layers,
                        _PP_CKPT_MAX_COUNT);
    _pp_ckpt_name(c->name, sizeof c->name, d->name ? d->name : m->name);
    _pp_ckpt_name(c->slot[0], _PP_CKPT_SLOT, "weights");
    for (s = 1; s <= d->n_state; s++) {
        const char* nm = d->state_names ? d->state_names[s - 1] : NULL;
        char dflt[_PP_CKPT_SLOT];
        size_t len;
        if (!d->state[s - 1])
            return _pp_fail(err, PP_ERR_INVALID, "checkpoint of '%s': state[%d] is NULL", mname, s - 1);
        if (!nm) {
            snprintf(dflt, sizeof dflt, "state%d", s - 1);
            nm = dflt;
        }
        len = strlen(nm);
        if (len < 1 || len >= _PP_CKPT_SLOT)
            return _pp_fail(err, PP_ERR_INVALID, "checkpoint of '%s': state name '%s' has %zu bytes (1 .. %d)", mname, nm,
                            len, _PP_CKPT_SLOT - 1);
        _pp_ckpt_name(c->slot[s], _PP_CKPT_SLOT, nm);
        for (k = 0; k < s; k++)
            if (memcmp(c->slot[k], c->slot[s], _PP_CKPT_SLOT) == 0)
                return _pp_fail(err, PP_ERR_INVALID, "checkpoint of '%s': two slots are named '%s'", mname, nm);
    }
    c->L = m->n_layers;
    c->S = c->file_S = 1 + d->n_state;
    for (l = 0; l < c->L; l++) {
        int n = m->params(m, d->weights, l, NULL, 0);
        if (n < 0)
            return _pp_fail(err, PP_ERR_INVALID, "layer %d (%s): the params hook gave %d (it does not know the layer)", l,
                            _pp_ckpt_lname(c, l), n);
        if (n > _PP_CKPT_MAX_COUNT - c->B)
            return _pp_fail(err, PP_ERR_INVALID, "checkpoint of '%s': more than %d buffers", mname, _PP_CKPT_MAX_COUNT);
        c->B += n;
    }
    /* one block: bytes[L], rec[L + 1], buf[S * B], first[L + 1] */
    off_buf = sizeof(uint64_t) * (2 * (size_t)c->L + 1);
    off_first = off_buf + sizeof(pp_param) * (size_t)c->S * (size_t)c->B;
    total = off_first + sizeof(int) * ((size_t)c->L + 1);
    if (!(c->mem = _pp_calloc(total, 1)))
        return _pp_fail(err, PP_ERR_NOMEM, "checkpoint of '%s': %zu bytes for its tables", mname, total);
    c->bytes = (uint64_t*)c->mem;
    c->rec = c->bytes + c->L;
    c->buf = (pp_param*)((char*)c->mem + off_buf);
    c->first = (int*)(void*)((char*)c->mem + off_first);
    for (l = 0; l < c->L; l++) {
        int n = m->params(m, d->weights, l, NULL, 0);
        if (n < 0 || n > c->B - c->first[l])
            return _pp_fail(err, PP_ERR_INVALID, "layer %d (%s): the params hook gave another buffer count than before", l,
                            _pp_ckpt_lname(c, l));
        c->first[l + 1] = c->first[l] + n;
    }
    if (c->first[c->L] != c->B)
        return _pp_fail(err, PP_ERR_INVALID, "checkpoint of '%s': the params hook gave another buffer count than before",
                        mname);
    if ((rc = _pp_ckpt_prepare_tp(c, d, err)) != PP_OK) return rc;
    for (s = 0; s < c->S; s++) {
        const char* sname = c->slot[s];
        for (l = 0; l < c->L; l++) {
            int n = c->first[l + 1] - c->first[l];
            pp_param* p = c->buf + (size_t)s * c->B + c->first[l];
            int got = n ? m->params(m, _pp_ckpt_slot_struct(c, s), l, p, n) : m->params(m, _pp_ckpt_slot_struct(c, s), l, NULL, 0);
            if (got != n)
                return _pp_fail(err, PP_ERR_INVALID, "layer %d (%s): the params hook gave %d buffers for %s, %d for the weights",
                                l, _pp_ckpt_lname(c, l), got, sname, n);
            for (b = 0; b < n; b++) {
                const pp_param* w0 = c->buf + c->first[l] + b;
                size_t es = pp_dtype_size(p[b].dtype);
                int64_t have = p[b].count; /* this rank's elements (a slice's) */
                if (c->shard && c->shard[c->first[l] + b] >= 0) {
                    const pp_ckpt_shard* sh = &d->shards[c->shard[c->first[l] + b]];
                    int64_t st0, un, want;
                    _pp_ckpt_slice(sh, c->tp_k, c->tp_n, &st0, &un, &want);
                    if (p[b].count != want)
                        return _pp_fail(err, PP_ERR_SIZE,
                                        "layer %d (%s) buffer %d of %s: %lld elements, TP rank %d of %d holds %lld of the "
                                        "%lld of shards[%d] (axis %d)",
                                        l, _pp_ckpt_lname(c, l), b, sname, (long long)p[b].count, c->tp_k, c->tp_n,
                                        (long long)want, (long long)sh->count, c->shard[c->first[l] + b], (int)sh->axis);
                    p[b].count = sh->count; /* the tables and the records hold it whole */
                    if (es && (uint64_t)sh->count * es > c->max_buf) c->max_buf = (uint64_t)sh->count * es;
                }
                if (es == 0 || p[b].count < 0 || (double)p[b].count * (double)es >= _PP_MAX_TENSOR_BYTES)
                    return _pp_fail(err, PP_ERR_INVALID, "layer %d (%s) buffer %d of %s: %lld elements of dtype %d", l,
                                    _pp_ckpt_lname(c, l), b, sname, (long long)p[b].count, (int)p[b].dtype);
                if (s > 0 && (p[b].count != w0->count || p[b].dtype != w0->dtype))
                    return _pp_fail(err, PP_ERR_INVALID,
                                    "layer %d (%s) buffer %d: %s has %lld %s, the weights %lld %s (a state is bound like "
                                    "the weights)",
                                    l, _pp_ckpt_lname(c, l), b, sname, (long long)p[b].count, pp_dtype_name(p[b].dtype),
                                    (long long)w0->count, pp_dtype_name(w0->dtype));
                if (need_data && _pp_ckpt_owns(c, l) && have > 0 && !p[b].data)
                    return _pp_fail(err, PP_ERR_INVALID,
                                    "layer %d (%s) buffer %d of %s has no data, and this call saves or loads the layer "
                                    "(own)",
                                    l, _pp_ckpt_lname(c, l), b, sname);
                if (s == 0) c->bytes[l] += (uint64_t)p[b].count * es;
            }
            if (s == 0) {
                if (c->bytes[l] > (uint64_t)(size_t)-1 - 64 || c->bytes[l] > _PP_CKPT_MAX_BYTES - sum)
                    return _pp_fail(err, PP_ERR_INVALID, "layer %d (%s): %llu bytes of parameters", l, _pp_ckpt_lname(c, l),
                                    (unsigned long long)c->bytes[l]);
                sum += c->bytes[l];
                if (c->bytes[l] > c->max_bytes) c->max_bytes = c->bytes[l];
            }
        }
    }
    c->head = _PP_CKPT_HEAD + (uint64_t)_PP_CKPT_SLOT * c->S + (uint64_t)_PP_CKPT_LAYER * c->L + (uint64_t)_PP_CKPT_BUF * c->B;
    return PP_OK;
}

/* Where the records lie, for a file of file_S slots and user_bytes user bytes after the header. */
static void _pp_ckpt_layout(_pp_ckpt* c, uint64_t head, int file_S, uint64_t user_bytes) {
    uint64_t off = head + _pp_pad8(user_bytes);
    int l;
    c->file_S = file_S;
    c->user_bytes = user_bytes;
    for (l = 0; l < c->L; l++) {
        c->rec[l] = off;
        off += (uint64_t)file_S * _pp_ckpt_rec_bytes(c, l);
    }
    c->rec[c->L] = c->file_bytes = off;
}

static void _pp_ckpt_free(_pp_ckpt* c) {
    PP_FREE(c->mem);
    PP_FREE(c->shard);
    c->mem = NULL;
    c->shard = NULL;
}

/* The header's c->head bytes into h (zeroed by the caller). */
static void _pp_ckpt_encode(const _pp_ckpt* c, unsigned char* h) {
    unsigned char* lt = h + _PP_CKPT_HEAD + (size_t)_PP_CKPT_SLOT * c->S;
    unsigned char* bt = lt + (size_t)_PP_CKPT_LAYER * c->L;
    int s, l, b;
    memcpy(h, _pp_ckpt_magic, sizeof _pp_ckpt_magic);
    _pp_put32(h + 8, _PP_CKPT_VERSION);
    _pp_put32(h + 12, _pp_byte_order());
    _pp_put64(h + 16, c->head);
    _pp_put64(h + 24, c->file_bytes);
    _pp_put32(h + 32, (uint32_t)c->L);
    _pp_put32(h + 36, (uint32_t)c->S);
    _pp_put32(h + 40, (uint32_t)c->B);
    _pp_put64(h + 48, (uint64_t)c->d->step);
    _pp_put64(h + 56, c->user_bytes);
    _pp_put64(h + 64, _pp_fnv1a(_PP_FNV1A_BASIS, c->d->user, c->user_bytes));
    memcpy(h + 80, c->name, _PP_CKPT_NAME);
    for (s = 0; s < c->S; s++) memcpy(h + _PP_CKPT_HEAD + (size_t)_PP_CKPT_SLOT * s, c->slot[s], _PP_CKPT_SLOT);
    for (l = 0; l < c->L; l++) {
        unsigned char* e = lt + (size_t)_PP_CKPT_LAYER * l;
        _pp_ckpt_name((char*)e, _PP_CKPT_KIND, _pp_ckpt_lname(c, l));
        _pp_put32(e + 32, (uint32_t)c->first[l]);
        _pp_put32(e + 36, (uint32_t)(c->first[l + 1] - c->first[l]));
        _pp_put64(e + 40, c->bytes[l]);
    }
    for (b = 0; b < c->B; b++) {
        _pp_put32(bt + (size_t)_PP_CKPT_BUF * b, (uint32_t)c->buf[b].dtype);
        _pp_put64(bt + (size_t)_PP_CKPT_BUF * b + 8, (uint64_t)c->buf[b].count);
    }
    _pp_put64(h + 72, _pp_fnv1a(_PP_FNV1A_BASIS, h, (size_t)c->head));
}

/* A record's first 24 bytes into r; returns the checksum of them. */
static uint64_t _pp_ckpt_rec_head(unsigned char* r, int l, int s, int n, uint64_t bytes) {
    _pp_put32(r, _PP_CKPT_REC_MAGIC);
    _pp_put32(r + 4, (uint32_t)l);
    _pp_put32(r + 8, (uint32_t)s);
    _pp_put32(r + 12, (uint32_t)n);
    _pp_put64(r + 16, bytes);
    return _pp_fnv1a(_PP_FNV1A_BASIS, r, 24);
}

static pp_result _pp_ckpt_write(const pp_ckpt_io* io, uint64_t off, const void* p, size_t n, const char* what, int l,
                                const char* lname, pp_error* err) {
    size_t got = n ? io->write(io->ctx, off, p, n) : 0;
    if (got == n) return PP_OK;
    if (l >= 0)
        return _pp_fail(err, PP_ERR_IO, "writing layer %d (%s) %s: %zu of %zu bytes at offset %llu", l, lname, what, got, n,
                        (unsigned long long)off);
    return _pp_fail(err, PP_ERR_IO, "writing the %s: %zu of %zu bytes at offset %llu", what, got, n, (unsigned long long)off);
}

pp_result pp_ckpt_size(const pp_ckpt_desc* d, uint64_t* bytes, pp_error* err) {
    _pp_ckpt c;
    pp_result rc = _pp_ckpt_prepare(&c, d, 0, err);
    if (rc == PP_OK) {
        _pp_ckpt_layout(&c, c.head, c.S, d->user_bytes);
        if (bytes) *bytes = c.file_bytes;
    }
    _pp_ckpt_free(&c);
    return rc;
}

/* Layer l has a buffer split over the TP group (a save gathers it). */
static int _pp_ckpt_layer_sharded(const _pp_ckpt* c, int l) {
    int b;
    if (!c->shard || c->tp_n < 2) return 0;
    for (b = c->first[l]; b < c->first[l + 1]; b++)
        if (c->shard[b] >= 0) return 1;
    return 0;
}

/* A TP rank other than the first: the first rank's next word (_PP_TAG_CKPT_OUT), within the TP
   group's deadline. A slice goes to the first rank only when it asks for it (_PP_CKPT_SEND); any
   other word is the save's outcome, its last word (c->tp_last). So a save the first rank gives up
   (it cannot create its file, a write fails) leaves no slice queued on the TP transport, where
   the next save would read it as its own: it sends its outcome instead of the next request.
   Before (PP_TEST_CKPT_PUSH, build/ckpt-controls), every slice was sent unasked, under one tag. */
static pp_result _pp_ckpt_word(const pp_group* g, int32_t* word, pp_error* err) {
    const pp_transport* t = g->t;
    pp_request rq;
    pp_result rc;
    *word = (int32_t)PP_ERR_TIMEOUT;
    if ((rc = t->irecv(t->self, g->ranks ? g->ranks[0] : 0, _PP_TAG_CKPT_OUT, word, sizeof *word, &rq)) != PP_OK)
        return rc;
    return t->wait(t->self, &rq, g->timeout_s, err);
}
#ifndef PP_TEST_CKPT_PUSH
static pp_result _pp_ckpt_ask(_pp_ckpt* c, int l, pp_error* err) {
    int32_t word;
    pp_error e;
    pp_result rc;
    e.msg[0] = 0;
    if ((rc = _pp_ckpt_word(c->d->tp, &word, &e)) != PP_OK)
        return _pp_fail(err, rc, "checkpoint: TP rank %d waiting for TP rank 0 (rank %d) to ask for layer %d's slice: %s",
                        c->tp_k, c->tp_ranks[0], l, e.msg);
    if (word == _PP_CKPT_SEND) return PP_OK;
    if (c->tp_last) *c->tp_last = word;
    if (word == (int32_t)PP_OK)
        return _pp_fail(err, PP_ERR_INVALID, "checkpoint: TP rank 0 (rank %d) finished the save without layer %d's slice "
                        "of TP rank %d: the ranks' descs differ", c->tp_ranks[0], l, c->tp_k);
    return _pp_fail(err, (pp_result)word, "checkpoint: the save failed on TP rank 0 (rank %d), which writes the file: %s",
                    c->tp_ranks[0], pp_result_str((pp_result)word));
}
#endif

/* Slot s of layer l, whole, into w (host, c->bytes[l]): on TP rank 0 its own buffers and every
   other TP rank's slices (asked for and received in rank order, into tmp); on the others, only
   their slices sent to TP rank 0 as it asks (through tmp where d->copy is set). */
static pp_result _pp_ckpt_gather(_pp_ckpt* c, int l, int s, unsigned char* w, unsigned char* tmp, pp_error* err) {
    const pp_ckpt_desc* d = c->d;
    const pp_transport* t = d->tp->t;
    const pp_param* p = c->buf + (size_t)s * c->B + c->first[l];
    double to = d->tp->timeout_s;
    size_t at = 0, nb;
    pp_request rq;
    pp_result rc;
    int b, j, n = c->first[l + 1] - c->first[l];
    for (b = 0; b < n; b++, at += nb) {
        size_t es = pp_dtype_size(p[b].dtype);
        int sh = c->shard[c->first[l] + b];
        nb = (size_t)p[b].count * es;
        if (sh < 0) { /* whole on every rank: TP rank 0's copy */
            if (c->tp_k == 0 && nb) {
                if (!d->copy) memcpy(w + at, p[b].data, nb);
                else if (d->copy(d->copy_user, w + at, p[b].data, nb) != 0)
                    return _pp_fail(err, PP_ERR_IO, "layer %d (%s) buffer %d of %s: the copy hook failed", l,
                                    _pp_ckpt_lname(c, l), b, c->slot[s]);
            }
            continue;
        }
        for (j = 0; j < c->tp_n; j++) {
            int64_t st0, un, el;
            size_t sb;
            const unsigned char* src = tmp;
            _pp_ckpt_slice(&d->shards[sh], j, c->tp_n, &st0, &un, &el);
            sb = (size_t)el * es;
            if (j != c->tp_k && c->tp_k != 0) continue; /* a rank other than 0 sends its own slice alone */
            if (j == c->tp_k && sb) { /* this rank's slice, staged to the host where it lives elsewhere */
                if (!d->copy) src = (const unsigned char*)p[b].data;
                else if (d->copy(d->copy_user, tmp, p[b].data, sb) != 0)
                    return _pp_fail(err, PP_ERR_IO, "layer %d (%s) buffer %d of %s: the copy hook failed", l,
                                    _pp_ckpt_lname(c, l), b, c->slot[s]);
            }
            if (c->tp_k != 0) {
                if (!sb) continue;
#ifndef PP_TEST_CKPT_PUSH
                if ((rc = _pp_ckpt_ask(c, l, err)) != PP_OK) return rc;
#endif
                if ((rc = t->isend(t->self, c->tp_ranks[0], _PP_TAG_CKPT_TP, src, sb, &rq)) != PP_OK ||
                    (rc = t->wait(t->self, &rq, to, err)) != PP_OK)
                    return _pp_fail(err, rc, "checkpoint: TP rank %d sending layer %d (%s) buffer %d of %s to TP rank 0 "
                                    "(rank %d)", c->tp_k, l, _pp_ckpt_lname(c, l), b, c->slot[s], c->tp_ranks[0]);
                continue;
            }
#ifndef PP_TEST_CKPT_PUSH
            if (j != 0 && sb) {
                int32_t ask = _PP_CKPT_SEND;
                if ((rc = t->isend(t->self, c->tp_ranks[j], _PP_TAG_CKPT_OUT, &ask, sizeof ask, &rq)) != PP_OK ||
                    (rc = t->wait(t->self, &rq, to, err)) != PP_OK)
                    return _pp_fail(err, rc, "checkpoint: TP rank 0 asking TP rank %d (rank %d) for layer %d (%s) buffer %d of %s",
                                    j, c->tp_ranks[j], l, _pp_ckpt_lname(c, l), b, c->slot[s]);
            }
#endif
            if (j != 0 && sb &&
                ((rc = t->irecv(t->self, c->tp_ranks[j], _PP_TAG_CKPT_TP, tmp, sb, &rq)) != PP_OK ||
                 (rc = t->wait(t->self, &rq, to, err)) != PP_OK))
                return _pp_fail(err, rc, "checkpoint: TP rank 0 receiving layer %d (%s) buffer %d of %s from TP rank %d "
                                "(rank %d)", l, _pp_ckpt_lname(c, l), b, c->slot[s], j, c->tp_ranks[j]);
            if (sb) _pp_ckpt_place(&d->shards[sh], j, c->tp_n, es, w + at, (unsigned char*)(uintptr_t)src, 0);
        }
    }
    return PP_OK;
}

/* last: where a TP rank other than the first keeps the first's last word should it come during
   the save (_pp_ckpt_ask; _pp_ckpt_tp_outcome then waits for no other) */
static pp_result _pp_ckpt_save_io(const pp_ckpt_desc* d, const pp_ckpt_io* io, int32_t* last, pp_error* err) {
    static const unsigned char zeros[8] = {0};
    _pp_ckpt c;
    unsigned char *head = NULL, *stage = NULL, *tmp = NULL, r[_PP_CKPT_REC];
    pp_result rc;
    int l, s, b, writer;
    if ((rc = _pp_ckpt_prepare(&c, d, 1, err)) != PP_OK) goto cleanup;
    c.tp_last = last;
    writer = c.tp_k == 0; /* with tp, its first rank alone writes */
    if (writer && (!io || !io->write)) {
        rc = _pp_fail(err, PP_ERR_INVALID, "checkpoint save: io or its write is NULL");
        goto cleanup;
    }
    _pp_ckpt_layout(&c, c.head, c.S, d->user_bytes);
    if (writer && !d->records_only) {
        if (!(head = (unsigned char*)_pp_calloc((size_t)c.head, 1))) {
            rc = _pp_fail(err, PP_ERR_NOMEM, "checkpoint save: %llu bytes for the header", (unsigned long long)c.head);
            goto cleanup;
        }
        _pp_ckpt_encode(&c, head);
        if ((rc = _pp_ckpt_write(io, 0, head, (size_t)c.head, "header", -1, NULL, err)) != PP_OK ||
            (rc = _pp_ckpt_write(io, c.head, d->user, d->user_bytes, "user bytes", -1, NULL, err)) != PP_OK ||
            (rc = _pp_ckpt_write(io, c.head + d->user_bytes, zeros, (size_t)(_pp_pad8(d->user_bytes) - d->user_bytes),
                                 "user bytes' padding", -1, NULL, err)) != PP_OK)
            goto cleanup;
    }
    if ((d->copy || (c.shard && c.tp_n > 1)) && !(stage = (unsigned char*)_pp_calloc((size_t)c.max_bytes + 1, 1))) {
        rc = _pp_fail(err, PP_ERR_NOMEM, "checkpoint save: %llu bytes to stage a layer", (unsigned long long)c.max_bytes);
        goto cleanup;
    }
    if (c.shard && c.tp_n > 1 && !(tmp = (unsigned char*)_pp_calloc((size_t)c.max_buf + 1, 1))) {
        rc = _pp_fail(err, PP_ERR_NOMEM, "checkpoint save: %llu bytes to stage a slice", (unsigned long long)c.max_buf);
        goto cleanup;
    }
    for (l = 0; l < c.L; l++) {
        int n = c.first[l + 1] - c.first[l], gathered = _pp_ckpt_layer_sharded(&c, l);
        if (!_pp_ckpt_owns(&c, l) || (!writer && !gathered)) continue;
        for (s = 0; s < c.S; s++) {
            const pp_param* p = c.buf + (size_t)s * c.B + c.first[l];
            uint64_t off = c.rec[l] + (uint64_t)s * _pp_ckpt_rec_bytes(&c, l), h;
            unsigned char* st = gathered || d->copy ? stage : NULL; /* the record's bytes from there */
            size_t at = 0, nb;
            if (gathered && (rc = _pp_ckpt_gather(&c, l, s, stage, tmp, err)) != PP_OK) goto cleanup;
            if (!writer) continue;
            h = _pp_ckpt_rec_head(r, l, s, n, c.bytes[l]);
            for (b = 0; b < n; b++, at += nb) {
                nb = (size_t)p[b].count * pp_dtype_size(p[b].dtype);
                if (st && !gathered && nb && d->copy(d->copy_user, st + at, p[b].data, nb) != 0) {
                    rc = _pp_fail(err, PP_ERR_IO, "layer %d (%s) buffer %d of %s: the copy hook failed", l,
                                  _pp_ckpt_lname(&c, l), b, c.slot[s]);
                    goto cleanup;
                }
                if (nb) h = _pp_fnv1a(h, st ? st + at : (const unsigned char*)p[b].data, nb);
            }
            _pp_put64(r + 24, h);
            if ((rc = _pp_ckpt_write(io, off, r, sizeof r, c.slot[s], l, _pp_ckpt_lname(&c, l), err)) != PP_OK) goto cleanup;
            off += sizeof r;
            for (at = 0, b = 0; b < n; b++, at += nb) {
                nb = (size_t)p[b].count * pp_dtype_size(p[b].dtype);
                if ((rc = _pp_ckpt_write(io, off + at, st ? st + at : (const unsigned char*)p[b].data, nb, c.slot[s], l,
                                         _pp_ckpt_lname(&c, l), err)) != PP_OK)
                    goto cleanup;
            }
            if ((rc = _pp_ckpt_write(io, off + at, zeros, (size_t)(_pp_pad8(at) - at), c.slot[s], l, _pp_ckpt_lname(&c, l),
                                     err)) != PP_OK)
                goto cleanup;
        }
    }
cleanup:
    PP_FREE(head);
    PP_FREE(stage);
    PP_FREE(tmp);
    _pp_ckpt_free(&c);
    return rc;
}

/* Reads [off, off + n) or says the data ends there (avail: the known length, or UINT64_MAX). */
static pp_result _pp_ckpt_read(const pp_ckpt_io* io, uint64_t off, void* p, size_t n, const char* what, pp_error* err) {
    size_t got = n ? io->read(io->ctx, off, p, n) : 0;
    if (got == n) return PP_OK;
    return _pp_fail(err, PP_ERR_CORRUPT, "truncated: %s: %zu of %zu bytes at offset %llu", what, got, n,
                    (unsigned long long)off);
}

/* Reads and checks the header (magic, version, byte order, sizes, checksum): *out (the caller
   frees it) and info. avail: the data's length where known, else UINT64_MAX. */
static pp_result _pp_ckpt_read_head(const pp_ckpt_io* io, uint64_t avail, unsigned char** out, pp_ckpt_info* info,
                                    pp_error* err) {
    unsigned char fixed[_PP_CKPT_HEAD], *h;
    uint64_t H, want, sum;
    uint32_t L, S, B, v, order;
    pp_result rc;
    *out = NULL;
    if (!io || !io->read) return _pp_fail(err, PP_ERR_INVALID, "checkpoint load: io or its read is NULL");
    if ((rc = _pp_ckpt_read(io, 0, fixed, sizeof fixed, "the header", err)) != PP_OK) return rc;
    if (memcmp(fixed, _pp_ckpt_magic, sizeof _pp_ckpt_magic) != 0)
        return _pp_fail(err, PP_ERR_CORRUPT, "not a pipeline.h checkpoint (its first 8 bytes are not \"PPCKPT\\r\\n\")");
    v = _pp_get32(fixed + 8);
    order = _pp_get32(fixed + 12);
    if (v != _PP_CKPT_VERSION)
        return _pp_fail(err, v > _PP_CKPT_VERSION ? PP_ERR_UNSUPPORTED : PP_ERR_CORRUPT,
                        "checkpoint version %u: this library reads version %u", v, _PP_CKPT_VERSION);
    if (order != _pp_byte_order())
        return _pp_fail(err, order == 1 || order == 2 ? PP_ERR_UNSUPPORTED : PP_ERR_CORRUPT,
                        "checkpoint payload byte order %u (1 little-endian, 2 big-endian), this machine's is %u", order,
                        _pp_byte_order());
    H = _pp_get64(fixed + 16);
    L = _pp_get32(fixed + 32);
    S = _pp_get32(fixed + 36);
    B = _pp_get32(fixed + 40);
    want = _PP_CKPT_HEAD + (uint64_t)_PP_CKPT_SLOT * S + (uint64_t)_PP_CKPT_LAYER * L + (uint64_t)_PP_CKPT_BUF * B;
    if (L < 1 || L > _PP_CKPT_MAX_COUNT || S < 1 || S > _PP_CKPT_MAX_STATE + 1 || B > _PP_CKPT_MAX_COUNT || H != want ||
        fixed[80 + _PP_CKPT_NAME - 1] != 0 || _pp_get64(fixed + 56) > _PP_CKPT_MAX_BYTES)
        return _pp_fail(err, PP_ERR_CORRUPT, "checkpoint header: %u layers, %u slots, %u buffers in %llu header bytes",
                        L, S, B, (unsigned long long)H);
    if (avail < H)
        return _pp_fail(err, PP_ERR_CORRUPT, "truncated: %llu bytes, the header alone has %llu", (unsigned long long)avail,
                        (unsigned long long)H);
    if (!(h = (unsigned char*)_pp_calloc((size_t)H, 1)))
        return _pp_fail(err, PP_ERR_NOMEM, "checkpoint load: %llu bytes for the header", (unsigned long long)H);
    memcpy(h, fixed, sizeof fixed);
    if ((rc = _pp_ckpt_read(io, sizeof fixed, h + sizeof fixed, (size_t)(H - sizeof fixed), "the header's tables", err)) !=
        PP_OK) {
        PP_FREE(h);
        return rc;
    }
    sum = _pp_get64(h + 72);
    memset(h + 72, 0, 8);
#ifndef PP_TEST_NO_CKPT_CHECKSUM /* the negative control of tests/test_ckpt.c */
    if (_pp_fnv1a(_PP_FNV1A_BASIS, h, (size_t)H) != sum) {
        PP_FREE(h);
        return _pp_fail(err, PP_ERR_CORRUPT, "the checkpoint's header does not match its checksum (%016llx)",
                        (unsigned long long)sum);
    }
#endif
    _pp_put64(h + 72, sum);
    if (info) {
        memset(info, 0, sizeof *info);
        info->version = v;
        info->n_layers = (int)L;
        info->n_state = (int)S - 1;
        info->step = (int64_t)_pp_get64(h + 48);
        info->file_bytes = _pp_get64(h + 24);
        info->user_bytes = _pp_get64(h + 56);
        memcpy(info->name, h + 80, sizeof info->name);
    }
    *out = h;
    return PP_OK;
}

pp_result pp_ckpt_read_info(const pp_ckpt_io* io, pp_ckpt_info* info, pp_error* err) {
    unsigned char* h = NULL;
    pp_result rc = _pp_ckpt_read_head(io, UINT64_MAX, &h, info, err);
    PP_FREE(h);
    return rc;
}

/* The file's tables against the model's (every layer): the name, layers, kinds, buffers. */
static pp_result _pp_ckpt_match(const _pp_ckpt* c, const unsigned char* h, const pp_ckpt_info* fi, int* slot_of,
                                pp_error* err) {
    const int fS = fi->n_state + 1;
    const unsigned char* lt = h + _PP_CKPT_HEAD + (size_t)_PP_CKPT_SLOT * fS;
    const unsigned char* bt = lt + (size_t)_PP_CKPT_LAYER * fi->n_layers;
    const uint64_t fB = _pp_get32(h + 40);
    int l, b, s, j;
    if (memcmp(h + 80, c->name, _PP_CKPT_NAME) != 0)
        return _pp_fail(err, PP_ERR_INVALID, "the checkpoint holds model '%s', this is '%s' (pp_ckpt_desc.name sets the name)",
                        fi->name, c->name);
    if (fi->n_layers != c->L)
        return _pp_fail(err, PP_ERR_SIZE, "the checkpoint of '%s' has %d layers, this model %d", c->name, fi->n_layers, c->L);
    for (l = 0; l < c->L; l++) {
        const unsigned char* e = lt + (size_t)_PP_CKPT_LAYER * l;
        char kind[_PP_CKPT_KIND];
        uint32_t fn = _pp_get32(e + 36), ff = _pp_get32(e + 32);
        int n = c->first[l + 1] - c->first[l];
        _pp_ckpt_name(kind, sizeof kind, _pp_ckpt_lname(c, l));
        if (e[_PP_CKPT_KIND - 1] != 0 || memcmp(e, kind, _PP_CKPT_KIND) != 0)
            return _pp_fail(err, PP_ERR_INVALID, "layer %d is '%.31s' in the checkpoint, '%s' in the model", l,
                            (const char*)e, kind);
        if (fn != (uint32_t)n)
            return _pp_fail(err, PP_ERR_SIZE, "layer %d (%s): %u parameter buffers in the checkpoint, %d in the model", l,
                            kind, fn, n);
        if (ff != (uint32_t)c->first[l] || (uint64_t)c->first[l] + (uint64_t)n > fB)
            return _pp_fail(err, PP_ERR_CORRUPT, "layer %d (%s): the checkpoint's layer table disagrees with its buffers", l,
                            kind);
        for (b = 0; b < n; b++) {
            const unsigned char* f = bt + (size_t)_PP_CKPT_BUF * (size_t)(c->first[l] + b);
            const pp_param* p = c->buf + c->first[l] + b;
            uint32_t dt = _pp_get32(f);
            int64_t count = (int64_t)_pp_get64(f + 8);
            if (dt != (uint32_t)p->dtype || count != p->count)
                return _pp_fail(err, PP_ERR_SIZE, "layer %d (%s) buffer %d: %lld %s in the checkpoint, %lld %s in the model",
                                l, kind, b, (long long)count, dt < (uint32_t)PP_DTYPE_COUNT ? pp_dtype_name((pp_dtype)dt) : "?",
                                (long long)p->count, pp_dtype_name(p->dtype));
        }
        if (_pp_get64(e + 40) != c->bytes[l])
            return _pp_fail(err, PP_ERR_CORRUPT, "layer %d (%s): the checkpoint's layer table disagrees with its buffers", l,
                            kind);
    }
    if (fB != (uint64_t)c->B) return _pp_fail(err, PP_ERR_CORRUPT, "the checkpoint's tables disagree on the buffer count");
    if (memcmp(h + _PP_CKPT_HEAD, c->slot[0], _PP_CKPT_SLOT) != 0)
        return _pp_fail(err, PP_ERR_CORRUPT, "the checkpoint's first slot is not \"weights\"");
    for (s = 0; s < c->S; s++) {
        for (j = 0; j < fS && memcmp(h + _PP_CKPT_HEAD + (size_t)_PP_CKPT_SLOT * j, c->slot[s], _PP_CKPT_SLOT) != 0;
             j++) {
        }
        if (j == fS) {
            char have[256];
            size_t k = 0;
            have[0] = 0;
            for (j = 0; j < fS && k + _PP_CKPT_SLOT + 3 < sizeof have; j++)
                k += (size_t)snprintf(have + k, sizeof have - k, "%s%.15s", j ? ", " : "",
                                      (const char*)h + _PP_CKPT_HEAD + (size_t)_PP_CKPT_SLOT * j);
            return _pp_fail(err, PP_ERR_INVALID, "the checkpoint of '%s' has no state '%s' (it holds: %s)", c->name, c->slot[s],
                            have);
        }
        slot_of[s] = j;
    }
    return PP_OK;
}

static pp_result _pp_ckpt_load(const pp_ckpt_desc* d, const pp_ckpt_io* io, uint64_t avail, pp_ckpt_info* info,
                               pp_error* err) {
    _pp_ckpt c;
    pp_ckpt_info fi;
    unsigned char *h = NULL, *scratch = NULL, *slice = NULL, *q;
    int slot_of[_PP_CKPT_MAX_STATE + 1];
    uint64_t need = 0, fbytes;
    pp_result rc;
    int l, s, b;
    if ((rc = _pp_ckpt_prepare(&c, d, 1, err)) != PP_OK) goto cleanup;
    if ((rc = _pp_ckpt_read_head(io, avail, &h, &fi, err)) != PP_OK) goto cleanup;
    if ((rc = _pp_ckpt_match(&c, h, &fi, slot_of, err)) != PP_OK) goto cleanup;
    _pp_ckpt_layout(&c, _pp_get64(h + 16), fi.n_state + 1, fi.user_bytes);
    fbytes = _pp_get64(h + 24);
    if (fbytes != c.file_bytes) {
        rc = _pp_fail(err, PP_ERR_CORRUPT, "the checkpoint's header says %llu bytes, its tables %llu",
                      (unsigned long long)fbytes, (unsigned long long)c.file_bytes);
        goto cleanup;
    }
    if (avail < fbytes) {
        rc = _pp_fail(err, PP_ERR_CORRUPT, "truncated: the checkpoint has %llu bytes, its header says %llu",
                      (unsigned long long)avail, (unsigned long long)fbytes);
        goto cleanup;
    }
    if (d->user && fi.user_bytes != d->user_bytes) {
        rc = _pp_fail(err, PP_ERR_SIZE, "the checkpoint holds %llu user bytes, the desc asks for %zu",
                      (unsigned long long)fi.user_bytes, d->user_bytes);
        goto cleanup;
    }
    for (l = 0; l < c.L; l++)
        if (_pp_ckpt_owns(&c, l)) need += (uint64_t)c.S * (_PP_CKPT_REC + c.bytes[l]);
    if (d->user) need += fi.user_bytes;
    if (need > (uint64_t)(size_t)-1 - 8 || !(scratch = (unsigned char*)_pp_calloc((size_t)need, 1))) {
        rc = _pp_fail(err, PP_ERR_NOMEM, "checkpoint load: %llu bytes of scratch for the records read",
                      (unsigned long long)need);
        goto cleanup;
    }
    /* read and check every record this call loads, and the user bytes */
    for (q = scratch, l = 0; l < c.L; l++) {
        int n = c.first[l + 1] - c.first[l];
        if (!_pp_ckpt_owns(&c, l)) continue;
        for (s = 0; s < c.S; s++) {
            unsigned char expect[_PP_CKPT_REC];
            uint64_t off = c.rec[l] + (uint64_t)slot_of[s] * _pp_ckpt_rec_bytes(&c, l), sum;
            size_t nb = (size_t)(_PP_CKPT_REC + c.bytes[l]);
            char what[96];
            snprintf(what, sizeof what, "layer %d (%s) %s", l, _pp_ckpt_lname(&c, l), c.slot[s]);
            if ((rc = _pp_ckpt_read(io, off, q, nb, what, err)) != PP_OK) goto cleanup;
            sum = _pp_ckpt_rec_head(expect, l, slot_of[s], n, c.bytes[l]);
            if (memcmp(q, expect, 24) != 0) {
                rc = _pp_fail(err, PP_ERR_CORRUPT,
                              "%s: the record at offset %llu says layer %u slot %u (%u buffers, %llu bytes), not what the "
                              "tables put there",
                              what, (unsigned long long)off, _pp_get32(q + 4), _pp_get32(q + 8), _pp_get32(q + 12),
                              (unsigned long long)_pp_get64(q + 16));
                goto cleanup;
            }
            sum = _pp_fnv1a(sum, q + _PP_CKPT_REC, (size_t)c.bytes[l]);
#ifndef PP_TEST_NO_CKPT_CHECKSUM /* the negative control of tests/test_ckpt.c */
            if (sum != _pp_get64(q + 24)) {
                rc = _pp_fail(err, PP_ERR_CORRUPT, "%s: the payload's checksum is %016llx, the record says %016llx (corrupt)",
                              what, (unsigned long long)sum, (unsigned long long)_pp_get64(q + 24));
                goto cleanup;
            }
#endif
            q += nb;
        }
    }
    if (d->user) {
        /* right after the file's header, whose size counts the file's states, not the desc's */
#ifdef PP_TEST_CKPT_USER_AT_DESC /* negative control (build/ckpt-controls): the desc's header size */
        uint64_t at = c.head;
#else
        uint64_t at = _pp_get64(h + 16);
#endif
        if ((rc = _pp_ckpt_read(io, at, q, (size_t)fi.user_bytes, "the user bytes", err)) != PP_OK) goto cleanup;
#ifndef PP_TEST_NO_CKPT_CHECKSUM
        if (_pp_fnv1a(_PP_FNV1A_BASIS, q, (size_t)fi.user_bytes) != _pp_get64(h + 64)) {
            rc = _pp_fail(err, PP_ERR_CORRUPT, "the checkpoint's user bytes do not match their checksum");
            goto cleanup;
        }
#endif
    }
    if (c.shard && c.tp_n > 1 && !(slice = (unsigned char*)_pp_calloc((size_t)c.max_buf + 1, 1))) {
        rc = _pp_fail(err, PP_ERR_NOMEM, "checkpoint load: %llu bytes to stage a slice", (unsigned long long)c.max_buf);
        goto cleanup;
    }
    /* all of it checked: into the caller's buffers */
    for (q = scratch, l = 0; l < c.L; l++) {
        int n = c.first[l + 1] - c.first[l];
        if (!_pp_ckpt_owns(&c, l)) continue;
        for (s = 0; s < c.S; s++) {
            const pp_param* p = c.buf + (size_t)s * c.B + c.first[l];
            size_t at = _PP_CKPT_REC, nb;
            for (b = 0; b < n; b++, at += nb) {
                const unsigned char* src = q + at;
                size_t cb;
                nb = cb = (size_t)p[b].count * pp_dtype_size(p[b].dtype);
                if (c.shard && c.tp_n > 1 && c.shard[c.first[l] + b] >= 0) { /* this TP rank's slice of it */
                    const pp_ckpt_shard* sh = &d->shards[c.shard[c.first[l] + b]];
                    int64_t st0, un, el;
                    _pp_ckpt_slice(sh, c.tp_k, c.tp_n, &st0, &un, &el);
                    cb = (size_t)el * pp_dtype_size(p[b].dtype);
                    _pp_ckpt_place(sh, c.tp_k, c.tp_n, pp_dtype_size(p[b].dtype), q + at, slice, 1);
                    src = slice;
                }
                if (!cb) continue;
                if (!d->copy) memcpy(p[b].data, src, cb);
                else if (d->copy(d->copy_user, p[b].data, src, cb) != 0) {
                    rc = _pp_fail(err, PP_ERR_IO, "layer %d (%s) buffer %d of %s: the copy hook failed (the buffers are "
                                  "partly loaded)", l, _pp_ckpt_lname(&c, l), b, c.slot[s]);
                    goto cleanup;
                }
            }
            q += _PP_CKPT_REC + c.bytes[l];
        }
    }
    if (d->user && fi.user_bytes) memcpy(d->user, q, (size_t)fi.user_bytes);
    if (info) *info = fi;
cleanup:
    PP_FREE(h);
    PP_FREE(scratch);
    PP_FREE(slice);
    _pp_ckpt_free(&c);
    return rc;
}

pp_result pp_ckpt_load(const pp_ckpt_desc* d, const pp_ckpt_io* io, pp_ckpt_info* info, pp_error* err) {
    return _pp_ckpt_load(d, io, UINT64_MAX, info, err);
}

/* stdio and memory behind pp_ckpt_io. A file's writer may be given a fault (tests/test_ckpt.c's
   sweep of failing and short writes): the bytes it lets through of each write. */
typedef struct _pp_ckpt_file {
    FILE* f;
    size_t (*fault)(void* user, uint64_t off, size_t n);
    void* fault_user;
} _pp_ckpt_file;
static size_t _pp_ckpt_fwrite(void* ctx, uint64_t off, const void* p, size_t n) {
    _pp_ckpt_file* w = (_pp_ckpt_file*)ctx;
    size_t k = n;
    if (off > (uint64_t)LONG_MAX || fseek(w->f, (long)off, SEEK_SET) != 0) return 0;
    if (w->fault && (k = w->fault(w->fault_user, off, n)) > n) k = n;
    return k ? fwrite(p, 1, k, w->f) : 0;
}
static size_t _pp_ckpt_fread(void* ctx, uint64_t off, void* p, size_t n) {
    FILE* f = (FILE*)ctx;
    if (off > (uint64_t)LONG_MAX || fseek(f, (long)off, SEEK_SET) != 0) return 0;
    return fread(p, 1, n, f);
}
typedef struct _pp_ckpt_mem {
    unsigned char* p;
    size_t n;
} _pp_ckpt_mem;
static size_t _pp_ckpt_mwrite(void* ctx, uint64_t off, const void* p, size_t n) {
    _pp_ckpt_mem* m = (_pp_ckpt_mem*)ctx;
    if (off > m->n || n > m->n - off) return 0;
    memcpy(m->p + off, p, n);
    return n;
}
static size_t _pp_ckpt_mread(void* ctx, uint64_t off, void* p, size_t n) {
    _pp_ckpt_mem* m = (_pp_ckpt_mem*)ctx;
    if (off >= m->n) return 0;
    if (n > m->n - off) n = (size_t)(m->n - off);
    memcpy(p, m->p + off, n);
    return n;
}

/* A save that is refused, fails or is killed leaves the file at path as it was: everything is
   checked before the path is touched, the bytes go to a new file beside it (path.tmp-PID-N,
   created exclusively), which is flushed to the disk (fsync where POSIX has it) and renamed over
   path (atomic on POSIX); the directory is synced too. A failed save removes its new file; a
   killed one leaves it behind. Without POSIX, a rename onto an existing file that fails (Windows)
   removes the old file first: there a crash between the two loses it. */
#if defined(__unix__) || defined(__APPLE__)
#define _PP_CKPT_POSIX 1
#include <fcntl.h>
#include <unistd.h>
/* As for clock_gettime above: a C library header included first under -std=c99 fixed the feature
   set without POSIX, and <stdio.h> and <unistd.h> then declared none of these (glibc). */
#if defined(__GLIBC__) && !defined(__USE_POSIX) && !defined(__cplusplus)
extern FILE* fdopen(int fd, const char* mode);
extern int fileno(FILE* f);
extern int fsync(int fd);
#endif
#endif

/* Creates a new file named after path (name: its name, cap bytes); NULL with errno set. */
static FILE* _pp_ckpt_create_tmp(const char* path, char* name, size_t cap) {
    int i;
    for (i = 0; i < 1000; i++) {
#ifdef _PP_CKPT_POSIX
        int fd;
        FILE* f;
        snprintf(name, cap, "%s.tmp-%ld-%d", path, (long)getpid(), i);
        if ((fd = open(name, O_WRONLY | O_CREAT | O_EXCL, 0666)) < 0) {
            if (errno == EEXIST) continue;
            return NULL;
        }
        if (!(f = fdopen(fd, "wb"))) {
            int e = errno;
            close(fd);
            remove(name);
            errno = e;
        }
        return f;
#else
        FILE* f;
        snprintf(name, cap, "%s.tmp-%d", path, i);
        if ((f = fopen(name, "rb")) != NULL) { /* taken */
            fclose(f);
            continue;
        }
        return fopen(name, "wb");
#endif
    }
    errno = EEXIST;
    return NULL;
}

/* The file's bytes to the disk (fflush, then fsync where there is one); 0 on success. */
static int _pp_ckpt_sync(FILE* f) {
    if (fflush(f) != 0 || ferror(f)) return -1;
#ifdef _PP_CKPT_POSIX
    if (fsync(fileno(f)) != 0) return -1;
#endif
    return 0;
}

/* The directory holding path, synced so that the rename is on the disk (best effort: some file
   systems refuse to sync a directory, and the file itself is already there). */
static void _pp_ckpt_sync_dir(const char* path, char* dir, size_t cap) {
#ifdef _PP_CKPT_POSIX
    const char* slash = strrchr(path, '/');
    int fd;
    if (!slash) snprintf(dir, cap, ".");
    else if (slash == path) snprintf(dir, cap, "/");
    else snprintf(dir, cap, "%.*s", (int)(slash - path), path);
    if ((fd = open(dir, O_RDONLY)) >= 0) {
        (void)fsync(fd);
        close(fd);
    }
#else
    (void)path, (void)dir, (void)cap;
#endif
}

/* With d->tp over several ranks: the save's outcome made the same on every TP rank. The first rank
   writes, the others only send their slices and cannot see a write fail, so the first sends its
   result (an int32) to each of the others as its last word (_pp_ckpt_ask), which wait for it with
   tp's deadline (unless it came during the save, `last`) and return it where theirs was PP_OK: a
   save fails on every TP rank or none (PP_TEST_CKPT_TP_OUTCOME_OFF: the senders' own result, as
   before; the negative control in build/ckpt-controls). */
static pp_result _pp_ckpt_tp_outcome(const pp_ckpt_desc* d, pp_result rc, int32_t last, pp_error* err) {
#ifdef PP_TEST_CKPT_TP_OUTCOME_OFF
    (void)d;
    (void)err;
    (void)last;
    return rc;
#else
    const pp_group* g = d ? d->tp : NULL;
    const pp_transport* t;
    int n = pp_group_size(g), me = pp_group_rank(g), k, first;
    int32_t out = (int32_t)rc;
    pp_request rq;
    pp_result tr;
    pp_error e2;
    e2.msg[0] = 0;
    if (n <= 1 || me < 0 || !g->t->isend || !g->t->irecv || !g->t->wait) return rc; /* me < 0: refused already */
    t = g->t;
    first = g->ranks ? g->ranks[0] : 0;
    if (me == 0) {
        for (k = 1; k < n; k++) {
            if ((tr = t->isend(t->self, g->ranks ? g->ranks[k] : k, _PP_TAG_CKPT_OUT, &out, sizeof out, &rq)) != PP_OK ||
                (tr = t->wait(t->self, &rq, g->timeout_s, &e2)) != PP_OK)
                return rc != PP_OK ? rc
                                   : _pp_fail(err, tr, "checkpoint: TP rank 0 telling TP rank %d the save's outcome: %s", k,
                                              e2.msg);
        }
        return rc;
    }
    /* the first rank's last word, unless it came during the save; requests this rank no longer
       answers (it failed) are passed over */
    for (out = last; out == _PP_CKPT_SEND;)
        if ((tr = _pp_ckpt_word(g, &out, &e2)) != PP_OK)
            return rc != PP_OK ? rc
                               : _pp_fail(err, tr, "checkpoint: TP rank %d waiting for TP rank 0's save outcome (rank %d): %s",
                                          me, first, e2.msg);
    if (rc == PP_OK && out != (int32_t)PP_OK)
        return _pp_fail(err, (pp_result)out, "checkpoint: the save failed on TP rank 0 (rank %d), which writes the file: %s",
                        first, pp_result_str((pp_result)out));
    return rc;
#endif
}

pp_result pp_ckpt_save(const pp_ckpt_desc* d, const pp_ckpt_io* io, pp_error* err) {
    int32_t last = _PP_CKPT_SEND;
    pp_result rc = _pp_ckpt_save_io(d, io, &last, err);
    return _pp_ckpt_tp_outcome(d, rc, last, err);
}

/* With d->tp: this rank is not the TP group's first, so a save only sends its slices. */
static int _pp_ckpt_tp_sender(const pp_ckpt_desc* d) {
    const pp_group* g = d ? d->tp : NULL;
    if (!g || !g->t) return 0;
    if (g->ranks) return g->n_ranks > 1 && g->ranks[0] != g->t->rank;
    return g->t->size > 1 && g->t->rank != 0;
}

/* _pp_ckpt_save_path on this rank alone (the outcome not yet agreed over TP). */
static pp_result _pp_ckpt_save_path_1(const pp_ckpt_desc* d, const char* path, size_t (*fault)(void*, uint64_t, size_t),
                                      void* fault_user, int32_t* last, pp_error* err) {
    _pp_ckpt c;
    _pp_ckpt_file w;
    pp_ckpt_io io;
    pp_result rc;
    char* tmp = NULL;
    size_t cap = 0;
    int in_place;
    if (!path) return _pp_fail(err, PP_ERR_INVALID, "checkpoint save: path is NULL");
    if (_pp_ckpt_tp_sender(d)) return _pp_ckpt_save_io(d, NULL, last, err); /* the file is TP rank 0's */
    /* everything a save checks, the layers' data included, before the path is touched */
#ifdef PP_TEST_CKPT_IN_PLACE
    rc = _pp_ckpt_prepare(&c, d, 0, err); /* as before: the layers' data unchecked */
#else
    rc = _pp_ckpt_prepare(&c, d, 1, err);
#endif
    _pp_ckpt_free(&c);
    if (rc != PP_OK) return rc;
#ifdef PP_TEST_CKPT_IN_PLACE /* negative control (build/ckpt-controls): the file itself, truncated */
    in_place = 1;
#else
    in_place = d->records_only; /* into the file the header's writer made: in place */
#endif
    memset(&w, 0, sizeof w);
    w.fault = fault;
    w.fault_user = fault_user;
    if (in_place) {
        if (!(w.f = fopen(path, d->records_only ? "r+b" : "wb")))
            return _pp_fail(err, PP_ERR_IO, "cannot open '%s' to %s: %s", path,
                            d->records_only ? "write records into it (records_only: it must exist)" : "write",
                            strerror(errno));
    } else {
        cap = strlen(path) + 48;
        if (!(tmp = (char*)_pp_calloc(cap, 1)))
            return _pp_fail(err, PP_ERR_NOMEM, "checkpoint save: %zu bytes for a file name", cap);
        if (!(w.f = _pp_ckpt_create_tmp(path, tmp, cap))) {
            rc = _pp_fail(err, PP_ERR_IO, "cannot create '%s' to write '%s' (nothing written): %s", tmp, path,
                          strerror(errno));
            PP_FREE(tmp);
            return rc;
        }
    }
    io.write = _pp_ckpt_fwrite;
    io.read = NULL;
    io.ctx = &w;
    rc = _pp_ckpt_save_io(d, &io, last, err);
    if (rc == PP_OK && _pp_ckpt_sync(w.f) != 0)
        rc = _pp_fail(err, PP_ERR_IO, "writing '%s' failed: %s", tmp ? tmp : path, strerror(errno));
    if (fclose(w.f) != 0 && rc == PP_OK) rc = _pp_fail(err, PP_ERR_IO, "closing '%s': %s", tmp ? tmp : path, strerror(errno));
    if (tmp && rc == PP_OK && rename(tmp, path) != 0) {
#ifndef _PP_CKPT_POSIX
        if (remove(path) != 0 || rename(tmp, path) != 0)
#endif
            rc = _pp_fail(err, PP_ERR_IO, "cannot rename '%s' to '%s' (the old file is left as it was): %s", tmp, path,
                          strerror(errno));
    }
    if (tmp && rc != PP_OK) remove(tmp);
    if (tmp && rc == PP_OK) _pp_ckpt_sync_dir(path, tmp, cap);
    PP_FREE(tmp);
    return rc;
}

/* pp_ckpt_save_file, with a fault for each write (tests; NULL: none); the outcome the same on every
   TP rank. */
static pp_result _pp_ckpt_save_path(const pp_ckpt_desc* d, const char* path, size_t (*fault)(void*, uint64_t, size_t),
                                    void* fault_user, pp_error* err) {
    int32_t last = _PP_CKPT_SEND;
    pp_result rc = _pp_ckpt_save_path_1(d, path, fault, fault_user, &last, err);
    return _pp_ckpt_tp_outcome(d, rc, last, err);
}

pp_result pp_ckpt_save_file(const pp_ckpt_desc* d, const char* path, pp_error* err) {
    return _pp_ckpt_save_path(d, path, NULL, NULL, err);
}

pp_result pp_ckpt_load_file(const pp_ckpt_desc* d, const char* path, pp_ckpt_info* info, pp_error* err) {
    pp_ckpt_io io;
    pp_result rc;
    long end;
    FILE* f;
    if (!path) return _pp_fail(err, PP_ERR_INVALID, "checkpoint load: path is NULL");
    if (!(f = fopen(path, "rb"))) return _pp_fail(err, PP_ERR_IO, "cannot open '%s' to read: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0 || (end = ftell(f)) < 0) {
        fclose(f);
        return _pp_fail(err, PP_ERR_IO, "cannot find the length of '%s': %s", path, strerror(errno));
    }
    io.write = NULL;
    io.read = _pp_ckpt_fread;
    io.ctx = f;
    rc = _pp_ckpt_load(d, &io, (uint64_t)end, info, err);
    fclose(f);
    return rc;
}

static pp_result _pp_ckpt_save_mem_1(const pp_ckpt_desc* d, void* buf, size_t cap, int32_t* last, pp_error* err) {
    _pp_ckpt_mem m;
    pp_ckpt_io io;
    uint64_t need = 0;
    pp_result rc;
    if (!buf) return _pp_fail(err, PP_ERR_INVALID, "checkpoint save: buf is NULL");
    if (_pp_ckpt_tp_sender(d)) return _pp_ckpt_save_io(d, NULL, last, err); /* the buffer is TP rank 0's */
    if ((rc = pp_ckpt_size(d, &need, err)) != PP_OK) return rc;
    if (need > cap)
        return _pp_fail(err, PP_ERR_SIZE, "checkpoint save: the buffer has %zu bytes, the checkpoint needs %llu", cap,
                        (unsigned long long)need);
    m.p = (unsigned char*)buf;
    m.n = cap;
    io.write = _pp_ckpt_mwrite;
    io.read = NULL;
    io.ctx = &m;
    return _pp_ckpt_save_io(d, &io, last, err);
}

pp_result pp_ckpt_save_mem(const pp_ckpt_desc* d, void* buf, size_t cap, pp_error* err) {
    int32_t last = _PP_CKPT_SEND;
    pp_result rc = _pp_ckpt_save_mem_1(d, buf, cap, &last, err);
    return _pp_ckpt_tp_outcome(d, rc, last, err);
}

pp_result pp_ckpt_load_mem(const pp_ckpt_desc* d, const void* buf, size_t bytes, pp_ckpt_info* info, pp_error* err) {
    _pp_ckpt_mem m;
    pp_ckpt_io io;
    if (!buf) return _pp_fail(err, PP_ERR_INVALID, "checkpoint load: buf is NULL");
    m.p = (unsigned char*)(uintptr_t)buf; /* read only */
    m.n = bytes;
    io.write = NULL;
    io.read = _pp_ckpt_mread;
    io.ctx = &m;
    return _pp_ckpt_load(d, &io, (uint64_t)bytes, info, err);
}

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
