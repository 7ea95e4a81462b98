/*
 * work.c: the middle layer of core/comm ([Note: the layers of core/comm] in
 * collectives.c): the work a collective returns. Starting the backend's
 * request (or the device library's) for a checked collective, testing and
 * waiting with a deadline, post-processing when it completes (averaging,
 * rounding 16-bit results back from f32, copying a host stand-in back to
 * its device tensor), failure, works released before completion, and the
 * counts of the collectives this process started
 * (fl_dist_collective_stats). It calls only the transport below it.
 *
 * [Note: progress and waiting]
 * Collectives are non-blocking MPI (MPI_Iallgather..., or the plugin's
 * rings of MPI_Isend/MPI_Irecv), so the rank computes while data moves. Open MPI moves non-blocking collectives only
 * inside MPI calls; the MPI backend therefore runs a progress thread that
 * tests outstanding requests every FSDP_PROGRESS_INTERVAL_US (default 100)
 * microseconds while any exist (see core/comm/mpi/backend_mpi.c), and
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
 *
 * [Note: the rank that knows]
 * A wait times out because some member is not in the collective. When a
 * roll call finds every other member answering from inside collectives of
 * their own, the one at fault is further away: under HYBRID_SHARD, rank 1
 * waits in its node's all-gather for rank 0, which waits in the
 * replicas' all-reduce for a rank on a node whose link was cut. If rank 1
 * ended the job then, its message could only say that rank 0 is busy, and
 * the abort would kill rank 0 before its own timeout named the lost
 * ranks (the cluster test saw exactly that, now and then, depending on
 * which rank's wait started first). So the wait goes on, still
 * progressing, until the member whose collective started last has
 * reached its own timeout, made its roll call and ended the job (with the
 * abort's grace); it prints a line saying so. Only if the job is still
 * there then does this rank fail, naming where the others wait. A slow
 * collective may complete meanwhile, and the wait then succeeds. The
 * extra wait is bounded by the timeout plus the roll call and the abort,
 * so a job whose ranks each wait for another (collectives started in
 * different orders) still ends.
 */
#include "dist.h"

#include <string.h>

/* Collectives this process started that move data between ranks (a group
 * of one, an empty tensor and the host copies of a device collective that
 * has no device library are not counted twice), by kind: how many, the
 * bytes of their buffers as handed to the backend, and the time the host
 * spent blocked waiting for them (fl_dist_collective_stats). Tests count
 * communication with them; the recipes log them per step. */
static int64_t coll_started[FL_COLL_BARRIER + 1];
static int64_t coll_bytes[FL_COLL_BARRIER + 1];
static double coll_wait[FL_COLL_BARRIER + 1];

/* ---- works ----------------------------------------------------------------- */

fl_work *fl_work_new(const char *name, fl_group *g) {
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

void fl_work_free(fl_work *w) {
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
int fl_work_finish(fl_work *w) {
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
    fl_dist_fail_at(w->name, w->group, status, what);
    snprintf(w->message, sizeof w->message, "%s", fl_last_error());
    w->status = status;
    w->failed = true;
    return status;
}

/* One step of progress: test the request, finish when it completed. */
int fl_work_progress(fl_work *w, bool *done) {
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
    int rc = fl_work_finish(w);
    if (rc != FL_OK) {
        char why[400];
        snprintf(why, sizeof why, "%s", fl_last_error());
        return work_fail(w, (fl_status)rc, why);
    }
    *done = true;
    return FL_OK;
}

/* ---- starting ----------------------------------------------------------------- */

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

fl_work *fl_work_done(const char *name, fl_group *g) {
    fl_work *w = fl_work_new(name, g);
    if (w) w->completed = true;
    return w;
}

fl_work *fl_work_start(fl_work *w, const fl_coll *c) {
    if (fl_dist.broken) {
        char why[700];
        snprintf(why, sizeof why, "no collective can start on this rank after an earlier one "
                 "timed out (MPI may still complete that one): %s",
                 fl_dist.broken_message);
        fl_dist_fail_at(w->name, w->group, FL_ERR_STATE, why);
        fl_work_free(w);
        return NULL;
    }
    count_started(w, c, w->group->size);
    int rc = fl_dist.backend->start(w->group->comm, c, &w->req);
    if (rc != FL_OK) {
        char why[400];
        snprintf(why, sizeof why, "%s", fl_last_error());
        fl_dist_fail_at(w->name, w->group, FL_ERR_DEVICE, why);
        fl_work_free(w);
        return NULL;
    }
    bool done;
    /* A backend that finished at once (or a request already complete)
     * still gets its post-processing now. */
    if (!w->req && fl_work_progress(w, &done) != FL_OK) {
        fl_work_free(w);
        return NULL;
    }
    return w;
}

fl_work *fl_work_start_device(const char *op, fl_group *g, const fl_coll *c, fl_tensor *keep0,
                              const fl_tensor *keep1) {
    const fl_device_comm_ops *ops = fl_device_comm_ops_of(g->comm_device);
    fl_work *w = fl_work_new(op, g);
    if (!w) return NULL;
    count_started(w, c, g->size);
    w->keep[0] = fl_tensor_retain(keep0);
    w->keep[1] = keep1 ? fl_tensor_retain((fl_tensor *)keep1) : NULL;
    w->dops = ops;
    char label[160];
    fl_dist_where(label, sizeof label, op, g);
    if (ops->start(g->device_comm, fl_device_index(g->comm_device), c, label, &w->req) != FL_OK) {
        char why[400];
        snprintf(why, sizeof why, "%s", fl_last_error());
        fl_dist_fail_at(op, g, FL_ERR_DEVICE, why);
        fl_work_free(w);
        return NULL;
    }
    return w;
}

fl_work *fl_work_copy_back(fl_work *w, fl_tensor *dev, fl_tensor *host) {
    if (!w) {
        fl_tensor_release(host);
        return NULL;
    }
    if (w->completed) {
        int rc = fl_copy_(dev, host);
        fl_tensor_release(host);
        if (rc != FL_OK) {
            fl_work_free(w);
            return NULL;
        }
        return w;
    }
    w->device_out = fl_tensor_retain(dev);
    w->host_out = host;
    return w;
}

int fl_work_test(fl_work *w, bool *done) {
    if (!w || !done) return fl_fail(FL_ERR_ARG, "work test: NULL argument");
    fl_dist_progress_dropped();
    return fl_work_progress(w, done);
}

/* Progress w, pausing between polls, until it completes or fails (true,
 * with its status in *rc) or `seconds` pass (false). `before`: seconds it
 * was waited for already (the pauses lengthen with the wait). */
static bool progress_within(fl_work *w, double seconds, double before, int *rc) {
    double start = fl_dist_now();
    for (;;) {
        bool done;
        *rc = fl_work_progress(w, &done);
        if (*rc != FL_OK || done) return true;
        double waited = fl_dist_now() - start;
        if (waited > seconds) return false;
        fl_dist_pause(before + waited);
    }
}

/* Seconds the launcher may take to end the job once a rank aborts it
 * (the MPI backend gives MPI_Abort 2 s), with a second of slack. */
#define FL_ABORT_SECONDS 3.0

/* [Note: the rank that knows]: when every other member of the group
 * answered the roll call from inside collectives of its own, the seconds
 * until the one whose oldest collective started last reaches its own
 * timeout, makes its roll call and ends the job (*who, *age: that member
 * and the age of its collective). 0 when a member is idle or silent: this
 * rank's own report names it. */
static double their_diagnosis_in(const fl_roll_answer *a, int n, int *who, double *age) {
    double latest = -1;
    for (int i = 0; i < n; i++) {
        if (a[i].world_rank == fl_dist.topo.rank) continue;
        if (!a[i].answered || a[i].in_flight == 0) return 0;
        double left = fl_dist.timeout - a[i].oldest;
        if (left < 0) left = 0; /* its wait is over: it is in its roll call */
        if (left > latest) {
            latest = left;
            *who = a[i].world_rank;
            *age = a[i].oldest;
        }
    }
    return latest < 0 ? 0 : latest + FL_ROLL_CALL_SECONDS + FL_ABORT_SECONDS;
}

/* [Note: a collective that never completes] */
static int work_time_out(fl_work *w) {
    char report[640] = "", why[1000], more[160] = "";
    fl_roll_answer *a = w->dops ? NULL : fl_dist_roll_call(w->group, FL_ROLL_CALL_SECONDS);
    int who = -1;
    double age = 0, extra = a ? their_diagnosis_in(a, w->group->size, &who, &age) : 0;
    if (extra > 0) {
        free(a);
        char where[160];
        fprintf(stderr,
                "fsdp-lua: rank %d: %s: not complete after %g s, and world rank %d waits in a "
                "collective of its own (for %.1f s): waiting %.0f s more for the rank at fault "
                "to be named\n",
                fl_dist.topo.rank, fl_dist_where(where, sizeof where, w->name, w->group),
                fl_dist.timeout, who, age, extra);
        fflush(stderr);
        int rc;
        if (progress_within(w, extra, fl_dist.timeout, &rc)) return rc;
        snprintf(more, sizeof more, " and %.0f s more for world rank %d", extra, who);
        a = fl_dist_roll_call(w->group, FL_ROLL_CALL_SECONDS);
    }
    if (a) fl_dist_roll_report(a, w->group->size, FL_ROLL_CALL_SECONDS, report, sizeof report);
    free(a);
    if (report[0])
        snprintf(why, sizeof why,
                 "not complete after waiting %g s (the collective timeout, "
                 "FSDP_COLLECTIVE_TIMEOUT)%s: %s",
                 fl_dist.timeout, more, report);
    else
        snprintf(why, sizeof why,
                 "not complete after waiting %g s (the collective timeout, "
                 "FSDP_COLLECTIVE_TIMEOUT)%s: a rank of the group has not started it, has "
                 "failed, or started this group's collectives in another order",
                 fl_dist.timeout, more);
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
    int rc;
    if (!progress_within(w, fl_dist.timeout, 0, &rc)) rc = work_time_out(w);
    if (w->kind >= 0) coll_wait[w->kind] += fl_dist_now() - start;
    return rc;
}

bool fl_work_is_completed(const fl_work *w) { return w && w->completed; }

bool fl_work_is_pending(const fl_work *w) { return w && !w->completed && w->req; }

const char *fl_work_name(const fl_work *w) { return w ? w->name : "(null work)"; }

void fl_work_release(fl_work *w) {
    if (!w) return;
    if (w->completed || !w->req || fl_dist.finalized) {
        fl_work_free(w);
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
            if (!w->failed && !w->completed) fl_work_finish(w);
            *link = w->next;
            fl_work_free(w);
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

int fl_dist_collective_stats(const char *kind, int64_t *count, int64_t *bytes, double *wait_seconds,
                             double *busy_seconds) {
    bool any = kind && strcmp(kind, "any") == 0;
    int k = any ? -1 : coll_kind_of(kind);
    if (k < 0 && !any)
        return fl_fail(FL_ERR_ARG, "collective stats: unknown kind '%s' (all_gather, reduce_scatter, "
                       "all_reduce, broadcast, barrier, any)", kind ? kind : "(null)");
    int first = any ? 0 : k, last = any ? FL_COLL_BARRIER : k;
    int64_t n = 0, b = 0;
    double waited = 0;
    for (int i = first; i <= last; i++) n += coll_started[i], b += coll_bytes[i], waited += coll_wait[i];
    if (count) *count = n;
    if (bytes) *bytes = b;
    if (wait_seconds) *wait_seconds = waited;
    if (busy_seconds) {
        const fl_dist_backend *be = fl_dist.initialized ? fl_dist.backend : NULL;
        *busy_seconds = be && be->busy_seconds ? be->busy_seconds(k) : 0;
    }
    return FL_OK;
}

int fl_dist_collective_log(fl_coll_record *out, int max, int64_t *lost) {
    if (lost) *lost = 0;
    if (max < 0 || (max > 0 && !out))
        return fl_fail(FL_ERR_ARG, "collective log: room for %d records at %p", max, (void *)out), -1;
    const fl_dist_backend *be = fl_dist.initialized ? fl_dist.backend : NULL;
    if (!be || !be->collective_log || max == 0) return 0;
    int64_t dropped = 0;
    int n = be->collective_log(out, max, &dropped);
    if (lost) *lost = dropped;
    return n;
}
