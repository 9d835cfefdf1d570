"""The search agent behind OpenAI's chat-completions API, at ``/agent/v1`` on the rollout's port.

``/v1`` (vLLM's own routes) is the bare policy: one completion, no search. ``/agent/v1`` runs the
same agent loop as ``/answer`` (search calls to the retriever, then an answer) and answers in
OpenAI's response shape, with the searches in an ``llds`` extension object. Split as the house
style asks: ``protocol`` (request and response models), ``logic`` (mapping, no web framework),
``routes`` (the FastAPI router).
"""
