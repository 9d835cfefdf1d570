"""Server-side helpers every llds service needs: settings loading, HTTP plumbing.

The rule: this package imports no service (``llds_retriever``, ``llds_rollout``, ``llds_trainer``)
and not the launcher (``llds``), and it needs neither torch nor vLLM, so every service, the
launcher and the tests can use it without pulling each other in. Wire contracts live in
``llds_proto``, not here.
"""
