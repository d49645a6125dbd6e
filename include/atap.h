/*
 * libatap: Any Time Any Place. An embeddable task runtime for C.
 *
 * This header is the whole library: the runtime (atap/core.h: tasks,
 * time, values between tasks, waiting inside a task; the conventions every
 * call follows are at its top) and the built-in tasks, each area in a
 * header of its own:
 *   atap/fs.h       files: operations and watches
 *   atap/process.h  child processes and signals
 *   atap/tasks.h    a sleep, and channels between tasks
 *   atap/net.h      sockets: TCP, UDP, Unix (it includes <sys/socket.h>)
 * A program that wants only some of them includes <atap/core.h> and those.
 */
#ifndef ATAP_H
#define ATAP_H

#include "atap/core.h"
#include "atap/fs.h"
#include "atap/net.h"
#include "atap/process.h"
#include "atap/tasks.h"

#endif /* ATAP_H */
