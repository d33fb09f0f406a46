# C types for the compiled twin of sim.py (systems/compiled.py, setup.py); the rules are in the .py.
import cython

cdef class Lineage:
    cdef public object problem
    cdef public dict seen

    cpdef object get(self, str path)
    cpdef void put(self, str path, object value)


cdef class SyntheticPrm:
    cdef public object seed
    cdef public Lineage memo

    cpdef list values(self, object problem, object tokens, object step_ends, object computed, str path=*)


@cython.locals(p=Py_ssize_t)
cpdef bint starts_with(object tokens, Py_ssize_t n, object base, object tail=*)


@cython.locals(B=Py_ssize_t, k=Py_ssize_t, lo=Py_ssize_t, hi=Py_ssize_t, mid=Py_ssize_t)
cpdef list block_hashes(object tokens, Py_ssize_t block, object base=*, object base_hashes=*, object base_tail=*)
cpdef list extend_hashes(object tokens, Py_ssize_t block, object hashes)
cpdef list chain_hashes(object h, object tokens, Py_ssize_t start, Py_ssize_t block)


cdef class PathHashes:
    cdef public Py_ssize_t block
    cdef public Lineage memo

    cpdef list hashes(self, object tokens, str path=*)
    cpdef void remember(self, str path, object tokens, list hs, object tail=*)


cdef class BlockCache:
    cdef public Py_ssize_t capacity, block, reserved
    cdef public dict ref
    cdef public object free

    @cython.locals(n=Py_ssize_t, k=Py_ssize_t)
    cpdef Py_ssize_t hit_tokens(self, list hs, Py_ssize_t length)
    cpdef Py_ssize_t used(self)
    @cython.locals(n=Py_ssize_t)
    cpdef Py_ssize_t _evict(self, Py_ssize_t k)
    @cython.locals(ref=dict, lo=Py_ssize_t, hi=Py_ssize_t, mid=Py_ssize_t)
    cpdef Py_ssize_t pinned_prefix(self, list hs, object upto=*)
    @cython.locals(ref=dict, k=Py_ssize_t, new=list, over=Py_ssize_t)
    cpdef bint try_admit(self, list hs, Py_ssize_t extra_blocks)
    @cython.locals(ref=dict, j=Py_ssize_t, c=Py_ssize_t, room=Py_ssize_t)
    cpdef void release(self, list pinned, Py_ssize_t reserved, object produced)


cdef class TokenStream:
    cdef public object m, rng_len, rng_body
    cdef public list tokens, ends, is_eos
    cdef public Py_ssize_t length, materialised

    @cython.locals(n=Py_ssize_t)
    cpdef void _draw(self)
    @cython.locals(end=Py_ssize_t)
    cpdef tuple scan(self, Py_ssize_t i, Py_ssize_t limit, bint eos_only)
    @cython.locals(i=Py_ssize_t)
    cpdef tuple boundary(self, Py_ssize_t start, Py_ssize_t limit, bint eos_only)
    @cython.locals(toks=list, ends=list, is_eos=list, first=Py_ssize_t, last=Py_ssize_t, at=Py_ssize_t,
                   i=Py_ssize_t, k=Py_ssize_t)
    cpdef list read(self, Py_ssize_t n)


cdef class _Seq:
    cdef public object r
    cdef public TokenStream stream
    cdef public Py_ssize_t step_len
    cdef public str finish
    cdef public list hs
    cdef public Py_ssize_t extra, cached, admitted, order, end
    cdef public bint speculating
    cdef public Py_ssize_t cap, scan
    cdef public bint tentative

    cpdef void speculate(self, Py_ssize_t cap)
    cpdef void resolve(self)


cdef class _Engine:
    cdef dict __dict__
    cdef public object m
    cdef public Py_ssize_t block
    cdef public BlockCache cache
    cdef public Py_ssize_t max_num_seqs
    cdef public object offload_bw

    cpdef double swap_time(self)


@cython.locals(end=Py_ssize_t, s=_Seq)
cpdef _Seq _first_end(list ends, dict run, double upto)


cdef class SimGenerator(_Engine):
    cdef public object hw, tokens
    cdef public Py_ssize_t token_budget, max_model_len
    cdef public PathHashes paths
    cdef public object _head

    @cython.locals(B=Py_ssize_t, budget=Py_ssize_t, hit=Py_ssize_t, new=Py_ssize_t, step_len=Py_ssize_t,
                   extra=Py_ssize_t, hs=list, s=_Seq)
    cdef tuple _admit(self, object queue, dict run, Py_ssize_t now)
    @cython.locals(B=Py_ssize_t, admitted=Py_ssize_t, steps=Py_ssize_t, ctx=Py_ssize_t, k=Py_ssize_t,
                   decodes=Py_ssize_t, need=Py_ssize_t, t=double, dec_ctx=double, more=bint, pressure=bint, s=_Seq,
                   run=dict, spec=dict, potential=dict, outputs=dict, ends=list, due=list, prefill=list, new_seqs=list)
    cpdef object extend(self, object requests, object policy)
    @cython.locals(s=_Seq)
    cdef Py_ssize_t _end(self, str uid, Py_ssize_t steps, dict run, dict spec, dict potential, dict outputs)
    @cython.locals(toks=list, filled=list, hs=list, prompt=list)
    cdef void _finish(self, _Seq s, Py_ssize_t done, dict outputs)


cdef class SimVerifier(_Engine):
    cdef public object hw
    cdef public Py_ssize_t budget
    cdef public object map, prompts, prm
    cdef public PathHashes paths

    @cython.locals(t=double, cached=Py_ssize_t, total=Py_ssize_t, B=Py_ssize_t, i=Py_ssize_t, j=Py_ssize_t,
                   n=Py_ssize_t, hit=Py_ssize_t, extra=Py_ssize_t, new_tokens=Py_ssize_t, new=Py_ssize_t, attn=double,
                   cache=BlockCache, hs=list, pinned=list, vals=list)
    cpdef object verify(self, object pidx, object items, object paths=*)
    cdef double _charge(self, Py_ssize_t new_tokens, double attn_flops)
