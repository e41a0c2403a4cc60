/* The Avro binary encoder of engine.avro, in C: one call writes a whole event.
 *
 * engine/avro.py compiles each event schema into a "program": a tuple of field ops
 * (code, attribute name, sub-program[, slot]). encode(prefix, obj, program) returns prefix +
 * the record's Avro binary body, reading each field as getattr(obj, name), or, when the op
 * carries the slot's member descriptor and obj is an instance of the class that defines it,
 * straight from the slot: a getattr looks the name up in the type's attribute cache first, and
 * between two appends that cache and the type dicts behind it have left the CPU caches (one
 * event with the caches flushed: 9-11 us through getattr, 6-7 from the slots).
 *
 * encode_delimited(objs) writes many objects in one call, each record behind its length (an
 * unsigned varint), with the prefix and program registered for its exact class (register).
 *
 * It accepts exactly what the generated Python writers accept without help: a long is an int
 * (not a bool) within 64 bits, a double an int or a float, a boolean a bool, a string a str
 * (not a subclass) UTF-8 can encode, an array a list or tuple. Anything else raises, and the
 * caller (engine.codec) then runs the Python writer, which either writes the value the same way
 * or raises the error that names the field: the messages live in one place.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>

enum {
    OP_LONG = 0,
    OP_DOUBLE = 1,
    OP_FLOAT = 2,
    OP_BOOL = 3,
    OP_STRING = 4,
    OP_ARRAY = 5,
    OP_RECORD = 6,
    OP_NULLABLE = 16, /* flag: the union ["null", T] */
};

#define STACK_BYTES 2048
#define MAX_DEPTH 32

typedef struct {
    char *data;
    Py_ssize_t len;
    Py_ssize_t cap;
    char stack[STACK_BYTES];
} Buffer;

static int reserve(Buffer *b, Py_ssize_t extra) {
    if (b->len + extra <= b->cap)
        return 0;
    Py_ssize_t cap = b->cap * 2;
    while (cap < b->len + extra)
        cap *= 2;
    char *data;
    if (b->data == b->stack) {
        data = PyMem_Malloc(cap);
        if (data != NULL)
            memcpy(data, b->stack, b->len);
    } else {
        data = PyMem_Realloc(b->data, cap);
    }
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = data;
    b->cap = cap;
    return 0;
}

static int put_bytes(Buffer *b, const char *p, Py_ssize_t n) {
    if (reserve(b, n) < 0)
        return -1;
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

static int put_varint(Buffer *b, unsigned long long z) {
    if (reserve(b, 10) < 0)
        return -1;
    unsigned char *p = (unsigned char *)b->data + b->len;
    while (z > 0x7F) {
        *p++ = (unsigned char)((z & 0x7F) | 0x80);
        z >>= 7;
    }
    *p++ = (unsigned char)z;
    b->len = (char *)p - b->data;
    return 0;
}

static int put_long(Buffer *b, long long n) {
    /* zigzag: 0, -1, 1, -2 ... -> 0, 1, 2, 3 ... */
    return put_varint(b, ((unsigned long long)n << 1) ^ (unsigned long long)(n >> 63));
}

static int refuse(const char *what) {
    PyErr_Format(PyExc_TypeError, "the native writer does not take this value as %s", what);
    return -1;
}

static int write_record(Buffer *b, PyObject *obj, PyObject *program, int depth);

static int write_value(Buffer *b, PyObject *v, long code, PyObject *sub, int depth) {
    if (code & OP_NULLABLE) {
        if (v == Py_None) {
            return put_varint(b, 0);
        }
        if (put_varint(b, 2) < 0) /* zigzag(1): the second branch */
            return -1;
        code &= ~OP_NULLABLE;
    }
    switch (code) {
    case OP_LONG: {
        if (!PyLong_CheckExact(v))
            return refuse("a long");
        int overflow = 0;
        long long n = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow)
            return refuse("a long");
        if (n == -1 && PyErr_Occurred())
            return -1;
        return put_long(b, n);
    }
    case OP_DOUBLE:
    case OP_FLOAT: {
        double d;
        if (PyFloat_CheckExact(v)) {
            d = PyFloat_AS_DOUBLE(v);
        } else if (PyLong_CheckExact(v)) {
            d = PyLong_AsDouble(v);
            if (d == -1.0 && PyErr_Occurred())
                return -1;
        } else {
            return refuse("a number");
        }
        if (reserve(b, 8) < 0)
            return -1;
        unsigned char *p = (unsigned char *)b->data + b->len;
        if (code == OP_DOUBLE) {
            if (PyFloat_Pack8(d, (char *)p, 1) < 0)
                return -1;
            b->len += 8;
        } else {
            if (PyFloat_Pack4(d, (char *)p, 1) < 0)
                return -1;
            b->len += 4;
        }
        return 0;
    }
    case OP_BOOL:
        if (!PyBool_Check(v))
            return refuse("a boolean");
        return put_varint(b, v == Py_True ? 1 : 0);
    case OP_STRING: {
        if (!PyUnicode_CheckExact(v))
            return refuse("a string");
        if (PyUnicode_IS_ASCII(v)) { /* its own bytes are its UTF-8 */
            Py_ssize_t n = PyUnicode_GET_LENGTH(v);
            if (put_varint(b, (unsigned long long)n << 1) < 0)
                return -1;
            return put_bytes(b, (const char *)PyUnicode_DATA(v), n);
        }
        /* encoded into a bytes object of its own, not PyUnicode_AsUTF8's copy, which would stay
         * on the str (a session's history texts) as long as it lives */
        PyObject *utf8 = PyUnicode_AsUTF8String(v); /* fails on a lone surrogate */
        if (utf8 == NULL)
            return -1;
        Py_ssize_t n = PyBytes_GET_SIZE(utf8);
        int rc = put_varint(b, (unsigned long long)n << 1);
        if (rc == 0)
            rc = put_bytes(b, PyBytes_AS_STRING(utf8), n);
        Py_DECREF(utf8);
        return rc;
    }
    case OP_ARRAY: {
        if (!PyList_CheckExact(v) && !PyTuple_CheckExact(v))
            return refuse("an array");
        /* sub is the items' op: (code, None, sub) */
        long item_code = PyLong_AsLong(PyTuple_GET_ITEM(sub, 0));
        PyObject *item_sub = PyTuple_GET_ITEM(sub, 2);
        /* a list is copied into a tuple first: its count is written before its items, and
         * nothing an item's attributes run may change what is written after it */
        PyObject *seq;
        if (PyTuple_CheckExact(v)) {
            seq = v;
            Py_INCREF(seq);
        } else {
            seq = PyList_AsTuple(v);
            if (seq == NULL)
                return -1;
        }
        Py_ssize_t n = PyTuple_GET_SIZE(seq);
        int rc = 0;
        if (n > 0) {
            rc = put_varint(b, (unsigned long long)n << 1);
            for (Py_ssize_t i = 0; rc == 0 && i < n; i++)
                rc = write_value(b, PyTuple_GET_ITEM(seq, i), item_code, item_sub, depth);
        }
        Py_DECREF(seq);
        if (rc < 0)
            return -1;
        return put_varint(b, 0);
    }
    case OP_RECORD:
        return write_record(b, v, sub, depth + 1);
    default:
        PyErr_Format(PyExc_ValueError, "unknown op %ld in an Avro write program", code);
        return -1;
    }
}

/* The field's value (a new reference) read from its slot, or NULL without an error set: the op
 * names no slot, obj is not an instance of the class that defines it, or the slot is empty
 * (getattr then reads it, or raises the AttributeError). */
static PyObject *slot_value(PyObject *obj, PyObject *op) {
    if (PyTuple_GET_SIZE(op) != 4)
        return NULL;
    PyObject *descr = PyTuple_GET_ITEM(op, 3);
    if (!PyObject_TypeCheck(obj, PyDescr_TYPE(descr)))
        return NULL;
    PyObject *value = *(PyObject **)((char *)obj + ((PyMemberDescrObject *)descr)->d_member->offset);
    Py_XINCREF(value);
    return value;
}

static int write_record(Buffer *b, PyObject *obj, PyObject *program, int depth) {
    if (depth > MAX_DEPTH) {
        PyErr_SetString(PyExc_ValueError, "records nested too deep for the native writer");
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(program);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *op = PyTuple_GET_ITEM(program, i);
        long code = PyLong_AsLong(PyTuple_GET_ITEM(op, 0));
        PyObject *value = slot_value(obj, op);
        if (value == NULL)
            value = PyObject_GetAttr(obj, PyTuple_GET_ITEM(op, 1));
        if (value == NULL)
            return -1;
        int rc = write_value(b, value, code, PyTuple_GET_ITEM(op, 2), depth);
        Py_DECREF(value);
        if (rc < 0)
            return -1;
    }
    return 0;
}

static int valid_program(PyObject *program, int depth);

/* The member descriptor of the slot ``name`` holding an object (a __slots__ entry), whose
 * offset can be read. */
static int object_slot(PyObject *descr, PyObject *name) {
    if (!Py_IS_TYPE(descr, &PyMemberDescr_Type) || !PyUnicode_CheckExact(name))
        return 0;
    PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
    const char *named = PyUnicode_AsUTF8(name);
    if (named == NULL) {
        PyErr_Clear();
        return 0;
    }
    return member->type == T_OBJECT_EX && member->offset > 0 && strcmp(member->name, named) == 0;
}

/* One op: (code, attribute name, sub[, slot]); an array's item op has None for its name and no
 * slot. */
static int valid_op(PyObject *op, int depth, int named) {
    if (!PyTuple_CheckExact(op) || PyTuple_GET_SIZE(op) < 3 || PyTuple_GET_SIZE(op) > 4
        || !PyLong_CheckExact(PyTuple_GET_ITEM(op, 0)))
        return 0;
    if (PyTuple_GET_SIZE(op) == 4 && !(named && object_slot(PyTuple_GET_ITEM(op, 3), PyTuple_GET_ITEM(op, 1))))
        return 0;
    long code = PyLong_AsLong(PyTuple_GET_ITEM(op, 0));
    long base = code & ~OP_NULLABLE;
    PyObject *name = PyTuple_GET_ITEM(op, 1), *sub = PyTuple_GET_ITEM(op, 2);
    if (base < OP_LONG || base > OP_RECORD || (code & ~(OP_NULLABLE | 0xF)) != 0)
        return 0;
    if (named ? !PyUnicode_CheckExact(name) : name != Py_None)
        return 0;
    if (base == OP_RECORD)
        return valid_program(sub, depth + 1);
    if (base == OP_ARRAY)
        return depth < MAX_DEPTH && valid_op(sub, depth + 1, 0);
    return 1;
}

static int valid_program(PyObject *program, int depth) {
    if (depth > MAX_DEPTH || !PyTuple_CheckExact(program))
        return 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(program); i++)
        if (!valid_op(PyTuple_GET_ITEM(program, i), depth, 1))
            return 0;
    return 1;
}

static PyObject *check(PyObject *module, PyObject *program) {
    (void)module;
    if (!valid_program(program, 0)) {
        PyErr_SetString(PyExc_ValueError, "not an Avro write program");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *encode(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3 || !PyBytes_CheckExact(args[0]) || !PyTuple_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError, "encode(prefix: bytes, obj, program: tuple)");
        return NULL;
    }
    Buffer b;
    b.data = b.stack;
    b.len = 0;
    b.cap = STACK_BYTES;
    PyObject *result = NULL;
    if (put_bytes(&b, PyBytes_AS_STRING(args[0]), PyBytes_GET_SIZE(args[0])) == 0
        && write_record(&b, args[1], args[2], 0) == 0)
        result = PyBytes_FromStringAndSize(b.data, b.len);
    if (b.data != b.stack)
        PyMem_Free(b.data);
    return result;
}

static PyObject *registered = NULL;
/* class -> (prefix, program), each program checked when registered: what encode_delimited
 * writes an object of that exact class with. */

static PyObject *register_class(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3 || !PyType_Check(args[0]) || !PyBytes_CheckExact(args[1]) || !valid_program(args[2], 0)) {
        PyErr_SetString(PyExc_TypeError, "register(cls: type, prefix: bytes, program: a write program)");
        return NULL;
    }
    if (registered == NULL && (registered = PyDict_New()) == NULL)
        return NULL;
    PyObject *entry = PyTuple_Pack(2, args[1], args[2]);
    if (entry == NULL)
        return NULL;
    int rc = PyDict_SetItem(registered, args[0], entry);
    Py_DECREF(entry);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* The records of objs, each behind its length (an unsigned varint), in one bytes; None if an
 * object's class is not registered or a value is not what its program writes without help
 * (the caller then encodes them one by one, which names what is wrong). */
static PyObject *encode_delimited(PyObject *module, PyObject *objs) {
    (void)module;
    if (!PyList_CheckExact(objs) && !PyTuple_CheckExact(objs)) {
        PyErr_SetString(PyExc_TypeError, "encode_delimited(objs: list | tuple)");
        return NULL;
    }
    PyObject *seq = PySequence_Tuple(objs); /* nothing an attribute runs can change what is written */
    if (seq == NULL)
        return NULL;
    Buffer out, record;
    out.data = out.stack;
    out.len = 0;
    out.cap = STACK_BYTES;
    record.data = record.stack;
    record.len = 0;
    record.cap = STACK_BYTES;
    PyObject *result = NULL;
    int ok = 1;
    for (Py_ssize_t i = 0; ok && i < PyTuple_GET_SIZE(seq); i++) {
        PyObject *obj = PyTuple_GET_ITEM(seq, i);
        PyObject *entry = registered == NULL ? NULL : PyDict_GetItemWithError(registered, (PyObject *)Py_TYPE(obj));
        if (entry == NULL) {
            ok = 0;
            break;
        }
        Py_INCREF(entry); /* a getattr may run code that registers its class again */
        PyObject *prefix = PyTuple_GET_ITEM(entry, 0);
        record.len = 0;
        ok = put_bytes(&record, PyBytes_AS_STRING(prefix), PyBytes_GET_SIZE(prefix)) == 0
             && write_record(&record, obj, PyTuple_GET_ITEM(entry, 1), 0) == 0
             && put_varint(&out, (unsigned long long)record.len) == 0
             && put_bytes(&out, record.data, record.len) == 0;
        Py_DECREF(entry);
    }
    if (ok) {
        result = PyBytes_FromStringAndSize(out.data, out.len);
    } else if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_Exception)) {
        PyErr_Clear(); /* refused, or a value's own error: the one-by-one path raises it by name */
        result = Py_NewRef(Py_None);
    }
    if (out.data != out.stack)
        PyMem_Free(out.data);
    if (record.data != record.stack)
        PyMem_Free(record.data);
    Py_DECREF(seq);
    return result;
}

static PyMethodDef methods[] = {
    {"encode", (PyCFunction)(void (*)(void))encode, METH_FASTCALL,
     "encode(prefix, obj, program) -> prefix + the Avro binary record of obj."},
    {"register", (PyCFunction)(void (*)(void))register_class, METH_FASTCALL,
     "register(cls, prefix, program): encode_delimited writes objects of exactly cls with them."},
    {"encode_delimited", encode_delimited, METH_O,
     "encode_delimited(objs) -> each record behind its varint length, or None (see the source)."},
    {"check", check, METH_O, "check(program): ValueError unless it is a well-formed write program."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_avrowrite", "The native Avro record writer (see engine/avro.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__avrowrite(void) {
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "OP_LONG", OP_LONG) < 0 || PyModule_AddIntConstant(m, "OP_DOUBLE", OP_DOUBLE) < 0
        || PyModule_AddIntConstant(m, "OP_FLOAT", OP_FLOAT) < 0 || PyModule_AddIntConstant(m, "OP_BOOL", OP_BOOL) < 0
        || PyModule_AddIntConstant(m, "OP_STRING", OP_STRING) < 0
        || PyModule_AddIntConstant(m, "OP_ARRAY", OP_ARRAY) < 0
        || PyModule_AddIntConstant(m, "OP_RECORD", OP_RECORD) < 0
        || PyModule_AddIntConstant(m, "OP_NULLABLE", OP_NULLABLE) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
