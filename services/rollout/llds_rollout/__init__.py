"""The rollout service: runs Search-R1 agents on an inference engine and streams token-level
trajectory groups to the trainer over Redis; serves ``/answer`` and takes live weight updates.

Layout: ``config`` (settings), ``engine/`` (backends behind one interface), ``weights`` (published
folder verification), ``retrieval`` (retriever client), ``agent`` (the multi-turn loop), ``scheduler``
(continuous group production, staleness control, Redis push), ``app`` (HTTP), ``cli`` (entrypoints).
"""
