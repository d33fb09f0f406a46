# C types for the compiled twin of simulator.py (systems/compiled.py, setup.py); the rules are in the .py.
import cython

cdef class SimExecutor:
    cdef public object cost
    cdef public Py_ssize_t p, g
    cdef public bint has_energy
    cdef public double delay_s
    cdef public Py_ssize_t max_num_seqs
    cdef public double kv_cap
    cdef public double now
    cdef public list inp, out, need, sched, pref, gen, gen_dec, adm, slot, started, waiting
    cdef public set running
    cdef public Py_ssize_t n_adm, kv_used, n_preempt
    cdef public list _preempted
    cdef public Py_ssize_t chunk, m
    cdef public object clock
    cdef public double clock_target
    cdef public list pending, clock_log, slot_ready, slot_busy
    cdef public bint parked
    cdef public list slot_dec, slot_flying, stage_free, heap
    cdef public Py_ssize_t seq
    cdef public double energy
    cdef public double[::1] e_bin
    cdef public Py_ssize_t n_bins
    cdef public dict p_idle

    @cython.locals(tc=double, tl=double, t_ready=double, j=Py_ssize_t, k=Py_ssize_t)
    cpdef object advance(self, double until)
    cpdef void _wake(self, double now)
    @cython.locals(k=Py_ssize_t)
    cdef void _charge(self, double t, double joules)
    cdef double _idle_power(self, double f)
    cdef double _clock_at(self, double t)
    @cython.locals(dec=list, j=Py_ssize_t, k=Py_ssize_t)
    cdef void _assign(self, Py_ssize_t r)
    cdef void _release(self, Py_ssize_t r)
    @cython.locals(c=Py_ssize_t, ctx=Py_ssize_t, n=Py_ssize_t, n_dec=Py_ssize_t, pairs=Py_ssize_t, kv_used=Py_ssize_t,
                   budget=Py_ssize_t, ntok=Py_ssize_t, r=Py_ssize_t, s=Py_ssize_t, free=double, prev=double, lat=double,
                   e_gpu=double, e_it=double, busy=double, idle=double, f=double, seqs=Py_ssize_t, g=Py_ssize_t,
                   kv_read=double, attn=double, p_idle=double)
    cdef void _launch(self, Py_ssize_t j, double t)
    @cython.locals(t=double, j=Py_ssize_t, r=Py_ssize_t, g=Py_ssize_t, n_dec=Py_ssize_t, i=Py_ssize_t, ntok=Py_ssize_t)
    cdef object _complete(self, tuple item)
