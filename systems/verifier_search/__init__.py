"""FastTTS family (ASPLOS 26): generator + verifier test-time search on vLLM, its vLLM baseline
(``vllm_tts``), the three FastTTS techniques (S: speculative beam extension, P: prefix-aware
scheduling, M: asymmetric memory allocation) and a simulated backend for the paper's GPUs."""
