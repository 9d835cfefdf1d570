"""The multi-turn loop at token level, on a scripted engine and an in-memory searcher."""

from __future__ import annotations

import asyncio
from typing import Any

from rollout_fakes import FakeSearcher, ScriptedEngine

from llds_proto.search_protocol import invalid_action_ids, observation_ids, prompt_ids
from llds_rollout.agent import LoopSettings, run_episode

SEARCH = "<think> need to look </think><search> hamlet author </search>"
ANSWER = "<think> found it </think><answer> William Shakespeare </answer>"


def _run(engine: ScriptedEngine, searcher: FakeSearcher, tok: Any, **kw: Any):  # type: ignore[no-untyped-def]
    settings = LoopSettings(**{"max_turns": 3, "max_tokens_per_turn": 64, **kw})
    return asyncio.run(
        run_episode(
            engine,
            searcher,
            tok,
            "who wrote hamlet",
            ["William Shakespeare"],
            settings,
            trajectory_id="g:0:0/0",
        )
    )


def test_search_then_answer_is_sampled_plus_observation_tokens(tokenizer: Any) -> None:
    engine, searcher = ScriptedEngine(tokenizer, [SEARCH, ANSWER], version=7), FakeSearcher()
    ep = _run(engine, searcher, tokenizer)
    t = ep.trajectory
    gen1, gen2 = (r.token_ids for r in engine.results)
    obs = observation_ids(tokenizer, [d.model_dump() for d in searcher.docs])
    assert t.prompt_ids == prompt_ids(tokenizer, "who wrote hamlet")
    assert t.response_ids == gen1 + obs + gen2
    assert t.loss_mask == [1] * len(gen1) + [0] * len(obs) + [1] * len(gen2)
    assert t.logprobs == engine.results[0].logprobs + [0.0] * len(obs) + engine.results[1].logprobs
    assert t.versions == [7] * len(gen1) + [-1] * len(obs) + [7] * len(gen2)
    n1 = len(gen1)
    assert t.action_spans == [(0, n1), (n1 + len(obs), len(t.response_ids))]
    s, e = t.answer_span
    # the smallest token range covering the tags ("><" is one token here, so it starts one char early)
    assert "<answer> William Shakespeare </answer>" in tokenizer.decode(t.response_ids[s:e])
    assert "<answer>" not in tokenizer.decode(t.response_ids[s + 1 : e])
    assert "</answer>" not in tokenizer.decode(t.response_ids[s : e - 1])
    assert searcher.queries == ["hamlet author"]
    assert (t.reward, t.exact_match, t.answer) == (1.0, 1.0, "William Shakespeare")
    assert (t.num_turns, t.num_valid_searches, t.finish_reason) == (2, 1, "answer")
    # the second turn continued exactly the tokens so far, nothing re-tokenized
    assert engine.requests[1].prompt_ids == t.prompt_ids + gen1 + obs
    assert engine.requests[0].stop == ("</search>", "</answer>")
    assert ep.turns[0].search_query == "hamlet author" and len(ep.turns[0].documents) == 2


def test_invalid_action_gets_feedback_and_is_masked(tokenizer: Any) -> None:
    engine, searcher = (
        ScriptedEngine(tokenizer, ["I am not sure", "<answer> Marlowe </answer>"]),
        FakeSearcher(),
    )
    t = _run(engine, searcher, tokenizer).trajectory
    gen1, gen2 = (r.token_ids for r in engine.results)
    fb = invalid_action_ids(tokenizer)
    assert t.response_ids == gen1 + fb + gen2
    assert t.loss_mask == [1] * len(gen1) + [0] * len(fb) + [1] * len(gen2)
    assert (t.reward, t.answer, t.num_valid_searches, searcher.queries) == (0.0, "Marlowe", 0, [])


def test_empty_search_is_invalid(tokenizer: Any) -> None:
    engine, searcher = ScriptedEngine(tokenizer, ["<search>  </search>", ANSWER]), FakeSearcher()
    ep = _run(engine, searcher, tokenizer)
    assert searcher.queries == [] and ep.invalid_actions == 1


def test_final_turn_has_no_search(tokenizer: Any) -> None:
    engine, searcher = ScriptedEngine(tokenizer, [SEARCH] * 5), FakeSearcher()
    ep = _run(engine, searcher, tokenizer, max_turns=2)
    t = ep.trajectory
    # two search-enabled turns, then one final turn whose search is not executed
    assert len(engine.requests) == 3 and searcher.queries == ["hamlet author"] * 2
    assert (t.num_turns, t.num_valid_searches, t.finish_reason, t.answer_span) == (3, 2, "max_turns", None)
    assert len(t.action_spans) == 3 and t.loss_mask[-1] == 1


def test_zero_max_turns_is_one_turn_without_search(tokenizer: Any) -> None:
    engine, searcher = ScriptedEngine(tokenizer, [SEARCH]), FakeSearcher()
    t = _run(engine, searcher, tokenizer, max_turns=0).trajectory
    assert (len(engine.requests), searcher.queries, t.finish_reason) == (1, [], "max_turns")


def test_context_cap_bounds_prompt_plus_response(tokenizer: Any) -> None:
    engine, searcher = ScriptedEngine(tokenizer, [SEARCH] * 5), FakeSearcher()
    cap = len(prompt_ids(tokenizer, "who wrote hamlet")) + 40
    t = _run(engine, searcher, tokenizer, max_context_tokens=cap).trajectory
    assert len(t.prompt_ids) + len(t.response_ids) == cap
    assert t.finish_reason == "context"
    assert all(r.max_tokens <= 40 for r in engine.requests)


def test_greedy_settings_reach_the_engine(tokenizer: Any) -> None:
    engine = ScriptedEngine(tokenizer, [ANSWER])
    _run(engine, FakeSearcher(), tokenizer, temperature=0.0, top_p=1.0, max_tokens_per_turn=17)
    req = engine.requests[0]
    assert (req.temperature, req.top_p, req.max_tokens) == (0.0, 1.0, 17)
