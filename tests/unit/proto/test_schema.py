"""The committed JSON Schema files are exactly what the pydantic models generate."""

from llds_proto.schema import SCHEMA_DIR, render


def test_committed_json_schema_matches_models() -> None:
    rendered = render()
    on_disk = {p.name for p in SCHEMA_DIR.glob("*.json")}
    assert on_disk == set(rendered), "run `make schema` and commit proto/llds_proto/schema/"
    for fname, text in rendered.items():
        assert (SCHEMA_DIR / fname).read_text() == text, f"{fname} is stale: run `make schema`"
