"""proto/ must stay importable without torch or vLLM (STYLE rule 3)."""

import subprocess
import sys


def test_llds_proto_imports_without_torch_or_vllm() -> None:
    code = (
        "import sys\n"
        "import llds_proto, llds_proto.codec, llds_proto.search_protocol, llds_proto.reward\n"
        "import llds_proto.streams, llds_proto.schema, llds_proto.steplog\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in {'torch', 'vllm', 'transformers'})\n"
        "assert not bad, bad\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_every_message_carries_a_schema_version() -> None:
    from llds_proto.schema import MODELS

    for name, model in MODELS.items():
        assert "schema_version" in model.model_fields, name
