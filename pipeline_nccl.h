/* pipeline_nccl.h - pipeline.h's transport for one process per GPU, over NCCL.
   v0.1.0   public domain / MIT (see pipeline.h)

   Includes pipeline_cuda.h (and so pipeline.h); include <mpi.h> first if you want the MPI
   bootstrap. In the one file that defines PIPELINE_IMPLEMENTATION the implementations come
   along. C99 and C++; link with -lnccl -lcudart. It launches no kernel of its own besides
   NCCL's. The executor's blocks belong in device memory: a one-rank pp_cuda per process gives
   them (pp_cuda_device_ops(c, 0)) and the compute stream (pp_cuda_stream(c, 0)).

   WHAT IT DOES
   - pp_nccl: a pp_transport over an NCCL communicator and up to seven split from it (collective
     calls at pp_stage_create, as many as its checked schedules need), eight channels, each with
     its own stream: activations to higher
     ranks, to lower ranks, then gradients to higher and to lower ranks, each once for the
     neighbour pairs whose lower rank is even and once for the odd ones. NCCL runs a
     communicator's kernels in issue order, so on one communicator a send queued behind a
     receive waits for it, and two neighbours that each send before they receive (interleaved
     does) would wait for each other at the GPU; split by direction they cannot
     (tests/test_nccl_pipeline.c fails interleaved with one channel). Split by kind, the
     V-shaped schedules (ZB-V, V-Half, V-Min, DualPipeV), whose neighbours exchange activations
     of one chunk and gradients of the other in orders that differ between the two sides, match
     in order on every channel. Split by pair parity, a rank's sends to one neighbour and its
     receives from the other never share a group, so no built-in schedule's groups wait in a
     cycle (with four channels some did: pp_nccl_desc.channels chooses fewer). By default the
     transport runs on the fewest of 1, 2, 4 and 8 channels that the schedules pp_stage_create
     checks pass over (1F1B, GPipe, ZB-H1 and ZB-H2 on one: an action's messages then make one
     NCCL group, not one per channel); pp_nccl_channels says how many.
     isend/irecv queue ncclSend/ncclRecv; the end of an executor group that posted a send
     issues everything queued as one NCCL group per channel (an action's sends together with
     the next action's receives, Megatron's send-forward/receive-backward pairing); a wait on a
     queued receive issues the queue up to it. Each group's stream first waits for the compute
     stream's work so far (the producers, and earlier readers of a receive block); a receive's
     wait makes the compute stream wait for its group and returns: the host runs ahead, the
     stream waits for data. Sends are done when their group is (polled, never blocking a
     probe). Byte counts are exact (the step plan's, varlen included). Buffers are normally
     device memory (the device block pool of pipeline_cuda.h); a host buffer (BROADCAST's step
     metadata) goes through a pooled device bounce buffer. A message to this rank itself (the
     turn of a V map) is a device copy on the compute stream.
   - Connections: NCCL sets a pair up on its first exchange, inside the outermost ncclGroupEnd,
     with the host held until the peer's host sets up its side; first exchanges in different
     orders on two ranks wait there forever (the step agreement did at p >= 3). A communicator's
     first collective does the same for its ring or tree. Each connection holds NCCL's buffers on
     the GPU (PP_NCCL_CONN_BYTES, 9.2 MiB, per direction, peer and NCCL channel). So nothing is
     left to a step, and only what is used is made: pp_nccl_create runs one all-reduce per dtype
     (f32, f64) on the communicator, which sets the collective's connections up on every rank
     at once; pp_stage_create's schedule check (collective) splits the channels the schedule
     needs and sets up, in one order on every rank, the pairs the schedule talks over, on the
     channels their messages take: its neighbours, and the step agreement's star around rank 0
     (1F1B p = 8: rank 3 holds 3 + 3 connections on one communicator where it held 14 + 14 on
     eight). A transport whose schedule is never checked makes every channel and connects every
     pair at its first message, or at create with pp_nccl_desc.connect_all (isend/irecv used
     directly). pp_nccl_desc.collective_only (the grid's dp and tied transports)
     makes one communicator and no pair: a ring's connections, nothing else. pp_nccl_get_stats
     reports communicators, connections and their bytes (a lower bound: NCCL runs several
     channels per peer over NVLink; docs/multiprocess.md has the table for grids up to 8 x 64).
     An evaluation whose outputs go to a rank other than rank 0 and the last stage's connects
     that pair at its first use. Split children of a parent made with splitShare = 1 (or under
     NCCL_COMM_SPLIT_SHARE_RESOURCES=1) share its launch queue: the transport then refuses more
     than one channel (pp_nccl_desc.comm_shares_resources declares such a parent). Several
     channels rely on kernels of different communicators progressing at once (ranks launch the
     channels' groups in different orders), which NCCL does not promise: where the kernels are
     known to run one after another the transport runs one channel and refuses a schedule that
     needs more, naming the kinds that run: n channels' streams (each channel's and NCCL's two
     per communicator, deviceStream and hostStream) and the compute stream, 1 + 3n, with the
     streams the rank holds besides (pp_nccl_desc.queues_held; a grid's pipe: 8, 11 with tp),
     beyond CUDA_DEVICE_MAX_CONNECTIONS (8 by default: 2 channels fit, none beyond one in a
     grid), or NCCL_LAUNCH_ORDER_IMPLICIT set. pp_nccl_desc.channels = 1 keeps to NCCL's
     documented rule everywhere (docs/gpu.md).
   - pp_nccl_step_end after every pp_stage_step (and pp_stage_eval): waits, with the deadline,
     for the step's groups, so a peer that never sent is an error here, not a GPU that never
     finishes.
   - NCCL has no tags: messages between two ranks match in the order they are posted. The
     executor posts in schedule order, so the order agrees on both sides when every rank's list
     implies the same per-pair sequence of each kind; pp_nccl_check_order proves that for a
     schedule. It holds for every list pp_schedule_make builds (p 2 to 8, m 1 to 24); lists
     generated for costs can break it where a pair carries activations of several chunks in
     orders that differ between the two sides (interleaved-mem for F, B, W = 1, 2, 1: 31 of 168):
     such a schedule, or a user's list that breaks the order, is refused with the first
     mismatching message named. Use the MPI transport (tags) there.
   - Sends complete only when their receive runs (rendezvous), and a group completes with all
     its operations: pp_nccl_check_rendezvous runs every rank's groups, in issue order, against
     each other and refuses a schedule whose groups would wait in a cycle (every built-in one
     passes; a hand-written table may not). pp_stage_create runs both checks through the
     transport (pp_transport.check_schedule): such a schedule fails there, not at a step. The
     stage's forward-only list (evaluation) is checked the same way; it passes wherever its
     training list does, at the same channel count (built-in kinds, p 2 to 8, m 1 to 24). Its
     messages carry other tags, outside the training list's order table (_ppn_key), and the
     outputs an evaluation sends to a rank other than the last stage's go after both ranks'
     lists: after every other message of the pair on both sides, waited for by no action.
   - Waits that poll (sends, host receives, pp_nccl_step_end) use cudaEventQuery and
     ncclCommGetAsyncError against the deadline; on a timeout (other than the executor's short
     probes of retiring blocks) or an NCCL error the communicators are aborted (ncclCommAbort),
     so this rank returns PP_ERR_TIMEOUT / PP_ERR_TRANSPORT instead of hanging, and its peers
     fail the same way within their own timeouts. transport.abort also aborts them. An aborted
     transport stays aborted: destroy it and build a new communicator (a new unique id; a grid's:
     pp_nccl_grid_recover, from the world communicator). A
     layer's failure does not abort: the transport's abort_local makes the stage drain the step
     (no compute, zeros sent) and report the failure at its end, on every rank at once. In a
     pp x dp grid pp_dp_overlap_wait, called on every rank after every step, gives the grid one
     outcome (a vote, one more all-reduce on the dp communicator and one on the pipeline's): NCCL
     has no tags, so a rank whose step failed still issues the good wait's all-reduces before
     its vote, in the same order (docs/errors.md, the recovery for a grid).
   - Bootstrap: pp_launch_from_env (pipeline.h) gives rank, world and local rank from mpirun,
     srun or torchrun; the ncclUniqueId travels by MPI_Bcast (pp_nccl_unique_id_mpi, when
     <mpi.h> was included first) or through a file on a shared filesystem
     (pp_nccl_unique_id_file, with a deadline); pp_nccl_comm_init binds the GPU (local rank modulo
     the device count) and creates the communicator without blocking past its deadline.
   - Grid: pp_nccl_grid_create splits the world communicator with ncclCommSplit (NCCL >= 2.18)
     into the pipeline group, the data-parallel group and the tied pair (first and last stage
     rank) of a pp x dp grid (pipeline.h's pp_grid colours; dp and tied collective_only), and with
     pp_nccl_grid_create_tp the TP group of a pp x dp x tp grid (g.tp, one channel, every pair; pipeline.h's
     pp_tp_* collectives run over its isend/irecv, host memory, and pp_nccl_tp_* enqueue NCCL's own
     on a layer's stream, device memory); tied layers use the tied transport,
     or the pipeline transport with the pair of ranks that own them (pp_tied_sum_grads), data
     parallelism the dp transport (pp_grad_allreduce after the step, or pp_dp_overlap during the
     cool-down: the transport's iallreduce_sum enqueues each bucket's ncclAllReduce on its own
     stream after a record of the compute stream and returns; wait completes it, with the
     deadline and abort of a receive's wait; host buffers go through a pinned buffer copied by a
     host function in stream order, so the hook never waits for the device).

   USAGE (one process per GPU; examples/gpt_nccl.cu shows it whole)
       pp_launch L; pp_launch_from_env(&L, &err);
       ncclUniqueId id; pp_nccl_unique_id_mpi(MPI_COMM_WORLD, &id, &err);   // or _file
       ncclComm_t world; pp_nccl_comm_init(&L, &id, 60, &world, &err);
       pp_nccl_grid g; pp_nccl_grid_create(world, pp, PP_GRID_DP_INNER, stream, 60, &g, &err);
       pp_cuda* c; pp_cuda_desc cd = {0}; cd.n_ranks = 1; pp_cuda_create(&cd, &c, &err);
       d.transport = pp_nccl_transport(g.pipe); d.rank = g.grid.pp_rank;
       d.device = pp_cuda_device_ops(c, 0);   // stream: pp_cuda_stream(c, 0) as `compute` above
       ... pp_stage_step, pp_tied_sum_grads(&pipe, pair, ...), pp_grad_allreduce(&dp, ...)

   WHAT WAS RUN: make test runs it with the real executor over tests/fakenccl (every built-in
   schedule, p up to 8, rendezvous and eager, blocking and non-blocking communicators, NCCL's
   lazy set-up and shared queues, CUDA's shared hardware queues: tests/test_nccl_pipeline.c); it
   compiles and links in CI (make check-nccl) and against NCCL 2.30.7 (make gpu-nccl);
   examples/gpt_nccl -p 1 trained on an H200 (2026-11-26, docs/gpu.md) before the two-channel
   transport. Several ranks of real NCCL on one GPU (NCCL >= 2.30): tools/gpu_nccl.sh, not yet run.
*/
#ifndef PIPELINE_NCCL_H
#define PIPELINE_NCCL_H

#include "pipeline_cuda.h" /* pipeline.h, the CUDA runtime, the device block pool (pp_cuda_device_ops) */
/* The release of pipeline.h this header belongs to. Against another, compiling stops with an
   #error naming this header's version, then an include of a file named after both versions
   ("pipeline.h is version 0.2.0 but pipeline_nccl.h is 0.1.0": no such file), since #error cannot
   print a macro's value. */
#define PP_NCCL_VERSION 100 /* 0.1.0, PP_VERSION's encoding */
#define PP_NCCL_VERSION_STRING "0.1.0"
#if !defined(PP_VERSION) || PP_VERSION != PP_NCCL_VERSION
#error "pipeline_nccl.h 0.1.0 (PP_VERSION 100) and pipeline.h differ in version: use the headers of one release (pipeline.h's version is in the next error)"
#define _PPN_SKEW2(text) #text
#define _PPN_SKEW(maj, min, pat) _PPN_SKEW2(pipeline.h is version maj.min.pat but pipeline_nccl.h is 0.1.0)
#include _PPN_SKEW(PP_VERSION_MAJOR, PP_VERSION_MINOR, PP_VERSION_PATCH)
#endif
#include <nccl.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pp_nccl pp_nccl;

typedef struct pp_nccl_desc {
    ncclComm_t comm;            /* an initialised communicator */
    cudaStream_t compute;       /* the stream the layers run on (0: the legacy default stream) */
    int own_comm;               /* 1: pp_nccl_destroy destroys comm */
    /* Communicators the transport runs (the given one and splits of it): 0, the default, uses
       the fewest of 1, 2, 4, 8 that every schedule checked at pp_stage_create passes over
       (pp_nccl_check_order, pp_nccl_check_rendezvous), up to 8 (4 with two ranks) and up to what
       the device's hardware queues leave room for (1 + 3n queues and queues_held: 2 channels at
       CUDA's default 8; 1 under NCCL_LAUNCH_ORDER_IMPLICIT); 8, 4, 2 or 1 make and use that
       many, at the price of refusing some schedules. Every rank must pass the same. NCCL < 2.18: always 1. */
    int channels;
    double timeout_s;           /* create's splits and warm-up all-reduces, pp_stage_create's
                                   splits and connection set-up, a group's launch and
                                   pp_nccl_destroy: each waits this long for the peers (0: the
                                   default, PP_DEFAULT_TIMEOUT_S). Only a non-blocking comm lets
                                   NCCL's own calls keep it (docs/errors.md) */
    /* 1: comm was made with config.splitShare = 1 (or inherits it): ncclCommSplit children then
       share its launch queue, one kernel after another, and the transport refuses more than one
       channel (as it does under NCCL_COMM_SPLIT_SHARE_RESOURCES=1). NCCL offers no way to ask. */
    int comm_shares_resources;
    /* 1: the transport only all-reduces over the whole communicator (pp_nccl_grid's data-parallel
       and tied transports): no channel splits, no point-to-point connection made ahead (a send or
       a subset all-reduce over it connects its pair at first use, as NCCL does); create sets up
       the all-reduce's connections. 0: a pipeline transport (channels, pairs connected as its
       checked schedules need them). */
    int collective_only;
    /* 1: create makes every channel and sets up every pair both ways on each (what it did before
       it waited for the schedule check): for a transport whose isend/irecv a caller uses directly.
       0: at the check, or at the first message where no schedule is ever checked, which holds
       that message's host until every rank sends or receives its own first. */
    int connect_all;
    /* Hardware work queues this rank's other streams hold on its device, beyond the compute
       stream and this transport's own: other communicators (each takes NCCL's two streams)
       and their transports' streams, streams of your own that run while a step does. Channels
       beyond one are counted against CUDA_DEVICE_MAX_CONNECTIONS less these, so none of them
       shares a queue (pp_nccl_grid_create sets it for its pipe). Every rank must pass the same. */
    int queues_held;
} pp_nccl_desc;

/* Device memory NCCL 2.30 gives one point-to-point or ring connection, one direction, one NCCL
   channel, with its default buffer sizes (src/init.cc computeBuffSizes: DEFAULT_LL_BUFFSIZE,
   DEFAULT_LL128_BUFFSIZE, DEFAULT_BUFFSIZE; src/include/device.h NCCL_LL_LINES_PER_THREAD 8 x
   NCCL_LL_MAX_NTHREADS 512 x NCCL_STEPS 8 x 16-byte lines; NCCL_LL128_ELEMS_PER_THREAD 120 x
   NCCL_LL128_MAX_NTHREADS 640 x 8 steps x 8 bytes; 4 MiB). The P2P transport allocates all three
   on the receiving GPU (src/transport/p2p.cc p2pRecvSetup; with P2P read the SIMPLE buffer sits
   on the sender instead, p2pSendSetup). NCCL_BUFFSIZE, NCCL_LL_BUFFSIZE, NCCL_LL128_BUFFSIZE change
   them; these are the defaults. */
#define PP_NCCL_LL_BYTES 524288u      /* 8 * 512 * 8 * 16 */
#define PP_NCCL_LL128_BYTES 4915200u  /* 120 * 640 * 8 * 8 */
#define PP_NCCL_SIMPLE_BYTES 4194304u /* 1 << 22 */
#define PP_NCCL_CONN_BYTES (PP_NCCL_LL_BYTES + PP_NCCL_LL128_BYTES + PP_NCCL_SIMPLE_BYTES) /* 9.19 MiB */

/* What a transport set up (pp_nccl_get_stats). Connections count one direction to one peer on
   one of this transport's channels (communicators), as NCCL sets them up: a pipeline transport
   makes them at pp_stage_create for the pairs its checked schedules talk over (and the step
   agreement's star around rank 0), every pair on every channel at its first message when no
   schedule was checked; NCCL makes one a step asks for that is not there (p2p_lazy). */
typedef struct pp_nccl_stats {
    int comms;                  /* communicators it runs: the one given and the channels split from it */
    int channels;               /* channels in use (pp_nccl_channels) */
    int p2p_send, p2p_recv;     /* point-to-point connections, all channels */
    int p2p_send_ch[8], p2p_recv_ch[8]; /* per channel */
    int p2p_lazy;               /* of those, made at a message's first use (inside a step) */
    int colls_warmed;           /* warm-up all-reduces run at create (one per dtype: f32, f64) */
    int coll_send, coll_recv;   /* the all-reduce's ring connections: 1 and 1 per NCCL channel */
    /* Device bytes those connections hold on this GPU by NCCL's rule: PP_NCCL_CONN_BYTES per
       connection it receives on (p2p_recv + coll_recv; P2P write, the receiver's buffers). A lower
       bound: it counts one NCCL channel per peer and one ring channel, where NCCL runs
       p2pnChannelsPerPeer of them per peer (src/graph/paths.cc ncclTopoComputeP2pChannels) and
       comm->nChannels rings (src/transport/generic.cc ncclTransportRingConnect), more over
       NVLink; trees, NVLS and the network's buffers are not counted. */
    uint64_t conn_bytes;
} pp_nccl_stats;

/* Collective over d->comm: splits the channels a count given in d->channels asks for (the
   default splits at pp_stage_create, as the checked schedules need) and runs one all-reduce per
   dtype, so NCCL sets the collective's connections up here (it does at first use otherwise,
   holding the host until every member gets there); the pairs are connected at the schedule
   check. On failure the communicator stays the caller's, except after a failed set-up
   (PP_ERR_TIMEOUT, PP_ERR_TRANSPORT): NCCL's abort freed it (the message says so). */
pp_result pp_nccl_create(const pp_nccl_desc* d, pp_nccl** out, pp_error* err);
/* Waits for the transport's work up to pp_nccl_desc.timeout_s; what has not finished by then
   (a peer that never came or failed) is aborted: the splits, and d->comm when own_comm = 1. A
   caller's own communicator keeps its unfinished work (and the transport's staging buffers,
   leaked: freeing them would wait for it): after a failed step, ncclCommAbort it rather than
   ncclCommDestroy (which waits for that work). */
void pp_nccl_destroy(pp_nccl* t);
pp_transport pp_nccl_transport(pp_nccl* t);
/* After pp_stage_step on this rank: waits (until timeout_s) for the step's NCCL transfers, so a
   peer that never sent surfaces here as an error instead of a GPU that never finishes. The
   compute stream already waits for every receive; this is the host's check. After an error
   the communicator is aborted: destroy this transport and make a new communicator. */
pp_result pp_nccl_step_end(pp_nccl* t, double timeout_s, pp_error* err);
cudaStream_t pp_nccl_comm_stream(const pp_nccl* t);
/* The channels in use: pp_nccl_desc.channels where given; with the default, the fewest that
   every schedule checked so far (pp_stage_create) passes over, and before the first the most it
   may run (8, 4 with two ranks: a stage whose transport.check_schedule was cleared runs on all,
   made at its first message). collective_only: 1. */
int pp_nccl_channels(const pp_nccl* t);
/* Deprecated (sent so far by this rank): pp_step_stats' bytes_sent and msgs_sent count it per step. */
void pp_nccl_counters(const pp_nccl* t, uint64_t* bytes, uint64_t* msgs);
const char* pp_nccl_error(const pp_nccl* t);
/* Communicators, connections and the device memory they hold (pp_nccl_stats), now. */
void pp_nccl_get_stats(const pp_nccl* t, pp_nccl_stats* out);

/* Tensor-parallel collectives of device memory, in stream order, for layers that run on the
   GPU (pipeline.h's pp_tp_* take host memory over any transport). g is the layer's TP group
   (io->tp: pp_stage_desc.tp over the grid's g.tp transport, all of its ranks); the NCCL
   collective (a sum) is enqueued on stream, the stream the layer's kernels run on, after what
   the layer enqueued there, and the call returns: the host never waits, and the layer's next
   kernels on that stream read the result. Every member calls the same collectives in the same
   order. The sum is NCCL's, in its algorithm's order: the same bits run to run on one machine
   and configuration, not pp_tp_allreduce's order. f32, f64, f16 and bf16. The reduce-scatter
   and the all-gather take count as the whole tensor, divisible by the group's size (NCCL's
   equal blocks): the reduce-scatter leaves this member's count / size elements in recv, the
   all-gather reads count / size from send. g NULL or of one rank: no message (a copy where
   send and recv differ). pp_nccl_step_end on the TP transport waits, with its deadline, for
   the collectives enqueued since its last call: a member that never came is PP_ERR_TIMEOUT
   there, and the TP communicator is aborted, which ends the kernels that wait for it. Each
   collective's deadline runs from its enqueue (the transport's timeout_s): whatever waits
   behind one on its communicator or its stream (the TP verdict; in a grid the pipe's, dp's and
   the tied pair's waits, linked to g.tp) ends by then too, so a member whose layer failed
   before its collective fails the step on every rank within one deadline. */
#define pp_nccl_tp_allreduce _PP_ABI(nccl_tp_allreduce)
#define pp_nccl_tp_reducescatter _PP_ABI(nccl_tp_reducescatter)
#define pp_nccl_tp_allgather _PP_ABI(nccl_tp_allgather)
pp_result pp_nccl_tp_allreduce(const pp_group* g, void* buf, size_t count, pp_dtype dtype, cudaStream_t stream,
                               pp_error* err);
pp_result pp_nccl_tp_reducescatter(const pp_group* g, const void* send, void* recv, size_t count, pp_dtype dtype,
                                   cudaStream_t stream, pp_error* err);
pp_result pp_nccl_tp_allgather(const pp_group* g, const void* send, void* recv, size_t count, pp_dtype dtype,
                               cudaStream_t stream, pp_error* err);

/* Bootstrap. The file variant: rank 0 removes what is at path, creates the id and writes it
   there atomically (write, then rename) with its wall-clock time and the launcher's job id
   ($SLURM_JOB_ID, $TORCHELASTIC_RUN_ID, ... where one is set); the others poll for the file until
   timeout_s and take only a file of this job written at most timeout_s before they started: a
   file an earlier run left is passed over (rank 0 replaces it), and a timeout says it was
   stale. The ranks' clocks must agree to well within timeout_s. Use a path unique to the job
   where you can (e.g. with $SLURM_JOB_ID). */
pp_result pp_nccl_unique_id_file(const char* path, int rank, double timeout_s, ncclUniqueId* id, pp_error* err);
/* cudaSetDevice(local_rank % devices), then ncclCommInitRankConfig (non-blocking) polled until
   timeout_s; on a timeout the half-made communicator is aborted. */
pp_result pp_nccl_comm_init(const pp_launch* L, const ncclUniqueId* id, double timeout_s, ncclComm_t* comm,
                            pp_error* err);

/* The pp x dp grid over a world communicator: pipe (rank grid.pp_rank) and dp (rank
   grid.dp_rank), both on the compute stream given. Needs ncclCommSplit (NCCL >= 2.18); older
   NCCL answers PP_ERR_UNSUPPORTED. The world communicator is non-blocking (pp_nccl_comm_init):
   NCCL writes a split's new communicator only once the parent's state leaves ncclInProgress, so
   each split first waits for the world, then for the new communicator. If the world does not
   settle before timeout_s (PP_ERR_TIMEOUT), NCCL may still write into g: abort the world
   (ncclCommAbort) before g goes away. */
typedef struct pp_nccl_grid {
    pp_grid grid;
    pp_nccl* pipe;
    pp_nccl* dp;
    pp_nccl* tied;              /* first and last stage rank of this pipeline; NULL between */
    ncclComm_t split_out[3];    /* private: where NCCL writes the new communicators (pipe, dp, tied) */
    pp_nccl* tp;                /* the TP group (pp_nccl_grid_create_tp, tp > 1; its ranks are the TP
                                   ranks; one channel, every pair connected at create: connect_all);
                                   else NULL */
    ncclComm_t split_tp_out;    /* private: where NCCL writes the TP communicator */
} pp_nccl_grid;

/* pp_grid is sized by PP_MAX_RANKS: linked under names carrying the configuration (pipeline.h) */
#define pp_nccl_grid_create _PP_ABI(nccl_grid_create)
#define pp_nccl_grid_create_tp _PP_ABI(nccl_grid_create_tp)
#define pp_nccl_grid_destroy _PP_ABI(nccl_grid_destroy)
pp_result pp_nccl_grid_create(ncclComm_t world, int pp, pp_grid_order order, cudaStream_t compute, double timeout_s,
                              pp_nccl_grid* out, pp_error* err);
/* pp x dp x tp (pp_grid_make_tp): also g.tp, the TP group's transport for pipeline.h's TP
   collectives (pp_tp_allreduce and friends, over its isend/irecv: host memory, staged through
   the device) and for pp_nccl_tp_* (device memory, in stream order), split after the other three. */
pp_result pp_nccl_grid_create_tp(ncclComm_t world, int pp, int tp, pp_grid_order order, cudaStream_t compute,
                                 double timeout_s, pp_nccl_grid* out, pp_error* err);
void pp_nccl_grid_destroy(pp_nccl_grid* g);
/* After a step that failed on every rank of the world (its outcome agreed: the TP verdict of
   pp_stage_desc.tp, pp_dp_agree), once pp_nccl_step_end ran on each of g's transports; collective
   over world: makes the grid usable again. A transport whose communicator was aborted (a wait
   that ran out: a member whose layer failed before its pp_nccl_tp_* leaves the others'
   collectives, and what their streams and communicators hold behind them, waiting out a
   deadline) stays aborted, and the ranks that talk to it would fail every later step, so every
   rank makes its grid again if any rank must: the world votes (one all-reduce of an int on
   compute, polled until timeout_s); where any rank's grid holds an aborted communicator, every
   rank destroys its grid and splits it again from world (g's pp, tp and order), and *remade = 1:
   make the stages again over the new transports. Otherwise *remade = 0 and the grid stays (a
   layer's failure that left nothing stuck drains the step without an abort). The first vote is
   the world communicator's first collective: NCCL sets its connections up in the call, every
   member at once. PP_ERR_TIMEOUT: a rank did not vote in timeout_s, and world still runs the
   vote: abort world (ncclCommAbort) and start over. */
#define pp_nccl_grid_recover _PP_ABI(nccl_grid_recover)
pp_result pp_nccl_grid_recover(ncclComm_t world, pp_nccl_grid* g, cudaStream_t compute, double timeout_s, int* remade,
                               pp_error* err);

/* Proves that, under schedule s, each ordered pair of ranks posts its receives in the order
   the sender sends, per kind of message (NCCL matches by order, not by tag; the transport sends
   activations and gradients on channels of their own). PP_ERR_UNSUPPORTED names the first pair
   and message where they differ. Pure: no GPU needed. */
pp_result pp_nccl_check_order(const pp_schedule* s, pp_error* err);
/* Proves that the NCCL calls this transport makes under schedule s (with LOCAL or BROADCAST
   shapes) cannot wait in a cycle when sends complete only once their receive runs (NCCL's
   rendezvous for large messages): it derives every rank's groups in the order the executor and
   the transport issue them and runs them against each other. PP_ERR_DEADLOCK names the ranks,
   messages and groups that would wait for each other. channels: 8 (the transport's default,
   NCCL >= 2.18: by direction, by kind and by the parity of the pair's lower rank), 4 (by
   direction and kind), 2 (by direction) or 1, as pp_nccl_desc.channels. Pure: no GPU needed. The
   transport runs this check and pp_nccl_check_order on every schedule pp_stage_create gives it
   (pp_transport.check_schedule), so a user's table that would hang is refused before the first
   step. It takes every connection as made: NCCL's lazy set-up, which holds the host in
   ncclGroupEnd, happens at pp_nccl_create and pp_stage_create, never in a step. */
pp_result pp_nccl_check_rendezvous(const pp_schedule* s, int channels, pp_error* err);

#if defined(MPI_VERSION)
/* Rank 0 of comm creates the id; MPI_Bcast gives it to everyone. */
pp_result pp_nccl_unique_id_mpi(MPI_Comm comm, ncclUniqueId* id, pp_error* err);
#endif

#ifdef __cplusplus
}
#endif
#endif /* PIPELINE_NCCL_H */

/* >>impl-nccl ================================================================================= */
#if defined(PIPELINE_IMPLEMENTATION) && !defined(PIPELINE_NCCL_IMPLEMENTATION_DONE)
#define PIPELINE_NCCL_IMPLEMENTATION_DONE

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

#define _PPN_DEV_CACHE 256

/* One NCCL group on the communication stream; its operations complete together. */
typedef struct _ppn_batch {
    struct _ppn_batch* next;    /* on the transport's list of batches not yet seen complete */
    cudaEvent_t done;           /* NULL for a group of device sends until a host wait asks (_ppn_event) */
    int refs;                   /* live ops, and 1 while on that list */
    int complete;
    int ch;                     /* the channel (communicator and stream) it went on */
    uint64_t seq;               /* issue order on its channel, from 1 */
    uint64_t not_ready_at;      /* 1 + the transport's epoch when last seen running (or issued) */
} _ppn_batch;

/* Host bytes a host function copies in stream order (_ppn_iallreduce). */
typedef struct _ppn_hcopy {
    void* dst;
    const void* src;
    size_t n;
} _ppn_hcopy;

typedef struct _ppn_op {
    struct _ppn_op *next, *prev; /* the transport's live ops, oldest first */
    int is_recv, peer, tag;
    void* buf;                  /* the caller's buffer */
    void* dev;                  /* what NCCL reads or writes: buf, or a bounce buffer */
    size_t dev_cap;
    int host;                   /* buf is host memory: staged through dev */
    size_t bytes;
    _ppn_batch* batch;          /* NULL while queued */
    uint64_t rel_at;            /* a device receive: the `ready` record after its block's last use (_ppn_released) */
    int order;                  /* a device data message: its peer's action that receives (a send) or
                                   sends it (a receive), the index in the peer's list; -1 unknown */
    int ch;                     /* _ppn_channel_of: direction + 2 * gradient + 4 * odd pair */
    int self_done;              /* a message to this rank itself: copied (or failed) */
    pp_result self_rc;
    /* a host receive: the pinned buffer its bytes are copied into on its channel's stream
       behind its group (_ppn_flush); a started all-reduce of host memory (_ppn_iallreduce): its
       pinned staging buffer, and the copy into it a host function makes on the stream (pageable
       memory, read in stream order) */
    void* pinned;
    size_t pinned_cap;
    _ppn_hcopy up;
} _ppn_op;

typedef struct _ppn_rel { /* a free block of the stage's pool (pp_transport.released) */
    const char* p;
    size_t n;
    uint64_t at;            /* the first record of `ready` after its last use */
} _ppn_rel;

typedef struct _ppn_bounce {
    struct _ppn_bounce* next;
    void* p;
    size_t cap;
} _ppn_bounce;

/* Eight channels, each a communicator with its own stream: messages to higher ranks and to
   lower ranks, each split again into activations and gradients, and again by the parity of the
   pair's lower rank (channel = direction + 2 * gradient + 4 * odd pair). NCCL runs a
   communicator's kernels one after another, so on a single communicator a send queued behind a
   receive waits for it: two neighbours that each send before they receive (interleaved
   schedules do) would wait for each other. Split by direction, a pair's two directions never
   queue behind each other. Split by kind, a pair's messages on one channel are those of one
   kind, which every stage sends and receives in ascending micro-batch order: the V-shaped
   schedules, whose two chunks send each neighbour activations and gradients in orders that
   differ between the two sides, match in order per channel (pp_nccl_check_order). Split by pair,
   a rank's sends to one neighbour and its receives from the other (both activations going up,
   say) are not in one group, which NCCL completes as a whole: with four channels ZB-H2 generated
   for F, B, W = 1, 2, 1 waited in a cycle in 90 of 168 cases (pp_nccl_check_rendezvous). */
#define _PPN_MAXCH 8
#define _PPN_TP_RING 16 /* TP collectives tracked by age (more: the newest share a slot) */
struct pp_nccl {
    ncclComm_t comm;            /* the caller's: channel 0 and the all-reduce */
    ncclComm_t ch_comm[_PPN_MAXCH]; /* [0] = comm, the others splits of it */
    int own_comm, rank, size, aborted, in_group, group_sends;
    int nch, nch_made, nch_auto; /* channels in use (1, 2, 4 or 8) and made; auto: the fewest the schedules pass */
    int nch_checked;            /* auto: a schedule was checked (before, all made are in use) */
    cudaStream_t compute, stream;   /* stream: channel 0's (and the all-reduce's) */
    cudaStream_t ch_stream[_PPN_MAXCH];
    _ppn_op *head, *tail;       /* live ops in posting order; the queued ones have no batch */
    int n_queued[_PPN_MAXCH];
    _ppn_batch* outstanding;    /* issued batches not yet seen complete */
    uint64_t batch_seq[_PPN_MAXCH];  /* batches issued so far, per channel */
    uint64_t waited_seq[_PPN_MAXCH]; /* the last batch of each channel the compute stream waited for */
    uint64_t done_seq[_PPN_MAXCH];   /* every batch of the channel up to this one is complete */
    uint64_t busy_seq[_PPN_MAXCH], busy_at[_PPN_MAXCH]; /* a batch of the channel seen running, and 1 + the epoch then */
    uint64_t epoch;             /* issues so far: one per _ppn_flush_all, one per flush outside it */
    cudaEvent_t ready;          /* recorded on the compute stream at every flush (a wait keeps its record) */
    cudaEvent_t tp_done;        /* recorded after the last stream-ordered TP collective (pp_nccl_tp_*) */
    int tp_pending;             /* 1: one was enqueued since pp_nccl_step_end last saw them done */
    /* the TP collectives not yet seen done, oldest at tp_head: a record after each, and when it
       was enqueued (full: the newest slot is recorded again, keeping its time) (_ppn_tp_due) */
    cudaEvent_t tp_ev[_PPN_TP_RING];
    double tp_at[_PPN_TP_RING];
    int tp_head, tp_n;
    struct pp_nccl* tp_link;    /* a grid's TP transport, whose collectives run on this one's compute stream */
    uint64_t ready_n;           /* records of it so far */
    uint64_t ch_ready[_PPN_MAXCH]; /* the last of them channel ch's stream waited for */
    _ppn_rel* rel;              /* free blocks of the stage's pool, by base */
    int n_rel, cap_rel;
    int sched_s, sched_m;       /* the checked schedule's stages and micro-batches (0: none, -1: several differ) */
    int* order;                 /* [key]: what _ppn_op.order says, by message (_ppn_key) */
    int* proven;                /* [peer]: the latest action of the peer whose message the compute stream waited for */
    int in_flush_all, ready_fresh; /* within _ppn_flush_all: ready is recorded once for every channel's group */
    cudaEvent_t* free_ev;       /* completion events of released batches, for reuse */
    int n_free_ev, cap_free_ev;
    _ppn_bounce* bounce;        /* free device bounce buffers (host-memory messages) */
    _ppn_bounce* pinned;        /* free pinned host buffers (host-memory all-reduces started) */
    const void* dev_cache[_PPN_DEV_CACHE];  /* 1 + page numbers known to be device memory (_ppn_is_host) */
    const void* host_cache[_PPN_DEV_CACHE]; /* and known to be host memory */
    uint64_t bytes_sent, msgs_sent;
#ifdef PP_NCCL_TEST_COPY_STREAM /* negative control (build/nccl-controls): a stream of its own for them */
    cudaStream_t copy_stream;   /* host receives' copies out of their bounce buffers (_ppn_unstage) */
    cudaEvent_t copy_ev;
#endif
    unsigned char conn[_PPN_MAXCH][PP_MAX_RANKS]; /* set up: 1 a send to the rank, 2 a receive from it (_ppn_connect) */
    /* [rank]: what the checked schedules exchange with it, bit 1 << (2 * kind + dir) (kind 1:
       gradients, dir 1: received); _ppn_connect sets up those pairs on their channels */
    unsigned char want[PP_MAX_RANKS];
    int nch_max;                /* the most channels it may run (made at the first check, auto) */
    int queues_held;            /* pp_nccl_desc.queues_held: queues the rank's other streams hold */
    int coll_only, planned;     /* pp_nccl_desc.collective_only; a schedule was checked (or all set up) */
    int colls_warmed, coll_conn, p2p_lazy; /* warm-up all-reduces; ring connections made; pairs NCCL made at first use */
    void* warm_buf;             /* the warm-up all-reduce's device element */
    double timeout_s;           /* pp_nccl_desc.timeout_s, resolved */
    char err[256];
};

static void _ppn_note(pp_nccl* t, const char* what, const char* detail) {
    snprintf(t->err, sizeof t->err, "rank %d: %s: %s", t->rank, what, detail ? detail : "");
}

static pp_result _ppn_cuda(pp_nccl* t, cudaError_t e, const char* what) {
    if (e == cudaSuccess) return PP_OK;
    _ppn_note(t, what, cudaGetErrorString(e));
    (void)cudaGetLastError();
    return e == cudaErrorMemoryAllocation ? PP_ERR_NOMEM : PP_ERR_TRANSPORT;
}

static pp_result _ppn_nccl(pp_nccl* t, ncclResult_t r, const char* what) {
    if (r == ncclSuccess || r == ncclInProgress) return PP_OK;
    _ppn_note(t, what, ncclGetErrorString(r));
    return PP_ERR_TRANSPORT;
}

static void _ppn_abort_comm(pp_nccl* t) {
    int ch;
    if (!t->aborted) {
        t->aborted = 1;
        ncclCommAbort(t->comm);
        for (ch = 1; ch < t->nch_made; ch++) ncclCommAbort(t->ch_comm[ch]);
    }
}
#define _PPN_COMM(t, ch) ((t)->ch_comm[ch])
/* The channel counts pp_nccl_desc.channels and pp_nccl_check_rendezvous take. */
#define _PPN_CHANNELS_OK(n) ((n) == 1 || (n) == 2 || (n) == 4 || (n) == 8)
#define _PPN_STREAM(t, ch) ((t)->ch_stream[ch])

/* The channel of a message between this rank (me) and peer: its direction (0: to the higher
   rank), with four channels or more its kind (grad: a gradient), with eight the parity of the
   pair's lower rank. A pure function of the pair and the message: both sides pick the same one,
   and the rendezvous check (_ppn_rdv_post) the same as the transport. */
static int _ppn_channel_of(int nch, int me, int is_recv, int peer, int grad) {
    int lo = peer < me ? peer : me;
    return (nch >= 2 && (is_recv ? peer > me : peer < me)) + (nch >= 4 && grad ? 2 : 0) + (nch == 8 && (lo & 1) ? 4 : 0);
}
/* The executor's data tags carry the kind in their direction bit; the library's own tags count
   as activations. */
static int _ppn_channel(int nch, int me, int is_recv, int peer, int tag) {
    return _ppn_channel_of(nch, me, is_recv, peer, tag >= 0 && tag < _PP_TAG_RESERVED && (tag >> _PP_GEN_BITS & 1));
}

/* An executor's data message (pipeline.h's _pp_tag: direction, micro-batch, boundary, tensor)
   as an index into order[]: (micro-batch * stages + boundary) * 2 + direction, the tensor left
   out (a boundary's tensors travel together); -1 for the library's own tags or another step
   shape than the checked schedule's. */
static int _ppn_key(const pp_nccl* t, int tag) {
    int v;
    if (tag < 0 || tag >= _PP_TAG_RESERVED || t->sched_s < 1) return -1;
    v = tag >> _PP_GEN_BITS;
    v = (v >> 1) / (PP_MAX_TENSORS + 1) * 2 + (v & 1);
    return v < 2 * t->sched_s * t->sched_m ? v : -1;
}

static void _ppn_sleep_us(long us) {
    struct timespec ts;
    ts.tv_sec = us / 1000000L;
    ts.tv_nsec = (us % 1000000L) * 1000L;
    nanosleep(&ts, NULL);
}

/* Polls a communicator's state (ncclCommGetAsyncError) every sleep_us until it leaves
   ncclInProgress or the deadline passes: ncclSuccess, its error, or ncclInProgress at the
   deadline. Non-blocking init, splits and group launches all end this way. */
static ncclResult_t _ppn_comm_wait(ncclComm_t c, double deadline, long sleep_us) {
    for (;;) {
        ncclResult_t st = ncclSuccess;
        if (ncclCommGetAsyncError(c, &st) != ncclSuccess) st = ncclInternalError;
        if (st != ncclInProgress || _pp_now() > deadline) return st;
        _ppn_sleep_us(sleep_us);
    }
}

/* 1 for host memory. The executor sends from and receives into the same pooled device blocks
   step after step, and its step metadata (the plan check) lives in the same host buffers step
   after step, so answers are remembered (direct-mapped caches: of the 4 KiB pages known to be
   device memory, so a block's offsets share one answer, and of host pointers): under unified
   addressing the driver reserves device addresses, so one never becomes host memory while the
   process lives, nor a host address device memory, and a page is one or the other
   (tests/fakecuda reserves an arena the same way). */
static int _ppn_is_host(pp_nccl* t, const void* p) {
    struct cudaPointerAttributes a;
    uintptr_t page = (uintptr_t)p >> 12;
    const void* pg = (const void*)(page + 1); /* dev_cache holds pages: a block's offsets share its pages */
    size_t h = (size_t)(((uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15ull) >> 56) % _PPN_DEV_CACHE; /* blocks are aligned: mix */
    size_t hp = (size_t)(((uint64_t)page * 0x9E3779B97F4A7C15ull) >> 56) % _PPN_DEV_CACHE;
    if (t->dev_cache[hp] == pg) return 0;
    if (t->host_cache[h] == p) return 1;
    memset(&a, 0, sizeof a);
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError(); /* clear: an unregistered host pointer is not an error */
        t->host_cache[h] = p;
        return 1;
    }
    if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged) {
        t->host_cache[h] = p;
        return 1;
    }
    t->dev_cache[hp] = pg;
    return 0;
}

/* An event goes back to the pool: recording it again is safe once the waits enqueued on it
   are (each keeps the record it was enqueued for). */
static void _ppn_ev_put(pp_nccl* t, cudaEvent_t ev) {
    if (!ev) return;
    if (t->n_free_ev == t->cap_free_ev) {
        int cap = t->cap_free_ev ? 2 * t->cap_free_ev : 16;
        cudaEvent_t* nv = (cudaEvent_t*)PP_MALLOC(sizeof(cudaEvent_t) * (size_t)cap);
        if (nv) {
            if (t->n_free_ev) memcpy(nv, t->free_ev, sizeof(cudaEvent_t) * (size_t)t->n_free_ev);
            PP_FREE(t->free_ev);
            t->free_ev = nv;
            t->cap_free_ev = cap;
        }
    }
    if (t->n_free_ev < t->cap_free_ev) t->free_ev[t->n_free_ev++] = ev;
    else cudaEventDestroy(ev); /* CUDA releases it once its record completed */
}

static void _ppn_batch_release(pp_nccl* t, _ppn_batch* b) {
    if (b && --b->refs == 0) {
        _ppn_ev_put(t, b->done);
        PP_FREE(b);
    }
}

/* A device bounce buffer (pinned 1: a pinned host buffer) of at least n bytes, reused across
   messages (cudaMalloc can synchronise the device: only while the pool grows). */
static pp_result _ppn_bounce_get(pp_nccl* t, int pinned, size_t n, void** p, size_t* cap) {
    _ppn_bounce **bp, *b;
    for (bp = pinned ? &t->pinned : &t->bounce; (b = *bp) != NULL; bp = &b->next)
        if (b->cap >= n) {
            *bp = b->next;
            *p = b->p;
            *cap = b->cap;
            PP_FREE(b);
            return PP_OK;
        }
    *cap = n < 256 ? 256 : n;
    if (pinned) return _ppn_cuda(t, cudaMallocHost(p, *cap), "cudaMallocHost (staging buffer)");
    return _ppn_cuda(t, cudaMalloc(p, *cap), "cudaMalloc (bounce buffer)");
}

/* Frees a list of bounce buffers (pinned 1: pinned host buffers). */
static void _ppn_bounce_drop(_ppn_bounce** list, int pinned) {
    while (*list) {
        _ppn_bounce* b = *list;
        *list = b->next;
        if (pinned) cudaFreeHost(b->p);
        else cudaFree(b->p);
        PP_FREE(b);
    }
}

static void _ppn_bounce_put(pp_nccl* t, int pinned, void* p, size_t cap) {
    _ppn_bounce *b = (_ppn_bounce*)_pp_calloc(1, sizeof *b), **list;
    if (!b) {
        if (pinned) cudaFreeHost(p);
        else cudaFree(p);
        return;
    }
    b->p = p;
    b->cap = cap;
    list = pinned ? &t->pinned : &t->bounce;
    b->next = *list;
    *list = b;
}

static void _ppn_op_free(pp_nccl* t, _ppn_op* op) {
    if (op->prev) op->prev->next = op->next;
    else t->head = op->next;
    if (op->next) op->next->prev = op->prev;
    else t->tail = op->prev;
    if (!op->batch && op->peer != t->rank) t->n_queued[op->ch]--;
    if (op->host && op->dev) _ppn_bounce_put(t, 0, op->dev, op->dev_cap);
    if (op->pinned) _ppn_bounce_put(t, 1, op->pinned, op->pinned_cap);
    _ppn_batch_release(t, op->batch);
    PP_FREE(op);
}

/* A non-blocking communicator enqueues a group's kernels in the background: wait until it
   has (ncclCommGetAsyncError leaves ncclInProgress) before recording anything after them. */
static pp_result _ppn_settle_comm(pp_nccl* t, ncclComm_t comm, const char* what, double deadline) {
    ncclResult_t st = _ppn_comm_wait(comm, deadline, 20);
    if (st == ncclSuccess) return PP_OK;
    _ppn_note(t, what, st == ncclInProgress ? "the communicator did not finish enqueueing" : ncclGetErrorString(st));
    return st == ncclInProgress ? PP_ERR_TIMEOUT : PP_ERR_TRANSPORT;
}

/* An event for a batch's completion: from the pool, or a new one. */
static pp_result _ppn_ev_get(pp_nccl* t, cudaEvent_t* ev) {
    if (t->n_free_ev) {
        *ev = t->free_ev[--t->n_free_ev];
        return PP_OK;
    }
    return _ppn_cuda(t, cudaEventCreateWithFlags(ev, cudaEventDisableTiming), "cudaEventCreate");
}

/* Issues channel ch's queued ops from the oldest up to `last` (NULL: all) as one NCCL group on
   the channel's stream, after the compute stream's work so far (a send's producer, a receive
   block's earlier readers), and records the group's completion event. A group of device sends
   alone records none: the compute stream never waits for it (a send is done for the executor
   once the compute stream waited for a later group of its channel, _ppn_test), and a host wait
   that asks for it gets one then (_ppn_event): one call fewer per such group, the sends of
   warm-up and cool-down and, with two channels, every action's send (interleaved schedules:
   6 calls per transfer to 5, bench/bench_imitation). */
static pp_result _ppn_flush(pp_nccl* t, int ch, _ppn_op* last) {
    _ppn_batch* b;
    _ppn_op *op, *end;
    cudaEvent_t ready = NULL;
    pp_result rc = PP_OK;
    ncclResult_t ge;
    ncclComm_t comm = _PPN_COMM(t, ch);
    cudaStream_t stream;
    int need_ev = 0, need_wait = 0;
    if (!t->n_queued[ch]) return PP_OK;
    if (!_PPN_STREAM(t, ch) && (rc = _ppn_cuda(t, cudaStreamCreateWithFlags(&t->ch_stream[ch], cudaStreamNonBlocking),
                                               "cudaStreamCreate (channel)")) != PP_OK) {
        t->ch_stream[ch] = NULL;
        return rc;
    }
    stream = _PPN_STREAM(t, ch);
    if (!t->in_flush_all) t->epoch++; /* _ppn_flush_all counts its channels' groups as one */
    if (t->aborted) return PP_ERR_ABORTED;
    end = last ? last->next : NULL;
    for (op = t->head; op != end; op = op->next)
        if (!op->batch && op->ch == ch && op->peer != t->rank) {
            if (op->is_recv || op->host) need_ev = 1;
            if (!op->is_recv || op->host || op->rel_at > t->ch_ready[ch]) need_wait = 1;
        }
    b = (_ppn_batch*)_pp_calloc(1, sizeof *b);
    if (!b) return PP_ERR_NOMEM;
    if (need_ev) rc = _ppn_ev_get(t, &b->done);
    if (rc == PP_OK && !t->ready) rc = _ppn_cuda(t, cudaEventCreateWithFlags(&t->ready, cudaEventDisableTiming), "cudaEventCreate");
    ready = t->ready;
    if (rc == PP_OK && need_wait) {
        if (!t->ready_fresh && (rc = _ppn_cuda(t, cudaEventRecord(ready, t->compute), "cudaEventRecord (compute)")) == PP_OK)
            t->ready_n++;
        t->ready_fresh = t->in_flush_all; /* the other channel's group of this flush waits for the same record */
        if (rc == PP_OK) rc = _ppn_cuda(t, cudaStreamWaitEvent(stream, ready, 0), "cudaStreamWaitEvent (compute)");
        if (rc == PP_OK) t->ch_ready[ch] = t->ready_n;
    }
    for (op = t->head; op != end && rc == PP_OK; op = op->next)
        if (!op->batch && op->ch == ch && op->peer != t->rank && op->host && !op->is_recv && op->bytes)
            rc = _ppn_cuda(t, cudaMemcpyAsync(op->dev, op->buf, op->bytes, cudaMemcpyHostToDevice, stream), "staging a host send");
    if (rc == PP_OK) rc = _ppn_nccl(t, ncclGroupStart(), "ncclGroupStart");
    if (rc == PP_OK) {
        for (op = t->head; op != end && rc == PP_OK; op = op->next) {
            if (op->batch || op->ch != ch || op->peer == t->rank) continue;
            if (op->is_recv) rc = _ppn_nccl(t, ncclRecv(op->dev, op->bytes, ncclUint8, op->peer, comm, stream), "ncclRecv");
            else rc = _ppn_nccl(t, ncclSend(op->dev, op->bytes, ncclUint8, op->peer, comm, stream), "ncclSend");
            if (rc == PP_OK) {
                op->batch = b;
                b->refs++;
                t->n_queued[ch]--;
            }
        }
        ge = ncclGroupEnd();
        if (rc == PP_OK) rc = _ppn_nccl(t, ge, "ncclGroupEnd");
#ifndef PP_NCCL_TEST_FLUSH_DEFAULT_TIMEOUT
        if (rc == PP_OK && ge == ncclInProgress) rc = _ppn_settle_comm(t, comm, "ncclGroupEnd (non-blocking)", _pp_now() + t->timeout_s);
#else /* negative control (build/nccl-controls): the library's default, not pp_nccl_desc.timeout_s */
        if (rc == PP_OK && ge == ncclInProgress) rc = _ppn_settle_comm(t, comm, "ncclGroupEnd (non-blocking)", _pp_now() + PP_DEFAULT_TIMEOUT_S);
#endif
    }
    /* a host receive's bytes out of its bounce buffer on the same stream, behind the group and
       ahead of the record: the record that says the group is done says the copy is, and no
       stream more takes a hardware queue (_ppn_queues_need) */
    for (op = t->head; op != end && rc == PP_OK; op = op->next)
        if (op->batch == b && op->host && op->is_recv && op->pinned)
            rc = _ppn_cuda(t, cudaMemcpyAsync(op->pinned, op->dev, op->bytes, cudaMemcpyDeviceToHost, stream), "unstaging a host receive");
    if (rc == PP_OK && b->done) rc = _ppn_cuda(t, cudaEventRecord(b->done, stream), "cudaEventRecord (group done)");
    if (b->refs == 0) {
        b->refs = 1;
        _ppn_batch_release(t, b); /* nothing went out: the event goes back to the pool */
    } else {
        b->ch = ch;
        b->seq = ++t->batch_seq[ch];
        b->not_ready_at = t->epoch + 1; /* just issued: it runs (a send waits for its receive) until the next issue */
        b->refs++; /* the outstanding list's */
        b->next = t->outstanding;
        t->outstanding = b;
    }
    if (rc != PP_OK) _ppn_abort_comm(t);
    return rc;
}

/* What tells a host wait that batch b, a group of device sends without an event, is done: the
   nearest later group of its channel that has one (*cover; a channel's groups complete in issue
   order), else an event recorded now on the channel's stream (after b and any later group of
   sends: exact when b is the channel's newest group). Either may answer later than b's own
   record would have; _ppn_wait's probes therefore give up at once where it is not exact. */
static _ppn_batch* _ppn_cover(const pp_nccl* t, const _ppn_batch* b) {
    _ppn_batch *x, *c = NULL;
    for (x = t->outstanding; x; x = x->next) /* newest first */
        if (x->ch == b->ch && x->seq > b->seq && x->done) c = x;
    return c;
}
static pp_result _ppn_event(pp_nccl* t, _ppn_batch* b, _ppn_batch** cover) {
    pp_result rc;
    if ((*cover = _ppn_cover(t, b)) != NULL) return PP_OK;
    if ((rc = _ppn_ev_get(t, &b->done)) != PP_OK) return rc;
    rc = _ppn_cuda(t, cudaEventRecord(b->done, _PPN_STREAM(t, b->ch)), "cudaEventRecord (sends done)");
    if (rc != PP_OK) {
        _ppn_ev_put(t, b->done);
        b->done = NULL;
    }
    return rc;
}

/* 1 when the batch is done, 0 while it runs; an error otherwise (NCCL's asynchronous error).
   A channel's batches complete in issue order, so neither a batch seen running nor a later one
   of its channel is asked again before the next issue (the step's end polls every batch left);
   a batch issued since then is not asked at all (its send waits for a receive the peer runs
   later, and "not yet" is always a safe answer). Only waits ask: _ppn_test never does. */
static pp_result _ppn_query(pp_nccl* t, _ppn_batch* b, int* done) {
    cudaError_t e;
    ncclResult_t ar = ncclSuccess;
    _ppn_batch* cover = NULL;
    pp_result rc;
    *done = 0;
    if (!b->complete && b->seq && b->seq <= t->done_seq[b->ch]) b->complete = 1;
    if (b->complete) {
        *done = 1;
        return PP_OK;
    }
#ifdef PP_NCCL_TEST_EVENTLESS_DONE /* negative control (build/nccl-controls): a group of sends is done when asked */
    if (!b->done) {
        b->complete = *done = 1;
        return PP_OK;
    }
#endif
    if (!b->done && (rc = _ppn_event(t, b, &cover)) != PP_OK) return rc;
    if (cover) { /* a later group of the channel: its completion is b's too */
        if ((rc = _ppn_query(t, cover, done)) == PP_OK && *done) b->complete = 1;
        return rc;
    }
    if (b->not_ready_at == t->epoch + 1) return PP_OK;
    /* a later batch than one seen running since the last flush is running too (issue order) */
    if (b->seq && t->busy_at[b->ch] == t->epoch + 1 && b->seq >= t->busy_seq[b->ch]) return PP_OK;
    e = cudaEventQuery(b->done);
    if (e == cudaSuccess) {
        b->complete = 1;
        if (b->seq > t->done_seq[b->ch]) t->done_seq[b->ch] = b->seq;
        *done = 1;
        return PP_OK;
    }
    b->not_ready_at = t->epoch + 1;
    if (b->seq && (t->busy_at[b->ch] != t->epoch + 1 || b->seq < t->busy_seq[b->ch])) {
        t->busy_seq[b->ch] = b->seq;
        t->busy_at[b->ch] = t->epoch + 1;
    }
    if (e != cudaErrorNotReady) return _ppn_cuda(t, e, "cudaEventQuery");
    if (ncclCommGetAsyncError(_PPN_COMM(t, b->ch), &ar) != ncclSuccess || (ar != ncclSuccess && ar != ncclInProgress)) {
        _ppn_note(t, "NCCL reported an asynchronous error", ncclGetErrorString(ar));
        return PP_ERR_TRANSPORT;
    }
    return PP_OK;
}

/* Polls b until it completes or the deadline passes. No abort here: a short wait is a probe. */
/* When the oldest stream-ordered TP collective not yet done (pp_nccl_tp_*) runs out of time: its
   enqueue plus the transport's timeout (a very large number where none is pending). Anything on
   this communicator runs after it (NCCL's launch order per communicator), so a host wait on it
   ends then too: a member that never came is found one deadline after the collective, not a
   deadline after each wait that queued behind it began. */
static double _ppn_tp_due(pp_nccl* t) {
    double due;
#ifdef PP_NCCL_TEST_TP_NO_DUE /* negative control (build/tp-controls): each wait its own deadline */
    return 1e300;
#endif
    if (t->aborted) t->tp_n = 0; /* NCCL's abort ended them */
    while (t->tp_n > 0) {
        cudaError_t e = cudaEventQuery(t->tp_ev[t->tp_head]);
        if (e != cudaSuccess) {
            if (e != cudaErrorNotReady) (void)cudaGetLastError();
            break;
        }
        t->tp_head = (t->tp_head + 1) % _PPN_TP_RING;
        t->tp_n--;
    }
    due = t->tp_n > 0 ? t->tp_at[t->tp_head] + t->timeout_s : 1e300;
    if (t->tp_link) { /* a collective on the compute stream holds what this transport waits for behind it too */
        double other = _ppn_tp_due(t->tp_link);
        if (other < due) due = other;
    }
    return due;
}

/* After a TP collective was enqueued on stream: its record in the ring. */
static pp_result _ppn_tp_track(pp_nccl* t, cudaStream_t stream) {
    int slot;
    (void)_ppn_tp_due(t); /* the done ones leave first */
    slot = (t->tp_head + (t->tp_n < _PPN_TP_RING ? t->tp_n : _PPN_TP_RING - 1)) % _PPN_TP_RING;
    if (!t->tp_ev[slot] && _ppn_cuda(t, cudaEventCreateWithFlags(&t->tp_ev[slot], cudaEventDisableTiming),
                                     "cudaEventCreate (TP collectives)") != PP_OK)
        return PP_ERR_TRANSPORT;
    if (_ppn_cuda(t, cudaEventRecord(t->tp_ev[slot], stream), "cudaEventRecord (TP collective)") != PP_OK)
        return PP_ERR_TRANSPORT;
    if (t->tp_n < _PPN_TP_RING) t->tp_at[slot] = _pp_now(), t->tp_n++;
    return PP_OK;
}

static pp_result _ppn_poll(pp_nccl* t, _ppn_batch* b, double deadline) {
    int done = 0, round = 0;
    pp_result rc;
    double due = _ppn_tp_due(t);
    if (due < deadline) deadline = due;
    /* seen running (or issued) since the last issue: sleep before the first question */
    int known_busy = !b->complete && !(b->seq && b->seq <= t->done_seq[b->ch]) && b->not_ready_at == t->epoch + 1;
    for (;; round++) {
        if (!known_busy || round > 0) {
            _ppn_batch* c = b->done ? NULL : _ppn_cover(t, b);
            b->not_ready_at = t->busy_at[b->ch] = 0; /* polling: ask every time */
            if (c) c->not_ready_at = 0;
            if ((rc = _ppn_query(t, b, &done)) != PP_OK || done) return rc;
        }
        if (t->aborted) return PP_ERR_ABORTED;
        if (_pp_now() > deadline) return PP_ERR_TIMEOUT;
        _ppn_sleep_us(round > 6 ? 500 : 8L << round); /* backing off: 8 us doubling to 500 */
    }
}

/* A message to this rank itself (the turn of a V map): the two sides meet in the op list, in
   posting order per tag, and the bytes move by a copy on the compute stream, where the
   producer ran before and the consumer runs after. */
static void _ppn_self_match(pp_nccl* t, _ppn_op* op) {
    _ppn_op* x;
    cudaError_t e;
    for (x = t->head; x; x = x->next)
        if (x != op && x->peer == t->rank && !x->self_done && x->is_recv != op->is_recv && x->tag == op->tag) break;
    if (!x) return;
    {
        _ppn_op *s = op->is_recv ? x : op, *r = op->is_recv ? op : x;
        pp_result rc = PP_OK;
        if (s->bytes != r->bytes) {
            snprintf(t->err, sizeof t->err, "rank %d sent itself %zu bytes with tag %d and posted a receive of %zu", t->rank,
                     s->bytes, s->tag, r->bytes);
            rc = PP_ERR_SIZE;
        } else if (s->bytes) {
            e = cudaMemcpyAsync(r->buf, s->buf, s->bytes, cudaMemcpyDefault, t->compute);
            if (e == cudaSuccess && (s->host || r->host)) e = cudaStreamSynchronize(t->compute); /* metadata */
            rc = _ppn_cuda(t, e, "copying a message to this rank itself");
        }
        s->self_done = r->self_done = 1;
        s->self_rc = r->self_rc = rc;
    }
}

static pp_result _ppn_flush_all(pp_nccl* t) {
    pp_result rc;
    int ch;
    t->in_flush_all = 1;
    t->epoch++;
    for (ch = 0, rc = PP_OK; ch < t->nch_made && rc == PP_OK; ch++) rc = _ppn_flush(t, ch, NULL);
    t->in_flush_all = t->ready_fresh = 0;
    return rc;
}

static pp_result _ppn_plan_all(pp_nccl* t, pp_error* err);
static pp_result _ppn_post(pp_nccl* t, int is_recv, int peer, int tag, void* buf, size_t bytes, pp_request* req) {
    _ppn_op* op;
    pp_result rc = PP_OK;
    if (!req || peer < 0 || peer >= t->size || (bytes && !buf)) return PP_ERR_INVALID;
    memset(req, 0, sizeof *req);
    if (t->aborted) return PP_ERR_ABORTED;
    if (!t->planned && !t->coll_only && peer != t->rank && t->size > 1) { /* no schedule checked: every pair */
        pp_result rp = _ppn_plan_all(t, NULL);
        if (rp != PP_OK) return rp;
    }
    if (!(op = (_ppn_op*)_pp_calloc(1, sizeof *op))) return PP_ERR_NOMEM;
    op->is_recv = is_recv;
    op->peer = peer;
    op->tag = tag;
    op->buf = buf;
    op->dev = buf;
    op->bytes = bytes;
    op->host = bytes ? _ppn_is_host(t, buf) : 0;
    op->ch = _ppn_channel(t->nch, t->rank, is_recv, peer, tag);
    op->rel_at = UINT64_MAX; /* not known to be free: the group waits for the compute stream */
    op->order = -1;
    if (tag == _PP_TAG_VERDICT) {
        /* the step agreement's verdict (rank 0 sends it to every rank at the end of every step,
           pipeline.h _pp_agree): the proofs of this step's actions (_ppn_proven) would be stale
           in the next, whose action indices start again. The transport resets them here itself,
           so a caller that skips pp_nccl_step_end cannot get stale ones; a proof forgotten early
           only leaves a send to the channel waits. */
        int q;
        for (q = 0; t->proven && q < t->size; q++) t->proven[q] = -1;
    }
    if (!op->host && t->order) {
        int key = _ppn_key(t, tag);
        op->order = key >= 0 ? t->order[key] : -1;
    }
    if (is_recv && !op->host) {
        int i;
        for (i = 0; i < t->n_rel; i++)
            if ((const char*)buf >= t->rel[i].p && (const char*)buf + bytes <= t->rel[i].p + t->rel[i].n) {
                op->rel_at = t->rel[i].at;
                break;
            }
    }
    if (op->host && peer != t->rank) {
        op->dev = NULL;
        rc = _ppn_bounce_get(t, 0, bytes, &op->dev, &op->dev_cap);
#if !defined(PP_NCCL_TEST_COPY_STREAM) && !defined(PP_NCCL_TEST_UNSTAGE_BLOCKING)
        if (rc == PP_OK && is_recv) rc = _ppn_bounce_get(t, 1, bytes, &op->pinned, &op->pinned_cap);
#endif
    }
    if (rc != PP_OK) {
        if (op->host && op->dev) _ppn_bounce_put(t, 0, op->dev, op->dev_cap);
        PP_FREE(op);
        return rc;
    }
    op->prev = t->tail;
    if (t->tail) t->tail->next = op;
    else t->head = op;
    t->tail = op;
    req->impl = op;
    req->id = tag;
    if (!is_recv) {
        t->bytes_sent += bytes;
        t->msgs_sent++;
    }
    if (peer == t->rank) {
        _ppn_self_match(t, op);
        return PP_OK;
    }
    t->n_queued[op->ch]++;
    if (!(t->conn[op->ch][peer] & (1 << (is_recv != 0)))) { /* NCCL sets it up in this message's group end */
        t->conn[op->ch][peer] |= (unsigned char)(1 << (is_recv != 0));
        t->p2p_lazy++;
    }
    if (!is_recv) {
        if (t->in_group) t->group_sends = 1;
#ifndef PP_NCCL_TEST_LATE_SENDS
        else rc = _ppn_flush_all(t);
#endif
    }
    return rc;
}

/* pp_transport.released: a free block of the stage's pool, whose uses all came before the next
   record of `ready` (bytes 0: forgotten; ptr NULL: all forgotten). A receive posted into it
   later needs no stream wait on its channel once that channel's stream waited for that record
   or a later one: a group of such receives alone then enqueues no record and no wait
   (_ppn_flush). With two channels (interleaved schedules) every action's receive goes in a
   group of its own on the other channel than its send: 5 calls per transfer to about 4.3
   (bench/bench_imitation; on the first and last ranks, whose receive channel carries no sends,
   the block is often newer than that channel's last wait). At most _PPN_MAX_REL blocks are
   remembered; one not remembered is waited for, as before. */
#define _PPN_MAX_REL 4096
static void _ppn_released(void* self, const void* ptr, size_t bytes) {
    pp_nccl* t = (pp_nccl*)self;
    int i;
    if (!ptr) { /* after a failed step */
        t->n_rel = 0;
        return;
    }
    for (i = 0; i < t->n_rel; i++)
        if (t->rel[i].p == (const char*)ptr) break;
    if (!bytes) {
        if (i < t->n_rel) t->rel[i] = t->rel[--t->n_rel];
        return;
    }
    if (i == t->n_rel) {
        if (t->n_rel == t->cap_rel) {
            int cap = t->cap_rel ? 2 * t->cap_rel : 64;
            _ppn_rel* nr = cap <= _PPN_MAX_REL ? (_ppn_rel*)PP_MALLOC(sizeof(_ppn_rel) * (size_t)cap) : NULL;
            if (!nr) return;
            if (t->n_rel) memcpy(nr, t->rel, sizeof(_ppn_rel) * (size_t)t->n_rel);
            PP_FREE(t->rel);
            t->rel = nr;
            t->cap_rel = cap;
        }
        t->n_rel++;
    }
    t->rel[i].p = (const char*)ptr;
    t->rel[i].n = bytes;
#ifdef PP_NCCL_TEST_RELEASED_NOW /* negative control (build/nccl-controls): free as of the last record */
    t->rel[i].at = t->ready_n;
#else
    t->rel[i].at = t->ready_n + 1;
#endif
}

static pp_result _ppn_isend(void* self, int peer, int tag, const void* buf, size_t bytes, pp_request* req) {
    return _ppn_post((pp_nccl*)self, 0, peer, tag, (void*)(uintptr_t)buf, bytes, req);
}

static pp_result _ppn_irecv(void* self, int peer, int tag, void* buf, size_t bytes, pp_request* req) {
    return _ppn_post((pp_nccl*)self, 1, peer, tag, buf, bytes, req);
}

static pp_result _ppn_group_start(void* self) {
    ((pp_nccl*)self)->in_group++;
    return PP_OK;
}

/* The end of an outermost group that posted a send issues everything queued, the receives
   posted ahead included: an action's sends travel in one NCCL group with the receives of the
   next action (Megatron's send-forward/receive-backward pairing), so two neighbours that each
   send and then receive meet inside one group on both sides instead of waiting for each other.
   A group of receives alone stays queued until the next send or wait. */
static pp_result _ppn_group_end(void* self) {
    pp_nccl* t = (pp_nccl*)self;
    if (t->in_group > 0) t->in_group--;
    if (t->in_group == 0 && t->group_sends) {
        t->group_sends = 0;
#ifndef PP_NCCL_TEST_LATE_SENDS
        return _ppn_flush_all(t);
#endif
    }
    return PP_OK;
}

/* The channel whose waits order the compute stream after a send of channel ch: ch itself. */
#ifdef PP_NCCL_TEST_WRONG_CHANNEL /* negative control (build/nccl-controls): another channel's waits */
#define _PPN_ORDER_CH(t, ch) (((ch) + 1) % (t)->nch)
#else
#define _PPN_ORDER_CH(t, ch) (ch)
#endif

/* 1 when the compute stream is ordered after issued send op: it waited for a group of the
   send's channel at least as late as the send's (_ppn_test); or, for a device send of the
   executor's data, for a message the peer sent at or after the action that receives this one
   (_ppn_proven). */
static int _ppn_send_ordered(const pp_nccl* t, const _ppn_op* op) {
    if (!op->batch || !op->batch->seq) return 0;
    if (op->batch->seq <= t->waited_seq[_PPN_ORDER_CH(t, op->ch)]) return 1;
#if defined(PP_NCCL_TEST_PROOF_ANY) /* negative control (build/nccl-controls): any message of the peer proves */
    if (op->order >= 0 && t->proven && t->proven[op->peer] >= 0) return 1;
#elif !defined(PP_NCCL_TEST_NO_PROOF) /* negative control (build/nccl-controls): the first and last ranks' pools grow */
    if (op->order >= 0 && t->proven && op->order <= t->proven[op->peer]) return 1;
#endif
    return 0;
}

/* The compute stream waited for device receive op, which its peer sent from action
   op->order of its list: every message this rank sent the peer that an action up to that one
   received has arrived by then, on the device. The peer's compute stream runs its actions in
   list order and waited for each such message at its receiving action; the group that sends
   op waited for a record of that stream after the sending action; and op's arrival completes
   the group this rank waited for. So those sends' blocks may be written again after this
   wait. This is what brings back, during the step, the blocks of the first and the last rank
   whose sends to one side travel on a channel that carries no receive for the compute stream
   to wait for (interleaved schedules; before, they came back at the step's end, and the pool
   held them all). Reset at every step's end (the agreement's verdict, _ppn_post; and
   pp_nccl_step_end). */
static void _ppn_proven(pp_nccl* t, const _ppn_op* op) {
    if (op->order >= 0 && t->proven && op->order > t->proven[op->peer]) t->proven[op->peer] = op->order;
}

static pp_result _ppn_done(pp_nccl* t, pp_request* req, _ppn_op* op, pp_result rc) {
    _ppn_op_free(t, op);
    req->impl = NULL;
    req->done = 1;
    return rc;
}

/* A device receive: the compute stream waits for its group, the host goes on (no host wait on
   data). A send the compute stream is already ordered after (_ppn_test) returns at once. A host
   receive (metadata) and another send: the host polls the group until the deadline; a send's
   timeout leaves it posted and the communicator alive (the executor probes sends with short
   waits), a receive's timeout aborts the communicator. pp_nccl_step_end waits for every group
   on the host. */
static pp_result _ppn_iallreduce_wait(pp_nccl* t, pp_request* req, _ppn_op* op, double dt, pp_error* err);
static pp_result _ppn_unstage(pp_nccl* t, _ppn_op* op, double deadline);
static pp_result _ppn_wait(void* self, pp_request* req, double timeout_s, pp_error* err) {
    pp_nccl* t = (pp_nccl*)self;
    _ppn_op* op = req ? (_ppn_op*)req->impl : NULL;
    double dt = timeout_s > 0 ? timeout_s : PP_DEFAULT_TIMEOUT_S, due;
    pp_result rc;
    int peer;
    if (!req) return _pp_fail(err, PP_ERR_INVALID, "wait on a NULL request");
    if (req->done || !op) return PP_OK;
    peer = op->peer;
    if (op->is_recv == 2 && !t->aborted) return _ppn_iallreduce_wait(t, req, op, dt, err);
    if (t->aborted)
        return _pp_fail(err, _ppn_done(t, req, op, PP_ERR_ABORTED), "rank %d: the NCCL communicator was aborted (%s)", t->rank,
                        t->err);
    if (peer == t->rank) {
        if (!op->self_done) /* only this thread could post the other side: it never will now */
            return _pp_fail(err, op->is_recv ? _ppn_done(t, req, op, PP_ERR_TIMEOUT) : PP_ERR_TIMEOUT,
                            "rank %d: a message to itself (tag %d) has no %s yet", t->rank, op->tag,
                            op->is_recv ? "send" : "receive");
        rc = op->self_rc;
        _ppn_done(t, req, op, rc);
        return rc == PP_OK ? PP_OK : _pp_fail(err, rc, "%s", t->err);
    }
    if (!op->batch && (rc = _ppn_flush(t, op->ch, op)) != PP_OK)
        return _pp_fail(err, _ppn_done(t, req, op, rc), "%s", t->err);
    if (op->is_recv && !op->host) {
        rc = PP_OK;
        if (t->waited_seq[op->ch] < op->batch->seq) { /* a channel's batches complete in issue order */
            rc = _ppn_cuda(t, cudaStreamWaitEvent(t->compute, op->batch->done, 0), "cudaStreamWaitEvent");
            if (rc == PP_OK) t->waited_seq[op->ch] = op->batch->seq;
        }
        if (rc == PP_OK) _ppn_proven(t, op);
        _ppn_done(t, req, op, rc);
        if (rc != PP_OK) _ppn_abort_comm(t);
        return rc == PP_OK ? PP_OK : _pp_fail(err, rc, "%s", t->err);
    }
    if (!op->is_recv && _ppn_send_ordered(t, op)) return _ppn_done(t, req, op, PP_OK);
    if (!op->is_recv && dt <= _PP_RETIRE_WAIT_S && !op->batch->done && op->batch->seq < t->batch_seq[op->ch] &&
        op->batch->seq > t->done_seq[op->ch]) /* a probe, and only later groups could answer (_ppn_event) */
        return _pp_fail(err, PP_ERR_TIMEOUT, "rank %d: a send to rank %d is not known to be done (a later group of its channel "
                        "would have to finish first)", t->rank, peer);
    rc = _ppn_poll(t, op->batch, _pp_now() + dt); /* or the TP collectives' due, earlier (_ppn_poll) */
    due = rc == PP_ERR_TIMEOUT ? _ppn_tp_due(t) : 1e300; /* which of the two ran out: asked before the abort below */
    if (rc == PP_ERR_TIMEOUT && !op->is_recv && dt <= _PP_RETIRE_WAIT_S) /* the executor's probe: no harm done */
        return _pp_fail(err, rc, "rank %d: a send to rank %d is not done after %.3g s", t->rank, peer, dt);
    if (rc == PP_OK && op->is_recv && op->bytes) rc = _ppn_unstage(t, op, _pp_now() + (dt > 0 ? dt : t->timeout_s));
    if (rc != PP_OK && op->pinned && op->is_recv == 1) op->pinned = NULL; /* its copy may still write it: leaked */
    _ppn_done(t, req, op, rc);
    if (rc == PP_OK) return PP_OK;
    _ppn_abort_comm(t);
    if (rc == PP_ERR_TIMEOUT && _pp_now() >= due)
        return _pp_fail(err, rc, "rank %d: a TP collective enqueued %.3g s ago never finished (a member that never came), and "
                        "the message from rank %d waited behind it (communicator aborted)", t->rank, _pp_now() - (due - t->timeout_s),
                        peer);
    if (rc == PP_ERR_TIMEOUT)
        return _pp_fail(err, rc, "rank %d waited %.3g s for rank %d over NCCL and got nothing (communicator aborted)", t->rank, dt,
                        peer);
    return _pp_fail(err, rc, "%s", t->err);
}

/* Never issues, waits or asks the device: a queued op is not done; a send is done as soon as
   the compute stream waited for its group or a later one of its channel (a receive's wait):
   every later write of the block is then ordered after the send on the device (the compute
   stream's own work, and every group issued later waits for a record of it), so the host may
   hand the block out again; or once a wait saw its group or a later one of its channel
   complete. Asking the device instead (cudaEventQuery) mostly heard "not yet" while the host
   runs ahead of the device, at one query per channel and action: 1.2 calls per transfer for
   interleaved schedules, whose sends to one side are ordered only two actions later, with the
   next receive from the other (bench/bench_imitation); the pool holds such a block a little
   longer instead. A device receive is reported by its wait (which orders the compute stream
   after it). NCCL's asynchronous errors surface at the next host wait (the step's end). */
static pp_result _ppn_test(void* self, pp_request* req, int* done) {
    pp_nccl* t = (pp_nccl*)self;
    _ppn_op* op = req ? (_ppn_op*)req->impl : NULL;
    pp_result rc;
    *done = 0;
    if (!req || req->done || !op) {
        *done = 1;
        return PP_OK;
    }
    if (op->peer == t->rank) {
        if (op->self_done && !op->is_recv) {
            rc = op->self_rc;
            *done = 1;
            _ppn_done(t, req, op, rc);
            return rc;
        }
        return PP_OK;
    }
    if (!op->batch || op->is_recv) return PP_OK;
#ifdef PP_NCCL_TEST_EARLY_REUSE /* negative control (build/nccl-controls): a send is done once issued */
    *done = 1;
#else
    if (_ppn_send_ordered(t, op) || (op->batch->seq && op->batch->seq <= t->done_seq[op->ch])) *done = 1;
#endif
    if (*done) _ppn_done(t, req, op, PP_OK);
    return PP_OK;
}

/* After a failed step: a queued receive is withdrawn; one already issued to NCCL cannot be
   (the communicator is aborted by then, which ends it). */
static pp_result _ppn_cancel(void* self, pp_request* req) {
    pp_nccl* t = (pp_nccl*)self;
    _ppn_op* op = req ? (_ppn_op*)req->impl : NULL;
    if (!op) return PP_OK;
    if (op->is_recv == 2 && !op->host && !t->aborted) {
        /* a started all-reduce of device memory runs on: whatever the compute stream does next
           with the buffer (zeroing it after a failed step) comes after it */
        (void)_ppn_cuda(t, cudaStreamWaitEvent(t->compute, op->batch->done, 0), "cudaStreamWaitEvent (all-reduce)");
        _ppn_done(t, req, op, PP_OK);
        return PP_OK;
    }
    if (op->batch && !t->aborted) return PP_ERR_UNSUPPORTED; /* a host all-reduce's bounce buffer too: kept until destroy */
    _ppn_done(t, req, op, PP_OK);
    return PP_OK;
}

/* Polls event ev until the work before it is done, or the deadline (then PP_ERR_TIMEOUT). */
static pp_result _ppn_event_wait(pp_nccl* t, cudaEvent_t ev, double deadline) {
    int done = 0, round = 0;
    pp_result rc = PP_OK;
    double due = _ppn_tp_due(t); /* a TP collective on the compute stream that ran out of time ends it too */
    if (due < deadline) deadline = due;
    for (;;) {
        _ppn_batch b;
        memset(&b, 0, sizeof b);
        b.done = ev;
        if ((rc = _ppn_query(t, &b, &done)) != PP_OK || done) return rc;
        if (_pp_now() > deadline) {
            _ppn_note(t, "timeout", "all-reduce did not complete; communicator aborted");
            return PP_ERR_TIMEOUT;
        }
        if (++round > 100) _ppn_sleep_us(round > 1000 ? 500 : 20);
    }
}

/* A host receive's bytes, once its group is done: its group's stream copied them into the op's
   pinned buffer before the record the wait saw (_ppn_flush). Before, the copy went on a stream
   of the transport's own after the wait: one stream more than _ppn_queues_need counts, which
   took the compute stream's hardware queue at two channels on CUDA's default 8 (steps hung, by
   chance, over tests/fakecuda's shared queues). The negative controls keep the old ways. */
static pp_result _ppn_unstage(pp_nccl* t, _ppn_op* op, double deadline) {
#if defined(PP_NCCL_TEST_UNSTAGE_BLOCKING) /* negative control (build/nccl-controls): a blocking copy */
    (void)deadline;
    return _ppn_cuda(t, cudaMemcpy(op->buf, op->dev, op->bytes, cudaMemcpyDeviceToHost), "unstaging a host receive");
#elif defined(PP_NCCL_TEST_COPY_STREAM) /* negative control (build/nccl-controls): a stream of its own */
    pp_result rc = PP_OK;
    void* pin = NULL;
    size_t cap = 0;
    if (!t->copy_stream) rc = _ppn_cuda(t, cudaStreamCreateWithFlags(&t->copy_stream, cudaStreamNonBlocking), "cudaStreamCreate (unstaging)");
    if (rc == PP_OK && !t->copy_ev) rc = _ppn_cuda(t, cudaEventCreateWithFlags(&t->copy_ev, cudaEventDisableTiming), "cudaEventCreate");
    if (rc == PP_OK) rc = _ppn_bounce_get(t, 1, op->bytes, &pin, &cap);
    if (rc == PP_OK)
        rc = _ppn_cuda(t, cudaMemcpyAsync(pin, op->dev, op->bytes, cudaMemcpyDeviceToHost, t->copy_stream), "unstaging a host receive");
    if (rc == PP_OK) rc = _ppn_cuda(t, cudaEventRecord(t->copy_ev, t->copy_stream), "cudaEventRecord");
    if (rc == PP_OK) rc = _ppn_event_wait(t, t->copy_ev, deadline);
    if (rc == PP_OK) memcpy(op->buf, pin, op->bytes);
    if (pin && rc != PP_ERR_TIMEOUT) _ppn_bounce_put(t, 1, pin, cap);
    return rc;
#else
    (void)t, (void)deadline;
    if (!op->pinned) return PP_ERR_INVALID;
    memcpy(op->buf, op->pinned, op->bytes);
    return PP_OK;
#endif
}

static pp_result _ppn_allreduce(void* self, void* buf, size_t count, pp_dtype dtype, const int* ranks, int n_ranks,
                                double timeout_s, pp_error* err) {
    pp_nccl* t = (pp_nccl*)self;
    int whole = _pp_ranks_whole(ranks, n_ranks, t->size), host;
    size_t bytes = count * pp_dtype_size(dtype);
    void* dev;
    double dt = timeout_s > 0 ? timeout_s : PP_DEFAULT_TIMEOUT_S, deadline = _pp_now() + dt;
    cudaEvent_t ev = NULL;
    pp_result rc = PP_OK;
    if (!whole) {
        pp_transport tr = pp_nccl_transport(t);
        return pp_allreduce_p2p(&tr, buf, count, dtype, ranks, n_ranks, timeout_s, err);
    }
    if (!buf || (dtype != PP_F32 && dtype != PP_F64))
        return _pp_fail(err, PP_ERR_INVALID, "all-reduce needs a buffer and an f32/f64 dtype");
    if (n_ranks == 1 || count == 0) return PP_OK;
    if (t->aborted) return _pp_fail(err, PP_ERR_ABORTED, "rank %d: the NCCL communicator was aborted", t->rank);
    if ((rc = _ppn_flush_all(t)) != PP_OK) return _pp_fail(err, rc, "%s", t->err);
    host = _ppn_is_host(t, buf);
    dev = buf;
    if (host) rc = _ppn_cuda(t, cudaMalloc(&dev, bytes), "cudaMalloc (all-reduce bounce)");
    if (rc == PP_OK) rc = _ppn_cuda(t, cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
    /* the gradients are complete when the compute stream gets here */
    if (rc == PP_OK) rc = _ppn_cuda(t, cudaEventRecord(ev, t->compute), "cudaEventRecord");
    if (rc == PP_OK) rc = _ppn_cuda(t, cudaStreamWaitEvent(t->stream, ev, 0), "cudaStreamWaitEvent");
    /* a copy from pageable host memory reads it when called, not in stream order: kernels still
       queued on the compute stream (a stage's last backward, when the all-reduce runs from the
       gradients-final hook) must have written it first. And such a copy blocks the host until
       the stream's earlier work is done (an all-reduce started before, whose peer never comes):
       that is waited for here, under the deadline, not inside the copy */
    if (rc == PP_OK && host) rc = _ppn_cuda(t, cudaEventRecord(ev, t->stream), "cudaEventRecord");
    if (rc == PP_OK && host) rc = _ppn_event_wait(t, ev, deadline);
    if (rc == PP_OK && host) rc = _ppn_cuda(t, cudaMemcpyAsync(dev, buf, bytes, cudaMemcpyHostToDevice, t->stream), "cudaMemcpyAsync");
    if (rc == PP_OK) {
        ncclResult_t ar = ncclAllReduce(dev, dev, count, dtype == PP_F32 ? ncclFloat32 : ncclFloat64, ncclSum, t->comm, t->stream);
        rc = _ppn_nccl(t, ar, "ncclAllReduce");
        if (rc == PP_OK) t->coll_conn = 1; /* NCCL set up its connections at the first (_ppn_warm) */
        /* a non-blocking communicator enqueues the kernel later: what follows must come after it */
        if (rc == PP_OK && ar == ncclInProgress) rc = _ppn_settle_comm(t, t->comm, "ncclAllReduce (non-blocking)", deadline);
    }
    /* the sum, under the deadline; then (host memory) the copy back, which no longer waits on NCCL */
#ifdef PP_NCCL_TEST_COPY_UNTIMED /* negative control (build/dpfault-controls): the copy back waits on NCCL, untimed */
    if (rc == PP_OK && host) rc = _ppn_cuda(t, cudaMemcpyAsync(buf, dev, bytes, cudaMemcpyDeviceToHost, t->stream), "cudaMemcpyAsync");
#endif
    if (rc == PP_OK) rc = _ppn_cuda(t, cudaEventRecord(ev, t->stream), "cudaEventRecord");
    if (rc == PP_OK) rc = _ppn_event_wait(t, ev, deadline);
#ifndef PP_NCCL_TEST_COPY_UNTIMED
    if (rc == PP_OK && host) rc = _ppn_cuda(t, cudaMemcpyAsync(buf, dev, bytes, cudaMemcpyDeviceToHost, t->stream), "cudaMemcpyAsync");
#endif
    if (rc == PP_OK) rc = _ppn_cuda(t, cudaStreamWaitEvent(t->compute, ev, 0), "cudaStreamWaitEvent");
    /* a sum that did not come is ended first: cudaFree waits for the device, NCCL's kernel too */
    if (rc != PP_OK) _ppn_abort_comm(t);
    if (ev) cudaEventDestroy(ev);
    if (host && dev) cudaFree(dev);
    if (rc == PP_OK) return PP_OK;
    return _pp_fail(err, rc, "%s", t->err);
}

/* A host function of _ppn_iallreduce: host bytes copied in stream order (no CUDA call). */
static void _ppn_hcopy_run(void* user) {
    const _ppn_hcopy* c = (const _ppn_hcopy*)user;
    memcpy(c->dst, c->src, c->n);
}

/* pp_transport.iallreduce_sum: what _ppn_allreduce does over the whole communicator (the same
   bits: one ncclAllReduce of the same elements), started and left running. The all-reduce goes
   on channel 0's stream, a stream of this transport's own (the grid's dp transport: not the
   compute stream, nor any of the pipeline's), after a record of the compute stream, so it reads
   the gradients the work enqueued there so far wrote (the stage's last backward, when it is
   started from the gradients-final hook), and the host, the compute stream and the pipeline's
   communicators go on meanwhile. A device buffer is left to NCCL and the compute stream waits
   for the all-reduce at the wait. A host buffer (pageable: a copy from it reads it when called,
   not in stream order) travels in stream order too: a host function on the stream copies it
   into a pinned buffer once the stream got past the compute stream's record, then pinned to a
   device bounce buffer, the all-reduce, and back to the pinned buffer; the wait copies that
   into the caller's buffer (untouched until then). The host never waits for the compute
   stream here (that held each hook until the stage's kernels had run: the step grew). _ppn_wait completes it: it polls the completion event against its
   deadline and the communicator's asynchronous error, and aborts the communicator on a timeout
   or an error, as for a receive. Every rank starts its all-reduces in one order (NCCL matches a
   communicator's collectives by issue order). Anything else _ppn_allreduce does another way (a
   subset of ranks, f16) is PP_ERR_UNSUPPORTED: the caller calls allreduce_sum. */
static pp_result _ppn_iallreduce(void* self, void* buf, size_t count, pp_dtype dtype, const int* ranks, int n_ranks,
                                 pp_request* req) {
    pp_nccl* t = (pp_nccl*)self;
    _ppn_op* op;
    _ppn_batch* b;
    int whole = _pp_ranks_whole(ranks, n_ranks, t->size);
    double deadline = _pp_now() + t->timeout_s;
    pp_result rc = PP_OK;
    if (!req || !buf || count == 0) return PP_ERR_INVALID;
    memset(req, 0, sizeof *req);
    if (!whole || n_ranks < 2 || !t->stream || (dtype != PP_F32 && dtype != PP_F64)) return PP_ERR_UNSUPPORTED;
    if (t->aborted) return PP_ERR_ABORTED;
    if ((rc = _ppn_flush_all(t)) != PP_OK) return rc; /* what was posted before goes first on the communicator */
    op = (_ppn_op*)_pp_calloc(1, sizeof *op);
    b = (_ppn_batch*)_pp_calloc(1, sizeof *b);
    if (!op || !b) {
        PP_FREE(op);
        PP_FREE(b);
        return PP_ERR_NOMEM;
    }
    op->is_recv = 2; /* a collective: no peer, no channel queue */
    op->peer = -1;
    op->tag = -1;
    op->order = -1;
    op->buf = op->dev = buf;
    op->bytes = count * pp_dtype_size(dtype);
    op->host = _ppn_is_host(t, buf);
    op->batch = b;
    b->refs = 1;
    op->prev = t->tail; /* on the list from here on: _ppn_op_free takes it all back */
    if (t->tail) t->tail->next = op;
    else t->head = op;
    t->tail = op;
    if (op->host) {
        op->dev = NULL;
        rc = _ppn_bounce_get(t, 0, op->bytes, &op->dev, &op->dev_cap);
        if (rc == PP_OK) rc = _ppn_bounce_get(t, 1, op->bytes, &op->pinned, &op->pinned_cap);
    }
    if (rc == PP_OK) rc = _ppn_ev_get(t, &b->done);
    if (rc == PP_OK && !t->ready) rc = _ppn_cuda(t, cudaEventCreateWithFlags(&t->ready, cudaEventDisableTiming), "cudaEventCreate");
    if (rc == PP_OK && (rc = _ppn_cuda(t, cudaEventRecord(t->ready, t->compute), "cudaEventRecord (compute)")) == PP_OK)
        t->ready_n++;
#ifndef PP_NCCL_TEST_DP_UNORDERED /* negative control (build/nccl-controls): the all-reduce reads the gradients unordered */
    if (rc == PP_OK) rc = _ppn_cuda(t, cudaStreamWaitEvent(t->stream, t->ready, 0), "cudaStreamWaitEvent (compute)");
    if (rc == PP_OK) t->ch_ready[0] = t->ready_n;
#endif
    if (rc == PP_OK && op->host) {
        op->up.dst = op->pinned;
        op->up.src = buf;
        op->up.n = op->bytes;
        rc = _ppn_cuda(t, cudaLaunchHostFunc(t->stream, _ppn_hcopy_run, &op->up), "cudaLaunchHostFunc (staging an all-reduce)");
        if (rc == PP_OK)
            rc = _ppn_cuda(t, cudaMemcpyAsync(op->dev, op->pinned, op->bytes, cudaMemcpyHostToDevice, t->stream),
                           "staging an all-reduce");
    }
    if (rc == PP_OK) {
        ncclResult_t ar = ncclAllReduce(op->dev, op->dev, count, dtype == PP_F32 ? ncclFloat32 : ncclFloat64, ncclSum, t->comm,
                                        t->stream);
        rc = _ppn_nccl(t, ar, "ncclAllReduce");
        if (rc == PP_OK) t->coll_conn = 1; /* NCCL set up its connections at the first (_ppn_warm) */
        if (rc == PP_OK && ar == ncclInProgress) rc = _ppn_settle_comm(t, t->comm, "ncclAllReduce (non-blocking)", deadline);
    }
    if (rc == PP_OK && op->host)
        rc = _ppn_cuda(t, cudaMemcpyAsync(op->pinned, op->dev, op->bytes, cudaMemcpyDeviceToHost, t->stream),
                       "unstaging an all-reduce");
    if (rc == PP_OK) rc = _ppn_cuda(t, cudaEventRecord(b->done, t->stream), "cudaEventRecord (all-reduce done)");
    if (rc != PP_OK) {
        if (op->host) cudaStreamSynchronize(t->stream); /* the host function may still read op->up */
        _ppn_op_free(t, op);
        _ppn_abort_comm(t); /* the peers' all-reduce would wait for ours */
        return rc;
    }
    req->impl = op;
    req->id = -1;
    return PP_OK;
}

/* _ppn_wait of a started all-reduce (_ppn_iallreduce). */
static pp_result _ppn_iallreduce_wait(pp_nccl* t, pp_request* req, _ppn_op* op, double dt, pp_error* err) {
    pp_result rc = _ppn_poll(t, op->batch, _pp_now() + dt);
    if (rc == PP_OK && op->host) memcpy(op->buf, op->pinned, op->bytes);
    if (rc == PP_OK && !op->host) /* what the compute stream does next with the buffer comes after the sum */
        rc = _ppn_cuda(t, cudaStreamWaitEvent(t->compute, op->batch->done, 0), "cudaStreamWaitEvent (all-reduce)");
    _ppn_done(t, req, op, rc);
    if (rc == PP_OK) return PP_OK;
    _ppn_abort_comm(t);
    if (rc == PP_ERR_TIMEOUT)
        return _pp_fail(err, rc, "rank %d waited %.3g s for a data-parallel all-reduce over NCCL (communicator aborted)", t->rank,
                        dt);
    return _pp_fail(err, rc, "%s", t->err);
}

static void _ppn_abort(void* self, pp_result why, const char* msg) {
    pp_nccl* t = (pp_nccl*)self;
    char tmp[200];
    snprintf(tmp, sizeof tmp, "%s (%s)", pp_result_str(why), msg ? msg : "");
    _ppn_note(t, "aborted", tmp);
    _ppn_abort_comm(t);
}

static pp_result _ppn_check_order(const pp_schedule* s, int by_kind, pp_error* err);

static pp_result _ppn_check_channels(const pp_schedule* s, int nch, pp_error* err) {
    pp_result rc = _ppn_check_order(s, nch >= 4, err);
    return rc == PP_OK ? pp_nccl_check_rendezvous(s, nch, err) : rc;
}

/* order[] for this rank from schedule s (_ppn_op.order): for each message it sends, the index
   of the receiving action in the receiver's list; for each it receives, the sending action's
   in the sender's. A second schedule that differs (several stages on one transport) turns it
   off for good: sends are then done only by their channel's waits, as before. */
static void _ppn_order_build(pp_nccl* t, const pp_schedule* s) {
    int q, i, S = s->n_stages, *ord;
    size_t n = 2 * (size_t)(S > 0 ? S : 0) * (size_t)(s->m > 0 ? s->m : 0);
    if (t->sched_s < 0) return;
    if (!n || n > (1u << 24) || !(ord = (int*)PP_MALLOC(sizeof(int) * n))) {
        t->sched_s = t->sched_m = -1; /* off: no table */
        PP_FREE(t->order);
        return;
    }
    for (i = 0; i < (int)n; i++) ord[i] = -1;
    for (q = 0; q < s->p && q < t->size; q++) {
        const pp_action* l = pp_schedule_rank(s, q);
        for (i = 0; l && i < s->per_rank; i++) {
            const pp_action* a = &l[i];
            int in = -1, out = -1, from = -1, to = -1; /* messages (keys) a receives and sends */
            if (a->op == PP_OP_F) {
                if (a->stage > 0 && a->prev_rank != q) in = (a->mb * S + a->stage) * 2, from = a->prev_rank;
                if (a->stage < S - 1 && a->next_rank != q) out = (a->mb * S + a->stage + 1) * 2, to = a->next_rank;
            } else if (a->op == PP_OP_B) {
                if (a->stage < S - 1 && a->next_rank != q) in = (a->mb * S + a->stage + 1) * 2 + 1, from = a->next_rank;
                if (a->stage > 0 && a->prev_rank != q) out = (a->mb * S + a->stage) * 2 + 1, to = a->prev_rank;
            }
            if (in >= 0 && from == t->rank) ord[in] = i;  /* this rank's send: received at q's action i */
            if (out >= 0 && to == t->rank) ord[out] = i;  /* this rank's receive: sent at q's action i */
        }
    }
    if (t->order && (t->sched_s != S || t->sched_m != s->m || memcmp(t->order, ord, sizeof(int) * n) != 0)) {
        t->sched_s = t->sched_m = -1; /* two schedules that differ: off */
        PP_FREE(t->order);
        PP_FREE(ord);
        return;
    }
    if (!t->proven && !(t->proven = (int*)PP_MALLOC(sizeof(int) * (size_t)t->size))) {
        PP_FREE(ord);
        return;
    }
    for (q = 0; q < t->size; q++) t->proven[q] = -1;
    PP_FREE(t->order);
    t->order = ord;
    t->sched_s = S;
    t->sched_m = s->m;
}

/* A set-up's wait (the connections' empty messages, the warm-up all-reduce): polls the
   transport's stream until its work is done, against the deadline; a failure NCCL reports on
   comm (a peer's exit over the network: ncclRemoteError) ends the wait at once. */
static pp_result _ppn_setup_wait(pp_nccl* t, ncclComm_t comm, double deadline, const char* what, const char* late) {
    for (;;) {
        cudaError_t e = cudaStreamQuery(t->stream);
        ncclResult_t ae = ncclSuccess;
        char why[96];
        if (e == cudaSuccess) return PP_OK;
#ifndef PP_NCCL_TEST_CONNECT_NO_ASYNC /* negative control (build/nccl-controls): a failure NCCL reported waits for the deadline */
        if (ncclCommGetAsyncError(comm, &ae) != ncclSuccess) ae = ncclInternalError;
#else
        (void)comm;
#endif
        if (e != cudaErrorNotReady) return _ppn_cuda(t, e, what);
        if (ae != ncclSuccess && ae != ncclInProgress) {
            snprintf(why, sizeof why, "%s (asynchronous error)", what);
            return _ppn_nccl(t, ae, why);
        }
        if (_pp_now() > deadline) {
            _ppn_note(t, "timeout", late);
            return PP_ERR_TIMEOUT;
        }
        _ppn_sleep_us(200);
    }
}

/* NCCL sets a pair up for point-to-point the first time it talks on a communicator, inside the
   outermost ncclGroupEnd, and the host stays there until the peer's host sets up the mirror
   connection (src/enqueue.cc p2pTaskAppend marks connectSend/connectRecv; src/group.cc
   groupLaunch runs src/transport.cc ncclTransportP2pSetup, which blocks in bootstrapRecv;
   NVIDIA/nccl#415). Left to first use, two ranks whose first messages go on different channels
   in opposite orders wait for each other there forever: the step agreement did at p >= 3 (rank
   r >= 2 first received rank 0's verdict on one channel while rank 0 first waited for r's
   outcome on another). So every connection a step uses is set up here, on every rank in the
   same order: channel by channel, each in one group of empty sends and receives, for each rank
   q and direction d the channel a message of kind k takes under nch channels, where want[q] has
   bit 2k + d (_ppn_schedule_want: what the checked schedules exchange), or every one (want
   NULL: every pair, both ways, both kinds). Each connection holds NCCL's buffers on the GPU
   (PP_NCCL_CONN_BYTES), hence the want. Each channel's group waits for every rank's, so no
   set-up can wait in a cycle. Called at the schedule check (pp_stage_create, collective; again
   when a later check changes the count), and for every pair at a transport's first message when
   nothing was checked (_ppn_plan_all); a connection made stays. */
static pp_result _ppn_connect(pp_nccl* t, int nch, const unsigned char* want, pp_error* err) {
    int ch, q, d, k;
    pp_result rc = PP_OK;
    double deadline = _pp_now() + t->timeout_s;
#ifdef PP_NCCL_TEST_NO_PRECONNECT /* negative control (build/nccl-controls): NCCL's lazy set-up, at first use */
    (void)t, (void)nch, (void)want, (void)err, (void)deadline, (void)ch, (void)q, (void)d, (void)k;
    return PP_OK;
#endif
    for (ch = 0; ch < nch && rc == PP_OK; ch++) {
        unsigned char need[PP_MAX_RANKS];
        int any = 0;
        ncclResult_t ge;
        memset(need, 0, sizeof need);
        for (q = 0; q < t->size; q++)
            for (d = 0; d < 2 && q != t->rank; d++)
                for (k = 0; k < 2; k++)
                    if ((!want || (want[q] >> (2 * k + d) & 1)) && _ppn_channel_of(nch, t->rank, d, q, k) == ch &&
                        !(t->conn[ch][q] & (1 << d)))
                        need[q] |= (unsigned char)(1 << d);
        for (q = 0; q < t->size; q++) any |= need[q];
        if (!any) continue;
        rc = _ppn_nccl(t, ncclGroupStart(), "ncclGroupStart (connection set-up)");
        for (q = 0; q < t->size && rc == PP_OK; q++) {
            if (need[q] & 1) rc = _ppn_nccl(t, ncclSend(NULL, 0, ncclUint8, q, _PPN_COMM(t, ch), t->stream), "ncclSend (connection set-up)");
            if (rc == PP_OK && (need[q] & 2))
                rc = _ppn_nccl(t, ncclRecv(NULL, 0, ncclUint8, q, _PPN_COMM(t, ch), t->stream), "ncclRecv (connection set-up)");
        }
        ge = ncclGroupEnd();
        if (rc == PP_OK) rc = _ppn_nccl(t, ge, "ncclGroupEnd (connection set-up)");
        if (rc == PP_OK && ge == ncclInProgress) rc = _ppn_settle_comm(t, _PPN_COMM(t, ch), "connection set-up (non-blocking)", deadline);
        /* the empty messages: done once every peer's group ran */
        if (rc == PP_OK)
            rc = _ppn_setup_wait(t, _PPN_COMM(t, ch), deadline, "connection set-up",
                                 "connection set-up: a peer did not set up its side");
        for (q = 0; q < t->size && rc == PP_OK; q++) t->conn[ch][q] |= need[q];
    }
    if (rc == PP_OK) return PP_OK;
    _ppn_abort_comm(t);
    return _pp_fail(err, rc, "%s (connection set-up; communicators aborted)", t->err);
}

/* What schedule s has this rank exchange with each other rank (_ppn_connect's want, bits
   1 << (2 * kind + dir)): the activations and gradients of its actions and its peers', the plan
   check's records (both ways with every neighbour, on the activations' channels: the library's
   own tags count as activations, _ppn_channel) and the step agreement's star around rank 0 (both
   ways, pipeline.h >>impl-stage-agree), which also carries the step's identity and the tied
   pair's sum (rank 0 and the last stage's rank). Pure. */
static void _ppn_schedule_want(const pp_schedule* s, int me, int size, unsigned char* want) {
    int q, i;
    for (q = 0; q < s->p && q < size; q++) {
        const pp_action* l = pp_schedule_rank(s, q);
        for (i = 0; l && i < s->per_rank; i++) {
            const pp_action* a = &l[i];
            int to = -1, kind = 0; /* the message action a sends (q to `to`) */
            if (a->op == PP_OP_F && a->stage < s->n_stages - 1) to = a->next_rank;
            else if (a->op == PP_OP_B && a->stage > 0) to = a->prev_rank, kind = 1;
            if (to < 0 || to == q || to >= size) continue;
            if (q == me) want[to] |= (unsigned char)(1 << (2 * kind) | 1 | 2);      /* sends; the plan check both ways */
            if (to == me) want[q] |= (unsigned char)(1 << (2 * kind + 1) | 1 | 2);  /* receives */
        }
    }
    for (q = 1; q < size; q++) { /* the agreement: rank 0 and every rank, both ways */
        if (me == 0) want[q] |= 1 | 2;
        if (q == me) want[0] |= 1 | 2;
    }
}

/* Channels 1 .. n-1 that are not made yet: split from the communicator (collective: every rank
   checks the same schedules in the same order, pp_stage_create). */
#if NCCL_VERSION_CODE >= 21800
static pp_result _ppn_split(ncclComm_t parent, int color, int key, ncclComm_t* out, double deadline, const char* what,
                            int grid, pp_error* err);
#endif
static pp_result _ppn_make_channels(pp_nccl* t, int n, pp_error* err) {
    pp_result rc = PP_OK;
    while (t->nch_made < n && rc == PP_OK) {
#if NCCL_VERSION_CODE >= 21800
        char what[48];
        /* NULL config: they inherit the parent's, blocking included, which NCCL cannot report;
           whether they share the parent's launch queue is the parent's splitShare (refused at
           create), their own would matter only for splits of them, which are never made. */
        snprintf(what, sizeof what, "ncclCommSplit (channel %d)", t->nch_made);
        rc = _ppn_split(t->comm, 0, t->rank, &t->ch_comm[t->nch_made], _pp_now() + t->timeout_s, what, 0, err);
        if (rc == PP_OK) t->nch_made++;
        else t->ch_comm[t->nch_made] = NULL;
#else
        (void)err;
        rc = PP_ERR_UNSUPPORTED;
#endif
    }
    return rc;
}

/* A transport whose schedule was never checked (pp_transport.check_schedule cleared, or its
   messages used directly): at its first message (or at create, pp_nccl_desc.connect_all) every
   channel is made and every pair set up on every one, both ways (what create itself did before
   it waited for the check). Every rank's first message comes before its first wait, so each
   gets here. */
static pp_result _ppn_plan_all(pp_nccl* t, pp_error* err) {
    pp_result rc;
    t->planned = 1;
    rc = _ppn_make_channels(t, t->nch, err);
    if (rc != PP_OK) {
        _ppn_abort_comm(t);
        return rc;
    }
    return _ppn_connect(t, t->nch, NULL, err);
}

/* When the channels may run at once. Several channels rely on kernels of different
   communicators on one device progressing at the same time: ranks launch the channels' groups in
   different orders (interleaved p = 2: rank 0 its send on channel 0, then its receive on channel
   1; rank 1 the mirror). NCCL does not promise that (docs/userguide communicators.rst, "Using
   multiple NCCL communicators concurrently": without one launch order on every device "deadlocks
   could ensue"); it holds while each stream has a hardware queue of its own and the GPU has room
   for the kernels. Two things take it away for certain, and then the device runs the
   transport's kernels one after another in launch order, which one channel's check proves (one
   communicator's kernels run in issue order anyway), and more channels are refused:
   - NCCL_LAUNCH_ORDER_IMPLICIT=1: NCCL orders every communicator's launches on a device in host
     order (src/enqueue.cc, getImplicitOrder, ncclLaunchPrepare: context->launchOrder), each
     kernel waiting for the previous one's end where the runtime or driver predates CUDA 12.3
     (ncclImplicitOrderSerial) and for its start after (ncclImplicitOrderLaunch). The transport
     takes both as the first: a channel's kernel launched behind another's that waits for a peer
     is not proven to start.
   - Shared hardware queues (CUDA_DEVICE_MAX_CONNECTIONS, 8 by default; streams beyond share, and
     a queue runs nothing past another stream's earlier work: the CUDA guide's false
     dependencies). n channels make 1 + 3n streams on this device: the compute stream, each
     channel's stream, and for each channel's communicator NCCL's own two (deviceStream and
     hostStream, made at init [src/init.cc, ncclStrongStreamConstruct]; deviceStream waits for
     every kernel of its communicator [src/enqueue.cc, ncclLaunchFinish:
     ncclStreamAdvanceToEvent]). Over tests/fakecuda's queues, four channels at 8 queues hung once
     NCCL's streams were made too (build/nccl-ctl-old-queues). The rank makes no stream more: a
     host receive is copied out on its channel's stream (_ppn_flush), and pp_cuda's device ops
     make no side stream (pipeline_cuda.h makes one at its own transport's first early copy).
     With one more, two channels at 8 queues put a channel's stream on the compute stream's
     queue and steps hung by chance (test_nccl_pipeline's queues mode counts every stream).
     Ranks sharing a device in one process share its queues; the count is per rank. Streams
     beside the transport's (a grid's other communicators: pp_nccl_desc.queues_held) take
     queues too, and a channel's stream placed with one of them waits behind its work (an
     all-reduce waiting for its peers, deviceStream's wait for it): held are counted first.
     One channel needs no queue of its own: its kernels run in issue order, which its check
     proves; every stream on one queue runs each rank's work in issue order, and the ranks of
     a grid issue theirs in the same order per role. */
static int _ppn_queues_need(int n, int held) { return n <= 1 ? 1 : held + 1 + 3 * n; }
static int _ppn_queues(int* given) {
    const char* e = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    int q = e && *e ? atoi(e) : 8;
    if (given) *given = e && *e;
#ifdef PP_NCCL_TEST_QUEUES_UNCHECKED /* negative control (build/nccl-controls): any count accepted */
    q = 64;
#endif
    return q < 1 ? 1 : q;
}
static int _ppn_launch_ordered(void) {
    const char* e = getenv("NCCL_LAUNCH_ORDER_IMPLICIT");
#ifdef PP_NCCL_TEST_ORDER_IGNORED /* negative control (build/nccl-controls): the variable not read */
    e = NULL;
#endif
    return e && *e && atoi(e) != 0;
}
/* the most channels (1, 2, 4 or 8) that may run at once */
static int _ppn_channels_fit(int held) {
    int n = 8, q = _ppn_queues(NULL);
    if (_ppn_launch_ordered()) return 1;
#ifdef PP_NCCL_TEST_OLD_QUEUES /* negative control (build/nccl-controls): NCCL's own streams not counted */
    while (n > 1 && n + 1 > q) n /= 2;
    return n;
#endif
    while (n > 1 && _ppn_queues_need(n, held) > q) n /= 2;
    return n;
}
static pp_result _ppn_queues_ok(int n, int held, pp_error* err) {
    int given, q = _ppn_queues(&given);
    char others[160] = "";
    if (n <= _ppn_channels_fit(held)) return PP_OK;
    if (held > 0)
        snprintf(others, sizeof others, ", and %d the rank's other streams hold: queues_held", held);
    if (_ppn_launch_ordered())
        return _pp_fail(err, PP_ERR_UNSUPPORTED,
                        "%d channels: NCCL_LAUNCH_ORDER_IMPLICIT is set, so NCCL orders this device's kernels by host launch "
                        "(one at a time before CUDA 12.3), and the channels' groups are launched in different orders on "
                        "different ranks, which can hang. Unset it, or use pp_nccl_desc.channels = 1",
                        n);
    return _pp_fail(err, PP_ERR_UNSUPPORTED,
                    "%d channels need %d hardware work queues (the compute stream, and for each channel its stream and NCCL's "
                    "two of its communicator%s); CUDA_DEVICE_MAX_CONNECTIONS is %d%s: streams beyond share a queue and wait for "
                    "each other's work, which can hang this schedule. Set CUDA_DEVICE_MAX_CONNECTIONS=%d or more before the "
                    "process first uses CUDA, or pp_nccl_desc.channels = %d",
                    n, _ppn_queues_need(n, held), others, q, given ? "" : " (CUDA's default)", _ppn_queues_need(n, held),
                    _ppn_channels_fit(held));
}

/* The built-in kinds whose lists at p and m pass over nch channels, named into buf. */
static void _ppn_kinds_over(int p, int m, int nch, char* buf, size_t cap) {
    int k;
    size_t len = 0;
    buf[0] = 0;
    for (k = 0; k < PP_SCHED_KIND_COUNT && len + 1 < cap; k++) {
        pp_schedule_kind kind = (pp_schedule_kind)k;
        int v = pp_schedule_kind_v(kind, 2);
        size_t need = pp_schedule_size(kind, p, v, m);
        pp_action* a = need ? (pp_action*)PP_MALLOC(need * sizeof(pp_action)) : NULL;
        pp_schedule sc;
        if (a && pp_schedule_make(kind, p, v, m, a, need, &sc, NULL) == PP_OK && _ppn_check_channels(&sc, nch, NULL) == PP_OK)
            len += (size_t)snprintf(buf + len, cap - len, "%s%s", len ? ", " : "", pp_schedule_name(kind));
        PP_FREE(a);
    }
    if (!len) snprintf(buf, cap, "none");
}

/* pp_stage_create's check: NCCL matches by order, and its sends wait for their receives. With
   the default channels the transport then runs on the fewest channels every schedule checked
   so far passes over (1F1B, GPipe, ZB-H1 and ZB-H2 pass over one: each action's messages then
   go in one NCCL group instead of one per channel). Every rank checks the same schedules in
   the same order (pp_stage_create, collective), so all pick the same count; it only grows, so
   a stage made earlier on the same transport keeps what it passed. */
static pp_result _ppn_check_schedule(void* self, const pp_schedule* s, pp_error* err) {
    pp_nccl* t = (pp_nccl*)self;
    int n;
    pp_result rc0;
    /* a stage's forward-only list (pp_stage_eval) is checked like its training list, but its
       messages carry other tags (micro-batch + m), outside the order table (_ppn_key): the
       table stays the training list's */
    if (s && !s->forward_only) _ppn_order_build(t, s);
    if (!t->nch_auto) {
        if ((rc0 = _ppn_check_channels(s, t->nch, err)) != PP_OK) return rc0;
        n = t->nch;
    } else {
#ifdef PP_NCCL_TEST_ONE_CHANNEL /* negative control (build/nccl-controls): one channel, unchecked */
        (void)n;
        t->nch = t->nch_checked = 1;
        t->planned = 1;
        return _ppn_connect(t, 1, NULL, err);
#endif
        for (n = t->nch_checked ? t->nch : 1; n < t->nch_max; n *= 2)
            if (_ppn_check_channels(s, n, NULL) == PP_OK) break;
        if (n >= t->nch_max) {
            pp_result rc = _ppn_check_channels(s, t->nch_max, err);
            int more = t->nch_max * 2, most = t->size > 2 ? _PPN_MAXCH : 4; /* two ranks: one pair, one parity */
            if (rc == PP_OK) n = t->nch_max;
            while (rc != PP_OK && more <= most && _ppn_check_channels(s, more, NULL) != PP_OK) more *= 2;
            if (rc != PP_OK && more <= most && more > _ppn_channels_fit(t->queues_held)) {
                /* it runs over more channels than the device's queues leave room for: say what runs */
                char kinds[256];
                pp_error why;
                int fit = _ppn_channels_fit(t->queues_held);
                (void)_ppn_queues_ok(more, t->queues_held, &why);
                _ppn_kinds_over(s->p, s->m, fit, kinds, sizeof kinds);
                return _pp_fail(err, PP_ERR_UNSUPPORTED, "%s p=%d m=%d needs %d channels, and %d fit: %s. At p=%d m=%d these "
                                "run over %d: %s", pp_schedule_name(s->kind), s->p, s->m, more, fit, why.msg, s->p, s->m, fit, kinds);
            }
            if (rc != PP_OK) return rc;
        }
        if ((rc0 = _ppn_queues_ok(n, t->queues_held, err)) != PP_OK) return rc0;
        if ((rc0 = _ppn_make_channels(t, n, err)) != PP_OK) { /* collective: the peers would wait */
            _ppn_abort_comm(t);
            return rc0;
        }
        t->nch = n;
        t->nch_checked = 1;
    }
    if (t->size < 2) return PP_OK;
    if (s) _ppn_schedule_want(s, t->rank, t->size, t->want);
    t->planned = 1;
#ifdef PP_NCCL_TEST_CONNECT_ALL /* negative control (build/nccl-controls): every pair on every channel, as before */
    return _ppn_connect(t, n, NULL, err);
#endif
    /* the pairs this schedule adds, and those the fewer channels put on other communicators */
    return _ppn_connect(t, n, t->want, err);
}

pp_transport pp_nccl_transport(pp_nccl* t) {
    /* in pp_transport's order (pipeline.h's pp_threads_transport names the fields) */
    static const pp_transport ops = {NULL, 0, 0, _ppn_isend, _ppn_irecv, _ppn_wait, _ppn_test, _ppn_group_start,
                                     _ppn_group_end, _ppn_allreduce, _ppn_abort, _ppn_cancel, NULL, NULL, NULL,
                                     _ppn_check_schedule, 1, _ppn_released, _ppn_iallreduce};
    return _pp_transport_of(&ops, t, t ? t->rank : 0, t ? t->size : 0);
}

/* 1 unless the channels' splits would share their parent's launch queue (pp_nccl_desc.comm_shares_resources,
   or NCCL_COMM_SPLIT_SHARE_RESOURCES set to a non-zero number, as NCCL reads it). */
static int _ppn_share_ok(const pp_nccl_desc* d) {
    const char* e = getenv("NCCL_COMM_SPLIT_SHARE_RESOURCES");
#ifdef PP_NCCL_TEST_SHARE_UNCHECKED /* negative control (build/nccl-controls): shared queues accepted */
    (void)d, (void)e;
    return 1;
#endif
    return !d->comm_shares_resources && !(e && *e && strtol(e, NULL, 10) != 0);
}

/* NCCL sets up a communicator's collective connections (the ring, tree or NVLS its tuner picks
   for the call) inside the first collective's ncclGroupEnd, with the host held until every
   member gets there (src/group.cc groupLaunch, ncclPrepareTasksAndCollPreconnectFunc ->
   ncclCollPreconnect; src/enqueue.cc ncclPrepareTasks sets algoNeedConnect; src/init.cc
   runtimeConn = cuMemSupport && NCCL_RUNTIME_CONNECT, default 1). Left to the first step, that
   waits inside the step, and two communicators whose first collectives come in different orders
   on two ranks wait for each other. So create runs one all-reduce of one element per dtype the
   transport reduces in (f32 and f64: _ppn_allreduce, _ppn_iallreduce refuse the others; the
   algorithms NCCL may pick differ by dtype, NVLS among them), collective, in one order on every
   rank. The tuner picks by size too: an all-reduce far larger than one element may pick an
   algorithm this one did not (ring where this took a tree), which NCCL then connects at its first
   use; the imitation has one algorithm. */
static pp_result _ppn_warm(pp_nccl* t, pp_error* err) {
    static const ncclDataType_t types[2] = {ncclFloat32, ncclFloat64};
    double deadline = _pp_now() + t->timeout_s;
    pp_result rc;
    int k;
#ifdef PP_NCCL_TEST_NO_WARMUP /* negative control (build/nccl-controls): NCCL's lazy collective set-up, at first use */
    (void)types, (void)deadline, (void)rc, (void)k, (void)err;
    return PP_OK;
#endif
    if (t->size < 2) return PP_OK;
    rc = _ppn_cuda(t, cudaMalloc(&t->warm_buf, 8), "cudaMalloc (warm-up all-reduce)");
    if (rc == PP_OK) rc = _ppn_cuda(t, cudaMemsetAsync(t->warm_buf, 0, 8, t->stream), "cudaMemsetAsync (warm-up all-reduce)");
    for (k = 0; k < 2 && rc == PP_OK; k++) {
        ncclResult_t ar = ncclAllReduce(t->warm_buf, t->warm_buf, 1, types[k], ncclSum, t->comm, t->stream);
        rc = _ppn_nccl(t, ar, "ncclAllReduce (collective connection set-up)");
        if (rc == PP_OK && ar == ncclInProgress) rc = _ppn_settle_comm(t, t->comm, "collective connection set-up (non-blocking)", deadline);
        if (rc == PP_OK) t->colls_warmed++;
    }
    /* done once every member's all-reduce ran */
    if (rc == PP_OK)
        rc = _ppn_setup_wait(t, t->comm, deadline, "collective connection set-up",
                             "collective connection set-up: a member did not come to the warm-up all-reduce");
    if (rc == PP_OK) {
        t->coll_conn = 1;
        return PP_OK;
    }
    _ppn_abort_comm(t);
    return _pp_fail(err, rc, "%s (connection set-up; communicators aborted)", t->err);
}

pp_result pp_nccl_create(const pp_nccl_desc* d, pp_nccl** out, pp_error* err) {
    pp_nccl* t;
    cudaError_t e;
    if (!out) return _pp_fail(err, PP_ERR_INVALID, "output pointer is NULL");
    *out = NULL;
    if (!d || !d->comm) return _pp_fail(err, PP_ERR_INVALID, "pp_nccl_create needs a communicator");
    if (d->queues_held < 0) return _pp_fail(err, PP_ERR_INVALID, "queues_held = %d (streams: 0 or more)", d->queues_held);
    if (!(t = (pp_nccl*)_pp_calloc(1, sizeof *t))) return _pp_fail(err, PP_ERR_NOMEM, "NCCL transport");
    t->comm = d->comm;
    t->queues_held = d->queues_held;
    t->own_comm = d->own_comm;
    t->compute = d->compute;
    t->timeout_s = d->timeout_s > 0 ? d->timeout_s : PP_DEFAULT_TIMEOUT_S;
    if (ncclCommUserRank(t->comm, &t->rank) != ncclSuccess || ncclCommCount(t->comm, &t->size) != ncclSuccess) {
        PP_FREE(t);
        return _pp_fail(err, PP_ERR_TRANSPORT, "cannot read the communicator's rank and size");
    }
    if (t->size > PP_MAX_RANKS) {
        int n = t->size;
        PP_FREE(t);
        return _pp_fail(err, PP_ERR_INVALID, "communicator has %d ranks, PP_MAX_RANKS is %d", n, PP_MAX_RANKS);
    }
    t->nch = 1;
    t->ch_comm[0] = t->comm;
    if (d->channels != 0 && !_PPN_CHANNELS_OK(d->channels)) {
        PP_FREE(t);
        return _pp_fail(err, PP_ERR_INVALID, "channels = %d (0 for the default, 1, 2, 4 or 8)", d->channels);
    }
#if NCCL_VERSION_CODE >= 21800
    if (t->size > 1) t->nch = d->channels ? d->channels : t->size > 2 ? 8 : 4; /* two ranks: one pair, one parity */
    if (!d->channels && t->nch > _ppn_channels_fit(t->queues_held)) /* each stream a queue of its own */
        t->nch = _ppn_channels_fit(t->queues_held);
#endif
    t->coll_only = d->collective_only;
#ifdef PP_NCCL_TEST_DP_CHANNELS /* negative control (build/nccl-controls): all-reduce transports made like a pipeline's */
    t->coll_only = 0;
#endif
    if (t->coll_only) t->nch = 1; /* one communicator: the one given */
    /* Split children of a parent that shares resources take its sharedRes, and every launch on
       it waits for the previous kernel to finish (src/init.cc ncclCommSplit, commAlloc;
       src/enqueue.cc ncclLaunchPrepare): the channels would run one after another, and the
       schedules that need them at once (interleaved, the V shapes) would hang at the GPU. The
       variable overrides every config (src/init.cc envConfigOverride). One channel needs no split. */
    if (t->nch > 1 && !_ppn_share_ok(d)) {
        const char* var = getenv("NCCL_COMM_SPLIT_SHARE_RESOURCES");
        PP_FREE(t);
        return _pp_fail(err, PP_ERR_UNSUPPORTED,
                        "%s: split communicators would share one launch queue and the transport's channels would run one "
                        "after another (interleaved and V schedules hang); %s, or set pp_nccl_desc.channels = 1 (GPipe, "
                        "1F1B, ZB-H1, ZB-H2)",
                        d->comm_shares_resources ? "pp_nccl_desc.comm_shares_resources = 1" : "NCCL_COMM_SPLIT_SHARE_RESOURCES is set",
                        d->comm_shares_resources ? "give a communicator made with splitShare = 0" : var ? "unset it" : "");
    }
    if (d->channels > 1 && t->nch > 1) { /* a count given: it is the one in use (the default waits for the check) */
        pp_result rq = _ppn_queues_ok(t->nch, t->queues_held, err);
        if (rq != PP_OK) {
            PP_FREE(t);
            return rq;
        }
    }
    t->nch_max = t->nch;
    t->nch_made = 1;
    if ((e = cudaStreamCreateWithFlags(&t->ch_stream[0], cudaStreamNonBlocking)) != cudaSuccess) {
        PP_FREE(t);
        return _pp_fail(err, PP_ERR_TRANSPORT, "cudaStreamCreate: %s", cudaGetErrorString(e));
    }
    /* the other channels' streams at their first group (_ppn_flush): a stream that is never used
       still takes a hardware work queue (_ppn_queues_ok) */
    t->stream = t->ch_stream[0];
    /* the default: all until the first check, then the fewest (one channel because the queues
       leave room for no more is the default too: its refusals say so) */
    t->nch_auto = !d->channels && !t->coll_only && (t->nch > 1 || (t->size > 1 && _ppn_channels_fit(t->queues_held) < 8));
    {
        /* channels 1 ..: the same ranks in communicators of their own (collective); with the
           default count, only those the checked schedules need, made at the check */
        pp_result rc = t->nch_auto ? PP_OK : _ppn_make_channels(t, t->nch, err);
        if (rc == PP_OK && d->connect_all && !t->coll_only && t->size > 1) rc = _ppn_plan_all(t, err);
#ifdef PP_NCCL_TEST_DP_CHANNELS /* the all-reduce transports as before: every channel, every pair set up */
        if (rc == PP_OK && d->collective_only) rc = _ppn_make_channels(t, t->nch, err);
        if (rc == PP_OK && d->collective_only && t->size > 1) rc = _ppn_connect(t, t->nch, NULL, err);
        t->planned |= d->collective_only;
#endif
        if (rc == PP_OK) rc = _ppn_warm(t, err);
        if (rc != PP_OK) {
            t->own_comm = 0; /* the caller's communicator stays the caller's (aborted after a failed set-up) */
            pp_nccl_destroy(t);
            return rc;
        }
    }
    *out = t;
    return PP_OK;
}

pp_result pp_nccl_step_end(pp_nccl* t, double timeout_s, pp_error* err) {
    double deadline = _pp_now() + (timeout_s > 0 ? timeout_s : PP_DEFAULT_TIMEOUT_S);
    pp_result rc = PP_OK;
    int ch, queued = 0;
    if (!t) return _pp_fail(err, PP_ERR_INVALID, "transport is NULL");
    for (ch = 0; t->proven && ch < t->size; ch++) t->proven[ch] = -1; /* _ppn_proven holds within a step */
    if (t->aborted) return _pp_fail(err, PP_ERR_ABORTED, "rank %d: the NCCL communicator was aborted (%s)", t->rank, t->err);
    for (ch = 0; ch < t->nch_made; ch++) queued += t->n_queued[ch];
    if (queued) {
        /* posted and never waited for: issue them, so the peers' matching ops are not left hanging */
        if ((rc = _ppn_flush_all(t)) != PP_OK) return _pp_fail(err, rc, "%s", t->err);
    }
    while (t->outstanding && rc == PP_OK) {
        _ppn_batch* b = t->outstanding;
        rc = _ppn_poll(t, b, deadline);
        if (rc == PP_OK) {
            t->outstanding = b->next;
            _ppn_batch_release(t, b);
        }
    }
#ifndef PP_NCCL_TEST_TP_UNWAITED /* negative control (build/tp-controls): the TP collectives not waited for */
    if (rc == PP_OK && t->tp_pending && (rc = _ppn_event_wait(t, t->tp_done, deadline)) == PP_OK) t->tp_pending = 0;
#endif
    if (rc == PP_OK) return PP_OK;
    _ppn_abort_comm(t);
    if (rc == PP_ERR_TIMEOUT)
        return _pp_fail(err, rc, "rank %d: the step's NCCL transfers did not finish in %.3g s (communicator aborted)", t->rank,
                        timeout_s > 0 ? timeout_s : PP_DEFAULT_TIMEOUT_S);
    return _pp_fail(err, rc, "%s", t->err);
}

/* pp_nccl_tp_*: kind 0 all-reduce, 1 reduce-scatter, 2 all-gather. */
static pp_result _ppn_tp_coll(const pp_group* g, int kind, const void* send, void* recv, size_t count, pp_dtype dtype,
                              cudaStream_t stream, pp_error* err) {
    static const char* const names[3] = {"TP all-reduce", "TP reduce-scatter", "TP all-gather"};
    const char* what = names[kind];
    int n = pp_group_size(g);
    size_t es = pp_dtype_size(dtype), per;
    ncclDataType_t nt;
    ncclResult_t r;
    pp_nccl* t;
    pp_result rc;
    switch (dtype) {
    case PP_F32: nt = ncclFloat32; break;
    case PP_F64: nt = ncclFloat64; break;
    case PP_F16: nt = ncclFloat16; break;
#if NCCL_VERSION_CODE >= 21000
    case PP_BF16: nt = ncclBfloat16; break;
#endif
    default:
        return _pp_fail(err, PP_ERR_INVALID, "%s: dtype %s: f32, f64, f16 or bf16 only", what,
                        (int)dtype >= 0 && dtype < PP_DTYPE_COUNT ? pp_dtype_name(dtype) : "unknown");
    }
    if (count > 0 && (!send || !recv)) return _pp_fail(err, PP_ERR_INVALID, "%s: a NULL buffer for %zu elements", what, count);
    if (kind != 0 && n > 1 && count % (size_t)n)
        return _pp_fail(err, PP_ERR_INVALID, "%s: %zu elements do not split into %d equal blocks (NCCL's); pad the "
                        "tensor, or use pp_tp_* on host memory (uneven blocks)", what, count, n);
    per = count / (size_t)(n > 1 ? n : 1);
    if ((rc = _pp_tp_declared(n, what, err)) != PP_OK) return rc; /* a stage that agrees its outcome over the group */
    if (n <= 1 || count == 0) { /* no message; one rank: recv is send's own */
        if (n > 1 || !count || send == recv) return PP_OK;
        if (cudaMemcpyAsync(recv, send, count * es, cudaMemcpyDeviceToDevice, stream) == cudaSuccess) return PP_OK;
        return _pp_fail(err, PP_ERR_TRANSPORT, "%s: cudaMemcpyAsync: %s", what, cudaGetErrorString(cudaGetLastError()));
    }
    if (!g->t || g->t->isend != _ppn_isend || !g->t->self)
        return _pp_fail(err, PP_ERR_UNSUPPORTED, "%s of device memory: the group's transport is not pipeline_nccl.h's "
                        "(pp_nccl_grid.tp); pp_tp_* take host memory over any transport", what);
    t = (pp_nccl*)g->t->self;
    if (g->ranks && !_pp_ranks_whole(g->ranks, g->n_ranks, t->size))
        return _pp_fail(err, PP_ERR_UNSUPPORTED, "%s of device memory: the group is %d of the transport's %d ranks; NCCL's "
                        "collectives run over a whole communicator (pp_nccl_grid.tp holds one TP group)", what, n, t->size);
    if (t->aborted)
        return _pp_fail(err, PP_ERR_ABORTED, "rank %d: %s: the NCCL communicator was aborted (%s)", t->rank, what, t->err);
    if (_ppn_is_host(t, send) || _ppn_is_host(t, recv))
        return _pp_fail(err, PP_ERR_INVALID, "%s: host memory (device memory here; pp_tp_* take host memory)", what);
    /* what the transport holds posted goes first on the communicator, as on every member */
    if ((rc = _ppn_flush_all(t)) != PP_OK) return _pp_fail(err, rc, "%s", t->err);
    if (!t->tp_done)
        rc = _ppn_cuda(t, cudaEventCreateWithFlags(&t->tp_done, cudaEventDisableTiming), "cudaEventCreate (TP collectives)");
    if (rc != PP_OK) return _pp_fail(err, rc, "%s", t->err);
    r = kind == 0 ? ncclAllReduce(send, recv, count, nt, ncclSum, t->comm, stream)
        : kind == 1 ? ncclReduceScatter(send, recv, per, nt, ncclSum, t->comm, stream)
                    : ncclAllGather(send, recv, per, nt, t->comm, stream);
    rc = _ppn_nccl(t, r, what);
    /* a non-blocking communicator enqueues it later: the record must come after it */
    if (rc == PP_OK && r == ncclInProgress) rc = _ppn_settle_comm(t, t->comm, what, _pp_now() + t->timeout_s);
    if (rc == PP_OK) rc = _ppn_cuda(t, cudaEventRecord(t->tp_done, stream), "cudaEventRecord (TP collective)");
    if (rc == PP_OK) rc = _ppn_tp_track(t, stream);
#ifdef PP_NCCL_TEST_TP_HOST_WAIT /* negative control (build/tp-controls): the host waits for the collective */
    if (rc == PP_OK) rc = _ppn_event_wait(t, t->tp_done, _pp_now() + t->timeout_s);
#endif
    if (rc == PP_OK) {
        t->tp_pending = 1;
        return PP_OK;
    }
    _ppn_abort_comm(t); /* the members that enqueued theirs would wait for this one */
    return _pp_fail(err, rc, "%s: %s", what, t->err);
}

pp_result pp_nccl_tp_allreduce(const pp_group* g, void* buf, size_t count, pp_dtype dtype, cudaStream_t stream,
                               pp_error* err) {
    return _ppn_tp_coll(g, 0, buf, buf, count, dtype, stream, err);
}
pp_result pp_nccl_tp_reducescatter(const pp_group* g, const void* send, void* recv, size_t count, pp_dtype dtype,
                                   cudaStream_t stream, pp_error* err) {
    return _ppn_tp_coll(g, 1, send, recv, count, dtype, stream, err);
}
pp_result pp_nccl_tp_allgather(const pp_group* g, const void* send, void* recv, size_t count, pp_dtype dtype,
                               cudaStream_t stream, pp_error* err) {
    return _ppn_tp_coll(g, 2, send, recv, count, dtype, stream, err);
}

/* pp_nccl_destroy giving up on work past its deadline: the transport's communicators aborted
   (their kernels stop); 1 where the caller's communicator (own_comm = 0) keeps its work. */
static int _ppn_destroy_abort(pp_nccl* t) {
    int k, left = 0;
    t->aborted = 1;
    if (t->own_comm) ncclCommAbort(t->comm);
#ifndef PP_NCCL_TEST_DESTROY_FREES /* negative control (build/nccl-controls): frees what that work uses */
    else left = 1;
#endif
    for (k = 1; k < t->nch_made; k++) ncclCommAbort(t->ch_comm[k]);
    return left;
}

void pp_nccl_destroy(pp_nccl* t) {
    int ch, k, left = 0; /* left: the caller's communicator still runs work the deadline gave up on */
    double deadline;
    if (!t) return;
    deadline = _pp_now() + t->timeout_s;
    /* stream-ordered TP collectives (pp_nccl_tp_*) not seen done: until the deadline, then the abort ends them */
    if (t->tp_pending && !t->aborted && _ppn_event_wait(t, t->tp_done, deadline) != PP_OK) left = _ppn_destroy_abort(t);
#ifndef PP_NCCL_TEST_DESTROY_UNBOUNDED
    /* Each channel's work until pp_nccl_desc.timeout_s, as every host wait here: a transfer whose
       peer never came or failed ends in NCCL's abort of the transport's communicators (its
       kernels stop), not in a host held forever. The caller's communicator (own_comm = 0) is
       not the transport's to abort: its unfinished work stays with it (docs/errors.md). */
    for (ch = 0; ch < t->nch_made && !t->aborted; ch++) {
        while (t->ch_stream[ch]) {
            ncclResult_t ae = ncclSuccess;
            cudaError_t e = cudaStreamQuery(t->ch_stream[ch]);
            if (e == cudaSuccess) break;
            if (e == cudaErrorNotReady && ncclCommGetAsyncError(_PPN_COMM(t, ch), &ae) == ncclSuccess &&
                (ae == ncclSuccess || ae == ncclInProgress) && _pp_now() <= deadline) {
                _ppn_sleep_us(200);
                continue;
            }
            (void)cudaGetLastError();
            left = _ppn_destroy_abort(t);
            break;
        }
    }
#else /* negative control (build/nccl-controls): the wait without a deadline */
    (void)deadline;
    (void)k;
    (void)left;
    if (!t->aborted)
        for (ch = 0; ch < t->nch_made; ch++)
            if (t->ch_stream[ch]) cudaStreamSynchronize(t->ch_stream[ch]);
#endif
    while (t->head) _ppn_op_free(t, t->head);
    while (t->outstanding) {
        _ppn_batch* b = t->outstanding;
        t->outstanding = b->next;
        _ppn_batch_release(t, b);
    }
    while (t->n_free_ev) cudaEventDestroy(t->free_ev[--t->n_free_ev]);
    PP_FREE(t->free_ev);
    PP_FREE(t->rel);
    PP_FREE(t->order);
    PP_FREE(t->proven);
    if (t->ready) cudaEventDestroy(t->ready);
    if (t->tp_done) cudaEventDestroy(t->tp_done);
    for (k = 0; k < _PPN_TP_RING; k++)
        if (t->tp_ev[k]) cudaEventDestroy(t->tp_ev[k]);
#ifdef PP_NCCL_TEST_COPY_STREAM
    if (t->copy_ev) cudaEventDestroy(t->copy_ev);
    if (t->copy_stream) cudaStreamDestroy(t->copy_stream);
#endif
    if (t->warm_buf && !left) cudaFree(t->warm_buf); /* left: leaked like the staging buffers (below) */
    if (!left) {
        _ppn_bounce_drop(&t->bounce, 0);
        _ppn_bounce_drop(&t->pinned, 1);
    } else { /* the buffers leaked: that work may use them, and cudaFree/cudaFreeHost would wait for it */
        for (k = 0; k < 2; k++)
            while (k ? t->pinned : t->bounce) {
                _ppn_bounce* b = k ? t->pinned : t->bounce;
                if (k) t->pinned = b->next;
                else t->bounce = b->next;
                PP_FREE(b);
            }
    }
    for (ch = 0; ch < t->nch_made; ch++) {
        if (t->ch_stream[ch]) cudaStreamDestroy(t->ch_stream[ch]);
        if (ch > 0 && t->ch_comm[ch] && !t->aborted) ncclCommDestroy(t->ch_comm[ch]);
    }
    if (t->own_comm && !t->aborted) ncclCommDestroy(t->comm);
    PP_FREE(t);
}

cudaStream_t pp_nccl_comm_stream(const pp_nccl* t) { return t ? t->stream : NULL; }

int pp_nccl_channels(const pp_nccl* t) { return t ? t->nch : 0; }

void pp_nccl_counters(const pp_nccl* t, uint64_t* bytes, uint64_t* msgs) {
    if (bytes) *bytes = t ? t->bytes_sent : 0;
    if (msgs) *msgs = t ? t->msgs_sent : 0;
}

const char* pp_nccl_error(const pp_nccl* t) { return t ? t->err : "transport is NULL"; }

void pp_nccl_get_stats(const pp_nccl* t, pp_nccl_stats* out) {
    int ch, q;
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!t) return;
    out->comms = t->nch_made;
    out->channels = t->nch;
    for (ch = 0; ch < _PPN_MAXCH; ch++)
        for (q = 0; q < t->size; q++) {
            out->p2p_send_ch[ch] += t->conn[ch][q] & 1;
            out->p2p_recv_ch[ch] += t->conn[ch][q] >> 1 & 1;
        }
    for (ch = 0; ch < _PPN_MAXCH; ch++) {
        out->p2p_send += out->p2p_send_ch[ch];
        out->p2p_recv += out->p2p_recv_ch[ch];
    }
    out->p2p_lazy = t->p2p_lazy;
    out->colls_warmed = t->colls_warmed;
    out->coll_send = out->coll_recv = t->coll_conn && t->size > 1; /* a ring: the next rank, the previous */
    out->conn_bytes = (uint64_t)(out->p2p_recv + out->coll_recv) * PP_NCCL_CONN_BYTES;
}

/* The id file: what rank 0 writes, so that a reader can tell this run's file from one an
   earlier run left at the same path. */
typedef struct _ppn_idfile {
    char magic[8];              /* "ppncclid" */
    uint32_t version;           /* 1 */
    int64_t written;            /* the writer's wall clock (time(NULL)) */
    char job[96];               /* the launcher's job identity, "" when none is set */
    ncclUniqueId id;
} _ppn_idfile;

/* The launcher's identity of this job (the same on every rank), or "". */
static void _ppn_job_token(char* out, size_t cap) {
    static const char* const vars[] = {"SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid",
                                       "LSB_JOBID", "PBS_JOBID", "FLUX_JOB_ID"};
    size_t i;
    out[0] = 0;
    for (i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char* v = getenv(vars[i]);
        if (v && *v) {
            snprintf(out, cap, "%s=%s", vars[i], v);
            return;
        }
    }
}

/* Why the file read is not this run's ("" if it is). */
static void _ppn_idfile_stale(const _ppn_idfile* f, size_t got, const char* job, int64_t start, double window, char* why,
                              size_t cap) {
    why[0] = 0;
    if (got != sizeof *f || memcmp(f->magic, "ppncclid", 8) != 0 || f->version != 1)
        snprintf(why, cap, "it is not an id file of this version (%zu bytes)", got);
    else if (strncmp(f->job, job, sizeof f->job) != 0)
        snprintf(why, cap, "it was written by job '%.40s', this is '%.40s'", f->job, job);
    else if ((double)(start - f->written) > window)
        snprintf(why, cap, "it was written %lld s before this rank started, more than the %.3g s timeout",
                 (long long)(start - f->written), window);
}

pp_result pp_nccl_unique_id_file(const char* path, int rank, double timeout_s, ncclUniqueId* id, pp_error* err) {
    char tmp[1100], job[96], why[200] = "";
    double dt = timeout_s > 0 ? timeout_s : PP_DEFAULT_TIMEOUT_S, deadline = _pp_now() + dt;
    int64_t start = (int64_t)time(NULL);
    _ppn_idfile f;
    FILE* fp;
    if (!path || !id) return _pp_fail(err, PP_ERR_INVALID, "unique id file needs a path and an output");
    if (strlen(path) + 32 > sizeof tmp) return _pp_fail(err, PP_ERR_INVALID, "path is too long");
    _ppn_job_token(job, sizeof job);
    if (rank == 0) {
        ncclResult_t r;
        remove(path); /* an earlier run's file goes before this one exists */
        r = ncclGetUniqueId(id);
        if (r != ncclSuccess) return _pp_fail(err, PP_ERR_TRANSPORT, "ncclGetUniqueId: %s", ncclGetErrorString(r));
        memset(&f, 0, sizeof f);
        memcpy(f.magic, "ppncclid", 8);
        f.version = 1;
        f.written = (int64_t)time(NULL);
        memcpy(f.job, job, sizeof f.job);
        f.id = *id;
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        if (!(fp = fopen(tmp, "wb"))) return _pp_fail(err, PP_ERR_TRANSPORT, "cannot write %s", tmp);
        if (fwrite(&f, sizeof f, 1, fp) != 1) {
            fclose(fp);
            remove(tmp);
            return _pp_fail(err, PP_ERR_TRANSPORT, "cannot write %s", tmp);
        }
        if (fclose(fp) != 0 || rename(tmp, path) != 0) {
            remove(tmp);
            return _pp_fail(err, PP_ERR_TRANSPORT, "cannot publish %s", path);
        }
        return PP_OK;
    }
    for (;;) {
        if ((fp = fopen(path, "rb")) != NULL) {
            unsigned char buf[sizeof f + 1];
            size_t got = fread(buf, 1, sizeof buf, fp); /* sizeof f + 1: a longer file is no id file */
            fclose(fp);
            memset(&f, 0, sizeof f);
            memcpy(&f, buf, got < sizeof f ? got : sizeof f);
            _ppn_idfile_stale(&f, got, job, start, dt, why, sizeof why);
            if (!why[0]) {
                *id = f.id;
                return PP_OK;
            }
        }
        if (_pp_now() > deadline) {
            if (why[0])
                return _pp_fail(err, PP_ERR_TIMEOUT, "rank %d waited %.3g s for rank 0 to write %s and found only a stale file: %s "
                                "(use a path unique to the job)", rank, dt, path, why);
            return _pp_fail(err, PP_ERR_TIMEOUT, "rank %d waited %.3g s for rank 0 to write %s", rank, dt, path);
        }
        _ppn_sleep_us(10000);
    }
}

/* Polls a non-blocking communicator until it is ready, failed, or the deadline passed. */
static pp_result _ppn_settle(ncclComm_t c, double deadline, const char* what, pp_error* err) {
    ncclResult_t st = _ppn_comm_wait(c, deadline, 1000);
    if (st == ncclSuccess) return PP_OK;
    ncclCommAbort(c);
    if (st == ncclInProgress)
        return _pp_fail(err, PP_ERR_TIMEOUT, "%s did not finish before the deadline (communicator aborted)", what);
    return _pp_fail(err, PP_ERR_TRANSPORT, "%s: %s", what, ncclGetErrorString(st));
}

#if NCCL_VERSION_CODE >= 21800
/* One split of a non-blocking parent. NCCL fills *out only once the parent's state leaves
   ncclInProgress [NCCL issue 1472; init.cc: the split runs as a job of the parent], so the
   parent settles first, then the new communicator (absent for NCCL_SPLIT_NOCOLOR). */
/* grid: 1 for the grid's splits of the world, made non-blocking (what pp_nccl_comm_init gives) and with
   splitShare = 0 stated, so that the transports' own splits of them (the channels) never share a
   launch queue, whatever the world's config; 0 inherits the parent's config (NULL). */
static pp_result _ppn_split(ncclComm_t parent, int color, int key, ncclComm_t* out, double deadline, const char* what,
                            int grid, pp_error* err) {
    ncclResult_t r, st;
    pp_result r2;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    cfg.splitShare = 0;
    *out = NULL;
    r = ncclCommSplit(parent, color, key, out, grid ? &cfg : NULL);
    if (r != ncclSuccess && r != ncclInProgress) return _pp_fail(err, PP_ERR_TRANSPORT, "%s: %s", what, ncclGetErrorString(r));
    if ((st = _ppn_comm_wait(parent, deadline, 1000)) == ncclInProgress)
        return _pp_fail(err, PP_ERR_TIMEOUT, "%s: the world communicator did not settle before the deadline (abort it)", what);
    if (st != ncclSuccess) {
        if (*out) ncclCommAbort(*out);
        *out = NULL;
        return _pp_fail(err, PP_ERR_TRANSPORT, "%s: world communicator: %s", what, ncclGetErrorString(st));
    }
    if (!*out) return PP_OK; /* NCCL_SPLIT_NOCOLOR */
    r2 = _ppn_settle(*out, deadline, what, err);
    if (r2 != PP_OK) *out = NULL; /* _ppn_settle aborted it */
    return r2;
}
#endif

pp_result pp_nccl_comm_init(const pp_launch* L, const ncclUniqueId* id, double timeout_s, ncclComm_t* comm,
                            pp_error* err) {
    int ndev = 0;
    cudaError_t e;
    ncclResult_t r;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    double deadline = _pp_now() + (timeout_s > 0 ? timeout_s : PP_DEFAULT_TIMEOUT_S);
    if (!L || !id || !comm) return _pp_fail(err, PP_ERR_INVALID, "pp_nccl_comm_init needs a launch, an id and an output");
    *comm = NULL;
    if ((e = cudaGetDeviceCount(&ndev)) != cudaSuccess || ndev < 1)
        return _pp_fail(err, PP_ERR_UNSUPPORTED, "no CUDA device (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    if ((e = cudaSetDevice(L->local_rank % ndev)) != cudaSuccess)
        return _pp_fail(err, PP_ERR_TRANSPORT, "cudaSetDevice(%d): %s", L->local_rank % ndev, cudaGetErrorString(e));
    cfg.blocking = 0;
    r = ncclCommInitRankConfig(comm, L->world, *id, L->rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress)
        return _pp_fail(err, PP_ERR_TRANSPORT, "ncclCommInitRankConfig (rank %d of %d): %s", L->rank, L->world,
                        ncclGetErrorString(r));
    return _ppn_settle(*comm, deadline, "ncclCommInitRankConfig", err);
}

/* The hardware queues a grid rank's streams hold beside its pipe's (pp_nccl_desc.queues_held):
   NCCL's two (deviceStream, hostStream: src/init.cc) for the world communicator, and for the
   dp, the tied pair's and the TP group's communicator those two and the transport's stream.
   The tied pair's are counted on every rank, so every pipe rank picks the same channels. */
#if NCCL_VERSION_CODE >= 21800
static int _ppn_grid_held(int tp) {
#ifdef PP_NCCL_TEST_GRID_UNHELD /* negative control (build/nccl-controls): the pipe counts its own streams only */
    (void)tp;
    return 0;
#endif
    return 2 + 3 + 3 + (tp > 1 ? 3 : 0);
}
#endif

pp_result pp_nccl_grid_create(ncclComm_t world, int pp, pp_grid_order order, cudaStream_t compute, double timeout_s,
                              pp_nccl_grid* g, pp_error* err) {
    return pp_nccl_grid_create_tp(world, pp, 1, order, compute, timeout_s, g, err);
}

pp_result pp_nccl_grid_create_tp(ncclComm_t world, int pp, int tp, pp_grid_order order, cudaStream_t compute,
                                 double timeout_s, pp_nccl_grid* g, pp_error* err) {
#if NCCL_VERSION_CODE >= 21800
    ncclComm_t pipe = NULL, dp = NULL, tied = NULL, tpc = NULL;
    int n = 0, me = 0, color, key;
    double deadline = _pp_now() + (timeout_s > 0 ? timeout_s : PP_DEFAULT_TIMEOUT_S);
    pp_nccl_desc d;
    pp_result rc;
    if (!g) return _pp_fail(err, PP_ERR_INVALID, "output pointer is NULL");
    memset(g, 0, sizeof *g);
    if (!world || ncclCommCount(world, &n) != ncclSuccess || ncclCommUserRank(world, &me) != ncclSuccess)
        return _pp_fail(err, PP_ERR_INVALID, "world communicator is not usable");
    if ((rc = pp_grid_make_tp(n, me, pp, tp, order, &g->grid, err)) != PP_OK) return rc;
    /* every rank calls the three splits (four with tp > 1), in the same order */
    pp_grid_pipe_split(&g->grid, &color, &key);
    rc = _ppn_split(world, color, key, &g->split_out[0], deadline, "ncclCommSplit (pipeline)", 1, err);
    if (rc == PP_OK) {
        pp_grid_dp_split(&g->grid, &color, &key);
        rc = _ppn_split(world, color, key, &g->split_out[1], deadline, "ncclCommSplit (data-parallel)", 1, err);
    }
    if (rc == PP_OK) { /* the tied pair: ranks in none pass NCCL_SPLIT_NOCOLOR and get no communicator */
        pp_grid_tied_split(&g->grid, &color, &key);
        rc = _ppn_split(world, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &g->split_out[2], deadline,
                        "ncclCommSplit (tied pair)", 1, err);
    }
    if (rc == PP_OK && tp > 1) {
        pp_grid_tp_split(&g->grid, &color, &key);
        rc = _ppn_split(world, color, key, &g->split_tp_out, deadline, "ncclCommSplit (TP group)", 1, err);
    }
    pipe = g->split_out[0];
    dp = g->split_out[1];
    tied = g->split_out[2];
    tpc = g->split_tp_out;
    if (rc != PP_OK) { /* the finished splits go; a split the world still runs may yet write its slot */
        for (int k = 0; k < 3; k++)
            if (g->split_out[k]) ncclCommDestroy(g->split_out[k]);
        if (g->split_tp_out) ncclCommDestroy(g->split_tp_out);
        return rc;
    }
    memset(&d, 0, sizeof d);
    d.compute = compute;
    d.own_comm = 1;
    d.timeout_s = timeout_s;
    d.comm = pipe;
    d.queues_held = _ppn_grid_held(tp);
    rc = pp_nccl_create(&d, &g->pipe, err);
    d.queues_held = 0; /* one channel each */
    d.comm = dp;
    d.collective_only = 1; /* dp and tied only all-reduce: one communicator each, no pair connected ahead */
    if (rc == PP_OK) rc = pp_nccl_create(&d, &g->dp, err);
    d.comm = tied;
    if (rc == PP_OK && tied) rc = pp_nccl_create(&d, &g->tied, err);
    /* the TP collectives (pipeline.h's pp_tp_*) run over sends and receives between every pair of
       the group: one channel, every pair connected at create, so no step sets one up */
    d.comm = tpc;
    d.collective_only = 0;
    d.channels = 1;
    d.connect_all = 1;
    if (rc == PP_OK && tpc) rc = pp_nccl_create(&d, &g->tp, err);
    if (rc == PP_OK && g->tp) { /* their waits end when a TP collective on the compute stream runs out of time */
        g->pipe->tp_link = g->tp;
        g->dp->tp_link = g->tp;
        if (g->tied) g->tied->tp_link = g->tp;
    }
    if (rc != PP_OK) {
        if (!g->pipe) ncclCommDestroy(pipe);
        if (!g->dp) ncclCommDestroy(dp);
        if (tied && !g->tied) ncclCommDestroy(tied);
        if (tpc && !g->tp) ncclCommDestroy(tpc);
        pp_nccl_grid_destroy(g);
    }
    return rc;
#else
    (void)world; (void)pp; (void)tp; (void)order; (void)compute; (void)timeout_s;
    if (g) memset(g, 0, sizeof *g);
    return _pp_fail(err, PP_ERR_UNSUPPORTED, "pp_nccl_grid_create needs ncclCommSplit (NCCL >= 2.18; this is %d)",
                    NCCL_VERSION_CODE);
#endif
}

void pp_nccl_grid_destroy(pp_nccl_grid* g) {
    if (!g) return;
    pp_nccl_destroy(g->tp);
    pp_nccl_destroy(g->tied);
    pp_nccl_destroy(g->dp);
    pp_nccl_destroy(g->pipe);
    g->tp = g->tied = g->dp = g->pipe = NULL;
}

pp_result pp_nccl_grid_recover(ncclComm_t world, pp_nccl_grid* g, cudaStream_t compute, double timeout_s, int* remade,
                               pp_error* err) {
#if NCCL_VERSION_CODE >= 21800
    double deadline = _pp_now() + (timeout_s > 0 ? timeout_s : PP_DEFAULT_TIMEOUT_S);
    int32_t mine = 0, any = 0, *dev = NULL;
    cudaEvent_t ev = NULL;
    ncclResult_t r, st = ncclSuccess;
    cudaError_t ce = cudaSuccess;
    const char* what = "";
    pp_grid grid;
    if (!remade) return _pp_fail(err, PP_ERR_INVALID, "pp_nccl_grid_recover: remade is NULL");
    *remade = 0;
    if (!g || !world) return _pp_fail(err, PP_ERR_INVALID, "pp_nccl_grid_recover needs the world communicator and the grid");
    grid = g->grid;
#ifdef PP_NCCL_TEST_RECOVER_UNTIMED /* negative control (build/tp-controls): the vote waited for without a deadline */
    deadline = 1e300;
#endif
    mine = (g->pipe && g->pipe->aborted) || (g->dp && g->dp->aborted) || (g->tied && g->tied->aborted) ||
           (g->tp && g->tp->aborted) || !g->pipe; /* !pipe: a grid a failed recovery left without transports */
#ifdef PP_NCCL_TEST_RECOVER_ALONE /* negative control (build/tp-controls): each rank decides alone */
    any = mine;
    goto decided;
#endif
    if ((ce = cudaMalloc((void**)&dev, sizeof mine)) != cudaSuccess) what = "cudaMalloc (the vote)";
    else if ((ce = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)) != cudaSuccess) what = "cudaEventCreate (the vote)";
    else if ((ce = cudaMemcpyAsync(dev, &mine, sizeof mine, cudaMemcpyHostToDevice, compute)) != cudaSuccess)
        what = "cudaMemcpyAsync (the vote)";
    if (!*what) {
        r = ncclAllReduce(dev, dev, 1, ncclInt32, ncclSum, world, compute);
        if (r == ncclInProgress) r = _ppn_comm_wait(world, deadline, 100);
        if (r != ncclSuccess) {
            if (ev) cudaEventDestroy(ev);
            if (r != ncclInProgress) cudaFree(dev); /* else the vote may still be launched and write it: leaked */
            return _pp_fail(err, r == ncclInProgress ? PP_ERR_TIMEOUT : PP_ERR_TRANSPORT, "pp_nccl_grid_recover: the vote's "
                            "all-reduce over the world communicator: %s%s", ncclGetErrorString(r),
                            r == ncclInProgress ? " (abort the world communicator)" : "");
        }
        if ((ce = cudaEventRecord(ev, compute)) != cudaSuccess) what = "cudaEventRecord (the vote)";
    }
    while (!*what) { /* the vote's end, polled: a rank that never votes is a timeout, not a host held */
        if ((ce = cudaEventQuery(ev)) == cudaSuccess) break;
        if (ce != cudaErrorNotReady) what = "cudaEventQuery (the vote)";
        else if (ncclCommGetAsyncError(world, &st) != ncclSuccess || (st != ncclSuccess && st != ncclInProgress)) {
            cudaEventDestroy(ev);
            return _pp_fail(err, PP_ERR_TRANSPORT, "pp_nccl_grid_recover: the world communicator failed in the vote: %s "
                            "(abort it)", ncclGetErrorString(st));
        } else if (_pp_now() > deadline) {
            cudaEventDestroy(ev); /* dev stays: the vote may still write it */
            return _pp_fail(err, PP_ERR_TIMEOUT, "pp_nccl_grid_recover: a rank did not vote in %.3g s (the world "
                            "communicator still runs the vote: abort it)", timeout_s > 0 ? timeout_s : PP_DEFAULT_TIMEOUT_S);
        } else _ppn_sleep_us(200);
    }
    if (!*what && (ce = cudaMemcpy(&any, dev, sizeof any, cudaMemcpyDeviceToHost)) != cudaSuccess)
        what = "cudaMemcpy (the vote)";
    if (ev) cudaEventDestroy(ev);
    if (dev) cudaFree(dev);
    if (*what) {
        (void)cudaGetLastError();
        return _pp_fail(err, PP_ERR_TRANSPORT, "pp_nccl_grid_recover: %s: %s", what, cudaGetErrorString(ce));
    }
#ifdef PP_NCCL_TEST_RECOVER_ALONE
decided:
#endif
    if (!any) return PP_OK;
    pp_nccl_grid_destroy(g);
    *remade = 1;
    return pp_nccl_grid_create_tp(world, grid.pp, grid.tp, grid.order, compute, timeout_s, g, err);
#else
    (void)world; (void)g; (void)compute; (void)timeout_s;
    if (remade) *remade = 0;
    return _pp_fail(err, PP_ERR_UNSUPPORTED, "pp_nccl_grid_recover needs ncclCommSplit (NCCL >= 2.18; this is %d)",
                    NCCL_VERSION_CODE);
#endif
}

/* One message in a pair's sequence: (micro-batch, boundary stage, direction). */
typedef struct _ppn_msg { int mb, boundary, dir; } _ppn_msg;

/* by_kind: activations and gradients travel on channels of their own (four channels or more),
   so only each kind's order must agree; else every message of a pair shares one order. */
static pp_result _ppn_check_order(const pp_schedule* s, int by_kind, pp_error* err) {
    int p, a, b, i, kind;
    _ppn_msg *snd = NULL, *rcv = NULL;
    size_t cap, ns, nr;
    pp_result rc = PP_OK;
    if (!s || !s->actions) return _pp_fail(err, PP_ERR_INVALID, "schedule is NULL");
    p = s->p;
    cap = (size_t)s->per_rank + 1;
    snd = (_ppn_msg*)_pp_calloc(cap, sizeof *snd);
    rcv = (_ppn_msg*)_pp_calloc(cap, sizeof *rcv);
    if (!snd || !rcv) {
        PP_FREE(snd);
        PP_FREE(rcv);
        return _pp_fail(err, PP_ERR_NOMEM, "order check");
    }
    for (kind = 0; kind <= by_kind && rc == PP_OK; kind++)
    for (a = 0; a < p && rc == PP_OK; a++)
        for (b = 0; b < p && rc == PP_OK; b++) {
            const pp_action* la = pp_schedule_rank(s, a);
            const pp_action* lb = pp_schedule_rank(s, b);
            if (a == b) continue;
            ns = nr = 0;
            /* what a sends to b, in a's order: F outputs forward, B input gradients backward */
            for (i = 0; i < s->per_rank; i++) {
                const pp_action* x = &la[i];
                if (by_kind && (x->op == PP_OP_B) != kind) continue;
                if (x->op == PP_OP_F && x->next_rank == b) { snd[ns].mb = x->mb; snd[ns].boundary = x->stage + 1; snd[ns++].dir = 0; }
                if (x->op == PP_OP_B && x->prev_rank == b) { snd[ns].mb = x->mb; snd[ns].boundary = x->stage; snd[ns++].dir = 1; }
            }
            /* what b receives from a, in b's posting order (its action order) */
            for (i = 0; i < s->per_rank; i++) {
                const pp_action* x = &lb[i];
                if (by_kind && (x->op == PP_OP_B) != kind) continue;
                if (x->op == PP_OP_F && x->prev_rank == a) { rcv[nr].mb = x->mb; rcv[nr].boundary = x->stage; rcv[nr++].dir = 0; }
                if (x->op == PP_OP_B && x->next_rank == a) { rcv[nr].mb = x->mb; rcv[nr].boundary = x->stage + 1; rcv[nr++].dir = 1; }
            }
            if (ns != nr) {
                rc = _pp_fail(err, PP_ERR_SCHEDULE, "rank %d sends %zu messages to rank %d, which receives %zu", a, ns, b, nr);
                break;
            }
            for (i = 0; i < (int)ns; i++)
                if (snd[i].mb != rcv[i].mb || snd[i].boundary != rcv[i].boundary || snd[i].dir != rcv[i].dir) {
                    rc = _pp_fail(err, PP_ERR_UNSUPPORTED,
                                  "%s p=%d v=%d: message %d from rank %d to rank %d is %s of micro-batch %d at stage "
                                  "boundary %d, but rank %d expects %s of micro-batch %d at boundary %d (NCCL matches by "
                                  "order; use the MPI transport for this schedule)",
                                  pp_schedule_name(s->kind), s->p, s->v, i, a, b, snd[i].dir ? "a gradient" : "an activation",
                                  snd[i].mb, snd[i].boundary, b, rcv[i].dir ? "a gradient" : "an activation", rcv[i].mb,
                                  rcv[i].boundary);
                    break;
                }
        }
    PP_FREE(snd);
    PP_FREE(rcv);
    return rc;
}

pp_result pp_nccl_check_order(const pp_schedule* s, pp_error* err) {
#if NCCL_VERSION_CODE >= 21800
    return _ppn_check_order(s, 1, err); /* pp_nccl_create makes eight channels (four or more) */
#else
    return _ppn_check_order(s, 0, err);
#endif
}

/* >>impl-nccl-rendezvous: can the NCCL calls the executor makes under s wait in a cycle?
   The issuing order, as _ppn_post/_ppn_group_end/_ppn_wait and the executor (pipeline.h,
   _pp_stage_step_run) produce it with LOCAL or BROADCAST shapes, per rank:
       for each action i: the receives of actions i (if not yet) and i + 1 are posted, queued
       (a group of receives alone issues nothing); the wait for action i's receive issues its
       channel's queue up to it as one group (unless a send issued it already) and the
       compute stream waits for that group; action i's send issues both channels' queues
       whole (channel 0, then 1): the receive of action i + 1 goes in the send's group.
   Each issued group runs on its channel's stream after the channel's earlier groups and after
   every group the compute stream waited for before it was issued (the flush's `ready` event).
   Rendezvous: a send completes only when its receive is running, and a group completes when
   all its operations have met their peers' (NCCL matches in order per communicator and pair).
   A host that blocks on a host-memory receive instead of the stream adds no dependency that
   the stream's wait did not already (later groups wait for the compute stream either way), and
   the executor's waits on sends are bounded probes or come after the last issue: so the GPU
   order is the whole story. The simulation starts every group whose dependencies completed and
   completes every started group whose operations' peers are started; what is left waits in a
   cycle, named by following "waits for" from one stuck channel. The multi-tensor messages of a
   boundary travel together in the same groups on both sides, so one operation stands for them;
   the model assumes every boundary carries a gradient back (a boundary of integer tensors only
   sends none, and its sender's groups then issue later than modelled). */
typedef struct _ppn_rop {   /* one operation in a rank's channel queue */
    int32_t grp;            /* index of its group among the rank's groups on this channel */
    int32_t mb;
    int16_t peer, bnd;      /* bnd: the stage boundary (receiving stage) */
    int8_t recv, grad;
} _ppn_rop;

typedef struct _ppn_rgrp { int32_t lo, hi, need[_PPN_MAXCH]; } _ppn_rgrp; /* ops [lo, hi); completed groups it waits for */

typedef struct _ppn_rdv {
    const pp_schedule* s;
    int p, nch, cap;
    _ppn_rop* ops;          /* [_PPN_RC(r, ch) * cap + k] */
    _ppn_rgrp* grps;        /* same layout */
    int32_t* n_ops;         /* [_PPN_RC(r, ch)] */
    int32_t* n_grps;
    int32_t* flushed;       /* ops already in a group */
    int32_t* done;          /* completed groups */
    int32_t* bypair;        /* [(_PPN_RC(r, ch)*p + peer)*2 + recv] -> first index in `order` */
    int32_t* order;         /* op positions of one (rank, channel, peer, kind), in posting order */
    int32_t* kth;           /* [_PPN_RC(r, ch) * cap + k]: k-th op of its (peer, kind) */
} _ppn_rdv;

#define _PPN_RC(r, ch) ((size_t)((r) * _PPN_MAXCH + (ch)))

static void _ppn_rdv_flush(_ppn_rdv* z, int r, int ch, int upto, const int* cw) {
    size_t rc = _PPN_RC(r, ch);
    int k;
    _ppn_rgrp* g;
    if (z->flushed[rc] >= upto) return;
    g = &z->grps[rc * (size_t)z->cap + (size_t)z->n_grps[rc]];
    g->lo = z->flushed[rc];
    g->hi = upto;
    memcpy(g->need, cw, sizeof g->need);
    for (k = g->lo; k < g->hi; k++) z->ops[rc * (size_t)z->cap + (size_t)k].grp = z->n_grps[rc];
    z->n_grps[rc]++;
    z->flushed[rc] = upto;
}

static void _ppn_rdv_flush_all(_ppn_rdv* z, int r, const int* cw) {
    int ch;
    for (ch = 0; ch < z->nch; ch++) _ppn_rdv_flush(z, r, ch, z->n_ops[_PPN_RC(r, ch)], cw);
}

/* Appends one operation of rank r to its channel's queue; returns (channel << 28) | position. */
static int _ppn_rdv_post(_ppn_rdv* z, int r, int recv, int peer, int grad, int mb, int bnd) {
    int ch = _ppn_channel_of(z->nch, r, recv, peer, grad);
    size_t rc = _PPN_RC(r, ch);
    _ppn_rop* o = &z->ops[rc * (size_t)z->cap + (size_t)z->n_ops[rc]];
    o->grp = -1;
    o->recv = (int8_t)recv;
    o->peer = (int16_t)peer;
    o->grad = (int8_t)grad;
    o->mb = mb;
    o->bnd = (int16_t)bnd;
    return (ch << 28) | z->n_ops[rc]++;
}

/* The receive an action posts (-1: none over NCCL), as _ppn_rdv_post's handle. */
static int _ppn_rdv_post_recv(_ppn_rdv* z, int r, const pp_action* a) {
    if (a->op == PP_OP_F && a->stage > 0 && a->prev_rank != r) return _ppn_rdv_post(z, r, 1, a->prev_rank, 0, a->mb, a->stage);
    if (a->op == PP_OP_B && a->stage < z->s->n_stages - 1 && a->next_rank != r)
        return _ppn_rdv_post(z, r, 1, a->next_rank, 1, a->mb, a->stage + 1);
    return -1;
}

static void _ppn_rdv_issue(_ppn_rdv* z, int r) {
    const pp_action* l = pp_schedule_rank(z->s, r);
    int n = z->s->per_rank, i, cw[_PPN_MAXCH] = {0};
    int* posted = (int*)z->kth; /* scratch for this rank, the k-th indices come later */
    for (i = 0; i < n; i++) posted[i] = -2;
    for (i = 0; i < n; i++) {
        const pp_action* a = &l[i];
        int h, ch;
        if (posted[i] == -2) posted[i] = _ppn_rdv_post_recv(z, r, a);
        if (i + 1 < n && posted[i + 1] == -2) posted[i + 1] = _ppn_rdv_post_recv(z, r, &l[i + 1]);
        if ((h = posted[i]) >= 0) {
            size_t rc;
            ch = h >> 28;
            rc = _PPN_RC(r, ch);
            _ppn_rdv_flush(z, r, ch, (h & 0x0fffffff) + 1, cw);
            if (z->ops[rc * (size_t)z->cap + (size_t)(h & 0x0fffffff)].grp + 1 > cw[ch])
                cw[ch] = z->ops[rc * (size_t)z->cap + (size_t)(h & 0x0fffffff)].grp + 1;
        }
        h = -1;
        if (a->op == PP_OP_F && a->stage < z->s->n_stages - 1 && a->next_rank != r)
            h = _ppn_rdv_post(z, r, 0, a->next_rank, 0, a->mb, a->stage + 1);
        if (a->op == PP_OP_B && a->stage > 0 && a->prev_rank != r) h = _ppn_rdv_post(z, r, 0, a->prev_rank, 1, a->mb, a->stage);
        if (h >= 0) _ppn_rdv_flush_all(z, r, cw);
    }
    _ppn_rdv_flush_all(z, r, cw); /* pp_nccl_step_end: nothing is left by then */
}

#define _PPN_OP(z, rc, k) (&(z)->ops[(rc) * (size_t)(z)->cap + (size_t)(k)])
#define _PPN_GRP(z, rc, k) (&(z)->grps[(rc) * (size_t)(z)->cap + (size_t)(k)])

static int _ppn_rdv_started(const _ppn_rdv* z, int r, int ch, int g) {
    size_t rc = _PPN_RC(r, ch);
    int c;
    const _ppn_rgrp* x;
    if (g < z->done[rc]) return 1;
    if (g > z->done[rc]) return 0;
    x = _PPN_GRP(z, rc, g);
    for (c = 0; c < z->nch; c++)
        if (z->done[_PPN_RC(r, c)] < x->need[c]) return 0;
    return 1;
}

/* The peer's operation that o (the k-th of its rank, channel, peer and kind) meets. */
static const _ppn_rop* _ppn_rdv_peer(const _ppn_rdv* z, int r, int ch, int k) {
    const _ppn_rop* o = _PPN_OP(z, _PPN_RC(r, ch), k);
    size_t qc = _PPN_RC(o->peer, ch), at = (qc * (size_t)z->p + (size_t)r) * 2 + (size_t)!o->recv;
    return _PPN_OP(z, qc, z->order[z->bypair[at] + z->kth[_PPN_RC(r, ch) * (size_t)z->cap + (size_t)k]]);
}

static void _ppn_rdv_opname(char* buf, size_t cap, const _ppn_rop* o) {
    _pp_sim_append(buf, cap, "%s %s mb%d s%d->%d %s r%d", o->recv ? "receives" : "sends", o->grad ? "grad" : "act", o->mb,
                   o->grad ? o->bnd : o->bnd - 1, o->grad ? o->bnd - 1 : o->bnd, o->recv ? "from" : "to", o->peer);
}

/* Why the stuck channel `cur` (rank * _PPN_MAXCH + channel) waits, appended to buf; returns the
   channel it waits for. */
static int _ppn_rdv_why(const _ppn_rdv* z, int cur, char* buf, size_t cap) {
    int r = cur / _PPN_MAXCH, ch = cur % _PPN_MAXCH, g = z->done[cur], k;
    const _ppn_rgrp* x = _PPN_GRP(z, (size_t)cur, g);
    if (!_ppn_rdv_started(z, r, ch, g)) {
        int c2 = 0;
        while (c2 < z->nch - 1 && z->done[_PPN_RC(r, c2)] >= x->need[c2]) c2++;
        _pp_sim_append(buf, cap, "r%d ch%d#%d waits for its compute stream, which waits for r%d ch%d#%d", r, ch, g, r, c2,
                       x->need[c2] - 1);
        return (int)_PPN_RC(r, c2);
    }
    for (k = x->lo; k < x->hi; k++) {
        const _ppn_rop* o = _PPN_OP(z, (size_t)cur, k);
        const _ppn_rop* q = _ppn_rdv_peer(z, r, ch, k);
        if (_ppn_rdv_started(z, o->peer, ch, q->grp)) continue;
        _pp_sim_append(buf, cap, "r%d ch%d#%d ", r, ch, g);
        _ppn_rdv_opname(buf, cap, o);
        _pp_sim_append(buf, cap, ", waits for r%d ch%d#%d", o->peer, ch, q->grp);
        return (int)_PPN_RC(o->peer, ch);
    }
    return -1; /* not stuck */
}

/* Follows "waits for" from a stuck channel until it comes round, and writes that cycle. */
static void _ppn_rdv_report(const _ppn_rdv* z, char* buf, size_t cap) {
    char scratch[8] = {0};
    int cur = -1, i, steps;
    for (i = 0; i < _PPN_MAXCH * z->p && cur < 0; i++)
        if (z->done[i] < z->n_grps[i]) cur = i;
    /* as many steps as channels from anywhere end inside the cycle */
    for (steps = 0; steps < _PPN_MAXCH * z->p && cur >= 0; steps++) cur = _ppn_rdv_why(z, cur, scratch, 0);
    _pp_sim_append(buf, cap, "its NCCL calls would wait in a cycle (sends wait for their receive; rK chC#N: rank K's N-th "
                   "group on channel C: 0 activations to higher ranks, 1 to lower, 2 and 3 the same for gradients, "
                   "4 to 7 the same between a rank and a neighbour whose lower rank is odd): ");
    for (i = cur, steps = 0; i >= 0 && (steps == 0 || i != cur) && steps < _PPN_MAXCH * z->p; steps++) {
        if (steps) _pp_sim_append(buf, cap, "; ");
        i = _ppn_rdv_why(z, i, buf, cap);
    }
}

/* Builds every rank's groups, then runs them under rendezvous semantics. */
static pp_result _ppn_rdv_run(const pp_schedule* s, int nch, pp_error* err) {
    _ppn_rdv z;
    size_t n_rc, n_pair, i;
    int r, ch, k, progress = 1;
    pp_result rc = PP_OK;
    memset(&z, 0, sizeof z);
    z.s = s;
    z.p = s->p;
    z.nch = nch;
    z.cap = 2 * s->per_rank + 1;
    n_rc = (size_t)_PPN_MAXCH * (size_t)z.p;
    n_pair = n_rc * (size_t)z.p * 2;
    z.ops = (_ppn_rop*)_pp_calloc(n_rc * (size_t)z.cap, sizeof *z.ops);
    z.grps = (_ppn_rgrp*)_pp_calloc(n_rc * (size_t)z.cap, sizeof *z.grps);
    z.kth = (int32_t*)_pp_calloc(n_rc * (size_t)z.cap, sizeof *z.kth);
    z.order = (int32_t*)_pp_calloc(n_rc * (size_t)z.cap, sizeof *z.order);
    z.n_ops = (int32_t*)_pp_calloc(n_rc * 4, sizeof *z.n_ops);
    z.bypair = (int32_t*)_pp_calloc(n_pair + 1, sizeof *z.bypair);
    if (!z.ops || !z.grps || !z.kth || !z.order || !z.n_ops || !z.bypair) {
        rc = _pp_fail(err, PP_ERR_NOMEM, "NCCL rendezvous check of %d x %d actions", z.p, s->per_rank);
        goto cleanup;
    }
    z.n_grps = z.n_ops + n_rc;
    z.flushed = z.n_grps + n_rc;
    z.done = z.flushed + n_rc;
    for (r = 0; r < z.p; r++) _ppn_rdv_issue(&z, r);
    /* index every (rank, channel, peer, kind) sequence: the k-th send meets the k-th receive */
    for (i = 0; i < n_rc; i++)
        for (k = 0; k < z.n_ops[i]; k++) {
            const _ppn_rop* o = _PPN_OP(&z, i, k);
            z.kth[i * (size_t)z.cap + (size_t)k] = z.bypair[(i * (size_t)z.p + (size_t)o->peer) * 2 + (size_t)o->recv + 1]++;
        }
    for (i = 0; i < n_pair; i++) z.bypair[i + 1] += z.bypair[i];
    for (i = 0; i < n_rc; i++)
        for (k = 0; k < z.n_ops[i]; k++) {
            const _ppn_rop* o = _PPN_OP(&z, i, k);
            z.order[z.bypair[(i * (size_t)z.p + (size_t)o->peer) * 2 + (size_t)o->recv] + z.kth[i * (size_t)z.cap + (size_t)k]] = k;
        }
    for (r = 0; r < z.p; r++)
        for (ch = 0; ch < nch; ch++)
            for (k = 0; k < z.p; k++) {
                size_t mine = (_PPN_RC(r, ch) * (size_t)z.p + (size_t)k) * 2, theirs = (_PPN_RC(k, ch) * (size_t)z.p + (size_t)r) * 2;
                int sends = z.bypair[mine + 1] - z.bypair[mine], recvs = z.bypair[theirs + 2] - z.bypair[theirs + 1];
                if (sends != recvs) {
                    rc = _pp_fail(err, PP_ERR_SCHEDULE, "rank %d sends %d messages to rank %d over NCCL, which receives %d", r,
                                  sends, k, recvs);
                    goto cleanup;
                }
            }
    while (progress) {
        progress = 0;
        for (r = 0; r < z.p; r++)
            for (ch = 0; ch < nch; ch++) {
                size_t c = _PPN_RC(r, ch);
                while (z.done[c] < z.n_grps[c] && _ppn_rdv_started(&z, r, ch, z.done[c])) {
                    const _ppn_rgrp* x = _PPN_GRP(&z, c, z.done[c]);
                    for (k = x->lo; k < x->hi; k++)
                        if (!_ppn_rdv_started(&z, _PPN_OP(&z, c, k)->peer, ch, _ppn_rdv_peer(&z, r, ch, k)->grp)) break;
                    if (k < x->hi) break;
                    z.done[c]++;
                    progress = 1;
                }
            }
    }
    for (i = 0; i < n_rc; i++)
        if (z.done[i] < z.n_grps[i]) {
            char msg[sizeof err->msg];
            msg[0] = 0;
            _ppn_rdv_report(&z, msg, sizeof msg);
            rc = _pp_fail(err, PP_ERR_DEADLOCK, "%s p=%d v=%d m=%d: %s", pp_schedule_name(s->kind), s->p, s->v, s->m, msg);
            break;
        }
cleanup:
    PP_FREE(z.ops);
    PP_FREE(z.grps);
    PP_FREE(z.kth);
    PP_FREE(z.order);
    PP_FREE(z.n_ops);
    PP_FREE(z.bypair);
    return rc;
}

pp_result pp_nccl_check_rendezvous(const pp_schedule* s, int channels, pp_error* err) {
    if (!s || !s->actions) return _pp_fail(err, PP_ERR_INVALID, "schedule is NULL");
    if (!_PPN_CHANNELS_OK(channels))
        return _pp_fail(err, PP_ERR_INVALID, "channels = %d (1, 2, 4 or 8)", channels);
    if (s->p < 1 || s->p > PP_MAX_RANKS || s->per_rank < 0 || s->per_rank > (1 << 26))
        return _pp_fail(err, PP_ERR_INVALID, "schedule header p=%d per_rank=%d", s->p, s->per_rank);
    return _ppn_rdv_run(s, channels, err);
}

#if defined(MPI_VERSION)
pp_result pp_nccl_unique_id_mpi(MPI_Comm comm, ncclUniqueId* id, pp_error* err) {
    int me = 0;
    /* rank 0's status travels with the id: when it could not make one, every rank says so at
       once instead of starting a communicator from zeros and waiting for its deadline */
    unsigned char msg[1 + sizeof(ncclUniqueId)];
    ncclResult_t r = ncclSuccess;
    if (!id) return _pp_fail(err, PP_ERR_INVALID, "output is NULL");
    MPI_Comm_rank(comm, &me);
    memset(msg, 0, sizeof msg);
    if (me == 0) {
        r = ncclGetUniqueId(id);
        msg[0] = r == ncclSuccess;
        if (r == ncclSuccess) memcpy(msg + 1, id, sizeof *id);
    }
    if (MPI_Bcast(msg, (int)sizeof msg, MPI_BYTE, 0, comm) != MPI_SUCCESS)
        return _pp_fail(err, PP_ERR_TRANSPORT, "MPI_Bcast of the NCCL unique id");
    if (!msg[0])
        return _pp_fail(err, PP_ERR_TRANSPORT, me == 0 ? "ncclGetUniqueId: %s" : "rank 0 could not make the NCCL unique id%s",
                        me == 0 ? ncclGetErrorString(r) : "");
    memcpy(id, msg + 1, sizeof *id);
    return PP_OK;
}
#endif

#ifdef __cplusplus
}
#endif
#endif /* PIPELINE_IMPLEMENTATION && !PIPELINE_NCCL_IMPLEMENTATION_DONE */
