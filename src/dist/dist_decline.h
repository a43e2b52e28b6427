/* What another room of the library calls in src/dist to keep the ranks paired (no MPI types
   here: src/amp includes it). */
#ifndef MT_DIST_DECLINE_H
#define MT_DIST_DECLINE_H

/* This rank cannot make the mt_all_reduce its peers are making now (local < 0, its error
   set): it takes part in their agreement marked failed, so that they fail too ("the call
   failed on another rank before the exchange") instead of waiting for it until the timeout
   and pairing their all-reduce with its next collective. Returns local; the error is kept
   unless the agreement itself fails (a timeout breaks the world, and says so). Ranks that
   are threads of one process (mt_dist_init_thread) have no agreement to join: there it does
   nothing. */
int mt_dist_all_reduce_decline(const char *op, int local);

#endif
