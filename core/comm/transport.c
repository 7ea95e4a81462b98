/*
 * transport.c: what every file of core/comm reads or calls, at the bottom of
 * its layers ([Note: the layers of core/comm] in collectives.c): the
 * runtime's state (fl_dist, data: dist.c fills it), the clock and the
 * waiting policy of every polling loop, messages that place a collective
 * ("all_reduce on group world (rank 1 of 4, world rank 1)"), and the roll
 * call over the backend's watch channel. It calls nothing in core/comm, so
 * the backends, the works and the API may all call it.
 */
#include "dist.h"

#include <sched.h>
#include <string.h>
#include <time.h>

fl_dist_state fl_dist;

/* ---- time and waiting ----------------------------------------------------- */

double fl_dist_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void fl_dist_pause(double waited) {
    /* Open MPI moves data (and computes reductions) only inside MPI calls,
     * so every pause between polls is time the collective stands still:
     * sleeping even 20 us between polls made a 32 MB reduce_scatter take
     * twice as long as MPI's own blocking call. Yielding instead lets other
     * ranks sharing the core run, and costs nothing when none do. */
    if (waited < 1.0) {
        sched_yield();
        return;
    }
    /* Waits this long are a late or failed peer, not a transfer: poll
     * less often so a wait of minutes does not burn a core. */
    struct timespec ts = {0, waited < 10.0 ? 50000 : 1000000};
    nanosleep(&ts, NULL);
}

/* ---- messages ------------------------------------------------------------- */

/* "all_reduce on group world (rank 1 of 4)" */
const char *fl_dist_where(char *buf, size_t size, const char *op, const fl_group *g) {
    if (g && g->comm)
        snprintf(buf, size, "%s on group %s (rank %d of %d, world rank %d)", op, g->name,
                 g->rank, g->size, fl_dist.topo.rank);
    else
        snprintf(buf, size, "%s", op);
    return buf;
}

int fl_dist_fail_at(const char *op, const fl_group *g, fl_status status, const char *what) {
    char w[160];
    return fl_fail(status, "%s: %s", fl_dist_where(w, sizeof w, op, g), what);
}

const char *fl_dist_rank_str(char *buf, size_t size) {
    int r = fl_dist.initialized ? fl_dist.topo.rank : fl_dist_launcher_rank();
    if (r < 0) r = 0;
    snprintf(buf, size, "rank %d", r);
    return buf;
}

/* ---- the roll call ([Note: the watch channel]) -------------------------------- */

fl_roll_answer *fl_dist_roll_call(fl_group *g, double patience) {
    if (!fl_dist.backend || !fl_dist.backend->roll_call || !g || !g->comm || g->size < 2)
        return NULL;
    fl_roll_answer *a = calloc((size_t)g->size, sizeof *a);
    if (a && fl_dist.backend->roll_call(g->comm, patience, a) != FL_OK) {
        free(a);
        return NULL;
    }
    return a;
}

void fl_dist_roll_report(const fl_roll_answer *a, int n, double patience, char *buf,
                         size_t size) {
    size_t len = 0;
    char silent[256] = "";
    size_t slen = 0;
    int n_silent = 0;
    buf[0] = '\0';
    for (int i = 0; i < n; i++) {
        if (a[i].world_rank == fl_dist.topo.rank) continue;
        if (!a[i].answered) {
            if (slen < sizeof silent)
                slen += (size_t)snprintf(silent + slen, sizeof silent - slen, "%s%d",
                                         n_silent ? ", " : "", a[i].world_rank);
            n_silent++;
        } else if (a[i].in_flight == 0 && len < size) {
            if (a[i].since_last < 0)
                len += (size_t)snprintf(buf + len, size - len,
                                        "%sworld rank %d has not started any collective",
                                        len ? "; " : "", a[i].world_rank);
            else
                len += (size_t)snprintf(buf + len, size - len,
                                        "%sworld rank %d is not in any collective (it started "
                                        "its last one %.1f s ago)",
                                        len ? "; " : "", a[i].world_rank, a[i].since_last);
        }
    }
    if (n_silent && len < size)
        len += (size_t)snprintf(buf + len, size - len,
                                "%sworld rank%s %s did not answer within %g s (stopped, dead, "
                                "or stuck outside MPI)",
                                len ? "; " : "", n_silent > 1 ? "s" : "", silent, patience);
    /* Nobody idle or silent: say where the others wait, since one of them
     * waits for a rank outside this group (or all for each other). */
    if (len > 0) return;
    for (int i = 0; i < n && len < size; i++)
        if (a[i].world_rank != fl_dist.topo.rank && a[i].answered && a[i].in_flight > 0)
            len += (size_t)snprintf(buf + len, size - len,
                                    "%sworld rank %d waits in a collective (its oldest started "
                                    "%.1f s ago, %d in flight)",
                                    len ? "; " : "", a[i].world_rank, a[i].oldest,
                                    a[i].in_flight);
}
