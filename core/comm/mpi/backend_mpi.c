/*
 * backend_mpi.c: the Open MPI backend, built alone into libfsdp_mpi.so and
 * loaded by the core only in processes a launcher started (see [Note:
 * choosing the backend] in core/comm/dist.c), so libfsdp.so never links
 * libmpi.
 *
 * It moves contiguous host buffers with MPI's non-blocking collectives
 * (MPI_Iallgather, MPI_Ireduce_scatter_block, MPI_Iallreduce, MPI_Ibcast,
 * MPI_Ibarrier), or for large all-gathers, reduce-scatters and all-reduces
 * with rings of its own ([Note: ring collectives] in ring.c), on
 * duplicates of the world's communicator, so nothing the user's own MPI
 * code does can match our messages. Errors return codes
 * (MPI_ERRORS_RETURN) and become messages through fl_set_error, with
 * MPI's own description of the error.
 *
 * [Note: the progress thread]
 * Open MPI advances a non-blocking collective only while some thread is
 * inside an MPI call; a rank busy computing would otherwise move nothing
 * until it waits, and "overlap" would be a delay. So while requests are
 * outstanding a progress thread tests them every FSDP_PROGRESS_INTERVAL_US
 * microseconds (default 100) and sleeps on a condition variable when there
 * are none (no cost to a run that is not communicating). MPI is initialised
 * with MPI_THREAD_SERIALIZED and every MPI call, from either thread, holds
 * one mutex. FSDP_PROGRESS_THREAD=0 turns the thread off (progress then
 * happens only in test and wait); so does an MPI that cannot provide
 * MPI_THREAD_SERIALIZED.
 *
 * [Note: the watch channel]
 * A duplicate of the world communicator carries the runtime's own small
 * messages, polled (MPI_Iprobe) by the progress thread every 20 ms even
 * when nothing else is in flight, and by every test:
 * - PING/PONG: a rank whose collective timed out asks the group's other
 *   members what they are doing (roll_call); each answers from its
 *   progress thread, which runs while the main thread computes or spins,
 *   with its collectives in flight and when it last started one. A member
 *   that does not answer is stopped (SIGSTOP), dead or stuck outside MPI
 *   (or runs without the progress thread).
 * - LEAVE: a rank leaving before its run finished (os.exit mid-run) tells
 *   the others; the core's exit hook waits briefly for all to leave and
 *   otherwise ends the job (core/comm/dist.c, [Note: leaving the job]).
 * Each channel message is received whole (probe, then receive its size),
 * so no receive ever stays posted into memory that could go away.
 */
#include "dist_backend.h"
#include "ring.h"

#include <errno.h>
#include <mpi.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

/* A communicator as the core holds it: the MPI handle first (so a
 * pointer to it is a pointer to the handle) and the sequence that tags its
 * ring collectives ([Note: ring collectives] in ring.c). */
typedef struct mpi_comm {
    MPI_Comm comm;
    unsigned ring_sequence;
    uint32_t key;        /* names it alike on its members ([Note: joined time]) */
    uint32_t splits;     /* splits of it so far: every member counts each */
    int64_t collectives; /* started on it so far */
} mpi_comm;

typedef struct mpi_req {
    MPI_Request request;
    mpi_ring *ring;        /* a ring collective instead of one MPI request */
    bool collective;       /* counted in the roll call's answers */
    int kind;              /* a collective's fl_coll_kind */
    double started;        /* when it started (monotonic seconds) */
    uint32_t comm_key;     /* its communicator's key and its sequence there */
    int64_t sequence;
    bool receive;          /* a point-to-point receive (cancellable) */
    bool done;             /* completed (or failed: error != 0) */
    int error;
    const char *what;      /* the MPI call, for messages */
    struct mpi_req *prev, *next; /* in the active list while not done */
} mpi_req;

static struct {
    pthread_mutex_t lock; /* held around every MPI call */
    pthread_cond_t wake;  /* a request became active, or stop */
    pthread_t thread;
    bool thread_running, stop;
    long interval_us;
    mpi_req *active;      /* requests not yet seen complete */
    bool we_initialized;  /* MPI_Init was ours, so MPI_Finalize is too */
    int thread_level;
    mpi_comm *world;
    double last_start;    /* when the latest one started; 0: never */
    long ring_min_bytes;  /* smallest buffer a ring runs; < 0: rings off */
    /* Busy time per collective kind and of any kind (the last slot): how
     * many are in flight, since when, and the seconds accumulated. */
    int in_flight[FL_COLL_BARRIER + 2];
    double busy_since[FL_COLL_BARRIER + 2], busy_total[FL_COLL_BARRIER + 2];
    /* Completed collectives not yet read ([Note: joined time]): a ring of
     * FL_COLL_LOG_CAPACITY records from log_head, log_count of them, and
     * how many were overwritten unread; this node's clock's offset from
     * world rank 0's. */
    fl_coll_record log[FL_COLL_LOG_CAPACITY];
    int log_head, log_count;
    int64_t log_lost;
    double clock_offset;
} S = {.lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

/* The watch channel ([Note: the watch channel]); callers hold S.lock. */
enum { TAG_PING = 1, TAG_PONG = 2, TAG_LEAVE = 3, PONG_FIELDS = 4 };
typedef struct watch_send {
    MPI_Request request;
    void *data;
    struct watch_send *next;
} watch_send;
static struct {
    bool open;
    MPI_Comm comm;
    int rank, size;
    bool *left;         /* world ranks that said they leave */
    double token;       /* of this rank's roll call in progress */
    double *pongs;      /* size x PONG_FIELDS answers to it */
    bool *answered;
    watch_send *sends;  /* small sends still in flight */
} W;

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- errors ------------------------------------------------------------- */

static int mpi_fail(int code, const char *call) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof text, "code %d", code);
    char msg[MPI_MAX_ERROR_STRING + 128];
    snprintf(msg, sizeof msg, "%s failed: %s", call, text);
    return fl_set_error(FL_ERR_DEVICE, msg);
}

/* ---- the active list (callers hold S.lock) ---------------------------------- */

/* A collective starts or is seen complete: the busy clocks of its kind
 * and of any kind ([Note: busy time], below). */
static void busy_change(const mpi_req *r, int by, double now) {
    if (!r->collective) return;
    int slots[2] = {r->kind, FL_COLL_BARRIER + 1};
    for (int i = 0; i < 2; i++) {
        int k = slots[i];
        if (by > 0 && S.in_flight[k]++ == 0) S.busy_since[k] = now;
        if (by < 0 && --S.in_flight[k] == 0) S.busy_total[k] += now - S.busy_since[k];
    }
}

static void track(mpi_req *r) {
    busy_change(r, +1, r->started);
    r->prev = NULL;
    r->next = S.active;
    if (S.active) S.active->prev = r;
    S.active = r;
    pthread_cond_signal(&S.wake);
}

/* `now`: when it was seen complete (or given up). */
static void untrack(mpi_req *r, double now) {
    busy_change(r, -1, now);
    if (r->prev) r->prev->next = r->next;
    else if (S.active == r) S.active = r->next;
    if (r->next) r->next->prev = r->prev;
    r->prev = r->next = NULL;
}

/* Keep the record of a collective seen complete now; a full log drops
 * its oldest. */
static void log_completed(const mpi_req *r, double now) {
    int slot = (S.log_head + S.log_count) % FL_COLL_LOG_CAPACITY;
    if (S.log_count == FL_COLL_LOG_CAPACITY) {
        S.log_head = (S.log_head + 1) % FL_COLL_LOG_CAPACITY;
        S.log_lost++;
    } else {
        S.log_count++;
    }
    S.log[slot] = (fl_coll_record){.comm = r->comm_key, .kind = (uint32_t)r->kind,
                                   .sequence = r->sequence,
                                   .start = r->started + S.clock_offset,
                                   .end = now + S.clock_offset};
}

/* Test one request; marks it done (and untracks it) when it completed. */
static void poll_one(mpi_req *r) {
    if (r->done) return;
    int flag = 0;
    int rc;
    if (r->ring) {
        bool done = false;
        rc = mpi_ring_progress(r->ring, &done);
        flag = done;
        if (done || rc != MPI_SUCCESS) {
            mpi_ring_free(r->ring);
            r->ring = NULL;
        }
    } else {
        rc = MPI_Test(&r->request, &flag, MPI_STATUS_IGNORE);
    }
    if (rc != MPI_SUCCESS) {
        r->error = rc;
        flag = 1;
    }
    if (flag) {
        double now = now_seconds();
        r->done = true;
        untrack(r, now);
        if (r->collective && !r->error) log_completed(r, now);
    }
}

static void watch_poll(void);

/* One pass over the requests in flight, from a thread that computes
 * ([Note: progress from compute], core/comm/dist.c). A try-lock: when the
 * progress thread (or a wait) holds the lock it is progressing them. */
static void mpi_poke(void) {
    if (pthread_mutex_trylock(&S.lock) != 0) return;
    for (mpi_req *r = S.active, *next; r; r = next) {
        next = r->next;
        poll_one(r);
    }
    pthread_mutex_unlock(&S.lock);
}

static void *progress_main(void *arg) {
    struct timespec pause = {0, S.interval_us * 1000};
    pthread_mutex_lock(&S.lock);
    while (!S.stop) {
        watch_poll();
        if (!S.active) {
            /* Idle: look at the watch channel 50 times a second. */
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_nsec += 20000000;
            if (until.tv_nsec >= 1000000000) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&S.wake, &S.lock, &until);
            continue;
        }
        for (mpi_req *r = S.active, *next; r; r = next) {
            next = r->next;
            poll_one(r);
        }
        pthread_mutex_unlock(&S.lock);
        nanosleep(&pause, NULL);
        pthread_mutex_lock(&S.lock);
    }
    pthread_mutex_unlock(&S.lock);
    return NULL;
}

/* The progress thread's clock is CLOCK_REALTIME (the condition variable's
 * default); MPI calls never depend on it. */
static void start_progress_thread(void) {
    const char *env = getenv("FSDP_PROGRESS_THREAD");
    if (env && strcmp(env, "0") == 0) return;
    if (S.thread_level < MPI_THREAD_SERIALIZED) return;
    const char *iv = getenv("FSDP_PROGRESS_INTERVAL_US");
    S.interval_us = iv && atol(iv) > 0 ? atol(iv) : 100;
    if (S.interval_us >= 1000000) S.interval_us = 999999;
    S.stop = false;
    S.thread_running = pthread_create(&S.thread, NULL, progress_main, NULL) == 0;
}

/* ---- the watch channel (callers hold S.lock) ------------------------------------ */

static void watch_send_bytes(int dst, int tag, const void *data, int bytes) {
    watch_send *w = calloc(1, sizeof *w);
    void *copy = malloc(bytes > 0 ? (size_t)bytes : 1);
    if (!w || !copy) {
        free(w), free(copy);
        return;
    }
    memcpy(copy, data, (size_t)bytes);
    w->data = copy;
    if (MPI_Isend(copy, bytes, MPI_BYTE, dst, tag, W.comm, &w->request) != MPI_SUCCESS) {
        free(copy), free(w);
        return;
    }
    w->next = W.sends;
    W.sends = w;
}

static void own_answer(fl_roll_answer *a);

/* A roll call's answer: the caller's token, then this rank's collectives
 * in flight, seconds since it started its latest one (-1: none yet) and
 * the age of the oldest one in flight. */
static void answer_ping(int src, double token) {
    fl_roll_answer a;
    own_answer(&a);
    double reply[PONG_FIELDS] = {token, a.in_flight, a.since_last, a.oldest};
    watch_send_bytes(src, TAG_PONG, reply, sizeof reply);
}

static void watch_poll(void) {
    if (!W.open) return;
    for (;;) {
        int flag = 0, bytes = 0;
        MPI_Status st;
        if (MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, W.comm, &flag, &st) != MPI_SUCCESS || !flag)
            break;
        MPI_Get_count(&st, MPI_BYTE, &bytes);
        char *buf = malloc(bytes > 0 ? (size_t)bytes : 1);
        if (!buf) break;
        int src = st.MPI_SOURCE;
        MPI_Recv(buf, bytes, MPI_BYTE, src, st.MPI_TAG, W.comm, MPI_STATUS_IGNORE);
        double fields[PONG_FIELDS] = {0};
        memcpy(fields, buf, (size_t)bytes < sizeof fields ? (size_t)bytes : sizeof fields);
        if (st.MPI_TAG == TAG_PING) {
            answer_ping(src, fields[0]);
        } else if (st.MPI_TAG == TAG_PONG && fields[0] == W.token && W.answered) {
            memcpy(&W.pongs[src * PONG_FIELDS], fields, sizeof fields);
            W.answered[src] = true;
        } else if (st.MPI_TAG == TAG_LEAVE) {
            W.left[src] = true;
        }
        free(buf);
    }
    for (watch_send **link = &W.sends; *link;) {
        watch_send *w = *link;
        int done = 0;
        if (MPI_Test(&w->request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) done = 1;
        if (done) {
            *link = w->next;
            free(w->data);
            free(w);
        } else {
            link = &w->next;
        }
    }
}

static void watch_open(void) {
    W.size = 0;
    if (MPI_Comm_dup(S.world->comm, &W.comm) != MPI_SUCCESS) return;
    MPI_Comm_rank(W.comm, &W.rank);
    MPI_Comm_size(W.comm, &W.size);
    W.left = calloc((size_t)W.size, sizeof *W.left);
    W.pongs = calloc((size_t)W.size * PONG_FIELDS, sizeof *W.pongs);
    W.answered = calloc((size_t)W.size, sizeof *W.answered);
    if (!W.left || !W.pongs || !W.answered) {
        free(W.left), free(W.pongs), free(W.answered);
        MPI_Comm_free(&W.comm);
        return;
    }
    W.open = true;
}

/* Sends still in flight to a rank that is gone never complete: they are
 * given up (freed requests finish alone); their data stays allocated. */
static void watch_close(void) {
    if (!W.open) return;
    watch_poll();
    for (watch_send *w = W.sends, *next; w; w = next) {
        next = w->next;
        MPI_Request_free(&w->request);
        free(w);
    }
    W.sends = NULL;
    MPI_Comm_free(&W.comm);
    W.open = false;
}

/* What this rank itself is doing, in a roll call's terms. */
static void own_answer(fl_roll_answer *a) {
    double now = now_seconds();
    a->answered = true;
    a->in_flight = 0;
    a->oldest = 0;
    for (mpi_req *r = S.active; r; r = r->next) {
        if (!r->collective) continue;
        a->in_flight++;
        if (now - r->started > a->oldest) a->oldest = now - r->started;
    }
    a->since_last = S.last_start > 0 ? now - S.last_start : -1;
}

static int mpi_roll_call(void *comm_ptr, double patience, fl_roll_answer *answers) {
    if (!W.open) return fl_set_error(FL_ERR_STATE, "roll call: the watch channel is not open");
    int n = 0;
    pthread_mutex_lock(&S.lock);
    MPI_Comm comm = *(MPI_Comm *)comm_ptr;
    MPI_Comm_size(comm, &n);
    int *members = malloc(sizeof(int) * (size_t)n), *mine = malloc(sizeof(int) * (size_t)n);
    MPI_Group group, world;
    int rc = members && mine ? MPI_Comm_group(comm, &group) : MPI_ERR_NO_MEM;
    if (rc == MPI_SUCCESS) {
        MPI_Comm_group(W.comm, &world);
        for (int i = 0; i < n; i++) mine[i] = i;
        rc = MPI_Group_translate_ranks(group, n, mine, world, members);
        MPI_Group_free(&group);
        MPI_Group_free(&world);
    }
    if (rc != MPI_SUCCESS) {
        pthread_mutex_unlock(&S.lock);
        free(members), free(mine);
        return mpi_fail(rc, "roll call");
    }
    W.token += 1;
    memset(W.answered, 0, sizeof *W.answered * (size_t)W.size);
    for (int i = 0; i < n; i++)
        if (members[i] != W.rank && members[i] >= 0)
            watch_send_bytes(members[i], TAG_PING, &W.token, sizeof W.token);
    pthread_mutex_unlock(&S.lock);
    /* The answers come from the members' progress threads: wait for all
     * of them or for `patience` seconds. */
    double start = now_seconds();
    for (;;) {
        pthread_mutex_lock(&S.lock);
        watch_poll();
        int missing = 0;
        for (int i = 0; i < n; i++)
            missing += members[i] != W.rank && members[i] >= 0 && !W.answered[members[i]];
        pthread_mutex_unlock(&S.lock);
        if (!missing || now_seconds() - start > patience) break;
        struct timespec pause = {0, 1000000};
        nanosleep(&pause, NULL);
    }
    pthread_mutex_lock(&S.lock);
    for (int i = 0; i < n; i++) {
        fl_roll_answer *a = &answers[i];
        memset(a, 0, sizeof *a);
        a->world_rank = members[i];
        if (members[i] == W.rank) {
            own_answer(a);
        } else if (members[i] >= 0 && W.answered[members[i]]) {
            const double *p = &W.pongs[members[i] * PONG_FIELDS];
            a->answered = true;
            a->in_flight = (int)p[1];
            a->since_last = p[2];
            a->oldest = p[3];
        }
    }
    pthread_mutex_unlock(&S.lock);
    free(members), free(mine);
    return FL_OK;
}

static void mpi_leave(const char *why) {
    pthread_mutex_lock(&S.lock);
    if (W.open && !W.left[W.rank]) {
        int bytes = (int)strlen(why) + 1;
        for (int r = 0; r < W.size; r++)
            if (r != W.rank) watch_send_bytes(r, TAG_LEAVE, why, bytes);
        W.left[W.rank] = true;
    }
    pthread_mutex_unlock(&S.lock);
}

static int mpi_peers_left(bool *left) {
    int n = 0;
    pthread_mutex_lock(&S.lock);
    if (W.open) {
        watch_poll();
        /* Progress whatever this rank still has in flight. */
        for (mpi_req *r = S.active, *next; r; r = next) {
            next = r->next;
            poll_one(r);
        }
        for (int r = 0; r < W.size; r++) {
            left[r] = W.left[r];
            n += W.left[r];
        }
    }
    pthread_mutex_unlock(&S.lock);
    return n;
}

/* ---- types ------------------------------------------------------------------------ */

static MPI_Datatype mpi_type(fl_dtype d) {
    switch (d) {
    case FL_F32: return MPI_FLOAT;
    case FL_F64: return MPI_DOUBLE;
    case FL_F16:
    case FL_BF16: /* moved as bits; reductions are staged in f32 by the core */
    case FL_U16: return MPI_UINT16_T;
    case FL_I64: return MPI_INT64_T;
    case FL_I32: return MPI_INT32_T;
    case FL_I16: return MPI_INT16_T;
    case FL_I8: return MPI_INT8_T;
    case FL_U32: return MPI_UINT32_T;
    case FL_U8:
    case FL_BOOL: return MPI_UINT8_T; /* max is any, min is all */
    default: return MPI_DATATYPE_NULL;
    }
}

static MPI_Op mpi_op(fl_reduce_op op) {
    switch (op) {
    case FL_REDUCE_MAX: return MPI_MAX;
    case FL_REDUCE_MIN: return MPI_MIN;
    default: return MPI_SUM;
    }
}

/* ---- init and finalize ------------------------------------------------------------- */

/* Ring collectives' messages take tags above the monitored barrier's
 * (1 ... 30000, core/comm/monitored_barrier.c) and at most 32767, the
 * least MPI_TAG_UB the standard allows. */
enum { RING_TAG_FIRST = 30720, RING_TAGS = 2048 };

/* [Note: ring collectives] (ring.c): FSDP_MPI_RING=0 turns them off,
 * FSDP_RING_MIN_BYTES sets the smallest buffer they run (default 64 KiB). */
static void ring_settings(void) {
    const char *on = getenv("FSDP_MPI_RING"), *min = getenv("FSDP_RING_MIN_BYTES");
    S.ring_min_bytes = min && atol(min) >= 0 ? atol(min) : 64 * 1024;
    if (on && strcmp(on, "0") == 0) S.ring_min_bytes = -1;
}

/* This node's clock's offset from world rank 0's ([Note: joined time]),
 * into S.clock_offset: each node's leader (its lowest world rank;
 * leaders[r] names rank r's) pings rank 0, which answers each ping with
 * its clock; the round trip that was fastest gives the estimate. Runs at
 * start, before any other traffic on the world communicator. */
enum { TAG_CLOCK = 7, CLOCK_ROUNDS = 16 };
static int measure_clock_offset(const fl_dist_topology *t, const int *leaders, MPI_Comm local) {
    MPI_Comm world = S.world->comm;
    int rc = MPI_SUCCESS;
    double offset = 0, best = 1e30;
    char ping = 0;
    if (t->rank == 0) {
        for (int r = 1; r < t->size; r++) {
            if (leaders[r] != r) continue;
            for (int i = 0; i < CLOCK_ROUNDS && rc == MPI_SUCCESS; i++) {
                rc = MPI_Recv(&ping, 1, MPI_CHAR, r, TAG_CLOCK, world, MPI_STATUS_IGNORE);
                double now = now_seconds();
                if (rc == MPI_SUCCESS) rc = MPI_Send(&now, 1, MPI_DOUBLE, r, TAG_CLOCK, world);
            }
        }
    } else if (leaders[t->rank] == t->rank) {
        for (int i = 0; i < CLOCK_ROUNDS && rc == MPI_SUCCESS; i++) {
            double theirs = 0, sent = now_seconds();
            rc = MPI_Send(&ping, 1, MPI_CHAR, 0, TAG_CLOCK, world);
            if (rc == MPI_SUCCESS) rc = MPI_Recv(&theirs, 1, MPI_DOUBLE, 0, TAG_CLOCK, world, MPI_STATUS_IGNORE);
            double back = now_seconds();
            if (rc == MPI_SUCCESS && back - sent < best) {
                best = back - sent;
                offset = theirs - (sent + back) / 2;
            }
        }
    }
    if (rc == MPI_SUCCESS) rc = MPI_Bcast(&offset, 1, MPI_DOUBLE, 0, local);
    S.clock_offset = rc == MPI_SUCCESS ? offset : 0;
    return rc;
}

static int mpi_backend_init(fl_dist_topology *t) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    pthread_mutex_lock(&S.lock);
    int rc = MPI_SUCCESS;
    if (!initialized) {
        rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &S.thread_level);
        if (rc != MPI_SUCCESS) {
            pthread_mutex_unlock(&S.lock);
            return mpi_fail(rc, "MPI_Init_thread");
        }
        S.we_initialized = true;
    } else {
        MPI_Query_thread(&S.thread_level);
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    S.world = malloc(sizeof *S.world);
    const char *call = "MPI_Comm_dup";
    if (!S.world) {
        pthread_mutex_unlock(&S.lock);
        return fl_set_error(FL_ERR_OOM, "mpi backend: out of memory");
    }
    *S.world = (mpi_comm){.key = 1};
    rc = MPI_Comm_dup(MPI_COMM_WORLD, &S.world->comm);
    MPI_Comm local = MPI_COMM_NULL;
    int *leaders = NULL;
    if (rc == MPI_SUCCESS) {
        MPI_Comm_rank(S.world->comm, &t->rank);
        MPI_Comm_size(S.world->comm, &t->size);
        call = "MPI_Comm_split_type";
        rc = MPI_Comm_split_type(S.world->comm, MPI_COMM_TYPE_SHARED, t->rank, MPI_INFO_NULL, &local);
    }
    /* Nodes: the ranks sharing memory with this one. Each node is named by
     * its lowest world rank; the node index counts the lower-named nodes. */
    int leader = t->rank;
    if (rc == MPI_SUCCESS) {
        MPI_Comm_rank(local, &t->local_rank);
        MPI_Comm_size(local, &t->local_size);
        call = "MPI_Allreduce";
        rc = MPI_Allreduce(&t->rank, &leader, 1, MPI_INT, MPI_MIN, local);
    }
    if (rc == MPI_SUCCESS) {
        leaders = malloc(sizeof(int) * (size_t)t->size);
        call = "MPI_Allgather";
        rc = leaders ? MPI_Allgather(&leader, 1, MPI_INT, leaders, 1, MPI_INT, S.world->comm)
                     : MPI_ERR_NO_MEM;
    }
    if (rc == MPI_SUCCESS) {
        t->node = t->nodes = 0;
        for (int r = 0; r < t->size; r++) {
            if (leaders[r] != r) continue; /* r names a node */
            t->nodes++;
            if (r < leader) t->node++;
        }
    }
    if (rc == MPI_SUCCESS && t->nodes > 1) {
        call = "clock offset (MPI_Send/MPI_Recv/MPI_Bcast)";
        rc = measure_clock_offset(t, leaders, local);
    }
    free(leaders);
    if (local != MPI_COMM_NULL) MPI_Comm_free(&local);
    if (rc == MPI_SUCCESS) watch_open();
    pthread_mutex_unlock(&S.lock);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, call);
    ring_settings();
    start_progress_thread();
    return FL_OK;
}

static void mpi_backend_finalize(void) {
    if (S.thread_running) {
        pthread_mutex_lock(&S.lock);
        S.stop = true;
        pthread_cond_signal(&S.wake);
        pthread_mutex_unlock(&S.lock);
        pthread_join(S.thread, NULL);
        S.thread_running = false;
    }
    pthread_mutex_lock(&S.lock);
    watch_close();
    if (S.world) {
        MPI_Comm_free(&S.world->comm);
        free(S.world);
        S.world = NULL;
    }
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (S.we_initialized && !finalized) MPI_Finalize();
    pthread_mutex_unlock(&S.lock);
}

/* ---- communicators ---------------------------------------------------------------- */

static void *mpi_world(void) { return S.world; }

/* The key of the communicator a split of one keyed `parent` gave the
 * members of `color`: the same on all of them, since each counts the
 * parent's splits alike (splitting is collective over the parent). */
static uint32_t child_key(uint32_t parent, uint32_t split_index, int color) {
    uint64_t h = ((uint64_t)parent << 32 | split_index) ^ (uint64_t)(uint32_t)color * 0x9E3779B97F4A7C15ull;
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 33;
    h *= 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 33;
    return (uint32_t)h ? (uint32_t)h : 2; /* 0 is nobody's; the world is 1 */
}

static int mpi_split(void *comm, int color, int key, void **out) {
    MPI_Comm result = MPI_COMM_NULL;
    pthread_mutex_lock(&S.lock);
    mpi_comm *parent = comm;
    int rc = MPI_Comm_split(parent->comm, color < 0 ? MPI_UNDEFINED : color, key, &result);
    uint32_t split_index = parent->splits++;
    pthread_mutex_unlock(&S.lock);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Comm_split");
    *out = NULL;
    if (result == MPI_COMM_NULL) return FL_OK;
    mpi_comm *box = malloc(sizeof *box);
    if (!box) {
        pthread_mutex_lock(&S.lock);
        MPI_Comm_free(&result);
        pthread_mutex_unlock(&S.lock);
        return fl_set_error(FL_ERR_OOM, "mpi backend: out of memory");
    }
    *box = (mpi_comm){.comm = result, .key = child_key(parent->key, split_index, color)};
    *out = box;
    return FL_OK;
}

static int mpi_comm_rank(void *comm) {
    int r = -1;
    pthread_mutex_lock(&S.lock);
    MPI_Comm_rank(*(MPI_Comm *)comm, &r);
    pthread_mutex_unlock(&S.lock);
    return r;
}

static int mpi_comm_size(void *comm) {
    int n = 0;
    pthread_mutex_lock(&S.lock);
    MPI_Comm_size(*(MPI_Comm *)comm, &n);
    pthread_mutex_unlock(&S.lock);
    return n;
}

static int mpi_world_ranks(void *comm, int *ranks) {
    pthread_mutex_lock(&S.lock);
    MPI_Group group, world;
    int n = 0, rc = MPI_Comm_group(*(MPI_Comm *)comm, &group);
    if (rc == MPI_SUCCESS) {
        rc = MPI_Comm_group(MPI_COMM_WORLD, &world);
        MPI_Group_size(group, &n);
        int *mine = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
        if (rc == MPI_SUCCESS && mine) {
            for (int i = 0; i < n; i++) mine[i] = i;
            rc = MPI_Group_translate_ranks(group, n, mine, world, ranks);
        } else if (!mine) {
            rc = MPI_ERR_NO_MEM;
        }
        free(mine);
        MPI_Group_free(&world);
        MPI_Group_free(&group);
    }
    pthread_mutex_unlock(&S.lock);
    return rc == MPI_SUCCESS ? FL_OK : mpi_fail(rc, "MPI_Group_translate_ranks");
}

static void mpi_comm_free(void *comm) {
    pthread_mutex_lock(&S.lock);
    MPI_Comm_free((MPI_Comm *)comm);
    pthread_mutex_unlock(&S.lock);
    if (comm == S.world) S.world = NULL;
    free(comm);
}

/* ---- collectives and messages -------------------------------------------------------- */

static mpi_req *req_new(const char *what, bool receive) {
    mpi_req *r = calloc(1, sizeof *r);
    if (r) {
        r->what = what;
        r->receive = receive;
    }
    return r;
}

/* Record a started request (under the lock) or free it when the call
 * failed. */
static int started(mpi_req *r, int rc, void **req) {
    if (rc != MPI_SUCCESS) {
        pthread_mutex_unlock(&S.lock);
        const char *what = r->what;
        free(r);
        *req = NULL;
        return mpi_fail(rc, what);
    }
    track(r);
    pthread_mutex_unlock(&S.lock);
    *req = r;
    return FL_OK;
}

static int mpi_start(void *comm_ptr, const fl_coll *c, void **req) {
    static const char *const calls[] = {"MPI_Iallgather", "MPI_Ireduce_scatter_block",
                                        "MPI_Iallreduce", "MPI_Ibcast", "MPI_Ibarrier"};
    static const char *const ring_calls[] = {"ring all_gather (MPI_Isend/MPI_Irecv)",
                                             "ring reduce_scatter (MPI_Isend/MPI_Irecv)",
                                             "ring all_reduce (MPI_Isend/MPI_Irecv)"};
    *req = NULL;
    mpi_comm *box = comm_ptr;
    MPI_Comm comm = box->comm;
    MPI_Datatype type = mpi_type(c->dtype);
    if (type == MPI_DATATYPE_NULL && c->kind != FL_COLL_BARRIER)
        return fl_set_error(FL_ERR_UNSUPPORTED, "mpi backend: no MPI type for this dtype");
    if ((int)c->kind < 0 || c->kind > FL_COLL_BARRIER)
        return fl_set_error(FL_ERR_ARG, "mpi backend: unknown collective");
    mpi_req *r = req_new(calls[c->kind], false);
    if (!r) return fl_set_error(FL_ERR_OOM, "mpi backend: out of memory");
    int count = (int)c->count, rc;
    pthread_mutex_lock(&S.lock);
    r->collective = true;
    r->kind = (int)c->kind;
    r->started = S.last_start = now_seconds();
    r->comm_key = box->key;
    r->sequence = box->collectives++;
    int size = 1, elem = 0;
    if (S.ring_min_bytes >= 0 && c->kind <= FL_COLL_ALL_REDUCE) {
        MPI_Comm_size(comm, &size);
        MPI_Type_size(type, &elem);
    }
    if (S.ring_min_bytes >= 0 && mpi_ring_takes(c, size, elem, S.ring_min_bytes)) {
        int rank = 0;
        MPI_Comm_rank(comm, &rank);
        int tag = RING_TAG_FIRST + (int)(box->ring_sequence++ % RING_TAGS);
        r->what = ring_calls[c->kind];
        rc = mpi_ring_start(comm, rank, size, tag, c, type, mpi_op(c->op), &r->ring);
        return started(r, rc, req);
    }
    switch (c->kind) {
    case FL_COLL_ALL_GATHER:
        rc = MPI_Iallgather(c->send ? c->send : MPI_IN_PLACE, count, type, c->recv, count, type,
                            comm, &r->request);
        break;
    case FL_COLL_REDUCE_SCATTER:
        rc = MPI_Ireduce_scatter_block(c->send, c->recv, count, type, mpi_op(c->op), comm,
                                       &r->request);
        break;
    case FL_COLL_ALL_REDUCE:
        rc = MPI_Iallreduce(MPI_IN_PLACE, c->recv, count, type, mpi_op(c->op), comm,
                            &r->request);
        break;
    case FL_COLL_BROADCAST:
        rc = MPI_Ibcast(c->recv, count, type, c->root, comm, &r->request);
        break;
    case FL_COLL_BARRIER:
    default:
        rc = MPI_Ibarrier(comm, &r->request);
        break;
    }
    return started(r, rc, req);
}

static int mpi_test(void *req, bool *done) {
    mpi_req *r = req;
    pthread_mutex_lock(&S.lock);
    if (!S.thread_running) watch_poll();
    poll_one(r);
    bool finished = r->done;
    int error = r->error;
    pthread_mutex_unlock(&S.lock);
    *done = finished;
    if (!finished) return FL_OK;
    const char *what = r->what;
    free(r);
    return error ? mpi_fail(error, what) : FL_OK;
}

static int mpi_isend(void *comm, int dst, int tag, const void *buf, int nbytes, void **req) {
    mpi_req *r = req_new("MPI_Isend", false);
    if (!r) return fl_set_error(FL_ERR_OOM, "mpi backend: out of memory");
    pthread_mutex_lock(&S.lock);
    int rc = MPI_Isend(buf, nbytes, MPI_BYTE, dst, tag, *(MPI_Comm *)comm, &r->request);
    return started(r, rc, req);
}

static int mpi_irecv(void *comm, int src, int tag, void *buf, int nbytes, void **req) {
    mpi_req *r = req_new("MPI_Irecv", true);
    if (!r) return fl_set_error(FL_ERR_OOM, "mpi backend: out of memory");
    pthread_mutex_lock(&S.lock);
    int rc = MPI_Irecv(buf, nbytes, MPI_BYTE, src, tag, *(MPI_Comm *)comm, &r->request);
    return started(r, rc, req);
}

static void mpi_abandon(void *req) {
    mpi_req *r = req;
    pthread_mutex_lock(&S.lock);
    if (!r->done && r->ring) {
        mpi_ring_free(r->ring);
        untrack(r, now_seconds());
    } else if (!r->done) {
        if (r->receive) MPI_Cancel(&r->request);
        /* Freeing an active request lets the operation finish on its own. */
        MPI_Request_free(&r->request);
        untrack(r, now_seconds());
    }
    pthread_mutex_unlock(&S.lock);
    free(r);
}

/* Seconds MPI_Abort may take before the rank ends on its own. */
#define ABORT_GRACE_SECONDS 2

static void *abort_watchdog(void *code) {
    sleep(ABORT_GRACE_SECONDS);
    _exit((int)(intptr_t)code);
    return NULL;
}

static void mpi_abort(int code) {
    /* MPI_Abort asks the launcher to end the job and waits for it. Under
     * srun that is the node's slurmstepd, which waits for srun on the batch
     * node: a node cut off from it (a failed link) would keep its ranks
     * forever. The watchdog ends this rank after a grace period whatever
     * MPI_Abort does (tests/cluster/run.sh cuts a node's link). */
    pthread_t watchdog;
    if (pthread_create(&watchdog, NULL, abort_watchdog, (void *)(intptr_t)code) == 0)
        pthread_detach(watchdog);
    /* The progress thread may hold the lock inside MPI_Test; wait a little
     * for it, then abort regardless: ending the job matters more. */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 2;
    pthread_mutex_timedlock(&S.lock, &until);
    MPI_Abort(MPI_COMM_WORLD, code);
    _exit(code);
}

/* [Note: busy time]
 * The seconds during which collectives of a kind were in flight, from the
 * start call until the progress thread (or a test) saw them complete:
 * what fsdp.plan.cost's communication time predicts (the link's time,
 * whether compute hid it or not), unlike the core's wait time, which is
 * only what compute did not hide. Completion is seen within the progress
 * thread's interval (100 us); without the thread, only when tested. */
static double mpi_busy_seconds(int kind) {
    int k = kind < 0 || kind > FL_COLL_BARRIER ? FL_COLL_BARRIER + 1 : kind;
    pthread_mutex_lock(&S.lock);
    double s = S.busy_total[k] + (S.in_flight[k] > 0 ? now_seconds() - S.busy_since[k] : 0);
    pthread_mutex_unlock(&S.lock);
    return s;
}

/* [Note: joined time]
 * A collective cannot move anything before its last member starts it, so
 * the time from that start to its completion is what the link (and the
 * planner's model of it, fsdp.plan.cost) accounts for; the busy time
 * above also holds the wait for late members. On a machine whose cores
 * are shared by more ranks than it has, members start the same collective
 * milliseconds apart, and busy time then exceeds the link's by tens of
 * percent (issue 19's HYBRID_SHARD measurements).
 *
 * So the plugin logs each completed collective: its communicator's key
 * (equal on all members: the world is 1, a split's key mixes its parent's,
 * the parent's split count and the color), its sequence on that
 * communicator (members start collectives in the same order), when it
 * started here and when it was seen complete here. fsdp.dist.joined_time
 * gathers the logs of all ranks and takes, for each collective, the
 * latest start among its members. Times are on world rank 0's monotonic
 * clock: ranks of a node share one clock; each other node's leader
 * measures its offset from rank 0 at start (the reply time against the
 * midpoint of the fastest of CLOCK_ROUNDS round trips, so the error is
 * under half that round trip) and tells its node. */
static int mpi_collective_log(fl_coll_record *out, int max, int64_t *lost) {
    pthread_mutex_lock(&S.lock);
    int n = max < S.log_count ? max : S.log_count;
    for (int i = 0; i < n; i++) out[i] = S.log[(S.log_head + i) % FL_COLL_LOG_CAPACITY];
    S.log_head = (S.log_head + n) % FL_COLL_LOG_CAPACITY;
    S.log_count -= n;
    *lost = S.log_lost;
    S.log_lost = 0;
    pthread_mutex_unlock(&S.lock);
    return n;
}

static const fl_dist_backend mpi_backend = {
    .abi = FL_DIST_BACKEND_ABI,
    .name = "mpi",
    .init = mpi_backend_init,
    .finalize = mpi_backend_finalize,
    .world = mpi_world,
    .split = mpi_split,
    .comm_rank = mpi_comm_rank,
    .comm_size = mpi_comm_size,
    .world_ranks = mpi_world_ranks,
    .comm_free = mpi_comm_free,
    .start = mpi_start,
    .test = mpi_test,
    .isend = mpi_isend,
    .irecv = mpi_irecv,
    .abandon = mpi_abandon,
    .abort = mpi_abort,
    .roll_call = mpi_roll_call,
    .leave = mpi_leave,
    .peers_left = mpi_peers_left,
    .busy_seconds = mpi_busy_seconds,
    .collective_log = mpi_collective_log,
    .poke = mpi_poke,
};

EXPORT const fl_dist_backend *fl_dist_mpi_backend(void);
EXPORT const fl_dist_backend *fl_dist_mpi_backend(void) { return &mpi_backend; }
