/*
 * ring.h: ring collectives over MPI point-to-point messages, inside the
 * MPI plugin (see [Note: ring collectives] in ring.c). Every function is
 * called with the plugin's MPI lock held.
 */
#ifndef FL_DIST_MPI_RING_H
#define FL_DIST_MPI_RING_H

#include "dist_backend.h"

#include <mpi.h>
#include <stdbool.h>

typedef struct mpi_ring mpi_ring;

/* Whether the ring should run c on a communicator of `size` ranks: an
 * all-gather, reduce-scatter or all-reduce of at least `min_bytes` with a
 * block for every rank. */
bool mpi_ring_takes(const fl_coll *c, int size, int elem_size, long min_bytes);

/* Start c on comm (this rank `rank` of `size`), its messages tagged `tag`
 * (unique among this communicator's collectives in flight). Posts the
 * first step; returns an MPI error code, MPI_SUCCESS with *out set. */
int mpi_ring_start(MPI_Comm comm, int rank, int size, int tag, const fl_coll *c,
                   MPI_Datatype type, MPI_Op op, mpi_ring **out);

/* Advance as far as the messages that arrived allow: finished steps are
 * reduced and the next ones posted. *done once the result is in place. */
int mpi_ring_progress(mpi_ring *g, bool *done);

/* Free a finished ring; an unfinished one has its receives cancelled and
 * its sends left to finish alone (their scratch buffers are not freed). */
void mpi_ring_free(mpi_ring *g);

#endif /* FL_DIST_MPI_RING_H */
