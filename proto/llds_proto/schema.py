"""Generate the language-neutral JSON Schema of every wire message.

Run ``python -m llds_proto.schema`` after changing a message; a test fails while the committed
files under ``schema/`` differ from what the models generate.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pydantic import BaseModel

from llds_proto import messages

SCHEMA_DIR = Path(__file__).parent / "schema"

MODELS: dict[str, type[BaseModel]] = {
    "retrieve_request": messages.RetrieveRequest,
    "retrieve_response": messages.RetrieveResponse,
    "answer_request": messages.AnswerRequest,
    "answer_response": messages.AnswerResponse,
    "weight_update_notice": messages.WeightUpdateNotice,
    "weight_update_response": messages.WeightUpdateResponse,
    "weight_transfer_init": messages.WeightTransferInit,
    "weight_transfer_update": messages.WeightTransferUpdate,
    "weight_transfer_info": messages.WeightTransferInfo,
    "health_response": messages.HealthResponse,
    "trajectory_group": messages.TrajectoryGroup,
    "trainer_info": messages.TrainerInfo,
}


def render() -> dict[str, str]:
    """File name -> JSON text for every model."""
    return {
        f"{name}.json": json.dumps(model.model_json_schema(), indent=2, sort_keys=True) + "\n"
        for name, model in MODELS.items()
    }


def main() -> int:
    SCHEMA_DIR.mkdir(exist_ok=True)
    for fname, text in render().items():
        (SCHEMA_DIR / fname).write_text(text)
    print(f"wrote {len(MODELS)} schemas to {SCHEMA_DIR}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
