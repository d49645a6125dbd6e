/*
 * The ATAP_PATH_* changes (atap/core.h) as inotify's event bits, both ways:
 * one table for the path source (sources.c) and the directory watch task
 * (tasks/fs_watch.c). Linux only; a file that includes it has
 * <sys/inotify.h>.
 */
#ifndef ATAP_INOTIFY_CHANGES_H
#define ATAP_INOTIFY_CHANGES_H

#if defined(__linux__)
#include <stdint.h>
#include <sys/inotify.h>

#include "atap.h"

/* The events to ask for: the changes asked, and always the file's going. */
static inline uint32_t atap__inotify_mask(unsigned changes)
{
    return ((changes & ATAP_PATH_WRITE) ? IN_MODIFY | IN_CLOSE_WRITE : 0) |
           ((changes & ATAP_PATH_ATTRIB) ? IN_ATTRIB : 0) |
           ((changes & ATAP_PATH_ENTRIES) ? IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO
                                          : 0) |
           IN_DELETE_SELF | IN_MOVE_SELF;
}

/* The changes an event's mask reports. */
static inline unsigned atap__inotify_changes(uint32_t mask)
{
    return ((mask & (IN_MODIFY | IN_CLOSE_WRITE)) ? ATAP_PATH_WRITE : 0) |
           ((mask & IN_ATTRIB) ? ATAP_PATH_ATTRIB : 0) |
           ((mask & (IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO)) ? ATAP_PATH_ENTRIES
                                                                           : 0) |
           ((mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED | IN_UNMOUNT)) ? ATAP_PATH_GONE
                                                                               : 0);
}
#endif

#endif
