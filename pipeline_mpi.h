/* pipeline_mpi.h - pipeline.h's transport over MPI: one process per rank, on any machine.
   v0.1.0   public domain / MIT (see pipeline.h)

   Include after pipeline.h. In the one file that defines PIPELINE_IMPLEMENTATION, this header's
   implementation comes along:

       #define PIPELINE_IMPLEMENTATION
       #include "pipeline.h"
       #include "pipeline_mpi.h"       // needs <mpi.h>: build with mpicc, run with mpirun

   A pp_mpi is a pp_transport over one MPI communicator: isend/irecv are MPI_Isend/MPI_Irecv with
   the executor's tags (messages match on (peer, tag), as the interface asks), waits poll with
   MPI_Test against a deadline, never a blocking MPI_Wait, and the all-reduce is MPI_Iallreduce
   over the whole communicator (a subset of ranks falls back to pp_allreduce_p2p).

   ABORT. Every pp_mpi has an abort domain: a duplicate of a communicator (by default its own)
   on which an abort is a small message to every member. Each wait polls it, so a rank that
   fails mid-step (pp_stage_step calls transport.abort) makes every other rank of the domain
   return PP_ERR_ABORTED from its next wait, within milliseconds, instead of hanging; a rank
   that dies or stops answering makes the others return PP_ERR_TIMEOUT after their timeout.
   An aborted pp_mpi stays aborted (its communicator may hold stale messages): destroy it.
   pp_mpi_grid makes the pipeline and data-parallel transports of a pp x dp grid share one
   domain over the whole world, so an error anywhere stops everyone.

   TAGS. The executor's tags grow with micro-batches x stages; MPI only promises MPI_TAG_UB >=
   32767 (Open MPI gives 2^31 - 1). The reserved tags of pipeline.h (0x7ffffff0 and up) are
   mapped to the top of the communicator's range; a tag that does not fit makes isend/irecv
   return PP_ERR_UNSUPPORTED and pp_mpi_error() says which tag and what MPI_TAG_UB is.

   Errors inside MPI are returned, not fatal: the communicators get MPI_ERRORS_RETURN.

   API
       pp_mpi_create(comm, abort_comm, &t, &err)   comm is duplicated; abort_comm may be
                                                   MPI_COMM_NULL (= comm)
       pp_mpi_transport(t)                         the pp_transport for pp_stage_desc
       pp_mpi_counters(t, &bytes, &msgs)           deprecated: sum pp_step_stats.bytes_sent
                                                   and msgs_sent over steps
       pp_mpi_error(t)                             the last error the transport recorded
       pp_mpi_set_spin(t, 1)                       busy-poll waits (one rank per core)
       pp_mpi_set_ordered_sum(t, 1)                all-reduce in rank order (bit-reproducible)
       pp_mpi_destroy(t)
       pp_mpi_grid_create(world, pp, order, &g, &err)   pp x dp grid: g.grid, g.pipe, g.dp, g.tied
       pp_mpi_grid_create_tp(world, pp, tp, order, &g, &err)   pp x dp x tp: also g.tp (TP group)
       pp_mpi_grid_destroy(&g)
*/
#ifndef PIPELINE_MPI_H
#define PIPELINE_MPI_H

#include <mpi.h>
#include "pipeline.h"
/* The release of pipeline.h this header belongs to. Against another, compiling stops with an
   #error naming this header's version, then an include of a file named after both versions
   ("pipeline.h is version 0.2.0 but pipeline_mpi.h is 0.1.0": no such file), since #error cannot
   print a macro's value. */
#define PP_MPI_VERSION 100 /* 0.1.0, PP_VERSION's encoding */
#define PP_MPI_VERSION_STRING "0.1.0"
#if !defined(PP_VERSION) || PP_VERSION != PP_MPI_VERSION
#error "pipeline_mpi.h 0.1.0 (PP_VERSION 100) and pipeline.h differ in version: use the headers of one release (pipeline.h's version is in the next error)"
#define _PPM_SKEW2(text) #text
#define _PPM_SKEW(maj, min, pat) _PPM_SKEW2(pipeline.h is version maj.min.pat but pipeline_mpi.h is 0.1.0)
#include _PPM_SKEW(PP_VERSION_MAJOR, PP_VERSION_MINOR, PP_VERSION_PATCH)
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pp_mpi pp_mpi;

pp_result pp_mpi_create(MPI_Comm comm, MPI_Comm abort_comm, pp_mpi** out, pp_error* err);
void pp_mpi_destroy(pp_mpi* t);
pp_transport pp_mpi_transport(pp_mpi* t);
/* Deprecated (sent so far by this rank): pp_step_stats' bytes_sent and msgs_sent count it per step. */
void pp_mpi_counters(const pp_mpi* t, uint64_t* bytes, uint64_t* msgs);
const char* pp_mpi_error(const pp_mpi* t);
/* How waits poll. 0 (the default): spin 64 rounds, then sleep 20 then 100 us between polls,
   so ranks that share cores (tests, 8 ranks on 2 cores) leave them to the busy ones. 1: spin
   without sleeping (one rank per core: the lowest latency, like MPI's own waits). */
void pp_mpi_set_spin(pp_mpi* t, int spin);
/* 1: allreduce_sum adds in rank order on rank 0 and sends the sum back (pp_allreduce_p2p):
   every rank gets the same bits, equal to a sequential sum in rank order, at the cost of rank
   0's bandwidth. 0 (the default): MPI_Iallreduce, whose order is MPI's (two ranks: one
   commutative addition, so exact; more: may differ in the last bits from a sequential sum). */
void pp_mpi_set_ordered_sum(pp_mpi* t, int ordered);

/* A pp x dp grid over `world`: pipe is this rank's pipeline (its rank there is grid.pp_rank),
   dp its data-parallel group (rank grid.dp_rank), tied the pair {first, last stage rank} of this
   pipeline (ranks 0 and 1 there; NULL on the ranks in between; with pp = 1 a one-rank group).
   All abort together. Use tied when the embedding lives on pp rank 0 and the head on pp rank
   pp - 1; otherwise pass the owners' pipe ranks to pp_tied_sum_grads over pipe. */
typedef struct pp_mpi_grid {
    pp_grid grid;
    pp_mpi* pipe;
    pp_mpi* dp;
    pp_mpi* tied;
    pp_mpi* tp;     /* the TP group (pp_mpi_grid_create_tp, tp > 1; its ranks are the TP ranks); else NULL */
} pp_mpi_grid;

/* pp_grid is sized by PP_MAX_RANKS: linked under names carrying the configuration (pipeline.h) */
#define pp_mpi_grid_create _PP_ABI(mpi_grid_create)
#define pp_mpi_grid_create_tp _PP_ABI(mpi_grid_create_tp)
#define pp_mpi_grid_destroy _PP_ABI(mpi_grid_destroy)
pp_result pp_mpi_grid_create(MPI_Comm world, int pp, pp_grid_order order, pp_mpi_grid* out, pp_error* err);
/* pp x dp x tp (pp_grid_make_tp): also g.tp, the TP group's transport (for pp_tp_allreduce and
   friends: a pp_group with ranks NULL), in the same abort domain as the others. */
pp_result pp_mpi_grid_create_tp(MPI_Comm world, int pp, int tp, pp_grid_order order, pp_mpi_grid* out, pp_error* err);
void pp_mpi_grid_destroy(pp_mpi_grid* g);

#ifdef __cplusplus
}
#endif
#endif /* PIPELINE_MPI_H */

#if defined(PIPELINE_IMPLEMENTATION) && !defined(PIPELINE_MPI_IMPLEMENTATION_DONE)
#define PIPELINE_MPI_IMPLEMENTATION_DONE

#include <string.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

#define _PP_MPI_TAG_ABORT 1
/* An abort notice: the sender's rank in the domain and the code (two ints), then the failing
   rank's message, so that every rank can say the root cause. */
#define _PP_MPI_ABORT_BYTES 512
#define _PP_MPI_RESERVED 0x7ffffff0 /* pipeline.h's own tags live at and above this */

/* What a domain's members share: one communicator for abort notices, and what was heard. */
typedef struct _pp_mpi_domain {
    MPI_Comm comm;
    int refs;
    int aborted;
    pp_result code;
    char msg[_PP_MPI_ABORT_BYTES];
    MPI_Request* sends;             /* outstanding abort notices, freed at destroy */
    int n_sends;
    char abort_buf[_PP_MPI_ABORT_BYTES];
} _pp_mpi_domain;

/* One outstanding operation; every live one is on the transport's list, so destroy can
   cancel and free what an aborted step left behind. */
typedef struct _pp_mpi_op {
    struct _pp_mpi_op *next, *prev;
    MPI_Request r;
    int peer, tag, is_recv;         /* is_recv 2: a nonblocking all-reduce (peer -1) */
    size_t bytes;
} _pp_mpi_op;

struct pp_mpi {
    MPI_Comm comm;
    int rank, size, tag_ub, spin, ordered;
    int abandoned;              /* an all-reduce was left unfinished: its communicator must live on */
    _pp_mpi_domain* dom;
    _pp_mpi_op* ops;
    uint64_t bytes_sent, msgs_sent;
    char err[256];
};

static void _pp_mpi_note(pp_mpi* t, const char* fmt, ...) _PP_PRINTF(2, 3);
static void _pp_mpi_note(pp_mpi* t, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->err, sizeof t->err, fmt, ap);
    va_end(ap);
}

static void _pp_mpi_errstr(int code, char* buf, size_t n) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, s, &len) != MPI_SUCCESS) len = 0;
    s[len < MPI_MAX_ERROR_STRING ? len : MPI_MAX_ERROR_STRING - 1] = 0;
    snprintf(buf, n, "%s", len ? s : "unknown MPI error");
}

/* A pipeline.h tag as an MPI tag, or -1 when it does not fit under MPI_TAG_UB. */
static int _pp_mpi_tag(pp_mpi* t, int tag) {
    if (tag < 0) return -1;
    if (tag >= _PP_MPI_RESERVED) {
        int m = t->tag_ub - (0x7fffffff - tag);
        return m > t->tag_ub / 2 ? m : -1;
    }
    return tag <= t->tag_ub - 16 ? tag : -1;
}

/* Receives any abort notice waiting on the domain; 1 if the domain is aborted. */
static int _pp_mpi_poll_abort(pp_mpi* t) {
    _pp_mpi_domain* d = t->dom;
    int flag = 0;
    MPI_Status st;
    while (!d->aborted) {
        int head[2];
        if (MPI_Iprobe(MPI_ANY_SOURCE, _PP_MPI_TAG_ABORT, d->comm, &flag, &st) != MPI_SUCCESS || !flag) break;
        memset(d->abort_buf, 0, sizeof d->abort_buf);
        if (MPI_Recv(d->abort_buf, (int)sizeof d->abort_buf, MPI_BYTE, st.MPI_SOURCE, _PP_MPI_TAG_ABORT, d->comm,
                     MPI_STATUS_IGNORE) != MPI_SUCCESS)
            break;
        d->abort_buf[sizeof d->abort_buf - 1] = 0;
        memcpy(head, d->abort_buf, sizeof head);
        d->aborted = 1;
        d->code = head[1] > PP_OK && head[1] < PP_RESULT_COUNT ? (pp_result)head[1] : PP_ERR_TRANSPORT;
        if (d->abort_buf[sizeof head])
            snprintf(d->msg, sizeof d->msg, "%s", d->abort_buf + sizeof head);
        else
            snprintf(d->msg, sizeof d->msg, "%s: rank %d (of the abort domain) gave no message", pp_result_str(d->code),
                     head[0]);
    }
    return d->aborted;
}

static _pp_mpi_op* _pp_mpi_op_new(pp_mpi* t) {
    _pp_mpi_op* op = (_pp_mpi_op*)_pp_calloc(1, sizeof *op);
    if (!op) return NULL;
    op->r = MPI_REQUEST_NULL;
    op->next = t->ops;
    if (t->ops) t->ops->prev = op;
    t->ops = op;
    return op;
}

static void _pp_mpi_op_free(pp_mpi* t, _pp_mpi_op* op) {
    if (op->prev) op->prev->next = op->next; else t->ops = op->next;
    if (op->next) op->next->prev = op->prev;
    PP_FREE(op);
}

static pp_result _pp_mpi_post(pp_mpi* t, int is_recv, int peer, int tag, void* buf, size_t bytes, pp_request* req) {
    _pp_mpi_op* op;
    int mt, rc;
    if (!req || peer < 0 || peer >= t->size || (bytes && !buf)) return PP_ERR_INVALID;
    memset(req, 0, sizeof *req);
    if (bytes > (size_t)0x7fffffff) {
        _pp_mpi_note(t, "rank %d: message of %zu bytes is over MPI's int count", t->rank, bytes);
        return PP_ERR_UNSUPPORTED;
    }
    if ((mt = _pp_mpi_tag(t, tag)) < 0) {
        _pp_mpi_note(t, "rank %d: tag %d does not fit under MPI_TAG_UB = %d (fewer micro-batches or stages per step)",
                     t->rank, tag, t->tag_ub);
        return PP_ERR_UNSUPPORTED;
    }
    if (t->dom->aborted) return PP_ERR_ABORTED;
    if (!(op = _pp_mpi_op_new(t))) return PP_ERR_NOMEM;
    op->peer = peer;
    op->tag = tag;
    op->is_recv = is_recv;
    op->bytes = bytes;
    if (is_recv)
        rc = MPI_Irecv(buf, (int)bytes, MPI_BYTE, peer, mt, t->comm, &op->r);
    else
        rc = MPI_Isend(buf, (int)bytes, MPI_BYTE, peer, mt, t->comm, &op->r);
    if (rc != MPI_SUCCESS) {
        char e[128];
        _pp_mpi_errstr(rc, e, sizeof e);
        _pp_mpi_note(t, "rank %d: MPI_%s to rank %d: %s", t->rank, is_recv ? "Irecv" : "Isend", peer, e);
        _pp_mpi_op_free(t, op);
        return PP_ERR_TRANSPORT;
    }
    if (!is_recv) {
        t->bytes_sent += bytes;
        t->msgs_sent++;
    }
    req->impl = op;
    req->id = tag;
    return PP_OK;
}

static pp_result _pp_mpi_isend(void* self, int peer, int tag, const void* buf, size_t bytes, pp_request* req) {
    return _pp_mpi_post((pp_mpi*)self, 0, peer, tag, (void*)(uintptr_t)buf, bytes, req);
}

static pp_result _pp_mpi_irecv(void* self, int peer, int tag, void* buf, size_t bytes, pp_request* req) {
    return _pp_mpi_post((pp_mpi*)self, 1, peer, tag, buf, bytes, req);
}

/* Checks a completed operation's status: a receive must get exactly the bytes it posted. */
static pp_result _pp_mpi_finish(pp_mpi* t, _pp_mpi_op* op, int mpi_rc, MPI_Status* st, pp_error* err) {
    pp_result rc = PP_OK;
    int count = 0;
    if (mpi_rc == MPI_ERR_TRUNCATE || (mpi_rc != MPI_SUCCESS && st->MPI_ERROR == MPI_ERR_TRUNCATE)) {
        rc = _pp_fail(err, PP_ERR_SIZE, "rank %d expected %zu bytes from rank %d (tag %d), the sender sent more",
                      t->rank, op->bytes, op->peer, op->tag);
    } else if (mpi_rc != MPI_SUCCESS) {
        char e[128];
        _pp_mpi_errstr(mpi_rc, e, sizeof e);
        rc = _pp_fail(err, PP_ERR_TRANSPORT, "rank %d: MPI %s with rank %d: %s", t->rank,
                      op->is_recv == 2 ? "all-reduce" : op->is_recv ? "receive" : "send", op->peer, e);
    } else if (op->is_recv == 1 && MPI_Get_count(st, MPI_BYTE, &count) == MPI_SUCCESS && (size_t)count != op->bytes) {
        rc = _pp_fail(err, PP_ERR_SIZE, "rank %d expected %zu bytes from rank %d (tag %d), the sender sent %d", t->rank,
                      op->bytes, op->peer, op->tag, count);
    }
    if (rc != PP_OK) {
        size_t k = strlen(err ? err->msg : pp_result_str(rc));
        if (k >= sizeof t->err) k = sizeof t->err - 1;
        memcpy(t->err, err ? err->msg : pp_result_str(rc), k);
        t->err[k] = 0;
    }
    return rc;
}

/* Spins a few rounds, then sleeps: spinning would starve the other ranks on a shared core, and
   a sleep of at most 100 us bounds the latency it adds to a wait. */
static void _pp_mpi_backoff(const pp_mpi* t, int round) {
    struct timespec ts;
    long ns = round < 64 ? 0 : round < 256 ? 20000L : 100000L;
    if (!ns || t->spin) return;
    ts.tv_sec = 0;
    ts.tv_nsec = ns;
    nanosleep(&ts, NULL);
}

static void _pp_mpi_abort(void* self, pp_result why, const char* msg);

/* A started all-reduce left unfinished (a timeout, an abort, pp_dp_overlap_reset after a failed
   step): MPI can neither cancel nor free it, and it stays first in the communicator's order, so
   the next all-reduce of this rank would meet the peers' in the wrong place (the sum of another
   step's buffer, PP_OK). The transport refuses every later all-reduce (_pp_mpi_abandoned) and
   tells the domain at once, so that no peer waits into its deadline, or takes a stale sum. */
static void _pp_mpi_abandon(pp_mpi* t) {
    t->abandoned = 1;
#ifndef PP_TEST_NO_MPI_ABANDON /* negative control (build/mpi-dpfault-controls) */
    if (!t->dom->aborted)
        _pp_mpi_abort(t, PP_ERR_ABORTED, "an all-reduce of a failed step was left unfinished: make the transport again");
#endif
}

/* 1 (and a note) when an earlier all-reduce was left unfinished: no later one may start. */
static int _pp_mpi_abandoned(pp_mpi* t) {
#ifdef PP_TEST_NO_MPI_ABANDON
    return 0;
#endif
    if (!t->abandoned) return 0;
    _pp_mpi_note(t, "rank %d: an all-reduce of a failed step was left unfinished on this communicator: make the "
                 "transport again (pp_mpi_grid_destroy, pp_mpi_grid_create)", t->rank);
    return 1;
}

/* Cancels a request nobody will wait for again (abort or timeout) and frees its op. */
static void _pp_mpi_drop(pp_mpi* t, _pp_mpi_op* op) {
    if (op->r != MPI_REQUEST_NULL) {
        if (op->is_recv == 2) {
            _pp_mpi_abandon(t); /* a collective may be neither cancelled nor freed (_pp_mpi_allreduce) */
        } else if (op->is_recv) {
            MPI_Cancel(&op->r);
            MPI_Wait(&op->r, MPI_STATUS_IGNORE); /* a cancelled receive completes at once */
        } else {
            MPI_Request_free(&op->r);         /* the send may still complete in the background */
        }
    }
    _pp_mpi_op_free(t, op);
}

static pp_result _pp_mpi_wait(void* self, pp_request* req, double timeout_s, pp_error* err) {
    pp_mpi* t = (pp_mpi*)self;
    _pp_mpi_op* op = (_pp_mpi_op*)req->impl;
    double dt = timeout_s > 0 ? timeout_s : PP_DEFAULT_TIMEOUT_S, deadline = _pp_now() + dt;
    int round = 0;
    if (req->done || !op) return PP_OK;
    for (;; round++) {
        MPI_Status st;
        int flag = 0, rc;
        memset(&st, 0, sizeof st);
        rc = MPI_Test(&op->r, &flag, &st);
        if (rc != MPI_SUCCESS || flag) {
            pp_result r = _pp_mpi_finish(t, op, rc, &st, err);
            op->r = MPI_REQUEST_NULL;
            _pp_mpi_op_free(t, op);
            req->impl = NULL;
            req->done = 1;
            return r;
        }
        if ((round & 7) == 0 && _pp_mpi_poll_abort(t)) {
            int peer = op->peer;
            _pp_mpi_drop(t, op);
            req->impl = NULL;
            req->done = 1;
            if (peer < 0) return _pp_fail(err, PP_ERR_ABORTED, "rank %d stopped waiting in an all-reduce: %s", t->rank, t->dom->msg);
            return _pp_fail(err, PP_ERR_ABORTED, "rank %d stopped waiting for rank %d: %s", t->rank, peer, t->dom->msg);
        }
        if (_pp_now() > deadline) {
            int peer = op->peer, is_recv = op->is_recv;
            if (!is_recv && dt <= _PP_RETIRE_WAIT_S) /* the executor's probe of a retiring block: the */
                return _pp_fail(err, PP_ERR_TIMEOUT, /* send stays posted, its block stays unused */
                                "rank %d: a send to rank %d is not done after %.3g s", t->rank, peer, dt);
            _pp_mpi_drop(t, op);
            req->impl = NULL;
            req->done = 1;
            _pp_mpi_note(t, "rank %d waited %.3g s for rank %d", t->rank, dt, peer);
            if (is_recv == 2)
                return _pp_fail(err, PP_ERR_TIMEOUT, "rank %d waited %.3g s in an all-reduce over %d ranks", t->rank, dt,
                                t->size);
            return _pp_fail(err, PP_ERR_TIMEOUT, "rank %d waited %.3g s for rank %d to %s and got nothing", t->rank, dt,
                            peer, is_recv ? "send" : "receive");
        }
        _pp_mpi_backoff(t, round);
    }
}

static pp_result _pp_mpi_test(void* self, pp_request* req, int* done) {
    pp_mpi* t = (pp_mpi*)self;
    _pp_mpi_op* op = (_pp_mpi_op*)req->impl;
    int flag = 0;
    if (req->done || !op) {
        *done = 1;
        return PP_OK;
    }
    /* Only sends are tested by the executor; a finished one is freed here, a receive's status
       (and an all-reduce's) is kept for its wait. */
    if (op->is_recv) {
        *done = 0;
        return PP_OK;
    }
    if (MPI_Test(&op->r, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
        *done = 0;
        return PP_ERR_TRANSPORT;
    }
    *done = flag;
    if (flag) {
        op->r = MPI_REQUEST_NULL;
        _pp_mpi_op_free(t, op);
        req->impl = NULL;
        req->done = 1;
    }
    return PP_OK;
}

/* A receive (or send) nobody will wait for after a failed step: cancelled and freed, so it
   cannot swallow a later message. */
static pp_result _pp_mpi_cancel(void* self, pp_request* req) {
    pp_mpi* t = (pp_mpi*)self;
    _pp_mpi_op* op = req ? (_pp_mpi_op*)req->impl : NULL;
    if (!op) return PP_OK;
    _pp_mpi_drop(t, op);
    req->impl = NULL;
    req->done = 1;
    return PP_OK;
}

static pp_result _pp_mpi_allreduce(void* self, void* buf, size_t count, pp_dtype dtype, const int* ranks, int n_ranks,
                                   double timeout_s, pp_error* err) {
    pp_mpi* t = (pp_mpi*)self;
    int whole = _pp_ranks_whole(ranks, n_ranks, t->size), rc, round = 0;
    double dt = timeout_s > 0 ? timeout_s : PP_DEFAULT_TIMEOUT_S, deadline = _pp_now() + dt;
    MPI_Request r;
    if (!whole || t->ordered || count > (size_t)0x7fffffff) {
        pp_transport tr = pp_mpi_transport(t);
        return pp_allreduce_p2p(&tr, buf, count, dtype, ranks, n_ranks, timeout_s, err);
    }
    if (!buf || (dtype != PP_F32 && dtype != PP_F64))
        return _pp_fail(err, PP_ERR_INVALID, "all-reduce needs a buffer and an f32/f64 dtype");
    if (n_ranks == 1 || count == 0) return PP_OK;
    if (_pp_mpi_abandoned(t)) return _pp_fail(err, PP_ERR_ABORTED, "%s", t->err);
    if (_pp_mpi_poll_abort(t)) return _pp_fail(err, PP_ERR_ABORTED, "rank %d: all-reduce: %s", t->rank, t->dom->msg);
    rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)count, dtype == PP_F32 ? MPI_FLOAT : MPI_DOUBLE, MPI_SUM, t->comm, &r);
    if (rc != MPI_SUCCESS) {
        char e[128];
        _pp_mpi_errstr(rc, e, sizeof e);
        return _pp_fail(err, PP_ERR_TRANSPORT, "rank %d: MPI_Iallreduce: %s", t->rank, e);
    }
    for (;; round++) {
        int flag = 0;
        if ((rc = MPI_Test(&r, &flag, MPI_STATUS_IGNORE)) != MPI_SUCCESS) {
            char e[128];
            _pp_mpi_errstr(rc, e, sizeof e);
            return _pp_fail(err, PP_ERR_TRANSPORT, "rank %d: all-reduce: %s", t->rank, e);
        }
        if (flag) return PP_OK;
        /* A nonblocking collective may be neither cancelled nor freed (the standard calls both
           erroneous): after an abort or a timeout its request is abandoned, and the transport,
           unusable from here on, should be destroyed. */
        if ((round & 7) == 0 && _pp_mpi_poll_abort(t)) {
            _pp_mpi_abandon(t);
            return _pp_fail(err, PP_ERR_ABORTED, "rank %d stopped waiting in an all-reduce: %s", t->rank, t->dom->msg);
        }
        if (_pp_now() > deadline) {
            _pp_mpi_abandon(t);
            t->dom->aborted = 1;
            if (!t->dom->msg[0]) snprintf(t->dom->msg, sizeof t->dom->msg, "rank %d: all-reduce timed out", t->rank);
            return _pp_fail(err, PP_ERR_TIMEOUT, "rank %d waited %.3g s in an all-reduce over %d ranks", t->rank, dt,
                            n_ranks);
        }
        _pp_mpi_backoff(t, round);
    }
}

/* The nonblocking all-reduce (pp_transport.iallreduce_sum): MPI_Iallreduce over the whole
   communicator, as _pp_mpi_allreduce's (the same bits), completed by _pp_mpi_wait. Anything
   _pp_mpi_allreduce sends through pp_allreduce_p2p (a subset, the ordered sum, more than an
   int of elements) is PP_ERR_UNSUPPORTED: the caller calls allreduce_sum. */
static pp_result _pp_mpi_iallreduce(void* self, void* buf, size_t count, pp_dtype dtype, const int* ranks, int n_ranks,
                                    pp_request* req) {
    pp_mpi* t = (pp_mpi*)self;
    _pp_mpi_op* op;
    int whole = _pp_ranks_whole(ranks, n_ranks, t->size), rc;
    if (!req || !buf || count == 0) return PP_ERR_INVALID;
    memset(req, 0, sizeof *req);
    if (!whole || t->ordered || count > (size_t)0x7fffffff || (dtype != PP_F32 && dtype != PP_F64)) return PP_ERR_UNSUPPORTED;
    if (_pp_mpi_abandoned(t)) return PP_ERR_ABORTED;
    if (_pp_mpi_poll_abort(t)) return PP_ERR_ABORTED;
    if (!(op = _pp_mpi_op_new(t))) return PP_ERR_NOMEM;
    op->peer = -1;
    op->is_recv = 2;
    op->bytes = count * pp_dtype_size(dtype);
    rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)count, dtype == PP_F32 ? MPI_FLOAT : MPI_DOUBLE, MPI_SUM, t->comm, &op->r);
    if (rc != MPI_SUCCESS) {
        char e[128];
        _pp_mpi_errstr(rc, e, sizeof e);
        _pp_mpi_note(t, "rank %d: MPI_Iallreduce: %s", t->rank, e);
        _pp_mpi_op_free(t, op);
        return PP_ERR_TRANSPORT;
    }
    req->impl = op;
    return PP_OK;
}

/* Tells every member of the domain; does not wait for delivery (a dead peer must not block it). */
static void _pp_mpi_abort(void* self, pp_result why, const char* msg) {
    pp_mpi* t = (pp_mpi*)self;
    _pp_mpi_domain* d = t->dom;
    int n = 0, me = 0, r, head[2];
    size_t len;
    if (d->aborted) return;
    d->aborted = 1;
    d->code = why;
    _pp_abort_text(d->msg, sizeof d->msg, t->rank, why, msg);
    MPI_Comm_size(d->comm, &n);
    MPI_Comm_rank(d->comm, &me);
    head[0] = me;
    head[1] = (int)why;
    memset(d->abort_buf, 0, sizeof d->abort_buf);
    memcpy(d->abort_buf, head, sizeof head);
    len = strlen(d->msg);
    if (len > sizeof d->abort_buf - sizeof head - 1) len = sizeof d->abort_buf - sizeof head - 1;
    memcpy(d->abort_buf + sizeof head, d->msg, len); /* the rest is zero */
    len += sizeof head + 1;
    d->sends = (MPI_Request*)_pp_calloc((size_t)n, sizeof *d->sends);
    if (!d->sends) return;
    for (r = 0; r < n; r++) {
        if (r == me) continue;
        if (MPI_Isend(d->abort_buf, (int)len, MPI_BYTE, r, _PP_MPI_TAG_ABORT, d->comm, &d->sends[d->n_sends]) ==
            MPI_SUCCESS)
            d->n_sends++;
    }
}

static int _pp_mpi_abort_reason(void* self, char* buf, size_t n) {
    pp_mpi* t = (pp_mpi*)self;
    if (!buf || n == 0 || !_pp_mpi_poll_abort(t)) return 0;
    snprintf(buf, n, "%s", t->dom->msg);
    return 1;
}

pp_transport pp_mpi_transport(pp_mpi* t) {
    pp_transport tr;
    memset(&tr, 0, sizeof tr);
    if (!t) return tr;
    tr.self = t;
    tr.rank = t->rank;
    tr.size = t->size;
    tr.isend = _pp_mpi_isend;
    tr.irecv = _pp_mpi_irecv;
    tr.wait = _pp_mpi_wait;
    tr.test = _pp_mpi_test;
    tr.allreduce_sum = _pp_mpi_allreduce;
    tr.iallreduce_sum = _pp_mpi_iallreduce;
    tr.abort = _pp_mpi_abort;
    tr.cancel = _pp_mpi_cancel;
    tr.abort_reason = _pp_mpi_abort_reason;
    return tr;
}

static pp_result _pp_mpi_dup(MPI_Comm in, MPI_Comm* out, pp_error* err) {
    int rc = MPI_Comm_dup(in, out);
    if (rc != MPI_SUCCESS) {
        char e[128];
        _pp_mpi_errstr(rc, e, sizeof e);
        return _pp_fail(err, PP_ERR_TRANSPORT, "MPI_Comm_dup: %s", e);
    }
    MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN);
    return PP_OK;
}

static void _pp_mpi_domain_release(_pp_mpi_domain* d) {
    int i;
    if (!d || --d->refs > 0) return;
    for (i = 0; i < d->n_sends; i++) {
        /* the notice may never be received (its peer finished or died): let it go */
        int flag = 0;
        MPI_Test(&d->sends[i], &flag, MPI_STATUS_IGNORE);
        if (!flag) MPI_Request_free(&d->sends[i]);
    }
    PP_FREE(d->sends);
    MPI_Comm_free(&d->comm);
    PP_FREE(d);
}

static pp_result _pp_mpi_create(MPI_Comm comm, _pp_mpi_domain* shared, MPI_Comm abort_comm, pp_mpi** out,
                                pp_error* err) {
    pp_mpi* t;
    void* ub = NULL;
    int flag = 0, init = 0;
    pp_result rc;
    if (!out) return _pp_fail(err, PP_ERR_INVALID, "output pointer is NULL");
    *out = NULL;
    MPI_Initialized(&init);
    if (!init) return _pp_fail(err, PP_ERR_INVALID, "MPI is not initialised (call MPI_Init first)");
    if (comm == MPI_COMM_NULL) return _pp_fail(err, PP_ERR_INVALID, "communicator is MPI_COMM_NULL");
    if (!(t = (pp_mpi*)_pp_calloc(1, sizeof *t))) return _pp_fail(err, PP_ERR_NOMEM, "MPI transport");
    if ((rc = _pp_mpi_dup(comm, &t->comm, err)) != PP_OK) {
        PP_FREE(t);
        return rc;
    }
    MPI_Comm_rank(t->comm, &t->rank);
    MPI_Comm_size(t->comm, &t->size);
    if (t->size > PP_MAX_RANKS) {
        int n = t->size;
        MPI_Comm_free(&t->comm);
        PP_FREE(t);
        return _pp_fail(err, PP_ERR_INVALID, "communicator has %d ranks, PP_MAX_RANKS is %d", n, PP_MAX_RANKS);
    }
    MPI_Comm_get_attr(t->comm, MPI_TAG_UB, &ub, &flag);
#ifndef PP_MPI_TEST_SPLIT_TAG_MIN /* negative control (build/mpi-controls): a split's bound is the minimum */
    /* MPI defines MPI_TAG_UB on MPI_COMM_WORLD, valid for every communicator; Open MPI attaches
       it to MPI_COMM_WORLD and its duplicates only, not to a split (a grid's groups): the
       world's, rather than the standard's minimum of 32767 */
    if (!flag || !ub) MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
#endif
    t->tag_ub = flag && ub ? *(int*)ub : 32767;
    if (shared) {
        shared->refs++;
        t->dom = shared;
    } else {
        _pp_mpi_domain* d = (_pp_mpi_domain*)_pp_calloc(1, sizeof *d);
        if (!d || (rc = _pp_mpi_dup(abort_comm == MPI_COMM_NULL ? comm : abort_comm, &d->comm, err)) != PP_OK) {
            PP_FREE(d);
            MPI_Comm_free(&t->comm);
            PP_FREE(t);
            return d ? rc : _pp_fail(err, PP_ERR_NOMEM, "MPI abort domain");
        }
        d->refs = 1;
        t->dom = d;
    }
    *out = t;
    return PP_OK;
}

pp_result pp_mpi_create(MPI_Comm comm, MPI_Comm abort_comm, pp_mpi** out, pp_error* err) {
    return _pp_mpi_create(comm, NULL, abort_comm, out, err);
}

void pp_mpi_destroy(pp_mpi* t) {
    if (!t) return;
    while (t->ops) _pp_mpi_drop(t, t->ops);
    _pp_mpi_domain_release(t->dom);
    /* MPI keeps progressing an unfinished collective on its communicator (Open MPI's libnbc
       crashes if that communicator is freed under it): leave such a communicator to MPI */
    if (!t->abandoned) MPI_Comm_free(&t->comm);
    PP_FREE(t);
}

void pp_mpi_counters(const pp_mpi* t, uint64_t* bytes, uint64_t* msgs) {
    if (bytes) *bytes = t ? t->bytes_sent : 0;
    if (msgs) *msgs = t ? t->msgs_sent : 0;
}

const char* pp_mpi_error(const pp_mpi* t) { return t ? t->err : "transport is NULL"; }

void pp_mpi_set_spin(pp_mpi* t, int spin) {
    if (t) t->spin = spin != 0;
}

void pp_mpi_set_ordered_sum(pp_mpi* t, int ordered) {
    if (t) t->ordered = ordered != 0;
}

pp_result pp_mpi_grid_create_tp(MPI_Comm world, int pp, int tp, pp_grid_order order, pp_mpi_grid* g, pp_error* err) {
    MPI_Comm pipe = MPI_COMM_NULL, dp = MPI_COMM_NULL, tied = MPI_COMM_NULL, tpc = MPI_COMM_NULL;
    int n = 0, me = 0, color, key;
    pp_result rc;
    if (!g) return _pp_fail(err, PP_ERR_INVALID, "output pointer is NULL");
    memset(g, 0, sizeof *g);
    if (world == MPI_COMM_NULL) return _pp_fail(err, PP_ERR_INVALID, "communicator is MPI_COMM_NULL");
    MPI_Comm_size(world, &n);
    MPI_Comm_rank(world, &me);
    if ((rc = pp_grid_make_tp(n, me, pp, tp, order, &g->grid, err)) != PP_OK) return rc;
    if (tp > 1) {
        pp_grid_tp_split(&g->grid, &color, &key);
        if (MPI_Comm_split(world, color, key, &tpc) != MPI_SUCCESS)
            return _pp_fail(err, PP_ERR_TRANSPORT, "MPI_Comm_split for the TP group");
    }
    pp_grid_pipe_split(&g->grid, &color, &key);
    if (MPI_Comm_split(world, color, key, &pipe) != MPI_SUCCESS) {
        if (tpc != MPI_COMM_NULL) MPI_Comm_free(&tpc);
        return _pp_fail(err, PP_ERR_TRANSPORT, "MPI_Comm_split for the pipeline group");
    }
    pp_grid_dp_split(&g->grid, &color, &key);
    if (MPI_Comm_split(world, color, key, &dp) != MPI_SUCCESS) {
        MPI_Comm_free(&pipe);
        if (tpc != MPI_COMM_NULL) MPI_Comm_free(&tpc);
        return _pp_fail(err, PP_ERR_TRANSPORT, "MPI_Comm_split for the data-parallel group");
    }
    pp_grid_tied_split(&g->grid, &color, &key);
    if (MPI_Comm_split(world, color < 0 ? MPI_UNDEFINED : color, key, &tied) != MPI_SUCCESS) {
        MPI_Comm_free(&pipe);
        MPI_Comm_free(&dp);
        if (tpc != MPI_COMM_NULL) MPI_Comm_free(&tpc);
        return _pp_fail(err, PP_ERR_TRANSPORT, "MPI_Comm_split for the tied pair");
    }
    rc = _pp_mpi_create(pipe, NULL, world, &g->pipe, err);
    if (rc == PP_OK) rc = _pp_mpi_create(dp, g->pipe->dom, MPI_COMM_NULL, &g->dp, err);
    if (rc == PP_OK && tied != MPI_COMM_NULL) rc = _pp_mpi_create(tied, g->pipe->dom, MPI_COMM_NULL, &g->tied, err);
    if (rc == PP_OK && tpc != MPI_COMM_NULL) rc = _pp_mpi_create(tpc, g->pipe->dom, MPI_COMM_NULL, &g->tp, err);
    MPI_Comm_free(&pipe);
    MPI_Comm_free(&dp);
    if (tied != MPI_COMM_NULL) MPI_Comm_free(&tied);
    if (tpc != MPI_COMM_NULL) MPI_Comm_free(&tpc);
    if (rc != PP_OK) {
        pp_mpi_grid_destroy(g);
        return rc;
    }
    return PP_OK;
}

pp_result pp_mpi_grid_create(MPI_Comm world, int pp, pp_grid_order order, pp_mpi_grid* g, pp_error* err) {
    return pp_mpi_grid_create_tp(world, pp, 1, order, g, err);
}

void pp_mpi_grid_destroy(pp_mpi_grid* g) {
    if (!g) return;
    pp_mpi_destroy(g->tp);
    pp_mpi_destroy(g->tied);
    pp_mpi_destroy(g->dp);
    pp_mpi_destroy(g->pipe);
    g->tp = g->tied = g->dp = g->pipe = NULL;
}

#ifdef __cplusplus
}
#endif
#endif /* PIPELINE_IMPLEMENTATION && !PIPELINE_MPI_IMPLEMENTATION_DONE */
