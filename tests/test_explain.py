"""``eva config --explain`` reads the models' own field descriptions aloud, and a mistyped key is
answered with the field it most likely meant (flows.explain)."""

from __future__ import annotations

import pytest

from flows.cli import main
from flows.config import RunConfig


def test_explain_prints_every_field_with_its_value_and_description(capsys) -> None:
    assert main(["config", "--explain", "--set", "sample.fraction=0.4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    described = RunConfig.model_fields["iterations"].description
    assert f"iterations: 2  # {described}" in lines
    fraction = [line for line in lines if line.startswith("sample.fraction: ")]
    assert len(fraction) == 1 and fraction[0].startswith("sample.fraction: 0.4  # ")
    # A section of a union (the solver) is read as the kind the config names.
    assert any(line.startswith('train.solver.kind: "dpo_nll"') for line in lines)
    assert any(line.startswith("train.solver.beta: 0.1") for line in lines)


@pytest.mark.parametrize(
    ("key", "meant"),
    [
        ("sample.fracton", "sample.fraction"),
        ("train.solver.learnin_rate", "train.solver.learning_rate"),  # inside the solver union
        ("iteration", "iterations"),
    ],
)
def test_a_mistyped_key_gets_the_field_it_meant(capsys, key: str, meant: str) -> None:
    assert main(["config", "--set", f"{key}=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"eva: error: {key}: not a field of this section (got 1) (did you mean {meant}?)"
    ]


def test_a_key_like_no_field_points_to_explain(capsys) -> None:
    assert main(["config", "--set", "zzz=1"]) == 2
    assert "eva config --explain lists the fields" in capsys.readouterr().err


def test_a_config_for_the_other_kind_of_run_says_which_command_runs_it(capsys) -> None:
    assert main(["config", "--config", "configs/world-online.yaml"]) == 2
    assert capsys.readouterr().err.strip() == (
        "eva: error: online: a section of an online run's config, not of this one (run it "
        "with eva online; eva config --online shows it)"
    )
    assert main(["config", "--online", "--config", "configs/world.yaml"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("eva: error: generate: a section of an offline run's config, not of")
    assert err.endswith("(run it with eva run; eva config shows it)")


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("autox", "Input should be a valid number, unable to parse string as a number, or 'auto'"
                  " (got 'autox')"),
        ("-1", "Input should be greater than or equal to 0, or 'auto' (got -1)"),
    ],
)  # fmt: skip
def test_a_field_of_several_types_is_one_message_naming_the_field(
    capsys, value: str, said: str
) -> None:
    # A number or "auto": pydantic fails the value once per type, each at the field plus the
    # type ('...missing_eos_penalty.constrained-float'); the user set the field.
    key = "online.solver.missing_eos_penalty"
    assert main(["config", "--online", "--config", "configs/world-online.yaml",
                 "--set", f"{key}={value}"]) == 2  # fmt: skip
    assert capsys.readouterr().err.strip() == f"eva: error: {key}: {said}"
