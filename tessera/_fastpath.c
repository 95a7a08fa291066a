/* The common case of tessera._dispatch.dispatch, in C.
 *
 * dispatch(op, *args, **attrs) here does exactly what the Python function does for one
 * case: every tensor input on the CPU with one float32/float64 dtype (or, for an op that
 * does not promote and with no input requiring grad, inputs of any dtypes), Python numbers or None beside them, one output, a memoised infer
 * result, and no dispatch mode installed.
 * Everything else (other devices and dtypes, mixed dtypes, tracing, global tensors,
 * large elementwise ops that the eager C kernels take, kernel errors) calls the Python
 * dispatch, which stays the reference: this file adds no rule of its own. It records
 * autograd nodes as ``_dispatch._record`` and ``Node.save`` do.
 *
 * Tensor is a Python class with __slots__; its slots are read and written at the offsets
 * their member descriptors give (configure() checks each is an object slot).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#define CACHE_MAX 8192

static PyObject *fallback;        /* the Python dispatch */
static int ready;                 /* configure() has run */
static PyTypeObject *tensor_type, *meta_type, *ndarray_type;
static PyObject *modes, *cpu, *f32, *f64, *dtype_module_dict, *state, *infer;
static PyObject *asarray, *user_errors, *cache;
static PyTypeObject *node_type;
static PyObject *node_seq, *refresh_view;
static Py_ssize_t n_op, n_attrs, n_next, n_needs, n_in_metas, n_out_metas, n_saved_in,
                  n_saved_out, n_versions, n_seq, n_pre_hooks, n_hooks, n_retained;
static Py_ssize_t eager_min;
static Py_ssize_t off_data, off_shape, off_dtype, off_device, off_rg, off_grad_fn,
                  off_output_nr, off_version;
static PyObject *s_cpu, *s_plain, *s_kernels, *s_to_c, *s_aliasing, *s_view,
                *s_dynamic_shape, *s_grad, *s_enabled, *s_inference, *s_default, *s_dtype,
                *s_astype, *s_np, *s_category, *s_nondiff, *s_base, *s_view_chain,
                *s_view_version, *s_inference_attr, *s_save, *s_inputs, *s_outputs,
                *s_grad_accumulator, *s_promote, *zero;

#define SLOT(o, off) (*(PyObject **)((char *)(o) + (off)))

static void set_slot(PyObject *o, Py_ssize_t off, PyObject *v)
{
    PyObject **p = (PyObject **)((char *)o + off);
    Py_INCREF(v);
    Py_XSETREF(*p, v);
}

/* ---- configure ------------------------------------------------------------------ */

static int slot_offset(PyTypeObject *type, const char *name, Py_ssize_t *off)
{
    PyObject *d = PyDict_GetItemString(type->tp_dict, name);
    if (d == NULL || Py_TYPE(d) != &PyMemberDescr_Type ||
            ((PyMemberDescrObject *)d)->d_member->type != T_OBJECT_EX) {
        PyErr_Format(PyExc_TypeError, "_fastpath: %s.%s is not an object slot",
                     type->tp_name, name);
        return -1;
    }
    *off = ((PyMemberDescrObject *)d)->d_member->offset;
    return 0;
}

#define KEEP(var, value) do { Py_XSETREF(var, Py_NewRef(value)); } while (0)

static PyObject *configure(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"fallback", "tensor", "meta", "ndarray", "modes", "cpu", "float32",
                            "float64", "dtype_module", "state", "infer",
                            "asarray", "user_errors", "eager_min", "node", "node_seq",
                            "refresh_view", NULL};
    PyObject *fb, *tt, *mt, *nd, *md, *c, *a, *b, *dm, *st, *inf, *asa, *ue, *nt, *sq;
    PyObject *rv;
    Py_ssize_t em;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO!O!O!O!OOOO!OOOO!nO!OO", names, &fb,
                                     &PyType_Type, &tt, &PyType_Type, &mt, &PyType_Type, &nd,
                                     &PyList_Type, &md, &c, &a, &b, &PyModule_Type, &dm,
                                     &st, &inf, &asa, &PyTuple_Type, &ue, &em,
                                     &PyType_Type, &nt, &sq, &rv))
        return NULL;
    PyTypeObject *nodet = (PyTypeObject *)nt;
    if (slot_offset(nodet, "op", &n_op) || slot_offset(nodet, "attrs", &n_attrs) ||
            slot_offset(nodet, "next_functions", &n_next) ||
            slot_offset(nodet, "needs_input_grad", &n_needs) ||
            slot_offset(nodet, "input_metas", &n_in_metas) ||
            slot_offset(nodet, "output_metas", &n_out_metas) ||
            slot_offset(nodet, "_saved_inputs", &n_saved_in) ||
            slot_offset(nodet, "_saved_outputs", &n_saved_out) ||
            slot_offset(nodet, "_versions", &n_versions) || slot_offset(nodet, "seq", &n_seq) ||
            slot_offset(nodet, "_pre_hooks", &n_pre_hooks) ||
            slot_offset(nodet, "_hooks", &n_hooks) || slot_offset(nodet, "_retained", &n_retained))
        return NULL;
    if (!PyIter_Check(sq)) {
        PyErr_SetString(PyExc_TypeError, "_fastpath: node_seq must be an iterator");
        return NULL;
    }
    Py_XSETREF(node_type, (PyTypeObject *)Py_NewRef(nt));
    KEEP(node_seq, sq);
    KEEP(refresh_view, rv);
    PyTypeObject *t = (PyTypeObject *)tt;
    if (slot_offset(t, "_data", &off_data) || slot_offset(t, "_shape", &off_shape) ||
            slot_offset(t, "_dtype", &off_dtype) || slot_offset(t, "_device", &off_device) ||
            slot_offset(t, "_requires_grad", &off_rg) ||
            slot_offset(t, "grad_fn", &off_grad_fn) ||
            slot_offset(t, "_output_nr", &off_output_nr) ||
            slot_offset(t, "_version", &off_version))
        return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)mt, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "_fastpath: Meta must be a tuple subclass");
        return NULL;
    }
    KEEP(fallback, fb);
    Py_XSETREF(tensor_type, (PyTypeObject *)Py_NewRef(tt));
    Py_XSETREF(meta_type, (PyTypeObject *)Py_NewRef(mt));
    Py_XSETREF(ndarray_type, (PyTypeObject *)Py_NewRef(nd));
    KEEP(modes, md);
    KEEP(cpu, c);
    KEEP(f32, a);
    KEEP(f64, b);
    KEEP(dtype_module_dict, PyModule_GetDict(dm));
    KEEP(state, st);
    KEEP(infer, inf);
    KEEP(asarray, asa);
    KEEP(user_errors, ue);
    eager_min = em;
    if (cache == NULL && (cache = PyDict_New()) == NULL)
        return NULL;
    PyDict_Clear(cache);
    ready = 1;
    Py_RETURN_NONE;
}

static PyObject *clear_cache(PyObject *self, PyObject *unused)
{
    if (cache != NULL)
        PyDict_Clear(cache);
    Py_RETURN_NONE;
}

static PyObject *set_enabled(PyObject *self, PyObject *flag)
{
    int on = PyObject_IsTrue(flag);
    if (on < 0)
        return NULL;
    PyObject *was = PyBool_FromLong(ready);
    ready = on && fallback != NULL && tensor_type != NULL;
    return was;
}

/* ---- helpers ----------------------------------------------------------------------- */

/* The slots this file reads without further checks hold what Tensor._make puts there.
 * A tensor whose slots were set otherwise (a bare object, a crafted file, user code) goes
 * to the Python path, which raises a Python error: each check is a pointer compare. */
static int sane_tensor(PyObject *a)
{
    PyObject *version = SLOT(a, off_version), *shape = SLOT(a, off_shape);
    return SLOT(a, off_data) != NULL && SLOT(a, off_dtype) != NULL && shape != NULL &&
           PyTuple_Check(shape) &&
           version != NULL && PyList_CheckExact(version) && PyList_GET_SIZE(version) >= 1 &&
           SLOT(a, off_grad_fn) != NULL && SLOT(a, off_output_nr) != NULL;
}

/* An attr value that may be part of the infer key, as the Python path decides:
 * numbers, strings, None, dtypes, devices and tuples of ints/None/such tuples. */
static int int_tuple(PyObject *v)
{
    Py_ssize_t n = PyTuple_GET_SIZE(v);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyTuple_GET_ITEM(v, i);
        if (!(PyLong_CheckExact(x) || x == Py_None || (PyTuple_CheckExact(x) && int_tuple(x))))
            return 0;
    }
    return 1;
}

static int keyable(PyObject *v)
{
    PyTypeObject *t = Py_TYPE(v);
    if (t == &PyLong_Type || t == &PyFloat_Type || t == &PyBool_Type ||
            t == &PyUnicode_Type || v == Py_None)
        return 1;
    if (PyTuple_Check(v))  /* tuples and Size */
        return int_tuple(v);
    /* tessera dtypes and devices: their types are the types of f32 and cpu */
    return t == Py_TYPE(f32) || t == Py_TYPE(cpu);
}

static Py_ssize_t numel(PyObject *shape)
{
    Py_ssize_t n = 1, k = PyTuple_GET_SIZE(shape);
    for (Py_ssize_t i = 0; i < k; i++) {
        Py_ssize_t s = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, i));
        if (s == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return PY_SSIZE_T_MAX;
        }
        n *= s;
    }
    return n;
}

/* getattr(o, name, None) without raising: 1 found, 0 absent, -1 error */
static int optional_attr(PyObject *o, PyObject *name, PyObject **out)
{
#if PY_VERSION_HEX >= 0x030D0000
    return PyObject_GetOptionalAttr(o, name, out);
#else
    return _PyObject_LookupAttr(o, name, out);
#endif
}

static PyObject *new_meta(PyObject *shape, PyObject *dt)
{
    PyObject *m = meta_type->tp_alloc(meta_type, 2);
    if (m == NULL)
        return NULL;
    PyTuple_SET_ITEM(m, 0, Py_NewRef(shape));
    PyTuple_SET_ITEM(m, 1, Py_NewRef(dt));
    return m;
}

/* The op's inputs as the Python path sees them: metas (Meta or the scalar itself). */
static PyObject *metas_list(PyObject *const *args, Py_ssize_t n)
{
    PyObject *metas = PyList_New(n);
    if (metas == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = args[i], *m;
        if (PyObject_TypeCheck(a, tensor_type))
            m = new_meta(SLOT(a, off_shape), SLOT(a, off_dtype));
        else
            m = Py_NewRef(a);
        if (m == NULL) {
            Py_DECREF(metas);
            return NULL;
        }
        PyList_SET_ITEM(metas, i, m);
    }
    return metas;
}

static PyObject *attrs_dict(PyObject *const *values, PyObject *kwnames)
{
    PyObject *d = PyDict_New();
    if (d == NULL || kwnames == NULL)
        return d;
    Py_ssize_t k = PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < k; i++)
        if (PyDict_SetItem(d, PyTuple_GET_ITEM(kwnames, i), values[i]) < 0) {
            Py_DECREF(d);
            return NULL;
        }
    return d;
}

/* The cache entry for a key: (out Meta, shape, dtype, numpy dtype, differentiable);
 * Py_None when infer gave several outputs (the Python path runs those). */
static PyObject *lookup(PyObject *key, PyObject *op, PyObject *const *args, Py_ssize_t n,
                        PyObject *kwnames, int scalars)
{
    PyObject *entry = PyDict_GetItemWithError(cache, key);
    if (entry != NULL || PyErr_Occurred())
        return Py_XNewRef(entry);
    PyObject *metas = metas_list(args, n);
    PyObject *attrs = metas ? attrs_dict(args + n, kwnames) : NULL;
    PyObject *out = attrs ? PyObject_CallFunctionObjArgs(infer, op, metas, attrs,
                                                         scalars ? Py_True : Py_False, NULL)
                          : NULL;
    Py_XDECREF(metas);
    Py_XDECREF(attrs);
    if (out == NULL)
        return NULL;
    if (Py_TYPE(out) != meta_type) {
        entry = Py_NewRef(Py_None);
    } else {
        PyObject *shape = PyTuple_GET_ITEM(out, 0), *dt = PyTuple_GET_ITEM(out, 1);
        PyObject *np = PyObject_GetAttr(dt, s_np);
        PyObject *cat = np ? PyObject_GetAttr(dt, s_category) : NULL;
        long c = cat ? PyLong_AsLong(cat) : -1;
        Py_XDECREF(cat);
        if (np == NULL || (c == -1 && PyErr_Occurred()) || !PyTuple_Check(shape)) {
            Py_XDECREF(np);
            Py_DECREF(out);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "_fastpath: infer gave a malformed Meta");
            return NULL;
        }
        entry = PyTuple_Pack(5, out, shape, dt, np, c >= 2 ? Py_True : Py_False);
        Py_DECREF(np);
    }
    Py_DECREF(out);
    if (entry == NULL)
        return NULL;
    if (PyDict_GET_SIZE(cache) >= CACHE_MAX)
        PyDict_Clear(cache);
    if (PyDict_SetItem(cache, key, entry) < 0) {
        Py_DECREF(entry);
        return NULL;
    }
    return entry;
}

static PyObject *make_tensor(PyObject *data, PyObject *dt, PyObject *shape)
{
    PyObject *t = tensor_type->tp_alloc(tensor_type, 0);
    if (t == NULL)
        return NULL;
    PyObject *version = PyList_New(1);
    if (version == NULL) {
        Py_DECREF(t);
        return NULL;
    }
    PyList_SET_ITEM(version, 0, Py_NewRef(zero));
    SLOT(t, off_data) = Py_NewRef(data);
    SLOT(t, off_shape) = Py_NewRef(shape);
    SLOT(t, off_dtype) = Py_NewRef(dt);
    SLOT(t, off_device) = Py_NewRef(cpu);
    SLOT(t, off_rg) = Py_NewRef(Py_False);
    SLOT(t, off_grad_fn) = Py_NewRef(Py_None);
    SLOT(t, off_output_nr) = Py_NewRef(zero);
    SLOT(t, off_version) = version;
    PyObject *inf = PyObject_GetAttr(state, s_inference);
    int on = inf ? PyObject_IsTrue(inf) : -1;
    Py_XDECREF(inf);
    if (on < 0 || (on && PyObject_SetAttr(t, s_inference_attr, Py_True) < 0)) {
        Py_DECREF(t);
        return NULL;
    }
    return t;
}

/* _mark_view: ``out`` shares the storage and version counter of ``args[0]``. */
static int mark_view(PyObject *out, PyObject *op, PyObject *const *args, Py_ssize_t n,
                     PyObject *kwnames)
{
    PyObject *src = args[0];
    if (!PyObject_TypeCheck(src, tensor_type)) {  /* checked by dispatch when a tensor */
        PyErr_SetString(PyExc_TypeError, "_fastpath: a view op's first input is not a tensor");
        return -1;
    }
    PyObject *version = SLOT(src, off_version);
    set_slot(out, off_version, version);
    PyObject *base = PyObject_GetAttr(src, s_base);
    if (base == NULL)
        return -1;
    int rc = PyObject_SetAttr(out, s_base, base != Py_None ? base : src);
    Py_DECREF(base);
    if (rc < 0)
        return -1;
    PyObject *rest = PyTuple_New(n - 1);
    if (rest == NULL)
        return -1;
    for (Py_ssize_t i = 1; i < n; i++)
        PyTuple_SET_ITEM(rest, i - 1, Py_NewRef(args[i]));
    PyObject *attrs = attrs_dict(args + n, kwnames);
    PyObject *link = attrs ? PyTuple_Pack(3, op, rest, attrs) : NULL;
    Py_DECREF(rest);
    Py_XDECREF(attrs);
    PyObject *chain = link ? PyObject_GetAttr(src, s_view_chain) : NULL;
    PyObject *one = chain ? PyTuple_Pack(1, link) : NULL;
    PyObject *longer = one ? PySequence_Concat(chain, one) : NULL;
    Py_XDECREF(link);
    Py_XDECREF(chain);
    Py_XDECREF(one);
    if (longer == NULL)
        return -1;
    rc = PyObject_SetAttr(out, s_view_chain, longer);
    Py_DECREF(longer);
    if (rc < 0)
        return -1;
    return PyObject_SetAttr(out, s_view_version, PyList_GET_ITEM(version, 0));
}

static int in_tuple(PyObject *tuple, long v)
{
    if (!PyTuple_Check(tuple))
        return -1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tuple); i++) {
        long x = PyLong_AsLong(PyTuple_GET_ITEM(tuple, i));
        if (x == -1 && PyErr_Occurred())
            return -1;
        if (x == v)
            return 1;
    }
    return 0;
}


/* _record: the autograd Node of one op with one output ``t`` (PyTorch's grad_fn). */
static PyObject *edge_of(PyObject *a)
{
    PyObject *base = PyObject_GetAttr(a, s_base);
    if (base == NULL)
        return NULL;
    if (base != Py_None) {  /* a view whose base was written since: take its history again */
        PyObject *vv = PyObject_GetAttr(a, s_view_version);
        int stale = vv ? PyObject_RichCompareBool(
            vv, PyList_GET_ITEM(SLOT(a, off_version), 0), Py_NE) : -1;
        Py_XDECREF(vv);
        PyObject *r = stale > 0 ? PyObject_CallOneArg(refresh_view, a) : NULL;
        Py_XDECREF(r);
        if (stale < 0 || (stale > 0 && r == NULL)) {
            Py_DECREF(base);
            return NULL;
        }
    }
    Py_DECREF(base);
    PyObject *fn = SLOT(a, off_grad_fn);
    if (fn != Py_None)
        return PyTuple_Pack(2, fn, SLOT(a, off_output_nr));
    PyObject *acc = PyObject_CallMethodNoArgs(a, s_grad_accumulator);
    if (acc == NULL)
        return NULL;
    PyObject *e = PyTuple_Pack(2, acc, zero);
    Py_DECREF(acc);
    return e;
}

static int record_node(PyObject *op, PyObject *const *in, Py_ssize_t n, PyObject *kwnames,
                       PyObject *out_meta, PyObject *t)
{
    PyObject *edges = PyTuple_New(n), *needs = PyTuple_New(n), *node = NULL;
    PyObject *metas = NULL, *attrs = NULL, *outs = NULL, *save = NULL, *seq = NULL;
    int rc = -1;
    if (edges == NULL || needs == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = in[i], *e;
        int req = PyObject_TypeCheck(a, tensor_type) && SLOT(a, off_rg) == Py_True;
        if (req) {
            if ((e = edge_of(a)) == NULL)
                goto done;
        } else {
            e = Py_NewRef(Py_None);
        }
        PyTuple_SET_ITEM(edges, i, e);
        PyTuple_SET_ITEM(needs, i, Py_NewRef(req ? Py_True : Py_False));
    }
    if ((metas = metas_list(in, n)) == NULL || (attrs = attrs_dict(in + n, kwnames)) == NULL ||
            (outs = PyTuple_Pack(1, out_meta)) == NULL || (seq = PyIter_Next(node_seq)) == NULL)
        goto done;
    if ((node = node_type->tp_alloc(node_type, 0)) == NULL)
        goto done;
    set_slot(node, n_op, op);
    set_slot(node, n_attrs, attrs);
    set_slot(node, n_next, edges);
    set_slot(node, n_needs, needs);
    set_slot(node, n_in_metas, metas);
    set_slot(node, n_out_metas, outs);
    set_slot(node, n_saved_in, Py_None);
    set_slot(node, n_saved_out, Py_None);
    set_slot(node, n_versions, Py_None);
    set_slot(node, n_seq, seq);
    set_slot(node, n_pre_hooks, Py_None);
    set_slot(node, n_hooks, Py_None);
    set_slot(node, n_retained, Py_None);
    /* Node.save: what backward needs, with the version each had */
    if ((save = PyObject_GetAttr(op, s_save)) == NULL)
        goto done;
    int any = PyObject_IsTrue(save);
    int with_in = any > 0 ? PySequence_Contains(save, s_inputs) : 0;
    int with_out = any > 0 ? PySequence_Contains(save, s_outputs) : 0;
    if (any < 0 || with_in < 0 || with_out < 0)
        goto done;
    if (any) {
        PyObject *versions = PyList_New(0);
        if (versions == NULL)
            goto done;
        if (with_in) {
            PyObject *inputs = PyTuple_New(n);
            if (inputs == NULL) {
                Py_DECREF(versions);
                goto done;
            }
            for (Py_ssize_t i = 0; i < n; i++) {
                PyObject *a = in[i];
                PyTuple_SET_ITEM(inputs, i, Py_NewRef(a));
                PyObject *v = PyObject_TypeCheck(a, tensor_type)
                    ? PyList_GET_ITEM(SLOT(a, off_version), 0) : Py_None;
                if (PyList_Append(versions, v) < 0) {
                    Py_DECREF(inputs);
                    Py_DECREF(versions);
                    goto done;
                }
            }
            set_slot(node, n_saved_in, inputs);
            Py_DECREF(inputs);
        }
        if (with_out) {
            PyObject *version = SLOT(t, off_version);
            PyObject *m = new_meta(SLOT(t, off_shape), SLOT(t, off_dtype));
            PyObject *vd = m ? PyTuple_Pack(2, version, SLOT(t, off_device)) : NULL;
            PyObject *one = vd ? PyTuple_Pack(3, SLOT(t, off_data), m, vd) : NULL;
            PyObject *saved = one ? PyTuple_Pack(1, one) : NULL;
            Py_XDECREF(m);
            Py_XDECREF(vd);
            Py_XDECREF(one);
            if (saved == NULL || PyList_Append(versions, PyList_GET_ITEM(version, 0)) < 0) {
                Py_XDECREF(saved);
                Py_DECREF(versions);
                goto done;
            }
            set_slot(node, n_saved_out, saved);
            Py_DECREF(saved);
        }
        set_slot(node, n_versions, versions);
        Py_DECREF(versions);
    }
    if (SLOT(t, off_rg) == Py_True) {
        set_slot(t, off_grad_fn, node);
        set_slot(t, off_output_nr, zero);
    }
    rc = 0;
done:
    Py_XDECREF(edges);
    Py_XDECREF(needs);
    Py_XDECREF(node);
    Py_XDECREF(metas);
    Py_XDECREF(attrs);
    Py_XDECREF(outs);
    Py_XDECREF(save);
    Py_XDECREF(seq);
    return rc;
}

/* ---- dispatch ---------------------------------------------------------------------- */

static PyObject *slow(PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    return PyObject_Vectorcall(fallback, args, nargsf, kwnames);
}

static PyObject *dispatch(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                          PyObject *kwnames)
{
    if (!ready || nargs < 2 || PyList_GET_SIZE(modes) != 0)
        return fallback ? slow(args, nargs, kwnames)
                        : (PyErr_SetString(PyExc_RuntimeError, "_fastpath: not configured"),
                           NULL);
    PyObject *op = args[0];
    PyObject *const *in = args + 1;
    Py_ssize_t n = nargs - 1, nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    PyObject *first_dt = NULL;
    int grad = 0, scalars = 0, mixed = 0;

    PyObject *key = PyTuple_New(3 + 2 * (n + nkw));
    if (key == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = in[i], *k0, *k1;
        if (PyObject_TypeCheck(a, tensor_type)) {
            PyObject *dt = SLOT(a, off_dtype), *rg = SLOT(a, off_rg);
            if (SLOT(a, off_device) != cpu || !sane_tensor(a))
                goto fall;  /* another device, or slots not set by _make */
            if (first_dt == NULL)
                first_dt = dt;
            else if (dt != first_dt)
                mixed = 1;
            if (rg == Py_True)
                grad = 1;
            else if (rg != Py_False)
                goto fall;
            k0 = SLOT(a, off_shape);
            k1 = dt;
        } else if (a == Py_None) {
            k0 = k1 = Py_None;
        } else if (PyFloat_CheckExact(a) || PyLong_CheckExact(a)) {
            scalars = 1;
            k0 = a;
            k1 = (PyObject *)Py_TYPE(a);
        } else {
            goto fall;
        }
        PyTuple_SET_ITEM(key, 3 + 2 * i, Py_NewRef(k0));
        PyTuple_SET_ITEM(key, 4 + 2 * i, Py_NewRef(k1));
    }
    if (first_dt == NULL)
        goto fall;
    if (first_dt != f32 && first_dt != f64)
        mixed = 1;  /* integer first input (bit-packed activations): as mixed dtypes below */
    if (mixed) {
        /* mixed dtypes: the Python path casts for a promoting op and records gradients;
           an op that takes its inputs as they are (packed weights, indices) with nothing
           to record is the common case here too */
        PyObject *pr = grad ? NULL : PyObject_GetAttr(op, s_promote);
        int promote = pr ? PyObject_IsTrue(pr) : 1;
        Py_XDECREF(pr);
        if (promote != 0) {
            if (promote < 0)
                PyErr_Clear();
            goto fall;
        }
    }
    for (Py_ssize_t j = 0; j < nkw; j++) {
        PyObject *v = in[n + j];
        if (!keyable(v))
            goto fall;
        PyTuple_SET_ITEM(key, 3 + 2 * (n + j), Py_NewRef(v));
        PyTuple_SET_ITEM(key, 4 + 2 * (n + j), Py_NewRef((PyObject *)Py_TYPE(v)));
    }
    PyObject *dflt = PyDict_GetItemWithError(dtype_module_dict, s_default);
    if (dflt == NULL) {
        Py_DECREF(key);
        return PyErr_Occurred() ? NULL : slow(args, nargs, kwnames);
    }
    PyTuple_SET_ITEM(key, 0, Py_NewRef(op));
    PyTuple_SET_ITEM(key, 1, Py_NewRef(dflt));
    PyTuple_SET_ITEM(key, 2, Py_NewRef(kwnames ? kwnames : Py_None));

    PyObject *entry = lookup(key, op, in, n, kwnames, scalars);
    Py_DECREF(key);
    if (entry == NULL)
        return NULL;
    if (entry == Py_None) {  /* several outputs */
        Py_DECREF(entry);
        return slow(args, nargs, kwnames);
    }
    PyObject *res = NULL, *t = NULL, *kernel = NULL, *attr;
    /* the eager C kernels take large inputs of ops with a C rule: the Python path decides */
    attr = PyObject_GetAttr(op, s_to_c);
    if (attr == NULL)
        goto error;
    int to_c = attr != Py_None;
    Py_DECREF(attr);
    if (to_c && PyObject_TypeCheck(in[0], tensor_type) &&
            numel(SLOT(in[0], off_shape)) >= eager_min)
        goto slow_entry;
    attr = PyObject_GetAttr(op, s_dynamic_shape);
    if (attr == NULL)
        goto error;
    int dynamic = PyObject_IsTrue(attr);
    Py_DECREF(attr);
    if (dynamic != 0)
        goto slow_entry;
    PyObject *kernels = PyObject_GetAttr(op, s_kernels);
    if (kernels == NULL)
        goto error;
    kernel = PyDict_Check(kernels) ? PyDict_GetItemWithError(kernels, s_cpu) : NULL;
    Py_XINCREF(kernel);
    Py_DECREF(kernels);
    if (kernel == NULL) {
        if (PyErr_Occurred())
            goto error;
        goto slow_entry;
    }
    PyObject *plain;
    if (optional_attr(kernel, s_plain, &plain) < 0)
        goto error;
    if (plain != NULL && !mixed)  /* the bare NumPy form takes one float dtype */
        Py_SETREF(kernel, plain);
    else
        Py_XDECREF(plain);

    /* the kernel: tensor inputs as their arrays, the rest as they are */
    PyObject *small[16], **vec = small;
    Py_ssize_t total = n + nkw;
    if (total > 16 && (vec = PyMem_Malloc(total * sizeof(PyObject *))) == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    for (Py_ssize_t i = 0; i < total; i++)
        vec[i] = (i < n && PyObject_TypeCheck(in[i], tensor_type)) ? SLOT(in[i], off_data)
                                                                     : in[i];
    res = PyObject_Vectorcall(kernel, vec, n, kwnames);
    if (vec != small)
        PyMem_Free(vec);
    if (res == NULL) {
        /* errors the Python path names with the op: run it there (kernels are pure) */
        if (PyErr_ExceptionMatches(user_errors)) {
            PyErr_Clear();
            goto slow_entry;
        }
        goto error;
    }
    if (Py_TYPE(res) != ndarray_type) {
        Py_SETREF(res, PyObject_CallOneArg(asarray, res));
        if (res == NULL)
            goto error;
    }
    PyObject *np_dtype = PyTuple_GET_ITEM(entry, 3);
    PyObject *got = PyObject_GetAttr(res, s_dtype);
    if (got == NULL)
        goto error;
    int same = got == np_dtype ? 1 : PyObject_RichCompareBool(got, np_dtype, Py_EQ);
    Py_DECREF(got);
    if (same < 0)
        goto error;
    if (!same) {
        Py_SETREF(res, PyObject_CallMethodOneArg(res, s_astype, np_dtype));
        if (res == NULL)
            goto error;
    }

    t = make_tensor(res, PyTuple_GET_ITEM(entry, 2), PyTuple_GET_ITEM(entry, 1));
    if (t == NULL)
        goto error;
    int rec = 0;
    if (grad) {
        PyObject *en = PyObject_GetAttr(state, s_enabled);
        PyObject *g = en ? PyObject_GetAttr(op, s_grad) : NULL;
        rec = g ? PyObject_IsTrue(en) : -1;
        if (rec > 0)
            rec = g != Py_None;
        Py_XDECREF(en);
        Py_XDECREF(g);
        if (rec < 0)
            goto error;
    }
    if (rec && PyTuple_GET_ITEM(entry, 4) == Py_True) {
        PyObject *nd = PyObject_GetAttr(op, s_nondiff);
        int skip = nd ? in_tuple(nd, 0) : -1;
        Py_XDECREF(nd);
        if (skip < 0)
            goto error;
        if (!skip)
            set_slot(t, off_rg, Py_True);
    }
    attr = PyObject_GetAttr(op, s_aliasing);
    if (attr == NULL)
        goto error;
    int view = PyUnicode_Check(attr) && PyUnicode_Compare(attr, s_view) == 0;
    Py_DECREF(attr);
    if (view && mark_view(t, op, in, n, kwnames) < 0)
        goto error;
    if (rec && record_node(op, in, n, kwnames, PyTuple_GET_ITEM(entry, 0), t) < 0)
        goto error;
    Py_DECREF(kernel);
    Py_DECREF(res);
    Py_DECREF(entry);
    return t;

slow_entry:
    Py_XDECREF(kernel);
    Py_XDECREF(res);
    Py_XDECREF(t);
    Py_DECREF(entry);
    return slow(args, nargs, kwnames);
error:
    Py_XDECREF(kernel);
    Py_XDECREF(res);
    Py_XDECREF(t);
    Py_DECREF(entry);
    return NULL;
fall:
    Py_DECREF(key);
    return slow(args, nargs, kwnames);
}


/* ---- operators ----------------------------------------------------------------------
 * ``Tensor.__add__`` and friends for a Tensor or Python number operand: dispatch(op, self,
 * other, **attrs) without the Python method between; any other operand (NumPy arrays and
 * scalars, other objects) goes to the Python method, which defines the operator. */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *op, *kwnames, *values, *method;   /* values: the attrs, in kwnames' order */
} OperatorObject;

static PyObject *operator_call(PyObject *self, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames)
{
    OperatorObject *o = (OperatorObject *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs == 2 && kwnames == NULL) {
        PyObject *other = args[1];
        if (PyObject_TypeCheck(other, tensor_type) || PyFloat_CheckExact(other) ||
                PyLong_CheckExact(other)) {
            PyObject *vec[8];
            Py_ssize_t k = o->kwnames ? PyTuple_GET_SIZE(o->kwnames) : 0;
            if (k <= 5) {
                vec[0] = o->op;
                vec[1] = args[0];
                vec[2] = other;
                for (Py_ssize_t i = 0; i < k; i++)
                    vec[3 + i] = PyTuple_GET_ITEM(o->values, i);
                return dispatch(NULL, vec, 3, o->kwnames);
            }
        }
    }
    return PyObject_Vectorcall(o->method, args, nargsf, kwnames);
}

static PyObject *operator_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None)
        return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

static int operator_traverse(PyObject *self, visitproc visit, void *arg)
{
    OperatorObject *o = (OperatorObject *)self;
    Py_VISIT(o->op);
    Py_VISIT(o->kwnames);
    Py_VISIT(o->values);
    Py_VISIT(o->method);
    return 0;
}

static void operator_dealloc(PyObject *self)
{
    OperatorObject *o = (OperatorObject *)self;
    PyObject_GC_UnTrack(self);
    Py_XDECREF(o->op);
    Py_XDECREF(o->kwnames);
    Py_XDECREF(o->values);
    Py_XDECREF(o->method);
    PyObject_GC_Del(self);
}

static PyObject *operator_name(PyObject *self, void *unused)
{
    return PyObject_GetAttrString(((OperatorObject *)self)->method, "__name__");
}

static PyObject *operator_doc(PyObject *self, void *unused)
{
    return PyObject_GetAttrString(((OperatorObject *)self)->method, "__doc__");
}

static PyObject *operator_wrapped(PyObject *self, void *unused)
{
    return Py_NewRef(((OperatorObject *)self)->method);
}

static PyGetSetDef operator_getset[] = {
    {"__name__", operator_name, NULL, NULL, NULL},
    {"__wrapped__", operator_wrapped, NULL, NULL, NULL},
    {"__doc__", operator_doc, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject OperatorType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tessera._fastpath_c.operator",
    .tp_basicsize = sizeof(OperatorObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_vectorcall_offset = offsetof(OperatorObject, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = operator_get,
    .tp_traverse = operator_traverse,
    .tp_dealloc = operator_dealloc,
    .tp_getset = operator_getset,
};

static PyObject *make_operator(PyObject *self, PyObject *args)
{
    PyObject *op, *attrs, *method;
    if (!PyArg_ParseTuple(args, "OO!O:operator", &op, &PyDict_Type, &attrs, &method))
        return NULL;
    Py_ssize_t k = PyDict_GET_SIZE(attrs);
    if (k > 5) {
        PyErr_SetString(PyExc_ValueError, "operator: at most 5 attrs");
        return NULL;
    }
    PyObject *names = PyTuple_New(k), *values = PyTuple_New(k), *key, *value;
    if (names == NULL || values == NULL) {
        Py_XDECREF(names);
        Py_XDECREF(values);
        return NULL;
    }
    Py_ssize_t pos = 0, i = 0;
    while (PyDict_Next(attrs, &pos, &key, &value)) {
        PyTuple_SET_ITEM(names, i, Py_NewRef(key));
        PyTuple_SET_ITEM(values, i, Py_NewRef(value));
        i++;
    }
    OperatorObject *o = PyObject_GC_New(OperatorObject, &OperatorType);
    if (o == NULL) {
        Py_DECREF(names);
        Py_DECREF(values);
        return NULL;
    }
    o->vectorcall = operator_call;
    o->op = Py_NewRef(op);
    if (k == 0) {
        o->kwnames = NULL;
        Py_DECREF(names);
    } else {
        o->kwnames = names;
    }
    o->values = values;
    o->method = Py_NewRef(method);
    PyObject_GC_Track(o);
    return (PyObject *)o;
}

/* ---- module ------------------------------------------------------------------------ */

static PyMethodDef methods[] = {
    {"dispatch", (PyCFunction)(void (*)(void))dispatch, METH_FASTCALL | METH_KEYWORDS,
     "dispatch(op, *args, **attrs): tessera._dispatch.dispatch, its common case in C."},
    {"configure", (PyCFunction)(void (*)(void))configure, METH_VARARGS | METH_KEYWORDS,
     "configure(...): the Python objects the fast path reads (called once at import)."},
    {"operator", make_operator, METH_VARARGS,
     "operator(op, attrs, method): a Tensor operator method dispatching ``op`` with ``attrs``"
     " for Tensor and number operands, calling ``method`` for others."},
    {"clear_cache", clear_cache, METH_NOARGS, "Forget every memoised infer result."},
    {"set_enabled", set_enabled, METH_O,
     "set_enabled(flag) -> previous: when off, dispatch always runs the Python path."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastpath_c", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

#define INTERN(var, text) \
    if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL

PyMODINIT_FUNC PyInit__fastpath_c(void)
{
    INTERN(s_cpu, "cpu");
    INTERN(s_plain, "plain");
    INTERN(s_kernels, "kernels");
    INTERN(s_to_c, "to_c");
    INTERN(s_aliasing, "aliasing");
    INTERN(s_view, "view");
    INTERN(s_dynamic_shape, "dynamic_shape");
    INTERN(s_grad, "grad");
    INTERN(s_enabled, "enabled");
    INTERN(s_inference, "inference");
    INTERN(s_default, "_default");
    INTERN(s_dtype, "dtype");
    INTERN(s_astype, "astype");
    INTERN(s_np, "np");
    INTERN(s_category, "category");
    INTERN(s_nondiff, "nondiff_outputs");
    INTERN(s_base, "_base");
    INTERN(s_view_chain, "_view_chain");
    INTERN(s_view_version, "_view_version");
    INTERN(s_inference_attr, "_inference");
    INTERN(s_save, "save");
    INTERN(s_inputs, "inputs");
    INTERN(s_outputs, "outputs");
    INTERN(s_grad_accumulator, "_grad_accumulator");
    INTERN(s_promote, "promote");
    if ((zero = PyLong_FromLong(0)) == NULL || PyType_Ready(&OperatorType) < 0)
        return NULL;
    return PyModule_Create(&module);
}
