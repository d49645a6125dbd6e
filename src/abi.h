/*
 * Versioned structs: how libatap reads a struct of any size that starts
 * with `size_t size` (atap.h's conventions say which and why; CHANGELOG.md
 * has the policy). Layer 0: the built-in tasks read atap_spawn_opts,
 * atap_cmd and atap_fs_req through it too.
 *
 * A struct the caller fills is copied into the library's own layout:
 *   - size 0 stands for the struct's first layout, as libatap 0.1 had it
 *     (`first` bytes: up to the end of its last field then), so that a
 *     designated initialiser that leaves size out means what it meant
 *     when it was written, whatever fields come later;
 *   - a size below sizeof(size_t) is ATAP_EINVAL: no layout is so small;
 *   - up to the library's layout, the bytes the caller has are copied and
 *     the fields past them read 0 (a caller built against an older header);
 *   - past it (a caller built against a newer header), the bytes this
 *     library does not know must all be 0: a field it would ignore is set,
 *     and ignoring it could do what the caller did not ask for;
 *   - the copy's size then reads the library's layout.
 * A struct the library fills is written up to the size its caller passed
 * (atap.h's inline wrappers pass the header's sizeof), at most the
 * library's layout, and its size field says how much was written: writing
 * less is always safe, so any size from sizeof(size_t) up is taken.
 */
#ifndef ATAP_ABI_H
#define ATAP_ABI_H

#include <stddef.h>
#include <string.h>

#include "atap.h"

/* The end of a struct's last field in libatap 0.1: what size 0 stands for. */
#define ATAP__FIRST(type, last) (offsetof(type, last) + sizeof(((type *)0)->last))
#define ATAP__CONFIG_FIRST ATAP__FIRST(atap_config, blocking_threads)
#define ATAP__OPTS_FIRST ATAP__FIRST(atap_spawn_opts, in_free)
#define ATAP__STATS_FIRST ATAP__FIRST(struct atap_pool_stats, fired_10ms)
#define ATAP__CMD_FIRST ATAP__FIRST(atap_cmd, input_len)
#define ATAP__FS_REQ_FIRST ATAP__FIRST(atap_fs_req, buf_done)

/* While atap_spawn_opts is as libatap 0.1 had it, size 0 and sizeof are
 * one layout, and a spawn reads such options where they lie (spawn.c's
 * quick path does). A field added makes size 0 shorter than sizeof: that
 * path must then copy (atap__opts_in), or read only the first fields. */
_Static_assert(sizeof(atap_spawn_opts) - ATAP__OPTS_FIRST < _Alignof(atap_spawn_opts),
               "atap_spawn_opts grew: size 0 no longer reads in place (abi.h)");

/* Copies the caller's struct `in` (its size field first) into `out`,
 * `known` bytes, the library's layout; `first`: what size 0 stands for.
 * Returns 0 or ATAP_EINVAL (the rule above; `out` is then all zero). */
static inline int atap__struct_in(void *out, size_t known, const void *in, size_t first)
{
    const unsigned char *bytes = (const unsigned char *)in;
    size_t size;

    memset(out, 0, known);
    memcpy(&size, in, sizeof size);
    if (size == 0)
        size = first;
    if (size < sizeof(size_t))
        return ATAP_EINVAL;
    for (size_t i = known; i < size; i++)
        if (bytes[i])
            return ATAP_EINVAL;
    memcpy(out, in, size < known ? size : known);
    memcpy(out, &known, sizeof known);
    return 0;
}

/* A struct the library filled (`from`, `known` bytes, its layout) into the
 * caller's of `size` bytes: at most that, with its size field saying how
 * much. Returns 0; ATAP_EINVAL for a size below sizeof(size_t) (no room
 * for the size field; nothing is written). */
static inline int atap__struct_out(void *out, size_t size, void *from, size_t known)
{
    size_t n = size < known ? size : known;

    if (size < sizeof(size_t))
        return ATAP_EINVAL;
    memcpy(from, &n, sizeof n);
    memcpy(out, from, n);
    return 0;
}

/* The options a spawn reads: *opts itself when it is NULL or in this
 * library's layout (size 0 or sizeof), else a copy made in *copy by the
 * rule above. Returns 0 or ATAP_EINVAL. */
static inline int atap__opts_in(const atap_spawn_opts **opts, atap_spawn_opts *copy)
{
    const atap_spawn_opts *o = *opts;
    int rc;

    if (!o || o->size == 0 || o->size == sizeof *o)
        return 0;
    if ((rc = atap__struct_in(copy, sizeof *copy, o, ATAP__OPTS_FIRST)) == 0)
        *opts = copy;
    return rc;
}

/* A copy of the options in this library's layout into *out: all zero (the
 * defaults) for NULL. Returns 0 or ATAP_EINVAL. */
static inline int atap__opts_copy(const atap_spawn_opts *in, atap_spawn_opts *out)
{
    if (!in) {
        memset(out, 0, sizeof *out);
        return 0;
    }
    return atap__struct_in(out, sizeof *out, in, ATAP__OPTS_FIRST);
}

#endif
