"""Wire contracts between the llds services.

Everything that crosses a service boundary (HTTP bodies, Redis stream entries, weight-update
notices) is defined here as a pydantic model carrying a ``schema_version``. This package imports
neither torch nor vLLM, so any client (or a service in another language, through the generated
JSON Schema in ``schema/``) can speak to the services.
"""

from llds_proto.messages import (
    SCHEMA_VERSION,
    AnswerRequest,
    AnswerResponse,
    AnswerTurn,
    Document,
    HealthResponse,
    RetrieveRequest,
    RetrieveResponse,
    ScoredDocument,
    Trajectory,
    TrajectoryGroup,
    WeightUpdateNotice,
    WeightUpdateResponse,
)

__all__ = [
    "SCHEMA_VERSION",
    "AnswerRequest",
    "AnswerResponse",
    "AnswerTurn",
    "Document",
    "HealthResponse",
    "RetrieveRequest",
    "RetrieveResponse",
    "ScoredDocument",
    "Trajectory",
    "TrajectoryGroup",
    "WeightUpdateNotice",
    "WeightUpdateResponse",
]
