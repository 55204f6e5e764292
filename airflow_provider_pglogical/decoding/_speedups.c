/* Optional compiled helpers of the drain's fetch and of the assembler's per-row path.
 *
 * The fetch reads `COPY (SELECT lsn, xid, data FROM pg_logical_slot_peek_binary_changes(...)) TO STDOUT
 * (FORMAT binary)` and snapshot COPYs on a libpq connection of this module's own, and splits them into
 * the (lsn, xid, data) rows the assembler takes.
 *
 * Why: psycopg2's named cursor fetches text: every bytea arrives hex-encoded (twice the bytes) and
 * is decoded, and every row becomes a tuple of parsed ints and a memoryview, ~2 µs a row. Binary COPY
 * sends the message bytes as they are; here the socket reads run without the GIL, a chunk of rows at
 * a time, and a row costs three small object allocations.
 *
 * libpq is linked (setup.py: pg_config's include and lib directories; a release wheel carries its own
 * copy, vendored by auditwheel) and its connections are opened here (pq_connect): a PGconn may only be
 * handled by the libpq that made it, so this module never touches a connection of psycopg2's, whose
 * libpq may be another build (psycopg2-binary bundles its own). Built without libpq headers
 * (PGLOGICAL_LIBPQ undefined), the module has the parsers and the assembler's helpers but no
 * connection functions, and the fetch takes the named cursor. The pure-Python path (hooks.slot_client:
 * named cursor) stays the reference and the fallback when this module is not built.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#ifdef PGLOGICAL_LIBPQ
#include <errno.h>
#include <poll.h>
#include <sys/time.h>
#include <libpq-fe.h>
#endif
/* Growable byte buffer filled without the GIL. */
typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Buf;

#ifdef PGLOGICAL_LIBPQ
static int
buf_add(Buf *b, const char *src, Py_ssize_t n)
{
    if (b->len + n > b->cap) {
        Py_ssize_t cap = b->cap ? b->cap : (1 << 20);
        while (cap < b->len + n)
            cap *= 2;
        char *d = PyMem_RawRealloc(b->data, cap);
        if (d == NULL)
            return -1;
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, src, n);
    b->len += n;
    return 0;
}
#endif

static const char SIGNATURE[11] = "PGCOPY\n\377\r\n";

static inline uint16_t be16(const unsigned char *p) { return (uint16_t)((p[0] << 8) | p[1]); }
static inline uint32_t be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}
static inline uint64_t be64(const unsigned char *p) { return ((uint64_t)be32(p) << 32) | be32(p + 4); }

/* Parse binary COPY rows of (bigint, bigint, bytea) from data[0:len] into `out` (a list); `*pos` is
 * the cursor. Returns 1 at the trailer, 0 when the input is used up, -1 with an exception set. */
static int
parse_rows(const unsigned char *data, Py_ssize_t len, Py_ssize_t *pos, int header, PyObject *out)
{
    Py_ssize_t p = *pos;
    if (header) {
        if (len - p < 19 || memcmp(data + p, SIGNATURE, 11) != 0) {
            PyErr_SetString(PyExc_ValueError, "binary COPY stream without its signature");
            return -1;
        }
        uint32_t ext = be32(data + p + 15);
        if ((Py_ssize_t)ext > len - p - 19) {
            PyErr_SetString(PyExc_ValueError, "truncated binary COPY header");
            return -1;
        }
        p += 19 + ext;
    }
    while (p < len) {
        if (len - p < 2)
            goto truncated;
        int16_t nf = (int16_t)be16(data + p);
        if (nf == -1) {
            *pos = p + 2;
            return 1;
        }
        if (nf != 3) {
            PyErr_Format(PyExc_ValueError, "binary COPY row with %d fields, expected 3", (int)nf);
            return -1;
        }
        /* lsn and xid: Int32 8 + Int64 each; data: Int32 length + bytes */
        if (len - p < 2 + 12 + 12 + 4)
            goto truncated;
        const unsigned char *q = data + p + 2;
        if ((int32_t)be32(q) != 8 || (int32_t)be32(q + 12) != 8) {
            PyErr_SetString(PyExc_ValueError, "binary COPY row whose lsn or xid is not a non-null bigint");
            return -1;
        }
        int64_t lsn = (int64_t)be64(q + 4);
        int64_t xid = (int64_t)be64(q + 16);
        int32_t n = (int32_t)be32(q + 24);
        if (n < 0) {
            PyErr_SetString(PyExc_ValueError, "binary COPY row with a null data field");
            return -1;
        }
        if ((Py_ssize_t)n > len - p - 30)
            goto truncated;
        PyObject *row = PyTuple_New(3);
        if (row == NULL)
            return -1;
        PyObject *a = PyLong_FromLongLong(lsn), *b = PyLong_FromLongLong(xid);
        PyObject *c = PyBytes_FromStringAndSize((const char *)q + 28, n);
        PyTuple_SET_ITEM(row, 0, a);
        PyTuple_SET_ITEM(row, 1, b);
        PyTuple_SET_ITEM(row, 2, c);
        if (a == NULL || b == NULL || c == NULL || PyList_Append(out, row) < 0) {
            Py_DECREF(row);
            return -1;
        }
        Py_DECREF(row);
        p += 30 + n;
    }
    *pos = p;
    return 0;
truncated:
    PyErr_Format(PyExc_ValueError, "binary COPY row truncated at offset %zd", p);
    return -1;
}

#ifdef PGLOGICAL_LIBPQ
/* A connection travels to Python as a capsule: only pointers made by pq_connect are accepted, and one
 * that is garbage collected unclosed is finished. pq_finish renames it so it cannot be used again. */
static const char CONN_NAME[] = "airflow_provider_pglogical.PGconn";
static const char CLOSED_NAME[] = "airflow_provider_pglogical.PGconn.closed";

static void
conn_destructor(PyObject *capsule)
{
    const char *name = PyCapsule_GetName(capsule);
    if (name != NULL && strcmp(name, CONN_NAME) == 0)
        PQfinish((PGconn *)PyCapsule_GetPointer(capsule, CONN_NAME));
}

/* pq_connect(keywords, values) -> connection: a blocking PQconnectdbParams without the GIL; OSError with
 * libpq's message when it fails (it names host and port, never a password). */
static PyObject *
pq_connect(PyObject *self, PyObject *args)
{
    PyObject *keys, *values;
    if (!PyArg_ParseTuple(args, "O!O!", &PyTuple_Type, &keys, &PyTuple_Type, &values))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(keys);
    if (PyTuple_GET_SIZE(values) != n) {
        PyErr_SetString(PyExc_ValueError, "keywords and values differ in length");
        return NULL;
    }
    const char **kw = PyMem_Calloc(n + 1, sizeof(char *));
    const char **val = PyMem_Calloc(n + 1, sizeof(char *));
    if (kw == NULL || val == NULL) {
        PyMem_Free(kw);
        PyMem_Free(val);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        kw[i] = PyUnicode_AsUTF8(PyTuple_GET_ITEM(keys, i));
        val[i] = kw[i] ? PyUnicode_AsUTF8(PyTuple_GET_ITEM(values, i)) : NULL;
        if (val[i] == NULL) {
            PyMem_Free(kw);
            PyMem_Free(val);
            return NULL;
        }
    }
    PGconn *conn;
    Py_BEGIN_ALLOW_THREADS
    conn = PQconnectdbParams(kw, val, 0);
    Py_END_ALLOW_THREADS
    PyMem_Free(kw);
    PyMem_Free(val);
    if (conn == NULL)
        return PyErr_NoMemory();
    if (PQstatus(conn) != CONNECTION_OK) {
        PyErr_Format(PyExc_OSError, "%s", PQerrorMessage(conn));
        PQfinish(conn);
        return NULL;
    }
    PyObject *capsule = PyCapsule_New(conn, CONN_NAME, conn_destructor);
    if (capsule == NULL)
        PQfinish(conn);
    return capsule;
}

/* pq_options() -> the connection keywords this libpq knows, with their defaults ("" for none). */
static PyObject *
pq_options(PyObject *self, PyObject *noargs)
{
    PQconninfoOption *opts = PQconndefaults();
    if (opts == NULL)
        return PyErr_NoMemory();
    PyObject *out = PyDict_New();
    for (PQconninfoOption *o = opts; out != NULL && o->keyword != NULL; o++) {
        PyObject *v = PyUnicode_DecodeUTF8(o->compiled ? o->compiled : "", o->compiled ? strlen(o->compiled) : 0,
                                           "replace");
        if (v == NULL || PyDict_SetItemString(out, o->keyword, v) < 0)
            Py_CLEAR(out);
        Py_XDECREF(v);
    }
    PQconninfoFree(opts);
    return out;
}

/* pq_lib_version() -> PQlibVersion(), e.g. 150018 */
static PyObject *
pq_lib_version(PyObject *self, PyObject *noargs)
{
    return PyLong_FromLong(PQlibVersion());
}

/* pq_finish(connection): close it now (idempotent). */
static PyObject *
pq_finish(PyObject *self, PyObject *capsule)
{
    if (!PyCapsule_IsValid(capsule, CONN_NAME))
        Py_RETURN_NONE;
    PGconn *conn = (PGconn *)PyCapsule_GetPointer(capsule, CONN_NAME);
    if (PyCapsule_SetName(capsule, CLOSED_NAME) < 0)
        return NULL;
    PQfinish(conn);
    Py_RETURN_NONE;
}

static PGconn *
conn_arg(PyObject *capsule)
{
    return (PGconn *)PyCapsule_GetPointer(capsule, CONN_NAME);
}

/* pq_backend_pid(connection) -> the server process serving it (PQbackendPID). */
static PyObject *
pq_backend_pid(PyObject *self, PyObject *capsule)
{
    PGconn *conn = conn_arg(capsule);
    if (conn == NULL)
        return NULL;
    return PyLong_FromLong(PQbackendPID(conn));
}

/* (sqlstate, message) of a failure: the message decoded with replacement, as a server in another encoding
 * (or a message cut at a buffer's end) may send bytes that are not UTF-8. */
static PyObject *
error_pair(const char *sqlstate, const char *message)
{
    PyObject *text = PyUnicode_DecodeUTF8(message, (Py_ssize_t)strlen(message), "replace");
    if (text == NULL)
        return NULL;
    return Py_BuildValue("(sN)", sqlstate, text);
}

/* Drain the remaining results of the current command; returns (sqlstate, message) of the first
 * error result, or None. Called without the GIL for the waits. */
static PyObject *
finish_results(PGconn *conn)
{
    char sqlstate[8] = "";
    char message[1024] = "";
    int failed = 0;
    PGresult *res;
    for (;;) {
        Py_BEGIN_ALLOW_THREADS
        res = PQgetResult(conn);
        Py_END_ALLOW_THREADS
        if (res == NULL)
            break;
        int st = PQresultStatus(res);
        if (!failed && st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK && st != PGRES_COPY_OUT) {
            failed = 1;
            const char *code = PQresultErrorField(res, PG_DIAG_SQLSTATE);
            snprintf(sqlstate, sizeof sqlstate, "%s", code ? code : "");
            snprintf(message, sizeof message, "%s", PQresultErrorMessage(res));
        }
        PQclear(res);
    }
    if (!failed)
        Py_RETURN_NONE;
    return error_pair(sqlstate, message);
}

static PyObject *
copy_start(PyObject *self, PyObject *args)
{
    PyObject *ptr;
    const char *sql;
    if (!PyArg_ParseTuple(args, "Oy", &ptr, &sql))
        return NULL;
    PGconn *conn = conn_arg(ptr);
    if (conn == NULL)
        return NULL;
    int sent;
    PGresult *res;
    Py_BEGIN_ALLOW_THREADS
    sent = PQsendQuery(conn, sql);
    res = sent ? PQgetResult(conn) : NULL;
    Py_END_ALLOW_THREADS
    if (!sent)
        return error_pair("", PQerrorMessage(conn));
    if (res != NULL && (PQresultStatus(res) == PGRES_COPY_OUT || PQresultStatus(res) == PGRES_COPY_BOTH)) {
        PQclear(res);
        Py_RETURN_NONE;
    }
    PyObject *err;
    if (res == NULL) {
        err = error_pair("", PQerrorMessage(conn));
    } else {
        const char *code = PQresultErrorField(res, PG_DIAG_SQLSTATE);
        err = error_pair(code ? code : "", PQresultErrorMessage(res));
        PQclear(res);
    }
    PyObject *rest = finish_results(conn);
    Py_XDECREF(rest);
    return err;
}

/* pq_exec(connection, sql) -> None, or (sqlstate, message) of the first failing statement; results are
 * discarded (for BEGIN, SET and the like before a COPY). */
static PyObject *
pq_exec(PyObject *self, PyObject *args)
{
    PyObject *capsule;
    const char *sql;
    if (!PyArg_ParseTuple(args, "Oy", &capsule, &sql))
        return NULL;
    PGconn *conn = conn_arg(capsule);
    if (conn == NULL)
        return NULL;
    int sent;
    Py_BEGIN_ALLOW_THREADS
    sent = PQsendQuery(conn, sql);
    Py_END_ALLOW_THREADS
    if (!sent)
        return error_pair("", PQerrorMessage(conn));
    return finish_results(conn);
}


/* Reads CopyData messages into b (their lengths into sizes as native int64s, when given) until max_rows
 * of them or b holds at least max_bytes (checked before each read). Call without the GIL. Returns the last
 * PQgetCopyData result: > 0 when a limit stopped the reading, -1 at the COPY's end, -2 on failure; *oom
 * when memory ran out. */
static int
read_messages(PGconn *conn, Py_ssize_t max_rows, Py_ssize_t max_bytes, Buf *b, Buf *sizes, int *oom)
{
    int n = 1;
    for (Py_ssize_t got = 0; got < max_rows && b->len < max_bytes; got++) {
        char *msg = NULL;
        n = PQgetCopyData(conn, &msg, 0);
        if (n <= 0)
            break;
        int64_t len = n;
        *oom = buf_add(b, msg, n) < 0 || (sizes != NULL && buf_add(sizes, (const char *)&len, sizeof len) < 0);
        PQfreemem(msg);
        if (*oom)
            break;
    }
    return n;
}

/* The outcome of a COPY whose PQgetCopyData returned n <= 0 (-1: ended, -2: failed): its results consumed,
 * (sqlstate, message) of its error or None; NULL with an exception set. */
static PyObject *
copy_outcome(PGconn *conn, int n)
{
    if (n != -2)
        return finish_results(conn);
    PyObject *err = error_pair("", PQerrorMessage(conn));
    PyObject *rest = finish_results(conn);
    Py_XDECREF(rest);
    return err;
}

/* copy_rows(pgconn, max_rows, first) -> (rows, done, error)
 * Reads up to max_rows CopyData messages (one row each) without the GIL, then splits them.
 * done: the COPY has ended (its results are consumed); error: (sqlstate, message) or None. */
static PyObject *
copy_rows(PyObject *self, PyObject *args)
{
    PyObject *ptr;
    Py_ssize_t max_rows;
    int first;
    if (!PyArg_ParseTuple(args, "Onp", &ptr, &max_rows, &first))
        return NULL;
    PGconn *conn = conn_arg(ptr);
    if (conn == NULL)
        return NULL;
    Buf b = {NULL, 0, 0};
    int n, oom = 0;
    Py_BEGIN_ALLOW_THREADS
    n = read_messages(conn, max_rows, PY_SSIZE_T_MAX, &b, NULL, &oom);
    Py_END_ALLOW_THREADS
    if (oom) {
        PyMem_RawFree(b.data);
        return PyErr_NoMemory();
    }
    PyObject *rows = PyList_New(0);
    if (rows == NULL) {
        PyMem_RawFree(b.data);
        return NULL;
    }
    Py_ssize_t pos = 0;
    int r = b.len ? parse_rows((const unsigned char *)b.data, b.len, &pos, first, rows) : 0;
    PyMem_RawFree(b.data);
    if (r < 0) {
        Py_DECREF(rows);
        return NULL;
    }
    if (n > 0)
        return Py_BuildValue("(NOO)", rows, Py_False, Py_None);
    PyObject *err = copy_outcome(conn, n);
    if (err == NULL) {
        Py_DECREF(rows);
        return NULL;
    }
    return Py_BuildValue("(NON)", rows, Py_True, err);
}

/* copy_messages(pgconn, max_rows, max_bytes) -> (data, sizes, done, error)
 * Reads CopyData messages without the GIL until max_rows of them or at least max_bytes bytes (checked
 * before each read, so the message that reaches it is the last one): their bytes back to back and each
 * one's length as native int64s. For any COPY TO: the caller frames the rows. done/error as copy_rows. */
static PyObject *
copy_messages(PyObject *self, PyObject *args)
{
    PyObject *ptr;
    Py_ssize_t max_rows, max_bytes;
    if (!PyArg_ParseTuple(args, "Onn", &ptr, &max_rows, &max_bytes))
        return NULL;
    PGconn *conn = conn_arg(ptr);
    if (conn == NULL)
        return NULL;
    Buf b = {NULL, 0, 0}, sz = {NULL, 0, 0};
    int n, oom = 0;
    Py_BEGIN_ALLOW_THREADS
    n = read_messages(conn, max_rows, max_bytes, &b, &sz, &oom);
    Py_END_ALLOW_THREADS
    PyObject *data = oom ? NULL : PyBytes_FromStringAndSize(b.data ? b.data : "", b.len);
    PyObject *sizes = oom ? NULL : PyBytes_FromStringAndSize(sz.data ? sz.data : "", sz.len);
    PyMem_RawFree(b.data);
    PyMem_RawFree(sz.data);
    if (data == NULL || sizes == NULL) {
        Py_XDECREF(data);
        Py_XDECREF(sizes);
        return oom ? PyErr_NoMemory() : NULL;
    }
    if (n > 0)
        return Py_BuildValue("(NNOO)", data, sizes, Py_False, Py_None);
    PyObject *err = copy_outcome(conn, n);
    if (err == NULL) {
        Py_DECREF(data);
        Py_DECREF(sizes);
        return NULL;
    }
    return Py_BuildValue("(NNON)", data, sizes, Py_True, err);
}

/* copy_cancel(pgconn): ask the server to cancel the running COPY, discard what is still coming
 * and consume the results, so the connection is idle again. */
static PyObject *
copy_cancel(PyObject *self, PyObject *args)
{
    PyObject *ptr;
    if (!PyArg_ParseTuple(args, "O", &ptr))
        return NULL;
    PGconn *conn = conn_arg(ptr);
    if (conn == NULL)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    PGcancel *c = PQgetCancel(conn);
    if (c != NULL) {
        char errbuf[256];
        PQcancel(c, errbuf, sizeof errbuf);
        PQfreeCancel(c);
    }
    for (;;) {
        char *msg = NULL;
        int n = PQgetCopyData(conn, &msg, 0);
        if (n <= 0)
            break;
        PQfreemem(msg);
    }
    Py_END_ALLOW_THREADS
    PyObject *rest = finish_results(conn);
    Py_XDECREF(rest);
    Py_RETURN_NONE;
}

/* ---- the streamed read: a logical replication connection in COPY BOTH mode -------------------
 * START_REPLICATION ... LOGICAL sends 'w' XLogData (dataStart, walEnd, sendTime, then one pgoutput message)
 * and 'k' keepalives (walEnd, sendTime, replyRequested). dataStart is the `lsn` column of the SQL peek.
 * A read is bounded like the peek's upto_lsn: a transaction whose commit starts at or after `bound` (its
 * Begin's final LSN) is not taken; with no transaction open, a commit or a message ending at or after
 * `bound` (taken), or a keepalive whose walEnd reaches it (the walsender has decoded that far), ends the
 * read. A message outside a transaction carries its record's end, not its start: one ending past the bound
 * may start before it (the peek takes it then), so it is taken, which loses nothing (no commit lies between
 * the bound and it, or its Begin would have come first) and ends the batch at its end. repl_step holds that rule for both repl_read and repl_split (the
 * tests' entry, checked against the Python reference in hooks.replication). */
enum { STEP_TAKE = 0, STEP_SKIP = 1, STEP_KEEPALIVE = 2, STEP_BOUND = 3, STEP_BAD = 4 };

static int
repl_step(const unsigned char *m, Py_ssize_t n, uint64_t bound, int *in_tx, uint64_t *lsn, int *reply)
{
    if (n >= 18 && m[0] == 'k') {
        *reply = m[17];
        return (!*in_tx && be64(m + 1) >= bound) ? STEP_BOUND : STEP_KEEPALIVE;
    }
    if (n < 26 || m[0] != 'w')
        return STEP_BAD;
    const unsigned char *p = m + 25;
    *lsn = be64(m + 1);
    if (!*in_tx) {
        if (p[0] == 'B') {
            if (n < 25 + 9 || be64(p + 1) >= bound)
                return n < 25 + 9 ? STEP_BAD : STEP_BOUND;
            *in_tx = 1;
            return STEP_TAKE;
        }
        return STEP_TAKE;  /* a message: the caller ends the read after it when its end reaches the bound */
    }
    if (p[0] == 'C') {
        *in_tx = 0;
        return STEP_TAKE;  /* the caller ends the read after it when its end (lsn) reaches the bound */
    }
    return STEP_TAKE;
}

static PyObject *
repl_row(const char *m, Py_ssize_t n, uint64_t lsn)
{
    return Py_BuildValue("(KiN)", (unsigned long long)lsn, 0, PyBytes_FromStringAndSize(m + 25, n - 25));
}

/* The standby status update: write = flush = apply = lsn (nothing past what the caller has made durable). */
static int
repl_send_status(PGconn *conn, uint64_t lsn, int reply)
{
    unsigned char msg[34];
    struct timeval tv;
    gettimeofday(&tv, NULL);
    /* microseconds since 2000-01-01, the server's epoch */
    uint64_t now = ((uint64_t)tv.tv_sec - 946684800ULL) * 1000000ULL + (uint64_t)tv.tv_usec;
    uint64_t v[4] = {lsn, lsn, lsn, now};
    msg[0] = 'r';
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < 8; i++)
            msg[1 + 8 * k + i] = (unsigned char)(v[k] >> (56 - 8 * i));
    msg[33] = (unsigned char)(reply != 0);
    if (PQputCopyData(conn, (const char *)msg, sizeof msg) != 1)
        return -1;
    return PQflush(conn) == 0 ? 0 : -1;
}

/* One CopyData message, waiting at most timeout_ms for it: > 0 its length, 0 nothing arrived in time,
 * -1 the COPY ended, -2 failure. Call without the GIL. */
static int
repl_get(PGconn *conn, char **msg, int timeout_ms)
{
    for (;;) {
        int n = PQgetCopyData(conn, msg, 1);
        if (n != 0)
            return n;
        struct pollfd fd = {PQsocket(conn), POLLIN, 0};
        int r = poll(&fd, 1, timeout_ms);
        if (r == 0 || (r < 0 && errno == EINTR))
            return 0;
        if (r < 0 || !PQconsumeInput(conn))
            return -2;
    }
}

/* repl_read(pgconn, max_rows, bound, in_tx, confirmed, timeout_ms) -> (rows, in_tx, state, error)
 * Reads XLogData without the GIL until max_rows rows are taken, the bound is reached (state 'bound'), nothing
 * arrives for timeout_ms ('idle': the caller asks the server for a keepalive) or the stream ends ('ended',
 * error set when it failed). Keepalives asking for a reply are answered with `confirmed`, the end of what is
 * published. rows: (dataStart, 0, message) as the peek's rows, xid unknown (0). */
static PyObject *
repl_read(PyObject *self, PyObject *args)
{
    PyObject *ptr;
    Py_ssize_t max_rows;
    unsigned long long bound, confirmed;
    int in_tx, timeout_ms;
    if (!PyArg_ParseTuple(args, "OnKpKi", &ptr, &max_rows, &bound, &in_tx, &confirmed, &timeout_ms))
        return NULL;
    PGconn *conn = conn_arg(ptr);
    if (conn == NULL)
        return NULL;
    Buf b = {NULL, 0, 0}, sz = {NULL, 0, 0};
    const char *state = "more";
    int n = 1, oom = 0, bad = 0, failed_reply = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t got = 0; got < max_rows;) {
        char *msg = NULL;
        n = repl_get(conn, &msg, timeout_ms);
        if (n == 0) {
            state = "idle";
            break;
        }
        if (n < 0) {
            state = "ended";
            break;
        }
        uint64_t lsn = 0;
        int reply = 0;
        int step = repl_step((const unsigned char *)msg, n, bound, &in_tx, &lsn, &reply);
        if (step == STEP_TAKE) {
            int64_t len = n;
            oom = buf_add(&b, msg, n) < 0 || buf_add(&sz, (const char *)&len, sizeof len) < 0;
            got++;
        }
        PQfreemem(msg);
        if (oom)
            break;
        if (step == STEP_BAD) {
            bad = 1;
            break;
        }
        if (reply && repl_send_status(conn, confirmed, 0) < 0) {
            failed_reply = 1;
            break;
        }
        if (step == STEP_BOUND || (step == STEP_TAKE && !in_tx && lsn >= bound)) {
            state = "bound";
            break;
        }
    }
    Py_END_ALLOW_THREADS
    if (oom) {
        PyMem_RawFree(b.data);
        PyMem_RawFree(sz.data);
        return PyErr_NoMemory();
    }
    PyObject *rows = PyList_New(0);
    const int64_t *sizes = (const int64_t *)sz.data;
    Py_ssize_t count = sz.len / (Py_ssize_t)sizeof(int64_t), pos = 0;
    for (Py_ssize_t i = 0; rows != NULL && i < count; i++) {
        const char *m = b.data + pos;
        PyObject *row = repl_row(m, (Py_ssize_t)sizes[i], be64((const unsigned char *)m + 1));
        if (row == NULL || PyList_Append(rows, row) < 0)
            Py_CLEAR(rows);
        Py_XDECREF(row);
        pos += (Py_ssize_t)sizes[i];
    }
    PyMem_RawFree(b.data);
    PyMem_RawFree(sz.data);
    if (rows == NULL)
        return NULL;
    PyObject *err = Py_None;
    Py_INCREF(err);
    if (bad || failed_reply) {
        Py_DECREF(err);
        state = "ended";
        err = error_pair("", bad ? "unexpected replication message" : PQerrorMessage(conn));
    } else if (n < 0) {
        Py_DECREF(err);
        err = copy_outcome(conn, n);
        if (err == NULL) {
            Py_DECREF(rows);
            return NULL;
        }
    }
    return Py_BuildValue("(NOsN)", rows, in_tx ? Py_True : Py_False, state, err);
}

/* repl_status(pgconn, lsn, reply) -> None, or an error message: a standby status update (see repl_send_status). */
static PyObject *
repl_status(PyObject *self, PyObject *args)
{
    PyObject *ptr;
    unsigned long long lsn;
    int reply, r;
    if (!PyArg_ParseTuple(args, "OKp", &ptr, &lsn, &reply))
        return NULL;
    PGconn *conn = conn_arg(ptr);
    if (conn == NULL)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    r = repl_send_status(conn, lsn, reply);
    Py_END_ALLOW_THREADS
    if (r == 0)
        Py_RETURN_NONE;
    return PyUnicode_DecodeUTF8(PQerrorMessage(conn), strlen(PQerrorMessage(conn)), "replace");
}

/* repl_split(messages, bound, in_tx) -> (rows, in_tx, state): repl_read's rule over a list of CopyData
 * messages (bytes) without a connection: state 'bound' where it stopped, 'keepalive' at a keepalive
 * (the read answers it and goes on), else 'more'. For the tests' comparison with the Python reference. */
static PyObject *
repl_split(PyObject *self, PyObject *args)
{
    PyObject *messages;
    unsigned long long bound;
    int in_tx;
    if (!PyArg_ParseTuple(args, "O!Kp", &PyList_Type, &messages, &bound, &in_tx))
        return NULL;
    PyObject *rows = PyList_New(0);
    const char *state = "more";
    for (Py_ssize_t i = 0; rows != NULL && i < PyList_GET_SIZE(messages); i++) {
        PyObject *item = PyList_GET_ITEM(messages, i);
        if (!PyBytes_Check(item)) {
            PyErr_SetString(PyExc_TypeError, "messages must be bytes");
            Py_CLEAR(rows);
            break;
        }
        const char *m = PyBytes_AS_STRING(item);
        Py_ssize_t n = PyBytes_GET_SIZE(item);
        uint64_t lsn = 0;
        int reply = 0;
        int step = repl_step((const unsigned char *)m, n, bound, &in_tx, &lsn, &reply);
        if (step == STEP_BAD) {
            PyErr_SetString(PyExc_ValueError, "unexpected replication message");
            Py_CLEAR(rows);
            break;
        }
        if (step == STEP_TAKE) {
            PyObject *row = repl_row(m, n, lsn);
            if (row == NULL || PyList_Append(rows, row) < 0)
                Py_CLEAR(rows);
            Py_XDECREF(row);
        }
        if (step == STEP_BOUND || (step == STEP_TAKE && !in_tx && lsn >= bound)) {
            state = "bound";
            break;
        }
        if (step == STEP_KEEPALIVE) {
            state = "keepalive";
            break;
        }
    }
    if (rows == NULL)
        return NULL;
    return Py_BuildValue("(NOs)", rows, in_tx ? Py_True : Py_False, state);
}
#endif /* PGLOGICAL_LIBPQ */

/* split_copy(data, header) -> (rows, end, trailer): the parser alone, for tests and for callers
 * holding a binary COPY stream already (e.g. psycopg2's copy_expert into a buffer). */
static PyObject *
split_copy(PyObject *self, PyObject *args)
{
    Py_buffer view;
    int header;
    if (!PyArg_ParseTuple(args, "y*p", &view, &header))
        return NULL;
    PyObject *rows = PyList_New(0);
    if (rows == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    Py_ssize_t pos = 0;
    int r = parse_rows((const unsigned char *)view.buf, view.len, &pos, header, rows);
    PyBuffer_Release(&view);
    if (r < 0) {
        Py_DECREF(rows);
        return NULL;
    }
    return Py_BuildValue("(NnO)", rows, pos, r == 1 ? Py_True : Py_False);
}


/* ---- the assembler's per-row path for plain DML (relations.unsplit_row_change in C) ----------
 * A plain DML message carries one tuple running to its end: 'I'/'U' + relid + 'N', or 'D' + relid
 * + 'K'/'O'; or an Update's two: 'U' + relid + 'K'/'O' + old tuple + 'N' + new tuple. Its RowChange
 * holds WireTuples (unsplit tuples) built here without running WireTuple.__init__: their five slots
 * are set through their member offsets. */
static PyTypeObject *WireTupleType = NULL, *RowChangeType = NULL;
static Py_ssize_t off_decoded, off_end, off_lsn, off_message, off_offset;
static PyObject *OP_I = NULL, *OP_U = NULL, *OP_D = NULL;

static int
slot_offset(PyTypeObject *tp, const char *name, Py_ssize_t *out)
{
    PyObject *d = PyObject_GetAttrString((PyObject *)tp, name);
    if (d == NULL)
        return -1;
    if (Py_TYPE(d) != &PyMemberDescr_Type || ((PyMemberDescrObject *)d)->d_member->type != T_OBJECT_EX) {
        Py_DECREF(d);
        PyErr_Format(PyExc_TypeError, "%s.%s is not an object slot", tp->tp_name, name);
        return -1;
    }
    *out = ((PyMemberDescrObject *)d)->d_member->offset;
    Py_DECREF(d);
    return 0;
}

static PyObject *
init_types(PyObject *self, PyObject *args)
{
    PyObject *wt, *rc, *i, *u, *d;
    if (!PyArg_ParseTuple(args, "O!O!UUU", &PyType_Type, &wt, &PyType_Type, &rc, &i, &u, &d))
        return NULL;
    PyTypeObject *w = (PyTypeObject *)wt, *r = (PyTypeObject *)rc;
    if (!PyType_IsSubtype(r, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "RowChange must be a tuple subclass");
        return NULL;
    }
    if (slot_offset(w, "_decoded", &off_decoded) < 0 || slot_offset(w, "end", &off_end) < 0 ||
        slot_offset(w, "lsn", &off_lsn) < 0 ||
        slot_offset(w, "message", &off_message) < 0 || slot_offset(w, "offset", &off_offset) < 0)
        return NULL;
    Py_INCREF(w); Py_XSETREF(WireTupleType, w);
    Py_INCREF(r); Py_XSETREF(RowChangeType, r);
    Py_INCREF(i); Py_XSETREF(OP_I, i);
    Py_INCREF(u); Py_XSETREF(OP_U, u);
    Py_INCREF(d); Py_XSETREF(OP_D, d);
    Py_RETURN_NONE;
}

#define SET_SLOT(obj, off, value) (*(PyObject **)((char *)(obj) + (off)) = (value))

/* A WireTuple of data[offset:end]; end 0: to the message's end (slot None). */
static PyObject *
new_wiretuple(PyObject *data, Py_ssize_t offset, PyObject *lsn, Py_ssize_t end)
{
    PyObject *w = WireTupleType->tp_alloc(WireTupleType, 0);
    if (w == NULL)
        return NULL;
    PyObject *off = PyLong_FromSsize_t(offset);
    PyObject *e = end ? PyLong_FromSsize_t(end) : (Py_INCREF(Py_None), Py_None);
    if (off == NULL || e == NULL) {
        Py_XDECREF(off);
        Py_XDECREF(e);
        Py_DECREF(w);
        return NULL;
    }
    Py_INCREF(Py_None); SET_SLOT(w, off_decoded, Py_None);
    SET_SLOT(w, off_end, e);
    Py_INCREF(lsn); SET_SLOT(w, off_lsn, lsn);
    Py_INCREF(data); SET_SLOT(w, off_message, data);
    SET_SLOT(w, off_offset, off);
    return w;
}

/* Where the TupleData at p[pos] ends, or 0 when it does not frame (wiretuple.tuple_end). */
static Py_ssize_t
tuple_end(const unsigned char *p, Py_ssize_t n, Py_ssize_t pos)
{
    if (pos + 2 > n)
        return 0;
    unsigned int ncols = be16(p + pos);
    pos += 2;
    for (unsigned int i = 0; i < ncols; i++) {
        if (pos >= n)
            return 0;
        unsigned char k = p[pos++];
        if (k == 'b' || k == 't') {
            if (pos + 4 > n)
                return 0;
            int32_t len = (int32_t)be32(p + pos);
            pos += 4;
            if (len < 0 || len > n - pos)
                return 0;
            pos += len;
        } else if (k != 'n' && k != 'u') {
            return 0;
        }
    }
    return pos;
}

/* Kind of a message as plain DML starting its relid at `base` (relations._row_shape): 'I'/'U' (new
 * tuple), 'D' with 'K'/'O', 'U' with 'K'/'O' whose old tuple frames and is followed by 'N' + a new one
 * (*old_end: where the old tuple ends; else 0), or 0 when it is anything else. */
static inline int
plain_kind(const unsigned char *p, Py_ssize_t n, Py_ssize_t base, int *key_only, Py_ssize_t *old_end)
{
    *old_end = 0;
    if (n <= base + 5)
        return 0;
    unsigned char t = p[0], tag = p[base + 4];
    if (tag == 'N' && (t == 'I' || t == 'U')) {
        *key_only = 0;
        return t;
    }
    if (tag == 'K' || tag == 'O') {
        *key_only = tag == 'K';
        if (t == 'D')
            return t;
        if (t == 'U') {
            Py_ssize_t end = tuple_end(p, n, base + 5);
            if (end && end + 1 < n && p[end] == 'N') {
                *old_end = end;
                return t;
            }
        }
    }
    return 0;
}

/* The relation of a plain message, borrowed; NULL without an exception when unknown. */
static PyObject *
relation_of(PyObject *relations, const unsigned char *p, Py_ssize_t base)
{
    PyObject *key = PyLong_FromUnsignedLong(be32(p + base));
    if (key == NULL)
        return NULL;
    PyObject *rel = PyDict_GetItemWithError(relations, key);
    Py_DECREF(key);
    return rel;
}

/* RowChange of a plain DML message (new reference); Py_None (new ref) when it is not one or its
 * relation is unknown (the Python path then handles the row, with its errors); NULL on error. */
static PyObject *
plain_change(PyObject *data, PyObject *lsn, PyObject *relations, Py_ssize_t base)
{
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(data);
    int key_only;
    Py_ssize_t old_end;
    int t = plain_kind(p, PyBytes_GET_SIZE(data), base, &key_only, &old_end);
    if (t == 0)
        Py_RETURN_NONE;
    PyObject *rel = relation_of(relations, p, base);
    if (rel == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    PyObject *image = new_wiretuple(data, base + 5, lsn, old_end);
    if (image == NULL)
        return NULL;
    PyObject *second = NULL;  /* an Update's new tuple after its old one */
    if (old_end) {
        second = new_wiretuple(data, old_end + 1, lsn, 0);
        if (second == NULL) {
            Py_DECREF(image);
            return NULL;
        }
    }
    PyObject *rc = RowChangeType->tp_alloc(RowChangeType, 6);
    if (rc == NULL) {
        Py_DECREF(image);
        Py_XDECREF(second);
        return NULL;
    }
    PyObject *op = t == 'I' ? OP_I : t == 'U' ? OP_U : OP_D;
    Py_INCREF(op); PyTuple_SET_ITEM(rc, 0, op);
    Py_INCREF(rel); PyTuple_SET_ITEM(rc, 1, rel);
    Py_INCREF(lsn); PyTuple_SET_ITEM(rc, 2, lsn);
    if (second != NULL) {
        PyTuple_SET_ITEM(rc, 3, image);
        PyTuple_SET_ITEM(rc, 4, second);
    } else if (t == 'D') {
        PyTuple_SET_ITEM(rc, 3, image);
        Py_INCREF(Py_None); PyTuple_SET_ITEM(rc, 4, Py_None);
    } else {
        Py_INCREF(Py_None); PyTuple_SET_ITEM(rc, 3, Py_None);
        PyTuple_SET_ITEM(rc, 4, image);
    }
    PyObject *ko = key_only ? Py_True : Py_False;
    Py_INCREF(ko); PyTuple_SET_ITEM(rc, 5, ko);
    return rc;
}

static int
types_ready(void)
{
    if (WireTupleType == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "init_types() has not been called");
        return 0;
    }
    return 1;
}

/* The data of a fetched or spilled row, a (lsn, xid, data) 3-tuple whose data is bytes; NULL (no
 * exception) for any other shape, which the callers leave to the Python path. Borrowed reference. */
static PyObject *
row_data(PyObject *row)
{
    if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != 3)
        return NULL;
    PyObject *data = PyTuple_GET_ITEM(row, 2);
    return PyBytes_CheckExact(data) ? data : NULL;
}

/* take_plain(rows, start, relations, items, room) -> (next, size)
 * From rows[start:] ((lsn, xid, data) tuples), append the RowChange of each plain DML row to
 * `items` while the rows are plain DML of a known relation with bytes data; stop before any other
 * row, or after the row that makes the summed message size exceed `room` (the budget left). */
static PyObject *
take_plain(PyObject *self, PyObject *args)
{
    PyObject *rows, *relations, *items;
    Py_ssize_t start, room;
    if (!PyArg_ParseTuple(args, "O!nO!O!n", &PyList_Type, &rows, &start, &PyDict_Type, &relations,
                          &PyList_Type, &items, &room))
        return NULL;
    if (!types_ready())
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(rows), i = start, size = 0;
    while (i < n) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        PyObject *data = row_data(row);
        if (data == NULL)
            break;
        PyObject *rc = plain_change(data, PyTuple_GET_ITEM(row, 0), relations, 1);
        if (rc == NULL)
            return NULL;
        if (rc == Py_None) {
            Py_DECREF(rc);
            break;
        }
        int r = PyList_Append(items, rc);
        Py_DECREF(rc);
        if (r < 0)
            return NULL;
        i++;
        size += PyBytes_GET_SIZE(data);
        if (size > room)
            break;
    }
    return Py_BuildValue("(nn)", i, size);
}

/* spill_plain(rows, start, relations) -> (next, records)
 * The spill records (spill.SpillFile's format: UInt64 lsn, UInt32 subxid 0, UInt32 length, bytes)
 * of the plain DML rows from rows[start:] of a known relation, up to the first other row. */
static PyObject *
spill_plain(PyObject *self, PyObject *args)
{
    PyObject *rows, *relations;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "O!nO!", &PyList_Type, &rows, &start, &PyDict_Type, &relations))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(rows), i = start, total = 0;
    for (; i < n; i++) { /* first pass: how far, and how many bytes */
        PyObject *row = PyList_GET_ITEM(rows, i);
        PyObject *data = row_data(row);
        if (data == NULL)
            break;
        const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(data);
        Py_ssize_t len = PyBytes_GET_SIZE(data);
        int key_only;
        Py_ssize_t old_end;
        if (plain_kind(p, len, 1, &key_only, &old_end) == 0 || len > 0xFFFFFFFFLL)
            break;
        PyObject *rel = relation_of(relations, p, 1);
        if (rel == NULL) {
            if (PyErr_Occurred())
                return NULL;
            break;
        }
        unsigned long long lsn = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(row, 0));
        if (lsn == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            break;
        }
        total += 16 + len;
    }
    Py_ssize_t stop = i;
    PyObject *blob = PyBytes_FromStringAndSize(NULL, total);
    if (blob == NULL)
        return NULL;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(blob);
    for (i = start; i < stop; i++) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        PyObject *data = PyTuple_GET_ITEM(row, 2);
        Py_ssize_t len = PyBytes_GET_SIZE(data);
        unsigned long long lsn = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(row, 0));
        for (int k = 0; k < 8; k++)
            out[k] = (unsigned char)(lsn >> (56 - 8 * k));
        memset(out + 8, 0, 4);
        out[12] = (unsigned char)(len >> 24);
        out[13] = (unsigned char)(len >> 16);
        out[14] = (unsigned char)(len >> 8);
        out[15] = (unsigned char)len;
        memcpy(out + 16, PyBytes_AS_STRING(data), len);
        out += 16 + len;
    }
    return Py_BuildValue("(nN)", stop, blob);
}

/* unsplit_records(records, relations, base) -> list: per (lsn, subxid, data) record, its RowChange
 * when it is plain DML of a known relation, else None (decoded by the Python path). */
static PyObject *
unsplit_records(PyObject *self, PyObject *args)
{
    PyObject *records, *relations;
    Py_ssize_t base;
    if (!PyArg_ParseTuple(args, "O!O!n", &PyList_Type, &records, &PyDict_Type, &relations, &base))
        return NULL;
    if (!types_ready())
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(records);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *rec = PyList_GET_ITEM(records, i);
        PyObject *data = row_data(rec);
        PyObject *rc;
        if (data != NULL) {
            rc = plain_change(data, PyTuple_GET_ITEM(rec, 0), relations, base);
            if (rc == NULL) {
                Py_DECREF(out);
                return NULL;
            }
        } else {
            Py_INCREF(Py_None);
            rc = Py_None;
        }
        PyList_SET_ITEM(out, i, rc);
    }
    return out;
}

/* spill_records(buf, pos) -> (records, pos): the whole spill records (UInt64 lsn, UInt32 subxid,
 * UInt32 length, bytes) in buf[pos:] as (lsn, subxid, data) tuples, and the offset after the last. */
static PyObject *
spill_records(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t pos;
    if (!PyArg_ParseTuple(args, "y*n", &view, &pos))
        return NULL;
    const unsigned char *d = (const unsigned char *)view.buf;
    Py_ssize_t len = view.len;
    PyObject *out = PyList_New(0);
    if (out == NULL)
        goto fail;
    while (pos >= 0 && len - pos >= 16) {
        uint32_t n = be32(d + pos + 12);
        if ((Py_ssize_t)n > len - pos - 16)
            break;
        PyObject *rec = Py_BuildValue("(KIy#)", (unsigned long long)be64(d + pos), (unsigned int)be32(d + pos + 8),
                                      (const char *)d + pos + 16, (Py_ssize_t)n);
        if (rec == NULL || PyList_Append(out, rec) < 0) {
            Py_XDECREF(rec);
            goto fail;
        }
        Py_DECREF(rec);
        pos += 16 + n;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(Nn)", out, pos);
fail:
    Py_XDECREF(out);
    PyBuffer_Release(&view);
    return NULL;
}

/* Whether `c` continues a run of `relation`: an exact RowChange whose relation is that very object. */
static inline int
in_run(PyObject *c, PyObject *relation)
{
    return Py_TYPE(c) == RowChangeType && PyTuple_GET_SIZE(c) >= 2 && PyTuple_GET_ITEM(c, 1) == relation;
}

/* relation_run(changes, start, relation) -> end: the index after the run of RowChanges of `relation`
 * (compared by identity, like the writer) that starts at changes[start]: the writer's per-row scan for
 * runs of one relation, in one call per run, as `staging.writer.relation_run_py` scans. An exact list or
 * tuple is read in its array; any other sequence (a subclass too, whose item access may be its own)
 * through len() and [] as the reference does. A negative start is a ValueError in both. */
static PyObject *
relation_run(PyObject *self, PyObject *args)
{
    PyObject *changes, *relation;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "OnO", &changes, &start, &relation))
        return NULL;
    if (start < 0) {
        PyErr_Format(PyExc_ValueError, "relation_run: start %zd is negative", start);
        return NULL;
    }
    if (!types_ready())
        return NULL;
    Py_ssize_t i = start;
    if (PyList_CheckExact(changes) || PyTuple_CheckExact(changes)) {
        PyObject **items = PySequence_Fast_ITEMS(changes);
        Py_ssize_t n = PySequence_Fast_GET_SIZE(changes);
        while (i < n && in_run(items[i], relation))
            i++;
        return PyLong_FromSsize_t(i);
    }
    Py_ssize_t n = PySequence_Size(changes);
    if (n < 0)
        return NULL;
    for (; i < n; i++) {
        PyObject *c = PySequence_GetItem(changes, i);
        if (c == NULL)
            return NULL;
        int more = in_run(c, relation);
        Py_DECREF(c);
        if (!more)
            break;
    }
    return PyLong_FromSsize_t(i);
}

/* One side (old or new) of rowchange_columns: the present images' messages joined (+ pad zero
 * bytes), per present image its tuple start and end (its `end` slot, or its message's end) in the
 * joined bytes, and the mask of absent images. Returns NULL with no exception when an image is not a
 * WireTuple (or not bytes). */
static PyObject *
image_side(PyObject *changes, Py_ssize_t n, int which, Py_ssize_t pad)
{
    Py_ssize_t total = 0, present = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *img = PyTuple_GET_ITEM(PyList_GET_ITEM(changes, i), which);
        if (img == Py_None)
            continue;
        if (Py_TYPE(img) != WireTupleType)
            return NULL;
        PyObject *msg = *(PyObject **)((char *)img + off_message);
        if (msg == NULL || !PyBytes_CheckExact(msg))
            return NULL;
        total += PyBytes_GET_SIZE(msg);
        present++;
    }
    PyObject *absent = PyBytes_FromStringAndSize(NULL, n);
    PyObject *joined = PyBytes_FromStringAndSize(NULL, total + pad);
    PyObject *starts = PyBytes_FromStringAndSize(NULL, present * 8);
    PyObject *ends = PyBytes_FromStringAndSize(NULL, present * 8);
    if (absent == NULL || joined == NULL || starts == NULL || ends == NULL)
        goto fail;
    char *a = PyBytes_AS_STRING(absent), *j = PyBytes_AS_STRING(joined);
    int64_t *st = (int64_t *)PyBytes_AS_STRING(starts), *en = (int64_t *)PyBytes_AS_STRING(ends);
    Py_ssize_t at = 0, k = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *img = PyTuple_GET_ITEM(PyList_GET_ITEM(changes, i), which);
        if (img == Py_None) {
            a[i] = 1;
            continue;
        }
        a[i] = 0;
        PyObject *msg = *(PyObject **)((char *)img + off_message);
        PyObject *offset = *(PyObject **)((char *)img + off_offset);
        PyObject *stop = *(PyObject **)((char *)img + off_end);
        Py_ssize_t off = offset ? PyLong_AsSsize_t(offset) : -1;
        if (off == -1 && PyErr_Occurred())
            goto fail;
        Py_ssize_t len = PyBytes_GET_SIZE(msg), tend = len;
        if (stop != NULL && stop != Py_None) {
            tend = PyLong_AsSsize_t(stop);
            if (tend == -1 && PyErr_Occurred())
                goto fail;
            if (tend < off || tend > len)
                goto not_plain;  /* an end outside its message: the Python path judges it */
        }
        memcpy(j + at, PyBytes_AS_STRING(msg), len);
        st[k] = at + off;
        en[k] = at + tend;
        at += len;
        k++;
    }
    memset(j + at, 0, pad);
    return Py_BuildValue("(NNNN)", absent, joined, starts, ends);
not_plain:
    PyErr_Clear();
fail:
    Py_XDECREF(absent);
    Py_XDECREF(joined);
    Py_XDECREF(starts);
    Py_XDECREF(ends);
    return NULL;
}

/* rowchange_columns(changes, pad) -> (lsn, op, key_only, old, new) or None
 * The staged columns of a row group of RowChanges in one pass: lsn as native int64 bytes, op as
 * one byte per row, key_only as one bool byte per row, and per image side image_side()'s tuple.
 * None (the Python path then runs) when anything is not the plain shape: a change that is not a
 * RowChange, an op that is not one ASCII letter, an image that is not a WireTuple. */
static PyObject *
rowchange_columns(PyObject *self, PyObject *args)
{
    PyObject *changes;
    Py_ssize_t pad;
    if (!PyArg_ParseTuple(args, "O!n", &PyList_Type, &changes, &pad))
        return NULL;
    if (!types_ready())
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(changes);
    PyObject *lsn = PyBytes_FromStringAndSize(NULL, n * 8);
    PyObject *ops = PyBytes_FromStringAndSize(NULL, n);
    PyObject *keys = PyBytes_FromStringAndSize(NULL, n);
    PyObject *old = NULL, *new = NULL;
    if (lsn == NULL || ops == NULL || keys == NULL)
        goto fail;
    int64_t *l = (int64_t *)PyBytes_AS_STRING(lsn);
    char *o = PyBytes_AS_STRING(ops), *k = PyBytes_AS_STRING(keys);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *c = PyList_GET_ITEM(changes, i);
        if (Py_TYPE(c) != RowChangeType || PyTuple_GET_SIZE(c) != 6)
            goto plain_no;
        PyObject *op = PyTuple_GET_ITEM(c, 0), *ko = PyTuple_GET_ITEM(c, 5);
        if (!PyUnicode_Check(op) || PyUnicode_GET_LENGTH(op) != 1 || !PyUnicode_IS_ASCII(op) ||
            (ko != Py_True && ko != Py_False))
            goto plain_no;
        o[i] = (char)PyUnicode_READ_CHAR(op, 0);
        k[i] = ko == Py_True;
        long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(c, 2));
        if (v == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            goto plain_no;
        }
        l[i] = v;
    }
    old = image_side(changes, n, 3, pad);
    if (old == NULL)
        goto side_failed;
    new = image_side(changes, n, 4, pad);
    if (new == NULL)
        goto side_failed;
    return Py_BuildValue("(NNNNN)", lsn, ops, keys, old, new);
side_failed:
    if (PyErr_Occurred())
        goto fail;
plain_no:
    Py_XDECREF(lsn);
    Py_XDECREF(ops);
    Py_XDECREF(keys);
    Py_XDECREF(old);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(lsn);
    Py_XDECREF(ops);
    Py_XDECREF(keys);
    Py_XDECREF(old);
    return NULL;
}

/* gather_slices(buf, starts, lengths, total): the bytes buf[starts[i]:starts[i] + lengths[i]] joined, for i in
 * order (starts and lengths native int64; total their lengths' sum). A row group's variable-width column in one
 * copy per value. Every slice and the total are checked before anything is allocated (a wrong total is an error,
 * not an allocation). The GIL is released only for a large copy: reacquiring it can wait a whole switch interval
 * while the row-group thread runs Python, longer than a small column's copy takes. */
#define GATHER_NOGIL_BYTES (64 * 1024)

static PyObject *
gather_slices(PyObject *self, PyObject *args)
{
    Py_buffer buf, starts, lengths;
    Py_ssize_t total;
    if (!PyArg_ParseTuple(args, "y*y*y*n", &buf, &starts, &lengths, &total))
        return NULL;
    PyObject *out = NULL;
    if (starts.len != lengths.len || starts.len % 8 != 0 || total < 0) {
        PyErr_SetString(PyExc_ValueError, "gather_slices: starts and lengths must be int64 arrays of one size");
        goto done;
    }
    /* a y* buffer may be unaligned: its int64s are read through memcpy */
    const char *st = (const char *)starts.buf, *ln = (const char *)lengths.buf, *src = (const char *)buf.buf;
    Py_ssize_t n = starts.len / 8, size = buf.len, at = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t s0, l0;
        memcpy(&s0, st + 8 * i, 8);
        memcpy(&l0, ln + 8 * i, 8);
        if (s0 < 0 || l0 < 0 || s0 > size || l0 > size - s0 || l0 > total - at) {
            PyErr_Format(PyExc_ValueError, "gather_slices: slice %zd is outside the buffer or the total", i);
            goto done;
        }
        at += l0;
    }
    if (at != total) {
        PyErr_Format(PyExc_ValueError, "gather_slices: the slices hold %zd bytes, not %zd", at, total);
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL)
        goto done;
    char *dst = PyBytes_AS_STRING(out);
    PyThreadState *state = total >= GATHER_NOGIL_BYTES ? PyEval_SaveThread() : NULL;
    at = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t s0, l0;
        memcpy(&s0, st + 8 * i, 8);
        memcpy(&l0, ln + 8 * i, 8);
        memcpy(dst + at, src + s0, (size_t)l0);
        at += l0;
    }
    if (state != NULL)
        PyEval_RestoreThread(state);
done:
    PyBuffer_Release(&buf);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&lengths);
    return out;
}

static PyMethodDef methods[] = {
    {"rowchange_columns", rowchange_columns, METH_VARARGS, "Staged columns of a list of RowChanges, or None."},
    {"gather_slices", gather_slices, METH_VARARGS, "buf's slices (int64 starts, lengths) joined; a large copy without the GIL."},
    {"spill_records", spill_records, METH_VARARGS, "Whole spill records in buf[pos:]: (records, pos)."},
    {"init_types", init_types, METH_VARARGS, "Register WireTuple, RowChange and the op strings I, U, D."},
    {"take_plain", take_plain, METH_VARARGS, "Append plain DML RowChanges from rows[start:]: (next, size)."},
    {"spill_plain", spill_plain, METH_VARARGS, "Spill records of plain DML rows from rows[start:]: (next, blob)."},
    {"unsplit_records", unsplit_records, METH_VARARGS, "RowChange or None per spill record."},
    {"relation_run", relation_run, METH_VARARGS, "End of the run of RowChanges of one relation from start."},
#ifdef PGLOGICAL_LIBPQ
    {"pq_connect", pq_connect, METH_VARARGS, "Open a libpq connection (keywords, values): a capsule."},
    {"pq_options", pq_options, METH_NOARGS, "The connection keywords this libpq knows and their defaults."},
    {"pq_lib_version", pq_lib_version, METH_NOARGS, "PQlibVersion() of the linked libpq."},
    {"pq_exec", pq_exec, METH_VARARGS, "Run statements, discarding results: None, or (sqlstate, message)."},
    {"pq_finish", pq_finish, METH_O, "Close a connection made by pq_connect (idempotent)."},
    {"pq_backend_pid", pq_backend_pid, METH_O, "PQbackendPID() of a connection made by pq_connect."},
    {"copy_start", copy_start, METH_VARARGS, "Send a COPY ... TO STDOUT; None, or (sqlstate, message)."},
    {"copy_rows", copy_rows, METH_VARARGS, "Read and split up to max_rows rows: (rows, done, error)."},
    {"copy_cancel", copy_cancel, METH_VARARGS, "Cancel the running COPY and consume its results."},
    {"copy_messages", copy_messages, METH_VARARGS, "Read CopyData messages: (data, sizes, done, error)."},
    {"repl_read", repl_read, METH_VARARGS, "Read a replication stream up to a bound: (rows, in_tx, state, error)."},
    {"repl_status", repl_status, METH_VARARGS, "Send a standby status update: None or an error message."},
    {"repl_split", repl_split, METH_VARARGS, "repl_read's rule over a list of messages: (rows, in_tx, state)."},
#endif
    {"split_copy", split_copy, METH_VARARGS, "Split (bigint, bigint, bytea) binary COPY rows: (rows, end, trailer)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_speedups", "Compiled helpers of the drain (optional).", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    return PyModule_Create(&module);
}
