"""Decode at the GPU's speed: the dense parts of a decode token as captured CUDA graphs, attention eager.

A decode token of an offloading engine cannot be one CUDA graph: the K/V it attends to move (layer-
wise streams layers through staging buffers, LBS loads each group into a buffer of its own) and grow
by a token every step. What does not move is everything between two attentions: layer ``l``'s output
projection and MLP, then layer ``l + 1``'s norm, Q/K/V projection and rotary embedding, on
activations of a fixed batch size. :class:`PiecewiseDecoder` captures those pieces, ``L + 1`` per
batch size (the embedding with layer 0's Q/K/V; each layer's tail with the next layer's head; the
last layer's tail with the final norm, the LM head and the log-softmax), and runs attention and the
K/V writes eagerly between them, through the engine's cache (:class:`systems.kv_offload.cache.GroupCache`,
whose ``layer_kv``/``layer_done`` hooks issue layer-wise offloading's copies and LBS's prefetch
between layers): vLLM's piecewise CUDA graphs (``CompilationConfig.cudagraph_mode=PIECEWISE``), made
with ``torch.cuda.graphs`` directly. A batch is padded up to the next captured size (powers of two up
to the run's beams, as vLLM's ``cudagraph_capture_sizes``); padded rows compute on token 0 and are
never read. The arithmetic is :class:`systems.kv_offload.decoder.LeanDecoder`'s (written once); on a
CPU the same pieces run eagerly (``graphs=False``), which is how the tests check it against
transformers' own forward in float64.

Batch-invariant mode (``pad_to``): every batch is padded to one size, so every projection, MLP and
LM head runs at one shape whichever group it serves, and a beam's arithmetic does not depend on which
scheduler grouped it with whom (issue 37, point 3); its cost is the padded rows' compute.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence

import torch

from systems.kv_offload.decoder import LeanDecoder


def capture_sizes(max_batch: int) -> List[int]:
    """Batch sizes to capture: powers of two below ``max_batch``, then ``max_batch`` itself."""
    if max_batch < 1:
        raise ValueError(f"max_batch={max_batch}: at least 1")
    sizes, s = [], 1
    while s < max_batch:
        sizes.append(s)
        s *= 2
    return sizes + [max_batch]


class _Pieces:
    """One batch size's static inputs, pieces and (on CUDA) their graphs.

    ``ids`` [Bp] long and ``pos`` [1] long are the static inputs; ``o[l]`` [Bp, heads * head_dim]
    holds layer ``l``'s attention output, written eagerly; ``out[i]`` is piece ``i``'s output
    (``(h, aux, q, k, v)`` for ``i < L``, the log-probs ``[Bp, V]`` for ``i = L``), at a fixed address
    once captured."""

    def __init__(self, dec: LeanDecoder, size: int, device, log_probs: Callable, graphs: bool, pool=None):
        self.dec, self.size, self.log_probs = dec, size, log_probs
        L = len(dec.layers)
        width = dec.model.config.num_attention_heads * dec.head_dim
        dtype = dec.model.lm_head.weight.dtype
        self.ids = torch.zeros(size, dtype=torch.long, device=device)
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        self.o = [torch.zeros(size, width, dtype=dtype, device=device) for _ in range(L)]
        self.out: List = [None] * (L + 1)
        self.graphs: Optional[List[torch.cuda.CUDAGraph]] = None
        if graphs:
            self._capture(pool)

    def piece(self, i: int):
        """Piece ``i``: 0 = embedding + layer 0's Q/K/V; ``0 < i < L`` = layer ``i-1``'s tail + layer ``i``'s
        Q/K/V; ``L`` = the last layer's tail + head + log-probs."""
        dec, L = self.dec, len(self.dec.layers)
        if i == 0:
            h, aux = dec.embed(self.ids, self.pos)
        else:
            h, aux = self.out[i - 1][0], self.out[i - 1][1]
            h = dec.post_attn(i - 1, h, self.o[i - 1])
        if i == L:
            return self.log_probs(dec.head(h))
        return (h, aux, *dec.pre_attn(i, h, aux))

    def run(self, i: int) -> None:
        if self.graphs is not None:
            self.graphs[i].replay()
        else:
            self.out[i] = self.piece(i)

    def _capture(self, pool) -> None:
        L = len(self.dec.layers)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture (cuBLAS handles, lazy kernels)
            for _ in range(2):
                for i in range(L + 1):
                    self.out[i] = self.piece(i)
        torch.cuda.current_stream().wait_stream(side)
        self.graphs = []
        for i in range(L + 1):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                self.out[i] = self.piece(i)
            self.graphs.append(g)
        torch.cuda.synchronize()


class PiecewiseDecoder:
    """``decoder(ids, cache) -> log-probs [B, V]`` of the next token for token ids ``[B]`` appended at
    position ``cache.get_seq_length()``: :class:`LeanDecoder`'s arithmetic, its dense pieces replayed
    as CUDA graphs at the batch's padded size (see the module doc).

    Args:
        dec: the model's :class:`LeanDecoder`.
        max_batch: the largest batch a call may bring (the run's beams); sizes are :func:`capture_sizes`.
        log_probs: ``logits [B, V] -> log-probs [B, V]`` in the sampling dtype (captured with the head).
        graphs: capture CUDA graphs (CUDA only); False runs the same pieces eagerly.
        pad_to: batch-invariant mode: every batch padded to this one size (>= max_batch).

    The returned log-probs are a view of a static buffer that the next call overwrites: clone what is
    kept. Raises ValueError for a batch larger than every captured size (before any work)."""

    def __init__(
        self, dec: LeanDecoder, max_batch: int, log_probs: Callable, graphs: bool, pad_to: Optional[int] = None
    ):
        if pad_to is not None and pad_to < max_batch:
            raise ValueError(f"pad_to={pad_to} is below the largest batch {max_batch}")
        self.dec, self.log_probs, self.graphs = dec, log_probs, graphs
        self.sizes = [pad_to] if pad_to is not None else capture_sizes(max_batch)
        self.device = dec.model.lm_head.weight.device
        self.pool = torch.cuda.graph_pool_handle() if graphs else None
        self._pieces: Dict[int, _Pieces] = {}  # captured lazily, the first time a size is needed

    def padded(self, batch: int) -> int:
        """The captured size a batch of ``batch`` runs at."""
        for s in self.sizes:
            if s >= batch:
                return s
        raise ValueError(f"a batch of {batch} beams exceeds the largest captured size {self.sizes[-1]}")

    def pieces(self, batch: int) -> _Pieces:
        size = self.padded(batch)
        if size not in self._pieces:
            self._pieces[size] = _Pieces(self.dec, size, self.device, self.log_probs, self.graphs, self.pool)
        return self._pieces[size]

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor, cache) -> torch.Tensor:
        B = ids.shape[0]
        p = self.pieces(B)
        full = B == p.size  # no padded rows: no slicing (fewer operators for the host to dispatch)
        (p.ids if full else p.ids[:B]).copy_(ids)
        p.pos.fill_(cache.get_seq_length())
        dec = self.dec
        for i in range(len(dec.layers)):
            p.run(i)
            _, _, q, k, v = p.out[i]
            if not full:
                q, k, v = q[:B], k[:B], v[:B]
            keys, values = cache.layers[i].update(k, v)
            (p.o[i] if full else p.o[i][:B]).copy_(dec.attention(q, keys, values))
        p.run(len(dec.layers))
        return p.out[-1] if full else p.out[-1][:B]

    def warm(self, batches: Sequence[int]) -> None:
        """Capture the sizes ``batches`` need now (outside any measured step)."""
        for b in batches:
            self.pieces(b)
