# C types for the compiled twin of driver.py (systems/compiled.py, setup.py); the rules are in the .py.
import cython

cdef class Driver:
    cdef public object ctl, arr, inp, out
    cdef public Py_ssize_t N
    cdef public double t_stop
    cdef public Py_ssize_t max_waiting_view
    cdef public object ex
    cdef public list arr_l, inp_l, out_l, need, pref, fin, gen, in_wait, waiting
    cdef public long long[::1] em_req, em_n
    cdef public Py_ssize_t n_it, n_em
    cdef public list dec_rows, knobs
    cdef public double[:, ::1] it_log
    cdef public Py_ssize_t n_dec, next_arr
    cdef public double d_int, d_t, win_t0
    cdef public Py_ssize_t win_arr, win_tok
    cdef public Py_ssize_t chunk, m
    cdef public double clock

    cdef void _call(self, object hook, double now, str trigger, Py_ssize_t rid=*, object win=*)
    cdef void _decodes_until(self, double now)
    @cython.locals(span=double)
    cdef void _tick(self, double t)
    @cython.locals(r=Py_ssize_t, n=Py_ssize_t)
    cdef void _arrival(self, double now)
    @cython.locals(t=double, pf=Py_ssize_t, i=Py_ssize_t, r=Py_ssize_t, ntok=Py_ssize_t, entered=Py_ssize_t,
                   n=Py_ssize_t, seqs=Py_ssize_t, in_wait=list, pref=list, gen=list, k=Py_ssize_t, e=Py_ssize_t,
                   em_req='long long[::1]', row='double[::1]')
    cdef void _account(self, object it)
    @cython.locals(N=Py_ssize_t, next_tick=double, next_second=double, t_stop=double, until=double, now=double, ta=double)
    cpdef object run(self, object ex, object progress=*)
