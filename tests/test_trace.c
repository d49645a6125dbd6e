/*
 * Traces (atap_trace_start / atap_trace_stop, ATAP_TRACE): a small known
 * program is traced, the file is read back through a strict JSON parser of
 * this file's own, and the events it must hold are looked for: a run slice
 * named after each task's function, a spawn arrow to each run, the park,
 * resume, cancel, timeout and give instants, the give's arrow, nested
 * slices on every lane, and the names of the workers' and the manager's
 * lanes. The task functions are not static, and this program is linked
 * with ENABLE_EXPORTS (tests/CMakeLists.txt), so that dladdr names them.
 *
 * Each file is also given to tests/trace_check.py, the checker of the
 * Trace Event Format's rules the viewers rely on, when the build found a
 * python3 (ATAP_TRACE_CHECK, set by CTest, is the command); without one
 * that check is skipped and said so.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <ctype.h>
#include <errno.h>
#include <sys/stat.h>
#if defined(__linux__)
#include <sys/syscall.h>
#endif

#include "test_util.h"

/* ---- a JSON parser, strict enough to refuse what a viewer would -------- */

enum jtype { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };

struct jval {
    enum jtype type;
    double num;
    char *str;           /* J_STR */
    size_t n, cap;       /* J_ARR, J_OBJ: items, and room for them */
    char **keys;         /* J_OBJ */
    struct jval **items; /* J_ARR, J_OBJ */
};

struct jparse {
    const char *p, *end;
    bool bad;
};

static void jfree(struct jval *v)
{
    if (!v)
        return;
    for (size_t i = 0; i < v->n; i++) {
        jfree(v->items[i]);
        if (v->keys)
            free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->str);
    free(v);
}

static void jspace(struct jparse *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\r' || *j->p == '\t'))
        j->p++;
}

static struct jval *jvalue(struct jparse *j, int depth);

static char *jstring(struct jparse *j)
{
    size_t cap = 16, n = 0;
    char *s = malloc(cap);

    if (j->p >= j->end || *j->p != '"') {
        j->bad = true;
        free(s);
        return NULL;
    }
    j->p++;
    while (j->p < j->end && *j->p != '"') {
        char c = *j->p++;

        if ((unsigned char)c < 0x20) {
            j->bad = true;
            break;
        }
        if (c == '\\') {
            if (j->p >= j->end) {
                j->bad = true;
                break;
            }
            c = *j->p++;
            switch (c) {
            case '"':
            case '\\':
            case '/':
                break;
            case 'b':
                c = '\b';
                break;
            case 'f':
                c = '\f';
                break;
            case 'n':
                c = '\n';
                break;
            case 'r':
                c = '\r';
                break;
            case 't':
                c = '\t';
                break;
            case 'u':
                for (int i = 0; i < 4; i++)
                    if (j->p >= j->end || !isxdigit((unsigned char)*j->p++))
                        j->bad = true;
                c = '?';
                break;
            default:
                j->bad = true;
                break;
            }
        }
        if (n + 2 > cap)
            s = realloc(s, cap *= 2);
        s[n++] = c;
    }
    if (j->p >= j->end)
        j->bad = true;
    else
        j->p++;
    s[n] = 0;
    return s;
}

static bool jnumber(struct jparse *j, double *out)
{
    const char *s = j->p;

    if (j->p < j->end && *j->p == '-')
        j->p++;
    if (j->p >= j->end || !isdigit((unsigned char)*j->p))
        return false;
    if (*j->p == '0')
        j->p++;
    else
        while (j->p < j->end && isdigit((unsigned char)*j->p))
            j->p++;
    if (j->p < j->end && *j->p == '.') {
        j->p++;
        if (j->p >= j->end || !isdigit((unsigned char)*j->p))
            return false;
        while (j->p < j->end && isdigit((unsigned char)*j->p))
            j->p++;
    }
    if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
        j->p++;
        if (j->p < j->end && (*j->p == '+' || *j->p == '-'))
            j->p++;
        if (j->p >= j->end || !isdigit((unsigned char)*j->p))
            return false;
        while (j->p < j->end && isdigit((unsigned char)*j->p))
            j->p++;
    }
    *out = strtod(s, NULL);
    return true;
}

static void jpush(struct jval *v, char *key, struct jval *item)
{
    if (v->n == v->cap) { /* doubling: a sanitizer's realloc always copies */
        v->cap = v->cap ? 2 * v->cap : 8;
        v->items = realloc(v->items, v->cap * sizeof *v->items);
        if (v->type == J_OBJ)
            v->keys = realloc(v->keys, v->cap * sizeof *v->keys);
    }
    if (v->keys)
        v->keys[v->n] = key;
    v->items[v->n++] = item;
}

static bool jword(struct jparse *j, const char *w)
{
    size_t n = strlen(w);

    if ((size_t)(j->end - j->p) < n || memcmp(j->p, w, n) != 0)
        return false;
    j->p += n;
    return true;
}

static struct jval *jvalue(struct jparse *j, int depth)
{
    struct jval *v = calloc(1, sizeof *v);

    jspace(j);
    if (depth > 64 || j->p >= j->end) {
        j->bad = true;
        return v;
    }
    if (*j->p == '{' || *j->p == '[') {
        bool obj = *j->p == '{';

        v->type = obj ? J_OBJ : J_ARR;
        j->p++;
        jspace(j);
        if (j->p < j->end && *j->p == (obj ? '}' : ']')) {
            j->p++;
            return v;
        }
        while (!j->bad) {
            char *key = NULL;

            jspace(j);
            if (obj) {
                key = jstring(j);
                jspace(j);
                if (j->p >= j->end || *j->p != ':') {
                    j->bad = true;
                    free(key);
                    break;
                }
                j->p++;
            }
            jpush(v, key, jvalue(j, depth + 1));
            jspace(j);
            if (j->p < j->end && *j->p == ',') {
                j->p++;
                continue;
            }
            if (j->p < j->end && *j->p == (obj ? '}' : ']')) {
                j->p++;
                break;
            }
            j->bad = true;
        }
    } else if (*j->p == '"') {
        v->type = J_STR;
        v->str = jstring(j);
    } else if (jword(j, "true") || jword(j, "false")) {
        v->type = J_BOOL;
    } else if (jword(j, "null")) {
        v->type = J_NULL;
    } else {
        v->type = J_NUM;
        if (!jnumber(j, &v->num))
            j->bad = true;
    }
    return v;
}

/* The whole file as one JSON value, or NULL if it is not one. */
static struct jval *jload(const char *path)
{
    FILE *f = fopen(path, "rb");
    struct jparse j;
    struct jval *v;
    char *buf;
    long n;

    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc((size_t)n + 1);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n)
        n = 0;
    fclose(f);
    j = (struct jparse){.p = buf, .end = buf + n};
    v = jvalue(&j, 0);
    jspace(&j);
    if (j.bad || j.p != j.end) {
        fprintf(stderr, "bad JSON at byte %ld\n", (long)(j.p - buf));
        jfree(v);
        v = NULL;
    }
    free(buf);
    return v;
}

static struct jval *jget(const struct jval *v, const char *key)
{
    if (!v || v->type != J_OBJ)
        return NULL;
    for (size_t i = 0; i < v->n; i++)
        if (strcmp(v->keys[i], key) == 0)
            return v->items[i];
    return NULL;
}

static const char *jstr(const struct jval *v, const char *key)
{
    struct jval *s = jget(v, key);

    return s && s->type == J_STR ? s->str : NULL;
}

static bool jis(const struct jval *v, const char *key, const char *want)
{
    const char *s = jstr(v, key);

    return s && want && strcmp(s, want) == 0;
}

/* ---- looking for events -------------------------------------------------- */

/* How many events have ph, name (NULL: any) and, in args, task == id
 * (NULL: any); cat (NULL: any) for flows, which carry id instead. */
static size_t count_events(const struct jval *evs, const char *ph, const char *name,
                           const char *task, const char *cat)
{
    size_t n = 0;

    for (size_t i = 0; i < evs->n; i++) {
        const struct jval *e = evs->items[i];

        if (!jis(e, "ph", ph) || (name && !jis(e, "name", name)) || (cat && !jis(e, "cat", cat)))
            continue;
        if (task && !jis(jget(e, "args"), "task", task) && !jis(e, "id", task))
            continue;
        n++;
    }
    return n;
}

static bool lane_named(const struct jval *evs, const char *prefix)
{
    for (size_t i = 0; i < evs->n; i++) {
        const struct jval *e = evs->items[i];
        const char *name = jstr(jget(e, "args"), "name");

        if (jis(e, "ph", "M") && jis(e, "name", "thread_name") && name &&
            strncmp(name, prefix, strlen(prefix)) == 0)
            return true;
    }
    return false;
}

/* Every lane's B and E pair up (lanes are numbered from 1, in the order
 * threads first recorded: a few here). */
/*
 * What a viewer needs of each lane (Perfetto's JSON import drops what breaks
 * it): events in time order; B and E balanced, an E no earlier than its B;
 * slices that nest perfectly, never overlapping in part (an X inside a run
 * ends before the run does; siblings one after the other). Arrows (s, f)
 * may come later in the file than their slices: trace_check.py checks what
 * they bind to.
 */
#define LANES 1024
#define LANE_DEPTH 512
#define TS_EPS 1e-6 /* timestamps are printed in microseconds, 3 decimals */

struct lane {
    double last;                     /* the lane's latest timestamp */
    unsigned depth;                  /* open B slices */
    double open[LANE_DEPTH];         /* their starts */
    double kids_end[LANE_DEPTH + 1]; /* where the last slice at each level ended */
};

static bool lanes_nest(const struct jval *evs)
{
    struct lane *lanes = calloc(LANES, sizeof *lanes);
    bool ok = lanes != NULL;

    for (size_t i = 0; ok && i < evs->n; i++) {
        const struct jval *e = evs->items[i], *tid = jget(e, "tid"), *ts = jget(e, "ts"), *dur;
        const char *ph = jstr(e, "ph");
        struct lane *l;
        double t;

        if (!ph || strcmp(ph, "M") == 0 || strcmp(ph, "s") == 0 || strcmp(ph, "f") == 0)
            continue; /* arrows may be written after their slices: trace_check.py binds them */
        if (!tid || !ts || tid->num < 0) {
            ok = false;
            break;
        }
        l = &lanes[(size_t)tid->num % LANES]; /* OS thread ids: few, apart */
        t = ts->num;
        if (t < l->last - TS_EPS)
            ok = false; /* out of order on its lane */
        l->last = t;
        if (strcmp(ph, "B") == 0) {
            if (l->depth == LANE_DEPTH || t < l->kids_end[l->depth] - TS_EPS)
                ok = false;
            else {
                l->open[l->depth++] = t;
                l->kids_end[l->depth] = t;
            }
        } else if (strcmp(ph, "E") == 0) {
            if (l->depth == 0 || t < l->open[l->depth - 1] - TS_EPS ||
                t < l->kids_end[l->depth] - TS_EPS)
                ok = false; /* no slice open, or a slice inside ends after it */
            else
                l->kids_end[--l->depth] = t;
        } else if (strcmp(ph, "X") == 0) {
            if (!(dur = jget(e, "dur")) || dur->num < 0 || t < l->kids_end[l->depth] - TS_EPS)
                ok = false;
            else
                l->kids_end[l->depth] = t + dur->num;
        }
    }
    free(lanes);
    return ok;
}

/* Every arrow that starts (s) ends (f) in the file, with the same cat,
 * name and id, once: a give or a spawn leads to one run. */
static bool arrows_end(const struct jval *evs)
{
    for (size_t i = 0; i < evs->n; i++) {
        const struct jval *e = evs->items[i];
        const char *cat = jstr(e, "cat"), *id = jstr(e, "id");
        bool ended = false;

        if (!jis(e, "ph", "s"))
            continue;
        if (!cat || !id)
            return false;
        for (size_t k = 0; k < evs->n; k++)
            if (jis(evs->items[k], "ph", "f") && jis(evs->items[k], "cat", cat) &&
                jis(evs->items[k], "id", id) && jis(evs->items[k], "name", jstr(e, "name"))) {
                if (ended)
                    return false; /* two ends for one start */
                ended = true;
            }
        if (!ended)
            return false;
    }
    return true;
}

static void id_of(atap_task t, char *buf, size_t n)
{
    snprintf(buf, n, "0x%llx", (unsigned long long)t.id);
}

/* The file through tests/trace_check.py, when there is a python3. */
static void trace_checked(const char *path)
{
    const char *cmd = getenv("ATAP_TRACE_CHECK");
    char line[1024];
    int status;

    if (!cmd || !*cmd) {
        print_message("trace_check.py not run on %s (no python3 found by the build)\n", path);
        return;
    }
    snprintf(line, sizeof line, "%s '%s'", cmd, path);
    status = system(line);
    if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("trace_check.py refused %s (status %d)", path, status);
}

static long long this_thread_id(void)
{
#if defined(__linux__)
    return (long long)syscall(SYS_gettid);
#else
    return -1; /* the lanes' ids are checked on Linux */
#endif
}

/* A thread_name metadata event for the lane of OS thread id tid. */
static bool lane_of_tid(const struct jval *evs, long long tid)
{
    for (size_t i = 0; i < evs->n; i++) {
        const struct jval *e = evs->items[i], *t = jget(e, "tid");

        if (jis(e, "ph", "M") && jis(e, "name", "thread_name") && t && t->type == J_NUM &&
            (long long)t->num == tid)
            return true;
    }
    return false;
}

static size_t dropped_count(const struct jval *evs)
{
    const struct jval *d;

    for (size_t i = 0; i < evs->n; i++)
        if (jis(evs->items[i], "name", "dropped events") &&
            (d = jget(jget(evs->items[i], "args"), "dropped")) != NULL)
            return (size_t)d->num;
    return 0;
}

static void temp_path(char *buf, size_t n)
{
    int fd;

    snprintf(buf, n, "%s/atap_trace_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    fd = mkstemp(buf);
    assert_true(fd >= 0);
    close(fd);
}

/* ---- the traced program ---------------------------------------------------- */

/* Not static: dladdr names only exported symbols. */
int trace_child(atap_ctx *ctx, void *arg, void *out);
int trace_parent(atap_ctx *ctx, void *arg, void *out);
int trace_piped(atap_ctx *ctx, void *arg, void *out);
int trace_forever(atap_ctx *ctx, void *arg, void *out);
int trace_given(atap_ctx *ctx, void *arg, void *out);

int trace_child(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    *(long *)out = (long)(intptr_t)arg;
    return 0;
}

#define CHILDREN 3
static atap_task children[CHILDREN];

int trace_parent(atap_ctx *ctx, void *arg, void *out)
{
    long sum = 0, v;

    (void)ctx, (void)arg;
    for (long i = 0; i < CHILDREN; i++)
        if (atap_spawn(&children[i], trace_child, (void *)(intptr_t)(i + 1),
                       &(atap_spawn_opts){.out_size = sizeof(long)}) != 0)
            return -1;
    for (int i = 0; i < CHILDREN; i++) {
        if (atap_join(children[i], &v, sizeof v) != 0)
            return -1;
        sum += v;
    }
    *(long *)out = sum;
    return 0;
}

static int pipe_fds[2];

int trace_piped(atap_ctx *ctx, void *arg, void *out)
{
    char c = 0;

    (void)arg;
    if (!atap_resumed(ctx))
        return atap_park_fd(ctx, pipe_fds[0], ATAP_READABLE, ATAP_FOREVER) == 0 ? ATAP_PARKED : -1;
    *(long *)out = read(pipe_fds[0], &c, 1) == 1 ? c : -1;
    return 0;
}

int trace_forever(atap_ctx *ctx, void *arg, void *out)
{
    (void)arg, (void)out;
    return atap_park_until(ctx, atap_now() + ATAP_SEC(60)) == 0 ? ATAP_PARKED : -1;
}

int trace_given(atap_ctx *ctx, void *arg, void *out)
{
    size_t n = 0;
    const long *in = atap_input(ctx, &n);

    (void)arg;
    *(long *)out = in && n == sizeof *in ? *in * 2 : -1;
    return 0;
}

static void wait_state(atap_task t, atap_state want)
{
    uint64_t end = now_ns() + ATAP_SEC(20);

    while (atap_state_of(t) != want && now_ns() < end)
        sleep_ms(1);
    assert_int_equal(atap_state_of(t), want);
}

static void test_trace_known_program(void **state)
{
    char path[256], id[40];
    atap_task parent, piped, cancelled, slow, given, repeat;
    struct jval *doc, *evs;
    uint64_t end;
    long v;

    (void)state;
    temp_path(path, sizeof path);
    assert_int_equal(pipe(pipe_fds), 0);
    /* Started before the runtime: the manager's first life is in it. */
    assert_int_equal(atap_trace_start(path), 0);
    assert_int_equal(atap_trace_start(path), ATAP_EALREADY);
    assert_int_equal(atap_init(&(atap_config){.size = sizeof(atap_config), .workers = 2}), 0);

    /* Spawns and joins. */
    assert_int_equal(
        atap_spawn(&parent, trace_parent, NULL, &(atap_spawn_opts){.out_size = sizeof(long)}), 0);
    assert_int_equal(atap_join(parent, &v, sizeof v), 0);
    assert_int_equal(v, 1 + 2 + 3);

    /* A park on a pipe, resumed by a write. */
    assert_int_equal(
        atap_spawn(&piped, trace_piped, NULL, &(atap_spawn_opts){.out_size = sizeof(long)}), 0);
    wait_state(piped, ATAP_WAITING);
    assert_int_equal(write(pipe_fds[1], "x", 1), 1);
    assert_int_equal(atap_join(piped, &v, sizeof v), 0);
    assert_int_equal(v, 'x');

    /* A cancel of a parked task. */
    assert_int_equal(atap_spawn(&cancelled, trace_forever, NULL, NULL), 0);
    wait_state(cancelled, ATAP_WAITING);
    assert_int_equal(atap_cancel(cancelled), 0);
    assert_int_equal(atap_wait(cancelled, NULL), 0);

    /* A run past its timeout (the manager ends it). */
    assert_int_equal(
        atap_spawn(&slow, trace_forever, NULL, &(atap_spawn_opts){.timeout_ns = ATAP_MS(5)}), 0);
    assert_int_equal(atap_wait(slow, NULL), 0);
    assert_int_equal(atap_state_of(slow), ATAP_TIMED_OUT);

    /* A give to a waiting task. */
    assert_int_equal(atap_spawn_waiting(&given, trace_given, NULL, sizeof(long),
                                        &(atap_spawn_opts){.out_size = sizeof(long), .gives = 1}),
                     0);
    wait_state(given, ATAP_WAITING);
    v = 21;
    assert_int_equal(atap_give(given, &v, sizeof v), 0);
    assert_int_equal(atap_join(given, &v, sizeof v), 0);
    assert_int_equal(v, 42);

    /* A repeat: three runs, one spawn. */
    assert_int_equal(atap_spawn(&repeat, trace_child, (void *)(intptr_t)5,
                                &(atap_spawn_opts){.out_size = sizeof(long),
                                                   .kind = ATAP_REPEAT,
                                                   .runs = 3,
                                                   .every_ns = ATAP_MS(1)}),
                     0);
    end = now_ns() + ATAP_SEC(20);
    while (!atap_finished(repeat) && now_ns() < end)
        sleep_ms(1);
    assert_true(atap_finished(repeat));

    assert_int_equal(atap_trace_stop(), 0);
    assert_int_equal(atap_trace_stop(), ATAP_EINVAL);

    assert_non_null(doc = jload(path));
    assert_int_equal(doc->type, J_OBJ);
    assert_non_null(evs = jget(doc, "traceEvents"));
    assert_int_equal(evs->type, J_ARR);

    /* A run slice named after its function, ended by an E of the same
     * name, and a spawn (a slice of no length) with an arrow into it, all
     * of one category, which the arrows bind by. */
    id_of(parent, id, sizeof id);
    assert_int_equal(count_events(evs, "B", "trace_parent", id, "atap"), 1);
    assert_int_equal(count_events(evs, "E", "trace_parent", NULL, "atap"), 1);
    assert_int_equal(count_events(evs, "s", "spawn", id, "atap"), 1);
    assert_int_equal(count_events(evs, "f", "spawn", id, "atap"), 1);
    assert_int_equal(count_events(evs, "X", "spawn", id, "atap"), 1);
    for (int i = 0; i < CHILDREN; i++) {
        id_of(children[i], id, sizeof id);
        assert_int_equal(count_events(evs, "B", "trace_child", id, NULL), 1);
        assert_int_equal(count_events(evs, "s", "spawn", id, "atap"), 1);
        assert_int_equal(count_events(evs, "f", "spawn", id, "atap"), 1);
    }
    /* Parked, resumed: two runs, the spawn's arrow into the first only. */
    id_of(piped, id, sizeof id);
    assert_int_equal(count_events(evs, "B", "trace_piped", id, NULL), 2);
    assert_int_equal(count_events(evs, "E", "trace_piped", NULL, NULL), 2);
    assert_int_equal(count_events(evs, "f", "spawn", id, "atap"), 1);
    assert_int_equal(count_events(evs, "i", "park", id, NULL), 1);
    assert_int_equal(count_events(evs, "i", "resume", id, NULL), 1);
    id_of(cancelled, id, sizeof id);
    assert_int_equal(count_events(evs, "B", "trace_forever", id, NULL), 1);
    assert_int_equal(count_events(evs, "i", "park", id, NULL), 1);
    assert_int_equal(count_events(evs, "i", "cancel", id, NULL), 1);
    id_of(slow, id, sizeof id);
    assert_int_equal(count_events(evs, "i", "timeout", id, NULL), 1);
    /* The give, its arrow, and the run it started (the one give here). */
    id_of(given, id, sizeof id);
    assert_int_equal(count_events(evs, "X", "give", id, "atap"), 1);
    assert_int_equal(count_events(evs, "s", "give", NULL, "atap"), 1);
    assert_int_equal(count_events(evs, "f", "give", NULL, "atap"), 1);
    assert_int_equal(count_events(evs, "B", "trace_given", id, NULL), 1);
    /* The repeat: three runs, one arrow from its spawn, to the first. */
    id_of(repeat, id, sizeof id);
    assert_int_equal(count_events(evs, "B", "trace_child", id, NULL), 3);
    assert_int_equal(count_events(evs, "s", "spawn", id, "atap"), 1);
    assert_int_equal(count_events(evs, "f", "spawn", id, "atap"), 1);
    /* The lanes carry the OS's thread ids: this thread spawned. */
    if (this_thread_id() >= 0)
        assert_true(lane_of_tid(evs, this_thread_id()));

    assert_true(count_events(evs, "i", "manager starts", NULL, NULL) >= 1);
    assert_true(lane_named(evs, "atap-worker "));
    assert_true(lane_named(evs, "atap-manager"));
    assert_int_equal(count_events(evs, "M", "process_name", NULL, NULL), 1);
    assert_int_equal(count_events(evs, "i", "dropped events", NULL, NULL), 1);
    assert_true(lanes_nest(evs));
    assert_true(arrows_end(evs));
    jfree(doc);
    trace_checked(path);

    atap_release(repeat);
    atap_release(parent);
    for (int i = 0; i < CHILDREN; i++)
        atap_release(children[i]);
    atap_release(piped);
    atap_release(cancelled);
    atap_release(slow);
    atap_release(given);
    assert_int_equal(atap_shutdown(), 0);
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    unlink(path);
}

/* A wait that sets its stack aside shows as two instants on its thread's
 * lane: the stack set aside, and the stack going on (a child parked for a
 * while is not in the waiter's queues, so the join cannot run it). The
 * child parks for arg ms once, then ends. */
static int trace_napper_for(atap_ctx *ctx, void *arg, void *out)
{
    (void)out;
    if (atap_resumed(ctx))
        return 0;
    return atap_park_until(ctx, atap_now() + ATAP_MS((uintptr_t)arg)) == 0 ? ATAP_PARKED : -1;
}

static int trace_waiter(atap_ctx *ctx, void *arg, void *out)
{
    atap_task c;
    int rc;

    (void)ctx, (void)arg, (void)out;
    if ((rc = atap_spawn(&c, trace_napper_for, (void *)(uintptr_t)20, NULL)) != 0)
        return rc;
    rc = atap_join(c, NULL, 0);
    atap_release(c);
    return rc;
}

static void test_trace_aside(void **state)
{
    char path[256];
    atap_task t;
    struct jval *doc, *evs;
    struct atap_pool_stats st;

    (void)state;
    temp_path(path, sizeof path);
    assert_int_equal(atap_init(NULL), 0);
    assert_int_equal(atap_trace_start(path), 0);
    assert_int_equal(atap_spawn(&t, trace_waiter, NULL, NULL), 0);
    assert_int_equal(atap_join(t, NULL, 0), 0);
    atap_release(t);
    assert_int_equal(atap_pool_stats(&st), 0);
    assert_true(st.peak_aside >= 1);
    assert_int_equal(atap_trace_stop(), 0);
    assert_non_null(doc = jload(path));
    assert_non_null(evs = jget(doc, "traceEvents"));
    assert_true(count_events(evs, "i", "stack set aside", NULL, NULL) >= 1);
    assert_int_equal(count_events(evs, "i", "stack goes on", NULL, NULL),
                     count_events(evs, "i", "stack set aside", NULL, NULL));
    assert_true(lanes_nest(evs));
    jfree(doc);
    trace_checked(path);
    assert_int_equal(atap_shutdown(), 0);
    unlink(path);
}

/* Two waiters on one worker, their stacks set aside in turn and going on
 * in the other order (the first's child naps 20 ms, the second's 80): the
 * thread's lane shows each waiter's run cut where its stack went aside
 * (an end that says so) and begun again where it went on, and each run's
 * last end carries its result: no end is lost to the other stack's runs. */

int trace_interleaved_waiter(atap_ctx *ctx, void *arg, void *out); /* named in the trace */

int trace_interleaved_waiter(atap_ctx *ctx, void *arg, void *out)
{
    atap_task c;
    int rc;

    (void)ctx, (void)out;
    if ((rc = atap_spawn(&c, trace_napper_for, arg, NULL)) != 0)
        return rc;
    rc = atap_join(c, NULL, 0);
    atap_release(c);
    return rc;
}

static void test_trace_aside_interleaved(void **state)
{
    char path[256];
    atap_task w[2];
    struct jval *doc, *evs;
    size_t begins = 0, cut = 0, ended = 0, lost = 0;

    (void)state;
    temp_path(path, sizeof path);
    assert_int_equal(atap_init(&(atap_config){.size = sizeof(atap_config), .workers = 1}), 0);
    assert_int_equal(atap_trace_start(path), 0);
    assert_int_equal(atap_spawn(&w[0], trace_interleaved_waiter, (void *)(uintptr_t)20, NULL), 0);
    assert_int_equal(atap_spawn(&w[1], trace_interleaved_waiter, (void *)(uintptr_t)80, NULL), 0);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(atap_join(w[i], NULL, 0), 0);
        atap_release(w[i]);
    }
    assert_int_equal(atap_trace_stop(), 0);
    assert_non_null(doc = jload(path));
    assert_non_null(evs = jget(doc, "traceEvents"));
    for (size_t i = 0; i < evs->n; i++) {
        const struct jval *e = evs->items[i], *args = jget(e, "args");

        if (!jis(e, "name", "trace_interleaved_waiter"))
            continue;
        if (jis(e, "ph", "B"))
            begins++;
        else if (jis(e, "ph", "E") && jis(args, "end", "set aside"))
            cut++;
        else if (jis(e, "ph", "E") && jget(args, "rc"))
            ended++;
        else if (jis(e, "ph", "E"))
            lost++;
    }
    assert_int_equal(ended, 2);
    assert_int_equal(lost, 0);
    assert_true(cut >= 2);
    assert_int_equal(begins, ended + cut);
    assert_true(lanes_nest(evs));
    jfree(doc);
    trace_checked(path);
    assert_int_equal(atap_shutdown(), 0);
    unlink(path);
}

/* Enough events to fill many chunks while the writer writes: every run is
 * in the file, unless events were dropped, and then the count says so. */
static void test_trace_many(void **state)
{
    char path[256];
    size_t n = scaled(20000, 2000), runs, dropped = 0;
    atap_task *ts = calloc(n, sizeof *ts);
    struct jval *doc, *evs;
    long v;

    (void)state;
    temp_path(path, sizeof path);
    assert_int_equal(atap_init(&(atap_config){.size = sizeof(atap_config), .workers = 2}), 0);
    assert_int_equal(atap_trace_start(path), 0);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(atap_spawn(&ts[i], trace_child, (void *)(intptr_t)i,
                                    &(atap_spawn_opts){.out_size = sizeof(long)}),
                         0);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(atap_join(ts[i], &v, sizeof v), 0);
        atap_release(ts[i]);
    }
    assert_int_equal(atap_trace_stop(), 0);
    assert_int_equal(atap_shutdown(), 0);
    assert_non_null(doc = jload(path));
    evs = jget(doc, "traceEvents");
    runs = count_events(evs, "B", "trace_child", NULL, NULL);
    dropped = dropped_count(evs);
    if (dropped == 0)
        assert_int_equal(runs, n);
    else
        assert_true(runs < n);
    assert_true(lanes_nest(evs)); /* dropped events or not */
    jfree(doc);
    trace_checked(path);
    free(ts);
    unlink(path);
}

static void test_trace_errors(void **state)
{
    (void)state;
    assert_int_equal(atap_trace_start(NULL), ATAP_EINVAL);
    assert_int_equal(atap_trace_start(""), ATAP_EINVAL);
    assert_int_equal(atap_trace_start("/nonexistent-atap-dir/trace.json"), -ENOENT);
    assert_int_equal(atap_trace_stop(), ATAP_EINVAL);
    assert_non_null(atap_strerror(ATAP_EALREADY));
}

/* ATAP_TRACE: started by the init that starts the runtime, finished by the
 * shutdown that stops it; no runtime needed for a trace of its own. */
static void test_trace_env(void **state)
{
    char path[256], id[40];
    struct jval *doc;
    atap_task t;
    long v;

    (void)state;
    temp_path(path, sizeof path);
    setenv("ATAP_TRACE", path, 1);
    assert_int_equal(atap_init(NULL), 0);
    unsetenv("ATAP_TRACE");
    assert_int_equal(atap_trace_start(path), ATAP_EALREADY);
    assert_int_equal(atap_spawn(&t, trace_child, (void *)(intptr_t)7,
                                &(atap_spawn_opts){.out_size = sizeof(long)}),
                     0);
    assert_int_equal(atap_join(t, &v, sizeof v), 0);
    assert_int_equal(atap_shutdown(), 0);
    assert_int_equal(atap_trace_stop(), ATAP_EINVAL); /* the shutdown stopped it */
    assert_non_null(doc = jload(path));
    id_of(t, id, sizeof id);
    assert_int_equal(count_events(jget(doc, "traceEvents"), "B", "trace_child", id, NULL), 1);
    jfree(doc);
    atap_release(t);

    /* Unopenable: the runtime starts untraced, and atap_init_error says why
     * (as does a line on stderr). */
    setenv("ATAP_TRACE", "/nonexistent-atap-dir/trace.json", 1);
    assert_int_equal(atap_init(NULL), 0);
    unsetenv("ATAP_TRACE");
    assert_true(atap_initialised());
    assert_string_equal(atap_init_error(),
                        "ATAP_TRACE=/nonexistent-atap-dir/trace.json: not traced: "
                        "No such file or directory");
    assert_int_equal(atap_trace_stop(), ATAP_EINVAL); /* no trace runs */
    assert_int_equal(atap_spawn(&t, trace_child, (void *)(intptr_t)7,
                                &(atap_spawn_opts){.out_size = sizeof(long)}),
                     0);
    assert_int_equal(atap_join(t, &v, sizeof v), 0);
    atap_release(t);
    assert_int_equal(atap_shutdown(), 0);
    /* The next init that has nothing to say clears it. */
    assert_int_equal(atap_init(NULL), 0);
    assert_string_equal(atap_init_error(), "");
    assert_int_equal(atap_shutdown(), 0);
    unlink(path);
}

/* Holds its worker in a kernel wait until the program ends: a run still
 * open when the program exits. */
int trace_holder(atap_ctx *ctx, void *arg, void *out);
int trace_holder(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    (void)atap_sleep_relaxed(ATAP_SEC(60));
    return 0;
}

/* Set in a fork's child about to exit(): the handler main registers first
 * (so it runs after libatap's own exit handler, registered later) ends the
 * child there. What a fork's child inherits of its parent's runtime is
 * never freed (runtime.c), and LeakSanitizer's check at exit would call it
 * a leak. */
static volatile sig_atomic_t exiting_child;

static void end_exiting_child(void)
{
    if (exiting_child)
        _exit(0);
}

/* A program that exits without atap_shutdown (nor atap_trace_stop) leaves a
 * whole trace: what it recorded, and the run still under way closed. Run in
 * a fork's child, which exits with the runtime running. */
static void test_trace_exit_without_shutdown(void **state)
{
    char path[256];
    struct jval *doc, *evs;
    atap_task parent, holder;
    pid_t pid;

    (void)state;
    temp_path(path, sizeof path);
    if ((pid = fork()) == 0) {
        long v = 0;

        setenv("ATAP_TRACE", path, 1);
        if (atap_init(&(atap_config){.size = sizeof(atap_config), .workers = 2}) != 0)
            _exit(1);
        if (atap_spawn(&parent, trace_parent, NULL, &(atap_spawn_opts){.out_size = sizeof(long)}) !=
                0 ||
            atap_join(parent, &v, sizeof v) != 0 || v != 6)
            _exit(2);
        if (atap_spawn(&holder, trace_holder, NULL, NULL) != 0)
            _exit(3);
        while (atap_state_of(holder) != ATAP_RUNNING)
            sleep_ms(1);
        exiting_child = 1;
        exit(0); /* no atap_shutdown */
    }
    assert_true(pid > 0);
    child_passed(pid);
    assert_non_null(doc = jload(path));
    assert_non_null(evs = jget(doc, "traceEvents"));
    assert_int_equal(count_events(evs, "B", "trace_parent", NULL, NULL), 1);
    assert_int_equal(count_events(evs, "E", "trace_parent", NULL, NULL), 1);
    assert_int_equal(count_events(evs, "B", "trace_child", NULL, NULL), CHILDREN);
    assert_int_equal(count_events(evs, "B", "trace_holder", NULL, NULL), 1);
    assert_int_equal(count_events(evs, "E", "trace_holder", NULL, NULL), 1);
    assert_true(lane_named(evs, "atap-worker "));
    assert_true(lanes_nest(evs));
    assert_true(arrows_end(evs));
    jfree(doc);
    trace_checked(path);
    unlink(path);
}

/* The file is a whole trace after each of the writer's rounds, not only
 * once the trace stops: a program that ends without running its exit
 * handlers (_exit, here in a fork's child) leaves what the last round
 * wrote, a file the viewers open. The child fills its own buffer (one
 * spawn event each) so that a round has it to write. */
static void test_trace_whole_between_rounds(void **state)
{
    char path[256];
    struct jval *doc, *evs;
    pid_t pid;

    (void)state;
    temp_path(path, sizeof path);
    if ((pid = fork()) == 0) {
        atap_task t;
        long v;

        if (atap_init(&(atap_config){.size = sizeof(atap_config), .workers = 1}) != 0 ||
            atap_trace_start(path) != 0)
            _exit(1);
        for (int i = 0; i < 2100; i++) {
            if (atap_spawn(&t, trace_child, NULL, &(atap_spawn_opts){.out_size = sizeof(long)}) !=
                    0 ||
                atap_join(t, &v, sizeof v) != 0)
                _exit(2);
            atap_release(t);
        }
        sleep_ms(300); /* rounds every 20 ms */
        _exit(0);      /* no exit handler, no stop */
    }
    assert_true(pid > 0);
    child_passed(pid);
    assert_non_null(doc = jload(path));
    assert_non_null(evs = jget(doc, "traceEvents"));
    assert_true(count_events(evs, "X", "spawn", NULL, NULL) >= 2048);
    assert_true(lanes_nest(evs));
    jfree(doc);
    trace_checked(path);
    unlink(path);
}

/* A fork's child that starts a runtime with ATAP_TRACE still set writes
 * its own trace to path.PID, and the parent's file stays whole, with the
 * parent's runs from before the fork and after it. */
static void test_trace_fork(void **state)
{
    char path[256], child_path[300], id[40];
    struct jval *doc, *evs;
    atap_task before, after;
    pid_t pid;
    long v;

    (void)state;
    temp_path(path, sizeof path);
    setenv("ATAP_TRACE", path, 1);
    assert_int_equal(atap_init(&(atap_config){.size = sizeof(atap_config), .workers = 2}), 0);
    assert_int_equal(atap_spawn(&before, trace_child, (void *)(intptr_t)1,
                                &(atap_spawn_opts){.out_size = sizeof(long)}),
                     0);
    assert_int_equal(atap_join(before, &v, sizeof v), 0);
    if ((pid = fork()) == 0) {
        atap_task t;

#if defined(TEST_TSAN) || defined(TEST_ASAN)
        /* TSan cannot start threads in the child of a multithreaded fork
         * (test_lifecycle says more), and ASan's allocator may be left
         * locked by a parent's thread (seen: the child's new threads
         * waiting in it for good): the child starts no runtime. The plain
         * build runs the whole test. */
        _exit(0);
#endif
        if (atap_init(NULL) != 0)
            _exit(1);
        if (atap_spawn(&t, trace_given, NULL, &(atap_spawn_opts){.out_size = sizeof(long)}) != 0 ||
            atap_join(t, &v, sizeof v) != 0)
            _exit(2);
        atap_release(t);
        if (atap_shutdown() != 0)
            _exit(3);
        _exit(0);
    }
    assert_true(pid > 0);
    unsetenv("ATAP_TRACE");
    child_passed(pid);
    assert_int_equal(atap_spawn(&after, trace_child, (void *)(intptr_t)2,
                                &(atap_spawn_opts){.out_size = sizeof(long)}),
                     0);
    assert_int_equal(atap_join(after, &v, sizeof v), 0);
    assert_int_equal(atap_shutdown(), 0);

    assert_non_null(doc = jload(path));
    assert_non_null(evs = jget(doc, "traceEvents"));
    id_of(before, id, sizeof id);
    assert_int_equal(count_events(evs, "B", "trace_child", id, NULL), 1);
    id_of(after, id, sizeof id);
    assert_int_equal(count_events(evs, "B", "trace_child", id, NULL), 1);
    assert_int_equal(count_events(evs, "B", "trace_given", NULL, NULL), 0);
    assert_true(lanes_nest(evs));
    jfree(doc);
    trace_checked(path);

    snprintf(child_path, sizeof child_path, "%s.%d", path, (int)pid);
#if defined(TEST_TSAN) || defined(TEST_ASAN)
    print_message(
        "sanitizer: the child started no trace (no threads after a multithreaded fork)\n");
    atap_release(before);
    atap_release(after);
    unlink(path);
    return;
#endif
    assert_non_null(doc = jload(child_path));
    assert_non_null(evs = jget(doc, "traceEvents"));
    assert_int_equal(count_events(evs, "B", "trace_given", NULL, NULL), 1);
    assert_int_equal(count_events(evs, "B", "trace_child", NULL, NULL), 0);
    jfree(doc);
    trace_checked(child_path);
    atap_release(before);
    atap_release(after);
    unlink(child_path);
    unlink(path);
}

/* Drops its run's own end: every event from here is dropped, as when the
 * trace's buffers are full. */
int trace_dropper(atap_ctx *ctx, void *arg, void *out);
int trace_dropper(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    atap__test_trace_drop(true);
    return 0;
}

/* Events dropped (a run's end among them): every slice in the file is
 * still closed, named as it began, and the count says how many went. */
static void test_trace_dropped(void **state)
{
    char path[256];
    struct jval *doc, *evs;
    atap_task t, more[4];
    long v;

    (void)state;
    temp_path(path, sizeof path);
    assert_int_equal(atap_init(&(atap_config){.size = sizeof(atap_config), .workers = 1}), 0);
    assert_int_equal(atap_trace_start(path), 0);
    assert_int_equal(atap_spawn(&t, trace_dropper, NULL, NULL), 0);
    assert_int_equal(atap_join(t, NULL, 0), 0);
    atap__test_trace_drop(false);
    atap_release(t);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(atap_spawn(&more[i], trace_child, (void *)(intptr_t)i,
                                    &(atap_spawn_opts){.out_size = sizeof(long)}),
                         0);
        assert_int_equal(atap_join(more[i], &v, sizeof v), 0);
        atap_release(more[i]);
    }
    assert_int_equal(atap_trace_stop(), 0);
    assert_non_null(doc = jload(path));
    assert_non_null(evs = jget(doc, "traceEvents"));
    assert_true(dropped_count(evs) >= 1);
    assert_int_equal(count_events(evs, "B", "trace_dropper", NULL, NULL), 1);
    assert_int_equal(count_events(evs, "E", "trace_dropper", NULL, NULL), 1);
    assert_int_equal(count_events(evs, "B", "trace_child", NULL, NULL), 4);
    assert_int_equal(count_events(evs, "E", "trace_child", NULL, NULL), 4);
    assert_true(lanes_nest(evs));
    jfree(doc);
    trace_checked(path);
    assert_int_equal(atap_shutdown(), 0);
    unlink(path);
}

/* atap_trace_name: a function's runs under the name given, then (the name
 * forgotten) under dladdr's again. */
static void test_trace_given_name(void **state)
{
    char path[256];
    struct jval *doc, *evs;
    atap_task t;
    long v;

    (void)state;
    temp_path(path, sizeof path);
    assert_int_equal(atap_trace_name(NULL, "x"), ATAP_EINVAL);
    assert_int_equal(atap_init(NULL), 0);
    assert_int_equal(atap_trace_name(trace_child, "child \"renamed\""), 0);
    assert_int_equal(atap_trace_start(path), 0);
    assert_int_equal(
        atap_spawn(&t, trace_child, NULL, &(atap_spawn_opts){.out_size = sizeof(long)}), 0);
    assert_int_equal(atap_join(t, &v, sizeof v), 0);
    atap_release(t);
    assert_int_equal(atap_trace_stop(), 0);
    assert_non_null(doc = jload(path));
    assert_non_null(evs = jget(doc, "traceEvents"));
    assert_int_equal(count_events(evs, "B", "child \"renamed\"", NULL, NULL), 1);
    assert_int_equal(count_events(evs, "E", "child \"renamed\"", NULL, NULL), 1);
    jfree(doc);
    trace_checked(path);

    assert_int_equal(atap_trace_name(trace_child, NULL), 0);
    assert_int_equal(atap_trace_start(path), 0);
    assert_int_equal(
        atap_spawn(&t, trace_child, NULL, &(atap_spawn_opts){.out_size = sizeof(long)}), 0);
    assert_int_equal(atap_join(t, &v, sizeof v), 0);
    atap_release(t);
    assert_int_equal(atap_trace_stop(), 0);
    assert_non_null(doc = jload(path));
    assert_int_equal(count_events(jget(doc, "traceEvents"), "B", "trace_child", NULL, NULL), 1);
    jfree(doc);
    assert_int_equal(atap_shutdown(), 0);
    unlink(path);
}

static int ensure_stopped(void **state)
{
    (void)state;
    unsetenv("ATAP_TRACE");
    atap__test_trace_drop(false);
    (void)atap_trace_stop();
    return atap_shutdown() == 0 && !atap_initialised() ? 0 : -1;
}

int main(void)
{
    atexit(end_exiting_child);
    unsetenv("ATAP_TRACE");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_trace_errors, ensure_stopped),
        cmocka_unit_test_teardown(test_trace_known_program, ensure_stopped),
        cmocka_unit_test_teardown(test_trace_aside, ensure_stopped),
        cmocka_unit_test_teardown(test_trace_aside_interleaved, ensure_stopped),
        cmocka_unit_test_teardown(test_trace_env, ensure_stopped),
        cmocka_unit_test_teardown(test_trace_many, ensure_stopped),
        cmocka_unit_test_teardown(test_trace_exit_without_shutdown, ensure_stopped),
        cmocka_unit_test_teardown(test_trace_whole_between_rounds, ensure_stopped),
        cmocka_unit_test_teardown(test_trace_fork, ensure_stopped),
        cmocka_unit_test_teardown(test_trace_dropped, ensure_stopped),
        cmocka_unit_test_teardown(test_trace_given_name, ensure_stopped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
