/* Routed-expert fixtures for tests. */
#ifndef BT_TESTS_MOE_H
#define BT_TESTS_MOE_H

#include "base/status.h"
#include "model/model.h"

/* Every sparse layer's router row of expert 1 and of the experts that EP
 * rank 1 of `ep` holds (E/ep of them from E/ep) copied from expert 0's (m
 * holds every expert's router row, as every EP rank does): they tie with
 * expert 0, and top-K ties go to the lower index, so no token ever picks
 * one of EP rank 1's experts until training moves the rows apart. */
bt_status_t test_moe_routers_tie(model_t *m, int ep);

#endif
