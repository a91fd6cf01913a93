/* A communicator of one process for tests: every collective moves this
 * rank's bytes to itself, so a sharded optimizer over it owns the whole
 * flat buffer. */
#ifndef LLMT_TEST_SELF_COMM_H
#define LLMT_TEST_SELF_COMM_H

#include "llmt/llmt.h"

/* A new communicator of one process (NULL on failure, with the library's
 * error); free it with llmt_comm_free. */
llmt_comm *test_self_comm(void);

#endif
