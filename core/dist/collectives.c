/*
 * collectives.c: the collectives every backend shares: checking tensors,
 * staging 16-bit floats in f32, averaging, work handles with deadlines,
 * and the monitored barrier.
 *
 * A collective checks its tensors (naming the collective, the group, this
 * rank and the shapes), hands the backend contiguous buffers, and returns
 * a work. Groups of one rank never reach the backend: the result is the
 * input. Meta and fake tensors are checked and nothing moves, so planning
 * a sharded model on meta runs the same code as training it.
 *
 * [Note: 16-bit reductions]
 * MPI has no bf16 type, and a user-defined MPI_Op on bf16 would round
 * every partial sum to bf16 (a ring all-reduce over 8 ranks adds 7
 * roundings). So bf16 and f16 reductions convert the input to an f32
 * buffer, reduce in f32 and round once into the output: accumulation in
 * fp32, at twice the bytes on the wire (CPU tensors move through memory,
 * where that is cheap next to the compute). Gathers and broadcasts move
 * 16-bit values as they are.
 *
 * [Note: progress and waiting]
 * Collectives are non-blocking MPI (MPI_Iallgather...), so the rank
 * computes while data moves. Open MPI moves non-blocking collectives only
 * inside MPI calls; the MPI backend therefore runs a progress thread that
 * tests outstanding requests every FSDP_PROGRESS_INTERVAL_US (default 100)
 * microseconds while any exist (see core/dist/mpi/backend_mpi.c), and
 * fl_work_test / fl_work_wait progress them too. A wait polls: it yields
 * the core between polls for the first second (see fl_dist_pause), then
 * sleeps briefly, and fails after the collective timeout instead of
 * hanging (MPI's own MPI_Wait cannot be bounded). Post-processing (averaging, rounding back
 * to bf16) runs in the thread that sees the completion, never in the
 * progress thread.
 *
 * [Note: a collective that never completes]
 * A wait that times out leaves the request with MPI: a late rank may still
 * send, and MPI then writes into the work's buffers. MPI cannot cancel a
 * collective, so the work keeps its tensors (and staging buffers)
 * referenced until the request completes, which may be never
 * (fl_work_is_pending tells a caller that unmaps pages itself, the sharded
 * unit, to keep them), and the runtime is marked broken: no collective
 * starts again on this rank (its sequence on the group is lost), and
 * leaving aborts the job instead of finalizing. The error that reports the
 * timeout normally ends the job anyway (the host aborts on it); this is
 * what keeps a script that catches it from crashing inside MPI (SIGSEGV in
 * MPI_Test writing into decommitted pages, seen under load).
 */
#include "dist.h"

#include <string.h>

struct fl_work {
    const char *name;  /* the collective */
    fl_group *group;   /* reference */
    fl_tensor *keep[2];/* the caller's tensors, referenced until completion */
    fl_tensor *result; /* where the result goes (an output, or in place) */
    fl_tensor *stage_in, *stage_out; /* f32 staging of 16-bit reductions */
    fl_tensor *device_out, *host_out; /* a device result and its host stand-in */
    void *req;         /* the backend's request while in flight */
    const fl_device_comm_ops *dops; /* set when req is the device library's */
    bool average;      /* divide the sum by the group size when done */
    int kind;          /* fl_coll_kind counted for it, or -1 (nothing moved) */
    bool completed, failed;
    fl_status status;  /* of a failed work */
    char message[1024];
    fl_work *next;     /* in fl_dist.dropped */
};

/* Collectives this process started that move data between ranks (a group
 * of one, an empty tensor and the host copies of a device collective that
 * has no device library are not counted twice), by kind: how many, the
 * bytes of their buffers as handed to the backend, and the time the host
 * spent blocked waiting for them (fl_dist_collective_stats). Tests count
 * communication with them; the recipes log them per step. */
static int64_t coll_started[FL_COLL_BARRIER + 1];
static int64_t coll_bytes[FL_COLL_BARRIER + 1];
static double coll_wait[FL_COLL_BARRIER + 1];

/* ---- messages ------------------------------------------------------------- */

/* "all_reduce on group world (rank 1 of 4)" */
static const char *where(char *buf, size_t size, const char *op, const fl_group *g) {
    if (g && g->comm)
        snprintf(buf, size, "%s on group %s (rank %d of %d, world rank %d)", op, g->name,
                 g->rank, g->size, fl_dist.topo.rank);
    else
        snprintf(buf, size, "%s", op);
    return buf;
}

static int fail_at(const char *op, const fl_group *g, fl_status status, const char *what) {
    char w[160];
    return fl_fail(status, "%s: %s", where(w, sizeof w, op, g), what);
}

/* ---- works ----------------------------------------------------------------- */

static fl_work *work_new(const char *name, fl_group *g) {
    fl_work *w = calloc(1, sizeof *w);
    if (!w) return FL_FAIL_NULL(FL_ERR_OOM, "%s: out of memory for the work handle", name);
    w->name = name;
    w->group = fl_group_retain(g);
    w->kind = -1;
    return w;
}

static void work_drop_tensors(fl_work *w) {
    for (int i = 0; i < 2; i++) {
        fl_tensor_release(w->keep[i]);
        w->keep[i] = NULL;
    }
    fl_tensor_release(w->stage_in);
    fl_tensor_release(w->stage_out);
    fl_tensor_release(w->device_out);
    fl_tensor_release(w->host_out);
    w->stage_in = w->stage_out = w->device_out = w->host_out = NULL;
    w->result = NULL;
}

static void work_free(fl_work *w) {
    work_drop_tensors(w);
    fl_group_release(w->group);
    free(w);
}

static void divide(void *data, fl_dtype dtype, int64_t n, double by) {
    if (dtype == FL_F64) {
        double *x = data;
#pragma omp parallel for if (n >= 65536)
        for (int64_t i = 0; i < n; i++) x[i] /= by;
    } else {
        float *x = data;
        float f = (float)by;
#pragma omp parallel for if (n >= 65536)
        for (int64_t i = 0; i < n; i++) x[i] /= f;
    }
}

/* What follows the backend's completion: average, round back to 16 bits. */
static int work_finish(fl_work *w) {
    fl_tensor *r = w->stage_out ? w->stage_out : w->result;
    if (w->average && r) divide(r->data, r->dtype, r->numel, (double)w->group->size);
    if ((w->stage_out &&
         fl_convert(w->result->data, w->result->dtype, r->data, r->dtype, r->numel) != FL_OK) ||
        (w->device_out && fl_copy_(w->device_out, w->host_out) != FL_OK)) {
        work_drop_tensors(w);
        return fl_last_status();
    }
    work_drop_tensors(w);
    w->completed = true;
    return FL_OK;
}

static int work_fail(fl_work *w, fl_status status, const char *what) {
    fail_at(w->name, w->group, status, what);
    snprintf(w->message, sizeof w->message, "%s", fl_last_error());
    w->status = status;
    w->failed = true;
    return status;
}

/* One step of progress: test the request, finish when it completed. */
static int work_progress(fl_work *w, bool *done) {
    *done = w->completed;
    if (w->completed) return FL_OK;
    if (w->failed) return fl_fail(w->status, "%s", w->message);
    if (w->req) {
        bool finished = false;
        int rc = w->dops ? w->dops->test(w->req, &finished) : fl_dist.backend->test(w->req, &finished);
        if (rc != FL_OK) {
            w->req = NULL; /* the backend freed it */
            char why[400];
            snprintf(why, sizeof why, "%s", fl_last_error());
            work_drop_tensors(w);
            return work_fail(w, FL_ERR_DEVICE, why);
        }
        if (!finished) return FL_OK;
        w->req = NULL;
    }
    int rc = work_finish(w);
    if (rc != FL_OK) {
        char why[400];
        snprintf(why, sizeof why, "%s", fl_last_error());
        return work_fail(w, (fl_status)rc, why);
    }
    *done = true;
    return FL_OK;
}

int fl_work_test(fl_work *w, bool *done) {
    if (!w || !done) return fl_fail(FL_ERR_ARG, "work test: NULL argument");
    fl_dist_progress_dropped();
    return work_progress(w, done);
}

/* [Note: a collective that never completes] */
static int work_time_out(fl_work *w) {
    char report[640] = "", why[1000];
    fl_roll_answer *a = w->dops ? NULL : fl_dist_roll_call(w->group, FL_ROLL_CALL_SECONDS);
    if (a) fl_dist_roll_report(a, w->group->size, FL_ROLL_CALL_SECONDS, report, sizeof report);
    free(a);
    if (report[0])
        snprintf(why, sizeof why,
                 "not complete after waiting %g s (the collective timeout, "
                 "FSDP_COLLECTIVE_TIMEOUT): %s",
                 fl_dist.timeout, report);
    else
        snprintf(why, sizeof why,
                 "not complete after waiting %g s (the collective timeout, "
                 "FSDP_COLLECTIVE_TIMEOUT): a rank of the group has not started it, has "
                 "failed, or started this group's collectives in another order",
                 fl_dist.timeout);
    int rc = work_fail(w, FL_ERR_DEVICE, why);
    if (w->req && !fl_dist.broken) {
        fl_dist.broken = true;
        snprintf(fl_dist.broken_message, sizeof fl_dist.broken_message, "%.500s", w->message);
    }
    return rc;
}

int fl_work_wait(fl_work *w) {
    if (!w) return fl_fail(FL_ERR_ARG, "work wait: NULL work");
    if (w->dops && w->req && !w->failed) {
        /* The device library's work: the device waits for it, the host goes
         * on ([Note: ordered collectives]); nothing is left to finish. */
        void *req = w->req;
        w->req = NULL;
        if (w->dops->order(req) != FL_OK) {
            /* The message names the collective that failed (this one or
             * one waited for earlier): kept as it is. */
            snprintf(w->message, sizeof w->message, "%s", fl_last_error());
            w->status = fl_last_status();
            w->failed = true;
            work_drop_tensors(w);
            return w->status;
        }
    }
    double start = fl_dist_now();
    for (;;) {
        bool done;
        int rc = work_progress(w, &done);
        if (rc != FL_OK || done) {
            if (w->kind >= 0) coll_wait[w->kind] += fl_dist_now() - start;
            return rc;
        }
        double waited = fl_dist_now() - start;
        if (waited > fl_dist.timeout) return work_time_out(w);
        fl_dist_pause(waited);
    }
}

bool fl_work_is_completed(const fl_work *w) { return w && w->completed; }

bool fl_work_is_pending(const fl_work *w) { return w && !w->completed && w->req; }

const char *fl_work_name(const fl_work *w) { return w ? w->name : "(null work)"; }

void fl_work_release(fl_work *w) {
    if (!w) return;
    if (w->completed || !w->req || fl_dist.finalized) {
        work_free(w);
        return;
    }
    /* The backend still writes into its buffers: keep them until done. */
    w->next = fl_dist.dropped;
    fl_dist.dropped = w;
}

void fl_dist_progress_dropped(void) {
    fl_work **link = &fl_dist.dropped;
    while (*link) {
        fl_work *w = *link;
        bool gone = true;
        if (w->req) {
            bool done = false;
            int rc = w->dops ? w->dops->test(w->req, &done) : fl_dist.backend->test(w->req, &done);
            if (rc != FL_OK) {
                w->req = NULL; /* failed: the backend freed it; nothing to finish */
                w->failed = true;
            } else if (done) {
                w->req = NULL;
            } else {
                gone = false; /* still writing into the buffers it holds */
            }
        }
        if (gone) {
            /* Nobody can wait for it any more, but its outputs are still
             * made right (averaged, rounded back), as the caller expects
             * from a collective it did not cancel. */
            if (!w->failed && !w->completed) work_finish(w);
            *link = w->next;
            work_free(w);
        } else {
            link = &w->next;
        }
    }
}

void fl_dist_drain_dropped(double seconds) {
    double start = fl_dist_now();
    while (fl_dist.dropped) {
        fl_dist_progress_dropped();
        double waited = fl_dist_now() - start;
        if (!fl_dist.dropped) break;
        if (waited > seconds) {
            int n = 0;
            for (fl_work *w = fl_dist.dropped; w; w = w->next) n++;
            fprintf(stderr,
                    "fsdp-lua: rank %d: %d collective(s) released before completion (first: "
                    "%s on group %s) did not complete within %g s; shutting down anyway\n",
                    fl_dist.topo.rank, n, fl_dist.dropped->name, fl_dist.dropped->group->name,
                    seconds);
            return;
        }
        fl_dist_pause(waited);
    }
}

/* ---- checking tensors -------------------------------------------------------- */

static int check_tensor(const char *op, const fl_group *g, const char *role, const fl_tensor *t) {
    char why[256];
    if (!t) {
        snprintf(why, sizeof why, "%s tensor is NULL", role);
        return fail_at(op, g, FL_ERR_ARG, why);
    }
    if (!t->storage) return FL_OK; /* meta or fake: shapes only */
    if (!fl_tensor_is_contiguous(t)) {
        char shape[96];
        snprintf(why, sizeof why, "%s tensor of shape %s is not contiguous (call contiguous())",
                 role, fl_shape_str(t, shape, sizeof shape));
        return fail_at(op, g, FL_ERR_ARG, why);
    }
    return FL_OK;
}

static int check_reduce_op(const char *op, const fl_group *g, fl_reduce_op rop, fl_dtype dtype) {
    char why[160];
    if ((int)rop < 0 || rop >= FL_REDUCE_OP_COUNT) {
        snprintf(why, sizeof why, "invalid reduce op %d (expected sum, avg, max or min)",
                 (int)rop);
        return fail_at(op, g, FL_ERR_ARG, why);
    }
    if (rop == FL_REDUCE_AVG && !fl_dtype_is_float(dtype)) {
        snprintf(why, sizeof why, "avg needs a float dtype, the tensor is %s (use sum)",
                 fl_dtype_name(dtype));
        return fail_at(op, g, FL_ERR_ARG, why);
    }
    if (rop == FL_REDUCE_SUM && dtype == FL_BOOL) {
        snprintf(why, sizeof why, "sum of bool tensors is not defined (max is any, min is all)");
        return fail_at(op, g, FL_ERR_ARG, why);
    }
    return FL_OK;
}

static bool is_16bit_float(fl_dtype d) { return d == FL_BF16 || d == FL_F16; }

static bool overlap(const fl_tensor *a, const fl_tensor *b) {
    const char *pa = a->data, *pb = b->data;
    int64_t na = a->numel * (int64_t)fl_dtype_size(a->dtype);
    int64_t nb = b->numel * (int64_t)fl_dtype_size(b->dtype);
    return pa < pb + nb && pb < pa + na;
}

static int check_count(const char *op, const fl_group *g, int64_t count) {
    if (count <= INT32_MAX) return FL_OK;
    char why[160];
    snprintf(why, sizeof why, "%lld elements per rank exceed MPI's count limit of %d; split it",
             (long long)count, INT32_MAX);
    return fail_at(op, g, FL_ERR_ARG, why);
}

/* A work that is complete from the start (nothing to move). */
static fl_work *done_work(const char *name, fl_group *g) {
    fl_work *w = work_new(name, g);
    if (w) w->completed = true;
    return w;
}

/* Count c, started on a group of group_size ranks, for w. The buffer is
 * the whole gathered output of an all_gather and the whole input of a
 * reduce_scatter (count is one rank's part), the tensor of an all_reduce
 * or broadcast; 16-bit reductions arrive here already staged in f32. */
static void count_started(fl_work *w, const fl_coll *c, int group_size) {
    if ((int)c->kind < 0 || (int)c->kind > FL_COLL_BARRIER) return;
    int64_t elements = c->count;
    if (c->kind == FL_COLL_ALL_GATHER || c->kind == FL_COLL_REDUCE_SCATTER) elements *= group_size;
    coll_started[c->kind]++;
    coll_bytes[c->kind] += c->kind == FL_COLL_BARRIER ? 0 : elements * (int64_t)fl_dtype_size(c->dtype);
    w->kind = (int)c->kind;
}

static int coll_kind_of(const char *kind) {
    static const char *const names[] = {"all_gather", "reduce_scatter", "all_reduce", "broadcast",
                                        "barrier"};
    for (int i = 0; i <= FL_COLL_BARRIER; i++)
        if (kind && strcmp(kind, names[i]) == 0) return i;
    return -1;
}

int64_t fl_dist_collective_count(const char *kind) {
    int k = coll_kind_of(kind);
    return k < 0 ? -1 : coll_started[k];
}

int fl_dist_collective_stats(const char *kind, int64_t *count, int64_t *bytes, double *wait_seconds) {
    int k = coll_kind_of(kind);
    if (k < 0)
        return fl_fail(FL_ERR_ARG, "collective stats: unknown kind '%s' (all_gather, reduce_scatter, "
                       "all_reduce, broadcast, barrier)", kind ? kind : "(null)");
    if (count) *count = coll_started[k];
    if (bytes) *bytes = coll_bytes[k];
    if (wait_seconds) *wait_seconds = coll_wait[k];
    return FL_OK;
}

/* Start c on g's communicator and return the work (w is consumed). */

static fl_work *launch(fl_work *w, const fl_coll *c) {
    if (fl_dist.broken) {
        char why[700];
        snprintf(why, sizeof why, "no collective can start on this rank after an earlier one "
                 "timed out (MPI may still complete that one): %s",
                 fl_dist.broken_message);
        fail_at(w->name, w->group, FL_ERR_STATE, why);
        work_free(w);
        return NULL;
    }
    count_started(w, c, w->group->size);
    int rc = fl_dist.backend->start(w->group->comm, c, &w->req);
    if (rc != FL_OK) {
        char why[400];
        snprintf(why, sizeof why, "%s", fl_last_error());
        fail_at(w->name, w->group, FL_ERR_DEVICE, why);
        work_free(w);
        return NULL;
    }
    bool done;
    /* A backend that finished at once (or a request already complete)
     * still gets its post-processing now. */
    if (!w->req && work_progress(w, &done) != FL_OK) {
        work_free(w);
        return NULL;
    }
    return w;
}

static fl_tensor *f32_stage(const fl_tensor *like, int64_t numel, bool copy) {
    int64_t shape[1] = {numel};
    fl_tensor *s = fl_empty(1, shape, FL_F32, fl_device_make(FL_DEVICE_CPU, 0));
    if (s && copy && fl_convert(s->data, FL_F32, like->data, like->dtype, numel) != FL_OK) {
        fl_tensor_release(s);
        return NULL;
    }
    return s;
}

/* ---- device tensors ----------------------------------------------------------- */

/* [Note: collectives on device tensors]
 * A group's first collective on device tensors decides, with every rank,
 * how the group moves them (device_path):
 * - through the device's library (NCCL for cuda: cuda_nccl.cu) when every
 *   rank has it and could make a communicator from rank 0's unique id
 *   (broadcast by the host backend): device pointers, the tensor's own
 *   dtype, avg done by the library, queued after the kernels that made the
 *   inputs, the work complete when its event is;
 * - otherwise through host copies: the inputs are copied to the host when
 *   the collective starts (the copy waits for the kernels that made them),
 *   the host backend moves the copies, and the result is copied back to the
 *   device tensor when the work completes (work_finish), so a caller sees
 *   the device tensor change exactly when it would with the result in
 *   place. This is the path for ranks sharing one GPU (NCCL refuses them),
 *   for machines without NCCL and for FSDP_NCCL=0.
 * All ranks or none use the library: collectives of the two kinds would
 * never meet. */

static bool on_device(const fl_tensor *t) {
    return t && t->storage && fl_device_kind_of(t->device) != FL_DEVICE_CPU;
}

/* Both tensors of a two-tensor collective on one device (meta and fake
 * ones, without storage, go anywhere). */
static int check_same_device(const char *op, const fl_group *g, const fl_tensor *out,
                             const fl_tensor *in) {
    const fl_tensor *both[2] = {out, in};
    if (!out->storage || !in->storage || fl_same_device("output and input", 2, both) == FL_OK)
        return FL_OK;
    char why[256];
    snprintf(why, sizeof why, "%s", fl_last_error());
    return fail_at(op, g, FL_ERR_ARG, why);
}

static fl_tensor *host_copy(const fl_tensor *t) {
    return fl_to(t, t->dtype, fl_device_make(FL_DEVICE_CPU, 0));
}

static fl_tensor *host_like(const fl_tensor *t) {
    return fl_empty(t->ndim, t->shape, t->dtype, fl_device_make(FL_DEVICE_CPU, 0));
}

const fl_device_comm_ops *fl_device_comm_ops_of(fl_device device) {
    const fl_backend *be = fl_backend_of(device);
    return be && be->comm_ops ? be->comm_ops() : NULL;
}

/* Every rank of g learns whether all of them have *flag set (an all-reduce
 * of int32 minima on the host). */
static int agree(fl_group *g, int32_t *flag) {
    int64_t one = 1;
    fl_tensor *t = fl_empty(1, &one, FL_I32, fl_device_make(FL_DEVICE_CPU, 0));
    if (!t) return fl_last_status();
    *(int32_t *)t->data = *flag;
    fl_work *w = fl_all_reduce(g, t, FL_REDUCE_MIN);
    int rc = w ? fl_work_wait(w) : (int)fl_last_status();
    fl_work_release(w);
    *flag = *(int32_t *)t->data;
    fl_tensor_release(t);
    return rc;
}

/* Decide, with every rank of g, how g moves tensors on dev: 1 through the
 * device library (a communicator made now), 0 through host copies; -1 on
 * an error. All ranks or none use the library: a rank without it, or one
 * whose communicator could not be made (NCCL refuses two ranks on one
 * GPU), sends the whole group through host copies, since collectives of
 * the two kinds would never meet. */
static int device_path(const char *op, fl_group *g, fl_device dev) {
    if (g->size == 1) return 0;
    if (g->device_path == 0) {
        const fl_device_comm_ops *ops = fl_device_comm_ops_of(dev);
        /* A rank that cannot use its device must say so before the others
         * block in comm_init waiting for it. */
        int32_t ok = ops != NULL && ops->check_device(fl_device_index(dev)) == FL_OK;
        if (ops && !ok)
            fprintf(stderr, "fsdp-lua: rank %d: %s cannot use the device: %s\n", fl_dist.topo.rank,
                    ops->name, fl_last_error());
        if (agree(g, &ok)) return -1;
        unsigned char id[129] = {0};
        if (ok) {
            int64_t n = sizeof id;
            fl_tensor *t = fl_empty(1, &n, FL_U8, fl_device_make(FL_DEVICE_CPU, 0));
            if (!t) return -1;
            unsigned char *b = t->data;
            memset(b, 0, sizeof id);
            if (g->rank == 0) b[0] = ops->unique_id(b + 1) == FL_OK;
            fl_work *w = fl_broadcast(g, t, 0);
            int rc = w ? fl_work_wait(w) : (int)fl_last_status();
            fl_work_release(w);
            memcpy(id, b, sizeof id);
            fl_tensor_release(t);
            if (rc) return -1;
            ok = id[0];
        }
        void *comm = NULL;
        char why[300] = "";
        if (ok) {
            ok = ops->comm_init(g->size, id + 1, g->rank, fl_device_index(dev), &comm) == FL_OK;
            if (!ok) snprintf(why, sizeof why, "%s", fl_last_error());
            int32_t all = ok;
            if (agree(g, &all)) return -1;
            /* A communicator some ranks made and others could not is left
             * alone: destroying it is collective over ranks that never
             * joined, and would hang. */
            if (!all && why[0])
                fprintf(stderr, "fsdp-lua: rank %d: %s is not used for cuda tensors on group %s (%s); "
                        "they move through host copies\n", fl_dist.topo.rank, ops->name, g->name, why);
            ok = all;
        }
        g->device_path = ok ? 1 : -1;
        g->device_comm = ok ? comm : NULL;
        g->comm_device = dev;
        if (ok) g->device_comm_seq = ++fl_dist.device_comms_made;
    }
    if (g->device_path < 0) return 0;
    if (g->comm_device != dev) {
        char a[32], b[32], why[160];
        fl_device_format(g->comm_device, a, sizeof a);
        fl_device_format(dev, b, sizeof b);
        snprintf(why, sizeof why, "the group's %s communicator is on %s, the tensors on %s",
                 fl_device_comm_ops_of(dev)->name, a, b);
        fail_at(op, g, FL_ERR_ARG, why);
        return -1;
    }
    return 1;
}

/* Start c (device pointers) through g's device library; keep0/keep1 stay
 * referenced until it completes. */
static fl_work *launch_device(const char *op, fl_group *g, const fl_coll *c, fl_tensor *keep0,
                              const fl_tensor *keep1) {
    const fl_device_comm_ops *ops = fl_device_comm_ops_of(g->comm_device);
    fl_work *w = work_new(op, g);
    if (!w) return NULL;
    count_started(w, c, g->size);
    w->keep[0] = fl_tensor_retain(keep0);
    w->keep[1] = keep1 ? fl_tensor_retain((fl_tensor *)keep1) : NULL;
    w->dops = ops;
    char label[160];
    where(label, sizeof label, op, g);
    if (ops->start(g->device_comm, fl_device_index(g->comm_device), c, label, &w->req) != FL_OK) {
        char why[400];
        snprintf(why, sizeof why, "%s", fl_last_error());
        fail_at(op, g, FL_ERR_DEVICE, why);
        work_free(w);
        return NULL;
    }
    return w;
}

/* Attach the copy back of host to dev to w, which ran on host (consumed);
 * done at once if w already completed. */
static fl_work *copy_back_when_done(fl_work *w, fl_tensor *dev, fl_tensor *host) {
    if (!w) {
        fl_tensor_release(host);
        return NULL;
    }
    if (w->completed) {
        int rc = fl_copy_(dev, host);
        fl_tensor_release(host);
        if (rc != FL_OK) {
            work_free(w);
            return NULL;
        }
        return w;
    }
    w->device_out = fl_tensor_retain(dev);
    w->host_out = host;
    return w;
}

/* ---- the collectives --------------------------------------------------------- */

fl_work *fl_all_gather_into(fl_group *group, fl_tensor *out, const fl_tensor *in) {
    static const char op[] = "all_gather_into";
    fl_dist_progress_dropped();
    fl_group *g = fl_group_resolve(op, group);
    if (!g) return NULL;
    if (check_tensor(op, g, "output", out) || check_tensor(op, g, "input", in) ||
        check_same_device(op, g, out, in))
        return NULL;
    char why[256], s1[96], s2[96];
    if (in->dtype != out->dtype) {
        snprintf(why, sizeof why, "input is %s, output is %s: the dtypes must match",
                 fl_dtype_name(in->dtype), fl_dtype_name(out->dtype));
        return fail_at(op, g, FL_ERR_ARG, why), NULL;
    }
    if (out->numel != in->numel * g->size) {
        snprintf(why, sizeof why,
                 "output %s has %lld elements, expected %d ranks x %lld (input %s) = %lld",
                 fl_shape_str(out, s1, sizeof s1), (long long)out->numel, g->size,
                 (long long)in->numel, fl_shape_str(in, s2, sizeof s2),
                 (long long)(in->numel * g->size));
        return fail_at(op, g, FL_ERR_ARG, why), NULL;
    }
    if (!in->storage || !out->storage) return done_work(op, g);
    if (check_count(op, g, in->numel)) return NULL;
    size_t bytes = (size_t)in->numel * fl_dtype_size(in->dtype);
    const char *slot = (const char *)out->data + (size_t)g->rank * bytes;
    bool in_place = in->data == slot;
    if (!in_place && overlap(in, out)) {
        snprintf(why, sizeof why,
                 "input overlaps the output other than as this rank's slot (elements %lld "
                 "... of the output)",
                 (long long)(g->rank * in->numel));
        return fail_at(op, g, FL_ERR_ARG, why), NULL;
    }
    if (on_device(out)) {
        int path = device_path(op, g, out->device);
        if (path < 0) return NULL;
        if (path == 1) {
            fl_coll c = {FL_COLL_ALL_GATHER, in->data, out->data, in->numel, in->dtype,
                         FL_REDUCE_SUM, 0};
            return launch_device(op, g, &c, out, in);
        }
        fl_tensor *hin = host_copy(in), *hout = hin ? host_like(out) : NULL;
        fl_work *w = hout ? fl_all_gather_into(group, hout, hin) : NULL;
        fl_tensor_release(hin);
        return hout ? copy_back_when_done(w, out, hout) : NULL;
    }
    if (g->size == 1) {
        if (!in_place) memmove(out->data, in->data, bytes);
        return done_work(op, g);
    }
    fl_work *w = work_new(op, g);
    if (!w) return NULL;
    w->keep[0] = fl_tensor_retain(out);
    w->keep[1] = fl_tensor_retain((fl_tensor *)in);
    fl_coll c = {FL_COLL_ALL_GATHER, in_place ? NULL : in->data, out->data, in->numel,
                 in->dtype, FL_REDUCE_SUM, 0};
    return launch(w, &c);
}

fl_work *fl_reduce_scatter(fl_group *group, fl_tensor *out, const fl_tensor *in,
                           fl_reduce_op rop) {
    static const char op[] = "reduce_scatter";
    fl_dist_progress_dropped();
    fl_group *g = fl_group_resolve(op, group);
    if (!g) return NULL;
    if (check_tensor(op, g, "output", out) || check_tensor(op, g, "input", in) ||
        check_same_device(op, g, out, in))
        return NULL;
    char why[256], s1[96], s2[96];
    if (in->dtype != out->dtype) {
        snprintf(why, sizeof why, "input is %s, output is %s: the dtypes must match",
                 fl_dtype_name(in->dtype), fl_dtype_name(out->dtype));
        return fail_at(op, g, FL_ERR_ARG, why), NULL;
    }
    if (check_reduce_op(op, g, rop, in->dtype)) return NULL;
    if (in->numel != out->numel * g->size) {
        snprintf(why, sizeof why,
                 "input %s has %lld elements, expected %d ranks x %lld (output %s) = %lld",
                 fl_shape_str(in, s1, sizeof s1), (long long)in->numel, g->size,
                 (long long)out->numel, fl_shape_str(out, s2, sizeof s2),
                 (long long)(out->numel * g->size));
        return fail_at(op, g, FL_ERR_ARG, why), NULL;
    }
    if (!in->storage || !out->storage) return done_work(op, g);
    if (check_count(op, g, out->numel)) return NULL;
    if (overlap(in, out))
        return fail_at(op, g, FL_ERR_ARG, "input and output overlap (reduce into a separate "
                                          "tensor)"),
               NULL;
    if (on_device(out)) {
        int path = device_path(op, g, out->device);
        if (path < 0) return NULL;
        if (path == 1) {
            fl_coll c = {FL_COLL_REDUCE_SCATTER, in->data, out->data, out->numel, in->dtype, rop, 0};
            return launch_device(op, g, &c, out, in);
        }
        fl_tensor *hin = host_copy(in), *hout = hin ? host_like(out) : NULL;
        fl_work *w = hout ? fl_reduce_scatter(group, hout, hin, rop) : NULL;
        fl_tensor_release(hin);
        return hout ? copy_back_when_done(w, out, hout) : NULL;
    }
    if (g->size == 1) {
        memcpy(out->data, in->data, (size_t)in->numel * fl_dtype_size(in->dtype));
        return done_work(op, g);
    }
    fl_work *w = work_new(op, g);
    if (!w) return NULL;
    w->keep[0] = fl_tensor_retain(out);
    w->keep[1] = fl_tensor_retain((fl_tensor *)in);
    w->result = out;
    w->average = rop == FL_REDUCE_AVG;
    fl_coll c = {FL_COLL_REDUCE_SCATTER, in->data, out->data, out->numel, in->dtype,
                 w->average ? FL_REDUCE_SUM : rop, 0};
    if (is_16bit_float(in->dtype)) {
        w->stage_in = f32_stage(in, in->numel, true);
        w->stage_out = w->stage_in ? f32_stage(out, out->numel, false) : NULL;
        if (!w->stage_out) {
            work_free(w);
            return NULL;
        }
        c.send = w->stage_in->data;
        c.recv = w->stage_out->data;
        c.dtype = FL_F32;
    }
    return launch(w, &c);
}

fl_work *fl_all_reduce(fl_group *group, fl_tensor *t, fl_reduce_op rop) {
    static const char op[] = "all_reduce";
    fl_dist_progress_dropped();
    fl_group *g = fl_group_resolve(op, group);
    if (!g) return NULL;
    if (check_tensor(op, g, "the", t) || check_reduce_op(op, g, rop, t->dtype)) return NULL;
    if (on_device(t) && g->size > 1) {
        int path = device_path(op, g, t->device);
        if (path < 0) return NULL;
        if (path == 1) {
            fl_coll c = {FL_COLL_ALL_REDUCE, NULL, t->data, t->numel, t->dtype, rop, 0};
            return launch_device(op, g, &c, t, NULL);
        }
        fl_tensor *host = host_copy(t);
        return host ? copy_back_when_done(fl_all_reduce(group, host, rop), t, host) : NULL;
    }
    if (!t->storage || g->size == 1) return done_work(op, g);
    if (check_count(op, g, t->numel)) return NULL;
    fl_work *w = work_new(op, g);
    if (!w) return NULL;
    w->keep[0] = fl_tensor_retain(t);
    w->result = t;
    w->average = rop == FL_REDUCE_AVG;
    fl_coll c = {FL_COLL_ALL_REDUCE, NULL, t->data, t->numel, t->dtype,
                 w->average ? FL_REDUCE_SUM : rop, 0};
    if (is_16bit_float(t->dtype)) {
        w->stage_out = f32_stage(t, t->numel, true);
        if (!w->stage_out) {
            work_free(w);
            return NULL;
        }
        c.recv = w->stage_out->data;
        c.dtype = FL_F32;
    }
    return launch(w, &c);
}

fl_work *fl_broadcast(fl_group *group, fl_tensor *t, int root) {
    static const char op[] = "broadcast";
    fl_dist_progress_dropped();
    fl_group *g = fl_group_resolve(op, group);
    if (!g) return NULL;
    if (check_tensor(op, g, "the", t)) return NULL;
    if (root < 0 || root >= g->size) {
        char why[128];
        snprintf(why, sizeof why, "root %d is not a rank of the group (0 ... %d)", root,
                 g->size - 1);
        return fail_at(op, g, FL_ERR_ARG, why), NULL;
    }
    if (on_device(t) && g->size > 1) {
        int path = device_path(op, g, t->device);
        if (path < 0) return NULL;
        if (path == 1) {
            fl_coll c = {FL_COLL_BROADCAST, NULL, t->data, t->numel, t->dtype, FL_REDUCE_SUM, root};
            return launch_device(op, g, &c, t, NULL);
        }
        fl_tensor *host = host_copy(t);
        return host ? copy_back_when_done(fl_broadcast(group, host, root), t, host) : NULL;
    }
    if (!t->storage || g->size == 1) return done_work(op, g);
    if (check_count(op, g, t->numel)) return NULL;
    fl_work *w = work_new(op, g);
    if (!w) return NULL;
    w->keep[0] = fl_tensor_retain(t);
    fl_coll c = {FL_COLL_BROADCAST, NULL, t->data, t->numel, t->dtype, FL_REDUCE_SUM, root};
    return launch(w, &c);
}

fl_work *fl_barrier(fl_group *group) {
    static const char op[] = "barrier";
    fl_dist_progress_dropped();
    fl_group *g = fl_group_resolve(op, group);
    if (!g) return NULL;
    if (g->size == 1) return done_work(op, g);
    fl_work *w = work_new(op, g);
    if (!w) return NULL;
    fl_coll c = {FL_COLL_BARRIER, NULL, NULL, 0, FL_U8, FL_REDUCE_SUM, 0};
    return launch(w, &c);
}

/* ---- the monitored barrier ----------------------------------------------------- */

/* The verdict rank 0 sends: how many ranks were missing, then the world
 * ranks of the first ones. */
enum { VERDICT_NAMED = 15, VERDICT_INTS = VERDICT_NAMED + 1, BARRIER_TAGS = 30000 };

/* "rank 3" / "ranks 1, 3, 5" (world ranks) from a verdict. */
static void missing_str(char *buf, size_t size, const int *verdict) {
    int n = verdict[0], named = n < VERDICT_NAMED ? n : VERDICT_NAMED;
    size_t len = (size_t)snprintf(buf, size, "%s", n == 1 ? "rank " : "ranks ");
    for (int i = 0; i < named && len < size; i++)
        len += (size_t)snprintf(buf + len, size - len, "%s%d", i ? ", " : "", verdict[1 + i]);
    if (n > named && len < size) snprintf(buf + len, size - len, " and %d more", n - named);
}

/* Poll req until it completes or the deadline passes; true when done. A
 * backend failure counts as not done (the caller reports the timeout or
 * failure with its own words). */
static bool poll_until(void **req, double start, double deadline) {
    while (*req) {
        bool done = false;
        if (fl_dist.backend->test(*req, &done) != FL_OK) {
            *req = NULL;
            return false;
        }
        if (done) {
            *req = NULL;
            return true;
        }
        double now = fl_dist_now();
        if (now > deadline) return false;
        fl_dist_pause(now - start);
    }
    return true;
}

static int barrier_member(fl_group *g, int tag, double timeout) {
    static const int arrived = 1;
    const fl_dist_backend *b = fl_dist.backend;
    /* Heap, and deliberately not freed when abandoned: a cancelled receive
     * may still be written while the cancellation completes. */
    int *verdict = calloc(VERDICT_INTS, sizeof(int));
    if (!verdict) return fail_at("monitored_barrier", g, FL_ERR_OOM, "out of memory");
    void *send = NULL, *recv = NULL;
    if (b->isend(g->comm, 0, tag, &arrived, sizeof arrived, &send) != FL_OK ||
        b->irecv(g->comm, 0, tag, verdict, VERDICT_INTS * (int)sizeof(int), &recv) != FL_OK) {
        char why[400];
        snprintf(why, sizeof why, "cannot reach rank 0: %s", fl_last_error());
        if (send) b->abandon(send);
        return fail_at("monitored_barrier", g, FL_ERR_DEVICE, why);
    }
    /* Rank 0 answers at most `timeout` after it arrives; it may arrive
     * later than this rank, so this rank allows twice that (and a second
     * for the messages) before concluding rank 0 is not coming. */
    double start = fl_dist_now(), patience = 2 * timeout + 1;
    bool answered = poll_until(&recv, start, start + patience);
    if (!answered) {
        if (recv) b->abandon(recv);
        if (send) b->abandon(send);
        char why[256];
        snprintf(why, sizeof why,
                 "no answer from group rank 0 (world rank %d) within %g s: it has not reached "
                 "the barrier or has failed",
                 g->world_ranks[0], patience);
        return fail_at("monitored_barrier", g, FL_ERR_DEVICE, why);
    }
    /* Rank 0 answers only after receiving our report, so the send is done
     * or about to be. */
    if (!poll_until(&send, start, fl_dist_now() + timeout) && send) b->abandon(send);
    int rc = FL_OK;
    if (verdict[0] != 0) {
        char names[160], why[320];
        missing_str(names, sizeof names, verdict);
        snprintf(why, sizeof why, "world %s did not arrive within %g s (reported by rank %d)",
                 names, timeout, g->world_ranks[0]);
        rc = fail_at("monitored_barrier", g, FL_ERR_DEVICE, why);
    }
    free(verdict);
    return rc;
}

static int barrier_root(fl_group *g, int tag, double timeout) {
    const fl_dist_backend *b = fl_dist.backend;
    int n = g->size;
    int *reports = calloc((size_t)n, sizeof(int));
    void **reqs = calloc((size_t)n, sizeof(void *));
    int *verdict = calloc(VERDICT_INTS, sizeof(int));
    bool *arrived = calloc((size_t)n, sizeof(bool));
    if (!reports || !reqs || !verdict || !arrived) {
        free(reports), free(reqs), free(verdict), free(arrived);
        return fail_at("monitored_barrier", g, FL_ERR_OOM, "out of memory");
    }
    for (int r = 1; r < n; r++) {
        if (b->irecv(g->comm, r, tag, &reports[r], sizeof(int), &reqs[r]) != FL_OK) {
            char why[400];
            snprintf(why, sizeof why, "cannot post the receive from rank %d: %s", r,
                     fl_last_error());
            for (int k = 1; k < r; k++)
                if (reqs[k]) b->abandon(reqs[k]);
            /* reports stays allocated: abandoned receives may still land. */
            free(reqs), free(verdict), free(arrived);
            return fail_at("monitored_barrier", g, FL_ERR_DEVICE, why);
        }
    }
    double start = fl_dist_now(), deadline = start + timeout;
    int pending = n - 1;
    while (pending > 0) {
        for (int r = 1; r < n; r++) {
            if (arrived[r]) continue;
            bool done = false;
            if (reqs[r] && b->test(reqs[r], &done) != FL_OK) reqs[r] = NULL;
            if (done) {
                reqs[r] = NULL;
                arrived[r] = true;
                pending--;
            }
        }
        double now = fl_dist_now();
        if (pending == 0 || now > deadline) break;
        fl_dist_pause(now - start);
    }
    for (int r = 1; r < n; r++) {
        if (arrived[r]) continue;
        if (verdict[0] < VERDICT_NAMED) verdict[1 + verdict[0]] = g->world_ranks[r];
        verdict[0]++;
        if (reqs[r]) b->abandon(reqs[r]);
    }
    /* Tell every rank that arrived; a rank that did not will time out
     * waiting for this answer and fail by itself. */
    bool sends_done = true;
    for (int r = 1; r < n; r++) {
        if (!arrived[r]) continue;
        void *send = NULL;
        if (b->isend(g->comm, r, tag, verdict, VERDICT_INTS * (int)sizeof(int), &send) != FL_OK)
            continue;
        if (!poll_until(&send, fl_dist_now(), fl_dist_now() + timeout) && send) {
            b->abandon(send);
            sends_done = false;
        }
    }
    int rc = FL_OK;
    if (verdict[0] != 0) {
        char names[160], why[320];
        missing_str(names, sizeof names, verdict);
        snprintf(why, sizeof why, "world %s did not arrive within %g s", names, timeout);
        rc = fail_at("monitored_barrier", g, FL_ERR_DEVICE, why);
    }
    /* Buffers a backend may still touch (abandoned receives, sends) stay. */
    if (verdict[0] == 0) free(reports);
    if (sends_done) free(verdict);
    free(reqs);
    free(arrived);
    return rc;
}

int fl_monitored_barrier(fl_group *group, double timeout) {
    fl_dist_progress_dropped();
    fl_group *g = fl_group_resolve("monitored_barrier", group);
    if (!g) return fl_last_status();
    if (!(timeout > 0)) {
        char why[96];
        snprintf(why, sizeof why, "timeout must be a positive number of seconds, got %g",
                 timeout);
        return fail_at("monitored_barrier", g, FL_ERR_ARG, why);
    }
    if (g->size == 1) return FL_OK;
    /* One tag per barrier on this group, so a late report from an earlier
     * barrier that timed out never completes a later one. */
    int tag = 1 + (int)(g->barrier_sequence++ % BARRIER_TAGS);
    return g->rank == 0 ? barrier_root(g, tag, timeout) : barrier_member(g, tag, timeout);
}
