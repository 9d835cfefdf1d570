"""The benchmarks, one module per service (``retriever``, ``rollout``, ``trainer``), kept out of the
service packages: each measures a service against a baseline run in the same process and writes its
section of BENCHMARKS.md. They sit on top of the services (importing them, as the launcher does) and
nothing imports them but ``llds bench``. Run as ``llds bench <service>`` or
``python -m llds_bench.<service>``."""
