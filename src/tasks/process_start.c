/*
 * Starting a child: its standard streams (pipes, files, /dev/null, the
 * caller's fds, stderr onto stdout), its environment (env, with env_set's
 * changes) and its working directory, then posix_spawnp. process.c has
 * the tasks; process_int.h what the two share.
 *
 * posix_spawnp runs no code of ours between fork and exec, so a
 * multithreaded parent is safe. Everything the child gets is opened here,
 * in the parent, before the spawn: a file that cannot be opened is the
 * call's own error (not a child that failed to exec), and a path is the
 * caller's (relative to its working directory). Each fd made for the
 * child is close-on-exec and numbered 3 or above (a caller that closed
 * its fd 0, 1 or 2 would have a new pipe land there), and the file
 * actions dup2 it onto 0, 1 or 2 (dup2 clears the flag on the copy), in
 * that order, then 2 onto 1 for ATAP_STDIO_STDOUT. The fds are closed
 * again as the call returns, whatever happened: only our ends of pipes
 * outlive it.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pipe2, posix_spawn_file_actions_addchdir_np */
#endif
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "atap.h"
#include "process_int.h"

#if defined(__APPLE__)
#include <crt_externs.h>
#define environ (*_NSGetEnviron()) /* a dylib may not name environ itself */
#else
extern char **environ;
#endif

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

/* ---- checks --------------------------------------------------------------- */

static bool stdio_ok(const atap_stdio *s, int i, bool pipes)
{
    switch (s->how) {
    case ATAP_STDIO_DEFAULT:
    case ATAP_STDIO_INHERIT:
    case ATAP_STDIO_NULL:
        return true;
    case ATAP_STDIO_PIPE:
        return pipes;
    case ATAP_STDIO_FILE:
        return s->path != NULL;
    case ATAP_STDIO_APPEND:
        return s->path != NULL && i > 0;
    case ATAP_STDIO_FD:
        return s->fd >= 0;
    case ATAP_STDIO_STDOUT:
        return i == 2;
    default:
        return false;
    }
}

int atap__proc_check(const atap_cmd *cmd, bool pipes)
{
    for (int i = 0; i < 3; i++)
        if (!stdio_ok(&cmd->stdio[i], i, pipes))
            return ATAP_EINVAL;
    if (cmd->input && cmd->stdio[0].how != ATAP_STDIO_DEFAULT)
        return ATAP_EINVAL;
    for (const char *const *e = cmd->env_set; e && *e; e++)
        if ((*e)[0] == '\0' || (*e)[0] == '=')
            return ATAP_EINVAL;
    return 0;
}

/* ---- the streams ---------------------------------------------------------- */

/* fd moved to a number of 3 or above, close-on-exec: the new fd, or
 * -errno (fd closed either way). */
static int high(int fd)
{
    int moved;

    if (fd < 0)
        return -errno;
    if (fd >= 3)
        return fd;
    moved = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (moved < 0)
        moved = -errno;
    close(fd);
    return moved;
}

/* A pipe, both ends close-on-exec and 3 or above. 0 or -errno. */
static int make_pipe(int p[2])
{
    int rc;

#if defined(__linux__) || defined(__FreeBSD__) || defined(__NetBSD__) || defined(__OpenBSD__)
    if (pipe2(p, O_CLOEXEC) != 0)
        return -errno;
#else
    if (pipe(p) != 0)
        return -errno;
    if (fcntl(p[0], F_SETFD, FD_CLOEXEC) != 0 || fcntl(p[1], F_SETFD, FD_CLOEXEC) != 0) {
        rc = -errno;
        close(p[0]);
        close(p[1]);
        p[0] = p[1] = -1;
        return rc;
    }
#endif
    p[0] = high(p[0]);
    p[1] = high(p[1]);
    if (p[0] < 0 || p[1] < 0) {
        rc = p[0] < 0 ? p[0] : p[1];
        if (p[0] >= 0)
            close(p[0]);
        if (p[1] >= 0)
            close(p[1]);
        p[0] = p[1] = -1;
        return rc;
    }
    return 0;
}

/* Stream i as s says: *theirs, the fd to dup2 onto i (-1: none, the
 * child keeps ours or gets 2 onto 1), *ours, our end of a pipe (-1: no
 * pipe). 0 or -errno (nothing left open). */
static int stream_open(const atap_stdio *s, int i, int *theirs, int *ours)
{
    int p[2], flags;

    *theirs = *ours = -1;
    switch (s->how) {
    case ATAP_STDIO_PIPE:
        if ((flags = make_pipe(p)) != 0)
            return flags;
        *ours = i == 0 ? p[1] : p[0]; /* stdin: we write; the others: we read */
        *theirs = i == 0 ? p[0] : p[1];
        return 0;
    case ATAP_STDIO_NULL:
        *theirs = high(open("/dev/null", (i == 0 ? O_RDONLY : O_WRONLY) | O_CLOEXEC));
        break;
    case ATAP_STDIO_FILE:
    case ATAP_STDIO_APPEND:
        flags = i == 0 ? O_RDONLY
                       : O_WRONLY | O_CREAT | (s->how == ATAP_STDIO_APPEND ? O_APPEND : O_TRUNC);
        *theirs = high(open(s->path, flags | O_CLOEXEC, 0666));
        break;
    case ATAP_STDIO_FD:
        *theirs = fcntl(s->fd, F_DUPFD_CLOEXEC, 3);
        if (*theirs < 0)
            *theirs = -errno;
        break;
    default: /* INHERIT, STDOUT */
        return 0;
    }
    if (*theirs < 0) {
        int rc = *theirs;
        *theirs = -1;
        return rc;
    }
    return 0;
}

/* ---- the environment ------------------------------------------------------ */

/* The length of entry e's name: up to its '=' or its end. */
static size_t name_len(const char *e)
{
    const char *eq = strchr(e, '=');

    return eq ? (size_t)(eq - e) : strlen(e);
}

/* Whether `set` (an env_set entry) names the variable of entry e. */
static bool same_name(const char *e, const char *set)
{
    size_t n = name_len(set);

    return strncmp(e, set, n) == 0 && e[n] == '=';
}

/* base with env_set's changes: a malloc'd array of base's and env_set's
 * own strings (none copied), into *out. 0 or -ENOMEM. */
static int env_build(char *const *base, const char *const *set, char ***out)
{
    size_t nb = 0, ns = 0, k = 0;
    char **env;

    while (base && base[nb])
        nb++;
    while (set[ns])
        ns++;
    if (!(env = malloc((nb + ns + 1) * sizeof *env)))
        return -ENOMEM;
    for (size_t i = 0; i < nb; i++) {
        bool changed = false;
        for (size_t j = 0; j < ns && !changed; j++)
            changed = same_name(base[i], set[j]);
        if (!changed)
            env[k++] = base[i];
    }
    for (size_t j = 0; j < ns; j++) {
        bool later = false; /* a later entry of the same name wins */
        for (size_t l = j + 1; l < ns && !later; l++)
            later = name_len(set[l]) == name_len(set[j]) &&
                    strncmp(set[l], set[j], name_len(set[j])) == 0;
        if (!later && strchr(set[j], '='))
            env[k++] = (char *)set[j];
    }
    env[k] = NULL;
    *out = env;
    return 0;
}

/* ---- the spawn ------------------------------------------------------------ */

/* posix_spawnp with the file actions for theirs[] and st, in a group of
 * its own, no signal blocked, every disposition the default. */
static int spawn(const atap_cmd *cmd, const atap_stdio st[3], const int theirs[3],
                 char *const *envp, pid_t *pid)
{
    char *alone[2] = {(char *)cmd->program, NULL};
    char *const *argv = cmd->argv ? (char *const *)cmd->argv : alone;
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    sigset_t none, all;
    int rc;

    if ((rc = -posix_spawn_file_actions_init(&fa)) != 0)
        return rc;
    if ((rc = -posix_spawnattr_init(&at)) != 0) {
        posix_spawn_file_actions_destroy(&fa);
        return rc;
    }
    sigemptyset(&none);
    sigfillset(&all);
    for (int i = 0; i < 3 && !rc; i++)
        if (theirs[i] >= 0)
            rc = -posix_spawn_file_actions_adddup2(&fa, theirs[i], i);
    if (!rc && st[2].how == ATAP_STDIO_STDOUT)
        rc = -posix_spawn_file_actions_adddup2(&fa, 1, 2);
    if (!rc && cmd->dir) {
#if (defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 29)) || defined(__APPLE__) ||      \
    defined(__FreeBSD__)
        rc = -posix_spawn_file_actions_addchdir_np(&fa, cmd->dir);
#else
        rc = -ENOTSUP;
#endif
    }
    if (!rc)
        rc = -posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                                POSIX_SPAWN_SETSIGDEF);
    if (!rc)
        rc = -posix_spawnattr_setpgroup(&at, 0);
    if (!rc)
        rc = -posix_spawnattr_setsigmask(&at, &none);
    if (!rc)
        rc = -posix_spawnattr_setsigdefault(&at, &all);
    if (!rc)
        rc = -posix_spawnp(pid, cmd->program, &fa, &at, argv, envp);
    posix_spawnattr_destroy(&at);
    posix_spawn_file_actions_destroy(&fa);
    return rc;
}

int atap__proc_start(const atap_cmd *cmd, const atap_stdio st[3], pid_t *pid, int fds[3])
{
    int theirs[3] = {-1, -1, -1};
    char *const *envp = cmd->env ? (char *const *)cmd->env : environ;
    char **built = NULL;
    int rc = 0;

    fds[0] = fds[1] = fds[2] = -1;
    for (int i = 0; i < 3 && !rc; i++)
        rc = stream_open(&st[i], i, &theirs[i], &fds[i]);
    if (!rc && cmd->env_set && (rc = env_build(envp, cmd->env_set, &built)) == 0)
        envp = built;
    if (!rc)
        rc = spawn(cmd, st, theirs, envp, pid);
    free(built);
    for (int i = 0; i < 3; i++) {
        close_fd(&theirs[i]);
        if (rc)
            close_fd(&fds[i]);
    }
    return rc;
}
