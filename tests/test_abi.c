/*
 * The ABI (issue #33, item 4), and what atap.h promises around it (item 5):
 *   - the versioned structs, read by their size (atap_config,
 *     atap_spawn_opts, atap_cmd, atap_fs_req: size 0 is the layout of 0.1,
 *     a smaller size leaves the later fields 0, a larger one must set
 *     nothing this library does not know) and filled no further than the
 *     caller's size (struct atap_status, struct atap_pool_stats);
 *   - the version the header and the library report;
 *   - why an atap_init failed (atap_init_error), and the ATAP_TRACE that
 *     cannot be opened, which no longer stops a start;
 *   - atap_dup's copies, which are equal; the atap_net_prep_* refusals;
 *     and the alignment of what a channel hands elem_free.
 *
 * A struct "from an older header" is made by filling a struct's bytes with
 * 0xff and setting a size that stops short of them: the library must not
 * read past the size (0xff in a priority, a kind or a pointer would be
 * refused, or crash). One "from a newer header" is the struct followed by
 * more bytes, and a size that covers them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdalign.h>
#include <sys/socket.h>

#include "test_util.h"

static int ensure_stopped(void **state)
{
    (void)state;
    unsetenv("ATAP_WORKERS");
    unsetenv("ATAP_BLOCKING_THREADS");
    unsetenv("ATAP_TRACE");
    atomic_store(&g_release_all, 1);
    int rc = atap_shutdown();
    atomic_store(&g_release_all, 0);
    return rc == 0 && !atap_initialised() ? 0 : -1;
}

/* ---- the version -------------------------------------------------------- */

static void test_abi_version_header_and_library_agree(void **state)
{
    char want[32];

    (void)state;
    assert_int_equal(atap_version_hex(), ATAP_VERSION_HEX);
    assert_int_equal(ATAP_VERSION_HEX, (ATAP_VERSION_MAJOR << 24) | (ATAP_VERSION_MINOR << 16) |
                                           (ATAP_VERSION_PATCH << 8));
    assert_int_equal(atap_version_hex() & 0xffu, 0);
    snprintf(want, sizeof want, "%u.%u.%u", atap_version_hex() >> 24,
             (atap_version_hex() >> 16) & 0xffu, (atap_version_hex() >> 8) & 0xffu);
    assert_string_equal(atap_version_string(), want);
#if ATAP_VERSION_HEX < 0x00010000
#error "ATAP_VERSION_HEX must be usable in #if, and this library is 0.1 or later"
#endif
}

/* ---- atap_spawn_opts ---------------------------------------------------- */

/* A struct of the caller's (an older header's) `size` bytes: the first
 * size bytes of opts, then 0xff up to the library's layout. */
static atap_spawn_opts *older_opts(unsigned char *buf, const atap_spawn_opts *opts, size_t size)
{
    memset(buf, 0xff, sizeof(atap_spawn_opts));
    memcpy(buf, opts, size);
    memcpy(buf, &size, sizeof size);
    return (atap_spawn_opts *)(void *)buf;
}

/* A newer header's struct: opts, then `more` bytes, the first of them `extra`. */
struct newer_opts {
    atap_spawn_opts o;
    unsigned char more[32];
};

static const atap_spawn_opts *newer(struct newer_opts *n, const atap_spawn_opts *opts,
                                    unsigned char extra)
{
    memset(n, 0, sizeof *n);
    n->o = *opts;
    n->o.size = sizeof *n;
    n->more[0] = extra;
    return &n->o;
}

static void spawn_and_join(const atap_spawn_opts *opts, uint64_t value)
{
    atap_task t = ATAP_NO_TASK;
    uint64_t v = 0;

    assert_int_equal(atap_spawn(&t, task_value, (void *)(uintptr_t)value, opts), 0);
    assert_int_equal(atap_join(t, &v, sizeof v), 0);
    assert_true(v == value);
    atap_release(t);
}

static void test_abi_spawn_opts_by_size(void **state)
{
    alignas(atap_spawn_opts) unsigned char buf[sizeof(atap_spawn_opts)];
    atap_spawn_opts base = {.out_size = sizeof(uint64_t)};
    struct newer_opts n;
    atap_task t = {.id = 77};

    (void)state;
    spawn_and_join(&base, 1); /* size 0: the layout of 0.1 */
    base.size = sizeof base;
    spawn_and_join(&base, 2);
    /* An older struct: out_size only. The rest, 0xff, is never read (a
     * priority of -1 would do no harm, but kind 0xffffffff would be refused
     * and out_free 0xff..ff would crash). */
    spawn_and_join(older_opts(buf, &base, offsetof(atap_spawn_opts, out_free)), 3);
    /* A newer struct that sets nothing more: taken. */
    spawn_and_join(newer(&n, &base, 0), 4);
    /* A newer struct that sets a field this library does not know. */
    assert_int_equal(atap_spawn(&t, task_value, NULL, newer(&n, &base, 1)), ATAP_EINVAL);
    assert_true(t.id == 0);
    /* No layout is smaller than its size field. */
    base.size = 4;
    assert_int_equal(atap_spawn(&t, task_value, NULL, &base), ATAP_EINVAL);
    assert_true(t.id == 0);
}

/* Spawns from inside a task, where the quick path is: a struct of this
 * layout (size 0, sizeof), an older one and a newer one. */
static int task_spawns_by_size(atap_ctx *ctx, void *arg, void *out)
{
    alignas(atap_spawn_opts) unsigned char buf[sizeof(atap_spawn_opts)];
    atap_spawn_opts base = {.out_size = sizeof(uint64_t)};
    const atap_spawn_opts *each[5];
    struct newer_opts n, bad;
    uint64_t got = 0;

    (void)ctx, (void)arg;
    each[0] = &(atap_spawn_opts){.out_size = sizeof(uint64_t)};
    each[1] = &(atap_spawn_opts){.size = sizeof(atap_spawn_opts), .out_size = sizeof(uint64_t)};
    each[2] = older_opts(buf, &base, offsetof(atap_spawn_opts, out_free));
    each[3] = newer(&n, &base, 0);
    each[4] = newer(&bad, &base, 9);
    for (int i = 0; i < 5; i++) {
        atap_task t = ATAP_NO_TASK;
        uint64_t v = 0;
        int rc = atap_spawn(&t, task_value, (void *)(uintptr_t)(i + 10), each[i]);

        if (i == 4) {
            if (rc == ATAP_EINVAL && t.id == 0)
                got |= 1u << i;
            continue;
        }
        if (rc == 0 && atap_join(t, &v, sizeof v) == 0 && v == (uint64_t)i + 10)
            got |= 1u << i;
        atap_release(t);
    }
    memcpy(out, &got, sizeof got);
    return 0;
}

static void test_abi_spawn_opts_by_size_inside_a_task(void **state)
{
    (void)state;
    assert_int_equal(join8(spawn8(task_spawns_by_size, NULL)), 0x1f);
}

static int task_input(atap_ctx *ctx, void *arg, void *out)
{
    size_t size = 0;
    const void *in = atap_input(ctx, &size);

    (void)arg;
    if (size != sizeof(uint64_t))
        return -1;
    memcpy(out, in, size);
    return 0;
}

/* The other calls that take options read them by size too: a waiting
 * task, a receiver, and the built-in tasks, which copy them. */
static void test_abi_spawn_opts_by_size_elsewhere(void **state)
{
    alignas(atap_spawn_opts) unsigned char buf[sizeof(atap_spawn_opts)];
    atap_spawn_opts base = {.out_size = sizeof(uint64_t)};
    struct newer_opts n;
    atap_task w, r, src, s;
    uint64_t v = 5, got = 0;

    (void)state;
    assert_int_equal(
        atap_spawn_waiting(&w, task_input, NULL, sizeof v,
                           older_opts(buf, &base, offsetof(atap_spawn_opts, out_free))),
        0);
    assert_int_equal(atap_give(w, &v, sizeof v), 0);
    assert_int_equal(atap_join(w, &got, sizeof got), 0);
    assert_true(got == 5);
    atap_release(w);
    assert_int_equal(atap_spawn_waiting(&w, task_input, NULL, sizeof v, newer(&n, &base, 1)),
                     ATAP_EINVAL);

    src = spawn8(task_value, (void *)(uintptr_t)6);
    assert_int_equal(atap_receive_all(&r, task_input, NULL, &src, 1, newer(&n, &base, 0)), 0);
    assert_int_equal(atap_join(r, &got, sizeof got), 0);
    assert_true(got == 6);
    atap_release(r);
    assert_int_equal(atap_receive_any(&r, task_input, NULL, &src, 1, newer(&n, &base, 2)),
                     ATAP_EINVAL);
    atap_release(src);

    base.out_size = 0;
    assert_int_equal(atap_spawn_sleep(&s, ATAP_US(10), false,
                                      older_opts(buf, &base, offsetof(atap_spawn_opts, out_free))),
                     0);
    assert_int_equal(atap_wait(s, NULL), 0);
    assert_int_equal(atap_state_of(s), ATAP_READY);
    atap_release(s);
    assert_int_equal(atap_spawn_sleep(&s, ATAP_US(10), false, newer(&n, &base, 3)), ATAP_EINVAL);
    assert_true(s.id == 0);
}

/* ---- struct atap_pool_stats, struct atap_status ------------------------- */

static void test_abi_pool_stats_filled_to_size(void **state)
{
    unsigned char buf[sizeof(struct atap_pool_stats) + 16];
    struct atap_pool_stats st, *p = (struct atap_pool_stats *)(void *)buf;
    size_t part = offsetof(struct atap_pool_stats, peak_aside);
    char line[512], again[512];

    (void)state;
    memset(&st, 0xee, sizeof st); /* whatever the stack held */
    assert_int_equal(atap_pool_stats(&st), 0);
    assert_true(st.size == sizeof st);
    assert_true(st.workers > 0);

    /* An older header's struct: filled up to its size, no further. */
    memset(buf, 0xab, sizeof buf);
    assert_int_equal(atap_pool_stats_sized(p, part), 0);
    assert_true(p->size == part);
    assert_true(p->workers > 0);
    for (size_t i = part; i < sizeof buf; i++)
        assert_int_equal(buf[i], 0xab);
    /* A newer header's: the library's struct, and size says so. */
    memset(buf, 0xab, sizeof buf);
    assert_int_equal(atap_pool_stats_sized(p, sizeof buf), 0);
    assert_true(p->size == sizeof st);
    for (size_t i = sizeof st; i < sizeof buf; i++)
        assert_int_equal(buf[i], 0xab);
    /* No room for the size field, or no struct at all. */
    assert_int_equal(atap_pool_stats_sized(p, 4), ATAP_EINVAL);
    assert_int_equal(atap_pool_stats_sized(NULL, sizeof st), ATAP_EINVAL);
    assert_int_equal(atap_pool_stats(NULL), ATAP_EINVAL);

    /* atap_stats_format reads a snapshot by its size: one of 0.1's layout
     * made by hand (size 0), one filled, and one with a bad size. */
    memset(&st, 0, sizeof st);
    st.workers = 3;
    st.stacks = 9;
    assert_true(atap_stats_format(line, sizeof line, &st) > 0);
    assert_non_null(strstr(line, "workers=3 busy=0 "));
    assert_non_null(strstr(line, " stacks=9"));
    assert_null(strstr(line, "size"));
    assert_int_equal(atap_pool_stats(&st), 0);
    assert_int_equal(atap_stats_format(line, sizeof line, &st),
                     atap_stats_format(again, sizeof again, &st));
    assert_string_equal(line, again);
    st.size = 4;
    assert_int_equal(atap_stats_format(line, sizeof line, &st), ATAP_EINVAL);
}

static void test_abi_status_filled_to_size(void **state)
{
    unsigned char buf[sizeof(struct atap_status) + 16];
    struct atap_status s, *p = (struct atap_status *)(void *)buf;

    (void)state;
    memset(&s, 0xee, sizeof s);
    assert_int_equal(atap_status(&s), 0);
    assert_true(s.size == sizeof s);
    assert_true(s.initialised && s.healthy && !s.shutting_down);
    memset(buf, 0xab, sizeof buf);
    assert_int_equal(atap_status_sized(p, sizeof buf), 0);
    assert_true(p->size == sizeof s);
    assert_true(p->initialised);
    for (size_t i = sizeof s; i < sizeof buf; i++)
        assert_int_equal(buf[i], 0xab);
    /* A smaller struct: as far as it goes. */
    memset(buf, 0xab, sizeof buf);
    assert_int_equal(atap_status_sized(p, offsetof(struct atap_status, manager_alive)), 0);
    assert_true(p->size == offsetof(struct atap_status, manager_alive));
    assert_true(p->initialised && !p->shutting_down);
    for (size_t i = offsetof(struct atap_status, manager_alive); i < sizeof buf; i++)
        assert_int_equal(buf[i], 0xab);
    assert_int_equal(atap_status_sized(p, 7), ATAP_EINVAL);
    assert_int_equal(atap_status(NULL), ATAP_EINVAL);
}

/* ---- atap_config -------------------------------------------------------- */

static void test_abi_config_by_size(void **state)
{
    alignas(atap_config) unsigned char buf[sizeof(atap_config)];
    atap_config cfg = {.size = 4};
    struct {
        atap_config c;
        unsigned char more[16];
    } big;

    (void)state;
    assert_int_equal(atap_init(&cfg), ATAP_EINVAL);
    memset(&big, 0, sizeof big);
    big.c.size = sizeof big;
    big.more[3] = 1;
    assert_int_equal(atap_init(&big.c), ATAP_EINVAL);
    assert_false(atap_initialised());

    /* An older struct (no workers, no blocking_threads): 0xff past its
     * size would be 4 Gi workers if it were read. */
    cfg = (atap_config){.workers_per_core = 2};
    memset(buf, 0xff, sizeof buf);
    memcpy(buf, &cfg, offsetof(atap_config, workers));
    cfg.size = offsetof(atap_config, workers);
    memcpy(buf, &cfg.size, sizeof cfg.size);
    assert_int_equal(atap_init((atap_config *)(void *)buf), 0);
    assert_int_equal(atap_shutdown(), 0);
    /* Bytes past the library's layout that are all 0: taken. */
    big.more[3] = 0;
    assert_int_equal(atap_init(&big.c), 0);
}

/* ---- atap_cmd and atap_fs_req ------------------------------------------- */

static void test_abi_cmd_and_fs_req_by_size(void **state)
{
    alignas(atap_fs_req) unsigned char rb[sizeof(atap_fs_req)];
    alignas(atap_cmd) unsigned char cb[sizeof(atap_cmd)];
    atap_fs_req req = {.op = ATAP_FS_STAT, .path = "/"};
    atap_cmd cmd = {.program = "true"};
    struct {
        atap_fs_req r;
        unsigned char more[16];
    } rbig;
    struct {
        atap_cmd c;
        unsigned char more[16];
    } cbig;
    atap_fs_out out;
    atap_task t;
    int status = -1;

    (void)state;
    /* An older atap_fs_req: op and path only; 0xff in path2, data, buf... */
    memset(rb, 0xff, sizeof rb);
    req.size = offsetof(atap_fs_req, path2);
    memcpy(rb, &req, req.size);
    memset(&out, 0, sizeof out);
    assert_int_equal(atap_block(atap_fs_run, rb, &out, sizeof out), 0);
    assert_int_equal(out.rc, 0);
    assert_int_equal(out.meta.type, ATAP_FS_TYPE_DIR);
    assert_int_equal(atap_fs_spawn(&t, (atap_fs_req *)(void *)rb, NULL), 0);
    assert_int_equal(atap_join(t, &out, sizeof out), 0);
    assert_int_equal(out.rc, 0);
    atap_release(t);
    /* A newer one that sets what this library does not know. */
    memset(&rbig, 0, sizeof rbig);
    rbig.r = req;
    rbig.r.size = sizeof rbig;
    rbig.more[0] = 1;
    assert_int_equal(atap_block(atap_fs_run, &rbig, &out, sizeof out), 0);
    assert_int_equal(out.rc, ATAP_EINVAL);
    assert_int_equal(atap_fs_spawn(&t, &rbig.r, NULL), ATAP_EINVAL);
    rbig.more[0] = 0;
    assert_int_equal(atap_block(atap_fs_run, &rbig, &out, sizeof out), 0);
    assert_int_equal(out.rc, 0);

    /* An older atap_cmd: program only; 0xff in argv, dir, env, input... */
    memset(cb, 0xff, sizeof cb);
    cmd.size = offsetof(atap_cmd, argv);
    memcpy(cb, &cmd, cmd.size);
    assert_int_equal(atap_spawn_run(&t, (atap_cmd *)(void *)cb, NULL), 0);
    assert_int_equal(atap_join(t, &status, sizeof status), 0);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    atap_release(t);
    memset(&cbig, 0, sizeof cbig);
    cbig.c = cmd;
    cbig.c.size = sizeof cbig;
    cbig.more[5] = 1;
    assert_int_equal(atap_spawn_run(&t, &cbig.c, NULL), ATAP_EINVAL);
    atap_child child;
    assert_int_equal(atap_child_start(&child, &cbig.c), ATAP_EINVAL);
    assert_int_equal(child.pid, -1);
}

/* ---- why an init failed ------------------------------------------------- */

/* Whether this thread's atap_init_error is "" (its text dies with it). */
static void *other_thread_error(void *arg)
{
    (void)arg;
    return (void *)(intptr_t)(atap_init_error()[0] == '\0');
}

static void test_abi_init_error_names_the_variable(void **state)
{
    atap_config cfg = {.size = 4};
    struct {
        atap_config c;
        unsigned char more[16];
    } big;
    pthread_t th;
    void *other = NULL;

    (void)state;
    assert_int_equal(atap_init(&cfg), ATAP_EINVAL);
    assert_string_equal(atap_init_error(), "atap_config.size 4: below 8, or sets bytes past the 32 "
                                           "this library knows");
    memset(&big, 0, sizeof big);
    big.c.size = sizeof big;
    big.more[3] = 1;
    assert_int_equal(atap_init(&big.c), ATAP_EINVAL);
    assert_non_null(strstr(atap_init_error(), "atap_config.size 48: "));
    cfg = (atap_config){.worker_stack = 4096};
    assert_int_equal(atap_init(&cfg), ATAP_EINVAL);
    assert_string_equal(atap_init_error(), "atap_config.worker_stack 4096: below 16384 bytes");
    cfg = (atap_config){.size = sizeof cfg, .blocking_threads = 5000};
    assert_int_equal(atap_init(&cfg), ATAP_EINVAL);
    assert_string_equal(atap_init_error(), "atap_config.blocking_threads 5000: above 1024");

    setenv("ATAP_WORKERS", "4x", 1);
    assert_int_equal(atap_init(NULL), ATAP_EINVAL);
    assert_string_equal(atap_init_error(), "ATAP_WORKERS=\"4x\": not a number from 0 to 1024");
    /* The text is this thread's: another thread's last init said nothing. */
    assert_int_equal(pthread_create(&th, NULL, other_thread_error, NULL), 0);
    assert_int_equal(pthread_join(th, &other), 0);
    assert_true(other == (void *)(intptr_t)1);
    unsetenv("ATAP_WORKERS");
    setenv("ATAP_BLOCKING_THREADS", "2000", 1);
    assert_int_equal(atap_init(NULL), ATAP_EINVAL);
    assert_string_equal(atap_init_error(),
                        "ATAP_BLOCKING_THREADS=\"2000\": not a number from 0 to 1024");
    unsetenv("ATAP_BLOCKING_THREADS");
    assert_false(atap_initialised());
    assert_int_equal(atap_init(NULL), 0);
    assert_string_equal(atap_init_error(), "");
}

/* An ATAP_TRACE that cannot be opened: the runtime starts untraced, one line
 * on stderr says why, and atap_init_error has the same text. */
static void test_abi_trace_unopenable_starts_untraced(void **state)
{
    char path[64], line[256] = {0};
    int saved, fd;
    FILE *f;

    (void)state;
    snprintf(path, sizeof path, "/tmp/atap_abi_err_%ld", (long)getpid());
    assert_true((fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)) >= 0);
    fflush(stderr);
    assert_true((saved = dup(2)) >= 0);
    assert_int_equal(dup2(fd, 2), 2);
    setenv("ATAP_TRACE", "/nonexistent-atap-dir/t.json", 1);
    int rc = atap_init(NULL);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    unsetenv("ATAP_TRACE");
    assert_int_equal(rc, 0);
    assert_true(atap_initialised());
    assert_string_equal(atap_init_error(),
                        "ATAP_TRACE=/nonexistent-atap-dir/t.json: not traced: No such file or "
                        "directory");
    assert_non_null(f = fopen(path, "r"));
    assert_non_null(fgets(line, sizeof line, f));
    assert_null(fgets(line + strlen(line), (int)(sizeof line - strlen(line)), f)); /* one line */
    fclose(f);
    unlink(path);
    assert_string_equal(line, "libatap: ATAP_TRACE=/nonexistent-atap-dir/t.json: not traced: No "
                              "such file or directory\n");
    assert_int_equal(atap_trace_stop(), ATAP_EINVAL); /* nothing is traced */
}

/* ---- atap_dup ----------------------------------------------------------- */

static void test_abi_dup_copies_are_equal_and_counted(void **state)
{
    atap_task t, c;

    (void)state;
    t = spawn8(task_value, (void *)(uintptr_t)8);
    assert_int_equal(atap_dup(t, &c), 0);
    assert_true(c.id == t.id); /* the same value: handles are counted */
    atap_release(t);
    assert_true(join8(c) == 8); /* one count left: the task is there */
    atap_release(c);
    assert_int_equal(atap_state_of(c), ATAP_FAILED);

    /* What atap.h warns of: releasing one handle twice lets go of the
     * other's count, and the copy still held then names no task. */
    t = spawn8(task_value, (void *)(uintptr_t)9);
    assert_int_equal(atap_dup(t, &c), 0);
    atap_release(t);
    atap_release(t);
    uint64_t v = 0;
    assert_int_equal(atap_join(c, &v, sizeof v), ATAP_ENOTASK);
    assert_true(wait_live_back(ATAP_SEC(10)));
}

/* ---- atap_net_prep_* ---------------------------------------------------- */

static void test_abi_net_prep_einval(void **state)
{
    atap_net_io io;
    atap_net_reader rd;
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    char buf[16], rbuf[16];

    (void)state;
    assert_int_equal(atap_net_prep_connect(NULL, "127.0.0.1:80"), ATAP_EINVAL);
    assert_int_equal(atap_net_prep_connect(&io, NULL), ATAP_EINVAL);
    assert_int_equal(atap_net_prep_connect(&io, "localhost"), ATAP_EINVAL);  /* no ':' */
    assert_int_equal(atap_net_prep_connect(&io, "localhost:"), ATAP_EINVAL); /* no port */
    assert_int_equal(atap_net_prep_connect(&io, "127.0.0.1:80"), 0);
    assert_int_equal(atap_net_prep_unix_connect(&io, ""), ATAP_EINVAL);
    assert_int_equal(atap_net_prep_accept(NULL, 3, NULL, NULL), ATAP_EINVAL);
    assert_int_equal(atap_net_prep_accept(&io, 3, (struct sockaddr *)&ss, NULL), ATAP_EINVAL);
    assert_int_equal(atap_net_prep_accept(&io, 3, (struct sockaddr *)&ss, &len), 0);
    assert_int_equal(atap_net_prep_send(NULL, 3, buf, 1), ATAP_EINVAL);
    assert_int_equal(atap_net_prep_send(&io, 3, NULL, 1), ATAP_EINVAL);
    assert_int_equal(atap_net_prep_send(&io, 3, NULL, 0), 0);
    assert_int_equal(atap_net_prep_recv(&io, 3, NULL, 1), ATAP_EINVAL);
    assert_int_equal(atap_net_prep_recv_exact(NULL, 3, buf, 1), ATAP_EINVAL);
    assert_int_equal(atap_net_prep_send_to(&io, 3, buf, 1, NULL, 0), ATAP_EINVAL);
    assert_int_equal(atap_net_prep_send_to(&io, 3, NULL, 1, (struct sockaddr *)&ss, len),
                     ATAP_EINVAL);
    assert_int_equal(atap_net_prep_recv_from(&io, 3, buf, 1, (struct sockaddr *)&ss, NULL),
                     ATAP_EINVAL);
    assert_int_equal(atap_net_prep_recv_from(&io, 3, buf, 1, NULL, NULL), 0);
    assert_int_equal(atap_net_reader_init(&rd, 3, rbuf, sizeof rbuf), 0);
    assert_int_equal(atap_net_prep_recv_until(&io, &rd, "\n", 0, 8), ATAP_EINVAL);
    assert_int_equal(atap_net_prep_recv_until(&io, &rd, "\n", 1, sizeof rbuf + 1), ATAP_EINVAL);
    assert_int_equal(atap_net_prep_recv_until(&io, &rd, "ab", 2, 1), ATAP_EINVAL);
    assert_int_equal(atap_net_prep_recv_until(&io, NULL, "\n", 1, 8), ATAP_EINVAL);
    assert_int_equal(atap_net_prep_recv_until(&io, &rd, "\n", 1, 8), 0);
}

/* ---- what a channel hands elem_free ------------------------------------- */

static atomic_int freed, misaligned;
static _Atomic size_t elem_bytes;

/* The alignment atap.h promises a pointer to `size` bytes: alignof
 * (max_align_t), or the largest power of two dividing size. */
static size_t promised(size_t size)
{
    size_t a = alignof(max_align_t);

    while (size % a)
        a /= 2;
    return a;
}

static void note_free(void *value)
{
    if ((uintptr_t)value % promised(atomic_load(&elem_bytes)) != 0)
        atomic_fetch_add(&misaligned, 1);
    atomic_fetch_add(&freed, 1);
}

/* For each size: a received output nobody took (freed at the release of
 * its task), and values a last receiver's close drops. 24 and 40 bytes
 * reach elem_free 8-aligned, which the one promise allows. */
static void test_abi_channel_elem_free_aligned_as_promised(void **state)
{
    static const size_t sizes[] = {1, 8, 12, 16, 24, 32, 40, 48, 64, 72, 96, 200};
    unsigned char value[256] = {0}, got[256];

    (void)state;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k];
        atap_chan *ch;
        atap_task t;

        atomic_store(&elem_bytes, n);
        atomic_store(&freed, 0);
        assert_int_equal(atap_chan_open(&ch, n, 0, note_free), 0);
        for (int i = 0; i < 3; i++)
            assert_int_equal(atap_chan_send(ch, value), 0);
        assert_int_equal(atap_chan_spawn_recv(&t, ch, NULL), 0);
        assert_int_equal(atap_join(t, got, n), 0); /* copied, not taken */
        atap_release(t);
        assert_true(wait_atomic_at_least(&freed, 1, ATAP_SEC(10)));
        atap_chan_close_sender(ch);
        atap_chan_close_receiver(ch); /* drops the two left */
        assert_true(wait_atomic_at_least(&freed, 3, ATAP_SEC(10)));
        assert_int_equal(atomic_load(&misaligned), 0);
    }
}

int main(void)
{
    unsetenv("ATAP_WORKERS");
    unsetenv("ATAP_BLOCKING_THREADS");
    unsetenv("ATAP_TRACE");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_abi_version_header_and_library_agree),
        cmocka_unit_test_setup_teardown(test_abi_spawn_opts_by_size, setup_runtime,
                                        teardown_runtime),
        cmocka_unit_test_setup_teardown(test_abi_spawn_opts_by_size_inside_a_task, setup_runtime,
                                        teardown_runtime),
        cmocka_unit_test_setup_teardown(test_abi_spawn_opts_by_size_elsewhere, setup_runtime,
                                        teardown_runtime),
        cmocka_unit_test_setup_teardown(test_abi_pool_stats_filled_to_size, setup_runtime,
                                        teardown_runtime),
        cmocka_unit_test_setup_teardown(test_abi_status_filled_to_size, setup_runtime,
                                        teardown_runtime),
        cmocka_unit_test_teardown(test_abi_config_by_size, ensure_stopped),
        cmocka_unit_test_setup_teardown(test_abi_cmd_and_fs_req_by_size, setup_runtime,
                                        teardown_runtime),
        cmocka_unit_test_teardown(test_abi_init_error_names_the_variable, ensure_stopped),
        cmocka_unit_test_teardown(test_abi_trace_unopenable_starts_untraced, ensure_stopped),
        cmocka_unit_test_setup_teardown(test_abi_dup_copies_are_equal_and_counted, setup_runtime,
                                        teardown_runtime),
        cmocka_unit_test(test_abi_net_prep_einval),
        cmocka_unit_test_setup_teardown(test_abi_channel_elem_free_aligned_as_promised,
                                        setup_runtime, teardown_runtime),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
