"""A deterministic synthetic world: the embedded default task.

Fictional people, cities, countries and organisations with attributes and relations, written as
passages in the wiki-18 corpus format, and 1-hop and 2-hop questions whose answers cannot be known
without searching (every name and fact is invented by a seeded generator). Train and eval questions
are split by entity, so no eval answer appears in a train question.

Run ``llds world build --out DIR [--seed 0]``; writes ``corpus.jsonl``, ``train.jsonl``,
``eval.jsonl`` and ``meta.json``.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from llds_proto.search_protocol import prompt_text

DATA_SOURCE = "synthworld"
_ONSETS = [
    "b",
    "d",
    "f",
    "g",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "z",
    "br",
    "dr",
    "kr",
    "st",
    "th",
    "vel",
]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ei", "ou"]
_CODAS = ["", "n", "r", "s", "th", "l", "m", "x", "nd", "rk"]
_OCCUPATIONS = [
    "painter", "chemist", "architect", "poet", "astronomer", "engineer", "composer", "botanist",
    "cartographer", "historian", "sculptor", "physician", "mathematician", "novelist", "linguist",
]  # fmt: skip
_ORG_KINDS = ["Institute", "Company", "Society", "Observatory", "Academy", "Foundry", "Guild", "Museum"]
_CITY_FEATURES = ["river", "harbour", "mountain pass", "salt lake", "old bridge", "lighthouse"]


@dataclass
class Person:
    name: str
    born_city: str
    birth_year: int
    occupation: str


@dataclass
class City:
    name: str
    country: str
    feature: str
    population: int


@dataclass
class Org:
    name: str
    founder: str
    hq_city: str
    founded_year: int
    kind: str


@dataclass
class World:
    seed: int
    people: dict[str, Person] = field(default_factory=dict)
    cities: dict[str, City] = field(default_factory=dict)
    orgs: dict[str, Org] = field(default_factory=dict)
    countries: list[str] = field(default_factory=list)


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables))


def _unique(rng: random.Random, used: set[str], make: object) -> str:
    while True:
        name = make()  # type: ignore[operator]
        if name.lower() not in used:
            used.add(name.lower())
            return name


def generate(
    seed: int = 0, n_people: int = 160, n_cities: int = 48, n_orgs: int = 64, n_countries: int = 8
) -> World:
    """The world for ``seed``; identical on every machine and Python 3.11+ run."""
    rng = random.Random(seed)
    used: set[str] = set()
    world = World(seed=seed)
    world.countries = [
        _unique(rng, used, lambda: _word(rng, 2).capitalize() + "ia") for _ in range(n_countries)
    ]
    for _ in range(n_cities):
        name = _unique(rng, used, lambda: _word(rng, rng.choice([2, 3])).capitalize())
        world.cities[name] = City(
            name, rng.choice(world.countries), rng.choice(_CITY_FEATURES), rng.randrange(2, 900) * 1000
        )
    city_names = list(world.cities)
    for _ in range(n_people):
        name = _unique(rng, used, lambda: f"{_word(rng, 2).capitalize()} {_word(rng, 2).capitalize()}")
        world.people[name] = Person(
            name, rng.choice(city_names), rng.randrange(1701, 1990), rng.choice(_OCCUPATIONS)
        )
    people = list(world.people)
    for _ in range(n_orgs):
        kind = rng.choice(_ORG_KINDS)
        name = _unique(rng, used, lambda kind=kind: f"{_word(rng, 2).capitalize()} {kind}")
        founder = rng.choice(people)
        founded = world.people[founder].birth_year + rng.randrange(22, 60)
        world.orgs[name] = Org(name, founder, rng.choice(city_names), founded, kind)
    return world


def _a(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def passages(world: World) -> list[dict[str, str]]:
    """One passage per entity, ``contents`` = ``"Title"\\ntext`` (wiki-18 form)."""
    founded_by: dict[str, list[str]] = {}
    for org in world.orgs.values():
        founded_by.setdefault(org.founder, []).append(org.name)
    out = []
    for p in world.people.values():
        text = (
            f"{p.name} (born {p.birth_year}) is {_a(p.occupation)} from {world.cities[p.born_city].country}. "
            f"{p.name} was born in the city of {p.born_city} and worked as {_a(p.occupation)} for most of their life."
        )
        if p.name in founded_by:
            text += f" {p.name} founded the {', the '.join(founded_by[p.name])}."
        out.append({"id": f"person-{len(out)}", "contents": f'"{p.name}"\n{text}'})
    for c in world.cities.values():
        text = (
            f"{c.name} is a city in {c.country}, known for its {c.feature}. "
            f"It has a population of about {c.population:,} people."
        )
        out.append({"id": f"city-{len(out)}", "contents": f'"{c.name}"\n{text}'})
    for o in world.orgs.values():
        text = (
            f"The {o.name} is {_a(o.kind.lower())} founded in {o.founded_year} by {o.founder}. "
            f"Its headquarters are in {o.hq_city}, {world.cities[o.hq_city].country}."
        )
        out.append({"id": f"org-{len(out)}", "contents": f'"{o.name}"\n{text}'})
    return out


def _questions(world: World, doc_of: dict[str, str]) -> list[tuple[set[str], dict[str, object]]]:
    """(support entities, row) pairs; a question is eval if any of its entities is."""
    qs: list[tuple[set[str], dict[str, object]]] = []

    def add(key: str, question: str, answer: str, support: list[tuple[str, str]]) -> None:
        qs.append(({e for _, e in support}, {"question": question, "golden_answers": [answer], "hops": len(support),
                         "support": [{"query": q, "doc_id": doc_of[e]} for q, e in support]}))  # fmt: skip

    for p in world.people.values():
        add(p.name, f"In which city was {p.name} born", p.born_city, [(f"{p.name} birthplace", p.name)])
        add(p.name, f"In what year was {p.name} born", str(p.birth_year), [(f"{p.name} born", p.name)])
        add(p.name, f"What was the occupation of {p.name}", p.occupation, [(f"{p.name} occupation", p.name)])
    for c in world.cities.values():
        add(
            c.name,
            f"In which country is the city of {c.name}",
            c.country,
            [(f"{c.name} city country", c.name)],
        )
    for o in world.orgs.values():
        add(o.name, f"Who founded the {o.name}", o.founder, [(f"{o.name} founder", o.name)])
        add(
            o.name,
            f"In which city is the {o.name} headquartered",
            o.hq_city,
            [(f"{o.name} headquarters", o.name)],
        )
        f = world.people[o.founder]
        add(o.name, f"In which city was the founder of the {o.name} born", f.born_city,
            [(f"{o.name} founder", o.name), (f"{f.name} birthplace", f.name)])  # fmt: skip
        add(o.name, f"What was the occupation of the founder of the {o.name}", f.occupation,
            [(f"{o.name} founder", o.name), (f"{f.name} occupation", f.name)])  # fmt: skip
        add(o.name, f"In which country is the headquarters of the {o.name}", world.cities[o.hq_city].country,
            [(f"{o.name} headquarters", o.name), (f"{o.hq_city} city country", o.hq_city)])  # fmt: skip
    return qs


def build(out: Path, seed: int = 0, eval_fraction: float = 0.2) -> dict[str, int]:
    """Write the world's corpus and question splits into ``out``; returns counts."""
    world = generate(seed)
    corpus = passages(world)
    doc_of = {d["contents"].split("\n", 1)[0].strip('"'): d["id"] for d in corpus}
    rng = random.Random(seed + 1)
    entities = sorted(doc_of)
    rng.shuffle(entities)
    eval_entities = set(entities[: int(len(entities) * eval_fraction)])
    rows: dict[str, list[dict[str, object]]] = {"train": [], "eval": []}
    for keys, row in _questions(world, doc_of):
        split = "eval" if keys & eval_entities else "train"
        idx = len(rows[split])
        answers = row["golden_answers"]
        row = {
            "id": f"{DATA_SOURCE}-{split}-{idx}",
            "data_source": DATA_SOURCE,
            **row,
            "prompt": [{"role": "user", "content": prompt_text(str(row["question"]))}],
            "ability": "fact-reasoning",
            "reward_model": {"style": "rule", "ground_truth": {"target": answers}},
            "extra_info": {"split": split, "index": idx},
        }
        rows[split].append(row)
    for split in rows:
        random.Random(seed + 2).shuffle(rows[split])
        for i, row in enumerate(rows[split]):
            row["id"] = f"{DATA_SOURCE}-{split}-{i}"
            row["extra_info"] = {"split": split, "index": i}
    out.mkdir(parents=True, exist_ok=True)
    _write_jsonl(out / "corpus.jsonl", corpus)
    for split, split_rows in rows.items():
        _write_jsonl(out / f"{split}.jsonl", split_rows)
    counts = {"passages": len(corpus), "train": len(rows["train"]), "eval": len(rows["eval"])}
    (out / "meta.json").write_text(json.dumps({"seed": seed, **counts}, indent=2) + "\n")
    return counts


def _write_jsonl(path: Path, rows: list[dict[str, object]]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llds world", description="Synthetic world: corpus and questions.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="write corpus.jsonl, train.jsonl, eval.jsonl, meta.json")
    b.add_argument("--out", type=Path, required=True, help="output folder")
    b.add_argument("--seed", type=int, default=0, help="fixes every name and fact")
    args = parser.parse_args(argv)
    counts = build(args.out, seed=args.seed)
    print(
        f"wrote {args.out}: {counts['passages']} passages, {counts['train']} train / {counts['eval']} eval questions"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
