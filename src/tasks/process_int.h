/*
 * What process.c and process_start.c share, and no one else (callers use
 * atap.h): starting a child. process_start.c checks a command's streams
 * and environment and starts it; process.c has the tasks that feed, read,
 * wait for and kill it. Each file's top comment has its rule.
 */
#ifndef ATAP_PROCESS_INT_H
#define ATAP_PROCESS_INT_H

#include <sys/types.h>

#include "atap.h"

/* process_start.c. Checks cmd->stdio and cmd->env_set; `pipes`: whether
 * ATAP_STDIO_PIPE may be asked for. 0 or ATAP_EINVAL. */
int atap__proc_check(const atap_cmd *cmd, bool pipes);

/*
 * process_start.c. Starts cmd with its streams as st says (no
 * ATAP_STDIO_DEFAULT left: the caller chose for each), in a process group
 * of its own. fds[i]: our end of stream i's pipe (the write end of
 * stdin's, the read end of the others'), close-on-exec and blocking; -1
 * for a stream that is no pipe. Returns 0 and *pid, or -errno with no
 * child started and no fd left open.
 */
int atap__proc_start(const atap_cmd *cmd, const atap_stdio st[3], pid_t *pid, int fds[3]);

#endif
