# C types for the compiled twin of gpu_model.py (systems/compiled.py, setup.py); the rules are in the .py.
import cython

cdef class StageModel:
    cdef dict __dict__                   # the attributes step1 does not read stay Python attributes
    cdef public double idle_w
    cdef public dict _clock_terms

    @cython.locals(rate=double, f_ratio=double, mem_slow=double, t_fixed=double, t_tok=double, dpa=double,
                   beta=double, one_beta=double, limit=double, p_idle=double, w2=double, a=double, rb=double,
                   kv=double, bw=double, t_sm=double, t_mem=double, t_other=double, t_k=double, r=double, p=double)
    cpdef tuple step1(self, object n, double f, double ctx_tokens=*, double attn_pairs=*, object seqs=*)
