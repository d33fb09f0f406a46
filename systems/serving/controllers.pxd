# C types for the compiled twin of controllers.py (systems/compiled.py, setup.py); the rules are in the .py.
import cython

cdef class TableSearch:
    cdef public object L, E, idle, clocks
    cdef public Py_ssize_t F
    cdef public dict _neg, _best

    cpdef Py_ssize_t first_ok(self, Py_ssize_t n, double bound)
    @cython.locals(i=Py_ssize_t, bi=Py_ssize_t)
    cpdef tuple best_from(self, Py_ssize_t n, double w_e, double w_l, Py_ssize_t j)


@cython.locals(d=Py_ssize_t, mp=Py_ssize_t, cum=Py_ssize_t, tot=Py_ssize_t, c=Py_ssize_t, n=Py_ssize_t, lim=double,
               b=double, j0=Py_ssize_t, k=Py_ssize_t, slack=double, cu=Py_ssize_t, wt=double, tok=Py_ssize_t)
cpdef object s1_search(TableSearch search, object waiting, Py_ssize_t D, Py_ssize_t m, Py_ssize_t p, Py_ssize_t g,
                       object chunks, double slo_ttft, double slo_tbt)
