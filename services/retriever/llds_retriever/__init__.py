"""The retriever service: BM25, dense (FAISS) and hybrid search behind Search-R1's ``/retrieve`` API.

Modules: ``config`` (RetrieverConfig), ``corpus`` (memory-mapped JSONL rows), ``encoders`` (HF encoders
with pooling/prefixes), ``backends`` (BM25 / dense / hybrid behind one Protocol, shard merge),
``index`` (resumable index builder, manifest), ``loader`` (config -> backend), ``batcher``
(cross-request micro-batching with bounded admission), ``cache`` (LRU), ``service`` (logic, response
bytes), ``app`` (FastAPI routes), ``cli`` (entrypoints), ``bench`` (``llds bench retriever``).
"""
