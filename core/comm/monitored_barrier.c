/*
 * monitored_barrier.c: a barrier that names the ranks that did not arrive
 * within a timeout (fl_monitored_barrier), as torch.distributed's. In the
 * API layer of core/comm ([Note: the layers of core/comm] in
 * collectives.c): point-to-point messages on the backend, no work.
 */
#include "dist.h"

#include <string.h>

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
    if (!verdict) return fl_dist_fail_at("monitored_barrier", g, FL_ERR_OOM, "out of memory");
    void *send = NULL, *recv = NULL;
    if (b->isend(g->comm, 0, tag, &arrived, sizeof arrived, &send) != FL_OK ||
        b->irecv(g->comm, 0, tag, verdict, VERDICT_INTS * (int)sizeof(int), &recv) != FL_OK) {
        char why[400];
        snprintf(why, sizeof why, "cannot reach rank 0: %s", fl_last_error());
        if (send) b->abandon(send);
        return fl_dist_fail_at("monitored_barrier", g, FL_ERR_DEVICE, why);
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
        return fl_dist_fail_at("monitored_barrier", g, FL_ERR_DEVICE, why);
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
        rc = fl_dist_fail_at("monitored_barrier", g, FL_ERR_DEVICE, why);
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
        return fl_dist_fail_at("monitored_barrier", g, FL_ERR_OOM, "out of memory");
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
            return fl_dist_fail_at("monitored_barrier", g, FL_ERR_DEVICE, why);
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
        rc = fl_dist_fail_at("monitored_barrier", g, FL_ERR_DEVICE, why);
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
        return fl_dist_fail_at("monitored_barrier", g, FL_ERR_ARG, why);
    }
    if (g->size == 1) return FL_OK;
    /* One tag per barrier on this group, so a late report from an earlier
     * barrier that timed out never completes a later one. */
    int tag = 1 + (int)(g->barrier_sequence++ % BARRIER_TAGS);
    return g->rank == 0 ? barrier_root(g, tag, timeout) : barrier_member(g, tag, timeout);
}
