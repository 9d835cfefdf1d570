"""The trainer service: GRPO + LLDS on token-level trajectory groups from Redis.

Modules: ``loss`` (pure tensor functions), ``batch`` (groups -> tensors), ``core`` (the learner),
``scoring`` (the forward passes), ``objective`` (the micro-batch loss), ``regularizers`` (one module
per likelihood regulariser), ``queue`` (Redis consumer group), ``checkpoint``, ``publish`` (weights +
notices), ``lld`` (monitor and alarm), ``service`` (the loop), ``app`` (HTTP), ``cli`` (entrypoint),
``warmstart``, ``bench``.
"""
