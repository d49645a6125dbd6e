/*
 * File operations and watches (src/tasks/fs.c): each operation spawned and
 * run with atap_block, its results and its errors (ENOENT, EEXIST,
 * ENOTEMPTY, EISDIR, ENOTDIR, EACCES when not root), who owns the buffers,
 * a cancel and a run timeout landing between the chunks of a copy or a
 * read, and the watch task: changes reported in order with removal last,
 * and a repeat losing no change made between its runs.
 *
 * Every test works in a fresh mkdtemp directory, removed by the teardown.
 * Chunks are made observable by atap__fs_chunk_hook (src/tasks/fs.c),
 * which the copy and read tests use to cancel at a known chunk or to slow
 * each chunk down. Exact things are asserted strictly; time only with
 * generous upper bounds (the CI machine is a loaded 2-core VM).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_util.h"

#define CHUNK (64u * 1024u)
#define GAP ATAP_MS(200) /* a watch repeat's gap: time to take each report */

extern _Atomic(void (*)(uint64_t)) atap__fs_chunk_hook; /* src/tasks/fs.c */

static char g_dir[256];

static const char *at(const char *name)
{
    static char buf[4][512];
    static int next;
    char *b = buf[next++ % 4];

    snprintf(b, sizeof buf[0], "%s/%s", g_dir, name);
    return b;
}

static int setup_fs(void **state)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/atap_fs_XXXXXX");
    if (!mkdtemp(g_dir))
        return -1;
    return setup_runtime(state);
}

static int teardown_fs(void **state)
{
    atap_fs_out o;

    atomic_store(&atap__fs_chunk_hook, NULL);
    chmod(g_dir, 0700);
    atap_block(atap_fs_run,
               &(atap_fs_req){.op = ATAP_FS_REMOVE, .flags = ATAP_FS_TREE, .path = g_dir}, &o,
               sizeof o);
    if (o.rc != 0)
        print_error("could not remove %s: %s\n", g_dir, atap_strerror(o.rc));
    return teardown_runtime(state);
}

/* Spawns q, takes its output (the task itself must succeed). */
static atap_fs_out run(atap_fs_req q)
{
    atap_fs_out o;
    atap_task t;

    memset(&o, 0xa5, sizeof o);
    assert_int_equal(atap_fs_spawn(&t, &q, NULL), 0);
    assert_int_equal(atap_take(t, &o, sizeof o), 0);
    atap_release(t);
    return o;
}

/* Only the result code; no data is asked for by the ops it is used on. */
static int rc_of(atap_fs_req q)
{
    atap_fs_out o = run(q);
    assert_null(o.data);
    return o.rc;
}

static void put(const char *path, const char *text)
{
    atap_fs_out o =
        run((atap_fs_req){.op = ATAP_FS_WRITE, .path = path, .data = text, .len = strlen(text)});
    assert_int_equal(o.rc, 0);
    assert_int_equal(o.n, strlen(text));
}

static void assert_contents(const char *path, const char *text)
{
    atap_fs_out o = run((atap_fs_req){.op = ATAP_FS_READ, .path = path});
    assert_int_equal(o.rc, 0);
    assert_int_equal(o.n, strlen(text));
    assert_string_equal(o.data, text); /* NUL-ended */
    free(o.data);
}

static atap_fs_meta meta(const char *path, bool follow, int want_rc)
{
    atap_fs_out o = run((atap_fs_req){.op = follow ? ATAP_FS_STAT : ATAP_FS_LSTAT, .path = path});
    assert_int_equal(o.rc, want_rc);
    return o.meta;
}

/* A file of n bytes, byte i being (i * 7 + i / 251) & 0xff. */
static unsigned char *pattern(size_t n)
{
    unsigned char *p = malloc(n);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)((i * 7 + i / 251) & 0xff);
    return p;
}

/* ---- reading and writing ------------------------------------------------- */

static void test_fs_write_read_append_at(void **state)
{
    (void)state;
    char buf[8];
    atap_fs_out o;

    put(at("f"), "hello");
    assert_contents(at("f"), "hello");
    o = run((atap_fs_req){.op = ATAP_FS_APPEND, .path = at("f"), .data = " world", .len = 6});
    assert_int_equal(o.rc, 0);
    assert_int_equal(o.n, 6);
    assert_contents(at("f"), "hello world");
    o = run((atap_fs_req){.op = ATAP_FS_WRITE_AT, .path = at("f"), .data = "J", .len = 1});
    assert_int_equal(o.rc, 0);
    assert_contents(at("f"), "Jello world");
    /* WRITE truncates. */
    put(at("f"), "abc");
    assert_contents(at("f"), "abc");
    /* APPEND creates. */
    o = run((atap_fs_req){.op = ATAP_FS_APPEND, .path = at("g"), .data = "x", .len = 1});
    assert_int_equal(o.rc, 0);
    assert_contents(at("g"), "x");
    /* An empty write makes an empty file. */
    o = run((atap_fs_req){.op = ATAP_FS_WRITE, .path = at("e")});
    assert_int_equal(o.rc, 0);
    assert_int_equal(o.n, 0);
    assert_contents(at("e"), "");

    /* read_at: malloc'd, then into the caller's buffer. */
    put(at("f"), "0123456789");
    o = run((atap_fs_req){.op = ATAP_FS_READ_AT, .path = at("f"), .offset = 3, .len = 4});
    assert_int_equal(o.rc, 0);
    assert_int_equal(o.n, 4);
    assert_memory_equal(o.data, "3456", 4);
    free(o.data);
    memset(buf, 0, sizeof buf);
    o = run(
        (atap_fs_req){.op = ATAP_FS_READ_AT, .path = at("f"), .offset = 8, .len = 8, .buf = buf});
    assert_int_equal(o.rc, 0);
    assert_int_equal(o.n, 2); /* short at the end */
    assert_ptr_equal(o.data, buf);
    assert_memory_equal(buf, "89", 2);
    o = run(
        (atap_fs_req){.op = ATAP_FS_READ_AT, .path = at("f"), .offset = 100, .len = 8, .buf = buf});
    assert_int_equal(o.rc, 0);
    assert_int_equal(o.n, 0);
}

/* The first chunk of a read_at grows the file it reads (once). */
static int g_grow_fd = -1;
static unsigned char *g_grow_tail;

static void grow_once(uint64_t done)
{
    (void)done;
    if (g_grow_fd >= 0) {
        CHECK(write(g_grow_fd, g_grow_tail, 3 * CHUNK) == (ssize_t)(3 * CHUNK));
        close(g_grow_fd);
        g_grow_fd = -1;
    }
}

/* A read_at without a buffer sizes its buffer by what the file gives, not
 * by len: SIZE_MAX reads the rest of the file, of a regular file, of one
 * whose size says nothing (/proc), and of one that grows while read. */
static void test_fs_read_at_sized_by_the_file(void **state)
{
    (void)state;
    atap_fs_out o, whole;
    unsigned char *p = pattern(5 * CHUNK);

    put(at("six"), "abcdef");
    o = run((atap_fs_req){.op = ATAP_FS_READ_AT, .path = at("six"), .len = SIZE_MAX});
    assert_int_equal(o.rc, 0);
    assert_int_equal(o.n, 6);
    assert_memory_equal(o.data, "abcdef", 6);
    free(o.data);
    o = run((atap_fs_req){.op = ATAP_FS_READ_AT, .path = at("six"), .offset = 4, .len = SIZE_MAX});
    assert_int_equal(o.rc, 0);
    assert_int_equal(o.n, 2);
    assert_memory_equal(o.data, "ef", 2);
    free(o.data);
    o = run((atap_fs_req){.op = ATAP_FS_READ_AT, .path = at("six"), .offset = 9, .len = SIZE_MAX});
    assert_int_equal(o.rc, 0);
    assert_int_equal(o.n, 0);
    free(o.data);
    o = run((atap_fs_req){.op = ATAP_FS_READ_AT, .path = at("six"), .offset = 1, .len = 3});
    assert_int_equal(o.rc, 0);
    assert_int_equal(o.n, 3);
    assert_memory_equal(o.data, "bcd", 3);
    free(o.data);
    /* Size 0 says nothing in /proc. */
    if (access("/proc/self/cmdline", R_OK) == 0) {
        whole = run((atap_fs_req){.op = ATAP_FS_READ, .path = "/proc/self/cmdline"});
        assert_int_equal(whole.rc, 0);
        assert_true(whole.n > 0);
        o = run(
            (atap_fs_req){.op = ATAP_FS_READ_AT, .path = "/proc/self/cmdline", .len = SIZE_MAX});
        assert_int_equal(o.rc, 0);
        assert_int_equal(o.n, whole.n);
        assert_memory_equal(o.data, whole.data, whole.n);
        free(o.data);
        free(whole.data);
    }
    /* 2 chunks, grown by 3 more while read: all 5 come back. */
    {
        atap_fs_out w = run(
            (atap_fs_req){.op = ATAP_FS_WRITE, .path = at("grows"), .data = p, .len = 2 * CHUNK});
        assert_int_equal(w.rc, 0);
    }
    g_grow_tail = p + 2 * CHUNK;
    g_grow_fd = open(at("grows"), O_WRONLY | O_APPEND | O_CLOEXEC);
    assert_true(g_grow_fd >= 0);
    atomic_store(&atap__fs_chunk_hook, grow_once);
    o = run((atap_fs_req){.op = ATAP_FS_READ_AT, .path = at("grows"), .len = SIZE_MAX});
    atomic_store(&atap__fs_chunk_hook, NULL);
    assert_int_equal(g_grow_fd, -1);
    assert_no_failures();
    assert_int_equal(o.rc, 0);
    assert_int_equal(o.n, 5 * CHUNK);
    assert_memory_equal(o.data, p, 5 * CHUNK);
    free(o.data);
    /* Bounded by len all the same. */
    o = run((atap_fs_req){
        .op = ATAP_FS_READ_AT, .path = at("grows"), .offset = 10, .len = 2 * CHUNK + 7});
    assert_int_equal(o.rc, 0);
    assert_int_equal(o.n, 2 * CHUNK + 7);
    assert_memory_equal(o.data, p + 10, 2 * CHUNK + 7);
    free(o.data);
    free(p);
}

static void test_fs_large_read_write_in_chunks(void **state)
{
    (void)state;
    size_t n = 5 * CHUNK + 123;
    unsigned char *p = pattern(n);
    atap_fs_out o;

    o = run((atap_fs_req){.op = ATAP_FS_WRITE, .path = at("big"), .data = p, .len = n});
    assert_int_equal(o.rc, 0);
    assert_int_equal(o.n, n);
    o = run((atap_fs_req){.op = ATAP_FS_READ, .path = at("big")});
    assert_int_equal(o.rc, 0);
    assert_int_equal(o.n, n);
    assert_memory_equal(o.data, p, n);
    free(o.data);
    /* A file whose size says 0 (procfs) is read to its end all the same. */
    if (access("/proc/self/status", R_OK) == 0) {
        o = run((atap_fs_req){.op = ATAP_FS_READ, .path = "/proc/self/status"});
        assert_int_equal(o.rc, 0);
        assert_true(o.n > 0);
        assert_int_equal(strlen(o.data), o.n);
        assert_non_null(strstr(o.data, "Pid:"));
        free(o.data);
    }
    o = run((atap_fs_req){
        .op = ATAP_FS_READ_AT, .path = at("big"), .offset = CHUNK - 10, .len = 2 * CHUNK});
    assert_int_equal(o.rc, 0);
    assert_int_equal(o.n, 2 * CHUNK);
    assert_memory_equal(o.data, p + CHUNK - 10, 2 * CHUNK);
    free(o.data);
    free(p);
}

/* A join lends the buffer and the last release frees it (ASan would see a
 * leak or a double free); a take moves it to the taker. */
static void test_fs_read_buffer_ownership(void **state)
{
    (void)state;
    atap_fs_out o1, o2;
    atap_task t, u;

    put(at("f"), "shared");
    assert_int_equal(atap_fs_spawn(&t, &(atap_fs_req){.op = ATAP_FS_READ, .path = at("f")}, NULL),
                     0);
    assert_int_equal(atap_dup(t, &u), 0);
    assert_int_equal(atap_join(t, &o1, sizeof o1), 0);
    assert_int_equal(atap_join(u, &o2, sizeof o2), 0);
    assert_int_equal(o1.rc, 0);
    assert_ptr_equal(o1.data, o2.data); /* the same lent buffer */
    assert_string_equal(o1.data, "shared");
    atap_release(t);
    assert_string_equal(o2.data, "shared"); /* u still holds it */
    atap_release(u);                        /* freed here, by out_free */

    /* Never read at all: freed at the release too. */
    assert_int_equal(atap_fs_spawn(&t, &(atap_fs_req){.op = ATAP_FS_READ, .path = at("f")}, NULL),
                     0);
    assert_int_equal(atap_wait(t, NULL), 0);
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(10)));

    /* The data to write is copied at the spawn: the caller's may go at once. */
    char *text = strdup("copied at spawn");
    assert_int_equal(
        atap_fs_spawn(
            &t,
            &(atap_fs_req){.op = ATAP_FS_WRITE, .path = at("w"), .data = text, .len = strlen(text)},
            NULL),
        0);
    memset(text, 'X', strlen(text));
    free(text);
    assert_int_equal(atap_take(t, &o1, sizeof o1), 0);
    atap_release(t);
    assert_int_equal(o1.rc, 0);
    assert_contents(at("w"), "copied at spawn");

    /* ... or handed over with data_free, called once. */
    text = strdup("handed over");
    assert_int_equal(atap_fs_spawn(&t,
                                   &(atap_fs_req){.op = ATAP_FS_WRITE,
                                                  .path = at("w"),
                                                  .data = text,
                                                  .len = strlen(text),
                                                  .data_free = free},
                                   NULL),
                     0);
    assert_int_equal(atap_take(t, &o1, sizeof o1), 0);
    atap_release(t);
    assert_int_equal(o1.rc, 0);
    assert_contents(at("w"), "handed over");
}

static void test_fs_block_on_calling_thread(void **state)
{
    (void)state;
    atap_fs_out o;
    char buf[4];

    assert_int_equal(
        atap_block(atap_fs_run,
                   &(atap_fs_req){.op = ATAP_FS_WRITE, .path = at("b"), .data = "blk", .len = 3},
                   &o, sizeof o),
        0);
    assert_int_equal(o.rc, 0);
    assert_int_equal(
        atap_block(atap_fs_run, &(atap_fs_req){.op = ATAP_FS_READ, .path = at("b")}, &o, sizeof o),
        0);
    assert_int_equal(o.rc, 0);
    assert_string_equal(o.data, "blk");
    free(o.data); /* the caller's */
    assert_int_equal(
        atap_block(
            atap_fs_run,
            &(atap_fs_req){.op = ATAP_FS_READ_AT, .path = at("b"), .buf = buf, .len = sizeof buf},
            &o, sizeof o),
        0);
    assert_int_equal(o.n, 3);
    assert_memory_equal(buf, "blk", 3);
    assert_int_equal(
        atap_block(atap_fs_run, &(atap_fs_req){.op = ATAP_FS_READ, .path = at("no")}, &o, sizeof o),
        0);
    assert_int_equal(o.rc, -ENOENT);
    assert_null(o.data);
}

/* ---- metadata, links, modes ------------------------------------------------ */

static void test_fs_metadata_links_modes(void **state)
{
    (void)state;
    atap_fs_meta m;
    atap_fs_out o;
    struct stat st;

    put(at("f"), "12345");
    m = meta(at("f"), true, 0);
    assert_int_equal(m.type, ATAP_FS_TYPE_FILE);
    assert_int_equal(m.size, 5);
    assert_int_equal(stat(at("f"), &st), 0);
    assert_int_equal(m.mode, st.st_mode & 07777);
    assert_true(m.mtime_ns / 1000000000 == (int64_t)st.st_mtime);
    assert_int_equal(meta(g_dir, true, 0).type, ATAP_FS_TYPE_DIR);

    assert_int_equal(rc_of((atap_fs_req){.op = ATAP_FS_SYMLINK, .path = "f", .path2 = at("s")}), 0);
    assert_int_equal(meta(at("s"), false, 0).type, ATAP_FS_TYPE_LINK);
    m = meta(at("s"), true, 0);
    assert_int_equal(m.type, ATAP_FS_TYPE_FILE);
    assert_int_equal(m.size, 5);
    o = run((atap_fs_req){.op = ATAP_FS_READ_LINK, .path = at("s")});
    assert_int_equal(o.rc, 0);
    assert_int_equal(o.n, 1);
    assert_string_equal(o.data, "f");
    free(o.data);
    /* A dangling link: lstat sees it, stat does not. */
    assert_int_equal(
        rc_of((atap_fs_req){.op = ATAP_FS_SYMLINK, .path = "nowhere", .path2 = at("d")}), 0);
    meta(at("d"), false, 0);
    meta(at("d"), true, -ENOENT);

    assert_int_equal(rc_of((atap_fs_req){.op = ATAP_FS_LINK, .path = at("f"), .path2 = at("h")}),
                     0);
    assert_contents(at("h"), "12345");
    assert_int_equal(stat(at("f"), &st), 0);
    assert_int_equal(st.st_nlink, 2);

    assert_int_equal(rc_of((atap_fs_req){.op = ATAP_FS_SET_MODE, .path = at("f"), .mode = 0640}),
                     0);
    assert_int_equal(meta(at("f"), true, 0).mode, 0640);
    assert_int_equal(rc_of((atap_fs_req){.op = ATAP_FS_SET_MODE, .path = at("f"), .mode = 010000}),
                     ATAP_EINVAL);
    assert_int_equal(rc_of((atap_fs_req){.op = ATAP_FS_SET_LEN, .path = at("f"), .offset = 3}), 0);
    assert_contents(at("f"), "123");
    assert_int_equal(rc_of((atap_fs_req){.op = ATAP_FS_SET_LEN, .path = at("f"), .offset = 1000}),
                     0);
    assert_int_equal(meta(at("f"), true, 0).size, 1000);
}

/* ---- directories ----------------------------------------------------------- */

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void test_fs_directories(void **state)
{
    (void)state;
    atap_fs_out o;
    char **names;

    assert_int_equal(rc_of((atap_fs_req){.op = ATAP_FS_CREATE_DIR, .path = at("d")}), 0);
    assert_int_equal(rc_of((atap_fs_req){.op = ATAP_FS_CREATE_DIR, .path = at("d")}), -EEXIST);
    assert_int_equal(rc_of((atap_fs_req){.op = ATAP_FS_CREATE_DIR, .path = at("x/y")}), -ENOENT);
    assert_int_equal(rc_of((atap_fs_req){.op = ATAP_FS_CREATE_DIR,
                                         .flags = ATAP_FS_PARENTS,
                                         .path = at("x//y/z/")}),
                     0);
    assert_int_equal(meta(at("x/y/z"), true, 0).type, ATAP_FS_TYPE_DIR);
    /* Already there: no error with parents. */
    assert_int_equal(
        rc_of((atap_fs_req){.op = ATAP_FS_CREATE_DIR, .flags = ATAP_FS_PARENTS, .path = at("x/y")}),
        0);
    put(at("file"), "f");
    assert_int_equal(rc_of((atap_fs_req){.op = ATAP_FS_CREATE_DIR,
                                         .flags = ATAP_FS_PARENTS,
                                         .path = at("file/sub")}),
                     -ENOTDIR);
    assert_int_equal(rc_of((atap_fs_req){
                         .op = ATAP_FS_CREATE_DIR, .flags = ATAP_FS_PARENTS, .path = at("file")}),
                     -EEXIST);

    put(at("d/b"), "1");
    put(at("d/a"), "2");
    put(at("d/c"), "3");
    o = run((atap_fs_req){.op = ATAP_FS_READ_DIR, .path = at("d")});
    assert_int_equal(o.rc, 0);
    assert_int_equal(o.n, 3);
    names = o.data;
    assert_null(names[3]);
    qsort(names, 3, sizeof *names, cmp_str);
    assert_string_equal(names[0], "a");
    assert_string_equal(names[1], "b");
    assert_string_equal(names[2], "c");
    free(o.data); /* one block */
    o = run((atap_fs_req){.op = ATAP_FS_READ_DIR, .path = at("x/y/z")});
    assert_int_equal(o.rc, 0);
    assert_int_equal(o.n, 0);
    assert_null(((char **)o.data)[0]);
    free(o.data);
    o = run((atap_fs_req){.op = ATAP_FS_READ_DIR, .path = at("file")});
    assert_int_equal(o.rc, -ENOTDIR);
    assert_null(o.data);

    /* Remove: a file, an empty directory; not a full one unless a tree. */
    assert_int_equal(rc_of((atap_fs_req){.op = ATAP_FS_REMOVE, .path = at("d")}), -ENOTEMPTY);
    assert_int_equal(rc_of((atap_fs_req){.op = ATAP_FS_REMOVE, .path = at("d/a")}), 0);
    assert_int_equal(rc_of((atap_fs_req){.op = ATAP_FS_REMOVE, .path = at("x/y/z")}), 0);
    meta(at("x/y/z"), true, -ENOENT);
    /* A tree, with a link out of it that must not be followed. */
    put(at("keep"), "kept");
    assert_int_equal(rc_of((atap_fs_req){.op = ATAP_FS_CREATE_DIR,
                                         .flags = ATAP_FS_PARENTS,
                                         .path = at("d/e/f/g")}),
                     0);
    put(at("d/e/f/g/h"), "deep");
    assert_int_equal(
        rc_of((atap_fs_req){.op = ATAP_FS_SYMLINK, .path = g_dir, .path2 = at("d/e/up")}), 0);
    assert_int_equal(
        rc_of((atap_fs_req){.op = ATAP_FS_REMOVE, .flags = ATAP_FS_TREE, .path = at("d")}), 0);
    meta(at("d"), false, -ENOENT);
    assert_contents(at("keep"), "kept");
    assert_int_equal(
        rc_of((atap_fs_req){.op = ATAP_FS_REMOVE, .flags = ATAP_FS_TREE, .path = at("d")}),
        -ENOENT);

    /* Rename. */
    assert_int_equal(
        rc_of((atap_fs_req){.op = ATAP_FS_RENAME, .path = at("keep"), .path2 = at("moved")}), 0);
    assert_contents(at("moved"), "kept");
    meta(at("keep"), true, -ENOENT);
    assert_int_equal(
        rc_of((atap_fs_req){.op = ATAP_FS_RENAME, .path = at("keep"), .path2 = at("m2")}), -ENOENT);
    assert_int_equal(
        rc_of((atap_fs_req){.op = ATAP_FS_RENAME, .path = at("x"), .path2 = at("moved")}),
        -ENOTDIR);
}

/* ---- errors ---------------------------------------------------------------- */

static void test_fs_errors(void **state)
{
    (void)state;
    atap_fs_out o;
    atap_task t;

    put(at("f"), "x");
    /* No request, and no output asked for: nothing to read or free. */
    assert_int_equal(atap_block(atap_fs_run, NULL, NULL, 0), 0);
    assert_int_equal(atap_block(atap_fs_run, NULL, &o, sizeof o), 0);
    assert_int_equal(o.rc, ATAP_EINVAL);
    assert_int_equal(run((atap_fs_req){.op = ATAP_FS_READ, .path = at("none")}).rc, -ENOENT);
    assert_int_equal(run((atap_fs_req){.op = ATAP_FS_READ, .path = g_dir}).rc, -EISDIR);
    assert_int_equal(run((atap_fs_req){.op = ATAP_FS_READ_AT, .path = g_dir, .len = 4}).rc,
                     -EISDIR);
    assert_int_equal(
        run((atap_fs_req){.op = ATAP_FS_WRITE, .path = g_dir, .data = "x", .len = 1}).rc, -EISDIR);
    assert_int_equal(
        run((atap_fs_req){.op = ATAP_FS_WRITE, .path = at("no/f"), .data = "x", .len = 1}).rc,
        -ENOENT);
    assert_int_equal(
        run((atap_fs_req){.op = ATAP_FS_WRITE_AT, .path = at("none"), .data = "x", .len = 1}).rc,
        -ENOENT); /* write_at does not create */
    assert_int_equal(run((atap_fs_req){.op = ATAP_FS_READ_DIR, .path = at("none")}).rc, -ENOENT);
    assert_int_equal(rc_of((atap_fs_req){.op = ATAP_FS_REMOVE, .path = at("none")}), -ENOENT);
    assert_int_equal(rc_of((atap_fs_req){.op = ATAP_FS_SET_MODE, .path = at("none"), .mode = 0600}),
                     -ENOENT);
    assert_int_equal(rc_of((atap_fs_req){.op = ATAP_FS_SET_LEN, .path = g_dir, .offset = 1}),
                     -EISDIR);
    assert_int_equal(rc_of((atap_fs_req){.op = ATAP_FS_LINK, .path = at("f"), .path2 = at("f")}),
                     -EEXIST);
    assert_int_equal(rc_of((atap_fs_req){.op = ATAP_FS_LINK, .path = at("none"), .path2 = at("l")}),
                     -ENOENT);
    assert_int_equal(rc_of((atap_fs_req){.op = ATAP_FS_SYMLINK, .path = "x", .path2 = at("f")}),
                     -EEXIST);
    assert_int_equal(run((atap_fs_req){.op = ATAP_FS_READ_LINK, .path = at("f")}).rc, -EINVAL);
    assert_int_equal(run((atap_fs_req){.op = ATAP_FS_READ_LINK, .path = at("none")}).rc, -ENOENT);
    assert_int_equal(run((atap_fs_req){.op = ATAP_FS_COPY, .path = g_dir, .path2 = at("c")}).rc,
                     -EISDIR);
    assert_int_equal(
        run((atap_fs_req){.op = ATAP_FS_COPY, .path = at("none"), .path2 = at("c")}).rc, -ENOENT);
    assert_int_equal(
        run((atap_fs_req){.op = ATAP_FS_COPY, .path = at("f"), .path2 = at("no/c")}).rc, -ENOENT);

    /* Requests and options refused at the spawn. */
    assert_int_equal(atap_fs_spawn(&t, &(atap_fs_req){.op = ATAP_FS_READ}, NULL), ATAP_EINVAL);
    assert_int_equal(atap_fs_spawn(&t, &(atap_fs_req){.op = 0, .path = "x"}, NULL), ATAP_EINVAL);
    assert_int_equal(atap_fs_spawn(&t, &(atap_fs_req){.op = 99, .path = "x"}, NULL), ATAP_EINVAL);
    assert_int_equal(atap_fs_spawn(&t, &(atap_fs_req){.op = ATAP_FS_RENAME, .path = "x"}, NULL),
                     ATAP_EINVAL);
    assert_int_equal(
        atap_fs_spawn(&t, &(atap_fs_req){.op = ATAP_FS_WRITE, .path = "x", .len = 3}, NULL),
        ATAP_EINVAL);
    assert_int_equal(atap_fs_spawn(NULL, &(atap_fs_req){.op = ATAP_FS_READ, .path = "x"}, NULL),
                     ATAP_EINVAL);
    assert_int_equal(atap_fs_spawn(&t, NULL, NULL), ATAP_EINVAL);
    assert_int_equal(atap_fs_spawn(&t, &(atap_fs_req){.op = ATAP_FS_READ, .path = "x"},
                                   &(atap_spawn_opts){.kind = ATAP_REPEAT, .every_ns = GAP}),
                     ATAP_EINVAL);
    assert_int_equal(atap_fs_spawn(&t, &(atap_fs_req){.op = ATAP_FS_READ, .path = "x"},
                                   &(atap_spawn_opts){.out_size = 4}),
                     ATAP_EINVAL);
    assert_int_equal(atap_fs_spawn(&t, &(atap_fs_req){.op = ATAP_FS_READ, .path = "x"},
                                   &(atap_spawn_opts){.out_free = free}),
                     ATAP_EINVAL);
    assert_true(t.id == ATAP_NO_TASK.id);
    assert_int_equal(atap_block(atap_fs_run, &(atap_fs_req){.op = 99, .path = "x"}, &o, sizeof o),
                     0);
    assert_int_equal(o.rc, ATAP_EINVAL);

    /* Permission denied: root passes every permission check. */
    if (geteuid() == 0) {
        print_message("running as root: the EACCES checks are skipped\n");
        return;
    }
    assert_int_equal(rc_of((atap_fs_req){.op = ATAP_FS_CREATE_DIR, .path = at("locked")}), 0);
    put(at("locked/f"), "secret");
    put(at("ro"), "ro");
    assert_int_equal(chmod(at("ro"), 0400), 0);
    assert_int_equal(chmod(at("locked"), 0), 0);
    assert_int_equal(run((atap_fs_req){.op = ATAP_FS_READ, .path = at("locked/f")}).rc, -EACCES);
    assert_int_equal(run((atap_fs_req){.op = ATAP_FS_READ_DIR, .path = at("locked")}).rc, -EACCES);
    assert_int_equal(rc_of((atap_fs_req){.op = ATAP_FS_CREATE_DIR,
                                         .flags = ATAP_FS_PARENTS,
                                         .path = at("locked/a/b")}),
                     -EACCES);
    assert_int_equal(
        run((atap_fs_req){.op = ATAP_FS_WRITE, .path = at("ro"), .data = "x", .len = 1}).rc,
        -EACCES);
    assert_int_equal(chmod(at("locked"), 0700), 0);
}

/* ---- copy ------------------------------------------------------------------ */

static void test_fs_copy(void **state)
{
    (void)state;
    size_t n = 3 * CHUNK + 17;
    unsigned char *p = pattern(n);
    atap_fs_out o;

    o = run(
        (atap_fs_req){.op = ATAP_FS_WRITE, .path = at("src"), .data = p, .len = n, .mode = 0640});
    assert_int_equal(o.rc, 0);
    assert_int_equal(chmod(at("src"), 0640), 0); /* whatever the umask */
    put(at("dst"), "to be replaced by a longer file");
    o = run((atap_fs_req){.op = ATAP_FS_COPY, .path = at("src"), .path2 = at("dst")});
    assert_int_equal(o.rc, 0);
    assert_int_equal(o.n, n);
    o = run((atap_fs_req){.op = ATAP_FS_READ, .path = at("dst")});
    assert_int_equal(o.rc, 0);
    assert_int_equal(o.n, n);
    assert_memory_equal(o.data, p, n);
    free(o.data);
    assert_int_equal(meta(at("dst"), true, 0).mode, 0640); /* src's, though dst was there */
    /* An empty file copies to an empty file. */
    put(at("empty"), "");
    o = run((atap_fs_req){.op = ATAP_FS_COPY, .path = at("empty"), .path2 = at("e2")});
    assert_int_equal(o.rc, 0);
    assert_int_equal(o.n, 0);
    assert_contents(at("e2"), "");
    free(p);
}

static atomic_uint_fast64_t g_hook_calls, g_hook_last, g_cancel_at, g_sleep_us;
static atomic_uint_fast64_t g_task_id, g_cancel_call;

/* Called after each chunk on the task's thread: counts, and cancels the
 * task once the chunk numbered g_cancel_at is done, or sleeps. */
static void chunk_hook(uint64_t done)
{
    uint64_t n = atomic_fetch_add(&g_hook_calls, 1) + 1;
    unsigned us = (unsigned)atomic_load(&g_sleep_us);

    atomic_store(&g_hook_last, done);
    if (n >= atomic_load(&g_cancel_at) && atomic_load(&g_cancel_call) == 0) {
        atomic_store(&g_cancel_call, n);
        CHECK(atap_cancel((atap_task){atomic_load(&g_task_id)}) == 0);
    }
    if (us)
        sleep_us(us);
}

static void hook_reset(uint64_t cancel_at, unsigned sleep_each_us)
{
    atomic_store(&g_hook_calls, 0);
    atomic_store(&g_hook_last, 0);
    atomic_store(&g_cancel_at, cancel_at);
    atomic_store(&g_sleep_us, sleep_each_us);
    atomic_store(&g_task_id, 0);
    atomic_store(&g_cancel_call, 0);
}

/* Lets t (spawned held back, its hook set) run until the hook cancels it
 * after chunk n: its take reads ATAP_ECANCELLED, and once released its
 * slot comes back (the run ended at its next look). */
static void cancelled_at_chunk(atap_task t, uint64_t n)
{
    atap_fs_out o;

    atomic_store(&g_task_id, t.id);
    atomic_store(&g_cancel_at, n);
    assert_int_equal(atap_take(t, &o, sizeof o), ATAP_ECANCELLED);
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(20)));
}

/* A large sparse source (256 MiB): what matters is that the copy has far
 * more chunks than it gets to. */
static void make_large(const char *path)
{
    put(path, "head");
    assert_int_equal(
        rc_of((atap_fs_req){.op = ATAP_FS_SET_LEN, .path = path, .offset = 256u * 1024u * 1024u}),
        0);
}

static void test_fs_copy_cancel_between_chunks(void **state)
{
    (void)state;
    atap_task t;
    struct stat st;

    make_large(at("large"));
    hook_reset(UINT64_MAX, 0);
    atomic_store(&atap__fs_chunk_hook, chunk_hook);
    /* Held back a little, so the hook knows the task before it runs (if
     * not, it cancels at the first chunk it sees past the fourth). */
    assert_int_equal(
        atap_fs_spawn(&t,
                      &(atap_fs_req){.op = ATAP_FS_COPY, .path = at("large"), .path2 = at("copy")},
                      &(atap_spawn_opts){.after_ns = ATAP_MS(20)}),
        0);
    cancelled_at_chunk(t, 4);
    /* The run ends at its next look, before a fifth chunk. */
    atomic_store(&atap__fs_chunk_hook, NULL);
    /* No chunk after the one that cancelled, and the copy holds exactly the
     * chunks done. */
    assert_true(atomic_load(&g_cancel_call) >= 4);
    assert_no_failures();
    assert_int_equal(atomic_load(&g_hook_calls), atomic_load(&g_cancel_call));
    assert_int_equal(stat(at("copy"), &st), 0);
    assert_int_equal((uint64_t)st.st_size, atomic_load(&g_hook_last));
    assert_true(st.st_size > 0 && (uint64_t)st.st_size < 256u * 1024u * 1024u);
}

/* From another file system (tmpfs under /dev/shm to the test directory):
 * copy_file_range may refuse (EXDEV), and the copy goes through user space;
 * the bytes, and a cancel between chunks, are the same either way. */
static void test_fs_copy_across_file_systems(void **state)
{
    (void)state;
    char other[64], src[96];
    size_t n = 6 * CHUNK + 5;
    unsigned char *p;
    atap_fs_out o;
    atap_task t;
    struct stat a, b;

    snprintf(other, sizeof other, "/dev/shm/atap_fs_XXXXXX");
    if (!mkdtemp(other)) {
        print_message("no /dev/shm to copy from: skipped\n");
        return;
    }
    snprintf(src, sizeof src, "%s/src", other);
    p = pattern(n);
    o = run((atap_fs_req){.op = ATAP_FS_WRITE, .path = src, .data = p, .len = n});
    assert_int_equal(o.rc, 0);
    assert_int_equal(stat(src, &a), 0);
    assert_int_equal(stat(g_dir, &b), 0);
    if (a.st_dev == b.st_dev)
        print_message("/dev/shm is on the test directory's file system\n");
    o = run((atap_fs_req){.op = ATAP_FS_COPY, .path = src, .path2 = at("dst")});
    assert_int_equal(o.rc, 0);
    assert_int_equal(o.n, n);
    o = run((atap_fs_req){.op = ATAP_FS_READ, .path = at("dst")});
    assert_int_equal(o.rc, 0);
    assert_int_equal(o.n, n);
    assert_memory_equal(o.data, p, n);
    free(o.data);

    hook_reset(UINT64_MAX, 0);
    atomic_store(&atap__fs_chunk_hook, chunk_hook);
    assert_int_equal(
        atap_fs_spawn(&t, &(atap_fs_req){.op = ATAP_FS_COPY, .path = src, .path2 = at("cut")},
                      &(atap_spawn_opts){.after_ns = ATAP_MS(20)}),
        0);
    cancelled_at_chunk(t, 2);
    atomic_store(&atap__fs_chunk_hook, NULL);
    assert_no_failures();
    assert_int_equal(atomic_load(&g_hook_calls), atomic_load(&g_cancel_call));
    assert_int_equal(stat(at("cut"), &a), 0);
    assert_int_equal((uint64_t)a.st_size, atomic_load(&g_hook_last));
    assert_true((uint64_t)a.st_size < n);
    assert_int_equal(unlink(src), 0);
    assert_int_equal(rmdir(other), 0);
    free(p);
}

static void test_fs_copy_and_read_timeout(void **state)
{
    (void)state;
    uint64_t t0, full = 256u * 1024u * 1024u;
    atap_fs_out o;
    atap_task t;
    struct stat st;

    make_large(at("large"));
    hook_reset(UINT64_MAX, 20000); /* 20 ms a chunk */
    atomic_store(&atap__fs_chunk_hook, chunk_hook);
    t0 = now_ns();
    assert_int_equal(
        atap_fs_spawn(&t,
                      &(atap_fs_req){.op = ATAP_FS_COPY, .path = at("large"), .path2 = at("copy")},
                      &(atap_spawn_opts){.timeout_ns = ATAP_MS(100)}),
        0);
    assert_int_equal(atap_take(t, &o, sizeof o), ATAP_ETIMEDOUT);
    assert_true(now_ns() - t0 < ATAP_SEC(10));
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(20)));
    assert_int_equal(stat(at("copy"), &st), 0);
    assert_true((uint64_t)st.st_size < full);
    assert_int_equal((uint64_t)st.st_size, atomic_load(&g_hook_last));

    /* A whole-file read stops the same way, its buffer freed (ASan). */
    put(at("mid"), "head");
    assert_int_equal(
        rc_of((atap_fs_req){.op = ATAP_FS_SET_LEN, .path = at("mid"), .offset = 64 * CHUNK}), 0);
    hook_reset(UINT64_MAX, 20000);
    assert_int_equal(atap_fs_spawn(&t, &(atap_fs_req){.op = ATAP_FS_READ, .path = at("mid")},
                                   &(atap_spawn_opts){.timeout_ns = ATAP_MS(100)}),
                     0);
    assert_int_equal(atap_take(t, &o, sizeof o), ATAP_ETIMEDOUT);
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(20)));
    assert_true(atomic_load(&g_hook_calls) < 64);

    /* A cancel before the run: nothing is done. */
    atomic_store(&atap__fs_chunk_hook, NULL);
    assert_int_equal(
        atap_fs_spawn(
            &t, &(atap_fs_req){.op = ATAP_FS_WRITE, .path = at("never"), .data = "x", .len = 1},
            &(atap_spawn_opts){.after_ns = ATAP_SEC(1)}),
        0);
    assert_int_equal(atap_cancel(t), 0);
    assert_int_equal(atap_take(t, &o, sizeof o), ATAP_ECANCELLED);
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(10)));
    assert_int_equal(stat(at("never"), &st), -1);
}

/* A tree removal and a read_dir stop between entries. */
static void test_fs_tree_cancel_between_entries(void **state)
{
    (void)state;
    atap_fs_out o;
    atap_task t;
    char name[32];
    size_t left, removed;

    assert_int_equal(rc_of((atap_fs_req){.op = ATAP_FS_CREATE_DIR, .path = at("t")}), 0);
    for (int i = 0; i < 50; i++) {
        snprintf(name, sizeof name, "t/f%02d", i);
        put(at(name), "x");
    }
    hook_reset(UINT64_MAX, 0);
    atomic_store(&atap__fs_chunk_hook, chunk_hook);
    assert_int_equal(
        atap_fs_spawn(&t,
                      &(atap_fs_req){.op = ATAP_FS_REMOVE, .flags = ATAP_FS_TREE, .path = at("t")},
                      &(atap_spawn_opts){.after_ns = ATAP_MS(20)}),
        0);
    cancelled_at_chunk(t, 10);
    assert_no_failures();
    assert_int_equal(atomic_load(&g_hook_calls), atomic_load(&g_cancel_call));
    /* Exactly the entries the hook saw removed are gone. */
    removed = atomic_load(&g_hook_calls);
    atomic_store(&atap__fs_chunk_hook, NULL);
    o = run((atap_fs_req){.op = ATAP_FS_READ_DIR, .path = at("t")});
    assert_int_equal(o.rc, 0);
    left = o.n;
    free(o.data);
    assert_int_equal(left, 50 - removed);
    assert_true(left > 0);

    hook_reset(UINT64_MAX, 0);
    atomic_store(&atap__fs_chunk_hook, chunk_hook);
    assert_int_equal(atap_fs_spawn(&t, &(atap_fs_req){.op = ATAP_FS_READ_DIR, .path = at("t")},
                                   &(atap_spawn_opts){.after_ns = ATAP_MS(20)}),
                     0);
    cancelled_at_chunk(t, 3);
    atomic_store(&atap__fs_chunk_hook, NULL);
    assert_no_failures();
    assert_int_equal(atomic_load(&g_hook_calls), atomic_load(&g_cancel_call));
}

/* ---- watches --------------------------------------------------------------- */

/* Takes the watch's next report; 0 and *bits, or the take's error. */
static int next_report(atap_task t, unsigned *bits)
{
    uint64_t end = now_ns() + ATAP_SEC(10);
    int rc;

    do {
        rc = atap_take_for(t, bits, sizeof *bits, ATAP_SEC(10));
        if (rc == ATAP_ETAKEN) /* between runs: the next one has not started */
            sleep_ms(1);
    } while (rc == ATAP_ETAKEN && now_ns() < end);
    return rc;
}

/* As next_report, waiting ns at most. */
static int report_within(atap_task t, unsigned *bits, uint64_t ns)
{
    uint64_t end = now_ns() + ns;
    int rc;

    do {
        rc = atap_take_for(t, bits, sizeof *bits, ns);
        if (rc == ATAP_ETAKEN)
            sleep_ms(1);
    } while (rc == ATAP_ETAKEN && now_ns() < end);
    return rc;
}

/* True if no report came for ns. */
static bool no_report_for(atap_task t, uint64_t ns)
{
    uint64_t end = now_ns() + ns;
    unsigned bits;
    int rc;

    while (now_ns() < end) {
        rc = atap_take_for(t, &bits, sizeof bits, ATAP_MS(50));
        if (rc != ATAP_ETAKEN && rc != ATAP_ENOTREADY)
            return false;
        if (rc == ATAP_ETAKEN)
            sleep_ms(1);
    }
    return true;
}

static void wait_waiting(atap_task t)
{
    uint64_t end = now_ns() + ATAP_SEC(10);

    while (atap_state_of(t) != ATAP_WAITING && now_ns() < end)
        sleep_ms(1);
    assert_int_equal(atap_state_of(t), ATAP_WAITING);
}

static void append_to(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    assert_int_equal(close(fd), 0);
}

/* Reads reports until one has `want`; each must have no bit outside
 * `allowed`. Returns the union seen. */
static unsigned reports_until(atap_task t, unsigned want, unsigned allowed)
{
    unsigned seen = 0, bits;

    while (!(seen & want)) {
        assert_int_equal(next_report(t, &bits), 0);
        assert_int_not_equal(bits, 0);
        assert_int_equal(bits & ~allowed, 0);
        seen |= bits;
    }
    return seen;
}

static void test_fs_watch_file_write_attrib_gone_last(void **state)
{
    (void)state;
    unsigned bits;
    atap_task t;

    put(at("w"), "start");
    assert_int_equal(atap_fs_spawn_watch(&t, at("w"), -1, 0,
                                         &(atap_spawn_opts){.kind = ATAP_REPEAT, .every_ns = GAP}),
                     0);
    wait_waiting(t);
    append_to(at("w"), "+1");
    reports_until(t, ATAP_PATH_WRITE, ATAP_PATH_WRITE | ATAP_PATH_ATTRIB);
    assert_int_equal(chmod(at("w"), 0600), 0);
    reports_until(t, ATAP_PATH_ATTRIB, ATAP_PATH_WRITE | ATAP_PATH_ATTRIB);
    assert_int_equal(unlink(at("w")), 0);
    reports_until(t, ATAP_PATH_GONE, ATAP_PATH_WRITE | ATAP_PATH_ATTRIB | ATAP_PATH_GONE);
    /* Removal was the last report. */
    assert_int_equal(next_report(t, &bits), ATAP_EFINISHED);
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(10)));
}

static void test_fs_watch_dir_create_write_remove(void **state)
{
    (void)state;
    const unsigned all = ATAP_PATH_WRITE | ATAP_PATH_ATTRIB | ATAP_PATH_ENTRIES | ATAP_PATH_GONE;
    unsigned bits, seen;
    atap_task t;

    assert_int_equal(rc_of((atap_fs_req){.op = ATAP_FS_CREATE_DIR, .path = at("d")}), 0);
    assert_int_equal(atap_fs_spawn_watch(&t, at("d"), -1, 0,
                                         &(atap_spawn_opts){.kind = ATAP_REPEAT, .every_ns = GAP}),
                     0);
    wait_waiting(t);
    put(at("d/new"), "");
    seen = reports_until(t, ATAP_PATH_ENTRIES, all & ~ATAP_PATH_GONE);
    append_to(at("d/new"), "x"); /* the directory's entries do not change */
    assert_int_equal(
        rc_of((atap_fs_req){.op = ATAP_FS_REMOVE, .flags = ATAP_FS_TREE, .path = at("d")}), 0);
    seen |= reports_until(t, ATAP_PATH_GONE, all);
    assert_true(seen & ATAP_PATH_ENTRIES);
    assert_int_equal(next_report(t, &bits), ATAP_EFINISHED);
    atap_release(t);

    /* A watch of a directory reports a file made in it, once. */
    assert_int_equal(rc_of((atap_fs_req){.op = ATAP_FS_CREATE_DIR, .path = at("e")}), 0);
    assert_int_equal(atap_fs_spawn_watch(&t, at("e"), -1, ATAP_PATH_ENTRIES, NULL), 0);
    wait_waiting(t);
    put(at("e/a"), "");
    assert_int_equal(atap_take_for(t, &bits, sizeof bits, ATAP_SEC(10)), 0);
    assert_int_equal(bits, ATAP_PATH_ENTRIES);
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(10)));
}

/* Changes made while no run of the repeat is parked (in its gap, and before
 * its first run) are reported by the next run. */
/* A directory watch holds its kernel watch for its whole life: a file in
 * it rewritten again and again, each rewrite waited for, is reported each
 * time, wherever the rewrite lands: between the runs of a repeat (phase
 * 0: at once after a report is taken), or while a run is parked, at every
 * point of its 50 ms look (phase 1: after the gap). A rewrite is one
 * pwrite through an fd kept open: one event, so one report. */
static void test_fs_watch_dir_loses_no_rewrite(void **state)
{
    (void)state;
    unsigned bits;
    int fd;

    assert_int_equal(rc_of((atap_fs_req){.op = ATAP_FS_CREATE_DIR, .path = at("rw")}), 0);
    put(at("rw/f"), "0");
    fd = open(at("rw/f"), O_WRONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    for (int phase = 0; phase < 2; phase++) {
        atap_task t;
        int lost = 0;

        assert_int_equal(
            atap_fs_spawn_watch(&t, at("rw"), -1, ATAP_PATH_WRITE,
                                &(atap_spawn_opts){.kind = ATAP_REPEAT, .every_ns = GAP}),
            0);
        wait_waiting(t);
        for (int i = 0; i < 20; i++) {
            char c = (char)('a' + i);
            if (phase == 1) /* the next run parked, at every point of its look */
                sleep_ms((unsigned)(GAP / ATAP_MS(1)) + (unsigned)(i * 7) % 60);
            assert_int_equal(pwrite(fd, &c, 1, 0), 1);
            if (report_within(t, &bits, ATAP_SEC(3)) != 0) {
                if (++lost == 3)
                    break; /* enough to tell */
                continue;
            }
            assert_int_equal(bits, ATAP_PATH_WRITE);
        }
        assert_int_equal(atap_cancel(t), 0);
        atap_release(t);
        if (lost)
            print_error("phase %d: %d rewrites not reported\n", phase, lost);
        assert_int_equal(lost, 0);
    }
    close(fd);
    assert_true(wait_live_back(ATAP_SEC(10)));
}

/* Takes the next full report of a watch spawned for them. */
static int next_named(atap_task t, atap_fs_watch_report *r)
{
    uint64_t end = now_ns() + ATAP_SEC(10);
    int rc;

    do {
        rc = atap_take_for(t, r, sizeof *r, ATAP_SEC(10));
        if (rc == ATAP_ETAKEN)
            sleep_ms(1);
    } while (rc == ATAP_ETAKEN && now_ns() < end);
    return rc;
}

/* The names in r: each once, `count` of them, zeros after; seen[i] set
 * for each of want[0..n) named. */
static void check_names(const atap_fs_watch_report *r, const char *const *want, size_t n,
                        bool *seen)
{
    size_t at = 0;

    for (unsigned k = 0; k < r->count; k++) {
        const char *name = r->names + at;
        size_t len = strnlen(name, sizeof r->names - at);
        assert_true(len > 0 && at + len < sizeof r->names);
        for (size_t j = at + len + 1; j < sizeof r->names && r->names[j];
             j += strlen(r->names + j) + 1)
            assert_string_not_equal(r->names + j, name); /* once */
        for (size_t i = 0; i < n; i++)
            if (strcmp(want[i], name) == 0)
                seen[i] = true;
        at += len + 1;
    }
    for (; at < sizeof r->names; at++)
        assert_int_equal(r->names[at], 0);
}

/* Each report of a directory watch names the entries that changed; past
 * the room for names it says `more`. */
static void test_fs_watch_names_entries(void **state)
{
    (void)state;
    static const char *const abc[3] = {"a", "b", "c"};
    atap_fs_watch_report r;
    bool seen[3] = {false, false, false};
    atap_task t;
    unsigned changes = 0;

    assert_int_equal(rc_of((atap_fs_req){.op = ATAP_FS_CREATE_DIR, .path = at("nm")}), 0);
    assert_int_equal(
        atap_fs_spawn_watch(
            &t, at("nm"), -1, 0,
            &(atap_spawn_opts){.kind = ATAP_REPEAT, .every_ns = GAP, .out_size = sizeof r}),
        0);
    wait_waiting(t);
    put(at("nm/a"), "1");
    put(at("nm/b"), "2");
    put(at("nm/c"), "3");
    append_to(at("nm/a"), "more");
    while (!(seen[0] && seen[1] && seen[2])) {
        assert_int_equal(next_named(t, &r), 0);
        assert_false(r.more);
        assert_int_equal(r.changes & ~(ATAP_PATH_ENTRIES | ATAP_PATH_WRITE | ATAP_PATH_ATTRIB), 0);
        changes |= r.changes;
        check_names(&r, abc, 3, seen);
    }
    assert_true(changes & ATAP_PATH_ENTRIES);
    assert_int_equal(atap_cancel(t), 0);
    atap_release(t);

    /* A file watch names nothing. */
    assert_int_equal(
        atap_fs_spawn_watch(&t, at("nm/a"), -1, 0, &(atap_spawn_opts){.out_size = sizeof r}), 0);
    wait_waiting(t);
    append_to(at("nm/a"), "x");
    assert_int_equal(atap_take_for(t, &r, sizeof r, ATAP_SEC(10)), 0);
    assert_true(r.changes & ATAP_PATH_WRITE);
    assert_int_equal(r.count, 0);
    assert_false(r.more);
    atap_release(t);

    /* 60 names of 30 bytes do not fit in one report: made before the
     * watch's first run (it watches from its spawn on), they come at once. */
    assert_int_equal(rc_of((atap_fs_req){.op = ATAP_FS_CREATE_DIR, .path = at("many")}), 0);
    assert_int_equal(
        atap_fs_spawn_watch(&t, at("many"), -1, ATAP_PATH_ENTRIES,
                            &(atap_spawn_opts){.after_ns = ATAP_MS(500), .out_size = sizeof r}),
        0);
    for (int i = 0; i < 60; i++) {
        char name[64];
        snprintf(name, sizeof name, "many/entry-with-a-long-name-%02d", i);
        put(at(name), "");
    }
    bool before = atap_state_of(t) == ATAP_PENDING;
    assert_int_equal(atap_take_for(t, &r, sizeof r, ATAP_SEC(10)), 0);
    assert_int_equal(r.changes, ATAP_PATH_ENTRIES);
    check_names(&r, NULL, 0, NULL);
    if (before) { /* all 60 were queued when it first looked */
        assert_true(r.more);
        assert_true(r.count > 0 && r.count < 60);
    }
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(10)));
}

static void test_fs_watch_repeat_keeps_changes_between_runs(void **state)
{
    (void)state;
    unsigned bits;
    atap_task t;

    put(at("w"), "start");
    assert_int_equal(atap_fs_spawn_watch(&t, at("w"), -1, ATAP_PATH_WRITE | ATAP_PATH_ATTRIB,
                                         &(atap_spawn_opts){.kind = ATAP_REPEAT,
                                                            .every_ns = ATAP_MS(400),
                                                            .after_ns = ATAP_MS(400)}),
                     0);
    /* Before the first run. */
    assert_int_equal(chmod(at("w"), 0600), 0);
    assert_int_equal(next_report(t, &bits), 0);
    assert_true(bits & ATAP_PATH_ATTRIB);
    for (int i = 0; i < 3; i++) {
        bool in_gap;
        /* Now in the 400 ms gap; the next run has not started. */
        append_to(at("w"), "more");
        in_gap = atap_state_of(t) == ATAP_TAKEN;
        assert_int_equal(next_report(t, &bits), 0);
        assert_true(bits & ATAP_PATH_WRITE);
        if (!in_gap)
            print_message("the machine is slow: change %d landed after the gap\n", i);
    }
    /* Nothing changes: a run parks and reports nothing. */
    assert_true(no_report_for(t, ATAP_MS(600)));
    atap_cancel(t);
    assert_int_equal(atap_take(t, &bits, sizeof bits), ATAP_ECANCELLED);
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(10)));
}

static void test_fs_watch_fd_errors_timeout_cancel(void **state)
{
    (void)state;
    unsigned bits;
    atap_task t;
    int fd;

    assert_int_equal(atap_fs_spawn_watch(&t, at("none"), -1, 0, NULL), -ENOENT);
    assert_true(t.id == ATAP_NO_TASK.id);
    assert_int_equal(atap_fs_spawn_watch(&t, NULL, -1, 0, NULL), ATAP_EINVAL);
    assert_int_equal(atap_fs_spawn_watch(&t, g_dir, -1, 0x100, NULL), ATAP_EINVAL);
    assert_int_equal(atap_fs_spawn_watch(&t, g_dir, -1, 0, &(atap_spawn_opts){.blocking = true}),
                     ATAP_EINVAL);
    assert_int_equal(atap_fs_spawn_watch(&t, g_dir, -1, 0,
                                         &(atap_spawn_opts){.kind = ATAP_AT_RATE, .every_ns = 1}),
                     ATAP_EINVAL);
    assert_int_equal(atap_fs_spawn_watch(&t, g_dir, -1, 0, &(atap_spawn_opts){.out_size = 8}),
                     ATAP_EINVAL);
    assert_int_equal(atap_fs_spawn_watch(NULL, g_dir, -1, 0, NULL), ATAP_EINVAL);
    assert_int_equal(atap_fs_spawn_watch(&t, NULL, 1000000, 0, NULL), -EBADF);

    /* By fd: the task holds its own descriptor. */
    put(at("f"), "x");
    fd = open(at("f"), O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(atap_fs_spawn_watch(&t, NULL, fd, ATAP_PATH_WRITE, NULL), 0);
    close(fd);
    wait_waiting(t);
    append_to(at("f"), "y");
    assert_int_equal(atap_take_for(t, &bits, sizeof bits, ATAP_SEC(10)), 0);
    assert_int_equal(bits, ATAP_PATH_WRITE);
    atap_release(t);

    /* Nothing comes: a run timeout ends it; a cancel takes it down. */
    assert_int_equal(
        atap_fs_spawn_watch(&t, at("f"), -1, 0, &(atap_spawn_opts){.timeout_ns = ATAP_MS(100)}), 0);
    assert_int_equal(atap_take_for(t, &bits, sizeof bits, ATAP_SEC(10)), ATAP_ETIMEDOUT);
    atap_release(t);
    assert_int_equal(atap_fs_spawn_watch(&t, at("f"), -1, 0, NULL), 0);
    wait_waiting(t);
    assert_int_equal(atap_cancel(t), 0);
    assert_int_equal(atap_take(t, &bits, sizeof bits), ATAP_ECANCELLED);
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(10)));
}

/* ---- open files ------------------------------------------------------------- */

/* A request on an open file: fd and open_flags are fields added after 0.1,
 * read only from a request of the full size. */
#define FREQ(...) ((atap_fs_req){.size = sizeof(atap_fs_req), __VA_ARGS__})

/* The operation run with atap_block, on this thread. */
static atap_fs_out blk(atap_fs_req q)
{
    atap_fs_out o;

    memset(&o, 0xa5, sizeof o);
    assert_int_equal(atap_block(atap_fs_run, &q, &o, sizeof o), 0);
    return o;
}

/* Opens path with atap_block or spawned: the fd. */
static int open_file(const char *path, int flags, bool spawned)
{
    atap_fs_req q = FREQ(.op = ATAP_FS_OPEN, .path = path, .open_flags = flags, .mode = 0600);
    atap_fs_out o = spawned ? run(q) : blk(q);

    assert_int_equal(o.rc, 0);
    assert_null(o.data);
    assert_true(o.n > 2 && o.n < 1u << 20);
    assert_true(fcntl((int)o.n, F_GETFD) & FD_CLOEXEC);
    return (int)o.n;
}

static void close_file(int fd, bool spawned)
{
    atap_fs_req q = FREQ(.op = ATAP_FS_CLOSE, .flags = ATAP_FS_FD, .fd = fd);

    assert_int_equal(spawned ? rc_of(q) : blk(q).rc, 0);
}

/* The fds the process has open (each a name in /proc/self/fd). */
static int count_fds(void)
{
    atap_fs_out o = blk((atap_fs_req){.op = ATAP_FS_READ_DIR, .path = "/proc/self/fd"});
    int n = (int)o.n;

    assert_int_equal(o.rc, 0);
    free(o.data);
    return n;
}

/* Reads and writes at an offset through an open fd, spawned and on the
 * calling thread: short at the end of the file, nothing past it, a hole
 * before a write past it; and no fd left behind. */
static void test_fs_file_read_write_at_offset(void **state)
{
    (void)state;
    int fds = count_fds();

    for (int spawned = 0; spawned < 2; spawned++) {
        int fd = open_file(at("f"), O_RDWR | O_CREAT | O_TRUNC, spawned);
        atap_fs_out (*op)(atap_fs_req) = spawned ? run : blk;
        char buf[16];
        atap_fs_out o;
        struct stat st;

        o = op(FREQ(.op = ATAP_FS_WRITE_AT, .flags = ATAP_FS_FD, .fd = fd, .data = "hello world",
                    .len = 11));
        assert_int_equal(o.rc, 0);
        assert_int_equal(o.n, 11);
        o = op(FREQ(.op = ATAP_FS_WRITE_AT, .flags = ATAP_FS_FD, .fd = fd, .data = "W", .len = 1,
                    .offset = 6));
        assert_int_equal(o.rc, 0);
        assert_contents(at("f"), "hello World");
        /* A malloc'd read, then one into buf; pread leaves the position. */
        o = op(FREQ(.op = ATAP_FS_READ_AT, .flags = ATAP_FS_FD, .fd = fd, .offset = 6, .len = 5));
        assert_int_equal(o.rc, 0);
        assert_int_equal(o.n, 5);
        assert_memory_equal(o.data, "World", 5);
        free(o.data);
        memset(buf, 0, sizeof buf);
        o = op(FREQ(.op = ATAP_FS_READ_AT, .flags = ATAP_FS_FD, .fd = fd, .offset = 8, .buf = buf,
                    .len = sizeof buf));
        assert_int_equal(o.rc, 0);
        assert_int_equal(o.n, 3); /* short: the end of the file */
        assert_ptr_equal(o.data, buf);
        assert_memory_equal(buf, "rld", 3);
        o = op(FREQ(.op = ATAP_FS_READ_AT, .flags = ATAP_FS_FD, .fd = fd, .offset = 11, .buf = buf,
                    .len = sizeof buf));
        assert_int_equal(o.rc, 0);
        assert_int_equal(o.n, 0); /* at the end */
        o = op(FREQ(.op = ATAP_FS_READ_AT, .flags = ATAP_FS_FD, .fd = fd, .offset = 1000,
                    .len = SIZE_MAX));
        assert_int_equal(o.rc, 0);
        assert_int_equal(o.n, 0); /* past it */
        free(o.data);
        assert_int_equal(lseek(fd, 0, SEEK_CUR), 0);
        /* A write past the end leaves a hole of zeros. */
        o = op(FREQ(.op = ATAP_FS_WRITE_AT, .flags = ATAP_FS_FD, .fd = fd, .data = "!", .len = 1,
                    .offset = 20));
        assert_int_equal(o.rc, 0);
        assert_int_equal(fstat(fd, &st), 0);
        assert_int_equal(st.st_size, 21);
        o = op(
            FREQ(.op = ATAP_FS_READ_AT, .flags = ATAP_FS_FD, .fd = fd, .offset = 10, .len = 100));
        assert_int_equal(o.rc, 0);
        assert_int_equal(o.n, 11);
        assert_memory_equal(o.data, "d\0\0\0\0\0\0\0\0\0!", 11);
        free(o.data);
        close_file(fd, spawned);
    }
    assert_true(wait_live_back(ATAP_SEC(10)));
    assert_int_equal(count_fds(), fds);
}

/* At the fd's position: reads and writes move it on, as read(2) and
 * write(2); a whole read takes the rest; an O_APPEND fd appends; a pipe
 * reads at its position and refuses an offset. */
static void test_fs_file_read_write_at_position(void **state)
{
    (void)state;
    int fd = open_file(at("p"), O_RDWR | O_CREAT, true), pipe_fd[2];
    atap_fs_out o;

    for (int i = 0; i < 2; i++) {
        o = run(FREQ(.op = ATAP_FS_WRITE_AT, .flags = ATAP_FS_FD | ATAP_FS_AT_POSITION, .fd = fd,
                     .data = i ? "def" : "abc", .len = 3, .offset = 99));
        assert_int_equal(o.rc, 0);
        assert_int_equal(o.n, 3);
    }
    assert_int_equal(lseek(fd, 0, SEEK_CUR), 6); /* the task's dup shares it */
    assert_contents(at("p"), "abcdef");
    assert_int_equal(lseek(fd, 0, SEEK_SET), 0);
    o = run(
        FREQ(.op = ATAP_FS_READ_AT, .flags = ATAP_FS_FD | ATAP_FS_AT_POSITION, .fd = fd, .len = 4));
    assert_int_equal(o.rc, 0);
    assert_int_equal(o.n, 4);
    assert_memory_equal(o.data, "abcd", 4);
    free(o.data);
    o = blk(
        FREQ(.op = ATAP_FS_READ_AT, .flags = ATAP_FS_FD | ATAP_FS_AT_POSITION, .fd = fd, .len = 4));
    assert_int_equal(o.rc, 0);
    assert_int_equal(o.n, 2); /* short */
    assert_memory_equal(o.data, "ef", 2);
    free(o.data);
    o = run(
        FREQ(.op = ATAP_FS_READ_AT, .flags = ATAP_FS_FD | ATAP_FS_AT_POSITION, .fd = fd, .len = 4));
    assert_int_equal(o.rc, 0);
    assert_int_equal(o.n, 0); /* the end of the file */
    free(o.data);
    /* READ on an fd: from the position to the end. */
    assert_int_equal(lseek(fd, 2, SEEK_SET), 2);
    o = run(FREQ(.op = ATAP_FS_READ, .flags = ATAP_FS_FD, .fd = fd));
    assert_int_equal(o.rc, 0);
    assert_int_equal(o.n, 4);
    assert_string_equal(o.data, "cdef");
    free(o.data);
    close_file(fd, false);

    fd = open_file(at("p"), O_WRONLY | O_APPEND, false);
    o = run(FREQ(.op = ATAP_FS_WRITE_AT, .flags = ATAP_FS_FD | ATAP_FS_AT_POSITION, .fd = fd,
                 .data = "gh", .len = 2));
    assert_int_equal(o.rc, 0);
    assert_contents(at("p"), "abcdefgh");
    close_file(fd, true);

    assert_int_equal(pipe(pipe_fd), 0);
    assert_int_equal(write(pipe_fd[1], "piped", 5), 5);
    o = run(FREQ(.op = ATAP_FS_READ_AT, .flags = ATAP_FS_FD | ATAP_FS_AT_POSITION, .fd = pipe_fd[0],
                 .len = 5));
    assert_int_equal(o.rc, 0);
    assert_int_equal(o.n, 5);
    assert_memory_equal(o.data, "piped", 5);
    free(o.data);
    o = run(FREQ(.op = ATAP_FS_READ_AT, .flags = ATAP_FS_FD, .fd = pipe_fd[0], .len = 5));
    assert_int_equal(o.rc, -ESPIPE);
    assert_null(o.data);
    close(pipe_fd[0]);
    close(pipe_fd[1]);
}

/* fsync, fdatasync, a new length and a new mode through the fd. */
static void test_fs_file_sync_truncate(void **state)
{
    (void)state;
    int fd = open_file(at("s"), O_RDWR | O_CREAT, false), ro;
    atap_fs_out o;
    struct stat st;

    o = run(FREQ(.op = ATAP_FS_WRITE_AT, .flags = ATAP_FS_FD, .fd = fd, .data = "0123456789",
                 .len = 10));
    assert_int_equal(o.rc, 0);
    assert_int_equal(rc_of(FREQ(.op = ATAP_FS_SYNC, .flags = ATAP_FS_FD, .fd = fd)), 0);
    assert_int_equal(rc_of(FREQ(.op = ATAP_FS_DATASYNC, .flags = ATAP_FS_FD, .fd = fd)), 0);
    assert_int_equal(blk(FREQ(.op = ATAP_FS_SYNC, .flags = ATAP_FS_FD, .fd = fd)).rc, 0);
    assert_int_equal(blk(FREQ(.op = ATAP_FS_DATASYNC, .flags = ATAP_FS_FD, .fd = fd)).rc, 0);
    assert_int_equal(rc_of(FREQ(.op = ATAP_FS_SET_LEN, .flags = ATAP_FS_FD, .fd = fd, .offset = 4)),
                     0);
    assert_contents(at("s"), "0123");
    assert_int_equal(
        blk(FREQ(.op = ATAP_FS_SET_LEN, .flags = ATAP_FS_FD, .fd = fd, .offset = 5000)).rc, 0);
    assert_int_equal(fstat(fd, &st), 0);
    assert_int_equal(st.st_size, 5000);
    assert_int_equal(
        rc_of(FREQ(.op = ATAP_FS_SET_LEN, .flags = ATAP_FS_FD, .fd = fd, .offset = UINT64_MAX)),
        ATAP_EINVAL);
    assert_int_equal(
        rc_of(FREQ(.op = ATAP_FS_SET_MODE, .flags = ATAP_FS_FD, .fd = fd, .mode = 0604)), 0);
    assert_int_equal(fstat(fd, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0604);
    close_file(fd, true);
    /* A read-only fd syncs, and refuses a new length (EINVAL or EBADF, as
     * ftruncate(2) says on the system). */
    ro = open_file(at("s"), O_RDONLY, true);
    assert_int_equal(rc_of(FREQ(.op = ATAP_FS_SYNC, .flags = ATAP_FS_FD, .fd = ro)), 0);
    o = run(FREQ(.op = ATAP_FS_SET_LEN, .flags = ATAP_FS_FD, .fd = ro, .offset = 1));
    assert_true(o.rc == -EINVAL || o.rc == -EBADF);
    close_file(ro, false);
}

static void assert_stat_is(const atap_fs_stat *s, const struct stat *st, int type)
{
    assert_int_equal(s->size, sizeof *s);
    assert_int_equal(s->type, type);
    assert_int_equal(s->mode, st->st_mode & 07777);
    assert_int_equal(s->bytes, (uint64_t)st->st_size);
    assert_int_equal(s->blocks, (uint64_t)st->st_blocks);
    assert_int_equal(s->dev, (uint64_t)st->st_dev);
    assert_int_equal(s->ino, (uint64_t)st->st_ino);
    assert_int_equal(s->nlink, (uint64_t)st->st_nlink);
    assert_int_equal(s->rdev, (uint64_t)st->st_rdev);
    assert_int_equal(s->uid, st->st_uid);
    assert_int_equal(s->gid, st->st_gid);
    assert_int_equal(s->blksize, (uint32_t)st->st_blksize);
    assert_true(s->atime_ns == (int64_t)st->st_atim.tv_sec * 1000000000 + st->st_atim.tv_nsec);
    assert_true(s->mtime_ns == (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec);
    assert_true(s->ctime_ns == (int64_t)st->st_ctim.tv_sec * 1000000000 + st->st_ctim.tv_nsec);
}

/* atap_fs_stat against stat(2): by path, by fd, of a link itself, of a
 * FIFO; written no further than len; len too small refused. */
static void test_fs_file_stat_fields(void **state)
{
    (void)state;
    atap_fs_stat s, small[2];
    atap_fs_out o;
    struct stat st;
    int fd;

    put(at("f"), "twelve bytes");
    assert_int_equal(link(at("f"), at("f2")), 0); /* two links */
    assert_int_equal(stat(at("f"), &st), 0);
    memset(&s, 0xa5, sizeof s);
    o = run((atap_fs_req){.op = ATAP_FS_STAT, .path = at("f"), .buf = &s, .len = sizeof s});
    assert_int_equal(o.rc, 0);
    assert_int_equal(o.meta.size, 12);
    assert_int_equal(s.nlink, 2);
    assert_stat_is(&s, &st, ATAP_FS_TYPE_FILE);

    fd = open_file(at("f"), O_RDONLY, false);
    memset(&s, 0xa5, sizeof s);
    o = run(FREQ(.op = ATAP_FS_STAT, .flags = ATAP_FS_FD, .fd = fd, .buf = &s, .len = sizeof s));
    assert_int_equal(o.rc, 0);
    assert_int_equal(o.meta.type, ATAP_FS_TYPE_FILE);
    assert_int_equal(fstat(fd, &st), 0);
    assert_stat_is(&s, &st, ATAP_FS_TYPE_FILE);
    /* With no buf, out.meta alone. */
    o = blk(FREQ(.op = ATAP_FS_STAT, .flags = ATAP_FS_FD, .fd = fd));
    assert_int_equal(o.rc, 0);
    assert_int_equal(o.meta.size, 12);
    close_file(fd, false);

    assert_int_equal(symlink("f", at("l")), 0);
    o = blk((atap_fs_req){.op = ATAP_FS_LSTAT, .path = at("l"), .buf = &s, .len = sizeof s});
    assert_int_equal(o.rc, 0);
    assert_int_equal(lstat(at("l"), &st), 0);
    assert_stat_is(&s, &st, ATAP_FS_TYPE_LINK);

    assert_int_equal(mkfifo(at("fifo"), 0600), 0);
    o = run((atap_fs_req){.op = ATAP_FS_STAT, .path = at("fifo"), .buf = &s, .len = sizeof s});
    assert_int_equal(o.rc, 0);
    assert_int_equal(o.meta.type, ATAP_FS_TYPE_OTHER); /* atap_fs_meta as in 0.1 */
    assert_int_equal(stat(at("fifo"), &st), 0);
    assert_stat_is(&s, &st, ATAP_FS_TYPE_FIFO);
    if (stat("/dev/null", &st) == 0) {
        o = run((atap_fs_req){.op = ATAP_FS_STAT, .path = "/dev/null", .buf = &s, .len = sizeof s});
        assert_int_equal(o.rc, 0);
        assert_stat_is(&s, &st, ATAP_FS_TYPE_CHAR);
    }

    /* A caller with an older, shorter struct: no byte past its size. */
    memset(small, 0xa5, sizeof small);
    o = run((atap_fs_req){
        .op = ATAP_FS_STAT, .path = at("f"), .buf = small, .len = offsetof(atap_fs_stat, mode)});
    assert_int_equal(o.rc, 0);
    assert_int_equal(small[0].size, offsetof(atap_fs_stat, mode));
    assert_int_equal(small[0].type, ATAP_FS_TYPE_FILE);
    assert_int_equal(small[0].mode, 0xa5a5a5a5u);
    assert_int_equal(
        blk((atap_fs_req){.op = ATAP_FS_STAT, .path = at("f"), .buf = &s, .len = 4}).rc,
        ATAP_EINVAL);
    assert_int_equal(atap_fs_spawn(&(atap_task){0},
                                   &(atap_fs_req){.op = ATAP_FS_STAT, .path = at("f"), .buf = &s},
                                   NULL),
                     ATAP_EINVAL);
}

static const atap_fs_dirent *entry(const atap_fs_dirent *v, const char *name)
{
    for (; v->name; v++)
        if (!strcmp(v->name, name))
            return v;
    fail_msg("no entry %s", name);
    return NULL;
}

/* READ_DIR with ATAP_FS_TYPES: each entry's type and inode, a link's
 * its own; without the flag, the names as before. */
static void test_fs_read_dir_types(void **state)
{
    (void)state;
    static const char *const names[] = {"reg", "sub", "link", "dangling", "fifo"};
    static const int types[] = {ATAP_FS_TYPE_FILE, ATAP_FS_TYPE_DIR, ATAP_FS_TYPE_LINK,
                                ATAP_FS_TYPE_LINK, ATAP_FS_TYPE_FIFO};
    const atap_fs_dirent *v;
    atap_fs_out o;
    struct stat st;

    assert_int_equal(mkdir(at("d"), 0700), 0);
    put(at("d/reg"), "r");
    assert_int_equal(mkdir(at("d/sub"), 0700), 0);
    assert_int_equal(symlink("sub", at("d/link")), 0);
    assert_int_equal(symlink("nowhere", at("d/dangling")), 0);
    assert_int_equal(mkfifo(at("d/fifo"), 0600), 0);

    o = run((atap_fs_req){.op = ATAP_FS_READ_DIR, .flags = ATAP_FS_TYPES, .path = at("d")});
    assert_int_equal(o.rc, 0);
    assert_int_equal(o.n, 5);
    v = o.data;
    assert_null(v[5].name);
    for (size_t i = 0; i < 5; i++) {
        char path[600];
        const atap_fs_dirent *e = entry(v, names[i]);
        snprintf(path, sizeof path, "%s/d/%s", g_dir, names[i]);
        assert_int_equal(lstat(path, &st), 0);
        assert_int_equal(e->type, types[i]);
        assert_int_equal(e->ino, (uint64_t)st.st_ino);
    }
    free(o.data); /* one block */
    /* An empty directory: the NULL entry alone. */
    o = blk((atap_fs_req){.op = ATAP_FS_READ_DIR, .flags = ATAP_FS_TYPES, .path = at("d/sub")});
    assert_int_equal(o.rc, 0);
    assert_int_equal(o.n, 0);
    assert_null(((atap_fs_dirent *)o.data)[0].name);
    free(o.data);
    o = run((atap_fs_req){.op = ATAP_FS_READ_DIR, .flags = ATAP_FS_TYPES, .path = at("d/reg")});
    assert_int_equal(o.rc, -ENOTDIR);
    assert_null(o.data);
}

/* A big read and a big write through an fd at its position, cancelled at
 * their fourth 64 KiB chunk: no chunk after, and the position is after
 * exactly the chunks done (the dup the task worked on shares it). */
static void test_fs_file_cancel_between_chunks(void **state)
{
    (void)state;
    size_t n = 256 * CHUNK; /* 16 MiB */
    unsigned char *buf = calloc(1, n);
    int fd, fds = count_fds();
    atap_task t;
    struct stat st;

    assert_non_null(buf);
    make_large(at("large"));
    for (int writing = 0; writing < 2; writing++) {
        fd = open_file(at(writing ? "out" : "large"), writing ? O_WRONLY | O_CREAT : O_RDONLY,
                       false);
        hook_reset(UINT64_MAX, 0);
        atomic_store(&atap__fs_chunk_hook, chunk_hook);
        assert_int_equal(
            atap_fs_spawn(&t,
                          &FREQ(.op = writing ? ATAP_FS_WRITE_AT : ATAP_FS_READ_AT,
                                .flags = ATAP_FS_FD | ATAP_FS_AT_POSITION, .fd = fd,
                                .buf = writing ? NULL : buf, .data = writing ? buf : NULL,
                                .data_free = writing ? free : NULL, .len = n),
                          &(atap_spawn_opts){.after_ns = ATAP_MS(20)}),
            0);
        if (writing)
            buf = NULL; /* handed over: data_free frees it */
        cancelled_at_chunk(t, 4);
        atomic_store(&atap__fs_chunk_hook, NULL);
        assert_no_failures();
        assert_true(atomic_load(&g_cancel_call) >= 4);
        assert_int_equal(atomic_load(&g_hook_calls), atomic_load(&g_cancel_call));
        assert_int_equal((uint64_t)lseek(fd, 0, SEEK_CUR), atomic_load(&g_hook_last));
        assert_int_equal(atomic_load(&g_hook_last) % CHUNK, 0);
        assert_true(atomic_load(&g_hook_last) < n);
        if (writing) {
            assert_int_equal(fstat(fd, &st), 0);
            assert_int_equal((uint64_t)st.st_size, atomic_load(&g_hook_last));
        }
        close_file(fd, true);
    }
    free(buf);
    assert_true(wait_live_back(ATAP_SEC(10)));
    assert_int_equal(count_fds(), fds); /* the dups went with the tasks */
}

/* Bad fds and handles, and requests that make no sense, each with its
 * code; nothing of them is left open. */
static void test_fs_file_bad_input(void **state)
{
    (void)state;
    int fds = count_fds(), fd, closed;
    atap_task t = ATAP_NO_TASK;
    atap_fs_out o;
    char buf[4];

    put(at("f"), "data");
    fd = open_file(at("f"), O_RDONLY, false);
    closed = open_file(at("f"), O_RDONLY, true);
    close_file(closed, true);
    /* A closed fd: EBADF, spawned (the dup fails) and on this thread; a
     * second close too. */
    assert_int_equal(
        run(FREQ(.op = ATAP_FS_READ_AT, .flags = ATAP_FS_FD, .fd = closed, .len = 4)).rc, -EBADF);
    assert_int_equal(
        blk(FREQ(.op = ATAP_FS_READ_AT, .flags = ATAP_FS_FD, .fd = closed, .len = 4)).rc, -EBADF);
    assert_int_equal(rc_of(FREQ(.op = ATAP_FS_SYNC, .flags = ATAP_FS_FD, .fd = closed)), -EBADF);
    assert_int_equal(blk(FREQ(.op = ATAP_FS_CLOSE, .flags = ATAP_FS_FD, .fd = closed)).rc, -EBADF);
    assert_int_equal(blk(FREQ(.op = ATAP_FS_STAT, .flags = ATAP_FS_FD, .fd = 100000)).rc, -EBADF);
    /* Written through a read-only fd. */
    assert_int_equal(
        run(FREQ(.op = ATAP_FS_WRITE_AT, .flags = ATAP_FS_FD, .fd = fd, .data = "x", .len = 1)).rc,
        -EBADF);
    /* A directory's fd reads EISDIR. */
    {
        int dfd = open_file(g_dir, O_RDONLY | O_DIRECTORY, false);
        assert_int_equal(
            run(FREQ(.op = ATAP_FS_READ_AT, .flags = ATAP_FS_FD, .fd = dfd, .len = 4)).rc, -EISDIR);
        assert_int_equal(run(FREQ(.op = ATAP_FS_READ, .flags = ATAP_FS_FD, .fd = dfd)).rc, -EISDIR);
        close_file(dfd, false);
    }
    /* Opens that fail. */
    assert_int_equal(run(FREQ(.op = ATAP_FS_OPEN, .path = at("none"), .open_flags = O_RDONLY)).rc,
                     -ENOENT);
    assert_int_equal(
        run(FREQ(.op = ATAP_FS_OPEN, .path = at("f"), .open_flags = O_RDWR | O_CREAT | O_EXCL)).rc,
        -EEXIST);
    assert_int_equal(run(FREQ(.op = ATAP_FS_OPEN, .path = g_dir, .open_flags = O_RDWR)).rc,
                     -EISDIR);

    /* Refused at the spawn, and by atap_fs_run, with ATAP_EINVAL. */
    {
        const atap_fs_req bad[] = {
            FREQ(.op = ATAP_FS_READ_AT, .flags = ATAP_FS_FD, .fd = -1, .len = 4),
            FREQ(.op = ATAP_FS_READ_AT, .flags = ATAP_FS_FD, .fd = fd, .path = at("f")),
            FREQ(.op = ATAP_FS_WRITE, .flags = ATAP_FS_FD, .fd = fd),
            FREQ(.op = ATAP_FS_LSTAT, .flags = ATAP_FS_FD, .fd = fd),
            FREQ(.op = ATAP_FS_READ_DIR, .flags = ATAP_FS_FD, .fd = fd),
            FREQ(.op = ATAP_FS_COPY, .flags = ATAP_FS_FD, .fd = fd, .path2 = at("c")),
            FREQ(.op = ATAP_FS_OPEN, .flags = ATAP_FS_FD, .fd = fd),
            FREQ(.op = ATAP_FS_SYNC, .path = at("f")),
            FREQ(.op = ATAP_FS_CLOSE, .path = at("f")),
            FREQ(.op = ATAP_FS_DATASYNC),
            FREQ(.op = ATAP_FS_READ_AT, .flags = ATAP_FS_AT_POSITION, .path = at("f"), .len = 4),
            FREQ(.op = ATAP_FS_STAT, .flags = ATAP_FS_FD | ATAP_FS_AT_POSITION, .fd = fd),
            FREQ(.op = ATAP_FS_WRITE_AT, .flags = ATAP_FS_FD, .fd = fd, .len = 3),
            FREQ(.op = ATAP_FS_OPEN),
            FREQ(.op = ATAP_FS_DATASYNC + 1, .flags = ATAP_FS_FD, .fd = fd),
            /* size 0: fd and open_flags would go unread */
            {.op = ATAP_FS_READ_AT, .flags = ATAP_FS_FD, .fd = fd, .len = 4},
            {.op = ATAP_FS_OPEN, .path = at("f"), .open_flags = O_RDONLY},
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            assert_int_equal(atap_fs_spawn(&t, &bad[i], NULL), ATAP_EINVAL);
            assert_true(t.id == ATAP_NO_TASK.id);
            o = blk(bad[i]);
            assert_int_equal(o.rc, ATAP_EINVAL);
            assert_null(o.data);
        }
    }
    /* Offsets past what off_t holds; a mode past 07777. */
    assert_int_equal(run(FREQ(.op = ATAP_FS_READ_AT, .flags = ATAP_FS_FD, .fd = fd,
                              .offset = UINT64_MAX, .buf = buf, .len = 4))
                         .rc,
                     ATAP_EINVAL);
    assert_int_equal(
        run(FREQ(.op = ATAP_FS_OPEN, .path = at("g"), .open_flags = O_CREAT, .mode = 010000)).rc,
        ATAP_EINVAL);
    /* An OPEN nobody asked the output of closes what it opened. */
    assert_int_equal(atap_block(atap_fs_run,
                                &FREQ(.op = ATAP_FS_OPEN, .path = at("f"), .open_flags = O_RDONLY),
                                NULL, 0),
                     0);
    close_file(fd, false);
    assert_int_equal(count_fds(), fds);
}

/* Whoever ends up with an fd closes it: an OPEN's output nobody took (a
 * join lends it until the last release), a CLOSE cancelled before it ran
 * (the task took the fd at its spawn), the dups of spawned operations. */
static void test_fs_file_no_fd_leaked(void **state)
{
    (void)state;
    int fds = count_fds(), fd;
    atap_fs_out o;
    atap_task t;

    put(at("f"), "data");
    for (int i = 0; i < 20; i++) {
        assert_int_equal(
            atap_fs_spawn(&t, &FREQ(.op = ATAP_FS_OPEN, .path = at("f"), .open_flags = O_RDONLY),
                          NULL),
            0);
        if (i % 2) {
            assert_int_equal(atap_join(t, &o, sizeof o), 0); /* lent */
            assert_int_equal(o.rc, 0);
            assert_true(fcntl((int)o.n, F_GETFD) >= 0);
        } else {
            assert_int_equal(atap_wait(t, NULL), 0); /* not read at all */
        }
        atap_release(t);
    }
    fd = open_file(at("f"), O_RDONLY, true);
    assert_int_equal(atap_fs_spawn(&t, &FREQ(.op = ATAP_FS_CLOSE, .flags = ATAP_FS_FD, .fd = fd),
                                   &(atap_spawn_opts){.after_ns = ATAP_SEC(60)}),
                     0);
    assert_int_equal(atap_cancel(t), 0);
    assert_int_equal(atap_take(t, &o, sizeof o), ATAP_ECANCELLED);
    atap_release(t);
    fd = open_file(at("f"), O_RDONLY, false);
    for (int i = 0; i < 20; i++) {
        assert_int_equal(
            atap_fs_spawn(&t, &FREQ(.op = ATAP_FS_READ_AT, .flags = ATAP_FS_FD, .fd = fd, .len = 4),
                          i % 2 ? &(atap_spawn_opts){.after_ns = ATAP_SEC(60)} : NULL),
            0);
        if (i % 2)
            assert_int_equal(atap_cancel(t), 0);
        atap_release(t);
    }
    close_file(fd, true);
    assert_true(wait_live_back(ATAP_SEC(10)));
    assert_int_equal(count_fds(), fds);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup_fs, teardown_fs)
    const struct CMUnitTest tests[] = {
        T(test_fs_write_read_append_at),
        T(test_fs_read_at_sized_by_the_file),
        T(test_fs_large_read_write_in_chunks),
        T(test_fs_read_buffer_ownership),
        T(test_fs_block_on_calling_thread),
        T(test_fs_metadata_links_modes),
        T(test_fs_directories),
        T(test_fs_errors),
        T(test_fs_copy),
        T(test_fs_copy_cancel_between_chunks),
        T(test_fs_copy_across_file_systems),
        T(test_fs_copy_and_read_timeout),
        T(test_fs_tree_cancel_between_entries),
        T(test_fs_file_read_write_at_offset),
        T(test_fs_file_read_write_at_position),
        T(test_fs_file_sync_truncate),
        T(test_fs_file_stat_fields),
        T(test_fs_read_dir_types),
        T(test_fs_file_cancel_between_chunks),
        T(test_fs_file_bad_input),
        T(test_fs_file_no_fd_leaked),
        T(test_fs_watch_file_write_attrib_gone_last),
        T(test_fs_watch_dir_create_write_remove),
        T(test_fs_watch_repeat_keeps_changes_between_runs),
        T(test_fs_watch_dir_loses_no_rewrite),
        T(test_fs_watch_names_entries),
        T(test_fs_watch_fd_errors_timeout_cancel),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
