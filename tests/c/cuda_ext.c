/*
 * A Python extension module that links libcudart: Python imports it with
 * RTLD_LOCAL, so its runtime is in its own scope only.
 * cuda_ext.leak() leaks one block and returns 0, or the failing step.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "cuda_runtime_api.h"

__attribute__((noinline)) static int ext_leak(void) {
    void *p = NULL;
    return cudaMalloc(&p, 5151); /* LEAK extension */
}

static PyObject *leak(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ext_leak();
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc);
}

static PyMethodDef methods[] = {{"leak", leak, METH_NOARGS, "leak one block"}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "cuda_ext", NULL, -1, methods};

PyMODINIT_FUNC PyInit_cuda_ext(void) { return PyModule_Create(&module); }
